//! The probe catalogue: which groups probe whom, over which protocols, and
//! what source address a correct answer shows. `lab check` (pods in
//! namespaces) and `e2e check` (pods in a cluster) both plan from it, each
//! through its own [`Cluster`], so one set of probes runs against any
//! cluster; each caller then sends them its own way (sockets in the
//! namespaces, pod exec through the API) and adds the Service groups of
//! the Services it has.

use super::groups::{
    MTU_DF_CROSS_NODE, NODE_TO_POD, POD_TO_EXTERNAL, POD_TO_NODE, POD_TO_POD_CROSS_NODE,
    POD_TO_POD_SAME_NODE,
};
use super::matrix::{self, Slot};
use super::{Endpoint, ExpectSource, ProbeSpec, Proto};
use std::net::IpAddr;

/// What source address the destination must see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Not judged.
    Any,
    /// The source pod's own address (no NAT inside the cluster), judged on
    /// the protocols whose answer carries it (not ICMP).
    Own,
    /// The source node's address (masqueraded on the way out).
    Node,
}

/// One group of the catalogue.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub group: &'static str,
    /// Who probes whom.
    pub pairs: &'static str,
    pub protos: &'static [Proto],
    pub source: Source,
}

const POD_PROTOS: &[Proto] = &[Proto::Icmp, Proto::Tcp, Proto::Udp];
const NODE_PROTOS: &[Proto] = &[Proto::Icmp, Proto::Tcp];

/// The groups every cluster is probed with, in plan order.
pub const CATALOGUE: &[Entry] = &[
    Entry {
        group: POD_TO_POD_SAME_NODE,
        pairs: "every pod to the next pod on its own node",
        protos: POD_PROTOS,
        source: Source::Own,
    },
    Entry {
        group: POD_TO_POD_CROSS_NODE,
        pairs: "every pod to the pod at its position on every other node",
        protos: POD_PROTOS,
        source: Source::Own,
    },
    Entry {
        group: MTU_DF_CROSS_NODE,
        pairs: "every pod to its peer on the next node, a packet of the pod MTU with DF set",
        protos: &[Proto::Df],
        source: Source::Any,
    },
    Entry {
        group: POD_TO_NODE,
        pairs: "every pod to every node",
        protos: NODE_PROTOS,
        source: Source::Any,
    },
    Entry {
        group: POD_TO_EXTERNAL,
        pairs: "every pod to the host outside the cluster, masqueraded to its node's address",
        protos: NODE_PROTOS,
        source: Source::Node,
    },
    Entry {
        group: NODE_TO_POD,
        pairs: "every node to every pod",
        protos: NODE_PROTOS,
        source: Source::Any,
    },
];

/// The catalogue's entry of `group`.
pub fn entry(group: &str) -> Option<&'static Entry> {
    CATALOGUE.iter().find(|e| e.group == group)
}

/// A cluster as the catalogue plans over it: its nodes and their pods, by
/// index and position, at their addresses of one family.
pub trait Cluster {
    /// How many pods each node has, in node order.
    fn pods_per_node(&self) -> Vec<usize>;
    /// The pod at `at`, at its address of one family (`None`: it has none).
    fn pod(&self, at: Slot, v6: bool) -> Option<Endpoint>;
    /// Node `n` at its address of one family.
    fn node(&self, n: usize, v6: bool) -> Option<Endpoint>;
    /// The host outside the cluster, and the address node `n`'s pods are
    /// masqueraded to on the way there (`None`: no such host).
    fn external(&self, _n: usize, _v6: bool) -> Option<(Endpoint, IpAddr)> {
        None
    }
}

/// Probes per family of the O(pods × nodes) groups above which they are
/// sampled: a 10 × 100 lab (70,000) keeps its full plan.
const PROBE_BUDGET: usize = 100_000;

/// What a sampled plan covers, said up front and in the report.
pub const SAMPLED: &str = "pod-to-pod/cross-node, pod-to-node and node-to-pod are sampled (the cluster is over the probe budget): every pod is probed as a source and as a destination, and every ordered node pair is covered by at least 2 pods (rotating positions)";

/// The probe budget: [`PROBE_BUDGET`], or `CNILAB_PROBE_BUDGET` (a hidden
/// setting that tests lower to sample a small lab).
fn probe_budget() -> usize {
    std::env::var("CNILAB_PROBE_BUDGET")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(PROBE_BUDGET)
}

