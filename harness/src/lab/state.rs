//! Labs that stay up between commands (`cnilab lab up` / `check` /
//! `status` / `down`): the namespaces keep their names
//! (`cnilab-lab-<lab>-<role>`, so `ip netns exec` works on them) and the
//! state lives in `/run/cnilab/labs/<lab>/state.json`.

use super::base::{LabError, RuntimeKind, UpOptions, AGENT_PIDFILE, LEDGER};
use super::built::{Lab, Node, Pod};
use super::topology::Topology;
use crate::model::apply::NotMade;
use crate::netns::Netns;
use crate::runtime::{NetworkConfig, Runtime};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub const LABS_DIR: &str = "/run/cnilab/labs";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PodState {
    pub name: String,
    pub container_id: String,
    pub netns: String,
    pub ips: Vec<IpNet>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeState {
    pub name: String,
    pub netns: String,
    pub agent_pid: Option<u32>,
    pub pods: Vec<PodState>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LabState {
    pub name: String,
    pub topology: Topology,
    pub plugin_dir: String,
    pub run_dir: PathBuf,
    pub switch: String,
    pub external: Option<String>,
    pub nodes: Vec<NodeState>,
    /// Namespaces of the underlay shape (routers, NAT boxes).
    #[serde(default)]
    pub extra: Vec<String>,
    /// How the pods were attached (labs saved before `--runtime`: direct).
    #[serde(default)]
    pub runtime: RuntimeKind,
    /// What a replay (`lab up --capture`) could not make here; `lab check`
    /// reports it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_made: Vec<NotMade>,
    /// What each captured pod of a replay became (`lab show` says it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub captured_pods: Vec<FoundPod>,
}

/// A namespace a capture linked to a node as a pod, as a replay took it:
/// its captured name (the pod's name in every output), the role of its
/// namespace (`cnilab-lab-<lab>-<role>`), what says it is a pod, and why it
/// is not probed, if it is not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundPod {
    pub node: String,
    pub name: String,
    pub role: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// What a replay adds to a lab: what it could not make here and what
/// each captured pod became.
#[derive(Clone, Debug, Default)]
pub struct Replayed {
    pub not_made: Vec<NotMade>,
    pub pods: Vec<FoundPod>,
}

pub fn run_dir(name: &str) -> PathBuf {
    PathBuf::from(LABS_DIR).join(name)
}

fn state_path(name: &str) -> PathBuf {
    run_dir(name).join("state.json")
}

/// Whether lab `name`, whose run dir is `dir`, owns namespace `ns`: its
/// name has the lab's shape ([`owns_namespace`]) and the lab recorded
/// creating it (its ledger, or for a lab saved before ledgers, its state
/// file). Names alone can be read two ways (`X-node1-pod5`), so they never
/// suffice.
pub fn owns(dir: &std::path::Path, name: &str, nodes: &[String], ns: &str) -> bool {
    if !owns_namespace(name, nodes, ns) {
        return false;
    }
    let ledger = std::fs::read_to_string(dir.join(LEDGER)).unwrap_or_default();
    // The last word on `ns`: recorded, or taken back (`!ns`) after its
    // creation failed.
    let last = ledger
        .lines()
        .rev()
        .find(|l| *l == ns || l.strip_prefix('!') == Some(ns));
    if let Some(line) = last {
        return line == ns;
    }
    let saved = std::fs::read_to_string(dir.join("state.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<LabState>(&text).ok());
    saved.is_some_and(|s| {
        s.switch == ns
            || s.external.as_deref() == Some(ns)
            || s.extra.iter().any(|e| e == ns)
            || s.nodes
                .iter()
                .any(|n| n.netns == ns || n.pods.iter().any(|p| p.netns == ns))
    })
}

/// Lab names become namespace and directory names.
pub fn check_name(name: &str) -> Result<(), LabError> {
    let ok = !name.is_empty()
        && name.len() <= 20
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(LabError::Setup(format!(
            "lab name {name:?}: use 1-20 characters of [A-Za-z0-9-]"
        )))
    }
}

/// Whether namespace `ns` is one lab `name` makes for a topology with
/// these `nodes`: exactly `cnilab-lab-<name>-<role>`, the role being
/// `switch`, `external`, a node or a node's pod (`<node>-pod<k>`). A prefix
/// match would also take lab `<name>-y`'s namespaces.
pub fn owns_namespace(name: &str, nodes: &[String], ns: &str) -> bool {
    let Some(role) = ns
        .strip_prefix(crate::netns::PREFIX)
        .and_then(|r| r.strip_prefix("lab-"))
        .and_then(|r| r.strip_prefix(name))
        .and_then(|r| r.strip_prefix('-'))
    else {
        return false;
    };
    role == "switch"
        || role == "external"
        || role == super::underlay::ROUTER_ROLE
        || nodes
            .iter()
            .any(|node| role == super::underlay::nat_role(node))
        || nodes.iter().any(|node| {
            role == node
                || role
                    .strip_prefix(node.as_str())
                    .and_then(|r| r.strip_prefix("-pod"))
                    .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Keeps every namespace of `lab` and writes its state; agents keep running.
pub fn persist(lab: Lab) -> Result<LabState, LabError> {
    persist_with(lab, Replayed::default())
}

/// [`persist`], recording what a replay could not make and its pods.
pub fn persist_with(lab: Lab, replayed: Replayed) -> Result<LabState, LabError> {
    let name = lab
        .opts
        .persistent
        .clone()
        .ok_or_else(|| LabError::Setup("only a lab made with `lab up` can persist".into()))?;
    let state = state_of(&lab, &name, replayed);
    let text = serde_json::to_string_pretty(&state).map_err(|e| LabError::Setup(e.to_string()))?;
    crate::util::write_replacing(&state_path(&name), text.as_bytes())
        .map_err(|e| LabError::Setup(format!("write lab state: {e}")))?;
    release(lab);
    Ok(state)
}

/// What a standing lab's state file holds of `lab`, under the name `name`
/// (also for a lab this process holds and will tear down: what a trace of
/// it reads).
pub fn state_of(lab: &Lab, name: &str, replayed: Replayed) -> LabState {
    LabState {
        name: name.to_string(),
        topology: lab.topo.clone(),
        plugin_dir: lab.plugin_dir.clone(),
        run_dir: lab.opts.run_dir.clone(),
        switch: lab.switch.name().to_string(),
        external: lab.external.as_ref().map(|e| e.name().to_string()),
        extra: lab.extra.iter().map(|e| e.name().to_string()).collect(),
        nodes: lab
            .nodes
            .iter()
            .map(|n| NodeState {
                name: n.spec.name.clone(),
                netns: n.ns.name().to_string(),
                agent_pid: n.agent.as_ref().map(|c| c.id()),
                pods: n
                    .pods
                    .iter()
                    .map(|p| PodState {
                        name: p.name.clone(),
                        container_id: p.container_id.clone(),
                        netns: p.ns.name().to_string(),
                        ips: p.ips.clone(),
                    })
                    .collect(),
            })
            .collect(),
        runtime: lab.opts.runtime,
        not_made: replayed.not_made,
        captured_pods: replayed.pods,
    }
}

/// A standing lab reopened by [`adopt`]. It stays standing when dropped,
/// on a panic too: only [`Standing::down`] removes it.
pub struct Standing(Option<Lab>);

impl std::ops::Deref for Standing {
    type Target = Lab;

    fn deref(&self) -> &Lab {
        // Taken only by `down`, which consumes `self`.
        self.0.as_ref().expect("a standing lab is held until down")
    }
}

impl Standing {
    /// Removes the lab: what `Lab::down` removes; how long it took.
    pub fn down(mut self) -> std::time::Duration {
        let Some(mut lab) = self.0.take() else {
            return std::time::Duration::ZERO;
        };
        for node in &mut lab.nodes {
            node.ns.delete_on_drop();
            for pod in &mut node.pods {
                pod.ns.delete_on_drop();
            }
        }
        for ns in lab.external.iter_mut().chain(&mut lab.extra) {
            ns.delete_on_drop();
        }
        lab.switch.delete_on_drop();
        lab.down()
    }
}

impl Drop for Standing {
    fn drop(&mut self) {
        if let Some(lab) = self.0.take() {
            release(lab);
        }
    }
}

/// Lets go of a lab without deleting anything.
fn release(lab: Lab) {
    for node in lab.nodes {
        for pod in node.pods {
            pod.ns.keep();
        }
        node.ns.keep();
        // Dropping a Child neither kills nor waits for it.
        drop(node.agent);
        if let Some(d) = node.cri {
            d.release();
        }
    }
    if let Some(e) = lab.external {
        e.keep();
    }
    for e in lab.extra {
        e.keep();
    }
    lab.switch.keep();
}

pub fn load_state(name: &str) -> Result<LabState, LabError> {
    check_name(name)?;
    let path = state_path(name);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        LabError::Setup(format!(
            "no lab {name:?} ({}: {e}); start one with `cnilab lab up --name {name}`",
            path.display()
        ))
    })?;
    serde_json::from_str(&text).map_err(|e| LabError::Setup(format!("{}: {e}", path.display())))
}

/// Reopens a standing lab: it stays standing unless [`Standing::down`]
/// removes it. Its namespaces are opened to be kept, and each node joins
/// the lab once reopened whole, so a part that cannot be reopened (a
/// namespace deleted by hand, say) fails the call and removes nothing.
pub fn adopt(name: &str) -> Result<Standing, LabError> {
    let state = load_state(name)?;
    let mut standing = Standing(Some(Lab {
        topo: state.topology.clone(),
        opts: UpOptions {
            plugin_dir: Some(state.plugin_dir.clone()),
            persistent: Some(state.name.clone()),
            run_dir: state.run_dir.clone(),
            runtime: state.runtime,
        },
        plugin_dir: state.plugin_dir.clone(),
        switch: Netns::open_kept(&state.switch)?,
        external: state
            .external
            .as_deref()
            .map(Netns::open_kept)
            .transpose()?,
        nodes: Vec::new(),
        phases: Vec::new(),
        extra: state
            .extra
            .iter()
            .map(|n| Netns::open_kept(n))
            .collect::<Result<_, _>>()?,
        containerd: None,
    }));
    for n in &state.nodes {
        let node = reopen_node(&state, n)?;
        if let Some(lab) = standing.0.as_mut() {
            lab.nodes.push(node);
        }
    }
    Ok(standing)
}

/// One node of a standing lab, its pods and its containerd, if any (the
/// last, so that nothing after it can fail).
fn reopen_node(state: &LabState, n: &NodeState) -> Result<Node, LabError> {
    let spec = state.topology.node(&n.name).cloned().ok_or_else(|| {
        LabError::Setup(format!(
            "state names node {} that the topology lacks",
            n.name
        ))
    })?;
    let ns = Netns::open_kept(&n.netns)?;
    let node_dir = state.run_dir.join(&n.name);
    let conf = node_dir.join("net.conflist");
    let net = NetworkConfig::load(&conf)?;
    let runtime = Runtime::new(&state.plugin_dir)
        .in_netns(&ns)?
        .with_cache_dir(&node_dir.join("results"));
    let mut pods = Vec::new();
    for p in &n.pods {
        pods.push(Pod {
            name: p.name.clone(),
            container_id: p.container_id.clone(),
            ns: Netns::open_kept(&p.netns)?,
            ips: p.ips.clone(),
        });
    }
    let cri = match state.runtime {
        RuntimeKind::Containerd => Some(super::cri::Containerd::adopt(&super::cri::node_cri_dir(
            &node_dir,
        ))?),
        RuntimeKind::Direct => None,
    };
    Ok(Node {
        spec,
        ns,
        runtime,
        net,
        pods,
        agent: None,
        cri,
    })
}

/// Stops the agents a standing lab started, each only after its pidfile
/// proves it is still that process (a pid alone may have been reused).
pub fn stop_agents(state: &LabState) {
    for n in &state.nodes {
        let path = state.run_dir.join(&n.name).join(AGENT_PIDFILE);
        if let Some(id) = super::pidfile::read(&path) {
            let _ = id.kill_if_ours(&state.run_dir);
        }
    }
}

/// The node names a standing lab's namespaces can carry.
pub fn node_names(state: &LabState) -> Vec<String> {
    let mut names: Vec<String> = state
        .topology
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .collect();
    names.extend(state.nodes.iter().map(|n| n.name.clone()));
    names.sort();
    names.dedup();
    names
}

/// Every standing lab's name.
pub fn list() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(LABS_DIR)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().join("state.json").is_file())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::owns_namespace;

    #[test]
    fn a_lab_owns_only_its_own_namespaces() {
        let nodes = vec!["node1".to_string(), "node2".to_string()];
        for ns in [
            "cnilab-lab-X-switch",
            "cnilab-lab-X-external",
            "cnilab-lab-X-node1",
            "cnilab-lab-X-node2-pod13",
        ] {
            assert!(owns_namespace("X", &nodes, ns), "{ns}");
        }
        for ns in [
            "cnilab-lab-X-y-switch",
            "cnilab-lab-X-y-node1",
            "cnilab-lab-X-y-node1-pod0",
            "cnilab-lab-Xy-switch",
            "cnilab-lab-X-node3",
            "cnilab-lab-X-node1-pod",
            "cnilab-lab-X-node1-podx",
            "cnilab-123-0-switch",
            "cnilab-lab-X",
        ] {
            assert!(!owns_namespace("X", &nodes, ns), "{ns}");
        }
    }
}
