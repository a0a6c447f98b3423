//! `cnilab lab trace`: FROM and TO (pods, nodes or addresses) of a standing
//! lab resolved to namespaces and addresses from its state file, and the
//! lab's namespaces handed by path to the tracer ([`crate::trace`]), which
//! knows nothing of labs and reads only the namespaces the packet crosses;
//! [`failed_probes`] does the same for the failed probes of `lab check`
//! (one world for all, traced side by side: [`trace::run_many`]). Both
//! tell the tracer the addresses the lab gave (pods' and nodes'), and that
//! pods are ends (see [`crate::trace::Addresses`]).

use super::built::Lab;
use super::state::{load_state, LabState};
use super::LabError;
use crate::connectivity::ProbeOutcome;
use crate::trace::{self, Addresses, Proto, Request, World};
use cnilab_net::netns as plugin_netns;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

/// Traces one packet from `from` to `to` in the standing lab `name`.
pub fn run(
    name: &str,
    from: &str,
    to: &str,
    probe: (Proto, Option<u16>, Option<u32>),
    invalid: bool,
) -> Result<trace::Trace, LabError> {
    of_state(&load_state(name)?, from, to, probe, invalid)
}

/// [`run`] in a lab this process holds (a scenario's, standing or not):
/// what its state file would hold is read from `lab` itself.
pub fn in_lab(
    lab: &Lab,
    from: &str,
    to: &str,
    probe: (Proto, Option<u16>, Option<u32>),
) -> Result<trace::Trace, LabError> {
    let name = lab.opts.persistent.as_deref().unwrap_or(&lab.topo.name);
    let state = super::state::state_of(lab, name, Default::default());
    of_state(&state, from, to, probe, false)
}

/// [`run`] of a lab as its state says it.
fn of_state(
    state: &LabState,
    from: &str,
    to: &str,
    (proto, port, size): (Proto, Option<u16>, Option<u32>),
    invalid: bool,
) -> Result<trace::Trace, LabError> {
    let name = state.name.as_str();
    let (paths, nodes) = namespaces(state);
    let pods = state
        .nodes
        .iter()
        .flat_map(|n| &n.pods)
        .map(|p| (p.name.as_str(), p.ips.as_slice()));
    let addresses = addresses(state.topology.nodes.iter(), pods);
    let world = World::new(paths, nodes, addresses).map_err(LabError::Setup)?;
    let (to_ns, dst) = endpoint(&world, state, to, None)
        .map_err(|e| LabError::Setup(format!("TO {e}")))?
        .and_dst()
        .map_err(|e| LabError::Setup(format!("TO {e}")))?;
    let (from_ns, src) = endpoint(&world, state, from, Some(dst))
        .map_err(|e| LabError::Setup(format!("FROM {e}")))?
        .pair();
    let port = match proto {
        Proto::Icmp => None,
        _ => Some(port.unwrap_or(super::probe::PORT)),
    };
    let mut command = command(name, from, to, (proto, port, size));
    if invalid {
        command.push_str(" --invalid");
    }
    let req = Request {
        from: from.to_string(),
        from_ns,
        to: to.to_string(),
        to_ns,
        src,
        dst,
        proto,
        port,
        size,
        invalid,
        command,
    };
    Ok(trace::run(&world, &req))
}

/// How many more times a failed probe to a Service is traced while its
/// trace's probe takes a backend that answers.
const AGAIN_FOR_A_FAILING_BACKEND: usize = 4;

