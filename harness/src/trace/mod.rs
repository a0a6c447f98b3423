//! Where did my packet die: one packet followed through the namespaces it
//! crosses, with the kernel's own answers at each hop.
//!
//! Where things happen: this file holds the types ([`Trace`], [`Hop`],
//! [`Death`]) and [`run`]: the walk with a probe traced along it (again
//! where NAT rewrote the probe), then the verdict of the two halves together
//! in `verdict.rs` ([`run_many`]: several traces through one world, side by
//! side); `pass.rs` sends one probe along a walk and traces it; `world.rs`
//! is the [`World`] the tracer reads (each namespace by path, read into the
//! model's form only when the trace crosses it; nothing lab-specific: a
//! real node's `/proc/<pid>/ns/net` paths do as well); `walk.rs` is the routing walk (RTM_GETROUTE per hop in
//! `route.rs`, then veth peer / bridge port to the next namespace, and the
//! outer packet of a VXLAN device walked like any other); `vxlan.rs` says
//! where a VXLAN device sends the inner packet and where it comes out (it
//! calls nothing of the walk);
//! `fdb.rs` says whether a bridge port that does not learn gets the frame
//! (its FDB entry or flooding, read live);
//! `nftrace.rs` sends one real probe with `meta nftrace` rules of the
//! trace's own in each crossed namespace and reads `nft monitor trace`;
//! `counters.rs` reads the drops only counters show (qdiscs, legacy
//! iptables rules and policies) before and after the probe;
//! `drops.rs` records the probe through a tracefs instance of its own
//! (the devices it crossed, the kernel's drop reason and function) and
//! `reasons.rs` places those devices in the walk's namespaces and turns a
//! drop nothing else explains into the death (`kernel-drop`);
//! `policy.rs` names the policy rule that decided a lookup;
//! `why.rs` names why the walk died where the kernel's answer alone does
//! not: a refused lookup, a next hop not reached, twins behind a bridge;
//! `ports.rs` says what a bridge port refuses; `exit.rs` where a packet
//! leaves a live node (`live.rs`: `cnilab trace` outside any lab);
//! `neighbour.rs` explains a next hop that never resolved;
//! `probe.rs` sends the probe; `text.rs` prints a trace; `combine.rs`
//! puts the halves together.
//!
//! # How the halves combine
//! The routing walk ends ARRIVED, DIED (a named cause) or INCONCLUSIVE.
//! The firewall trace then runs over the namespaces the walk crossed: the
//! first rule or chain policy that drops or rejects the probe, in a
//! namespace before the one routing named, is the death; so is a drop
//! counter that moved there (whichever namespace comes first). When routing says
//! it arrives and no firewall rule dropped it, the verdict is ARRIVED only
//! if the trace's own chain in the destination saw the probe; otherwise it
//! is INCONCLUSIVE, with what was seen (the trace never guesses). A route
//! lookup that refuses it in a namespace the probe never reached is not
//! where it died: a next hop on the way that never resolved is, when there
//! is one (a queue dropping the answers to the pod's own ARP requests).
//! A Service of several backends sends each probe to any of them: the walk
//! follows the backend its probe took, and probes again until one does.
//!
//! The probe carries mark 0, like the traffic it stands for (a mark would
//! change what fwmark rules select, and veths clear it between
//! namespaces); the nft trace rules match it by destination, protocol and
//! port, and match the VXLAN outer packets that carry it (source, VTEP,
//! UDP port), so a rule dropping those is named too; NAT rewrites are
//! read from the probe's own events only (`inner`).

mod answer;
mod combine;
mod counters;
pub mod drops;
mod exit;
mod fdb;
pub mod live;
mod nat;
mod neighbour;
mod nftrace;
mod pass;
mod policy;
mod ports;
mod probe;
mod reasons;
pub mod route;
mod text;
mod verdict;
mod vxlan;
mod walk;
mod why;
mod world;

pub use exit::Exit;
pub use nftrace::{sweep as sweep_tables, Event, EventKind, TABLE_PREFIX};
pub use reasons::KERNEL_DROP;
pub use world::{Addresses, World};

use serde::Serialize;
use std::net::IpAddr;

/// Version of the trace's JSON form (3: the verdict `left` and where, for
/// a live node's packet that leaves it).
pub const SCHEMA_VERSION: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Icmp,
    Tcp,
    Udp,
}

/// One decision at one namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hop {
    pub namespace: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oif: Option<String>,
    /// The address the packet is sent to next (gateway, or the
    /// destination when connected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_hop: Option<IpAddr>,
    pub decision: String,
    pub evidence: String,
}

