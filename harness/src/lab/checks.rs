//! The connectivity matrix: which probes to send, sending them all
//! concurrently, and judging each reply (including the source address the
//! peer saw, which proves masquerade or its absence).

use super::built::Lab;
use super::probe::{self, Reply};
use crate::connectivity::catalogue::{self, Cluster};
use crate::connectivity::matrix::Slot;
use crate::connectivity::report::{Failure, NodeView, Report};
use crate::connectivity::{Endpoint, ExpectSource, ProbeOutcome, ProbeSpec};
use futures_util::stream::{self, StreamExt};
use std::fs::File;
use std::net::IpAddr;
use std::time::Duration;

/// Check groups, in report order.
pub const GROUPS: &[&str] = crate::connectivity::groups::LAB;

/// Check groups that run only in labs that have what they check (a
/// `[service]`, IPv6 pods), in report order after [`GROUPS`].
pub const OPTIONAL_GROUPS: &[&str] = &[
    super::services::SAME_NODE,
    super::services::CROSS_NODE,
    super::services::HAIRPIN,
    super::services::CLUSTER_IP,
];

/// [`GROUPS`], then [`OPTIONAL_GROUPS`].
pub fn all_groups() -> Vec<&'static str> {
    GROUPS.iter().chain(OPTIONAL_GROUPS).copied().collect()
}

/// Refuses a group filter that selects no group (groups are prefixes:
/// `pod-to-pod` selects both pod-to-pod groups; `@ipv4` or `@ipv6` after
/// one keeps one address family, e.g. `pod-to-pod/cross-node@ipv6`).
pub fn check_groups(groups: &[String]) -> Result<(), String> {
    let all = all_groups();
    for g in groups {
        let (prefix, family) = split_selector(g);
        if family.is_some_and(|f| f != "ipv4" && f != "ipv6") {
            return Err(format!("{g:?}: the family after '@' is ipv4 or ipv6"));
        }
        if !all.iter().any(|k| k.starts_with(prefix)) {
            return Err(format!(
                "no check group is named or starts with {g:?}; the groups are {}",
                all.join(", ")
            ));
        }
    }
    Ok(())
}

/// A group selector's prefix and the family after its `@`, if any.
fn split_selector(w: &str) -> (&str, Option<&str>) {
    match w.rsplit_once('@') {
        Some((prefix, family)) => (prefix, Some(family)),
        None => (w, None),
    }
}

/// Whether the selectors `groups` (none: every group) select group `g` in
/// family `v6` (`None`: any family).
fn selected(groups: &[String], g: &str, v6: Option<bool>) -> bool {
    groups.is_empty()
        || groups.iter().any(|w| {
            let (prefix, family) = split_selector(w);
            let family_ok = match (family, v6) {
                (Some("ipv4"), Some(v6)) => !v6,
                (Some("ipv6"), Some(v6)) => v6,
                _ => true,
            };
            family_ok && g.starts_with(prefix)
        })
}

/// The lab as the probe catalogue plans over it.
impl Cluster for Lab {
    fn pods_per_node(&self) -> Vec<usize> {
        self.nodes.iter().map(|n| n.pods.len()).collect()
    }

    fn pod(&self, at: Slot, v6: bool) -> Option<Endpoint> {
        self.pod_endpoint(at.node, at.pos, v6)
    }

    /// Node `n` at its underlay address of one family.
    fn node(&self, n: usize, v6: bool) -> Option<Endpoint> {
        Some(Endpoint {
            name: self.nodes[n].spec.name.clone(),
            node: Some(n),
            pod: None,
            ip: self.nodes[n].spec.address_of(v6)?,
            external: false,
        })
    }

    /// The external host (`[external]`), which node `n`'s pods reach
    /// masqueraded to the node's underlay address.
    fn external(&self, n: usize, v6: bool) -> Option<(Endpoint, IpAddr)> {
        let ip = self.topo.external.as_ref()?.address_of(v6)?;
        let node_ip = self.nodes[n].spec.address_of(v6)?;
        let dst = Endpoint {
            name: "external".into(),
            node: None,
            pod: None,
            ip,
            external: true,
        };
        Some((dst, node_ip))
    }
}

/// The probe plan: the catalogue's probes in each address family the pods
/// have (IPv4, then IPv6), then the lab's Service probes.
pub fn probes(lab: &Lab, groups: &[String]) -> Vec<ProbeSpec> {
    let mut out = Vec::new();
    for v6 in [false, true] {
        let wanted = |g: &str| selected(groups, g, Some(v6));
        out.extend(catalogue::plan(lab, &wanted, v6));
    }
    // Once, whatever the families: the Services pick their own addresses.
    let wanted = |g: &str| selected(groups, g, None);
    super::services::probes(lab, &wanted, &mut out);
    super::kube_proxy::probes(lab, &wanted, &mut out);
    out
}