/// For `lab check`: traces failed probes of a lab this process holds
/// (standing or not), through one [`World`] read once for all, several at
/// once ([`trace::run_many`]). Each is `Err` when its ends are in no
/// namespace of the lab, or the lab's namespaces cannot be opened.
pub fn failed_probes(lab: &Lab, probes: &[&ProbeOutcome]) -> Vec<Result<trace::Trace, String>> {
    let world = match world_of(lab) {
        Ok(w) => w,
        Err(e) => return probes.iter().map(|_| Err(e.clone())).collect(),
    };
    let reqs: Vec<Result<Request, String>> =
        probes.iter().map(|o| request(lab, &world, o)).collect();
    let ok: Vec<Request> = reqs
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .cloned()
        .collect();
    let mut traced = trace::run_many(&world, &ok);
    // A failed probe to a Service of several backends took one that fails;
    // a trace's probe may take one that answers: traced again, one by one,
    // until it finds a backend that does not (or gives up).
    for (t, req) in traced.iter_mut().zip(&ok) {
        for _ in 0..AGAIN_FOR_A_FAILING_BACKEND {
            let rewritten = t.hops.iter().any(|h| h.decision.starts_with("dnat: "));
            if t.verdict != trace::Verdict::Arrived || t.reply_death.is_some() || !rewritten {
                break;
            }
            *t = trace::run(&world, req);
        }
    }
    let mut traced = traced.into_iter();
    reqs.into_iter()
        .map(|r| {
            r.and_then(|_| {
                traced
                    .next()
                    .ok_or_else(|| "the trace did not run".to_string())
            })
        })
        .collect()
}

/// Every namespace of the lab this process holds, by role, with the
/// addresses the lab gave.
fn world_of(lab: &Lab) -> Result<World, String> {
    let layout = super::layout::layout_of(lab);
    let mut paths = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    let underlay = std::iter::once(&lab.switch)
        .chain(&lab.external)
        .chain(&lab.extra);
    for ns in underlay {
        let role = layout
            .underlay
            .iter()
            .find(|(_, f)| std::ptr::eq(*f, ns.file()))
            .map(|(r, _)| r.clone())
            .unwrap_or_else(|| ns.name().to_string());
        paths.insert(role, ns.path().to_path_buf());
    }
    for n in &lab.nodes {
        paths.insert(n.spec.name.clone(), n.ns.path().to_path_buf());
        nodes.insert(n.spec.name.clone(), Some(n.spec.name.clone()));
        for p in &n.pods {
            paths.insert(p.name.clone(), p.ns.path().to_path_buf());
            nodes.insert(p.name.clone(), Some(n.spec.name.clone()));
        }
    }
    let pods = lab
        .nodes
        .iter()
        .flat_map(|n| &n.pods)
        .map(|p| (p.name.as_str(), p.ips.as_slice()));
    let addresses = addresses(lab.nodes.iter().map(|n| &n.spec), pods);
    World::new(paths, nodes, addresses)
}

/// What to trace for a failed probe `o`.
fn request(lab: &Lab, world: &World, o: &ProbeOutcome) -> Result<Request, String> {
    let (from, to) = (&o.spec.from, &o.spec.to);
    // A DF probe is as large as the pods' MTU: traced as a ping of that
    // size with DF, which crosses the same links.
    let (proto, size) = match o.spec.proto {
        crate::connectivity::Proto::Icmp => (Proto::Icmp, None),
        crate::connectivity::Proto::Tcp => (Proto::Tcp, None),
        crate::connectivity::Proto::Udp => (Proto::Udp, None),
        crate::connectivity::Proto::Df => (Proto::Icmp, Some(lab.topo.pod_mtu())),
    };
    let port = (proto != Proto::Icmp).then_some(super::probe::port_of(&o.spec));
    let name = lab.opts.persistent.as_deref().unwrap_or(&lab.topo.name);
    Ok(Request {
        from: from.name.clone(),
        from_ns: world
            .sender(from.ip)
            .ok_or_else(|| format!("{} is in no namespace of the lab", from.ip))?,
        to: to.name.clone(),
        // A Service VIP is no namespace's: the DNAT on the way decides.
        to_ns: world.owner(to.ip).unwrap_or_else(|| to.ip.to_string()),
        src: Some(from.ip),
        dst: to.ip,
        proto,
        port,
        size,
        invalid: false,
        // Addresses: the probe's endpoint names (`node1/node1-pod0`) are
        // not what `lab trace` takes.
        command: command(
            name,
            &from.ip.to_string(),
            &to.ip.to_string(),
            (proto, port, size),
        ),
    })
}