impl Hop {
    /// A bridge's choice of the port it sends the packet out of (the
    /// walk's `bridge B: to port P`).
    pub(crate) fn crosses_bridge(&self) -> bool {
        self.oif.is_some() && self.decision.starts_with("bridge ")
    }
}

/// Where and why the packet died.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Death {
    /// The namespace (by role).
    pub namespace: String,
    /// The node it belongs to (`None`: an underlay namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `blackhole`, `no-route`, `link-down`, `forwarding-off`,
    /// `firewall-drop`, … (docs/src/trace.md).
    pub cause: String,
    pub object: String,
    pub evidence: String,
    /// A command, run in that namespace, that shows the same.
    pub check: String,
}

impl Death {
    pub(crate) fn new(ns: &str, cause: &str, object: &str, evidence: &str) -> Death {
        Death {
            namespace: ns.to_string(),
            node: None,
            cause: cause.to_string(),
            object: object.to_string(),
            evidence: evidence.to_string(),
            check: String::new(),
        }
    }

    /// A command that shows this death's object (to reach `dst`).
    pub fn default_check(&self, dst: IpAddr) -> String {
        let mut words = self.object.split_whitespace();
        match (words.next(), words.next()) {
            (Some("link" | "bridge"), Some(name)) => format!("ip -d link show {name}"),
            (Some("port"), Some(name)) => format!("bridge -d link show dev {name}"),
            (Some("neighbour"), _) => "ip neigh show nud permanent".into(),
            (Some("fdb"), _) => {
                let dev = self
                    .object
                    .split_whitespace()
                    .skip_while(|w| *w != "dev")
                    .nth(1);
                format!("bridge fdb show dev {}", dev.unwrap_or(""))
            }
            _ if self.cause == "forwarding-off" => {
                format!("sysctl {}", self.object.replace('/', "."))
            }
            _ => format!("ip route get {dst}"),
        }
    }
}

/// Every cause a trace names (the ids `lab check` reports).
pub const CAUSES: &[&str] = &[
    "no-route",
    "blackhole",
    "unreachable",
    "prohibit",
    "route-refused",
    "routing-loop",
    "reverse-path",
    "forwarding-off",
    "link-down",
    "bridge-port-blocked",
    "bridge-port-isolated",
    "bridge-loop",
    "bridge-fdb-missing",
    "noarp",
    "mtu",
    "accept-local",
    "arp-ignore",
    "arp-announce",
    "qdisc-drop",
    "iptables-legacy-drop",
    "iptables-legacy-policy",
    "conntrack-invalid",
    "wrong-next-hop",
    "wrong-device",
    "duplicate-address",
    "duplicate-mac",
    "address-missing",
    "echo-ignored",
    "dnat-nowhere",
    "bridge-address-missing",
    "neighbour-wrong-mac",
    "neighbour-missing",
    "neighbour-failed",
    "vxlan-fdb-missing",
    "vxlan-fdb-wrong",
    "vxlan-no-device",
    "vxlan-vni-mismatch",
    "vxlan-port-mismatch",
    "firewall-drop",
    "firewall-reject",
    "firewall-policy",
    "tc-filter",
    "xdp-program",
    reasons::KERNEL_DROP,
];

/// A cause as its id in [`CAUSES`] (`trace` for one not in the list).
pub fn cause_id(cause: &str) -> &'static str {
    CAUSES
        .iter()
        .find(|c| **c == cause)
        .copied()
        .unwrap_or("trace")
}

/// How the routing walk ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    Arrived(String),
    Died(Box<Death>),
    Inconclusive(String),
    /// It leaves a world of one node ([`World::one_node`]) by a link whose
    /// far end is outside it.
    Left(Box<Exit>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Arrived,
    /// It left the node a live trace reads, nothing on it having dropped
    /// it (the kernel saw it queued on the way out).
    Left,
    Died,
    Inconclusive,
}

impl Verdict {
    /// The verdict's word, as the JSON has it (`arrived`, `died`, …).
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Arrived => "arrived",
            Verdict::Left => "left",
            Verdict::Died => "died",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// The probe's flags of a command that repeats a trace (`--proto`,
/// `--port`, `--size`), as `lab trace` and `trace` both take them.
pub fn probe_flags(proto: Proto, port: Option<u16>, size: Option<u32>) -> String {
    let mut s = String::new();
    if proto != Proto::Icmp {
        s.push_str(&format!(" --proto {}", format!("{proto:?}").to_lowercase()));
    }
    if let Some(p) = port {
        s.push_str(&format!(" --port {p}"));
    }
    if let Some(n) = size {
        s.push_str(&format!(" --size {n}"));
    }
    s
}

impl Verdict {
    /// 0 arrived (or left the traced node), 1 died, 3 inconclusive.
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Arrived | Verdict::Left => 0,
            Verdict::Died => 1,
            Verdict::Inconclusive => 3,
        }
    }
}

