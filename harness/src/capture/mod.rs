//! `cnilab capture`: a real node's network as one file, to be replayed
//! (`lab up --capture`, `crate::lab::replay`), probed and diagnosed somewhere else.
//!
//! Where things happen: this file holds the file's types ([`Capture`],
//! `schemaVersion` [`SCHEMA_VERSION`]) and [`capture`], which opens the node
//! (the process's own namespace, or `--netns`), finds its pods
//! (`discover.rs`), reads node and pods with the lab model's reader
//! ([`crate::model::read::read_with_warnings`]: one netlink session per
//! namespace on a dedicated thread inside it) and adds provenance;
//! `redact.rs` maps addresses and names for posting in public; `script/`
//! is the capture of a node without cnilab (`cnilab capture --script`: a
//! `sh` script's file of `ip -j` and friends, read into the same
//! [`Capture`] through [`name_pods`] and [`finish`], as [`capture`] reads
//! netlink).
//!
//! # The file (schemaVersion 1)
//! One JSON object:
//! - `schemaVersion`: 1; a reader refuses a newer one.
//! - `provenance`: `nodeName`, `hostname`, `kernel` (`uname -r`),
//!   `kernelVersion` (`uname -v`), `arch`, `time` (RFC 3339, UTC),
//!   `cnilabVersion`, `source` (`host` or the `--netns` path), `redacted`.
//! - `node`: the lab model's [`Node`](crate::model::Node): the node's
//!   namespace (`name` = the node name; `links`, `routes` of every table,
//!   `rules`, `neighbours`, `fdb`, `nftables` (iptables-nft included),
//!   `iptables` (iptables-save text: legacy tables, and iptables-nft's with their comments), `sysctls`, `qdiscs`), `podCidrs` (empty: a node does
//!   not say; replay derives them from the pods), and `pods`: one model
//!   namespace per pod, with the same fields. A node veth's `veth.namespace`
//!   and a pod macvlan's `lower.namespace` name the pod (or the node).
//!   What the model leaves out (routes the kernel makes from addresses,
//!   non-permanent neighbours, learned FDB entries, counters) is left out
//!   here too: `harness/src/model/mod.rs` lists it.
//! - `pods`: where each pod was found, by the name used in `node.pods`:
//!   `netns` (its name under `/run/netns`, or the path of a mount that
//!   names it elsewhere, Docker's `/run/docker/netns/<id>`), `pid` (the
//!   lowest process that holds it), `cri` (the sandbox name a CRI socket
//!   gave); `evidence`, what says it is a pod, and `skipped`, why a
//!   namespace linked like one is not (`evidence.rs`).
//! - `peers`: namespaces linked to the node that are not pods (an uplink's
//!   switch, router or NAT box), named and not read.
//! - `warnings`: what could not be read (a missing `nft` or
//!   `iptables-legacy-save`, a process whose namespace was not readable, a
//!   CRI socket that did not answer). Capture never fails for these.
//!
//! # Which namespaces are pods
//! Every network namespace on the machine, named under `/run/netns`,
//! mounted elsewhere (an `nsfs` mount in `/proc/self/mountinfo`) or only
//! held by a process (`/proc/<pid>/ns/net`), deduplicated by inode, except
//! the node's own and the machine's (`/proc/1/ns/net`, and the one capture
//! runs in), is a pod when
//! it has a veth, macvlan or ipvlan whose other end (or lower device) is in
//! the node's namespace, none of those is a bridge port, and it has no such
//! link into a third namespace (those join the node to others: `peers`).
//! A pod's name is its CRI sandbox's `<namespace>/<name>` where a socket
//! answers, else its `/run/netns` name, else the name of the file it is
//! mounted at, else `pid:<n>`. Whether a replay probes it is decided by
//! evidence, never by that name (`evidence.rs`).
//!
//! Capture only reads: netlink dumps, `/proc/sys`, `nft list ruleset`,
//! `iptables-legacy-save` only where `/proc/net/ip_tables_names` lists
//! tables. The root tests assert each namespace is the same before and after.

