//! A kube-proxy-like Service per lab (`[service]` in a topology, or
//! `--service`), as DNAT rules in every node's nftables, shaped like
//! kube-proxy's nftables mode (`table ip kube-proxy`: a `services` verdict
//! map on ClusterIP . protocol . port, a `service-…` chain that picks an
//! endpoint with `numgen random`, `endpoint-…` chains that DNAT and mark
//! hairpin traffic for masquerade, and a `masquerading` chain).
//!
//! The Service `web` (ClusterIP `cluster_ip`, port 7777 = the responders')
//! has a backend on several nodes: the first pod of each. The checks also
//! need to know which backend answers, so every backend gets a Service of
//! its own too (`web-<node>`, ClusterIP `cluster_ip` + 1 + node index),
//! with that one endpoint, as the Kubernetes e2e hairpin test does:
//!
//! - `service/same-node`: the other pods of a backend's node → its Service;
//! - `service/cross-node`: every pod → the next node's backend Service;
//! - `service/hairpin`: a backend → its own Service (needs hairpin mode on
//!   its bridge port, and masquerade so that the reply comes back through
//!   the node's conntrack);
//! - `service/cluster-ip`: every pod → `web` (any backend may answer).
//!
//! The lab compiles the ruleset into its model ([`ruleset_for`], pure, from
//! `model/compile.rs`, the backends' addresses as placeholders) and installs
//! it from there once the pods have their addresses (`Lab::build`); here
//! too: what the faults re-program or take away, the probe plan and the
//! diagnoses.
//!
//! The plan also probes the Services a replay captured from kube-proxy's
//! chains (`topo.kube_services`, read by [`super::kube_proxy`], which also
//! diagnoses them): [`probes`] plans both, and every pod's responders
//! listen on the [`target_ports`] of the captured ones too.

use super::base::{nft, LabError};
use super::built::Lab;
use super::facts::NodeFacts;
use super::probe::PORT;
use super::topology::shapes::ServiceSpec;
use crate::connectivity::Diagnosis;
use crate::connectivity::{Endpoint, ExpectSource, ProbeOutcome, ProbeSpec, Proto, ServicePort};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

pub const SAME_NODE: &str = "service/same-node";
pub const CROSS_NODE: &str = "service/cross-node";
pub const HAIRPIN: &str = "service/hairpin";
pub const CLUSTER_IP: &str = "service/cluster-ip";
/// The nftables table every node's Service rules live in.
pub const TABLE: &str = "ip kube-proxy";
/// How the multi-backend Service shows in reports.
pub const WEB: &str = "service web";

/// The nodes (by index) with a backend, and each backend's address.
fn backends(lab: &Lab) -> Vec<(usize, IpAddr)> {
    let Some(spec) = &lab.topo.service else {
        return Vec::new();
    };
    let count = spec.backends.unwrap_or(lab.nodes.len());
    lab.nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| {
            let ip = n
                .pods
                .first()?
                .ips
                .iter()
                .find(|ip| ip.addr().is_ipv4())?
                .addr();
            Some((i, ip))
        })
        .take(count)
        .collect()
}

/// The ClusterIP of node `i`'s own backend Service (`web-<node>`), if
/// node `i` has a backend.
pub fn backend_service(lab: &Lab, i: usize) -> Option<IpAddr> {
    let spec = lab.topo.service.as_ref()?;
    backends(lab)
        .iter()
        .any(|(n, _)| *n == i)
        .then(|| pinned_ip(spec, i))
}

/// The ClusterIP of node `i`'s backend Service.
fn pinned_ip(spec: &ServiceSpec, i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(spec.cluster_ip) + 1 + i as u32))
}

/// The ruleset of one node. `hairpin_masquerade = false` leaves out the
/// rule that marks a backend's traffic to itself for masquerade.
pub fn ruleset(lab: &Lab, hairpin_masquerade: bool) -> String {
    let Some(spec) = &lab.topo.service else {
        return String::new();
    };
    let backends: Vec<(usize, String, String)> = backends(lab)
        .into_iter()
        .map(|(i, ip)| (i, lab.nodes[i].spec.name.clone(), ip.to_string()))
        .collect();
    ruleset_for(spec, &backends, hairpin_masquerade)
}

