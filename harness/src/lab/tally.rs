//! A lab check's report: what ran and how it went, put together once the
//! probes are judged and the failures diagnosed.

use super::built::Lab;
use super::checks;
use crate::connectivity::report::{Failure, NodeView, Report};
use crate::connectivity::{Diagnosis, ProbeOutcome};
use std::time::Instant;

/// What a check found, for its report.
pub struct Checked {
    /// Every probe's outcome, in plan order.
    pub outcomes: Vec<ProbeOutcome>,
    /// The failed probes, each with its diagnoses.
    pub failures: Vec<Failure>,
    /// The host's limits that may have failed probes (why, where one did).
    pub host_limits: Vec<Option<String>>,
    /// Warnings: the lab's detours, the drop reasons not read.
    pub warnings: Vec<Diagnosis>,
    /// Why the plan was a sample, where it was one.
    pub sampled: Option<String>,
    /// When the checks started.
    pub started: Instant,
}

/// For a replayed lab (`lab up --capture`: what it can probe comes from
/// the captures), every selected group that got no probe, with why; a
/// lab built from a topology has none (its groups follow its topology).
fn skipped(lab: &Lab, groups: &[String], ran: &[&str]) -> Vec<(String, String)> {
    if !lab
        .nodes
        .iter()
        .any(|n| n.net.name == super::replay::NET_NAME)
    {
        return Vec::new();
    }
    let kube_proxy = !lab.topo.kube_services.is_empty();
    checks::all_groups()
        .into_iter()
        .filter(|g| checks::selected(groups, g, None) && !ran.contains(g))
        .map(|g| {
            let why = match g {
                crate::connectivity::groups::POD_TO_EXTERNAL => super::outside::NO_GATEWAY,
                crate::connectivity::groups::POD_TO_POD_SAME_NODE => "no captured node has two pods",
                g if g.starts_with("service/") && kube_proxy => {
                    "the captures' kube-proxy Services are probed by service/cluster-ip (every pod to each ClusterIP); the per-backend Services this group needs exist only in a topology's [service]"
                }
                g if g.starts_with("service/") => "the captures hold no Service (no kube-proxy chain the replay could read)",
                _ => "the captured nodes and pods give it no probe",
            };
            (g.to_string(), why.to_string())
        })
        .collect()
}

/// The lab's report: its nodes and pods, the outcomes by group (in
/// [`checks::GROUPS`] order), the failures with their diagnoses, what could
/// not be told (a host limit is the verdict only where no named cause
/// explains), the warnings, the groups a replay skipped, and the time each
/// build phase and the checks took.
pub fn report(lab: &Lab, groups: &[String], checked: Checked) -> Report {
    let Checked {
        outcomes,
        failures,
        host_limits,
        warnings,
        sampled,
        started,
    } = checked;
    let nodes = lab
        .nodes
        .iter()
        .map(|n| NodeView {
            name: n.spec.name.clone(),
            address: n
                .spec
                .addresses()
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(","),
            pod_cidr: n.spec.pod_cidr.iter().map(|c| c.to_string()).collect(),
            pods: n
                .pods
                .iter()
                .map(|p| {
                    (
                        p.name.clone(),
                        p.ips.iter().map(|i| i.addr().to_string()).collect(),
                    )
                })
                .collect(),
        })
        .collect();
    let routing = format!("{:?}", lab.topo.routing).to_lowercase();
    let mut report = Report::from_parts(
        &lab.topo.name,
        &lab.plugin_dir,
        &routing,
        nodes,
        &checks::all_groups(),
        outcomes,
        failures,
    );
    for (phase, took) in &lab.phases {
        report.add_phase(phase, *took);
    }
    for why in host_limits {
        report.inconclusive_unless_explained(why);
    }
    let ran: Vec<&str> = report.groups.iter().map(|g| g.name.as_str()).collect();
    report.skipped = skipped(lab, groups, &ran);
    report.add_phase("checks", started.elapsed());
    report.sampled = sampled;
    report.warnings = warnings;
    report
}