pub mod bundle;
mod check;
pub mod cni_conf;
mod discover;
pub mod evidence;
pub mod redact;
pub mod script;

use crate::model::{self, read::Layout, read::NodeLayout, Node};
use cnilab_net::netns as plugin_netns;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The version of the capture file; bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// A loaded capture and where it came from (`crate::lab::replay::load`).
pub struct Loaded {
    pub path: PathBuf,
    pub capture: Capture,
}

/// One node's capture.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capture {
    pub schema_version: u32,
    pub provenance: Provenance,
    pub node: Node,
    #[serde(default)]
    pub pods: Vec<PodSource>,
    #[serde(default)]
    pub peers: Vec<PodSource>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    pub node_name: String,
    pub hostname: String,
    pub kernel: String,
    pub kernel_version: String,
    pub arch: String,
    pub time: String,
    pub cnilab_version: String,
    /// `host` or the `--netns` path.
    pub source: String,
    pub redacted: bool,
}

/// Where a pod's (or a peer's) namespace was found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSource {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cri: Option<String>,
    /// What says it is a pod ([`evidence`]); empty for a peer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// Why it is no pod after all, though linked like one (a gateway
    /// beside the node) or why it is not probed (no address yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// What to capture.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The node's namespace (`None`: the process's own).
    pub netns: Option<PathBuf>,
    pub node_name: Option<String>,
    /// CRI sockets to ask for pod names (empty: the usual places).
    pub cri_sockets: Vec<PathBuf>,
    /// Redact with this key.
    pub redact: Option<Vec<u8>>,
    /// The node's CNI cache (`None`: [`evidence::CNI_CACHE`] when the
    /// node is this machine, none for `netns`).
    pub cni_cache: Option<PathBuf>,
    /// The node's CNI configuration directory (`None`:
    /// [`cni_conf::CNI_CONF_DIR`] when the node is this machine, none for
    /// `netns`).
    pub cni_conf_dir: Option<PathBuf>,
}

/// The usual CRI sockets, asked when they exist.
pub const CRI_SOCKETS: &[&str] = &[
    "/run/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/run/k3s/containerd/containerd.sock",
    "/run/cri-dockerd.sock",
];

/// `--netns NAME|PATH` as a path: a bare name is under `/run/netns`.
pub fn netns_path(arg: &str) -> PathBuf {
    if arg.contains('/') {
        PathBuf::from(arg)
    } else {
        Path::new(plugin_netns::NETNS_DIR).join(arg)
    }
}

/// Opens the node's namespace, with the fix in the error.
pub fn open_node(netns: Option<&Path>) -> Result<std::fs::File, String> {
    let Some(path) = netns else {
        return plugin_netns::open_network_namespace("/proc/self/ns/net")
            .map_err(|e| format!("{e} (capture runs as root)"));
    };
    plugin_netns::open_network_namespace(path).map_err(|e| {
        format!(
            "--netns {}: {e}; give a name listed by `ip netns list` or a path such as /proc/<pid>/ns/net",
            path.display()
        )
    })
}

/// Captures the node and its pods (see the module's header).
pub fn capture(opts: &Options) -> Result<Capture, String> {
    let found = discover_node(opts)?;
    let (node, mut warnings) = read_node(&found)?;
    warnings.extend(found.warnings);
    // The machine's own files belong to a node only when it is the node.
    let own = |given: &Option<PathBuf>, usual: &str| {
        given
            .clone()
            .or_else(|| opts.netns.is_none().then(|| PathBuf::from(usual)))
    };
    let cache = own(&opts.cni_cache, evidence::CNI_CACHE)
        .map(|d| evidence::cni_cache(&d, &mut warnings))
        .unwrap_or_default();
    let confs = own(&opts.cni_conf_dir, cni_conf::CNI_CONF_DIR)
        .map(|d| cni_conf::read_dir(&d, &mut warnings))
        .unwrap_or_default();
    let read = Read {
        node,
        pods: found.pods,
        peers: found.linked.peers,
        warnings,
    };
    Ok(finish(
        read,
        (&cache, &confs),
        provenance(&found.name, opts.netns.as_deref()),
        opts.redact.as_deref(),
    ))
}

