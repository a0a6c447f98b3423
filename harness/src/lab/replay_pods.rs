//! A replay's pods: each captured pod's namespace role (`<node>-pod<k>`,
//! which only names its namespace), what says it is a pod and whether it
//! is probed (`capture::evidence`), under the name its capture gave it.

use super::compile::PING_GROUP_RANGE;
use super::state::FoundPod;
use crate::capture::{self, Loaded};
use crate::model::Node as ModelNode;
use std::collections::BTreeMap;

/// The probes' ICMP sockets need `ping_group_range` open in the node and
/// in every probed pod, as in a lab's (a real node's namespaces start with
/// `1 0`, which excludes root); what stands beside the lab (a NAT box) is
/// not probed.
pub(super) fn open_ping(node: &mut ModelNode, judged: &[FoundPod]) {
    let probed = node.pods.iter_mut().filter(|p| {
        judged
            .iter()
            .any(|f| f.role == p.name && f.skipped.is_none())
    });
    for ns in std::iter::once(&mut node.net).chain(probed) {
        ns.sysctls
            .insert(PING_GROUP_RANGE.0.into(), PING_GROUP_RANGE.1.into());
    }
}

/// What each captured pod of `l` is in the replay: its role (`roles`: its
/// captured name → its namespace role), and the evidence that it is a pod
/// (recorded at capture, and what the model says) or why it is not probed.
pub(super) fn judged(l: &Loaded, roles: &BTreeMap<String, String>) -> Vec<FoundPod> {
    let node = &l.capture.node;
    node.pods
        .iter()
        .map(|pod| {
            let recorded = l
                .capture
                .pods
                .iter()
                .find(|s| s.name == pod.name)
                .map(|s| s.evidence.clone())
                .unwrap_or_default();
            let j = capture::evidence::judge(node, pod, &recorded);
            FoundPod {
                node: node.net.name.clone(),
                name: pod.name.clone(),
                role: roles.get(&pod.name).cloned().unwrap_or_default(),
                evidence: j.evidence,
                skipped: j.skipped,
            }
        })
        .collect()
}

/// The node with its pods' namespaces named `<node>-pod<k>` (what a
/// standing lab's namespaces may be called), every reference to a pod
/// renamed with it, and each captured name's role. The captured names stay
/// the pods' names in every output ([`FoundPod`]); the role only names the
/// namespace.
pub(super) fn renamed(node: &ModelNode) -> (ModelNode, BTreeMap<String, String>) {
    let mut node = node.clone();
    // A lab's pod keeps its number (`…-node1-pod7` stays `node1-pod7`).
    let me = node.net.name.clone();
    // Another lab's namespace keeps its role (`…-node1-nat`).
    // Only the roles a standing lab owns (`state::owns_namespace`), so
    // `lab down` and `sweep` find every namespace it made.
    let role = |name: &str| {
        let at = name.find(&format!("{me}-"))?;
        let role = &name[at..];
        let pod_k = role
            .strip_prefix(&format!("{me}-pod"))
            .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
        (pod_k || role == super::underlay::nat_role(&me)).then(|| role.to_string())
    };
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut taken: Vec<String> = Vec::new();
    for (k, p) in node.pods.iter().enumerate() {
        let mut new = role(&p.name).unwrap_or_else(|| format!("{me}-pod{k}"));
        let mut extra = node.pods.len();
        while taken.contains(&new) {
            new = format!("{me}-pod{extra}");
            extra += 1;
        }
        taken.push(new.clone());
        names.insert(p.name.clone(), new);
    }
    node.rename_pods(&names);
    (node, names)
}
