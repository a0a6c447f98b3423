//! A trace's verdict: what the walk and the probe's trace say together
//! (`combine.rs`), settled by the other witnesses (the kernel's drop
//! reasons, who else holds the address, a silent destination, a NAT to
//! nowhere), then the answer's way back for a packet that arrived, and
//! the commands that show the death's object.

use super::pass::Followed;
use super::{answer, combine, exit, nat, reasons, why};
use super::{End, Hop, Request, Trace, Verdict, World, SCHEMA_VERSION};

/// The trace of `req`, judged from the walk and probe of `followed`
/// (`size`: the probe's size in bytes).
pub fn judge(world: &World, req: &Request, followed: Followed, size: u32) -> Trace {
    let Followed {
        walked,
        pass: (path, traced, counted, kernel),
        rewrites,
    } = followed;
    let mut trace = Trace {
        schema_version: SCHEMA_VERSION,
        from: req.from.clone(),
        to: req.to.clone(),
        proto: req.proto,
        src: walked.sent_src,
        dst: req.dst,
        port: req.port,
        hops: walked.hops,
        firewall: Vec::new(),
        devices: Vec::new(),
        kernel_drop: None,
        reply_drop: None,
        reply_death: None,
        drop_reasons_skipped: None,
        verdict: Verdict::Inconclusive,
        death: None,
        reason: None,
        left: None,
        reproduce: vec![req.command.clone()],
    };
    let to_ns = world.owner(walked.dst).unwrap_or_else(|| req.to_ns.clone());
    let answer = (walked.dst, walked.src, walked.sent_src);
    let kernel = kernel.finish(world, &path, &to_ns);
    match &kernel.0 {
        Ok(f) => {
            trace.devices = f.devices.clone();
            trace.kernel_drop = f.drop.clone();
            trace.reply_drop = f.reply_drop.clone();
        }
        Err(e) => trace.drop_reasons_skipped = Some(e.clone()),
    }
    let end = combine::combine(
        world,
        &path,
        walked.end,
        (traced, counted),
        &to_ns,
        &mut trace,
    );
    let end = why::settle(
        world,
        reasons::settle(end, &kernel),
        &trace.hops,
        walked.dst,
    );
    let end = answer::silent(world, end, req.proto, walked.dst);
    let end = nat::nowhere(world, end, &trace.hops);
    match end {
        End::Arrived(_) => {
            trace.verdict = Verdict::Arrived;
            // The answer's way back, walked through the model (back to
            // the masqueraded source, then, where conntrack reverses it,
            // on to the probe's own).
            let snat = rewrites
                .iter()
                .find(|r| matches!(r.change, nat::Change::Snat(_)))
                .map(|r| r.namespace.as_str());
            trace.reply_death = answer::death(world, &to_ns, answer, snat, size);
            if let Some(d) = &trace.reply_death {
                trace.reproduce.push(format!(
                    "nsenter --net={} {}",
                    world.path(&d.namespace),
                    d.check
                ));
            }
        }
        End::Died(mut d) => {
            d.node = world.node_of(&d.namespace);
            if d.node.is_none() {
                d.evidence.push_str(&sent_by(&trace.hops, &d.namespace));
            }
            if d.check.is_empty() {
                d.check = d.default_check(req.dst);
            }
            trace.reproduce.push(format!(
                "nsenter --net={} {}",
                world.path(&d.namespace),
                d.check
            ));
            trace.verdict = Verdict::Died;
            trace.death = Some(*d);
        }
        End::Left(exit) => match exit::evidence(&exit, &trace) {
            Ok(()) => {
                trace.verdict = Verdict::Left;
                trace.left = Some(*exit);
            }
            Err(why) => {
                trace.verdict = Verdict::Inconclusive;
                trace.reason = Some(why);
            }
        },
        End::Inconclusive(mut reason) => {
            let unread = world.read_errors();
            if !unread.is_empty() {
                reason.push_str(&format!("; could not read: {}", unread.join("; ")));
            }
            trace.verdict = Verdict::Inconclusive;
            trace.reason = Some(reason);
        }
    }
    trace
}

/// For a death in a namespace of no node (the underlay: a router, an
/// outside host): the route that sent the packet there, the last one
/// before it with a gateway, so a detour names the node that took it.
fn sent_by(hops: &[Hop], ns: &str) -> String {
    let first = hops
        .iter()
        .position(|h| h.namespace == ns)
        .unwrap_or(hops.len());
    hops[..first]
        .iter()
        .rev()
        .find(|h| h.decision.starts_with("forward via"))
        .map(|h| {
            let asked = h.evidence.split(':').next().unwrap_or_default();
            format!("; {} sent it here: {} ({asked})", h.namespace, h.decision)
        })
        .unwrap_or_default()
}
