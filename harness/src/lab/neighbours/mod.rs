//! The host-wide neighbour tables (ARP for IPv4, NDP for IPv6) and a lab
//! of any size.
//!
//! The kernel keeps ONE neighbour table per family for every namespace of
//! the machine; `gc_thresh3` (1024 by default) caps its garbage-collectable
//! entries. A lab of 1,000 pods needs about four entries per pod (the pod's
//! gateway, its two same-node peers — the one it probes and the one that
//! probes it —, the node's entry for the pod): far more than
//! the table holds, and the overflow drops packets ("neighbor table
//! overflow"), which would look like a plugin bug.
//!
//! What the lab does about it, before the first probe:
//! 1. it computes the entries the lab needs ([`need`]) and the room the host
//!    has (`gc_thresh3` minus the entries in use now);
//! 2. if the need fits, nothing changes;
//! 3. if not, the bulk probe paths get PERMANENT entries ([`pin_bulk`]),
//!    which Linux ≥ 4.20 does not count against `gc_thresh3`: every pod but
//!    the first of each node ("the sample") and the node's entries for those
//!    pods. The sample pods and the underlay keep resolving through real
//!    ARP/NDP, so the plugin's neighbour handling is still proven;
//! 4. if even that does not fit, the run is refused up front with the numbers
//!    and the remedy — or, with `--tune-host`, `gc_thresh1/2/3` are raised
//!    for the run and restored afterwards (also on Ctrl-C), with room for
//!    the link-local and multicast entries every interface puts in the IPv6
//!    table too ([`link_local`]), whatever the pods' families.
//!
//! During the run the kernel's own counters (`table_fulls` in
//! `/proc/net/stat/arp_cache` and `ndisc_cache`, the input backlog's drops
//! in `/proc/net/softnet_stat`) and ENOBUFS from probes are watched: if the
//! simulator hit a host limit anyway, failures make the verdict
//! INCONCLUSIVE, never FAIL (`watch.rs`).

mod watch;

pub use watch::Watch;

use super::topology::Topology;
use super::{base::LabError, built::Lab};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Mutex;

/// Entries left free for everything else on the host.
const MARGIN: u64 = 64;

fn family_name(v6: bool) -> &'static str {
    if v6 {
        "IPv6 (NDP)"
    } else {
        "IPv4 (ARP)"
    }
}

fn sysctl_dir(v6: bool) -> &'static str {
    if v6 {
        "/proc/sys/net/ipv6/neigh/default"
    } else {
        "/proc/sys/net/ipv4/neigh/default"
    }
}

/// `gc_thresh1`, `gc_thresh2`, `gc_thresh3` of one family's table.
pub fn thresholds(v6: bool) -> Result<[u64; 3], String> {
    let mut out = [0; 3];
    for (i, slot) in out.iter_mut().enumerate() {
        let path = format!("{}/gc_thresh{}", sysctl_dir(v6), i + 1);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        *slot = text
            .trim()
            .parse()
            .map_err(|_| format!("{path}: not a number: {text:?}"))?;
    }
    Ok(out)
}

/// The kernel's counters of one family's neighbour table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Entries now (every namespace, permanent ones included).
    pub entries: u64,
    /// Times an entry could not be made because the table was full.
    pub table_fulls: u64,
}

/// Parses `/proc/net/stat/arp_cache` (or `ndisc_cache`): a header, then one
/// row of hexadecimal counters per CPU; `entries` is the same on every row,
/// `table_fulls` is per CPU.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let entries_col = header.iter().position(|h| *h == "entries")?;
    let fulls_col = header.iter().position(|h| *h == "table_fulls")?;
    let mut stat = Stat::default();
    for (i, line) in lines.enumerate() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let hex = |c: usize| u64::from_str_radix(cols.get(c)?, 16).ok();
        if i == 0 {
            stat.entries = hex(entries_col)?;
        }
        stat.table_fulls += hex(fulls_col)?;
    }
    Some(stat)
}