/// Whether a cluster whose nodes have `pods_per_node` pods gets the
/// sampled plan: its full pod-to-pod/cross-node, pod-to-node and
/// node-to-pod groups would send more than the probe budget per family.
pub fn sampled(pods_per_node: &[usize]) -> bool {
    let per_pair: usize = [POD_TO_POD_CROSS_NODE, POD_TO_NODE, NODE_TO_POD]
        .iter()
        .filter_map(|g| entry(g))
        .map(|e| e.protos.len())
        .sum();
    let pods: usize = pods_per_node.iter().sum();
    pods.saturating_mul(pods_per_node.len())
        .saturating_mul(per_pair)
        > probe_budget()
}

/// What a report says of `c`'s plan: [`SAMPLED`] when it is sampled.
pub fn sampled_note(c: &dyn Cluster) -> Option<String> {
    sampled(&c.pods_per_node()).then(|| SAMPLED.to_string())
}

/// Collects the probes of the selected groups.
struct Plan<'a> {
    wanted: &'a dyn Fn(&str) -> bool,
    out: Vec<ProbeSpec>,
}

impl Plan<'_> {
    /// `group`'s probes from `from` to `to`, over the catalogue's protocols;
    /// `node_ip` is the address a masquerade rewrites `from` to.
    fn push(
        &mut self,
        group: &'static str,
        from: &Endpoint,
        to: &Endpoint,
        node_ip: Option<IpAddr>,
    ) {
        let Some(e) = entry(group).filter(|e| (self.wanted)(e.group)) else {
            return;
        };
        for &proto in e.protos {
            let expect_source = match (e.source, proto) {
                (_, Proto::Icmp) | (Source::Any, _) => None,
                (Source::Own, _) => Some(ExpectSource::Unchanged(from.ip)),
                (Source::Node, _) => node_ip.map(ExpectSource::Masqueraded),
            };
            self.out.push(ProbeSpec {
                group,
                from: from.clone(),
                to: to.clone(),
                proto,
                expect_source,
                service: None,
            });
        }
    }
}