/// `cnilab lab trace …` that repeats a trace.
fn command(
    name: &str,
    from: &str,
    to: &str,
    (proto, port, size): (Proto, Option<u16>, Option<u32>),
) -> String {
    format!(
        "cnilab lab trace --name {name} {from} {to}{}",
        trace::probe_flags(proto, port, size)
    )
}

/// Every namespace of the lab by role (its path under `/run/netns`), and
/// the node each belongs to.
fn namespaces(state: &LabState) -> (BTreeMap<String, PathBuf>, BTreeMap<String, Option<String>>) {
    let dir = std::path::Path::new(plugin_netns::NETNS_DIR);
    let prefix = format!("{}lab-{}-", plugin_netns::PREFIX, state.name);
    let role = |ns: &str| ns.strip_prefix(&prefix).unwrap_or(ns).to_string();
    let mut paths = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    paths.insert(super::compile::SWITCH.to_string(), dir.join(&state.switch));
    for ns in state.external.iter().chain(&state.extra) {
        paths.insert(role(ns), dir.join(ns));
    }
    for n in &state.nodes {
        paths.insert(n.name.clone(), dir.join(&n.netns));
        nodes.insert(n.name.clone(), Some(n.name.clone()));
        for p in &n.pods {
            paths.insert(p.name.clone(), dir.join(&p.netns));
            nodes.insert(p.name.clone(), Some(n.name.clone()));
        }
    }
    (paths, nodes)
}

/// What the lab gave: the nodes' underlay addresses (checked in the node
/// when asked) and the pods' addresses; pods are ends.
fn addresses<'a>(
    specs: impl Iterator<Item = &'a super::topology::NodeSpec>,
    pods: impl Iterator<Item = (&'a str, &'a [ipnet::IpNet])>,
) -> Addresses {
    let mut a = Addresses::default();
    for s in specs {
        for ip in std::iter::once(s.address).chain(s.address6) {
            a.known.insert(ip, s.name.clone());
        }
    }
    for (pod, ips) in pods {
        for ip in ips {
            a.known.insert(ip.addr(), pod.to_string());
        }
        a.ends.insert(pod.to_string());
    }
    a
}

/// A resolved FROM or TO: its namespace and, when known, its address.
struct Endpoint {
    ns: String,
    addr: Option<IpAddr>,
}

impl Endpoint {
    fn pair(self) -> (String, Option<IpAddr>) {
        (self.ns, self.addr)
    }

    fn and_dst(self) -> Result<(String, IpAddr), String> {
        let addr = self
            .addr
            .ok_or_else(|| format!("{} has no address to send to", self.ns))?;
        Ok((self.ns, addr))
    }
}

/// A pod, a node or an address of the lab. `like`: the address the other
/// end has (its family is chosen).
fn endpoint(
    world: &World,
    state: &LabState,
    what: &str,
    like: Option<IpAddr>,
) -> Result<Endpoint, String> {
    let family = |a: &IpAddr| like.is_none_or(|l| l.is_ipv4() == a.is_ipv4());
    if let Ok(ip) = what.parse::<IpAddr>() {
        // A TO no namespace holds (a Service VIP) is where a DNAT on the
        // way decides; a FROM must be sent from somewhere.
        let owner = match like {
            None => world.owner(ip),
            Some(_) => world.sender(ip),
        };
        let ns = match (owner, like) {
            (Some(ns), _) => ns,
            (None, None) => ip.to_string(),
            (None, Some(_)) => {
                return Err(format!(
                    "{ip}: no namespace of lab {} has this address",
                    state.name
                ))
            }
        };
        return Ok(Endpoint { ns, addr: Some(ip) });
    }
    if let Some(spec) = state.topology.node(what) {
        let addr = [Some(spec.address), spec.address6]
            .into_iter()
            .flatten()
            .find(family);
        // From a node, the kernel chooses the source address.
        let addr = if like.is_some() { None } else { addr };
        return Ok(Endpoint {
            ns: what.to_string(),
            addr,
        });
    }
    let pod = state
        .nodes
        .iter()
        .flat_map(|n| &n.pods)
        .find(|p| p.name == what);
    if let Some(p) = pod {
        return Ok(Endpoint {
            ns: p.name.clone(),
            addr: p.ips.iter().map(|n| n.addr()).find(family),
        });
    }
    let pods: Vec<&str> = state
        .nodes
        .iter()
        .flat_map(|n| &n.pods)
        .map(|p| p.name.as_str())
        .collect();
    Err(format!(
        "{what:?} is no pod, node or address of lab {} (nodes: {}; pods: {}); see `cnilab lab status --name {}`",
        state.name,
        super::state::node_names(state).join(", "),
        pods.join(", "),
        state.name
    ))
}

