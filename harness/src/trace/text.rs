//! A trace for people: one line per hop, the firewall rules the probe met,
//! the verdict and how to reproduce it.

use super::{Death, Event, EventKind, Trace, Verdict};
use std::fmt::Write;

/// One firewall event as text (`rule … # handle 2 (verdict drop)`).
pub(crate) fn event(e: &Event) -> String {
    match &e.what {
        EventKind::Packet(p) => format!("packet {p}"),
        EventKind::Rule {
            text,
            handle,
            verdict,
        } => {
            let handle = handle.map(|h| format!(" # handle {h}")).unwrap_or_default();
            format!("rule {text}{handle} (verdict {verdict})")
        }
        EventKind::Policy(p) => format!("policy {p}"),
        EventKind::Verdict(v) => format!("verdict {v}"),
    }
}

/// Device crossings shown at each end of a long list.
const SHOWN: usize = 12;

/// Where and why a packet died: `node2: blackhole route …: evidence`.
fn died(d: &Death) -> String {
    let at = match &d.node {
        Some(n) if *n != d.namespace => format!("{} (node {n})", d.namespace),
        _ => d.namespace.clone(),
    };
    format!("{at}: {} {}: {}", d.cause, d.object, d.evidence)
}

/// The table form of a trace.
pub fn render(t: &Trace) -> String {
    let mut s = String::new();
    let port = t.port.map(|p| format!(" port {p}")).unwrap_or_default();
    let src = t.src.map(|a| a.to_string()).unwrap_or_else(|| "?".into());
    let _ = writeln!(
        s,
        "trace {} -> {}: {}{port} {src} -> {}",
        t.from,
        t.to,
        format!("{:?}", t.proto).to_lowercase(),
        t.dst
    );
    for (i, h) in t.hops.iter().enumerate() {
        let _ = writeln!(
            s,
            "  {:>2}. {:<16} in {:<14} out {:<14} {}",
            i + 1,
            h.namespace,
            h.iif.as_deref().unwrap_or("-"),
            h.oif.as_deref().unwrap_or("-"),
            h.decision
        );
        let _ = writeln!(s, "      {}", h.evidence);
    }
    for f in &t.firewall {
        let _ = writeln!(
            s,
            "  nft {:<16} {} {}: {}",
            f.namespace, f.table, f.chain, f.what
        );
    }
    if !t.devices.is_empty() {
        let mut crossed: Vec<String> = t
            .devices
            .iter()
            .map(|d| format!("{} {}/{}", d.direction, d.namespace, d.device))
            .collect();
        // A loop crosses the same devices over and over: its first and
        // last crossings say it (`-o json` has them all).
        if crossed.len() > 2 * SHOWN {
            let left_out = crossed.len() - 2 * SHOWN;
            crossed.splice(
                SHOWN..crossed.len() - SHOWN,
                [format!("… {left_out} more …")],
            );
        }
        let _ = writeln!(s, "  kernel: {}", crossed.join(" → "));
    }
    match (&t.kernel_drop, &t.drop_reasons_skipped) {
        (Some(d), _) => {
            let _ = writeln!(s, "  kernel: {}", d.describe());
        }
        (None, Some(why)) => {
            let _ = writeln!(s, "  kernel drop reasons: SKIP: {why}");
        }
        (None, None) => {}
    }
    if let Some(r) = &t.reply_drop {
        let _ = writeln!(s, "  kernel: its answer was {}", r.describe());
    }
    match (t.verdict, &t.death, &t.reason) {
        (Verdict::Died, Some(d), _) => {
            let _ = writeln!(s, "DIED at {}", died(d));
        }
        (Verdict::Arrived, _, _) => {
            let _ = writeln!(s, "ARRIVED at {}", t.to);
            if let Some(d) = &t.reply_death {
                let _ = writeln!(s, "its answer DIED at {}", died(d));
            }
        }
        (Verdict::Left, _, _) if t.left.is_some() => {
            if let Some(e) = &t.left {
                let _ = writeln!(
                    s,
                    "LEFT {}: nothing on {} dropped the probe; follow it with `cnilab trace` on the node of {}",
                    e.describe(),
                    e.namespace,
                    e.next_hop
                );
            }
        }
        (_, _, reason) => {
            let _ = writeln!(
                s,
                "INCONCLUSIVE: {}",
                reason.as_deref().unwrap_or("the trace could not tell")
            );
        }
    }
    for r in &t.reproduce {
        let _ = writeln!(s, "reproduce: {r}");
    }
    s
}
