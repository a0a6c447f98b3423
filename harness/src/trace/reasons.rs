//! The kernel's drop reasons in a trace: a [`drops::Instance`] records
//! while the probe passes, its devices are placed in the namespaces the
//! walk knows, and a drop the trace's own halves did not explain becomes
//! the death (`kernel-drop`); one they did explain gets the kernel's word
//! beside it.

use super::drops::{self, DeviceHop, Followed, KernelDrop};
use super::{Death, End, Hop, Proto, Request, World};
use std::fs::File;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

/// The ICMP probe's size when none was asked: ping's default and a little
/// more, different for each trace (odd above IPv4's default, even above
/// IPv6's, so two traces side by side never share one), so the tracefs
/// filter on the length picks out the probe's own packets.
pub(super) fn marker_size(dst: IpAddr) -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) + std::process::id();
    let step = 2 * (n % 32);
    if dst.is_ipv4() {
        84 + 1 + step
    } else {
        104 + 2 + step
    }
}

/// The recording of one probe: the instance, or why there is none.
pub(super) struct Recording(Result<drops::Instance, String>);

impl Recording {
    /// Starts recording the probe of `req`, `size` bytes from the IP
    /// header on.
    pub(super) fn start(req: &Request, size: u32) -> Recording {
        let support = match drops::support() {
            Ok(s) => s,
            Err(e) => return Recording(Err(e.clone())),
        };
        let protocol = if req.dst.is_ipv4() { 0x0800 } else { 0x86dd };
        Recording(drops::Instance::create(support, size, protocol))
    }

    /// What was recorded, followed from `path[0]` to `to_ns`; `Err`: why
    /// the kernel's account is missing (the SKIP reason).
    pub(super) fn finish(self, world: &World, path: &[String], to_ns: &str) -> Kernel {
        let records = match (&self.0, drops::support()) {
            (Ok(instance), Ok(support)) => instance.records(support),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        };
        let back: Vec<String> = path.iter().rev().cloned().collect();
        let followed = records.map(|records| {
            let from = path.first().map(String::as_str).unwrap_or_default();
            let mut f = drops::follow(&records, (from, to_ns), |prev, dev, rx, reply| {
                let path = if reply { &back } else { path };
                place(world, path, prev, dev, rx)
            });
            if world.is_one_node() {
                beyond_the_node(&mut f);
            }
            f
        });
        Kernel(followed)
    }
}

/// In a world of one node, the kernel's account ends where the probe left
/// it: a device it then crossed is in no namespace the trace knows (`?`),
/// and what is freed there is no object of this node (nor surely the
/// probe: once the probe is consumed elsewhere, its skb's address is soon
/// another packet's).
fn beyond_the_node(f: &mut Followed) {
    if let Some(cut) = f.devices.iter().position(|d| d.namespace == "?") {
        f.devices.truncate(cut);
        if f.drop.as_ref().is_some_and(|d| d.namespace == "?") {
            f.drop = None;
        }
    }
}

/// The kernel's account of one probe (`Err`: the SKIP reason).
pub(super) struct Kernel(pub(super) Result<Followed, String>);

/// The namespace of `dev`, by the crossing before it: the peer of the veth
/// it just left, the same namespace, or the next on the walk that has a
/// device of that name (a device received on just after it sent in the
/// same namespace is another's: a VXLAN device on the far node).
fn place(
    world: &World,
    path: &[String],
    prev: Option<&DeviceHop>,
    dev: &str,
    rx: bool,
) -> Option<String> {
    let has = |ns: &str| world.link(ns, dev).is_some();
    let Some(p) = prev else {
        return path.first().filter(|ns| has(ns)).cloned();
    };
    let sent = p.direction == "out";
    if rx && sent {
        if let Some((ns, name)) = world.peer(&p.namespace, &p.device) {
            if name == dev {
                return Some(ns);
            }
        }
    }
    let same_device_back = rx && sent && p.device == dev;
    if has(&p.namespace) && !same_device_back {
        return Some(p.namespace.clone());
    }
    let at = path.iter().position(|n| *n == p.namespace)?;
    path[at + 1..].iter().find(|ns| has(ns)).cloned()
}

/// The death with the kernel's account: a walk that could not tell, or a
/// probe the firewall trace lost, dies where the kernel dropped it; a
/// death already named gets the kernel's reason beside its evidence.
pub(super) fn settle(end: End, kernel: &Kernel) -> End {
    let Ok(Followed {
        drop: Some(drop), ..
    }) = &kernel.0
    else {
        return end;
    };
    match end {
        End::Inconclusive(why) => End::Died(Box::new(death(drop, &why))),
        End::Left(exit) => End::Died(Box::new(death(
            drop,
            &format!("routing sends it out of {}", exit.describe()),
        ))),
        End::Died(mut d) => {
            d.evidence
                .push_str(&format!("; the kernel: {}", drop.describe()));
            End::Died(d)
        }
        arrived => arrived,
    }
}

