//! One probe sent along a routing walk and traced: nftables' trace rules
//! in every namespace the walk crossed, the drop counters before and
//! after, and the kernel's drop reasons recorded meanwhile.

use super::{counters, nftrace, probe, reasons, walk};
use super::{Death, End, Request, World};
use std::fs::File;
use std::net::IpAddr;

/// A routing walk, the probe traced along it, and the NAT rewrites that
/// trace showed (the walk was made with them).
pub struct Followed {
    pub walked: walk::Walk,
    pub pass: Pass,
    pub rewrites: Vec<super::nat::Rewrite>,
}

/// The namespaces a walk crossed, in order, what nftables' trace saw of
/// one probe sent along them, the drop counters that moved meanwhile, and
/// what tracefs recorded of it.
pub type Pass = (
    Vec<String>,
    Result<nftrace::Traced, String>,
    Vec<Death>,
    reasons::Recording,
);

/// Sends one probe along `walked` and traces it: the trace rules match
/// any of `dsts` (and the request's port or any of `ports`).
pub fn probe(
    world: &World,
    req: &Request,
    walked: &walk::Walk,
    dsts: &[IpAddr],
    ports: &[u16],
) -> Pass {
    let mut path: Vec<String> = vec![req.from_ns.clone()];
    for h in &walked.hops {
        if !path.contains(&h.namespace) {
            path.push(h.namespace.clone());
        }
    }
    if let End::Died(d) = &walked.end {
        if !path.contains(&d.namespace) && world.file(&d.namespace).is_some() {
            path.push(d.namespace.clone());
        }
    }
    let files: Vec<(String, &File)> = path
        .iter()
        .filter_map(|ns| world.file(ns).map(|f| (ns.clone(), f)))
        .collect();
    let ports: Vec<u16> = req.port.iter().chain(ports).copied().collect();
    let matchers: Vec<String> = std::iter::once(nftrace::matcher(dsts, req.proto, &ports))
        .chain(walked.outer.iter().map(|o| nftrace::outer_matcher(*o)))
        .collect();
    let from = world.file(&req.from_ns);
    let (mut before, mut after) = (counters::Snapshot::default(), counters::Snapshot::default());
    // Where the kernel's routes drop it, past the first namespace.
    let dies_at = match &walked.end {
        End::Died(d) => files
            .iter()
            .position(|(ns, _)| *ns == d.namespace)
            .filter(|i| *i > 0),
        _ => None,
    };
    let recording = reasons::Recording::start(req, reasons::size_of(req));
    let devices = reasons::entry_devices(world, &walked.hops, &files);
    let traced = nftrace::trace(
        &files,
        &devices,
        &matchers,
        dies_at,
        || {
            before = counters::take(&files);
            match from {
                Some(f) => probe::send(f, walked.sent_src, req),
                None => probe::Sent::none(),
            }
        },
        || after = counters::take(&files),
    );
    let counted = counters::moved(&before, &after, &path);
    (path, traced, counted, recording)
}
