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
}