/// [`ruleset`] for backends `(node index, node name, address)`: pure, so
/// that the lab model compiles the same table (`lab/compile.rs`).
pub(crate) fn ruleset_for(
    spec: &ServiceSpec,
    backends: &[(usize, String, String)],
    hairpin_masquerade: bool,
) -> String {
    let mut chains = String::new();
    let mut map: Vec<String> = Vec::new();
    let endpoint = |chains: &mut String, name: &str, ip: &str| {
        let _ = writeln!(chains, "  chain {name} {{");
        if hairpin_masquerade {
            let _ = writeln!(chains, "    ip saddr {ip} jump mark-for-masquerade");
        }
        for proto in ["tcp", "udp"] {
            let _ = writeln!(chains, "    meta l4proto {proto} dnat to {ip}:{PORT}");
        }
        let _ = writeln!(chains, "  }}");
    };
    // web: every backend, picked at random.
    let web = IpAddr::V4(spec.cluster_ip);
    let mut vmap = Vec::new();
    for (k, (_, node, ip)) in backends.iter().enumerate() {
        let name = format!("endpoint-web-{node}");
        endpoint(&mut chains, &name, ip);
        vmap.push(format!("{k} : goto {name}"));
    }
    if !vmap.is_empty() {
        let _ = writeln!(
            chains,
            "  chain service-web {{\n    numgen random mod {} vmap {{ {} }}\n  }}",
            vmap.len(),
            vmap.join(", ")
        );
        for proto in ["tcp", "udp"] {
            map.push(format!("{web} . {proto} . {PORT} : goto service-web"));
        }
    }
    // web-<node>: one endpoint each.
    for (i, node, ip) in backends {
        let name = format!("endpoint-web-{node}-pinned");
        endpoint(&mut chains, &name, ip);
        let _ = writeln!(
            chains,
            "  chain service-web-{node} {{\n    goto {name}\n  }}"
        );
        for proto in ["tcp", "udp"] {
            map.push(format!(
                "{} . {proto} . {PORT} : goto service-web-{node}",
                pinned_ip(spec, *i)
            ));
        }
    }
    let services = if map.is_empty() {
        String::new()
    } else {
        format!(
            "    ip daddr . meta l4proto . th dport vmap {{ {} }}\n",
            map.join(", ")
        )
    };
    format!(
        "add table {TABLE}\ndelete table {TABLE}\ntable {TABLE} {{\n  chain mark-for-masquerade {{\n    meta mark set meta mark | 0x4000\n  }}\n  chain masquerading {{\n    meta mark & 0x4000 == 0 return\n    meta mark set meta mark ^ 0x4000\n    masquerade fully-random\n  }}\n  chain services {{\n{services}  }}\n  chain nat-prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;\n    jump services\n  }}\n  chain nat-output {{\n    type nat hook output priority -100; policy accept;\n    jump services\n  }}\n  chain nat-postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    jump masquerading\n  }}\n{chains}}}\n"
    )
}

/// Programs the Service rules on node `i`.
pub fn install_node(lab: &Lab, i: usize, hairpin_masquerade: bool) -> Result<(), LabError> {
    if lab.topo.service.is_none() {
        return Ok(());
    }
    nft(&lab.nodes[i].ns, &ruleset(lab, hairpin_masquerade))
}

/// Removes the Service rules of node `i` (kube-proxy not running there).
pub fn remove_node(lab: &Lab, i: usize) -> Result<(), LabError> {
    nft(
        &lab.nodes[i].ns,
        &format!("add table {TABLE}\ndelete table {TABLE}\n"),
    )
}

/// The Service probes of the groups `wanted` selects, between the lab's
/// pods at their IPv4 addresses (`pods`: [`Lab::pod_endpoints`]): the
/// topology's Service, then the Services a replay captured.
pub fn probes(
    lab: &Lab,
    pods: &[Endpoint],
    wanted: &dyn Fn(&str) -> bool,
    out: &mut Vec<ProbeSpec>,
) {
    topology_probes(lab, pods, wanted, out);
    captured_probes(lab, pods, wanted, out);
}