/// For a replayed lab (`lab up --capture`: what it can probe comes from
/// the captures), every selected group that got no probe, with why; a
/// lab built from a topology has none (its groups follow its topology).
pub fn skipped(lab: &Lab, groups: &[String], ran: &[&str]) -> Vec<(String, String)> {
    if !lab
        .nodes
        .iter()
        .any(|n| n.net.name == super::replay::NET_NAME)
    {
        return Vec::new();
    }
    let kube_proxy = || {
        super::facts::collect_nodes(lab)
            .iter()
            .any(|f| f.ruleset.contains("KUBE-SERVICES"))
    };
    all_groups()
        .into_iter()
        .filter(|g| selected(groups, g, None) && !ran.contains(g))
        .map(|g| {
            let why = match g {
                crate::connectivity::groups::POD_TO_EXTERNAL => super::outside::NO_GATEWAY,
                crate::connectivity::groups::POD_TO_POD_SAME_NODE => "no captured node has two pods",
                g if g.starts_with("service/") && kube_proxy() => {
                    "the captures' kube-proxy Services are probed by service/cluster-ip (every pod to each ClusterIP); the per-backend Services this group needs exist only in a topology's [service]"
                }
                g if g.starts_with("service/") => "the captures hold no Service (no kube-proxy chains)",
                _ => "the captured nodes and pods give it no probe",
            };
            (g.to_string(), why.to_string())
        })
        .collect()
}

/// The lab's report: its nodes and pods, the outcomes by group (in
/// [`GROUPS`] order) and the time each build phase took.
pub fn report(lab: &Lab, outcomes: Vec<ProbeOutcome>, failures: Vec<Failure>) -> Report {
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
        &all_groups(),
        outcomes,
        failures,
    );
    for (phase, took) in &lab.phases {
        report.add_phase(phase, *took);
    }
    report.sampled = catalogue::sampled_note(lab);
    report
}

fn ns_of<'a>(lab: &'a Lab, e: &Endpoint) -> Option<&'a File> {
    if e.external {
        return lab.external.as_ref().map(|n| n.file());
    }
    let node = &lab.nodes[e.node?];
    match e.pod {
        Some(p) => Some(node.pods.get(p)?.ns.file()),
        None => Some(node.ns.file()),
    }
}

/// Starts a responder in every pod, node and the external host.
pub fn start_responders(lab: &Lab, rt: &tokio::runtime::Handle) -> Result<(), String> {
    let mut targets: Vec<(String, &File)> = Vec::new();
    for node in &lab.nodes {
        targets.push((node.spec.name.clone(), node.ns.file()));
        for pod in &node.pods {
            targets.push((format!("{}/{}", node.spec.name, pod.name), pod.ns.file()));
        }
    }
    if let Some(ext) = &lab.external {
        targets.push(("external".into(), ext.file()));
    }
    // A captured Service's endpoints listen on its target ports too.
    let ports: Vec<u16> = std::iter::once(probe::PORT)
        .chain(super::kube_proxy::target_ports(lab))
        .collect();
    for (name, ns) in targets {
        for &port in &ports {
            // One dual-stack socket ([::]) answers both families; a kernel
            // without IPv6 gets an IPv4 one.
            probe::start_responders(ns, true, rt, &name, port)
                .or_else(|_| probe::start_responders(ns, false, rt, &name, port))
                .map_err(|e| format!("responder in {name} on port {port}: {e}"))?;
        }
    }
    Ok(())
}

fn judge(spec: &ProbeSpec, reply: Result<Reply, String>) -> ProbeOutcome {
    match reply {
        Err(error) => ProbeOutcome {
            spec: spec.clone(),
            error: Some(error),
            seen_source: None,
            rtt_ms: None,
        },
        Ok(reply) => {
            let wrong_peer = reply
                .responder
                .as_ref()
                .filter(|r| **r != spec.to.name && !super::services::may_answer(spec, r));
            let error = match (spec.expect_source, reply.seen_src) {
                _ if wrong_peer.is_some() => Some(format!(
                    "answered by {}, not by {}: the address {} leads to the wrong endpoint",
                    wrong_peer.map(String::as_str).unwrap_or_default(),
                    spec.to.name,
                    spec.to.ip
                )),
                (Some(ExpectSource::Unchanged(want)), Some(seen)) if seen != want => Some(format!(
                    "peer saw source {seen}, expected the pod's own address {want} (traffic inside the cluster was NATed)"
                )),
                (Some(ExpectSource::Masqueraded(want)), Some(seen)) if seen != want => Some(format!(
                    "external host saw source {seen}, expected the node address {want} (not masqueraded)"
                )),
                _ => None,
            };
            ProbeOutcome {
                spec: spec.clone(),
                error,
                seen_source: reply.seen_src,
                rtt_ms: Some(reply.rtt.as_secs_f64() * 1000.0),
            }
        }
    }
}

