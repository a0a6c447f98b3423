//! Sending a check's probes: a responder in every namespace, every probe
//! sent concurrently from its namespace, and each reply judged (including
//! the source address the peer saw, which proves masquerade or its absence).

use super::built::Lab;
use super::checks::Probes;
use super::probe::{self, Reply};
use crate::connectivity::{Endpoint, ExpectSource, ProbeOutcome, ProbeSpec};
use futures_util::stream::{self, StreamExt};
use std::fs::File;
use std::time::Duration;

/// Starts a responder in every pod, node and the external host, on
/// `probe::PORT` and on `ports`.
fn start_responders(lab: &Lab, ports: &[u16], rt: &tokio::runtime::Handle) -> Result<(), String> {
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
    let ports: Vec<u16> = std::iter::once(probe::PORT)
        .chain(ports.iter().copied())
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

/// Starts the responders, then sends every probe of `probes` (at most
/// `concurrency` at once) and returns the outcomes in plan order.
/// `progress` is called after each probe.
pub fn run(
    lab: &Lab,
    probes: &Probes,
    rt: &tokio::runtime::Runtime,
    concurrency: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<ProbeOutcome>, String> {
    start_responders(lab, &probes.ports, rt.handle())?;
    let specs = &probes.specs;
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
        Ok(outcomes.into_iter().map(|(_, o)| o).collect())
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectivity::Proto;
    use std::net::IpAddr;

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