/// The topology's Service: `service/hairpin`, `service/same-node` and
/// `service/cross-node` to each backend's own Service, and
/// `service/cluster-ip` to `web`.
fn topology_probes(
    lab: &Lab,
    pods: &[Endpoint],
    wanted: &dyn Fn(&str) -> bool,
    out: &mut Vec<ProbeSpec>,
) {
    let Some(spec) = lab.topo.service.clone() else {
        return;
    };
    let on = |n: usize| pods.iter().filter(move |e| e.node == Some(n));
    let pod = |n: usize, p: usize| on(n).find(|e| e.pod == Some(p));
    let backends = backends(lab);
    let mut push =
        |group: &'static str, from: &Endpoint, to: Endpoint, expect: Option<ExpectSource>| {
            if wanted(group) {
                for proto in [Proto::Tcp, Proto::Udp] {
                    out.push(ProbeSpec {
                        group,
                        from: from.clone(),
                        to: to.clone(),
                        proto,
                        expect_source: expect,
                        service: None,
                    });
                }
            }
        };
    for (k, (i, _)) in backends.iter().enumerate() {
        let Some(backend) = pod(*i, 0) else {
            continue;
        };
        let target = Endpoint {
            ip: pinned_ip(&spec, *i),
            ..backend.clone()
        };
        // The backend itself: hairpin (its source is masqueraded).
        push(HAIRPIN, backend, target.clone(), None);
        for src in on(*i).filter(|e| e.pod != Some(0)) {
            push(
                SAME_NODE,
                src,
                target.clone(),
                Some(ExpectSource::Unchanged(src.ip)),
            );
        }
        // The pods of the node whose backend comes before this one.
        let prev = backends[(k + backends.len() - 1) % backends.len()].0;
        if prev != *i {
            for src in on(prev) {
                push(
                    CROSS_NODE,
                    src,
                    target.clone(),
                    Some(ExpectSource::Unchanged(src.ip)),
                );
            }
        }
    }
    if backends.is_empty() {
        return;
    }
    let web = Endpoint {
        name: WEB.into(),
        node: None,
        pod: None,
        ip: IpAddr::V4(spec.cluster_ip),
        external: false,
    };
    if !wanted(CLUSTER_IP) {
        return;
    }
    for src in pods {
        out.push(ProbeSpec {
            group: CLUSTER_IP,
            from: src.clone(),
            to: web.clone(),
            proto: Proto::Tcp,
            expect_source: None,
            service: None,
        });
    }
}

/// Whether `responder` may answer a probe to `spec.to`: for `web`, any
/// backend (the first pod of a node); for a captured Service, any pod an
/// endpoint DNATs to.
pub fn may_answer(spec: &ProbeSpec, responder: &str) -> bool {
    if let Some(s) = &spec.service {
        return s.backends.iter().any(|b| b == responder);
    }
    spec.to.name == WEB && responder.ends_with("-pod0")
}

/// The interface index (in the node) of the peer of node `n`'s pod `p`'s eth0.
fn port_index(lab: &Lab, n: usize, p: usize) -> Option<u64> {
    let pod = lab.nodes[n].pods.get(p)?;
    let out = pod
        .ns
        .command("ip")
        .args(["-j", "link", "show", "eth0"])
        .output()
        .ok()?;
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    links.get(0)?.get("link_index")?.as_u64()
}

/// The hairpin mode of the bridge port of node `n`'s pod `p`.
fn hairpin_mode(lab: &Lab, n: usize, p: usize) -> Option<bool> {
    let peer = port_index(lab, n, p)?;
    let out = lab.nodes[n]
        .ns
        .command("ip")
        .args(["-j", "-d", "link", "show"])
        .output()
        .ok()?;
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let port = links
        .as_array()?
        .iter()
        .find(|l| l.get("ifindex").and_then(|i| i.as_u64()) == Some(peer))?;
    port.get("linkinfo")?
        .get("info_slave_data")?
        .get("hairpin")?
        .as_bool()
}

/// The name of the bridge port (node side) of node `n`'s pod `p`; `None`
/// when the pod's host end is not enslaved (a ptp-style plugin).
pub fn bridge_port(lab: &Lab, n: usize, p: usize) -> Option<String> {
    let peer = port_index(lab, n, p)?;
    lab.nodes[n]
        .ns
        .links()
        .ok()?
        .into_iter()
        .find(|l| u64::from(l.index) == peer && l.controller.is_some())
        .map(|l| l.name)
}

