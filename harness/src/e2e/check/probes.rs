//! The probes, as commands run in a pod through the API's exec, and how each
//! answer is judged. The pods run agnhost's `netexec`: `/hostname` proves
//! which pod answered, `/clientip` which source address it saw (pod to pod
//! must not be NATed), `/dial?protocol=udp` makes the source pod's own netexec
//! send a UDP request and report the peer's answer.

use super::nodes::{ClusterNode, NodeFinding};
use super::objects::{HTTP_PORT, UDP_PORT};
use super::NotReady;
use crate::connectivity::catalogue;
use crate::connectivity::groups;
use crate::connectivity::matrix::Slot;
use crate::connectivity::{Diagnosis, Endpoint, ProbeOutcome, ProbeSpec, Proto};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Check groups, in report order.
pub const GROUPS: &[&str] = groups::E2E;

/// A probe pod as the check found it running.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProbePod {
    pub name: String,
    pub node: usize,
    pub host: bool,
    pub ips: Vec<IpAddr>,
    /// eth0's MTU, read in the pod before probing.
    pub mtu: Option<u32>,
}

impl ProbePod {
    fn ip(&self, v6: bool) -> Option<IpAddr> {
        self.ips.iter().copied().find(|ip| ip.is_ipv6() == v6)
    }
}

/// Everything the plan is built from.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    pub namespace: String,
    pub nodes: Vec<ClusterNode>,
    /// Regular pods (two per node), then nothing else.
    pub pods: Vec<ProbePod>,
    /// hostNetwork pods, one per node.
    pub hosts: Vec<ProbePod>,
    /// ClusterIPs of the echo service.
    pub echo_ips: Vec<IpAddr>,
    /// ClusterIPs of each node's self service, by node index.
    pub self_ips: Vec<Vec<IpAddr>>,
}

/// What a correct answer looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Exit status 0 is enough (ping, or a node answering).
    Success,
    /// `/hostname` then `/clientip`: this pod answered and saw that source.
    PeerAndSource { peer: String, source: IpAddr },
    /// `/hostname` must be one of these pods.
    OneOf(Vec<String>),
    /// The UDP dial must have been answered by this pod.
    UdpPeer(String),
}

#[derive(Clone, Debug)]
pub struct Probe {
    pub spec: ProbeSpec,
    /// The pod the command runs in.
    pub exec_pod: String,
    pub command: Vec<String>,
    pub expect: Expect,
}

fn url(ip: IpAddr, port: u16, path: &str) -> String {
    match ip {
        IpAddr::V4(a) => format!("http://{a}:{port}{path}"),
        IpAddr::V6(a) => format!("http://[{a}]:{port}{path}"),
    }
}