/// What one trace says about a failure signature.
enum Finding {
    /// The trace named a death: the cause that replaces `undiagnosed`.
    Cause(crate::connectivity::Diagnosis),
    /// It saw the packet arrive (`true`), or could not tell: said next
    /// to `undiagnosed`.
    Note(String, bool),
}

/// `lab check`: failures that no rule explains get one trace per distinct
/// signature (check group, protocol, family); a death the trace names
/// becomes their cause (id from [`trace::CAUSES`], node, object,
/// evidence, the commands that reproduce it); otherwise what the trace saw
/// is attached to `undiagnosed`. Where a signature's trace saw its packet
/// arrive (a fault that breaks only the way back, say), one failure of
/// each other pair of nodes in it is traced too, and that pair's failures
/// take what their own trace found. Returns the warning that the kernel's
/// drop reasons were not read, where failures were diagnosed without them.
pub fn explain(
    lab: &Lab,
    failures: &mut [crate::connectivity::report::Failure],
) -> Option<crate::connectivity::Diagnosis> {
    use crate::connectivity::Diagnosis;
    type Signature = (String, &'static str, &'static str);
    type Pair = (Option<usize>, Option<usize>);
    let signature = |o: &ProbeOutcome| -> Signature {
        let spec = &o.spec;
        (spec.group.to_string(), spec.proto.as_str(), spec.family())
    };
    let pair = |o: &ProbeOutcome| -> Pair { (o.spec.from.node, o.spec.to.node) };
    let unexplained = |f: &crate::connectivity::report::Failure| {
        f.diagnoses.iter().all(|d| d.id == Diagnosis::UNDIAGNOSED)
    };
    // One failure per signature is traced; the traces run together.
    let mut first: BTreeMap<Signature, &ProbeOutcome> = BTreeMap::new();
    for f in failures.iter().filter(|f| unexplained(f)) {
        first.entry(signature(&f.outcome)).or_insert(&f.outcome);
    }
    let found = trace_each(lab, &first);
    // Then one per other node pair of the signatures whose trace arrived.
    let mut again: BTreeMap<(Signature, Pair), &ProbeOutcome> = BTreeMap::new();
    for f in failures.iter().filter(|f| unexplained(f)) {
        let sig = signature(&f.outcome);
        let arrived = matches!(found.get(&sig), Some(Finding::Note(_, true)));
        let traced = first.get(&sig).map(|o| pair(o));
        if arrived && traced != Some(pair(&f.outcome)) {
            again.entry((sig, pair(&f.outcome))).or_insert(&f.outcome);
        }
    }
    let found_again = trace_each(lab, &again);
    for f in failures.iter_mut().filter(|f| unexplained(f)) {
        let sig = signature(&f.outcome);
        let own = found_again.get(&(sig.clone(), pair(&f.outcome)));
        let Some(finding) = own.or_else(|| found.get(&sig)) else {
            continue;
        };
        match finding {
            Finding::Cause(d) => f.diagnoses = vec![d.clone()],
            Finding::Note(note, _) => {
                for d in &mut f.diagnoses {
                    d.message.push_str(&format!("; {note}"));
                }
            }
        }
    }
    drop_reasons_skipped(failures)
}

