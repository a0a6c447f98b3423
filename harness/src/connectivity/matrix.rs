//! The pair matrix: which pod probes which. The namespace lab and the
//! in-cluster check both send their pod-to-pod probes along these pairs.

use super::groups::{POD_TO_POD_CROSS_NODE, POD_TO_POD_SAME_NODE};

/// A pod by its node and its position among that node's pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub node: usize,
    pub pos: usize,
}

/// A pod that a source pod probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// `pod-to-pod/same-node` or `pod-to-pod/cross-node`.
    pub group: &'static str,
    pub to: Slot,
    /// The pair on the next node, which also gets the DF probe at the MTU
    /// (`mtu/df-cross-node`).
    pub df: bool,
}

/// The peers of the pod at `from`, given how many pods each node has: the
/// next pod on its own node (when it has more than one), then on every
/// other node with pods, in node order, the pod at the same position
/// (modulo that node's count).
pub fn peers(pods_per_node: &[usize], from: Slot) -> Vec<Peer> {
    let nodes = pods_per_node.len();
    let mut out = Vec::new();
    let Some(&count) = pods_per_node.get(from.node) else {
        return out;
    };
    if count > 1 {
        out.push(Peer {
            group: POD_TO_POD_SAME_NODE,
            to: Slot {
                node: from.node,
                pos: (from.pos + 1) % count,
            },
            df: false,
        });
    }
    for (m, &other) in pods_per_node.iter().enumerate() {
        if m == from.node || other == 0 {
            continue;
        }
        out.push(Peer {
            group: POD_TO_POD_CROSS_NODE,
            to: Slot {
                node: m,
                pos: from.pos % other,
            },
            df: m == (from.node + 1) % nodes,
        });
    }
    out
}

/// In a sampled plan (a big lab, see `lab::checks`), the source pods (or
/// destination pods, for node-to-pod) that cover each ordered node pair at
/// least: every pod of the node when it has fewer.
pub const PODS_PER_PAIR: usize = 2;

/// The nodes of `partners` (the candidates, other than the pod's own node)
/// the pod at position `pos` of a node with `count` pods is paired with in
/// a sampled plan. The node's pods take `k` consecutive partners each,
/// rotating from the next node on, with `k` such that its `count` pods
/// together cover every partner at least `PODS_PER_PAIR` times (or with
/// every pod, when the node has fewer); positions `t = pos·k + j` that hit
/// one partner are `partners.len()` apart, so they are distinct pods.
pub fn sampled_partners(node: usize, count: usize, pos: usize, partners: &[usize]) -> Vec<usize> {
    let len = partners.len();
    if len == 0 || count == 0 {
        return Vec::new();
    }
    // Partners in rotation order: the nodes after `node` first, wrapping.
    let start = partners.iter().position(|&m| m > node).unwrap_or(0);
    let k = (PODS_PER_PAIR * len).div_ceil(count).clamp(1, len);
    (0..k)
        .map(|j| partners[(start + pos * k + j) % len])
        .collect()
}

/// Every node but `node`, for [`sampled_partners`] (`with_pods`: only those
/// with pods).
fn others(pods_per_node: &[usize], node: usize, with_pods: bool) -> Vec<usize> {
    (0..pods_per_node.len())
        .filter(|&m| m != node && (!with_pods || pods_per_node[m] > 0))
        .collect()
}

/// The cross-node pod pairs (source, destination) of a sampled plan: every
/// pod probes its [`sampled_partners`] among the nodes with pods, each
/// destination node's pods taken in turn, so every pod is a destination
/// once the node gets as many probes as it has pods; a pod left out (uneven
/// pod counts) is probed by the pod at its position on the node before it.
pub fn sampled_cross_pairs(pods_per_node: &[usize]) -> Vec<(Slot, Slot)> {
    let nodes = pods_per_node.len();
    let mut next = vec![0usize; nodes];
    let mut hit: Vec<Vec<bool>> = pods_per_node.iter().map(|&c| vec![false; c]).collect();
    let mut out = Vec::new();
    for (n, &count) in pods_per_node.iter().enumerate() {
        let partners = others(pods_per_node, n, true);
        for p in 0..count {
            for m in sampled_partners(n, count, p, &partners) {
                let q = next[m] % pods_per_node[m];
                next[m] += 1;
                hit[m][q] = true;
                out.push((Slot { node: n, pos: p }, Slot { node: m, pos: q }));
            }
        }
    }
    for (m, missed) in hit.iter().enumerate() {
        let before = (1..nodes)
            .map(|d| (m + nodes - d) % nodes)
            .find(|&n| pods_per_node[n] > 0);
        let Some(n) = before else { continue };
        for (q, _) in missed.iter().enumerate().filter(|(_, h)| !**h) {
            let p = q % pods_per_node[n];
            out.push((Slot { node: n, pos: p }, Slot { node: m, pos: q }));
        }
    }
    out
}

