//! Which namespace a link's `link_netnsid` is. The netlink reader asks the
//! kernel (RTM_GETNSID with the other namespace's descriptor); a file
//! has only what the script printed, so: first `ip -j netns list-id`
//! (ids of namespaces named under `/run/netns`, by name), then the veth
//! pairs themselves (a veth at index `a` whose peer is index `b` there
//! pairs with the only namespace whose index `b` is a veth whose peer is
//! index `a`), each id of a namespace taken for one namespace only.

use super::ip::End;
use crate::model::LinkKind;
use std::collections::{BTreeMap, BTreeSet};

/// One namespace the script read.
pub struct Dumped {
    pub ends: Vec<End>,
    /// `ip -j netns list-id`: its ids for namespaces named under
    /// `/run/netns`, as the number of the namespace so named.
    pub listed: BTreeMap<i32, usize>,
}

/// `(namespace, id)` → the namespace the id is, for every id a link of
/// `all` (by number) names and that could be told.
pub fn resolve(all: &BTreeMap<usize, Dumped>) -> BTreeMap<(usize, i32), usize> {
    let mut known: BTreeMap<(usize, i32), usize> = BTreeMap::new();
    for (k, d) in all {
        for e in &d.ends {
            if let Some(id) = e.netnsid {
                if let Some(to) = d.listed.get(&id) {
                    known.insert((*k, id), *to);
                }
            }
        }
    }
    // Pairing, until nothing more is told.
    loop {
        let mut told = false;
        for (k, d) in all {
            let ids: BTreeSet<i32> = d.ends.iter().filter_map(|e| e.netnsid).collect();
            for id in ids {
                if known.contains_key(&(*k, id)) {
                    continue;
                }
                let taken: BTreeSet<usize> = known
                    .iter()
                    .filter(|((from, _), _)| from == k)
                    .map(|(_, to)| *to)
                    .collect();
                let candidates: Vec<usize> = all
                    .iter()
                    .filter(|(o, _)| *o != k && !taken.contains(o))
                    .filter(|(_, other)| pairs(d, id, other))
                    .map(|(o, _)| *o)
                    .collect();
                if let [only] = candidates.as_slice() {
                    known.insert((*k, id), *only);
                    told = true;
                }
            }
        }
        if !told {
            lowers_into_the_node(all, &mut known);
            return known;
        }
    }
}

/// A namespace whose only id left untold has only macvlans or ipvlans
/// behind it (a lower device names an index, which many namespaces have):
/// that id is the node's when the node has a device at each of those
/// indexes and is not told yet in that namespace. The node is the
/// namespace a pod's lower device is in on every node where pods get a
/// macvlan or ipvlan of the node's uplink.
fn lowers_into_the_node(all: &BTreeMap<usize, Dumped>, known: &mut BTreeMap<(usize, i32), usize>) {
    let Some(node) = all.get(&0) else {
        return;
    };
    for (k, d) in all.iter().filter(|(k, _)| **k != 0) {
        let untold: BTreeSet<i32> = d
            .ends
            .iter()
            .filter_map(|e| e.netnsid)
            .filter(|id| !known.contains_key(&(*k, *id)))
            .collect();
        let node_told = known.iter().any(|((from, _), to)| from == k && *to == 0);
        let [id] = untold.into_iter().collect::<Vec<_>>()[..] else {
            continue;
        };
        let mut behind = d.ends.iter().filter(|e| e.netnsid == Some(id));
        let lowers = behind.clone().all(|e| {
            matches!(e.kind, LinkKind::Macvlan | LinkKind::Ipvlan)
                && e.link_index
                    .is_some_and(|i| node.ends.iter().any(|n| n.index == i))
        });
        if lowers && !node_told && behind.next().is_some() {
            known.insert((*k, id), 0);
        }
    }
}