fn curl(urls: Vec<String>) -> Vec<String> {
    let mut c: Vec<String> = ["curl", "-sS", "-g", "--max-time", "5", "-w", "\\n"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    c.extend(urls);
    c
}

pub fn ping(ip: IpAddr) -> Vec<String> {
    ["ping", "-c", "1", "-W", "2"]
        .iter()
        .map(|s| s.to_string())
        .chain([ip.to_string()])
        .collect()
}

/// A ping that fills the pod MTU. No `-M do`: agnhost's ping is busybox's,
/// which lacks it; Linux sets DF anyway on a packet that fits the route MTU
/// (`ip_no_pmtu_disc=0`, the default), and IPv6 never fragments in transit.
pub fn df_ping(ip: IpAddr, mtu: u32) -> Vec<String> {
    let headers = if ip.is_ipv6() { 48 } else { 28 };
    let size = mtu.saturating_sub(headers).to_string();
    ["ping", "-c", "1", "-W", "2", "-s"]
        .iter()
        .map(|s| s.to_string())
        .chain([size, ip.to_string()])
        .collect()
}

pub fn udp_dial(ip: IpAddr) -> Vec<String> {
    vec![
        "curl".into(),
        "-sS".into(),
        "--max-time".into(),
        "8".into(),
        format!(
            "http://127.0.0.1:{HTTP_PORT}/dial?request=hostname&protocol=udp&host={ip}&port={UDP_PORT}&tries=1"
        ),
    ]
}

/// The command that reads eth0's MTU in a pod before probing.
pub fn mtu_command() -> Vec<String> {
    vec!["cat".into(), "/sys/class/net/eth0/mtu".into()]
}

fn pod_endpoint(c: &Cluster, i: usize, v6: bool) -> Option<Endpoint> {
    let p = c.pods.get(i)?;
    let node = c.nodes.get(p.node)?;
    Some(Endpoint {
        name: format!("{}/{}", node.name, p.name),
        node: Some(p.node),
        pod: Some(i),
        ip: p.ip(v6)?,
        external: false,
    })
}

/// The cluster as the probe catalogue plans over it: a pod's position is
/// its place among its node's probe pods, its endpoint's `pod` its index
/// into [`Cluster::pods`].
impl catalogue::Cluster for Cluster {
    fn pods_per_node(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .map(|n| self.pods.iter().filter(|p| p.node == n).count())
            .collect()
    }

    fn pod(&self, at: Slot, v6: bool) -> Option<Endpoint> {
        let (i, _) = self
            .pods
            .iter()
            .enumerate()
            .filter(|(_, p)| p.node == at.node)
            .nth(at.pos)?;
        pod_endpoint(self, i, v6)
    }

    /// Node `n` at its InternalIP of one family.
    fn node(&self, n: usize, v6: bool) -> Option<Endpoint> {
        let node = self.nodes.get(n)?;
        Some(Endpoint {
            name: node.name.clone(),
            node: Some(n),
            pod: None,
            ip: node.internal_ip(v6)?,
            external: false,
        })
    }
}

/// A catalogue probe as a command in a pod: the source pod runs it (the
/// source node's hostNetwork pod, for node-to-pod), and its answer is
/// judged by what the group needs. `None` when the cluster has no pod to
/// run it in, or no MTU read for the DF probe.
fn exec_probe(c: &Cluster, mut spec: ProbeSpec) -> Option<Probe> {
    let pod = |e: &Endpoint| e.pod.and_then(|i| c.pods.get(i));
    let to = spec.to.ip;
    let (exec, command, expect) = match (spec.group, spec.proto) {
        (groups::NODE_TO_POD, proto) => {
            let host = c.hosts.iter().find(|h| Some(h.node) == spec.from.node)?;
            let command = match proto {
                Proto::Icmp => ping(to),
                _ => curl(vec![url(to, HTTP_PORT, "/hostname")]),
            };
            let expect = match proto {
                Proto::Icmp => Expect::Success,
                _ => Expect::OneOf(vec![pod(&spec.to)?.name.clone()]),
            };
            (&host.name, command, expect)
        }
        (_, Proto::Df) => {
            let src = pod(&spec.from)?;
            (&src.name, df_ping(to, src.mtu?), Expect::Success)
        }
        (_, Proto::Icmp) => (&pod(&spec.from)?.name, ping(to), Expect::Success),
        (groups::POD_TO_NODE, _) => {
            let command = curl(vec![url(to, HTTP_PORT, "/hostname")]);
            (&pod(&spec.from)?.name, command, Expect::Success)
        }
        (_, Proto::Tcp) => {
            // The peer answered, and saw the pod's own address.
            let command = curl(vec![
                url(to, HTTP_PORT, "/hostname"),
                url(to, HTTP_PORT, "/clientip"),
            ]);
            let expect = Expect::PeerAndSource {
                peer: pod(&spec.to)?.name.clone(),
                source: spec.from.ip,
            };
            (&pod(&spec.from)?.name, command, expect)
        }
        (_, Proto::Udp) => {
            // The dial reports who answered, not the source it saw.
            spec.expect_source = None;
            let expect = Expect::UdpPeer(pod(&spec.to)?.name.clone());
            (&pod(&spec.from)?.name, udp_dial(to), expect)
        }
    };
    Some(Probe {
        exec_pod: exec.clone(),
        spec,
        command,
        expect,
    })
}

/// Who probes whom, in which group: the pod the command runs in (`exec`),
/// and the endpoints the report names.
struct Pair<'e> {
    group: &'static str,
    exec: &'e str,
    from: &'e Endpoint,
    to: &'e Endpoint,
}

