//! The connectivity matrix's plan: the check groups, which of them a
//! selector picks, and the probes of the catalogue and the Services.

use super::built::Lab;
use crate::connectivity::catalogue::{self, Cluster};
use crate::connectivity::matrix::Slot;
use crate::connectivity::{Endpoint, ProbeSpec};
use std::net::IpAddr;

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
pub(super) fn selected(groups: &[String], g: &str, v6: Option<bool>) -> bool {
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

/// What a check sends: the probes, and the ports besides `probe::PORT`
/// its responders listen on (the captured Services' target ports).
pub struct Probes {
    pub specs: Vec<ProbeSpec>,
    pub ports: Vec<u16>,
    /// Why the plan is a sample, where the lab is over the probe budget.
    pub sampled: Option<String>,
}

/// The probe plan: the catalogue's probes in each address family the pods
/// have (IPv4, then IPv6), then the lab's Service probes. A selection that
/// leaves no probe is an error (a usage error, never "0/0 failed").
pub fn probes(lab: &Lab, groups: &[String]) -> Result<Probes, String> {
    let mut specs = Vec::new();
    for v6 in [false, true] {
        let wanted = |g: &str| selected(groups, g, Some(v6));
        specs.extend(catalogue::plan(lab, &wanted, v6));
    }
    let sampled = catalogue::sampled_note(lab);
    // Once, whatever the families: the Services pick their own addresses.
    let wanted = |g: &str| selected(groups, g, None);
    let pods = lab.pod_endpoints(false);
    super::services::probes(lab, &pods, &wanted, &mut specs);
    // A captured Service's endpoints listen on its target ports too.
    let ports = super::services::target_ports(lab);
    if specs.is_empty() {
        return Err(format!(
            "the check groups {} select no probe in this lab (it has no {})",
            groups.join(","),
            if groups.is_empty() {
                "pods".to_string()
            } else {
                groups.join(" or ")
            }
        ));
    }
    Ok(Probes {
        specs,
        ports,
        sampled,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
