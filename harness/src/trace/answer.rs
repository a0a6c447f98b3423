//! The probe's answer: an end that got the probe and never answers it,
//! and the answer's way back, walked through the same model, with the
//! masquerade's reversal (conntrack's, in the namespace that rewrote the
//! probe's source) where it happens.

use super::nat::{Change, Rewrite};
use super::{walk, Death, End, Proto, World};
use std::net::IpAddr;

/// An ICMP echo that arrived in a namespace that ignores every echo
/// (`icmp_echo_ignore_all`): it died there, answered by nobody.
pub(super) fn silent(world: &World, end: End, proto: Proto, dst: IpAddr) -> End {
    let End::Arrived(ns) = &end else {
        return end;
    };
    let key = if dst.is_ipv4() {
        "net/ipv4/icmp_echo_ignore_all"
    } else {
        "net/ipv6/icmp/echo_ignore_all"
    };
    if proto != Proto::Icmp || world.sysctl(ns, key) != "1" {
        return end;
    }
    let mut d = Death::new(
        ns,
        "echo-ignored",
        key,
        &format!("{key} = 1: {ns} answers no ICMP echo request, this probe's included"),
    );
    d.check = format!("sysctl {}", key.replace('/', "."));
    End::Died(Box::new(d))
}

/// The answer of a probe that arrived (from `at`, the address it arrived
/// at, back to the source the probe had there), walked through the same
/// model: where that walk dies, with the command that shows it. `snat`:
/// the namespace that rewrote the probe's source from `sent` to `back_to`
/// (the answer goes back to `back_to`, and from there to `sent`).
pub(super) fn death(
    world: &World,
    at: &str,
    (arrived_at, back_to, sent): (IpAddr, Option<IpAddr>, Option<IpAddr>),
    snat: Option<&str>,
    size: u32,
) -> Option<Death> {
    let back_to = back_to?;
    let undo: Vec<Rewrite> = match (snat, sent) {
        (Some(ns), Some(sent)) if sent != back_to => vec![Rewrite {
            namespace: ns.to_string(),
            change: Change::Dnat(sent, None),
            evidence: format!(
                "conntrack: {ns} rewrote the probe's source {sent} to {back_to}, and the \
                 answer back"
            ),
        }],
        _ => Vec::new(),
    };
    let answer = walk::walk(world, at, (Some(arrived_at), back_to), size, &undo);
    let to = answer.dst;
    let End::Died(mut d) = super::why::settle(world, answer.end, &answer.hops, to) else {
        return None;
    };
    d.node = world.node_of(&d.namespace);
    if d.check.is_empty() {
        d.check = d.default_check(to);
    }
    Some(*d)
}