/// A node's namespace and the pods linked to it, named, not yet read.
struct Discovered {
    file: std::fs::File,
    name: String,
    linked: discover::Linked,
    /// `linked.pods`, named as a capture names them.
    pods: Vec<PodSource>,
    warnings: Vec<String>,
}

fn discover_node(opts: &Options) -> Result<Discovered, String> {
    let file = open_node(opts.netns.as_deref())?;
    let name = opts.node_name.clone().unwrap_or_else(|| match &opts.netns {
        Some(p) => discover::name_of_path(p),
        None => hostname(),
    });
    let mut warnings = Vec::new();
    let linked = discover::linked(&file, &mut warnings);
    let cri = discover::cri_names(&opts.cri_sockets, &mut warnings);
    let pods = name_pods(
        &name,
        linked
            .pods
            .iter()
            .map(|f| (f.source.clone(), cri.get(&f.inode).cloned())),
    );
    Ok(Discovered {
        file,
        name,
        linked,
        pods,
        warnings,
    })
}

/// The node and its pods read into the model, with what could not be read.
fn read_node(found: &Discovered) -> Result<(Node, Vec<String>), String> {
    let layout = Layout {
        name: found.name.clone(),
        underlay: Vec::new(),
        nodes: vec![NodeLayout {
            name: found.name.clone(),
            ns: &found.file,
            pod_cidrs: Vec::new(),
            pods: found
                .pods
                .iter()
                .zip(&found.linked.pods)
                .map(|(s, f)| (s.name.clone(), &f.file))
                .collect(),
        }],
    };
    let (mut read, warnings) = model::read::read_with_warnings(&layout)?;
    let node = read
        .nodes
        .pop()
        .ok_or_else(|| format!("node {}: nothing read", found.name))?;
    Ok((node, warnings))
}

/// A live node as the tracer opens it: the node's namespace and each
/// pod's, by path, with the pods' addresses as read.
pub struct LiveNode {
    pub name: String,
    pub path: PathBuf,
    pub pods: Vec<LivePod>,
    pub warnings: Vec<String>,
}

pub struct LivePod {
    pub source: PodSource,
    pub path: PathBuf,
    pub addresses: Vec<std::net::IpAddr>,
}

/// The node and its pods, found as [`capture`] finds them, for tracing
/// in place.
pub fn live(opts: &Options) -> Result<LiveNode, String> {
    let found = discover_node(opts)?;
    let (node, mut warnings) = read_node(&found)?;
    warnings.extend(found.warnings.iter().cloned());
    let pods = found
        .pods
        .iter()
        .zip(&found.linked.pods)
        .map(|(source, f)| LivePod {
            source: source.clone(),
            path: f.path.clone(),
            addresses: node
                .pods
                .iter()
                .find(|p| p.name == source.name)
                .map(|p| evidence::addresses(p).iter().map(|a| a.addr()).collect())
                .unwrap_or_default(),
        })
        .collect();
    let path = match &opts.netns {
        Some(p) => p.clone(),
        None => own_namespace_path(),
    };
    Ok(LiveNode {
        name: found.name,
        path,
        pods,
        warnings,
    })
}

/// A path to this process's namespace that a user can give `nsenter`:
/// pid 1's when it is the same.
fn own_namespace_path() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &str| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    match id("/proc/1/ns/net") {
        Some(one) if Some(one) == id("/proc/self/ns/net") => PathBuf::from("/proc/1/ns/net"),
        _ => PathBuf::from(format!("/proc/{}/ns/net", std::process::id())),
    }
}