/// A firewall event as the output shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FirewallHop {
    pub namespace: String,
    pub table: String,
    pub chain: String,
    pub what: String,
}

/// What to trace: FROM and TO resolved to namespaces and addresses.
#[derive(Clone, Debug)]
pub struct Request {
    pub from: String,
    pub from_ns: String,
    pub to: String,
    pub to_ns: String,
    pub src: Option<IpAddr>,
    pub dst: IpAddr,
    pub proto: Proto,
    pub port: Option<u16>,
    /// The probe's size in bytes, IP header included (ICMP only; `None`:
    /// ping's default). Every probe is sent with DF.
    pub size: Option<u32>,
    /// TCP only: send a segment conntrack classes INVALID (no flags set)
    /// instead of a SYN (`lab trace --invalid`).
    pub invalid: bool,
    /// The command line that repeats this trace.
    pub command: String,
}

/// A whole trace (`-o json`).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    pub schema_version: u32,
    pub from: String,
    pub to: String,
    pub proto: Proto,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src: Option<IpAddr>,
    pub dst: IpAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    pub hops: Vec<Hop>,
    pub firewall: Vec<FirewallHop>,
    /// The devices the kernel saw the probe cross, in order (tracefs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<drops::DeviceHop>,
    /// Where the kernel dropped it, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_drop: Option<drops::KernelDrop>,
    /// Where the kernel dropped the probe's answer on its way back (a
    /// probe that arrived).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_drop: Option<drops::KernelDrop>,
    /// Where the routing walk of that answer (from where the probe arrived
    /// back to its source) ends, when it dies: the object that killed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_death: Option<Death>,
    /// Why the kernel's account is missing (a SKIP: no tracefs, no drop
    /// reasons on this kernel).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drop_reasons_skipped: Option<String>,
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub death: Option<Death>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Where it left the node (verdict `left`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left: Option<Exit>,
    /// Commands that reproduce the finding.
    pub reproduce: Vec<String>,
}
/// How many probes a trace sends at most to follow one Service backend.
const PROBES_TO_PIN: usize = 6;

/// Traces `req` through `world`: the routing walk, then the firewall trace
/// with one real probe ([`follow`]), then the verdict of the two together
/// ([`verdict::judge`]).
pub fn run(world: &World, req: &Request) -> Trace {
    let mut marked = req.clone();
    if req.proto == Proto::Icmp && req.size.is_none() && !req.invalid {
        marked.size = Some(reasons::marker_size(req.dst));
    }
    let req = &marked;
    let size = req
        .size
        .unwrap_or_else(|| probe::default_size(req.dst, req.proto));
    let followed = follow(world, req, size);
    verdict::judge(world, req, followed, size)
}

/// The routing walk of `req` and one real probe traced along it. When
/// that trace shows a NAT rule rewriting the probe (a Service's DNAT, a
/// masquerade), the walk is made again with the rewrites where they
/// happen, and another probe is traced along it (matched by the original
/// and the rewritten destination). A Service of several backends sends
/// each probe to any of them: the walk follows the backend a probe took,
/// and a probe that took another is sent again (each is traced along the
/// walk made for the last), at most [`PROBES_TO_PIN`] times.
fn follow(world: &World, req: &Request, size: u32) -> pass::Followed {
    let mut rewrites: Vec<nat::Rewrite> = Vec::new();
    let mut attempt = 0;
    loop {
        let walked = walk::walk(world, &req.from_ns, (req.src, req.dst), size, &rewrites);
        let ports: Vec<u16> = rewrites
            .iter()
            .filter_map(|r| match r.change {
                nat::Change::Dnat(_, port) => port,
                _ => None,
            })
            .collect();
        let dsts = if attempt == 0 {
            vec![req.dst]
        } else {
            vec![req.dst, walked.dst]
        };
        let pass = pass::probe(world, req, &walked, &dsts, &ports);
        let now = match &pass.1 {
            Ok(t) => nat::rewrites(&nftrace::inner(&t.events, &walked.outer)),
            Err(_) => Vec::new(),
        };
        let settled = now.is_empty() || (attempt > 0 && nat::same_dnats(&now, &rewrites));
        if settled || attempt == PROBES_TO_PIN {
            if settled {
                let new: Vec<nat::Rewrite> =
                    now.into_iter().filter(|r| !rewrites.contains(r)).collect();
                rewrites.extend(new);
            }
            return pass::Followed {
                walked,
                pass,
                rewrites,
            };
        }
        rewrites = now;
        attempt += 1;
    }
}

