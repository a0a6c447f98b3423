//! Naming the likely cause of a failed probe in a lab: the node rules
//! (`crate::connectivity::node_rules`, which `e2e` shares) on the facts read
//! from the lab's nodes, then the rules of the lab's shapes (underlay,
//! VXLAN, Services, kube-proxy).

use super::built::Lab;
use super::facts::NodeFacts;
use crate::connectivity::node_rules::{diagnose_nodes, Network};
use crate::connectivity::{Diagnosis, ProbeOutcome};

/// Reads routes, sysctls, the uplink MTU and the firewall ruleset of every node.
pub fn collect(lab: &Lab) -> Vec<NodeFacts> {
    let mut facts = super::facts::collect_nodes(lab);
    for (i, f) in facts.iter_mut().enumerate() {
        super::vxlan::facts(lab, i, f);
    }
    facts
}

/// The likely causes of one failed probe.
pub fn diagnose(lab: &Lab, facts: &[NodeFacts], o: &ProbeOutcome) -> Vec<Diagnosis> {
    let network = Network {
        routes_in_router: super::underlay::routes_in_router(&lab.topo),
        mtu: lab.topo.mtu,
        cluster_cidr: &lab.topo.cluster_cidr,
        pods: lab
            .nodes
            .iter()
            .flat_map(|n| {
                n.pods.iter().map(move |p| {
                    (
                        format!("{}/{}", n.spec.name, p.name),
                        p.ips.iter().map(|ip| ip.addr()).collect(),
                    )
                })
            })
            .collect(),
    };
    let mut out = diagnose_nodes(&network, facts, o);
    super::underlay::diagnose(lab, facts, o, &mut out);
    super::vxlan::diagnose(lab, facts, o, &mut out);
    super::services::diagnose(lab, facts, o, &mut out);
    super::kube_proxy::diagnose(lab, facts, o, &mut out);
    out.dedup();
    out
}