/// Builds the Service probes of one address family, in plan order.
struct Planner<'a> {
    c: &'a Cluster,
    v6: bool,
    /// The first family asked for (the DNS probe runs in it only).
    first: bool,
    pod_names: Vec<String>,
    out: &'a mut Vec<Probe>,
}

impl Planner<'_> {
    /// Adds one probe of `pair`: protocol, command, expectation.
    fn add(&mut self, pair: &Pair<'_>, proto: Proto, command: Vec<String>, expect: Expect) {
        self.out.push(Probe {
            spec: ProbeSpec {
                group: pair.group,
                from: pair.from.clone(),
                to: pair.to.clone(),
                proto,
                expect_source: None,
                service: None,
            },
            exec_pod: pair.exec.to_string(),
            command,
            expect,
        });
    }

    /// An HTTP GET of `/hostname` on `port`, judged by `expect`.
    fn hostname(&mut self, pair: &Pair<'_>, port: u16, expect: Expect) {
        let command = curl(vec![url(pair.to.ip, port, "/hostname")]);
        self.add(pair, Proto::Tcp, command, expect);
    }

    /// Pod `i` to the echo Service by ClusterIP, and (first family only)
    /// by its DNS name: any probe pod may answer.
    fn pod_to_service(&mut self, i: usize, src: &Endpoint) {
        let c = self.c;
        let v6 = self.v6;
        let Some(ip) = c.echo_ips.iter().copied().find(|ip| ip.is_ipv6() == v6) else {
            return;
        };
        let dst = Endpoint {
            name: format!("service/{}", super::objects::ECHO_SERVICE),
            node: None,
            pod: None,
            ip,
            external: false,
        };
        let exec = &c.pods[i].name;
        let any = Expect::OneOf(self.pod_names.clone());
        let pair = Pair {
            group: groups::POD_TO_SERVICE,
            exec,
            from: src,
            to: &dst,
        };
        self.hostname(&pair, 80, any.clone());
        if self.first {
            let dns = format!("{}.{}.svc", super::objects::ECHO_SERVICE, c.namespace);
            let dst = Endpoint {
                name: dns.clone(),
                ..dst
            };
            let pair = Pair {
                group: groups::POD_TO_SERVICE_DNS,
                exec,
                from: src,
                to: &dst,
            };
            let command = curl(vec![format!("http://{dns}/hostname")]);
            self.add(&pair, Proto::Tcp, command, any);
        }
    }

    /// Hairpin: the first pod of each node through its node's own Service
    /// must reach itself.
    fn hairpin(&mut self, i: usize, src: &Endpoint) {
        let c = self.c;
        let src_pod = &c.pods[i];
        if c.pods.iter().position(|p| p.node == src_pod.node) != Some(i) {
            return;
        }
        let v6 = self.v6;
        let own = c
            .self_ips
            .get(src_pod.node)
            .and_then(|ips| ips.iter().copied().find(|ip| ip.is_ipv6() == v6));
        let Some(ip) = own else {
            return;
        };
        let dst = Endpoint {
            name: format!(
                "service/{}",
                super::objects::self_service_name(src_pod.node)
            ),
            node: Some(src_pod.node),
            pod: Some(i),
            ip,
            external: false,
        };
        let pair = Pair {
            group: groups::HAIRPIN,
            exec: &src_pod.name,
            from: src,
            to: &dst,
        };
        self.hostname(&pair, 80, Expect::OneOf(vec![src_pod.name.clone()]));
    }
}

