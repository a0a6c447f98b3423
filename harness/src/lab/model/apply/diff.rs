//! The difference between two models of one lab, old → new (pure: no IO).
//! [`super::apply_diff`] applies it to the namespaces standing for the old
//! model: a node that joins a running lab is the lab's topology compiled
//! with the node, diffed against the topology compiled without it.
//!
//! Namespaces are matched by role. Objects of a namespace both models have
//! are compared whole (a route, a rule, a neighbour, an FDB entry, a qdisc,
//! iptables-save text), links by name (a standing link is not re-made: the
//! kernel derives what differs on it, such as a bridge's MTU from its
//! ports), nftables tables by family, name and text (a table whose text
//! changed is removed and loaded again), sysctls by key and value (a key
//! only the old model has keeps its value: a sysctl has no absence).

use super::super::{LabModel, Namespace};
use ipnet::IpNet;
use std::collections::BTreeMap;

/// Where a namespace sits in a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    Underlay,
    /// A node, with its pod CIDRs.
    Node(Vec<IpNet>),
    /// A pod of the named node.
    Pod(String),
}

/// What turns a lab built as one model into another, namespace by namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelDiff {
    /// Namespaces only the new model has, whole, in the model's order
    /// (underlay, nodes, pods).
    pub made: Vec<(Place, Namespace)>,
    /// In namespaces both models have: what only the new one holds.
    pub added: Vec<Namespace>,
    /// In namespaces both models have: what only the old one holds.
    pub removed: Vec<Namespace>,
    /// The roles of the namespaces only the old model has.
    pub gone: Vec<String>,
}

impl ModelDiff {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.made.is_empty()
            && self.added.is_empty()
            && self.removed.is_empty()
            && self.gone.is_empty()
    }
}

/// Every namespace of `model` with its place, in the model's order.
pub(super) fn places(model: &LabModel) -> Vec<(Place, &Namespace)> {
    let mut out: Vec<(Place, &Namespace)> = model
        .underlay
        .iter()
        .map(|ns| (Place::Underlay, ns))
        .collect();
    for node in &model.nodes {
        out.push((Place::Node(node.pod_cidrs.clone()), &node.net));
    }
    for node in &model.nodes {
        for pod in &node.pods {
            out.push((Place::Pod(node.net.name.clone()), pod));
        }
    }
    out
}

/// The difference `old` → `new`.
pub fn diff(old: &LabModel, new: &LabModel) -> ModelDiff {
    let before: BTreeMap<&str, &Namespace> =
        old.namespaces().map(|ns| (ns.name.as_str(), ns)).collect();
    let mut out = ModelDiff::default();
    for (place, ns) in places(new) {
        match before.get(ns.name.as_str()) {
            None => out.made.push((place, ns.clone())),
            Some(was) => {
                let added = only_in(ns, was, true);
                if !holds_nothing(&added) {
                    out.added.push(added);
                }
                let removed = only_in(was, ns, false);
                if !holds_nothing(&removed) {
                    out.removed.push(removed);
                }
            }
        }
    }
    let after: Vec<&str> = new.namespaces().map(|ns| ns.name.as_str()).collect();
    out.gone = old
        .namespaces()
        .filter(|ns| !after.contains(&ns.name.as_str()))
        .map(|ns| ns.name.clone())
        .collect();
    out
}