/// A drop no rule of the trace explains: the kernel's reason is the cause.
fn death(drop: &KernelDrop, why: &str) -> Death {
    let before = why.split(';').next().unwrap_or(why);
    let mut d = Death::new(
        &drop.namespace,
        KERNEL_DROP,
        &format!("dev {}", drop.device),
        &format!(
            "{} (the kernel's drop reason; the trace alone found: {before})",
            drop.describe()
        ),
    );
    d.check = check(drop);
    d
}

/// The cause id of a death the kernel's reason names.
pub const KERNEL_DROP: &str = "kernel-drop";

/// A command that shows what the reason points at.
fn check(d: &KernelDrop) -> String {
    match d.reason.as_str() {
        "NETFILTER_DROP" => "nft -a list ruleset".into(),
        "IP_RPFILTER" => format!(
            "sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.{}.rp_filter",
            d.device
        ),
        "IP_INADDRERRORS" | "IP_INNOROUTES" | "IP_OUTNOROUTES" => {
            "ip route show table all; sysctl net.ipv4.ip_forward".into()
        }
        r if r.starts_with("QDISC") || r.starts_with("TC_") => {
            format!(
                "tc -s qdisc show dev {}; tc filter show dev {} ingress",
                d.device, d.device
            )
        }
        _ => format!("ip -s -d link show dev {}", d.device),
    }
}

/// The probe's size as the tracefs filter sees it (IP header on): the
/// asked size, or the default of its protocol.
pub(super) fn size_of(req: &Request) -> u32 {
    let ip = if req.dst.is_ipv4() { 20 } else { 40 };
    match (req.proto, req.size) {
        (Proto::Icmp, Some(s)) => s,
        // A bare TCP header on a raw socket.
        (Proto::Tcp, _) if req.invalid => ip + 20,
        _ => super::probe::default_size(req.dst, req.proto),
    }
}

/// Per namespace of `files`, the devices the probe enters it by: each
/// hop's input device, and the far end of the veth the hop before left by
/// (a bridge port, where the frame enters before the bridge has it).
pub(super) fn entry_devices(
    world: &World,
    hops: &[Hop],
    files: &[(String, &File)],
) -> Vec<Vec<String>> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for (i, h) in hops.iter().enumerate() {
        if let Some(iif) = &h.iif {
            entries.push((h.namespace.clone(), iif.clone()));
        }
        let left = i
            .checked_sub(1)
            .and_then(|p| hops.get(p))
            .filter(|p| p.namespace != h.namespace);
        if let Some(prev) = left {
            if let Some(peer) = prev
                .oif
                .as_deref()
                .and_then(|o| world.peer(&prev.namespace, o))
            {
                entries.push(peer);
            }
        }
    }
    files
        .iter()
        .map(|(ns, _)| {
            let mut devices: Vec<String> = entries
                .iter()
                .filter(|(n, d)| n == ns && world.link(ns, d).is_some())
                .map(|(_, d)| d.clone())
                .collect();
            devices.sort();
            devices.dedup();
            devices
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(ns: &str, dev: &str, direction: &'static str) -> DeviceHop {
        DeviceHop {
            namespace: ns.into(),
            device: dev.into(),
            direction,
        }
    }

    #[test]
    fn a_one_node_account_ends_where_the_probe_left_the_node() {
        let drop = |ns: &str| KernelDrop {
            namespace: ns.into(),
            device: "eth0".into(),
            reason: "IP_INNOROUTES".into(),
            function: "ip_error".into(),
        };
        let mut f = Followed {
            devices: vec![
                hop("pod", "eth0", "out"),
                hop("node", "cali1", "in"),
                hop("node", "eth0", "out"),
                hop("?", "up0", "in"),
                hop("?", "eth0", "in"),
            ],
            drop: Some(drop("?")),
            ..Default::default()
        };
        beyond_the_node(&mut f);
        assert_eq!(f.devices.len(), 3);
        assert_eq!(f.devices[2], hop("node", "eth0", "out"));
        assert!(f.drop.is_none());
        // A drop on the node itself stays.
        let mut f = Followed {
            devices: vec![hop("pod", "eth0", "out"), hop("node", "cali1", "in")],
            drop: Some(drop("node")),
            ..Default::default()
        };
        beyond_the_node(&mut f);
        assert_eq!(f.drop, Some(drop("node")));
    }
}
