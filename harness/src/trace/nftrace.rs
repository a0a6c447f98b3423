//! The firewall's own account of one packet: nftables' trace. In each
//! namespace the packet crosses, a table of the trace's own
//! (`inet cnilab_trace_<pid>`, chains on prerouting and output at the
//! earliest priority) sets `meta nftrace set 1` for packets that match the
//! probe; `nft -a monitor` in the same namespace prints every rule the
//! packet meets with table, chain, handle and verdict (iptables-nft rules
//! are nft rules and show the same way). The table is removed afterwards,
//! also when the trace fails ([`TraceTables`] on drop).
//!
//! No sleeps decide anything: each monitor is known to listen once it
//! printed the trace table's own `ready` chain being added (one that
//! started listening after it was added gets another, `ready2`, …), and to
//! have printed every trace event of the probe once it printed the `done`
//! chain (netlink delivers a socket's messages in order).

use cnilab_net::{netns, nft};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The name of the trace's own table in every namespace it touches.
pub fn table_name() -> String {
    format!("cnilab_trace_{}", std::process::id())
}

/// Every trace table starts with this (a test checks none is left).
pub const TABLE_PREFIX: &str = "cnilab_trace_";

/// One line of `nft monitor trace` that is not the trace's own table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The namespace (by role) it was seen in.
    pub namespace: String,
    pub family: String,
    pub table: String,
    pub chain: String,
    pub what: EventKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// `packet: iif "x" oif "y" …`: the packet entered this chain.
    Packet(String),
    /// A rule matched: its text, handle and verdict (`continue`, `drop`, …).
    Rule {
        text: String,
        handle: Option<u64>,
        verdict: String,
    },
    /// The chain's policy was applied.
    Policy(String),
    /// Another verdict line (`verdict continue`, `verdict return`).
    Verdict(String),
}

impl Event {
    /// True when this event ends the packet: a rule or policy that drops
    /// or rejects it.
    pub fn kills(&self) -> bool {
        match &self.what {
            EventKind::Rule { verdict, text, .. } => {
                verdict == "drop" || text.split_whitespace().any(|w| w == "reject")
            }
            EventKind::Policy(v) => v == "drop",
            _ => false,
        }
    }
}

/// Parses one line of `nft -a monitor` (`None`: not a trace line).
pub fn parse(namespace: &str, line: &str) -> Option<Event> {
    let rest = line.trim().strip_prefix("trace id ")?;
    let mut words = rest.splitn(5, ' ');
    let _id = words.next()?;
    let family = words.next()?.to_string();
    let table = words.next()?.to_string();
    let chain = words.next()?.to_string();
    let rest = words.next()?.trim();
    let what = if let Some(p) = rest.strip_prefix("packet:") {
        EventKind::Packet(p.trim().to_string())
    } else if let Some(p) = rest.strip_prefix("policy ") {
        EventKind::Policy(p.trim().to_string())
    } else if let Some(v) = rest.strip_prefix("verdict ") {
        EventKind::Verdict(v.trim().to_string())
    } else if let Some(r) = rest.strip_prefix("rule ") {
        let (body, verdict) = match r.rfind("(verdict ") {
            Some(i) => (
                r[..i].trim(),
                r[i + "(verdict ".len()..].trim_end_matches(')').trim(),
            ),
            None => (r.trim(), ""),
        };
        let (text, handle) = match body.rfind("# handle ") {
            Some(i) => (
                body[..i].trim(),
                body[i + "# handle ".len()..].trim().parse().ok(),
            ),
            None => (body, None),
        };
        EventKind::Rule {
            text: text.to_string(),
            handle,
            verdict: verdict.to_string(),
        }
    } else {
        return None;
    };
    Some(Event {
        namespace: namespace.to_string(),
        family,
        table,
        chain,
        what,
    })
}

/// The trace tables in every namespace, removed on drop.
pub struct TraceTables<'a> {
    table: String,
    namespaces: Vec<(String, &'a File)>,
}

impl Drop for TraceTables<'_> {
    fn drop(&mut self) {
        for (_, ns) in &self.namespaces {
            let _ = nft::run(
                Path::new("nft"),
                Some(ns),
                &["delete", "table", "inet", &self.table],
                None,
            );
        }
    }
}

/// A running `nft -a monitor` per namespace, killed on drop.
struct Monitors {
    children: Vec<Child>,
    lines: mpsc::Receiver<(usize, String)>,
}