/// What `a` holds and `b` does not, as a namespace of `a`'s name; with
/// `sysctls`, the keys `a` sets to another value than `b` too.
fn only_in(a: &Namespace, b: &Namespace, sysctls: bool) -> Namespace {
    fn missing<T: PartialEq + Clone>(a: &[T], b: &[T]) -> Vec<T> {
        a.iter().filter(|x| !b.contains(x)).cloned().collect()
    }
    Namespace {
        name: a.name.clone(),
        links: a
            .links
            .iter()
            .filter(|l| b.link(&l.name).is_none())
            .cloned()
            .collect(),
        routes: missing(&a.routes, &b.routes),
        rules: missing(&a.rules, &b.rules),
        neighbours: missing(&a.neighbours, &b.neighbours),
        fdb: missing(&a.fdb, &b.fdb),
        nftables: missing(&a.nftables, &b.nftables),
        sysctls: match sysctls {
            true => a
                .sysctls
                .iter()
                .filter(|(k, v)| b.sysctls.get(*k) != Some(*v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            false => BTreeMap::new(),
        },
        qdiscs: missing(&a.qdiscs, &b.qdiscs),
        iptables: missing(&a.iptables, &b.iptables),
    }
}

/// Whether a namespace of a diff holds nothing.
fn holds_nothing(ns: &Namespace) -> bool {
    ns.links.is_empty()
        && ns.routes.is_empty()
        && ns.rules.is_empty()
        && ns.neighbours.is_empty()
        && ns.fdb.is_empty()
        && ns.nftables.is_empty()
        && ns.sysctls.is_empty()
        && ns.qdiscs.is_empty()
        && ns.iptables.is_empty()
}

#[cfg(test)]
mod tests {
    use super::super::super::compile::{compile, infrastructure};
    use super::*;
    use crate::lab::topology::shapes::{apply_flags, Shape};
    use crate::lab::topology::Topology;

    /// The infrastructure of a generated topology of `n` nodes, and of the
    /// same topology without its last node.
    fn with_and_without(n: usize, shape: Option<Shape>, vxlan: bool) -> (LabModel, LabModel) {
        let mut topo = Topology::generated(n, 1).expect("topology");
        apply_flags(&mut topo, shape, vxlan, false).expect("flags");
        let with = infrastructure(compile(&topo).expect("compiles"));
        topo.nodes.pop();
        let without = infrastructure(compile(&topo).expect("compiles"));
        (with, without)
    }

    fn named<'a>(d: &'a [Namespace], name: &str) -> &'a Namespace {
        d.iter()
            .find(|ns| ns.name == name)
            .unwrap_or_else(|| panic!("{name} in {d:?}"))
    }

    #[test]
    fn a_model_and_itself_differ_in_nothing() {
        let (with, _) = with_and_without(3, Some(Shape::Routed), true);
        assert!(diff(&with, &with).is_empty());
    }

    #[test]
    fn a_joining_node_is_made_whole_with_its_port_and_its_peers_routes() {
        let (with, without) = with_and_without(3, None, false);
        let d = diff(&without, &with);
        let made: Vec<&str> = d.made.iter().map(|(_, ns)| ns.name.as_str()).collect();
        assert_eq!(made, ["node3"]);
        assert_eq!(
            d.made[0].0,
            Place::Node(vec!["10.244.3.0/24".parse().unwrap()])
        );
        assert!(d.removed.is_empty(), "{:?}", d.removed);
        assert!(d.gone.is_empty());
        let switch = named(&d.added, "switch");
        let links: Vec<&str> = switch.links.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(links, ["p-node3"]);
        // Static routing: node1 and node2 route node3's pods, and nothing else
        // of theirs changes.
        for peer in ["node1", "node2"] {
            let ns = named(&d.added, peer);
            let dsts: Vec<String> = ns.routes.iter().map(|r| r.dst.to_string()).collect();
            assert_eq!(dsts, ["10.244.3.0/24"], "{peer}");
            assert!(
                ns.links.is_empty() && ns.sysctls.is_empty(),
                "{peer}: {ns:?}"
            );
        }
    }

    #[test]
    fn a_leaving_node_is_the_reverse_of_a_joining_one() {
        let (with, without) = with_and_without(3, None, true);
        let join = diff(&without, &with);
        let leave = diff(&with, &without);
        assert_eq!(leave.gone, ["node3"]);
        assert!(leave.made.is_empty() && leave.added.is_empty());
        assert_eq!(leave.removed, join.added);
        // VXLAN: every peer forgets node3's VTEP (neighbour, FDB, route).
        let node1 = named(&leave.removed, "node1");
        assert_eq!(node1.neighbours.len(), 1);
        assert_eq!(node1.fdb.len(), 1);
        assert_eq!(node1.fdb[0].mac, "@node3/vxlan0");
        assert_eq!(node1.routes.len(), 1);
    }

    #[test]
    fn a_node_in_a_subnet_of_its_own_brings_its_rack_and_router_leg() {
        let (with, without) = with_and_without(3, Some(Shape::Routed), false);
        let d = diff(&without, &with);
        let switch = named(&d.added, "switch");
        let mut links: Vec<&str> = switch.links.iter().map(|l| l.name.as_str()).collect();
        links.sort();
        assert_eq!(links, ["p-node3", "p-r-rack3", "rack3"]);
        let router = named(&d.added, "router");
        assert_eq!(router.links.len(), 1);
        assert_eq!(router.links[0].name, "rack3");
        let dsts: Vec<String> = router.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["10.244.3.0/24"]);
    }

    #[test]
    fn a_nat_node_brings_its_nat_box_and_a_changed_table_is_replaced() {
        let (with, without) = with_and_without(2, Some(Shape::Nat), false);
        let d = diff(&without, &with);
        let made: Vec<&str> = d.made.iter().map(|(_, ns)| ns.name.as_str()).collect();
        assert_eq!(made, ["node2-nat", "node2"]);
        assert_eq!(d.made[0].0, Place::Underlay);
        let mut changed = with.clone();
        let table = &mut changed.nodes[0].net.nftables;
        table.push(crate::lab::model::NftTable {
            family: "inet".into(),
            name: "t".into(),
            text: "table inet t {\n}\n".into(),
        });
        let mut edited = changed.clone();
        edited.nodes[0].net.nftables.last_mut().unwrap().text =
            "table inet t {\n  chain c {\n  }\n}\n".into();
        let d = diff(&changed, &edited);
        assert_eq!(d.added.len(), 1);
        assert_eq!(d.removed.len(), 1);
        assert_eq!(d.removed[0].nftables[0].text, "table inet t {\n}\n");
        assert!(d.added[0].nftables[0].text.contains("chain c"));
    }
}