pub fn read_stat(v6: bool) -> Result<Stat, String> {
    let path = if v6 {
        "/proc/net/stat/ndisc_cache"
    } else {
        "/proc/net/stat/arp_cache"
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    parse_stat(&text).ok_or_else(|| format!("{path}: unexpected format"))
}

/// Neighbour entries one family of a lab needs at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub v6: bool,
    /// Entries that resolve through ARP/NDP (count against `gc_thresh3`)
    /// when nothing is pinned.
    pub all_dynamic: u64,
    /// Dynamic entries left when the bulk paths are pinned.
    pub dynamic_when_pinned: u64,
    /// Permanent entries pinning makes.
    pub pinned: u64,
    /// Entries the kernel makes on its own for every interface with IPv6
    /// (see [`link_local`]); 0 for IPv4.
    pub link_local: u64,
}

/// The entries the kernel puts in the IPv6 table on its own, whatever the
/// pods' families, counted with `ip -6 neigh show nud all` in every
/// namespace of a generated 2×10 lab once it had settled (124 entries):
/// - each pod: `ff02::16` (MLD), `ff02::2` (router solicitation) and its
///   solicited-node address on `eth0` (NOARP multicast), and on its node
///   `ff02::16` on the host-side veth and the pod's `fe80::` address on the
///   bridge (the node forwards, so it learns every router solicitation's
///   sender): 5;
/// - each node: `ff02::16` on `eth0` and on the bridge, and the `fe80::` of
///   every other host on the underlay (the other nodes, the external host,
///   the switch's own port);
/// - the switch: 3 on each port (nodes, external host, its own);
/// - the external host (not a router): 2.
///
/// The garbage collector may reclaim them when idle, so they never make a
/// lab refused; `--tune-host` makes room for them.
pub fn link_local(topo: &Topology) -> u64 {
    let nodes = topo.nodes.len() as u64;
    let external = topo.external.is_some() as u64;
    let pods = nodes * topo.pods_per_node as u64;
    let underlay_hosts = nodes + external + 1;
    pods * 5 + nodes * (2 + underlay_hosts - 1) + 3 * underlay_hosts + 2 * external
}

/// The entries a topology needs, per family: IPv4 when its pods have it,
/// IPv6 always (its table takes every interface's link-local entries,
/// [`link_local`]). Per pod of the family: its
/// gateway, its same-node peers (on-link with a bridge: the next pod, which
/// it probes, and the previous one, which probes it and gets the replies),
/// the node's entry for it; the underlay: every node knows every other node and the external
/// host, which knows every node.
pub fn need(topo: &Topology) -> Vec<Need> {
    let mut out = Vec::new();
    for v6 in [false, true] {
        let link_local = if v6 { link_local(topo) } else { 0 };
        let nodes = topo
            .nodes
            .iter()
            .filter(|n| n.pod_cidr_of(v6).is_some())
            .count() as u64;
        if nodes == 0 {
            if link_local > 0 {
                out.push(Need {
                    v6,
                    all_dynamic: 0,
                    dynamic_when_pinned: 0,
                    pinned: 0,
                    link_local,
                });
            }
            continue;
        }
        let with_address = topo
            .nodes
            .iter()
            .filter(|n| n.address_of(v6).is_some())
            .count() as u64;
        let external = topo
            .external
            .as_ref()
            .and_then(|e| e.address_of(v6))
            .is_some() as u64;
        let underlay = with_address * with_address.saturating_sub(1) + 2 * with_address * external;
        let pods = topo.pods_per_node as u64;
        let per_pod = match pods {
            1 => 2,
            2 => 3,
            _ => 4,
        };
        let all = nodes * pods * per_pod + underlay;
        let sample = nodes * per_pod.min(pods * per_pod);
        let dynamic = sample + underlay;
        out.push(Need {
            v6,
            all_dynamic: all,
            dynamic_when_pinned: dynamic,
            pinned: all - dynamic,
            link_local,
        });
    }
    out
}

/// How the lab will stay within the host's neighbour tables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostFit {
    /// Pin the bulk paths with permanent entries.
    pub pin: bool,
    /// Raise these thresholds (path, new value) for the run.
    pub tune: Vec<(PathBuf, u64)>,
    /// What was decided, for the run's header.
    pub summary: String,
    /// The tables could not be read: nothing was decided.
    pub unchecked: bool,
}

