//! `cnilab trace FROM TO` on a live node, outside any lab: the node and
//! its pods found as `cnilab capture` finds them ([`crate::capture::live`]:
//! every namespace linked to the node, named by the CRI sandbox, the
//! namespace's name or `pid:N`), handed by path to the same tracer as
//! `lab trace` as a world of one node ([`World::one_node`]): a packet that
//! leaves the node ends the walk there (verdict `left`, once the kernel
//! saw it queued on the way out). Nothing is changed on the node but the
//! trace's own nftables tables and tracefs instance, both removed when the
//! trace ends.

use super::{Addresses, Proto, Request, Trace, World};
use crate::capture::{self, LiveNode, LivePod};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

/// Where and how to trace.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The node's namespace (`None`: this process's own).
    pub netns: Option<PathBuf>,
    /// The node's name (default: the hostname, or the namespace's name
    /// with `netns`).
    pub node_name: Option<String>,
    /// CRI sockets to ask for pod names (empty: the usual ones).
    pub cri_sockets: Vec<PathBuf>,
}

/// The probe: protocol, port (tcp, udp), size (icmp), an INVALID segment.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    pub proto: Proto,
    pub port: Option<u16>,
    pub size: Option<u32>,
    pub invalid: bool,
}

/// Traces one packet from `from` to `to` on the node `opts` names.
pub fn run(opts: &Options, from: &str, to: &str, probe: Probe) -> Result<Trace, String> {
    let node = capture::live(&capture::Options {
        netns: opts.netns.clone(),
        node_name: opts.node_name.clone(),
        cri_sockets: opts.cri_sockets.clone(),
        ..Default::default()
    })?;
    let world = world_of(&node)?;
    let (to_ns, dst) = match endpoint(&world, &node, to, None)? {
        (ns, Some(ip)) => (ns, ip),
        (ns, None) => return Err(format!("TO {to}: {ns} has no address to send to")),
    };
    let (from_ns, src) = endpoint(&world, &node, from, Some(dst))?;
    let req = Request {
        from: from.to_string(),
        from_ns,
        to: to.to_string(),
        to_ns,
        src,
        dst,
        proto: probe.proto,
        port: probe.port,
        size: probe.size,
        invalid: probe.invalid,
        command: command(opts, from, to, probe),
    };
    Ok(super::run(&world, &req))
}

/// The node and its pods by path, each pod an end holding its addresses.
fn world_of(node: &LiveNode) -> Result<World, String> {
    let mut paths = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    let mut addresses = Addresses::default();
    paths.insert(node.name.clone(), node.path.clone());
    nodes.insert(node.name.clone(), Some(node.name.clone()));
    for p in &node.pods {
        let role = p.source.name.clone();
        paths.insert(role.clone(), p.path.clone());
        nodes.insert(role.clone(), Some(node.name.clone()));
        for ip in &p.addresses {
            addresses.known.insert(*ip, role.clone());
        }
        addresses.ends.insert(role);
    }
    Ok(World::new(paths, nodes, addresses)?.one_node())
}

/// A pod as `capture` names it, or by its sandbox name, its namespace's
/// name or path, or `pid:N` of a process in it.
fn pod<'a>(node: &'a LiveNode, what: &str) -> Option<&'a LivePod> {
    let pid = what
        .strip_prefix("pid:")
        .and_then(|p| p.parse::<u32>().ok());
    let by_pid = |p: &LivePod| {
        pid.is_some_and(|pid| {
            p.source.pid == Some(pid)
                || std::fs::metadata(format!("/proc/{pid}/ns/net"))
                    .ok()
                    .zip(std::fs::metadata(&p.path).ok())
                    .is_some_and(|(a, b)| same_file(&a, &b))
        })
    };
    node.pods
        .iter()
        .find(|p| p.source.name == what)
        .or_else(|| {
            node.pods
                .iter()
                .find(|p| p.source.cri.as_deref() == Some(what))
        })
        .or_else(|| {
            node.pods.iter().find(|p| {
                p.source.netns.as_deref() == Some(what) || p.path == std::path::Path::new(what)
            })
        })
        .or_else(|| node.pods.iter().find(|p| by_pid(p)))
}

fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// FROM or TO: a pod, the node (by name) or an address; its namespace and,
/// when known, its address (of `like`'s family). From the node the kernel
/// chooses the source address.
fn endpoint(
    world: &World,
    node: &LiveNode,
    what: &str,
    like: Option<IpAddr>,
) -> Result<(String, Option<IpAddr>), String> {
    let end = if like.is_some() { "FROM" } else { "TO" };
    let family = |a: &IpAddr| like.is_none_or(|l| l.is_ipv4() == a.is_ipv4());
    if let Ok(ip) = what.parse::<IpAddr>() {
        // An address no namespace here holds: elsewhere in the cluster, or
        // a Service's, which a DNAT on the way decides.
        return match (world.owner(ip), like) {
            (Some(ns), _) => Ok((ns, Some(ip))),
            (None, None) => Ok((ip.to_string(), Some(ip))),
            (None, Some(_)) => Err(format!(
                "FROM {ip}: no namespace of node {} holds this address; {}",
                node.name,
                known(node)
            )),
        };
    }
    if what == node.name {
        let addr = match like {
            Some(_) => None,
            None => node_address(world, &node.name),
        };
        return Ok((node.name.clone(), addr));
    }
    if let Some(p) = pod(node, what) {
        let addr = p.addresses.iter().copied().find(family);
        if addr.is_none() && like.is_some() {
            return Err(format!(
                "{end} {what}: the pod has no address of the destination's family"
            ));
        }
        return Ok((p.source.name.clone(), addr));
    }
    Err(format!(
        "{end} {what:?} is no pod, node or address here; {}",
        known(node)
    ))
}

/// The node's first global address (what `ip route get` from elsewhere
/// would reach it by).
fn node_address(world: &World, node: &str) -> Option<IpAddr> {
    let ns = world.namespace(node)?;
    ns.links
        .iter()
        .filter(|l| l.kind != crate::model::LinkKind::Loopback)
        .flat_map(|l| &l.addresses)
        .map(|a| a.addr())
        .find(|a| !a.is_loopback() && !super::world::link_local(a))
}

/// What FROM and TO may name here, for an error.
fn known(node: &LiveNode) -> String {
    let pods: Vec<&str> = node.pods.iter().map(|p| p.source.name.as_str()).collect();
    format!(
        "the node is {}; its pods: {} (see `cnilab capture`)",
        node.name,
        if pods.is_empty() {
            "none found".to_string()
        } else {
            pods.join(", ")
        }
    )
}

/// `cnilab trace …` that repeats this trace.
fn command(opts: &Options, from: &str, to: &str, probe: Probe) -> String {
    let quote = |s: &str| {
        if s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@=".contains(c))
        {
            s.to_string()
        } else {
            format!("'{}'", s.replace('\'', r"'\''"))
        }
    };
    let mut c = format!("cnilab trace {} {}", quote(from), quote(to));
    if let Some(n) = &opts.netns {
        c.push_str(&format!(" --netns {}", quote(&n.display().to_string())));
    }
    if let Some(n) = &opts.node_name {
        c.push_str(&format!(" --node-name {}", quote(n)));
    }
    c.push_str(&super::probe_flags(probe.proto, probe.port, probe.size));
    if probe.invalid {
        c.push_str(" --invalid");
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_quotes_what_a_shell_would_split() {
        let opts = Options {
            netns: Some(PathBuf::from("/run/netns/cni-1")),
            node_name: Some("node one".into()),
            cri_sockets: Vec::new(),
        };
        let probe = Probe {
            proto: Proto::Tcp,
            port: Some(80),
            size: None,
            invalid: false,
        };
        assert_eq!(
            command(&opts, "default/web-0", "10.96.0.10", probe),
            "cnilab trace default/web-0 10.96.0.10 --netns /run/netns/cni-1 --node-name 'node one' --proto tcp --port 80"
        );
        assert_eq!(
            command(
                &Options::default(),
                "it's",
                "10.0.0.1",
                Probe {
                    proto: Proto::Icmp,
                    port: None,
                    size: Some(1500),
                    invalid: false
                }
            ),
            r"cnilab trace 'it'\''s' 10.0.0.1 --size 1500"
        );
    }
}
