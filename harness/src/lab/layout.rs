//! Which namespaces make a lab, by role: of a lab this process built
//! ([`layout_of`]) or of a standing one ([`standing`], read at once).

use crate::model::read::{self, Layout, NodeLayout};
use crate::model::{LabModel, Namespace};
use crate::netns::Netns;
use cnilab_net::netns as plugin_netns;
use ipnet::IpNet;

/// The underlay namespaces of a lab built by this process, by role:
/// `switch`, `external`, the router, the NAT boxes.
pub(crate) fn underlay_of(lab: &super::built::Lab) -> Vec<(String, &Netns)> {
    let mut underlay = vec![(super::compile::SWITCH.to_string(), &lab.switch)];
    if let Some(ext) = &lab.external {
        underlay.push((super::compile::EXTERNAL.to_string(), ext));
    }
    let roles: Vec<String> = std::iter::once(super::underlay::ROUTER_ROLE.to_string())
        .chain(
            lab.nodes
                .iter()
                .map(|n| super::underlay::nat_role(&n.spec.name)),
        )
        .collect();
    for ns in &lab.extra {
        // Throwaway namespaces carry the first 12 characters of the role.
        let role = roles.iter().find(|r| {
            let short: String = r.chars().take(12).collect();
            ns.name().ends_with(&format!("-{r}")) || ns.name().ends_with(&format!("-{short}"))
        });
        let role = role.cloned().unwrap_or_else(|| ns.name().to_string());
        underlay.push((role, ns));
    }
    underlay
}

/// The layout of a lab built by this process.
pub fn layout_of(lab: &super::built::Lab) -> Layout<'_> {
    let underlay = underlay_of(lab)
        .into_iter()
        .map(|(role, ns)| (role, ns.file()))
        .collect();
    let nodes = lab
        .nodes
        .iter()
        .map(|n| NodeLayout {
            name: n.spec.name.clone(),
            ns: n.ns.file(),
            pod_cidrs: n.spec.pod_cidr.iter().map(IpNet::trunc).collect(),
            pods: n
                .pods
                .iter()
                .map(|p| (p.name.clone(), p.ns.file()))
                .collect(),
        })
        .collect();
    Layout {
        name: lab.topo.name.clone(),
        underlay,
        nodes,
    }
}

/// The model of the standing lab `name` (`cnilab lab up --name`), read from
/// its namespaces under `/run/netns` (opened for reading, never removed).
pub(crate) fn standing(name: &str) -> Result<LabModel, super::LabError> {
    use super::LabError;
    let state = super::state::load_state(name)?;
    let open = |ns: &str| {
        plugin_netns::open_network_namespace(std::path::Path::new(plugin_netns::NETNS_DIR).join(ns))
            .map_err(|e| {
                LabError::Setup(format!(
                    "lab {name}: {e}; is it still up? (`cnilab lab status --name {name}`)"
                ))
            })
    };
    let prefix = format!("{}lab-{name}-", plugin_netns::PREFIX);
    let role = |ns: &str| ns.strip_prefix(&prefix).unwrap_or(ns).to_string();
    let mut underlay = vec![(super::compile::SWITCH.to_string(), open(&state.switch)?)];
    for ns in state.external.iter().chain(&state.extra) {
        underlay.push((role(ns), open(ns)?));
    }
    let mut nodes = Vec::new();
    for n in &state.nodes {
        let pods = n
            .pods
            .iter()
            .map(|p| Ok((p.name.clone(), open(&p.netns)?)))
            .collect::<Result<Vec<_>, LabError>>()?;
        let cidrs: Vec<IpNet> = state
            .topology
            .node(&n.name)
            .map(|s| s.pod_cidr.iter().map(IpNet::trunc).collect())
            .unwrap_or_default();
        nodes.push((n.name.clone(), open(&n.netns)?, cidrs, pods));
    }
    let layout = Layout {
        name: state.name.clone(),
        underlay: underlay.iter().map(|(r, f)| (r.clone(), f)).collect(),
        nodes: nodes
            .iter()
            .map(|(n, f, cidrs, pods)| NodeLayout {
                name: n.clone(),
                ns: f,
                pod_cidrs: cidrs.clone(),
                pods: pods.iter().map(|(p, f)| (p.clone(), f)).collect(),
            })
            .collect(),
    };
    read::read(&layout).map_err(LabError::Setup)
}

/// One namespace by path (`/run/netns/<name>`, `/proc/<pid>/ns/net`), read
/// as a model namespace called `role` (a veth peer elsewhere shows as
/// `netnsid N`).
pub fn namespace_at(path: &std::path::Path, role: &str) -> Result<Namespace, String> {
    let file = plugin_netns::open_network_namespace(path).map_err(|e| e.to_string())?;
    let layout = Layout {
        name: role.to_string(),
        underlay: vec![(role.to_string(), &file)],
        nodes: Vec::new(),
    };
    let mut model = read::read(&layout)?;
    model
        .underlay
        .pop()
        .ok_or_else(|| format!("{}: nothing read", path.display()))
}