/// How many traces [`run_many`] runs at once.
const AT_ONCE: usize = 4;

/// Traces every request of `reqs` through one `world` (each namespace read
/// once for all), several at once: requests whose probes one trace table
/// would match for the other (same family and protocol: the destination
/// may be rewritten on the way) run one after the other, the others side
/// by side. A trace whose death rests on a counter that moved while other
/// probes passed too is traced again alone, so that no verdict depends on
/// what ran next to it. The traces come back in the order of `reqs`.
pub fn run_many(world: &World, reqs: &[Request]) -> Vec<Trace> {
    // One tracefs instance for the whole batch.
    let _instance = drops::hold();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let key = |r: &Request| (r.dst.is_ipv4(), r.proto);
    for (i, r) in reqs.iter().enumerate() {
        match groups.iter_mut().find(|g| key(&reqs[g[0]]) == key(r)) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    let side_by_side = groups.len() > 1;
    let traced = crate::util::parallel_map(
        groups,
        AT_ONCE,
        |group| {
            group
                .into_iter()
                .map(|i| (i, run(world, &reqs[i])))
                .collect::<Vec<_>>()
        },
        Vec::new,
    );
    let mut done: Vec<Option<Trace>> = vec![None; reqs.len()];
    for (i, t) in traced.into_iter().flatten() {
        done[i] = Some(t);
    }
    done.into_iter()
        .zip(reqs)
        .map(|(t, req)| match t {
            Some(t) if side_by_side && counted_death(&t) => run(world, req),
            Some(t) => t,
            // A group whose worker panicked: traced again here.
            None => run(world, req),
        })
        .collect()
}

fn counted_death(t: &Trace) -> bool {
    t.death
        .as_ref()
        .is_some_and(|d| counters::CAUSES.contains(&d.cause.as_str()))
}

pub use text::render;

#[cfg(test)]
mod tests {
    use super::*;

    /// A verdict's word is its JSON.
    #[test]
    fn a_verdicts_word_is_its_json() {
        for v in [
            Verdict::Arrived,
            Verdict::Left,
            Verdict::Died,
            Verdict::Inconclusive,
        ] {
            assert_eq!(serde_json::to_value(v).ok(), Some(v.word().into()));
        }
    }

    /// Every cause a trace names is declared in the registry of causes,
    /// as one the trace names (and `trace`, the id of one it has no id
    /// for).
    #[test]
    fn every_cause_the_trace_names_is_declared() {
        use crate::connectivity::causes::{find, Finder};
        for id in super::CAUSES.iter().chain(&["trace"]) {
            let c = find(id)
                .unwrap_or_else(|| panic!("{id} is not declared in connectivity/causes.rs"));
            assert!(
                c.found_by.contains(&Finder::Trace),
                "{id} is not declared as the trace's"
            );
        }
    }

    /// A masquerade that a VXLAN outer packet met is no rewrite of the
    /// probe; the probe's own DNAT, after it in the same namespace, is.
    #[test]
    fn nat_rules_met_by_the_outer_packet_are_not_the_probes() {
        let lines = [
            "trace id 1 ip nat POSTROUTING packet: oif \"eth0\" ip saddr 10.250.0.1 ip daddr 10.250.0.2 ip ttl 64 udp sport 40000 udp dport 8472 udp length 114",
            "trace id 1 ip nat POSTROUTING rule oifname \"eth0\" masquerade (verdict accept)",
            "trace id 2 ip nat PREROUTING packet: iif \"cnilab0\" ip saddr 10.244.1.2 ip daddr 10.96.0.12 tcp dport 7777",
            "trace id 2 ip nat PREROUTING rule ip daddr 10.96.0.12 dnat to 10.244.2.2:7777 (verdict accept)",
        ];
        let events: Vec<Event> = lines
            .iter()
            .filter_map(|l| nftrace::parse("node1", l))
            .collect();
        assert_eq!(events.len(), 4);
        let vtep: IpAddr = "10.250.0.2".parse().unwrap();
        let all = nat::rewrites(&events);
        assert_eq!(all.len(), 2, "{all:?}");
        let own = nat::rewrites(&nftrace::inner(&events, &[(None, vtep, 8472)]));
        assert_eq!(own.len(), 1, "{own:?}");
        assert!(matches!(own[0].change, nat::Change::Dnat(..)), "{own:?}");
        assert_eq!(nat::rewrites(&nftrace::inner(&events, &[])).len(), 2);
    }
}