/// The probe plan for the families asked for: per family, the catalogue's
/// probes (each pod to its peers and the nodes, each node to every pod),
/// then each pod to the echo Service and to itself through its node's
/// Service.
pub fn plan(c: &Cluster, v4: bool, v6: bool) -> Vec<Probe> {
    let mut out = Vec::new();
    let families: Vec<bool> = [(v4, false), (v6, true)]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, f)| *f)
        .collect();
    let wanted = |g: &str| GROUPS.contains(&g);
    for (fi, &v6) in families.iter().enumerate() {
        let specs = catalogue::plan(c, &wanted, v6);
        out.extend(specs.into_iter().filter_map(|s| exec_probe(c, s)));
        let mut p = Planner {
            c,
            v6,
            first: fi == 0,
            pod_names: c.pods.iter().map(|p| p.name.clone()).collect(),
            out: &mut out,
        };
        for i in 0..c.pods.len() {
            let Some(src) = pod_endpoint(c, i, v6) else {
                continue;
            };
            p.pod_to_service(i, &src);
            p.hairpin(i, &src);
        }
    }
    out
}

/// One outcome per probe pod: Ready, or why not (the `pods-ready` group).
/// The probes of a pod that is not Ready are not run.
pub fn readiness(c: &Cluster, not_ready: &[NotReady], v6: bool) -> Vec<ProbeOutcome> {
    let unspecified = if v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let node_name = |n: usize| c.nodes.get(n).map(|x| x.name.clone()).unwrap_or_default();
    let node_ep = |n: usize| Endpoint {
        name: node_name(n),
        node: Some(n),
        pod: None,
        ip: c
            .nodes
            .get(n)
            .and_then(|x| x.internal_ip(v6))
            .unwrap_or(unspecified),
        external: false,
    };
    let mut rows: Vec<(usize, String, Option<IpAddr>, Option<String>)> = c
        .pods
        .iter()
        .chain(c.hosts.iter())
        .map(|p| (p.node, p.name.clone(), p.ip(v6), None))
        .chain(
            not_ready
                .iter()
                .map(|p| (p.node, p.name.clone(), None, Some(p.state.clone()))),
        )
        .collect();
    rows.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    rows.into_iter()
        .map(|(node, name, ip, state)| ProbeOutcome {
            spec: ProbeSpec {
                group: "pods-ready",
                from: node_ep(node),
                to: Endpoint {
                    name: format!("{}/{name}", node_name(node)),
                    node: Some(node),
                    pod: None,
                    ip: ip.unwrap_or(unspecified),
                    external: false,
                },
                proto: Proto::Tcp,
                expect_source: None,
                service: None,
            },
            error: state.map(|s| format!("not Ready: {s}")),
            seen_source: None,
            rtt_ms: None,
        })
        .collect()
}

/// What an exec returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    /// The API's reason when the command failed (exit code, not found...).
    pub message: String,
}