/// Diagnoses of a failed Service probe: no DNAT for the ClusterIP on the
/// client's node, hairpin mode off on the backend's bridge port, or no
/// masquerade for hairpin traffic.
pub fn diagnose(lab: &Lab, facts: &[NodeFacts], o: &ProbeOutcome, out: &mut Vec<Diagnosis>) {
    let spec = &o.spec;
    if !spec.group.starts_with("service/") {
        return;
    }
    if spec.service.is_some() {
        // A captured kube-proxy Service: `kube_proxy::diagnose` reads its chains.
        return;
    }
    let Some(src) = spec.from.node.and_then(|i| facts.get(i)) else {
        return;
    };
    let cluster_ip = spec.to.ip.to_string();
    if !src.ruleset.contains(&cluster_ip) || !src.ruleset.contains("dnat to") {
        out.push(Diagnosis {
            id: "service-dnat-missing",
            message: format!(
                "{} has no DNAT rule for ClusterIP {cluster_ip}:{PORT} (kube-proxy's table {TABLE} is missing there): traffic to the Service leaves {} with the ClusterIP as destination and nothing answers",
                src.name, src.name
            ),
        });
        return;
    }
    if spec.group != HAIRPIN {
        return;
    }
    let (Some(n), Some(p)) = (spec.to.node, spec.to.pod) else {
        return;
    };
    let port = bridge_port(lab, n, p).unwrap_or_else(|| "?".into());
    if hairpin_mode(lab, n, p) == Some(false) {
        out.push(Diagnosis {
            id: "hairpin-off",
            message: format!(
                "hairpin mode is off on {}'s bridge port {port}: {} reaching itself through its Service ({cluster_ip}) is DNATed back to its own port, and the bridge never sends a frame out of the port it came in on (plugin: \"hairpinMode\": true; kubelet --hairpin-mode)",
                spec.to.name, spec.to.name
            ),
        });
        return;
    }
    let backend = spec.from.ip.to_string();
    let marked = src
        .ruleset
        .lines()
        .any(|l| l.contains(&format!("ip saddr {backend}")) && l.contains("mark-for-masquerade"));
    if !marked {
        out.push(Diagnosis {
            id: "hairpin-masquerade-missing",
            message: format!(
                "{} has no masquerade for hairpin traffic of {} ({backend} → {cluster_ip} → {backend}): the backend sees its own address as source and answers itself directly, bypassing the DNAT's conntrack, so the reply never comes from the ClusterIP (kube-proxy marks `ip saddr <endpoint>` for masquerade)",
                src.name, spec.from.name
            ),
        });
    }
}

/// The ports the captured Services DNAT to: every pod's responders listen
/// on them too (besides `probe::PORT`).
pub fn target_ports(lab: &Lab) -> Vec<u16> {
    let mut ports: Vec<u16> = lab
        .topo
        .kube_services
        .iter()
        .flat_map(|s| &s.endpoints)
        .filter_map(|e| e.dnat.map(|d| d.port()))
        .filter(|p| *p != PORT)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// `service/cluster-ip` of the captured Services: every pod of the
/// Service's family → the ClusterIP at the Service's port, over its
/// protocol (TCP, UDP); the pods the endpoints DNAT to may answer.
fn captured_probes(
    lab: &Lab,
    pods: &[Endpoint],
    wanted: &dyn Fn(&str) -> bool,
    out: &mut Vec<ProbeSpec>,
) {
    let group = CLUSTER_IP;
    if !wanted(group) {
        return;
    }
    for s in &lab.topo.kube_services {
        let proto = match s.proto.as_str() {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            _ => continue,
        };
        let targets: Vec<IpAddr> = s
            .endpoints
            .iter()
            .filter_map(|e| e.dnat.map(|d| d.ip()))
            .collect();
        let backends: Vec<String> = pods
            .iter()
            .filter(|p| targets.contains(&p.ip))
            .map(|p| p.name.clone())
            .collect();
        let to = Endpoint {
            name: format!("service {}", s.name),
            node: None,
            pod: None,
            ip: s.cluster_ip,
            external: false,
        };
        for from in pods
            .iter()
            .filter(|p| p.ip.is_ipv4() == s.cluster_ip.is_ipv4())
        {
            out.push(ProbeSpec {
                group,
                from: from.clone(),
                to: to.clone(),
                proto,
                expect_source: None,
                service: Some(ServicePort {
                    port: s.port,
                    backends: backends.clone(),
                }),
            });
        }
    }
}
