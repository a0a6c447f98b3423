//! `cnilab capture --script`: capture a node that has no cnilab on it. The
//! script (`node.sh`, printed with the model's sysctl lists filled in) needs
//! only `sh`, coreutils or busybox, `nsenter` and iproute2; it writes one
//! plain-text file of sections (`archive.rs`), one per command and
//! namespace. This module reads that file into the same [`Capture`] as a
//! native capture: the same model types (`ip.rs`, by the netlink reader's
//! rules), the namespaces' ids for each other told from the file
//! (`nsid.rs`), the same pod discovery, naming and evidence
//! ([`super::name_pods`], [`super::finish`]).
//!
//! Where the two can differ, and why: the netlink reader asks the kernel
//! which namespace a peer's `link_netnsid` is; the file tells it from
//! `ip netns list-id` and the veth pairs (`nsid.rs`); a namespace whose
//! only untold id has only macvlans or ipvlans behind it takes that id for
//! the node when the node has their lower indexes. An id nothing tells
//! stays `netnsid N`, as the netlink reader names a namespace it was not
//! given.

mod archive;
mod ip;
mod nsid;

use super::{evidence, Capture, PodSource, Provenance, Read};
use crate::model::read::RawNamespace;
use crate::model::{firewall, sysctl, LabModel, Namespace, Node};
use archive::{Archive, Section};
use std::collections::BTreeMap;
use std::path::Path;

pub use archive::MAGIC;

const SCRIPT: &str = include_str!("node.sh");

/// The script, with the sysctl lists of the model's reader.
pub fn script() -> String {
    let words = |keys: &[&str]| keys.join(" ");
    SCRIPT
        .replace("@GLOBAL_KEYS@", &words(sysctl::GLOBAL_SYSCTLS))
        .replace("@CONF4_KEYS@", &words(sysctl::CONF_V4))
        .replace("@CONF6_KEYS@", &words(sysctl::CONF_V6))
        .replace("@LINK4_KEYS@", &words(sysctl::LINK_V4))
        .replace("@LINK6_KEYS@", &words(sysctl::LINK_V6))
}

/// Whether `first_line` opens a capture script's file.
pub fn is_script(first_line: &[u8]) -> bool {
    first_line.starts_with(MAGIC.as_bytes())
}

/// What to make of a script's file.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub node_name: Option<String>,
    pub redact: Option<Vec<u8>>,
}

/// Reads the script's file at `path` into a capture.
pub fn convert(path: &Path, opts: &Options) -> Result<Capture, String> {
    let shown = path.display();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut super::open_capped(path, super::MAX_BYTES)?, &mut bytes)
        .map_err(|e| format!("{shown}: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|e| format!("{shown}: not text: {e}"))?;
    from_text(&text, opts).map_err(|e| format!("{shown}: {e}"))
}

/// Reads the script's output `text` (a file's, or what `cnilab capture
/// --kubeconfig` collected from a node) into a capture, checked.
pub fn from_text(text: &str, opts: &Options) -> Result<Capture, String> {
    let archive = archive::parse(text)?;
    let c = from_archive(&archive, opts)?;
    super::check::check(&c)?;
    Ok(c)
}

/// A namespace of the file: its number, path and inode.
struct Place {
    path: String,
    inode: (u64, u64),
}

fn inode_of(text: &str) -> Option<(u64, u64)> {
    let (dev, ino) = text.trim().split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// `<dev>:<ino> <path>` lines.
fn stat_lines(s: Option<&Section>) -> Vec<((u64, u64), String)> {
    s.map(|s| s.body.as_str())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (ino, path) = l.split_once(' ')?;
            Some((inode_of(ino)?, path.to_string()))
        })
        .collect()
}