fn parse_client_ip(text: &str) -> Option<IpAddr> {
    let t = text.trim();
    let host = match t.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) && !port.is_empty() => h,
        _ => t,
    };
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// Judges one exec against what the probe expects.
pub fn judge(probe: &Probe, result: Result<ExecOutput, String>) -> ProbeOutcome {
    let mut outcome = ProbeOutcome {
        spec: probe.spec.clone(),
        error: None,
        seen_source: None,
        rtt_ms: None,
    };
    let out = match result {
        Err(e) => {
            outcome.error = Some(format!("exec in {} failed: {e}", probe.exec_pod));
            return outcome;
        }
        Ok(out) => out,
    };
    if !out.success {
        let detail = [out.stderr.trim(), out.stdout.trim(), out.message.trim()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        outcome.error = Some(if detail.is_empty() {
            format!(
                "{} failed",
                probe.command.first().map(String::as_str).unwrap_or("probe")
            )
        } else {
            last_line(&detail)
        });
        return outcome;
    }
    let mut lines = out.stdout.lines().map(str::trim).filter(|l| !l.is_empty());
    outcome.error = match &probe.expect {
        Expect::Success => None,
        Expect::PeerAndSource { peer, source } => {
            let who = lines.next().unwrap_or_default();
            let seen = lines.next().and_then(parse_client_ip);
            outcome.seen_source = seen;
            if who != peer {
                Some(format!(
                    "answered by {who:?}, not by {peer}: the address {} leads to the wrong endpoint",
                    probe.spec.to.ip
                ))
            } else {
                match seen {
                    Some(s) if s != *source => Some(format!(
                        "peer saw source {s}, expected the pod's own address {source} (traffic inside the cluster was NATed)"
                    )),
                    Some(_) => None,
                    None => Some("no /clientip answer to compare the source address with".into()),
                }
            }
        }
        Expect::OneOf(names) => {
            let who = lines.next().unwrap_or_default();
            if names.iter().any(|n| n == who) {
                None
            } else {
                Some(format!(
                    "answered by {who:?}, expected {}",
                    if names.len() == 1 {
                        names[0].clone()
                    } else {
                        "one of the probe pods".into()
                    }
                ))
            }
        }
        Expect::UdpPeer(peer) => {
            let parsed: Option<serde_json::Value> = serde_json::from_str(out.stdout.trim()).ok();
            let responses: Vec<String> = parsed
                .as_ref()
                .and_then(|v| v["responses"].as_array())
                .into_iter()
                .flatten()
                .filter_map(|r| r.as_str().map(str::to_string))
                .collect();
            if responses.iter().any(|r| r == peer) {
                None
            } else {
                let errors = parsed
                    .as_ref()
                    .and_then(|v| v["errors"].as_array().cloned())
                    .unwrap_or_default();
                Some(if responses.is_empty() {
                    format!(
                        "no UDP answer from {peer}{}",
                        if errors.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", serde_json::Value::Array(errors))
                        }
                    )
                } else {
                    format!("UDP answered by {responses:?}, not by {peer}")
                })
            }
        }
    };
    outcome
}

fn last_line(text: &str) -> String {
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(text);
    line.chars().take(300).collect()
}