impl Drop for Monitors {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How long a monitor may take to show the trace table's own marker (a
/// bound for a stuck nft on a loaded machine, not a timing the trace needs).
const MARKER_WAIT: Duration = Duration::from_secs(30);

/// Traces what `send` sends through `namespaces` (by role, in path order):
/// `matchers` are the nft matches for the probe (`ip daddr 10.0.0.2 meta
/// l4proto icmp`) and for the outer packets that carry it, one rule each.
pub fn trace(
    namespaces: &[(String, &File)],
    matchers: &[String],
    send: impl FnOnce(),
) -> Result<Traced, String> {
    let table = table_name();
    let tables = TraceTables {
        table: table.clone(),
        namespaces: Vec::new(),
    };
    let mut tables = tables;
    let rules: String = matchers
        .iter()
        .map(|m| format!("\t\t{m} meta nftrace set 1\n"))
        .collect();
    let ruleset = format!(
        "table inet {table} {{\n\
         \tchain pre {{ type filter hook prerouting priority -2147483647; policy accept;\n\
         {rules}\t}}\n\
         \tchain out {{ type filter hook output priority -2147483647; policy accept;\n\
         {rules}\t}}\n}}\n"
    );
    for (role, ns) in namespaces {
        nft::load(Path::new("nft"), Some(ns), &ruleset)
            .map_err(|e| format!("{role}: cannot add the trace table: {e}"))?;
        tables.namespaces.push((role.clone(), ns));
    }
    let mut monitors = start_monitors(namespaces)?;
    marker(&mut monitors, namespaces, &table, "ready", &mut Vec::new())?;
    send();
    let mut events = Vec::new();
    marker(&mut monitors, namespaces, &table, "done", &mut events)?;
    drop(monitors);
    drop(tables);
    let mut traced = Traced::default();
    for (i, (role, _)) in namespaces.iter().enumerate() {
        let parsed = events
            .iter()
            .filter(|(n, _)| *n == i)
            .filter_map(|(_, line)| parse(role, line));
        for e in parsed {
            if e.table != table {
                traced.events.push(e);
            } else if matches!(e.what, EventKind::Packet(_)) && !traced.seen.contains(role) {
                traced.seen.push(role.clone());
            }
        }
    }
    Ok(traced)
}

/// What the firewall trace saw.
#[derive(Clone, Debug, Default)]
pub struct Traced {
    /// Every rule, policy and verdict outside the trace's own table, in
    /// path order.
    pub events: Vec<Event>,
    /// The namespaces whose own trace chain saw the probe (it got there).
    pub seen: Vec<String>,
}

fn start_monitors(namespaces: &[(String, &File)]) -> Result<Monitors, String> {
    let (tx, rx) = mpsc::channel();
    let mut monitors = Monitors {
        children: Vec::new(),
        lines: rx,
    };
    for (i, (role, ns)) in namespaces.iter().enumerate() {
        let mut cmd = Command::new("nft");
        cmd.args(["-a", "monitor"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child =
            netns::spawn_in(ns, &mut cmd).map_err(|e| format!("{role}: nft monitor: {e}"))?;
        let out = child.stdout.take();
        monitors.children.push(child);
        let tx = tx.clone();
        if let Some(out) = out {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send((i, line)).is_err() {
                        break;
                    }
                }
            });
        }
    }
    Ok(monitors)
}

/// How long to wait for a marker before adding it again: a monitor that
/// had not subscribed yet when a marker chain was added never prints it.
const MARKER_AGAIN: Duration = Duration::from_millis(250);

/// Adds the chain `name` to the trace table in every namespace and waits
/// until every monitor printed it; lines seen meanwhile go to `seen`. A
/// monitor that has not printed it after [`MARKER_AGAIN`] gets another
/// (`name2`, `name3`, …): it may have started listening after the first.
fn marker(
    monitors: &mut Monitors,
    namespaces: &[(String, &File)],
    table: &str,
    name: &str,
    seen: &mut Vec<(usize, String)>,
) -> Result<(), String> {
    let wanted = format!("add chain inet {table} {name}");
    let mut waiting: Vec<bool> = vec![true; namespaces.len()];
    let deadline = Instant::now() + MARKER_WAIT;
    for attempt in 1.. {
        let chain = if attempt == 1 {
            name.to_string()
        } else {
            format!("{name}{attempt}")
        };
        for ((role, ns), _) in namespaces.iter().zip(&waiting).filter(|(_, w)| **w) {
            nft::run(
                Path::new("nft"),
                Some(ns),
                &["add", "chain", "inet", table, &chain],
                None,
            )
            .map_err(|e| format!("{role}: nft add chain: {e}"))?;
        }
        let again = (Instant::now() + MARKER_AGAIN).min(deadline);
        while waiting.iter().any(|w| *w) {
            let left = again.saturating_duration_since(Instant::now());
            match monitors.lines.recv_timeout(left) {
                Ok((i, line)) if line.starts_with(&wanted) => waiting[i] = false,
                Ok(other) => seen.push(other),
                Err(_) => break,
            }
        }
        if !waiting.iter().any(|w| *w) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    let late: Vec<&str> = namespaces
        .iter()
        .zip(&waiting)
        .filter(|(_, w)| **w)
        .map(|((r, _), _)| r.as_str())
        .collect();
    Err(format!(
        "nft monitor in {} did not show the trace table's `{name}` chain within {}s",
        late.join(", "),
        MARKER_WAIT.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drop_rule_line_names_table_chain_handle_and_verdict() {
        let e = parse(
            "node1",
            "trace id 4bf2bf7f ip filt forward rule ip daddr 10.244.2.0/24 counter packets 0 bytes 0 drop # handle 2 (verdict drop)",
        )
        .expect("a trace line");
        assert_eq!(
            (e.family.as_str(), e.table.as_str(), e.chain.as_str()),
            ("ip", "filt", "forward")
        );
        assert_eq!(
            e.what,
            EventKind::Rule {
                text: "ip daddr 10.244.2.0/24 counter packets 0 bytes 0 drop".into(),
                handle: Some(2),
                verdict: "drop".into()
            }
        );
        assert!(e.kills());
        let policy = parse("n", "trace id 1 inet t c policy drop ").expect("policy");
        assert!(policy.kills());
        assert_eq!(parse("n", "add chain inet t ready # handle 3"), None);
        assert!(!parse("n", "trace id 1 inet t c policy accept")
            .expect("policy")
            .kills());
    }
}