/// Whether every link of `d` into its namespace `id` has its other end in
/// `other`: a veth's peer there a veth pointing back, a macvlan's or
/// ipvlan's lower there by index.
fn pairs(d: &Dumped, id: i32, other: &Dumped) -> bool {
    let mut any_veth = false;
    let all = d.ends.iter().filter(|e| e.netnsid == Some(id)).all(|e| {
        let Some(there) = e.link_index else {
            return true;
        };
        let Some(peer) = other.ends.iter().find(|o| o.index == there) else {
            return false;
        };
        if e.kind != LinkKind::Veth {
            return true;
        }
        any_veth = true;
        peer.kind == LinkKind::Veth && peer.link_index == Some(e.index) && peer.netnsid.is_some()
    });
    // A lower device alone matches any namespace with that index: too weak
    // to tell one.
    all && any_veth
}

/// What one namespace is to the node: decided as the native capture
/// decides it (`discover.rs`), from the links `linked` gives.
pub(crate) use crate::capture::discover::{relation_of as relation, Relation};

/// The links `relation` weighs: veths, macvlans and ipvlans with a peer
/// namespace.
pub fn linked(ends: &[End]) -> Vec<(i32, bool)> {
    ends.iter()
        .filter(|e| {
            matches!(
                e.kind,
                LinkKind::Veth | LinkKind::Macvlan | LinkKind::Ipvlan
            )
        })
        .filter_map(|e| Some((e.netnsid?, e.port)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn veth(index: u32, peer: u32, id: i32) -> End {
        End {
            index,
            kind: LinkKind::Veth,
            link_index: Some(peer),
            netnsid: Some(id),
            port: false,
        }
    }

    #[test]
    fn veth_pairs_tell_ids_apart_where_names_do_not() {
        // Node 0 has veths 5 and 6 to pods 1 and 2, each pod's eth0 index 2;
        // pod 2 is named, so its id is listed; pod 1's follows.
        let mut all = BTreeMap::new();
        all.insert(
            0,
            Dumped {
                ends: vec![veth(5, 2, 0), veth(6, 2, 1)],
                listed: BTreeMap::from([(1, 2)]),
            },
        );
        all.insert(
            1,
            Dumped {
                ends: vec![veth(2, 5, 0)],
                listed: BTreeMap::new(),
            },
        );
        all.insert(
            2,
            Dumped {
                ends: vec![veth(2, 6, 0)],
                listed: BTreeMap::new(),
            },
        );
        let ids = resolve(&all);
        assert_eq!(ids.get(&(0, 1)), Some(&2));
        assert_eq!(ids.get(&(0, 0)), Some(&1));
        assert_eq!(ids.get(&(1, 0)), Some(&0));
        assert_eq!(ids.get(&(2, 0)), Some(&0));
    }

    #[test]
    fn a_lone_macvlan_leads_into_the_node() {
        let mut all = BTreeMap::new();
        let dev = |index| End {
            index,
            kind: LinkKind::Device,
            link_index: None,
            netnsid: None,
            port: false,
        };
        all.insert(
            0,
            Dumped {
                ends: vec![dev(1), dev(2)],
                listed: BTreeMap::new(),
            },
        );
        let mv = End {
            index: 3,
            kind: LinkKind::Macvlan,
            link_index: Some(2),
            netnsid: Some(0),
            port: false,
        };
        all.insert(
            1,
            Dumped {
                ends: vec![mv.clone()],
                listed: BTreeMap::new(),
            },
        );
        // Another namespace with an index 2 does not make it ambiguous;
        // a lower index the node lacks leaves the id untold.
        all.insert(
            2,
            Dumped {
                ends: vec![dev(2)],
                listed: BTreeMap::new(),
            },
        );
        all.insert(
            3,
            Dumped {
                ends: vec![End {
                    link_index: Some(9),
                    ..mv
                }],
                listed: BTreeMap::new(),
            },
        );
        let ids = resolve(&all);
        assert_eq!(ids.get(&(1, 0)), Some(&0));
        assert_eq!(ids.get(&(3, 0)), None);
    }

    #[test]
    fn a_namespace_linked_to_the_node_alone_is_a_pod() {
        assert_eq!(relation(&[(3, false)], Some(3)), Relation::Pod);
        assert_eq!(relation(&[(3, true)], Some(3)), Relation::Peer);
        assert_eq!(relation(&[(3, false), (4, false)], Some(3)), Relation::Peer);
        assert_eq!(relation(&[(4, false)], Some(3)), Relation::None);
        assert_eq!(relation(&[(4, false)], None), Relation::None);
    }
}