/// The likely causes of a failed probe, from the other probes' results and
/// the node findings.
pub fn diagnose(
    c: &Cluster,
    outcomes: &[ProbeOutcome],
    findings: &[NodeFinding],
    o: &ProbeOutcome,
) -> Vec<Diagnosis> {
    let mut out = Vec::new();
    let node_name = |n: Option<usize>| n.and_then(|n| c.nodes.get(n)).map(|n| n.name.clone());
    let touched: Vec<String> = [node_name(o.spec.from.node), node_name(o.spec.to.node)]
        .into_iter()
        .flatten()
        .collect();
    for f in findings {
        if f.nodes.iter().any(|n| touched.contains(n)) && !out.contains(&f.diagnosis) {
            out.push(f.diagnosis.clone());
        }
    }
    let passed = |group: &str, from: &str, to: Option<&str>, proto: Option<Proto>| {
        outcomes.iter().any(|x| {
            x.passed()
                && x.spec.group == group
                && x.spec.from.name == from
                && to.is_none_or(|t| x.spec.to.name == t)
                && proto.is_none_or(|p| x.spec.proto == p)
        })
    };
    let from = o.spec.from.name.as_str();
    let to = o.spec.to.name.as_str();
    if o.spec.expect_source.is_some()
        && o.seen_source.is_some()
        && o.error.as_deref().is_some_and(|e| e.contains("NATed"))
    {
        out.push(Diagnosis {
            id: "masquerade-too-broad",
            message: format!(
                "{to} saw {} instead of {}: pod-to-pod traffic is masqueraded; the MASQUERADE rule must exclude the cluster CIDR (the agent's CNILAB_CLUSTER_CIDR)",
                o.seen_source.map(|s| s.to_string()).unwrap_or_default(),
                o.spec.from.ip
            ),
        });
        return out;
    }
    match o.spec.group {
        "pods-ready" => {
            let err = o.error.as_deref().unwrap_or_default();
            let node = touched.first().cloned().unwrap_or_default();
            if err.contains("ImagePull") || err.contains("ErrImage") {
                out.push(Diagnosis {
                    id: "image-pull",
                    message: format!(
                        "{node} cannot pull the probe image: give a reachable one with --image (it must provide agnhost's netexec, curl and ping)"
                    ),
                });
            } else if err.contains("ContainerCreating")
                || err.contains("Sandbox")
                || err.contains("network")
            {
                out.push(Diagnosis {
                    id: "cni-add-failed",
                    message: format!(
                        "the pod sandbox on {node} was not set up: the CNI ADD failed or no CNI config is installed there (check the agent pod on {node}, /etc/cni/net.d and /opt/cni/bin; `cnilab e2e <provider> dump` saves them)"
                    ),
                });
            }
        }
        "pod-to-pod/cross-node" if passed("pod-to-pod/same-node", from, None, None) => {
            let dst_node = o.spec.to.node.and_then(|n| c.nodes.get(n));
            let via = dst_node
                .map(|n| {
                    format!(
                        "`{} via {}`",
                        n.pod_cidr(o.spec.to.ip.is_ipv6())
                            .map(|c| c.to_string())
                            .unwrap_or_else(|| "<no podCIDR>".into()),
                        n.internal_ip(o.spec.to.ip.is_ipv6())
                            .map(|i| i.to_string())
                            .unwrap_or_else(|| "<no InternalIP>".into())
                    )
                })
                .unwrap_or_default();
            out.push(Diagnosis {
                id: "missing-route",
                message: format!(
                    "{from} reaches pods on its own node but not {to}: check the route {via} on {}, net.ipv4.ip_forward and the FORWARD policy there (`cnilab e2e <provider> dump` saves routes4.txt, sysctls.txt and nft.txt per node)",
                    touched.first().cloned().unwrap_or_default()
                ),
            });
        }
        "mtu/df-cross-node"
            if passed("pod-to-pod/cross-node", from, Some(to), Some(Proto::Icmp)) =>
        {
            out.push(Diagnosis {
                id: "mtu-mismatch",
                message: format!(
                    "small pings from {from} reach {to} but a full-MTU packet with DF set does not: the pod MTU is larger than the path between the nodes allows (lower the plugin's mtu, or fix the node uplinks)"
                ),
            });
        }
        "pod-to-service" if passed("pod-to-pod/cross-node", from, None, Some(Proto::Tcp)) => {
            out.push(Diagnosis {
                id: "service-proxy",
                message: format!(
                    "{from} reaches pods directly but not the ClusterIP {}: kube-proxy's rules are not applied to pod traffic (bridge-nf-call-iptables off, or kube-proxy not running on {})",
                    o.spec.to.ip,
                    touched.first().cloned().unwrap_or_default()
                ),
            });
        }
        "pod-to-service/dns" if passed("pod-to-service", from, None, None) => {
            out.push(Diagnosis {
                id: "dns",
                message: format!(
                    "{from} reaches the service by ClusterIP but not by the name {to}: CoreDNS is unreachable or not Ready from this pod"
                ),
            });
        }
        "hairpin" if passed("pod-to-service", from, None, None) => {
            out.push(Diagnosis {
                id: "hairpin",
                message: format!(
                    "{from} reaches the echo service but not itself through {to}: the bridge port needs hairpin_mode (or the plugin's hairpinMode option)"
                ),
            });
        }
        _ => {}
    }
    out
}

#[cfg(test)]
#[path = "probes_tests.rs"]
mod tests;