/// A probe that arrived and whose answer the kernel dropped on the way
/// back: the answer's drop is the cause.
fn answer_dropped(t: &trace::Trace) -> Finding {
    // The object that killed the answer, where its walk names one (with
    // the kernel's word when it recorded the drop).
    if let Some(d) = &t.reply_death {
        let kernel = t
            .reply_drop
            .as_ref()
            .map(|r| format!("; the kernel: the answer was {}", r.describe()))
            .unwrap_or_default();
        return Finding::Cause(crate::connectivity::Diagnosis {
            id: trace::cause_id(&d.cause),
            message: format!(
                "traced {} → {}: it arrived, and its answer died at {}: {} {}: {}{kernel}; \
                 reproduce: {}",
                t.from,
                t.to,
                d.namespace,
                d.cause,
                d.object,
                d.evidence,
                t.reproduce.join("; ")
            ),
        });
    }
    let Some(r) = &t.reply_drop else {
        return Finding::Note(format!("the trace saw the packet arrive ({})", t.to), true);
    };
    Finding::Cause(crate::connectivity::Diagnosis {
        id: trace::KERNEL_DROP,
        message: format!(
            "traced {} → {}: it arrived, and its answer died at {}: {} dev {}: the answer was {}; \
             reproduce: {}",
            t.from,
            t.to,
            r.namespace,
            trace::KERNEL_DROP,
            r.device,
            r.describe(),
            t.reproduce.join("; ")
        ),
    })
}

/// Said once when failures were diagnosed without the kernel's drop
/// reasons (no tracefs, a kernel without them): a SKIP, not a fault of the
/// lab. Nothing is asked of the kernel when nothing failed.
fn drop_reasons_skipped(
    failures: &[crate::connectivity::report::Failure],
) -> Option<crate::connectivity::Diagnosis> {
    if failures.is_empty() {
        return None;
    }
    let why = trace::drops::support().as_ref().err()?;
    Some(crate::connectivity::Diagnosis {
        id: "drop-reasons-skipped",
        message: format!("SKIP: the kernel's drop reasons are not read: {why}"),
    })
}

/// Traces the probe of each key, all together: each key's finding.
fn trace_each<K: Ord + Clone>(
    lab: &Lab,
    probes: &BTreeMap<K, &ProbeOutcome>,
) -> BTreeMap<K, Finding> {
    if probes.is_empty() {
        return BTreeMap::new();
    }
    let list: Vec<&ProbeOutcome> = probes.values().copied().collect();
    probes
        .keys()
        .cloned()
        .zip(failed_probes(lab, &list).into_iter().map(finding))
        .collect()
}

fn finding(traced: Result<trace::Trace, String>) -> Finding {
    let t = match traced {
        Ok(t) => t,
        Err(e) => return Finding::Note(format!("the trace could not run: {e}"), false),
    };
    match (&t.death, &t.reason) {
        (Some(d), _) => {
            let at = match &d.node {
                Some(n) if *n != d.namespace => format!("{} (node {n})", d.namespace),
                _ => d.namespace.clone(),
            };
            // The hop where it died, as `lab trace` prints it: shown by
            // everything that prints diagnoses (`lab check`, `scenario run`).
            let hop = t
                .hops
                .iter()
                .enumerate()
                .rev()
                .find(|(_, h)| h.namespace == d.namespace)
                .map(|(i, h)| {
                    format!(
                        " at hop {}: {} {} ({})",
                        i + 1,
                        h.namespace,
                        h.decision,
                        h.evidence
                    )
                })
                .unwrap_or_default();
            Finding::Cause(crate::connectivity::Diagnosis {
                id: trace::cause_id(&d.cause),
                message: format!(
                    "traced {} → {}: died at {at}: {} {}: {}{hop}; reproduce: {}",
                    t.from,
                    t.to,
                    d.cause,
                    d.object,
                    d.evidence,
                    t.reproduce.join("; ")
                ),
            })
        }
        (None, Some(reason)) => Finding::Note(format!("trace INCONCLUSIVE: {reason}"), false),
        (None, None) if t.reply_drop.is_some() || t.reply_death.is_some() => answer_dropped(&t),
        (None, None) => Finding::Note(
            format!(
                "the trace saw the packet arrive ({}): {}",
                t.to,
                t.reproduce.join("; ")
            ),
            true,
        ),
    }
}