/// The nodes a pod probes (pod-to-node) or is probed from (node-to-pod) in
/// a sampled plan: its own node, then its [`sampled_partners`] among all
/// other nodes.
pub fn sampled_nodes(pods_per_node: &[usize], at: Slot) -> Vec<usize> {
    let Some(&count) = pods_per_node.get(at.node) else {
        return Vec::new();
    };
    let partners = others(pods_per_node, at.node, false);
    std::iter::once(at.node)
        .chain(sampled_partners(at.node, count, at.pos, &partners))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pod_meets_its_neighbour_and_every_other_node() {
        let got = peers(&[2, 3, 0, 1], Slot { node: 0, pos: 1 });
        let want = [
            ("pod-to-pod/same-node", 0, 0, false),
            ("pod-to-pod/cross-node", 1, 1, true),
            ("pod-to-pod/cross-node", 3, 0, false),
        ];
        assert_eq!(got.len(), want.len());
        for (p, (group, node, pos, df)) in got.iter().zip(want) {
            assert_eq!((p.group, p.to.node, p.to.pos, p.df), (group, node, pos, df));
        }
        // A lone pod on a node has no same-node peer; the last node's next
        // node is the first.
        let lone = peers(&[2, 1], Slot { node: 1, pos: 0 });
        assert_eq!(lone.len(), 1);
        assert_eq!((lone[0].to, lone[0].df), (Slot { node: 0, pos: 0 }, true));
        assert!(peers(&[1], Slot { node: 5, pos: 0 }).is_empty());
    }
    /// The sampled plan's guarantee, on even and uneven labs: every pod a
    /// source and a destination, every ordered node pair covered by
    /// `PODS_PER_PAIR` distinct pods (or all of the node's), per group.
    #[test]
    fn a_sampled_plan_covers_every_pod_and_every_node_pair() {
        use std::collections::{BTreeSet, HashMap};
        let shapes: [&[usize]; 6] = [
            &[100; 50],
            &[3, 5, 0, 7, 1],
            &[2; 12],
            &[1; 40],
            &[100, 1, 1, 60],
            &[4, 4],
        ];
        for pods in shapes {
            let nodes = pods.len();
            let all_pods: Vec<Slot> = (0..nodes)
                .flat_map(|n| (0..pods[n]).map(move |p| Slot { node: n, pos: p }))
                .collect();
            let want = |c: usize| PODS_PER_PAIR.min(c);
            // pod-to-pod/cross-node.
            let pairs = sampled_cross_pairs(pods);
            let mut by_pair: HashMap<(usize, usize), BTreeSet<usize>> = HashMap::new();
            for (from, to) in &pairs {
                assert_ne!(from.node, to.node, "{pods:?}");
                assert!(from.pos < pods[from.node] && to.pos < pods[to.node]);
                by_pair
                    .entry((from.node, to.node))
                    .or_default()
                    .insert(from.pos);
            }
            let with_pods = pods.iter().filter(|&&c| c > 0).count();
            for s in &all_pods {
                if with_pods > 1 {
                    assert!(
                        pairs.iter().any(|(f, _)| f == s),
                        "{pods:?}: {s:?} no source"
                    );
                    assert!(
                        pairs.iter().any(|(_, t)| t == s),
                        "{pods:?}: {s:?} no destination"
                    );
                }
            }
            for n in 0..nodes {
                for m in (0..nodes).filter(|&m| m != n && pods[n] > 0 && pods[m] > 0) {
                    let got = by_pair.get(&(n, m)).map_or(0, |s| s.len());
                    assert!(got >= want(pods[n]), "{pods:?}: {n}->{m} by {got} pods");
                }
            }
            // pod-to-node (source pods) and node-to-pod (destination pods):
            // the same pairs, read in the two directions.
            let mut pod_node: HashMap<(usize, usize), BTreeSet<usize>> = HashMap::new();
            for s in &all_pods {
                let to = sampled_nodes(pods, *s);
                assert_eq!(to[0], s.node, "its own node first");
                for m in to {
                    pod_node.entry((s.node, m)).or_default().insert(s.pos);
                }
            }
            for n in (0..nodes).filter(|&n| pods[n] > 0) {
                for m in 0..nodes {
                    let got = pod_node.get(&(n, m)).map_or(0, |s| s.len());
                    let need = if m == n { pods[n] } else { want(pods[n]) };
                    assert!(got >= need, "{pods:?}: pods of {n} to node {m}: {got}");
                }
            }
        }
    }
}