/// Sends every probe (at most `concurrency` at once) and returns the
/// outcomes in plan order. `progress` is called after each probe.
pub fn run(
    lab: &Lab,
    specs: &[ProbeSpec],
    rt: &tokio::runtime::Runtime,
    concurrency: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Vec<ProbeOutcome> {
    let timeout = Duration::from_millis(lab.topo.probe_timeout_ms);
    let total = specs.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    // DF probes are sized to the pods' MTU: what the plugin configured.
    let mtu = lab.topo.pod_mtu();
    rt.block_on(async {
        let jobs = specs.iter().map(|spec| {
            let done = &done;
            async move {
                let reply = match ns_of(lab, &spec.from) {
                    Some(ns) => {
                        probe::probe(
                            ns,
                            spec.to.ip,
                            probe::port_of(spec),
                            spec.proto,
                            timeout,
                            mtu,
                        )
                        .await
                    }
                    None => Err(format!("{} no longer exists", spec.from.name)),
                };
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(n, total);
                judge(spec, reply)
            }
        });
        let mut outcomes: Vec<(usize, ProbeOutcome)> =
            stream::iter(jobs.enumerate().map(|(i, f)| async move { (i, f.await) }))
                .buffer_unordered(concurrency.max(1))
                .collect()
                .await;
        outcomes.sort_by_key(|(i, _)| *i);
        outcomes.into_iter().map(|(_, o)| o).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectivity::Proto;

    /// `@ipv4`/`@ipv6` keep one family of the groups the prefix selects;
    /// any other family, or a prefix of no group, is refused.
    #[test]
    fn family_selectors_select_one_family() {
        let sel = |w: &str| vec![w.to_string()];
        let six = sel("pod-to-pod/cross-node@ipv6");
        assert!(selected(&six, "pod-to-pod/cross-node", Some(true)));
        assert!(!selected(&six, "pod-to-pod/cross-node", Some(false)));
        assert!(!selected(&six, "node-to-pod", Some(true)));
        assert!(selected(
            &sel("pod-to-pod"),
            "pod-to-pod/same-node",
            Some(false)
        ));
        assert!(selected(&[], "mtu/df-cross-node", Some(true)));
        assert!(check_groups(&six).is_ok());
        assert!(check_groups(&sel("pod-to-pod@ipv5")).is_err());
        assert!(check_groups(&sel("nonsense@ipv4")).is_err());
    }

    fn spec(expect: Option<ExpectSource>) -> ProbeSpec {
        let e = Endpoint {
            name: "a".into(),
            node: Some(0),
            pod: Some(0),
            ip: IpAddr::from([10, 244, 1, 2]),
            external: false,
        };
        ProbeSpec {
            group: "pod-to-pod/cross-node",
            from: e.clone(),
            to: e,
            proto: Proto::Tcp,
            expect_source: expect,
            service: None,
        }
    }

    #[test]
    fn snat_inside_the_cluster_fails_the_probe() {
        let s = spec(Some(ExpectSource::Unchanged(IpAddr::from([10, 244, 1, 2]))));
        let reply = Reply {
            seen_src: Some(IpAddr::from([10, 250, 0, 1])),
            responder: Some("a".into()),
            rtt: Duration::from_millis(1),
        };
        let out = judge(&s, Ok(reply.clone()));
        assert!(!out.passed());
        assert!(out.error.as_deref().unwrap_or("").contains("NATed"));
        let ok = judge(
            &spec(Some(ExpectSource::Masqueraded(IpAddr::from([
                10, 250, 0, 1,
            ])))),
            Ok(reply),
        );
        assert!(ok.passed());
        let timeout = judge(&s, Err("timed out".into()));
        assert!(!timeout.passed());
        let impostor = Reply {
            seen_src: Some(IpAddr::from([10, 244, 1, 2])),
            responder: Some("b".into()),
            rtt: Duration::from_millis(1),
        };
        let wrong = judge(&s, Ok(impostor));
        assert!(wrong
            .error
            .as_deref()
            .unwrap_or("")
            .contains("answered by b"));
    }
}
