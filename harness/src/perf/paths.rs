//! The paths `lab perf` measures in one lab, each from a namespace to an
//! address on [`load::PORT`](super::load::PORT), and the paths the lab has
//! not got (with the reason):
//!
//! | path          | from              | to                                    |
//! |---------------|-------------------|---------------------------------------|
//! | `underlay`    | node 1            | node 2's address (the baseline)       |
//! | `same-node`   | node 1's pod 0    | node 1's pod 1 (through the bridge)   |
//! | `cross-node`  | node 1's pod 0    | node 2's pod 0                        |
//! | `node-to-pod` | node 1            | node 2's last pod                     |
//! | `service`     | node 1's pod 0    | node 2's backend Service (ClusterIP)  |
//! | `external`    | node 1's pod 0    | the external host (masqueraded)       |
//!
//! IPv4: every lab shape has it; the ratios are per lab, so an IPv6 row
//! would say the same of a dual-stack plugin's second family.

use crate::lab::built::{Lab, Node};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};

/// The baseline every other path is a ratio to.
pub const BASELINE: &str = "underlay";
/// Every path, in the table's order.
pub const ALL: [&str; 6] = [
    BASELINE,
    "same-node",
    "cross-node",
    "node-to-pod",
    "service",
    "external",
];

/// One path of one lab.
pub struct Path {
    pub name: &'static str,
    pub from: String,
    pub to: String,
    pub src: File,
    pub dst: SocketAddr,
    /// The namespace that serves it (a server runs there).
    pub server: File,
}

/// A path the lab lacks, and why.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

fn v4(ips: &[ipnet::IpNet]) -> Option<IpAddr> {
    ips.iter().map(|n| n.addr()).find(IpAddr::is_ipv4)
}

fn clone(f: &File) -> Result<File, String> {
    f.try_clone()
        .map_err(|e| format!("a namespace handle: {e}"))
}

/// One end of a path: its name in the report and its namespace.
type End<'a> = (String, &'a File);

/// A path wanted: its name, where from, and the address it goes to with
/// the end that serves it; or why the lab has not got it.
type Wanted<'a> = (
    &'static str,
    Result<End<'a>, String>,
    Result<(End<'a>, IpAddr), String>,
);

/// Node `n` as an end.
fn node(n: &Node) -> End<'_> {
    (n.spec.name.clone(), n.ns.file())
}

/// Pod `p` of node `n` with its IPv4 address, or why there is none.
fn pod(n: &Node, p: usize) -> Result<(End<'_>, IpAddr), String> {
    let x = n.pods.get(p).ok_or_else(|| {
        format!(
            "{} has no pod {} (--pods-per-node {})",
            n.spec.name,
            p,
            p + 1
        )
    })?;
    let ip = v4(&x.ips).ok_or_else(|| format!("{} has no IPv4 address", x.name))?;
    Ok(((x.name.clone(), x.ns.file()), ip))
}

/// The paths of `lab`, and those it has not got.
pub fn of(lab: &Lab) -> Result<(Vec<Path>, Vec<Skipped>), String> {
    let (Some(n1), Some(n2)) = (lab.nodes.first(), lab.nodes.get(1)) else {
        return Err("lab perf needs a lab of 2 nodes or more (--nodes 2): its baseline is the underlay between two nodes".into());
    };
    let Some(under) = n2.spec.address_of(false) else {
        return Err(format!(
            "node {} has no IPv4 address: lab perf measures IPv4",
            n2.spec.name
        ));
    };
    let src = pod(n1, 0);
    let service = crate::lab::services::backend_service(lab, 1)
        .ok_or_else(|| "the lab has no Service with a backend on node 2 (--service)".to_string())
        .and_then(|ip| Ok(((format!("web-{} {ip}", n2.spec.name), pod(n2, 0)?.0 .1), ip)));
    let external = match (
        lab.topo.external.as_ref().and_then(|e| e.address_of(false)),
        &lab.external,
    ) {
        (Some(ip), Some(ns)) => Ok((("external".to_string(), ns.file()), ip)),
        _ => Err("the lab has no external host".to_string()),
    };
    // (path, from, to): `to` names the address and the namespace serving it.
    let from_pod = || src.clone().map(|(e, _)| e);
    let wanted: [Wanted; 6] = [
        (
            BASELINE,
            Ok(node(n1)),
            Ok(((n2.spec.name.clone(), n2.ns.file()), under)),
        ),
        ("same-node", from_pod(), pod(n1, 1)),
        ("cross-node", from_pod(), pod(n2, 0)),
        (
            "node-to-pod",
            Ok(node(n1)),
            pod(n2, n2.pods.len().saturating_sub(1)),
        ),
        ("service", from_pod(), service),
        ("external", from_pod(), external),
    ];
    let mut paths = Vec::new();
    let mut skipped = Vec::new();
    for (name, from, to) in wanted {
        match (from, to) {
            (Ok((from, src)), Ok(((to, server), ip))) => paths.push(Path {
                name,
                from,
                to,
                src: clone(src)?,
                dst: SocketAddr::new(ip, super::load::PORT),
                server: clone(server)?,
            }),
            (Err(reason), _) | (_, Err(reason)) => skipped.push(Skipped {
                path: name.to_string(),
                reason,
            }),
        }
    }
    Ok((paths, skipped))
}