/// The pods found (each with its CRI sandbox name, if any), named: the
/// sandbox name, else the namespace's, made unique beside the node's.
pub(crate) fn name_pods(
    node_name: &str,
    found: impl Iterator<Item = (PodSource, Option<String>)>,
) -> Vec<PodSource> {
    let mut taken = vec![node_name.to_string()];
    found
        .map(|(mut source, cri)| {
            source.cri = cri;
            let base = source.cri.clone().unwrap_or_else(|| source.name.clone());
            source.name = unique(&base, &mut taken);
            source
        })
        .collect()
}

/// What a capture read of a node, however it read it (netlink here, the
/// capture script's file in `script`).
pub(crate) struct Read {
    pub node: Node,
    pub pods: Vec<PodSource>,
    pub peers: Vec<PodSource>,
    pub warnings: Vec<String>,
}

/// The capture of what was read: each pod's evidence (recorded: its CRI
/// sandbox, the CNI cache and configuration `files`; then judged on the
/// file's own, redacted model), redacted with `redact` if given.
pub(crate) fn finish(
    read: Read,
    (cache, confs): (&[evidence::CacheEntry], &[cni_conf::Conf]),
    provenance: Provenance,
    redact: Option<&[u8]>,
) -> Capture {
    let Read {
        node,
        mut pods,
        peers,
        warnings,
    } = read;
    let held: Vec<_> = pods
        .iter()
        .map(|s| {
            let addrs = node
                .pods
                .iter()
                .find(|p| p.name == s.name)
                .map(evidence::addresses)
                .unwrap_or_default();
            (s.name.clone(), s.cri.clone(), addrs)
        })
        .collect();
    let mut recorded = evidence::recorded(&held, cache, confs);
    for s in &mut pods {
        s.evidence = recorded.remove(&s.name).unwrap_or_default();
    }
    let mut capture = Capture {
        schema_version: SCHEMA_VERSION,
        provenance,
        node,
        pods,
        peers,
        warnings,
    };
    if let Some(key) = redact {
        redact::Redactor::new(key).capture(&mut capture);
    }
    // What the model says, read from the file's own (redacted) model.
    let Capture { node, pods, .. } = &mut capture;
    for s in pods.iter_mut() {
        if let Some(pod) = node.pods.iter().find(|p| p.name == s.name) {
            let judged = evidence::judge(node, pod, &s.evidence);
            s.evidence = judged.evidence;
            s.skipped = judged.skipped;
        }
    }
    capture
}

/// `base`, or `base#2`, `base#3`… when taken.
pub(crate) fn unique(base: &str, taken: &mut Vec<String>) -> String {
    let mut name = base.to_string();
    let mut n = 1;
    while taken.contains(&name) {
        n += 1;
        name = format!("{base}#{n}");
    }
    taken.push(name.clone());
    name
}

fn proc_sys(key: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/kernel/{key}"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn hostname() -> String {
    proc_sys("hostname")
}

fn provenance(node_name: &str, netns: Option<&Path>) -> Provenance {
    Provenance {
        node_name: node_name.to_string(),
        hostname: hostname(),
        kernel: proc_sys("osrelease"),
        kernel_version: proc_sys("version"),
        arch: std::env::consts::ARCH.to_string(),
        time: rfc3339(std::time::SystemTime::now()),
        cnilab_version: env!("CARGO_PKG_VERSION").to_string(),
        source: netns.map_or("host".to_string(), |p| p.display().to_string()),
        redacted: false,
    }
}

/// `2026-11-25T00:14:28Z`.
pub(crate) fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The largest capture file [`load`] reads: 64 MiB. A node of 512 pods
/// with a few thousand kube-proxy rules is a few MiB; a bigger file is
/// refused before one byte of it is parsed.
pub const MAX_BYTES: u64 = 64 << 20;

/// A reader that fails once more than [`MAX_BYTES`] came through (a file
/// that grows while it is read, or one `stat` cannot size).
struct Capped<R> {
    inner: R,
    read: u64,
    limit: u64,
}

