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
        hooks: missing(&a.hooks, &b.hooks),
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
        && ns.hooks.is_empty()
}