/// The room one family's table has for the lab: `gc_thresh3` minus a
/// margin minus the entries in use now, counted up to a quarter of the
/// table. The kernel's count includes permanent entries (which do not
/// count against the limit) and the entries of namespaces being torn down,
/// and the garbage collector reclaims idle entries once the table passes
/// `gc_thresh2`: the moment's count is no measure of what others will hold.
/// Whatever happens during the run, the counters are watched.
fn room(v6: bool) -> Result<(u64, u64, u64), String> {
    let [_, _, t3] = thresholds(v6)?;
    let used = read_stat(v6)?.entries;
    let room = t3.saturating_sub(MARGIN).saturating_sub(used.min(t3 / 4));
    Ok((room, t3, used))
}

/// Decides, before anything is built, how the lab fits the host's tables;
/// `Err` (a usage/environment error) with the numbers and the remedies when
/// it cannot.
pub fn fit(topo: &Topology, tune_host: bool) -> Result<HostFit, String> {
    let needs = need(topo);
    let mut rooms = Vec::new();
    for n in &needs {
        match room(n.v6) {
            Ok(r) => rooms.push((n, r)),
            // A host without IPv6 has no table for the link-local entries.
            Err(_) if n.all_dynamic == 0 => {}
            // No /proc/net/stat here: nothing to decide with; the run goes
            // ahead as before and says so.
            Err(e) => {
                return Ok(HostFit {
                    summary: format!("the host's neighbour tables were not checked: {e}"),
                    unchecked: true,
                    ..HostFit::default()
                })
            }
        }
    }
    decide(&rooms, tune_host)
}