fn from_archive(a: &Archive, opts: &Options) -> Result<Capture, String> {
    let source = a.field("source")?.to_string();
    let own = stat_lines(a.get(None, "own"));
    let node_inode = own
        .first()
        .map(|(i, _)| *i)
        .ok_or("section `- own`: no inode of the node")?;
    let mut places: BTreeMap<usize, Place> = BTreeMap::new();
    places.insert(
        0,
        Place {
            path: source.clone(),
            inode: node_inode,
        },
    );
    for s in a.sections.iter().filter(|s| s.what == "namespace") {
        let inode = inode_of(&s.body).ok_or_else(|| format!("{}: no inode", s.label()))?;
        let k = s.ns.ok_or_else(|| format!("{}: no number", s.label()))?;
        places.insert(
            k,
            Place {
                path: s.arg.clone(),
                inode,
            },
        );
    }
    let named = stat_lines(a.get(None, "named"));
    let procs = stat_lines(a.get(None, "procs"));
    let by_inode: BTreeMap<(u64, u64), usize> = places.iter().map(|(k, p)| (p.inode, *k)).collect();
    let mut warnings = Vec::new();
    let mut dumped = BTreeMap::new();
    let mut raws = BTreeMap::new();
    for (k, place) in &places {
        // `None`: gone between the listing and the reading, no pod.
        if let Some((raw, ends)) = read_links(a, *k, place)? {
            let listed = listed_ids(a, *k, &named, &by_inode)?;
            dumped.insert(*k, nsid::Dumped { ends, listed });
            raws.insert(*k, raw);
        }
    }
    let ids = nsid::resolve(&dumped);
    let (pods, peers) = discover(&dumped, &ids, &places, &procs);
    let node_name = opts
        .node_name
        .clone()
        .unwrap_or_else(|| match source.as_str() {
            "host" => a.header.get("hostname").cloned().unwrap_or_default(),
            p => super::discover::name_of_path(Path::new(p)),
        });
    // As `discover.rs` counts them: processes whose namespace `stat` could
    // not read.
    let denied = a.get(None, "procs.stderr").map_or(0, |s| {
        s.body
            .lines()
            .filter(|l| l.contains("Permission denied"))
            .count()
    });
    if denied > 0 {
        warnings.push(format!(
            "the network namespace of {denied} processes was not readable (permission): pods held only by them are missing; run as root"
        ));
    }
    let cri = cri_names(a, &procs, &mut warnings);
    let sources = super::name_pods(
        &node_name,
        pods.iter()
            .map(|(k, s)| (s.clone(), cri.get(&places[k].inode).cloned())),
    );
    let mut roles: BTreeMap<usize, String> = BTreeMap::from([(0, node_name.clone())]);
    for ((k, _), s) in pods.iter().zip(&sources) {
        roles.insert(*k, s.name.clone());
    }
    let mut read = Vec::new();
    for (k, role) in &roles {
        let links = raws.remove(k).unwrap_or_default();
        read.push(read_namespace(a, *k, role, links, &ids, &roles)?);
    }
    let (mut done, more) = crate::model::read::resolve_all(read);
    warnings.extend(more);
    let mut take = |role: &str| done.remove(role).unwrap_or_else(|| ip::namespace(role));
    let mut model = LabModel {
        schema_version: crate::model::SCHEMA_VERSION,
        name: node_name.clone(),
        underlay: Vec::new(),
        nodes: vec![Node {
            net: take(&node_name),
            pod_cidrs: Vec::new(),
            pods: sources.iter().map(|s| take(&s.name)).collect(),
        }],
    };
    model.sort();
    let node = model.nodes.pop().ok_or("no node")?;
    let cache = node_files(
        a,
        ("cni-cache", "cniCache"),
        &mut warnings,
        evidence::cni_cache,
    )?;
    let confs = node_files(
        a,
        ("cni-conf", "cniConf"),
        &mut warnings,
        super::cni_conf::read_dir,
    )?;
    let read = Read {
        node,
        pods: sources,
        peers,
        warnings,
    };
    Ok(super::finish(
        read,
        (&cache, &confs),
        provenance(a, &node_name)?,
        opts.redact.as_deref(),
    ))
}

/// Section `what` of namespace `k` as JSON, `None` when the command
/// failed (its error output beside it).
fn json_of(a: &Archive, k: usize, what: &str) -> Result<Option<serde_json::Value>, String> {
    let Some(s) = a.get(Some(k), what) else {
        return Err(format!("namespace {k}: no section `{k} {what}`"));
    };
    if s.status != 0 {
        return Ok(None);
    }
    serde_json::from_str(&ip::escape_controls(&s.body))
        .map(Some)
        .map_err(|e| format!("{}: not JSON: {e}", s.label()))
}

