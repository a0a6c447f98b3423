//! `cnilab lab trace`: FROM and TO (pods, nodes or addresses) of a standing
//! lab resolved to namespaces and addresses, and the lab's namespaces handed
//! by path to the tracer ([`crate::trace`]), which knows nothing of labs.

use super::state::{load_state, LabState};
use super::LabError;
use crate::trace::{self, Proto, Request, World};
use cnilab_net::netns as plugin_netns;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

/// Traces one packet from `from` to `to` in the standing lab `name`.
pub fn run(
    name: &str,
    from: &str,
    to: &str,
    proto: Proto,
    port: Option<u16>,
) -> Result<trace::Trace, LabError> {
    let state = load_state(name)?;
    let model = super::model::read::standing(name)?;
    let (paths, nodes) = namespaces(&state);
    let world = World::new(model, paths, nodes).map_err(LabError::Setup)?;
    let (to_ns, dst) = endpoint(&world, &state, to, None)
        .map_err(|e| LabError::Setup(format!("TO {e}")))?
        .and_dst()
        .map_err(|e| LabError::Setup(format!("TO {e}")))?;
    let (from_ns, src) = endpoint(&world, &state, from, Some(dst))
        .map_err(|e| LabError::Setup(format!("FROM {e}")))?
        .pair();
    let port = match proto {
        Proto::Icmp => None,
        _ => Some(port.unwrap_or(super::probe::PORT)),
    };
    let mut command = format!("cnilab lab trace --name {name} {from} {to}");
    if proto != Proto::Icmp {
        command.push_str(&format!(" --proto {}", format!("{proto:?}").to_lowercase()));
    }
    if let Some(p) = port {
        command.push_str(&format!(" --port {p}"));
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
        command,
    };
    Ok(trace::run(&world, &req))
}

/// Every namespace of the lab by role (its path under `/run/netns`), and
/// the node each belongs to.
fn namespaces(state: &LabState) -> (BTreeMap<String, PathBuf>, BTreeMap<String, Option<String>>) {
    let dir = std::path::Path::new(plugin_netns::NETNS_DIR);
    let prefix = format!("{}lab-{}-", plugin_netns::PREFIX, state.name);
    let role = |ns: &str| ns.strip_prefix(&prefix).unwrap_or(ns).to_string();
    let mut paths = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    paths.insert(
        super::model::compile::SWITCH.to_string(),
        dir.join(&state.switch),
    );
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
        let ns = world
            .owner(ip)
            .ok_or_else(|| format!("{ip}: no namespace of lab {} has this address", state.name))?;
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