/// The catalogue's probes of one address family for the groups `wanted`
/// selects: for every pod, its peers ([`matrix::peers`]) with the DF probe
/// to the next node's, every node, the external host; then every node to
/// every pod, by source node. Over the probe budget ([`sampled`]) the
/// three O(pods × nodes) groups are sampled ([`SAMPLED`]).
pub fn plan(c: &dyn Cluster, wanted: &dyn Fn(&str) -> bool, v6: bool) -> Vec<ProbeSpec> {
    let counts = c.pods_per_node();
    let nodes = counts.len();
    let sampled = sampled(&counts);
    let mut p = Plan {
        wanted,
        out: Vec::new(),
    };
    // Sampled: every node, or the pod's own and its sampled partners.
    let nodes_of = |at: Slot| -> Vec<usize> {
        if sampled {
            matrix::sampled_nodes(&counts, at)
        } else {
            (0..nodes).collect()
        }
    };
    let slots = || (0..nodes).flat_map(|n| (0..counts[n]).map(move |pos| Slot { node: n, pos }));
    for at in slots() {
        let Some(src) = c.pod(at, v6) else {
            continue;
        };
        for peer in matrix::peers(&counts, at) {
            let Some(dst) = c.pod(peer.to, v6) else {
                continue;
            };
            // Sampled, the cross-node pairs come from the sampled ones
            // below; the DF probe to the next node stays.
            if !sampled || peer.group != POD_TO_POD_CROSS_NODE {
                p.push(peer.group, &src, &dst, None);
            }
            if peer.df {
                p.push(MTU_DF_CROSS_NODE, &src, &dst, None);
            }
        }
        for m in nodes_of(at) {
            if let Some(dst) = c.node(m, v6) {
                p.push(POD_TO_NODE, &src, &dst, None);
            }
        }
        if let Some((dst, node_ip)) = c.external(at.node, v6) {
            p.push(POD_TO_EXTERNAL, &src, &dst, Some(node_ip));
        }
    }
    if sampled {
        for (from, to) in matrix::sampled_cross_pairs(&counts) {
            if let (Some(src), Some(dst)) = (c.pod(from, v6), c.pod(to, v6)) {
                p.push(POD_TO_POD_CROSS_NODE, &src, &dst, None);
            }
        }
    }
    // Node-to-pod, by source node (a stable sort keeps the pods' order).
    let mut node_to_pod: Vec<(usize, Slot)> = slots()
        .flat_map(|at| nodes_of(at).into_iter().map(move |m| (m, at)))
        .collect();
    node_to_pod.sort_by_key(|(m, _)| *m);
    for (m, at) in node_to_pod {
        if let (Some(src), Some(dst)) = (c.node(m, v6), c.pod(at, v6)) {
            p.push(NODE_TO_POD, &src, &dst, None);
        }
    }
    p.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// Nodes with these pod counts; node `n`'s pods at 10.n.0.k, nodes at
    /// 192.168.0.n; IPv4 only; an external host when `external`.
    struct Shape {
        pods: Vec<usize>,
        external: bool,
    }

    fn ep(name: String, node: Option<usize>, pod: Option<usize>, ip: [u8; 4]) -> Endpoint {
        Endpoint {
            name,
            node,
            pod,
            ip: IpAddr::V4(Ipv4Addr::from(ip)),
            external: node.is_none(),
        }
    }

    impl Cluster for Shape {
        fn pods_per_node(&self) -> Vec<usize> {
            self.pods.clone()
        }
        fn pod(&self, at: Slot, v6: bool) -> Option<Endpoint> {
            (!v6 && at.pos < *self.pods.get(at.node)?).then(|| {
                let name = format!("n{}/p{}", at.node, at.pos);
                ep(
                    name,
                    Some(at.node),
                    Some(at.pos),
                    [10, at.node as u8, 0, at.pos as u8],
                )
            })
        }
        fn node(&self, n: usize, v6: bool) -> Option<Endpoint> {
            (!v6 && n < self.pods.len())
                .then(|| ep(format!("n{n}"), Some(n), None, [192, 168, 0, n as u8]))
        }
        fn external(&self, n: usize, v6: bool) -> Option<(Endpoint, IpAddr)> {
            let node = self.node(n, v6)?;
            self.external
                .then(|| (ep("external".into(), None, None, [203, 0, 113, 1]), node.ip))
        }
    }

    fn count(specs: &[ProbeSpec], group: &str) -> usize {
        specs.iter().filter(|s| s.group == group).count()
    }

    #[test]
    fn every_group_gets_its_pairs_protocols_and_sources() {
        let shape = Shape {
            pods: vec![2, 3],
            external: true,
        };
        let all = plan(&shape, &|_| true, false);
        // 5 pods: a same-node peer each, one cross-node peer each, 3 protocols.
        assert_eq!(count(&all, POD_TO_POD_SAME_NODE), 5 * 3);
        assert_eq!(count(&all, POD_TO_POD_CROSS_NODE), 5 * 3);
        assert_eq!(count(&all, MTU_DF_CROSS_NODE), 5);
        assert_eq!(count(&all, POD_TO_NODE), 5 * 2 * 2);
        assert_eq!(count(&all, NODE_TO_POD), 2 * 5 * 2);
        assert_eq!(count(&all, POD_TO_EXTERNAL), 5 * 2);
        for s in &all {
            let want = match (s.group, s.proto) {
                (_, Proto::Icmp) => None,
                (POD_TO_POD_SAME_NODE | POD_TO_POD_CROSS_NODE, _) => {
                    Some(ExpectSource::Unchanged(s.from.ip))
                }
                (POD_TO_EXTERNAL, _) => s
                    .from
                    .node
                    .and_then(|n| shape.node(n, false))
                    .map(|n| ExpectSource::Masqueraded(n.ip)),
                _ => None,
            };
            assert_eq!(s.expect_source, want, "{s:?}");
        }
        // Node-to-pod goes by source node.
        let sources: Vec<usize> = all
            .iter()
            .filter(|s| s.group == NODE_TO_POD)
            .filter_map(|s| s.from.node)
            .collect();
        assert!(sources.windows(2).all(|w| w[0] <= w[1]), "{sources:?}");
        // No external host, no family: no probes of them.
        let inside = plan(
            &Shape {
                external: false,
                ..shape
            },
            &|_| true,
            false,
        );
        assert_eq!(count(&inside, POD_TO_EXTERNAL), 0);
        assert!(plan(
            &Shape {
                pods: vec![2, 3],
                external: true
            },
            &|_| true,
            true
        )
        .is_empty());
    }

    #[test]
    fn a_group_left_out_gets_no_probe() {
        let shape = Shape {
            pods: vec![2, 2],
            external: false,
        };
        let only = plan(&shape, &|g| g == NODE_TO_POD, false);
        assert!(!only.is_empty());
        assert!(only.iter().all(|s| s.group == NODE_TO_POD));
    }

    #[test]
    fn over_the_budget_the_quadratic_groups_are_sampled() {
        let pods = vec![100; 50];
        assert!(sampled(&pods), "50 x 100 is over the budget");
        assert!(!sampled(&[100; 10]), "10 x 100 keeps its full plan");
        let shape = Shape {
            pods,
            external: false,
        };
        let specs = plan(&shape, &|g| g == POD_TO_NODE, false);
        // Each pod probes its own node and its sampled partners, not all 50.
        let per_pod = specs.len() / (50 * 100 * 2);
        assert!(per_pod > 1 && per_pod < 50, "{per_pod}");
    }
}