/// Why section `what` of `k` failed, from its error output.
fn failure(a: &Archive, k: usize, what: &str) -> String {
    let status = a.get(Some(k), what).map_or(0, |s| s.status);
    let err = a
        .get(Some(k), &format!("{what}.stderr"))
        .map(|s| s.body.trim().to_string())
        .unwrap_or_default();
    format!("exit status {status}: {err}")
}

/// A namespace's links, and their ends.
type Links = (Vec<crate::model::read::RawLink>, Vec<ip::End>);

/// The links of namespace `k` (`None`: it was gone when the script came
/// to it; the node must be there).
fn read_links(a: &Archive, k: usize, place: &Place) -> Result<Option<Links>, String> {
    let label = format!("section `{k} link`");
    match json_of(a, k, "link")? {
        Some(v) => ip::links(&v).map(Some).map_err(|e| format!("{label}: {e}")),
        None if k == 0 => Err(format!(
            "{label}: the node {} was not read: {}",
            place.path,
            failure(a, k, "link")
        )),
        None => Ok(None),
    }
}

/// `ip -j netns list-id` of `k`: its ids for the namespaces named under
/// `/run/netns`, as their numbers in the file.
fn listed_ids(
    a: &Archive,
    k: usize,
    named: &[((u64, u64), String)],
    by_inode: &BTreeMap<(u64, u64), usize>,
) -> Result<BTreeMap<i32, usize>, String> {
    // Not read where no link leads out (see `node.sh`).
    if a.get(Some(k), "nsid").is_none() {
        return Ok(BTreeMap::new());
    }
    let Some(v) = json_of(a, k, "nsid")? else {
        return Ok(BTreeMap::new());
    };
    let mut out = BTreeMap::new();
    for e in v.as_array().into_iter().flatten() {
        let (Some(id), Some(name)) = (e["nsid"].as_i64(), e["name"].as_str()) else {
            continue;
        };
        let path = format!("{}/{name}", cnilab_net::netns::NETNS_DIR);
        let found = named
            .iter()
            .find(|(_, p)| *p == path)
            .and_then(|(i, _)| by_inode.get(i));
        if let (Some(to), Ok(id)) = (found, i32::try_from(id)) {
            out.insert(id, *to);
        }
    }
    Ok(out)
}

/// Pods and peers of the node (namespace 0), in the order of their inodes
/// as `discover.rs` lists them: where each was found.
fn discover(
    dumped: &BTreeMap<usize, nsid::Dumped>,
    ids: &BTreeMap<(usize, i32), usize>,
    places: &BTreeMap<usize, Place>,
    procs: &[((u64, u64), String)],
) -> (Vec<(usize, PodSource)>, Vec<PodSource>) {
    let mut found: Vec<(usize, nsid::Relation)> = dumped
        .iter()
        .filter(|(k, _)| **k != 0)
        .map(|(k, d)| {
            let node_id = ids
                .iter()
                .find(|((from, _), to)| from == k && **to == 0)
                .map(|((_, id), _)| *id);
            (*k, nsid::relation(&nsid::linked(&d.ends), node_id))
        })
        .collect();
    found.sort_by_key(|(k, _)| places[k].inode);
    let mut pods = Vec::new();
    let mut peers = Vec::new();
    for (k, relation) in found {
        let source = source_of(&places[&k], procs);
        match relation {
            nsid::Relation::Pod => pods.push((k, source)),
            nsid::Relation::Peer => peers.push(source),
            nsid::Relation::None => {}
        }
    }
    (pods, peers)
}

/// Where a namespace was found: its `/run/netns` name, the lowest pid
/// holding it.
fn source_of(place: &Place, procs: &[((u64, u64), String)]) -> PodSource {
    let pid = procs
        .iter()
        .filter(|(i, _)| *i == place.inode)
        .filter_map(|(_, p)| {
            p.strip_prefix("/proc/")?
                .split('/')
                .next()?
                .parse::<u32>()
                .ok()
        })
        .min();
    let netns = place
        .path
        .strip_prefix(cnilab_net::netns::NETNS_DIR)
        .and_then(|n| n.strip_prefix('/'))
        .map(str::to_string);
    PodSource {
        name: netns
            .clone()
            .unwrap_or_else(|| format!("pid:{}", pid.unwrap_or(0))),
        netns,
        pid,
        ..Default::default()
    }
}