impl<R: std::io::Read> std::io::Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("larger than the {} MiB a capture may be", self.limit >> 20),
            ));
        }
        Ok(n)
    }
}

/// The file's bytes as a stream: a regular file of at most `limit` bytes
/// (opened without blocking, so a FIFO is refused rather than waited on),
/// or a scenario's built-in copy (`crate::assets`).
fn open_capped(path: &Path, limit: u64) -> Result<impl std::io::Read, String> {
    open_capped_as(path, limit, ("a capture", "cnilab capture -o FILE"))
}

/// [`open_capped`] for a file of another kind: `what` it is and the
/// command that writes one, for the messages.
pub fn open_capped_as(
    path: &Path,
    limit: u64,
    (what, writer): (&str, &str),
) -> Result<impl std::io::Read, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display();
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path);
    let inner: Box<dyn std::io::Read> = match opened {
        Ok(file) => {
            let meta = file.metadata().map_err(|e| format!("{shown}: {e}"))?;
            if !meta.is_file() {
                return Err(format!(
                    "{shown}: not a regular file; give {what} file ({writer})"
                ));
            }
            if meta.len() > limit {
                return Err(format!(
                    "{shown}: {} bytes, larger than the {} MiB {what} may be",
                    meta.len(),
                    limit >> 20
                ));
            }
            Box::new(file)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match crate::assets::builtin(path) {
            Some(bytes) => Box::new(bytes),
            None => return Err(format!("{shown}: {e}")),
        },
        Err(e) => return Err(format!("{shown}: {e}")),
    };
    // serde_json reads a byte at a time: the buffer is outermost.
    Ok(std::io::BufReader::with_capacity(
        1 << 16,
        Capped {
            inner,
            read: 0,
            limit,
        },
    ))
}

/// Only the version, every other value skipped without being kept.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Version {
    #[serde(default)]
    schema_version: serde_json::Value,
}

/// Reads a capture file: the capture script's file (told by its first
/// line, read by [`script::convert`]), or JSON of a schema this cnilab knows, at most
/// [`MAX_BYTES`], streamed into the typed capture (never whole into
/// memory, never into a `serde_json::Value`; a value nested where none is due refused at its first
/// byte, nesting deeper than serde_json's 128 levels refused), then every field checked
/// (`check.rs`).
pub fn load(path: &Path) -> Result<Capture, String> {
    let shown = path.display();
    // The capture script's file (`cnilab capture --script`) by its first line.
    let mut first = [0u8; 32];
    let n = std::io::Read::read(&mut open_capped(path, MAX_BYTES)?, &mut first)
        .map_err(|e| format!("{shown}: {e}"))?;
    if script::is_script(&first[..n]) {
        return script::convert(path, &script::Options::default());
    }
    let newer = |v: u64| {
        format!("{shown}: schemaVersion {v} is newer than this cnilab's {SCHEMA_VERSION}; use a newer cnilab")
    };
    let parsed: Result<Capture, _> = serde_json::from_reader(open_capped(path, MAX_BYTES)?);
    let capture = match parsed {
        Ok(c) => c,
        Err(e) => {
            // A newer file may differ anywhere: say so rather than the field.
            let version: Option<Version> =
                serde_json::from_reader(open_capped(path, MAX_BYTES)?).ok();
            let v = version.and_then(|v| v.schema_version.as_u64()).unwrap_or(0);
            if v > u64::from(SCHEMA_VERSION) {
                return Err(newer(v));
            }
            return Err(match e.classify() {
                serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                    format!("{shown}: not JSON: {e}")
                }
                _ => format!("{shown}: {e}"),
            });
        }
    };
    if capture.schema_version > SCHEMA_VERSION {
        return Err(newer(u64::from(capture.schema_version)));
    }
    check::check(&capture).map_err(|e| format!("{shown}: {e}"))?;
    Ok(capture)
}

