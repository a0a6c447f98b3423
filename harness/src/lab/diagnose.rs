//! Naming the likely cause of a failed probe in a lab: the node rules
//! (`crate::connectivity::node_rules`, which `e2e` shares) on the facts read
//! from the lab's nodes, then the rules of the lab's shapes (underlay,
//! VXLAN, Services, kube-proxy).

use super::built::Lab;
use super::facts::NodeFacts;
use crate::connectivity::node_rules::{diagnose_nodes, Network};
use crate::connectivity::report::Failure;
use crate::connectivity::{Diagnosis, ProbeOutcome};

/// Every failed probe of `outcomes` with its likely causes: the node
/// rules' and those along its path (see [`Failure::new`]); and the warnings that
/// hold whether or not a probe failed (a route that detours through
/// another node). `neighbours_before`: each node's underlay neighbours,
/// taken before the probes ran.
pub fn failures(
    lab: &Lab,
    outcomes: &[ProbeOutcome],
    neighbours_before: Vec<Vec<crate::netns::Neighbour>>,
) -> (Vec<Failure>, Vec<Diagnosis>) {
    let failed: Vec<(usize, &ProbeOutcome)> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.passed())
        .collect();
    let mut facts = if failed.is_empty() {
        Vec::new()
    } else {
        collect(lab)
    };
    for (f, before) in facts.iter_mut().zip(neighbours_before) {
        for n in before {
            if !f.uplink_neighbours.contains(&n) {
                f.uplink_neighbours.push(n);
            }
        }
    }
    let named: Vec<Vec<Diagnosis>> = failed
        .iter()
        .map(|(_, o)| diagnose(lab, &facts, o))
        .collect();
    let probes: Vec<&ProbeOutcome> = failed.iter().map(|(_, o)| *o).collect();
    let (on_path, warnings) = super::diagnose_path::diagnose_all(lab, &facts, &probes);
    let failures = failed
        .into_iter()
        .zip(named)
        .zip(on_path)
        .map(|(((index, o), mut diagnoses), path)| {
            for d in path {
                if !diagnoses.contains(&d) {
                    diagnoses.push(d);
                }
            }
            Failure::new(index, o, diagnoses)
        })
        .collect();
    (failures, warnings)
}

/// Reads routes, sysctls, the uplink MTU and the firewall ruleset of every node.
fn collect(lab: &Lab) -> Vec<NodeFacts> {
    let mut facts = super::facts::collect_nodes(lab);
    for (i, f) in facts.iter_mut().enumerate() {
        super::vxlan::facts(lab, i, f);
    }
    facts
}

/// The likely causes of one failed probe.
fn diagnose(lab: &Lab, facts: &[NodeFacts], o: &ProbeOutcome) -> Vec<Diagnosis> {
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