/// Sandbox names by namespace inode, from `crictl inspectp` (ready ones,
/// by their pause process).
fn cri_names(
    a: &Archive,
    procs: &[((u64, u64), String)],
    warnings: &mut Vec<String>,
) -> BTreeMap<(u64, u64), String> {
    let mut out = BTreeMap::new();
    for s in a.of(None).filter(|s| s.what == "crictl-inspectp") {
        let v: serde_json::Value = match serde_json::from_str(&s.body) {
            Ok(v) if s.status == 0 => v,
            _ => {
                warnings.push(format!(
                    "CRI sandbox {}: not inspected; pods are named by namespace",
                    s.arg
                ));
                continue;
            }
        };
        // As the native capture names it (`crate::cri::Sandbox::pod_name`).
        let meta = &v["status"]["metadata"];
        let name = match (meta["namespace"].as_str(), meta["name"].as_str()) {
            (Some(ns), Some(n)) if !ns.is_empty() => format!("{ns}/{n}"),
            (_, n) => n.unwrap_or_default().to_string(),
        };
        let pid = v["info"]["pid"].as_u64().unwrap_or(0);
        let at = format!("/proc/{pid}/ns/net");
        match procs.iter().find(|(_, p)| *p == at) {
            Some((inode, _)) if !name.is_empty() => {
                out.insert(*inode, name);
            }
            _ => warnings.push(format!(
                "CRI sandbox {name}: its pause process {pid} was not listed"
            )),
        }
    }
    out
}

/// The node's files of sections `what` (the CNI cache, its configuration),
/// read by the native capture's `reader` from a private copy (its warnings
/// name the node's directory, the header's `dir_field`).
fn node_files<T>(
    a: &Archive,
    (what, dir_field): (&str, &str),
    warnings: &mut Vec<String>,
    reader: impl Fn(&Path, &mut Vec<String>) -> Vec<T>,
) -> Result<Vec<T>, String> {
    let dir = crate::util::ScratchDir::new("cnifiles")
        .map_err(|e| format!("a directory for the node's {what} files: {e}"))?;
    for s in a.of(None).filter(|s| s.what == what && s.status == 0) {
        let name = Path::new(&s.arg)
            .file_name()
            .filter(|n| !s.arg.contains('/') && n.len() < 256)
            .ok_or_else(|| format!("{}: not a file name", s.label()))?;
        std::fs::write(dir.path().join(name), &s.body)
            .map_err(|e| format!("{}: {e}", s.label()))?;
    }
    let mut more = Vec::new();
    let read = reader(dir.path(), &mut more);
    let theirs = a.header.get(dir_field).cloned().unwrap_or_default();
    let ours = dir.path().display().to_string();
    warnings.extend(more.into_iter().map(|w| w.replace(&ours, &theirs)));
    Ok(read)
}

fn provenance(a: &Archive, node_name: &str) -> Result<Provenance, String> {
    Ok(Provenance {
        node_name: node_name.to_string(),
        hostname: a.field("hostname")?.to_string(),
        kernel: a.field("kernel")?.to_string(),
        kernel_version: a.field("kernelVersion")?.to_string(),
        arch: a.field("arch")?.to_string(),
        time: a.field("time")?.to_string(),
        cnilab_version: env!("CARGO_PKG_VERSION").to_string(),
        source: a.field("source")?.to_string(),
        redacted: false,
    })
}