/// Reads a file of one or more captures: a node's capture ([`load`]: the
/// script's file or JSON), or a cluster's bundle ([`bundle::load`]: each
/// node's capture in it).
pub fn load_all(path: &Path) -> Result<Vec<Capture>, String> {
    let mut first = [0u8; 32];
    let n = std::io::Read::read(&mut open_capped(path, bundle::MAX_BYTES)?, &mut first)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !script::is_script(&first[..n]) && bundle::is_bundle(path)? {
        let b = bundle::load(path)?;
        return bundle::captures(b).map_err(|e| format!("{}: {e}", path.display()));
    }
    Ok(vec![load(path)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn rfc3339_is_the_civil_date() {
        let at = |s: u64| rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_795_566_868), "2026-11-25T00:34:28Z");
    }

    #[test]
    fn load_refuses_a_newer_schema_and_reads_its_own() {
        let dir = std::env::temp_dir().join(format!("cnilab-capture-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("node.json");
        let c = Capture {
            schema_version: SCHEMA_VERSION,
            provenance: provenance("n1", None),
            node: Node::default(),
            pods: Vec::new(),
            peers: Vec::new(),
            warnings: vec!["w".into()],
        };
        std::fs::write(&file, serde_json::to_string(&c).expect("json")).expect("write");
        assert_eq!(load(&file), Ok(c));
        std::fs::write(&file, r#"{"schemaVersion": 2}"#).expect("write");
        let e = load(&file).expect_err("newer");
        assert!(
            e.contains("schemaVersion 2 is newer") && e.contains("node.json"),
            "{e}"
        );
        std::fs::write(&file, r#"{"schemaVersion": 1, "provenance": {}}"#).expect("write");
        assert!(load(&file).expect_err("truncated").contains("node.json"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_oversize_a_deep_or_a_special_file_is_refused_before_parsing() {
        let dir = tempfile::tempdir().expect("dir");
        let big = dir.path().join("big.json");
        let f = std::fs::File::create(&big).expect("create");
        // Sparse: the size is refused from `stat`, nothing is read.
        f.set_len(MAX_BYTES + 1).expect("set_len");
        let e = load(&big).expect_err("oversize");
        assert!(
            e.contains("larger than the 64 MiB") && e.contains("big.json"),
            "{e}"
        );
        let deep = dir.path().join("deep.json");
        // Skipped where unknown (serde_json skips without recursing, the
        // model reads `node` without buffering it: `model/wire.rs`), refused
        // at its first `[` where a string is due: each a clean error, never
        // a stack overflow.
        let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        for (at, says) in [
            (format!("\"x\": {nested}"), "missing field `provenance`"),
            (format!("\"node\": {{\"x\": {nested}}}"), "missing field `name`"),
            (format!("\"node\": {{\"name\": \"n\", \"links\": [{{\"name\": \"a\", \"up\": true, \"kind\": {nested}}}]}}"), "invalid type: sequence, expected a string"),
        ] {
            std::fs::write(&deep, format!("{{\"schemaVersion\": 1, {at}}}")).expect("write");
            let e = load(&deep).expect_err("deep");
            assert!(e.contains(says) && e.contains("deep.json"), "{says}: {e}");
        }
        let fifo = dir.path().join("fifo.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let e = load(&fifo).expect_err("fifo");
        assert!(e.contains("not a regular file"), "{e}");
        let grows = Capped {
            inner: std::io::repeat(b' ').take(MAX_BYTES + 10),
            read: 0,
            limit: MAX_BYTES,
        };
        let e = serde_json::from_reader::<_, Capture>(grows).expect_err("endless");
        assert!(e.to_string().contains("64 MiB"), "{e}");
    }

    #[test]
    fn a_taken_name_gets_a_number() {
        let mut taken = vec!["node".to_string()];
        assert_eq!(unique("a", &mut taken), "a");
        assert_eq!(unique("a", &mut taken), "a#2");
        assert_eq!(unique("node", &mut taken), "node#2");
    }
}