fn decide(rooms: &[(&Need, (u64, u64, u64))], tune_host: bool) -> Result<HostFit, String> {
    if rooms.iter().all(|(n, (room, _, _))| n.all_dynamic <= *room) {
        return Ok(HostFit {
            summary: "neighbour entries fit the host's tables".into(),
            ..HostFit::default()
        });
    }
    if tune_host {
        let mut tune = Vec::new();
        for (n, (_, t3, used)) in rooms {
            let want3 = (used + n.all_dynamic + n.link_local + 2 * MARGIN).max(*t3);
            if want3 > *t3 {
                let dir = PathBuf::from(sysctl_dir(n.v6));
                tune.push((dir.join("gc_thresh1"), want3 / 8));
                tune.push((dir.join("gc_thresh2"), want3 / 2));
                tune.push((dir.join("gc_thresh3"), want3));
            }
        }
        let summary = format!(
            "--tune-host: raising {} for the run (restored afterwards)",
            tune.iter()
                .map(|(p, v)| format!("{}={v}", p.display()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Ok(HostFit {
            pin: false,
            tune,
            summary,
            unchecked: false,
        });
    }
    if rooms
        .iter()
        .all(|(n, (room, _, _))| n.dynamic_when_pinned <= *room)
    {
        let pinned: u64 = rooms.iter().map(|(n, _)| n.pinned).sum();
        return Ok(HostFit {
            pin: true,
            tune: Vec::new(),
            unchecked: false,
            summary: format!(
                "the lab needs more neighbour entries than the host's tables hold: {pinned} permanent entries pin the bulk probe paths; the first pod of each node and the underlay resolve through real ARP/NDP"
            ),
        });
    }
    let lines: Vec<String> = rooms
        .iter()
        .filter(|(n, _)| n.all_dynamic > 0)
        .map(|(n, (room, t3, used))| {
            format!(
                "{}: needs {} entries ({} even with the bulk paths pinned), the table holds gc_thresh3 = {t3} with {used} in use, room for {room}",
                family_name(n.v6),
                n.all_dynamic,
                n.dynamic_when_pinned
            )
        })
        .collect();
    Err(format!(
        "this lab does not fit the host's neighbour tables (one per family, shared by every namespace): {}. Remedies: pass --tune-host to `cnilab lab run` (raises net.ipv4/ipv6.neigh.default.gc_thresh1/2/3 for the run and restores them), or use fewer nodes (the underlay needs nodes² entries)",
        lines.join("; ")
    ))
}

/// Thresholds to put back (path, old value), also from the Ctrl-C handler.
static RESTORE: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

/// Puts back every threshold `--tune-host` changed.
pub fn restore_host() {
    if let Ok(mut list) = RESTORE.lock() {
        while let Some((path, old)) = list.pop() {
            if let Err(e) = std::fs::write(&path, &old) {
                eprintln!("cnilab: cannot restore {} to {old}: {e}", path.display());
            }
        }
    }
}

/// Holds the raised thresholds; dropping it restores them.
pub struct HostTuning(());

impl HostTuning {
    /// Raises the thresholds of `fit` (nothing when there are none).
    /// gc_thresh3 is raised first so that the three stay ordered.
    pub fn apply(fit: &HostFit) -> Result<HostTuning, String> {
        let mut order = fit.tune.clone();
        order.sort_by_key(|(p, _)| std::cmp::Reverse(p.clone()));
        for (path, value) in order {
            let old =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            if let Ok(mut list) = RESTORE.lock() {
                list.insert(0, (path.clone(), old.trim().to_string()));
            }
            if let Err(e) = std::fs::write(&path, value.to_string()) {
                restore_host();
                return Err(format!("--tune-host: {}: {e}", path.display()));
            }
        }
        Ok(HostTuning(()))
    }
}

impl Drop for HostTuning {
    fn drop(&mut self) {
        restore_host();
    }
}

fn mac_bytes(mac: &str) -> Option<Vec<u8>> {
    let bytes: Option<Vec<u8>> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).ok())
        .collect();
    bytes.filter(|b| b.len() == 6)
}

/// The longest-prefix unicast route of the main table to `dst`.
fn lookup(routes: &[crate::netns::Route], dst: IpAddr) -> Option<&crate::netns::Route> {
    routes
        .iter()
        .filter(|r| r.table == 254 && r.unicast && r.dst.contains(&dst))
        .max_by_key(|r| r.dst.prefix_len())
}

/// One permanent entry to add: in which namespace (node `n`, pod `p` or
/// the node itself), on which link, for which address, which MAC.
struct Pin {
    node: usize,
    pod: Option<usize>,
    index: u32,
    addr: IpAddr,
    mac: Vec<u8>,
}

/// What a pod's namespace looks like to the pinning: its `eth0` and routes.
struct PodView {
    eth0: Option<(u32, Vec<u8>)>,
    routes: Vec<crate::netns::Route>,
}

/// Adds PERMANENT neighbour entries for the bulk probe paths: in every pod
/// but the first of each node, its gateway and its on-link same-node peer;
/// in every node, its pods but the first. Found from the kernel objects the
/// plugin made (the node's route to each pod gives the link, the pod's
/// route to each destination gives the next hop), so it works for any
/// plugin; a path it cannot work out is left to ARP/NDP. Returns how many
/// entries were added.
pub fn pin_bulk(lab: &Lab) -> Result<usize, LabError> {
    let views = pod_views(lab);
    let pins = plan_pins(lab, &views)?;
    let total = pins.len();
    install_pins(lab, pins)?;
    Ok(total)
}

/// Every pod's eth0 (index, MAC) and routes, read in parallel, by node.
fn pod_views(lab: &Lab) -> Vec<Vec<PodView>> {
    // Pods' eth0 and routes, read in parallel.
    std::thread::scope(|s| {
        let jobs: Vec<Vec<_>> = lab
            .nodes
            .iter()
            .map(|node| {
                node.pods
                    .iter()
                    .map(|pod| {
                        s.spawn(move || {
                            pod.ns.netlink(|h| async move {
                                let eth0 = cnilab_net::nl::link_by_name(&h, "eth0").await?;
                                let routes = cnilab_net::nl::all_routes(&h).await?;
                                Ok((eth0, routes))
                            })
                        })
                    })
                    .collect()
            })
            .collect();
        jobs.into_iter()
            .map(|node| {
                node.into_iter()
                    .map(|j| match j.join() {
                        Ok(Ok((eth0, routes))) => PodView {
                            eth0: eth0.and_then(|l| Some((l.index, mac_bytes(l.mac.as_deref()?)?))),
                            routes,
                        },
                        _ => PodView {
                            eth0: None,
                            routes: Vec::new(),
                        },
                    })
                    .collect()
            })
            .collect()
    })
}

/// The entries [`pin_bulk`] adds, worked out from the kernel objects.
fn plan_pins(lab: &Lab, views: &[Vec<PodView>]) -> Result<Vec<Pin>, LabError> {
    let setup = |m: String| LabError::Setup(m);
    let mut pins: Vec<Pin> = Vec::new();
    for (n, node) in lab.nodes.iter().enumerate() {
        let links = node.ns.links().map_err(|e| setup(e.to_string()))?;
        let routes = node.ns.routes().map_err(|e| setup(e.to_string()))?;
        let addresses = node.ns.addresses().map_err(|e| setup(e.to_string()))?;
        let mac_of: HashMap<u32, Vec<u8>> = links
            .iter()
            .filter_map(|l| Some((l.index, mac_bytes(l.mac.as_deref()?)?)))
            .collect();
        // Every pod address of this node → (pod, link in the node, pod MAC).
        let mut owner: HashMap<IpAddr, (usize, u32, Vec<u8>)> = HashMap::new();
        for (p, pod) in node.pods.iter().enumerate() {
            let Some((_, pod_mac)) = &views[n][p].eth0 else {
                continue;
            };
            for ip in &pod.ips {
                let Some(oif) = lookup(&routes, ip.addr()).and_then(|r| r.oif) else {
                    continue;
                };
                owner.insert(ip.addr(), (p, oif, pod_mac.clone()));
                if p > 0 {
                    pins.push(Pin {
                        node: n,
                        pod: None,
                        index: oif,
                        addr: ip.addr(),
                        mac: pod_mac.clone(),
                    });
                }
            }
        }
        for (p, pod) in node.pods.iter().enumerate().skip(1) {
            let view = &views[n][p];
            let Some((eth0, _)) = view.eth0 else { continue };
            for ip in &pod.ips {
                let v6 = ip.addr().is_ipv6();
                let Some(&(_, oif, _)) = owner.get(&ip.addr()) else {
                    continue;
                };
                // The gateway: the next hop of the default route (or of the
                // route to the cluster), when the node has it on that link.
                let probe_dst = lab
                    .topo
                    .cluster_cidr
                    .iter()
                    .find(|c| c.addr().is_ipv6() == v6)
                    .map(|c| c.addr());
                let gateway = probe_dst
                    .and_then(|d| lookup(&view.routes, d))
                    .or_else(|| {
                        view.routes.iter().find(|r| {
                            r.table == 254
                                && r.dst.prefix_len() == 0
                                && r.dst.addr().is_ipv6() == v6
                        })
                    })
                    .and_then(|r| r.gateway);
                if let (Some(gw), Some(mac)) = (gateway, mac_of.get(&oif)) {
                    let on_link = addresses
                        .iter()
                        .any(|a| a.index == oif && a.addr.addr() == gw)
                        || matches!(gw, IpAddr::V6(g) if g.segments()[0] & 0xffc0 == 0xfe80);
                    if on_link {
                        pins.push(Pin {
                            node: n,
                            pod: Some(p),
                            index: eth0,
                            addr: gw,
                            mac: mac.clone(),
                        });
                    }
                }
                // On-link same-node peers (a bridge): the pod this one probes
                // and the one that probes it (and gets its replies).
                let count = node.pods.len();
                let mut peers = vec![(p + 1) % count, (p + count - 1) % count];
                peers.dedup();
                for peer in peers.into_iter().filter(|q| *q != p) {
                    for peer_ip in node.pods[peer]
                        .ips
                        .iter()
                        .filter(|i| i.addr().is_ipv6() == v6)
                    {
                        let direct = lookup(&view.routes, peer_ip.addr())
                            .is_some_and(|r| r.gateway.is_none() && r.oif == Some(eth0));
                        if let (true, Some((_, _, mac))) = (direct, owner.get(&peer_ip.addr())) {
                            pins.push(Pin {
                                node: n,
                                pod: Some(p),
                                index: eth0,
                                addr: peer_ip.addr(),
                                mac: mac.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    Ok(pins)
}

/// Adds `pins`, one netlink session per namespace.
fn install_pins(lab: &Lab, pins: Vec<Pin>) -> Result<(), LabError> {
    let setup = |m: String| LabError::Setup(m);
    let mut by_ns: HashMap<(usize, Option<usize>), Vec<Pin>> = HashMap::new();
    for pin in pins {
        by_ns.entry((pin.node, pin.pod)).or_default().push(pin);
    }
    let groups: Vec<_> = by_ns.into_iter().collect();
    let results: Vec<Result<(), String>> = crate::util::parallel_map(
        groups.chunks(groups.len().div_ceil(8).max(1)),
        crate::util::A_THREAD_EACH,
        |chunk| -> Result<(), String> {
            for ((n, p), list) in chunk {
                let node = &lab.nodes[*n];
                let ns = match p {
                    Some(p) => &node.pods[*p].ns,
                    None => &node.ns,
                };
                let list: Vec<(u32, IpAddr, Vec<u8>)> = list
                    .iter()
                    .map(|x| (x.index, x.addr, x.mac.clone()))
                    .collect();
                ns.netlink(|h| async move {
                    use rtnetlink::packet_route::neighbour::NeighbourState;
                    for (index, addr, mac) in list {
                        h.neighbours()
                            .add(index, addr)
                            .link_layer_address(&mac)
                            .state(NeighbourState::Permanent)
                            .replace()
                            .execute()
                            .await?;
                    }
                    Ok(())
                })
                .map_err(|e| format!("permanent neighbour entries in {}: {e}", ns.name()))?;
            }
            Ok(())
        },
        || Err("pinning thread panicked".into()),
    );
    for r in results {
        r.map_err(setup)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernels_counters() {
        let text = "entries  allocs   destroys hash_grows lookups  hits     res_failed rcv_probes_mcast rcv_probes_ucast periodic_gc_runs forced_gc_runs unresolved_discards table_fulls\n\
0000001b 00003414 000034fa 00000000   0001adfb 00001b71 00000000   00000000         00000000         00000295         00000000       00000000            00000002\n\
0000001b 00003229 00003141 00000006   000199ff 00001e2d 00000000   00000000         00000000         00000000         00000000       00000000            0000000a\n";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                entries: 27,
                table_fulls: 12
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_thousand_pods_need_pinning_and_a_small_lab_does_not() {
        let big = Topology::generated(10, 100).expect("topology");
        let n = need(&big);
        assert_eq!(n.len(), 2, "IPv4 pods, and IPv6 link-local entries");
        assert!(!n[0].v6 && n[1].v6 && n[1].all_dynamic == 0, "{n:?}");
        // 1,000 pods × 4 + 10 nodes × 9 peers + 2 × 10 for the external host.
        assert_eq!(n[0].all_dynamic, 4000 + 90 + 20);
        assert_eq!(n[0].dynamic_when_pinned, 40 + 110);
        let room = (1024 - 27 - MARGIN, 1024, 27);
        let fit = decide(&[(&n[0], room)], false).expect("fits when pinned");
        assert!(fit.pin && fit.tune.is_empty(), "{fit:?}");
        let small = need(&Topology::generated(2, 2).expect("topology"));
        let fit = decide(&[(&small[0], room)], false).expect("fits");
        assert!(!fit.pin, "{fit:?}");
    }

    /// What --tune-host raises is put back when the guard goes, and by
    /// [`restore_host`] (what the Ctrl-C handler calls) if it does not.
    #[test]
    fn tuned_thresholds_are_restored() {
        let dir = tempfile::tempdir().expect("tmp");
        let t3 = dir.path().join("gc_thresh3");
        let t2 = dir.path().join("gc_thresh2");
        std::fs::write(&t3, "1024\n").expect("write");
        std::fs::write(&t2, "512\n").expect("write");
        let fit = HostFit {
            pin: false,
            tune: vec![(t2.clone(), 2048), (t3.clone(), 4096)],
            summary: String::new(),
            unchecked: false,
        };
        let guard = HostTuning::apply(&fit).expect("applied");
        assert_eq!(std::fs::read_to_string(&t3).expect("read"), "4096");
        assert_eq!(std::fs::read_to_string(&t2).expect("read"), "2048");
        drop(guard);
        assert_eq!(std::fs::read_to_string(&t3).expect("read"), "1024");
        assert_eq!(std::fs::read_to_string(&t2).expect("read"), "512");
        let guard = HostTuning::apply(&fit).expect("applied");
        restore_host();
        assert_eq!(std::fs::read_to_string(&t3).expect("read"), "1024");
        std::mem::forget(guard);
    }

    #[test]
    fn a_lab_that_cannot_fit_is_refused_with_numbers_and_remedy() {
        let n = need(&Topology::generated(40, 10).expect("topology"));
        // 40 nodes: 40 × 39 underlay entries alone exceed the room.
        let room = (1024 - 100 - MARGIN, 1024, 100);
        let err = decide(&[(&n[0], room)], false).expect_err("refused");
        assert!(
            err.contains("gc_thresh3 = 1024") && err.contains("--tune-host"),
            "{err}"
        );
        assert!(err.contains(&n[0].dynamic_when_pinned.to_string()), "{err}");
        let tuned = decide(&[(&n[0], room)], true).expect("tuned");
        assert!(!tuned.pin);
        let t3 = tuned
            .tune
            .iter()
            .find(|(p, _)| p.ends_with("gc_thresh3"))
            .map(|(_, v)| *v)
            .expect("gc_thresh3 raised");
        assert!(t3 >= 100 + n[0].all_dynamic, "{tuned:?}");
    }
    /// The 50×100 lab (IPv4 pods) overflowed the IPv6 table with
    /// `--tune-host`: only the IPv4 thresholds were raised, while every
    /// interface's multicast and link-local entries land in the IPv6 table.
    #[test]
    fn tune_host_raises_the_ipv6_table_for_the_link_local_entries_of_an_ipv4_lab() {
        let topo = Topology::generated(50, 100).expect("topology");
        let needs = need(&topo);
        let v6 = needs.iter().find(|n| n.v6).expect("an IPv6 need");
        // Measured on a 2×10 lab: 5 a pod, 2 + 51 on each node's links,
        // 3 on each of the switch's 52 ports, 2 at the external host.
        assert_eq!(v6.link_local, 5000 * 5 + 50 * 53 + 3 * 52 + 2);
        assert_eq!(v6.all_dynamic, 0, "no IPv6 pods");
        let v4 = needs.iter().find(|n| !n.v6).expect("an IPv4 need");
        // The defaults of the host the 50×100 run overflowed on.
        let rooms: Vec<_> = needs
            .iter()
            .map(|n| (n, (1024 - 16 - MARGIN, 1024, 16)))
            .collect();
        let fit = decide(&rooms, true).expect("tuned");
        let raised = |dir: &str| {
            fit.tune
                .iter()
                .find(|(p, _)| p.starts_with(dir) && p.ends_with("gc_thresh3"))
                .map(|(_, v)| *v)
        };
        let t3_v6 = raised("/proc/sys/net/ipv6").expect("IPv6 gc_thresh3 raised");
        assert!(t3_v6 >= 16 + v6.link_local, "{fit:?}");
        let t3_v4 = raised("/proc/sys/net/ipv4").expect("IPv4 gc_thresh3 raised");
        assert!(t3_v4 >= 16 + v4.all_dynamic + v4.link_local, "{fit:?}");
        // The link-local entries are the kernel's own and reclaimable: they
        // never make a lab refused or pinned without --tune-host.
        let small = need(&Topology::generated(10, 100).expect("topology"));
        let rooms: Vec<_> = small
            .iter()
            .map(|n| (n, (1024 - 27 - MARGIN, 1024, 27)))
            .collect();
        let fit = decide(&rooms, false).expect("fits when pinned");
        assert!(fit.tune.is_empty(), "{fit:?}");
    }
}