/// One namespace's model, its peers' namespaces by role (`roles`: the
/// node's and its pods'; another namespace is `netnsid N`, as the netlink
/// reader names one it was not given).
fn read_namespace(
    a: &Archive,
    k: usize,
    role: &str,
    mut links: Vec<crate::model::read::RawLink>,
    ids: &BTreeMap<(usize, i32), usize>,
    roles: &BTreeMap<usize, String>,
) -> Result<RawNamespace, String> {
    let mut warnings = Vec::new();
    let what = |e: String| format!("read namespace {role}: {e}");
    let label = |w: &str| format!("section `{k} {w}`");
    let ends = match json_of(a, k, "link")? {
        Some(v) => {
            ip::links(&v)
                .map_err(|e| format!("{}: {e}", label("link")))?
                .1
        }
        None => Vec::new(),
    };
    for (l, e) in links.iter_mut().zip(&ends) {
        if let (Some((_, peer_role)), Some(id)) = (l.peer.as_mut(), e.netnsid) {
            *peer_role = Some(
                ids.get(&(k, id))
                    .and_then(|to| roles.get(to))
                    .cloned()
                    .unwrap_or_else(|| format!("netnsid {id}")),
            );
        }
    }
    let mut ns = ip::namespace(role);
    if let Some(v) = json_of(a, k, "addr")? {
        ip::addresses(&v, &mut links).map_err(|e| format!("{}: {e}", label("addr")))?;
    }
    for (w, v6) in [("route4", false), ("route6", true)] {
        if let Some(v) = json_of(a, k, w)? {
            ns.routes
                .extend(ip::routes(&v, v6).map_err(|e| format!("{}: {e}", label(w)))?);
        }
    }
    for (w, v6) in [("rule4", false), ("rule6", true)] {
        if let Some(v) = json_of(a, k, w)? {
            ns.rules
                .extend(ip::rules(&v, v6).map_err(|e| format!("{}: {e}", label(w)))?);
        }
    }
    if let Some(v) = json_of(a, k, "neigh")? {
        ns.neighbours = ip::neighbours(&v).map_err(|e| format!("{}: {e}", label("neigh")))?;
    }
    if let Some(v) = json_of(a, k, "fdb")? {
        ns.fdb = ip::fdb(&v, &links).map_err(|e| format!("{}: {e}", label("fdb")))?;
    }
    if let Some(v) = json_of(a, k, "qdisc")? {
        ns.qdiscs = ip::qdiscs(&v).map_err(|e| format!("{}: {e}", label("qdisc")))?;
    }
    // A tool the node lacks (`bridge`, `tc`) or that failed: what it
    // would have read is not in the capture, and the warning says so.
    for w in [
        "addr", "route4", "route6", "rule4", "rule6", "neigh", "fdb", "qdisc",
    ] {
        if a.get(Some(k), w).is_some_and(|s| s.status != 0) {
            warnings.push(what(format!(
                "not captured by the script: {w}: {}",
                failure(a, k, w)
            )));
        }
    }
    if let Some(s) = a.get(Some(k), "sysctl") {
        ns.sysctls = ip::sysctls(&s.body);
    }
    firewall_of(a, k, &mut ns, &mut warnings, &what);
    Ok(RawNamespace {
        ns,
        links,
        warnings,
    })
}

/// The namespace's nftables tables and iptables-save text, by the native
/// reader's rules (`model::firewall`).
fn firewall_of(
    a: &Archive,
    k: usize,
    ns: &mut Namespace,
    warnings: &mut Vec<String>,
    what: &dyn Fn(String) -> String,
) {
    match a.get(Some(k), "nft") {
        Some(s) if s.status == 0 => ns.nftables = firewall::tables_of(&s.body),
        Some(_) => warnings.push(what(format!(
            "nft list ruleset: {} (is nftables installed?)",
            failure(a, k, "nft")
        ))),
        None => {}
    }
    let legacy: Vec<(String, Vec<String>)> =
        [("ipv4", "ip_tables_names"), ("ipv6", "ip6_tables_names")]
            .into_iter()
            .filter_map(|(family, w)| firewall::legacy_names_of(family, &a.get(Some(k), w)?.body))
            .collect();
    let (iptables, more) =
        firewall::iptables_with(&legacy, &ns.nftables, |tool| match a.get(Some(k), tool) {
            Some(s) if s.status == 0 => Ok(s.body.clone()),
            Some(_) => Err(failure(a, k, tool)),
            None => Err("not run by the script".to_string()),
        });
    ns.iptables = iptables;
    warnings.extend(more.into_iter().map(what));
}
