//! The firewall's own account of one packet: nftables' trace. In each
//! namespace the packet crosses, a table of the trace's own
//! (`inet cnilab_trace_<pid>_<n>`, one per trace, a chain on every hook at
//! the earliest priority) sets `meta nftrace set 1` for packets that match
//! the probe; `nft -a monitor` in the same namespace prints every rule the
//! packet meets with table, chain, handle and verdict (iptables-nft rules
//! are nft rules and show the same way). The table is removed afterwards,
//! also when the trace fails ([`TraceTables`] on drop). The rules match the
//! probe by [`matcher`] (its destinations, protocol and ports) and the
//! VXLAN outer packets that carry it by [`outer_matcher`].
//!
//! Traces may run at once (`lab check` runs its traces side by side): a
//! monitor prints every traced packet of its namespace, so a trace keeps
//! only the events of packets (by nftables' trace id) that a rule of its
//! own table matched. Two traces whose probes both tables would match (same
//! destination and protocol) must not run at once; the caller orders them.
//!
//! No sleeps decide anything: each monitor is known to listen once it
//! printed the trace table's own `ready` chain being added (one that
//! started listening after it was added gets another, `ready2`, …), and to
//! have printed every trace event of the probe once it printed the `done`
//! chain (netlink delivers a socket's messages in order).

use super::probe::Sent;
use super::Proto;
use cnilab_net::{netns, nft};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The name of one trace's own table in every namespace it touches: one
/// per trace (process id and a count), so that traces running at once never
/// share a table.
pub fn table_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{TABLE_PREFIX}{}_{n}", std::process::id())
}

/// Every trace table starts with this (a test checks none is left).
pub const TABLE_PREFIX: &str = "cnilab_trace_";

/// The pid in a trace table's name (`cnilab_trace_<pid>_<n>`).
fn table_pid(table: &str) -> Option<u32> {
    let (pid, n) = table.strip_prefix(TABLE_PREFIX)?.split_once('_')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// `cnilab sweep`: removes the trace tables of processes that are gone (a
/// trace killed with SIGKILL on a live node) from the machine's own
/// namespace and every one named under `/run/netns`. Returns them as
/// `<namespace>: <family> <table>`.
pub fn sweep(alive: impl Fn(u32) -> bool) -> Vec<String> {
    let mut places: Vec<(String, Option<File>)> = vec![("host".into(), None)];
    let named = std::fs::read_dir(netns::NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten();
    for entry in named {
        if let Ok(f) = netns::open_network_namespace(entry.path()) {
            places.push((entry.file_name().to_string_lossy().into_owned(), Some(f)));
        }
    }
    let mut removed = Vec::new();
    for (name, file) in &places {
        let Ok(listed) = nft::run(Path::new("nft"), file.as_ref(), &["list", "tables"], None)
        else {
            continue;
        };
        for line in listed.lines() {
            let mut words = line.split_whitespace();
            let (Some("table"), Some(family), Some(table)) =
                (words.next(), words.next(), words.next())
            else {
                continue;
            };
            if table_pid(table).is_some_and(|pid| !alive(pid))
                && nft::run(
                    Path::new("nft"),
                    file.as_ref(),
                    &["delete", "table", family, table],
                    None,
                )
                .is_ok()
            {
                removed.push(format!("{name}: {family} {table}"));
            }
        }
    }
    removed
}

/// One line of `nft monitor trace` that is not the trace's own table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The namespace (by role) it was seen in.
    pub namespace: String,
    /// nftables' id of the packet (the same for one packet within one
    /// namespace; another namespace may give it another).
    pub id: String,
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
    let id = words.next()?.to_string();
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
        id,
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
            for family in ["inet", "bridge", "netdev"] {
                let _ = nft::run(
                    Path::new("nft"),
                    Some(ns),
                    &["delete", "table", family, &self.table],
                    None,
                );
            }
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

/// The nft match for the probe: any of its destinations (before and after
/// a DNAT), the protocol and any of its ports. `dsts` is never empty.
pub fn matcher(dsts: &[IpAddr], proto: Proto, ports: &[u16]) -> String {
    let v4 = dsts.first().is_none_or(|d| d.is_ipv4());
    let family = if v4 { "ip" } else { "ip6" };
    let set = |items: Vec<String>| match items.as_slice() {
        [one] => one.clone(),
        [] => "0".to_string(),
        _ => format!("{{ {} }}", items.join(", ")),
    };
    let mut dsts: Vec<String> = dsts.iter().map(IpAddr::to_string).collect();
    dsts.dedup();
    let mut ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    ports.dedup();
    let l4 = match (proto, v4) {
        (Proto::Icmp, true) => "meta l4proto icmp icmp type echo-request".to_string(),
        (Proto::Icmp, false) => "meta l4proto ipv6-icmp icmpv6 type echo-request".to_string(),
        (Proto::Tcp, _) => format!("tcp dport {}", set(ports)),
        (Proto::Udp, _) => format!("udp dport {}", set(ports)),
    };
    format!("{family} daddr {} {l4}", set(dsts))
}

/// The nft match for a VXLAN outer packet that carries the probe: from
/// `local` (when known) to the remote VTEP's UDP `port`.
pub fn outer_matcher((local, vtep, port): (Option<IpAddr>, IpAddr, u16)) -> String {
    let family = if vtep.is_ipv4() { "ip" } else { "ip6" };
    let from = local
        .map(|l| format!("{family} saddr {l} "))
        .unwrap_or_default();
    format!("{from}{family} daddr {vtep} udp dport {port}")
}

/// Traces what `send` sends through `namespaces` (by role, in path order):
/// `matchers` are the nft matches for the probe (`ip daddr 10.0.0.2 meta
/// l4proto icmp`) and for the outer packets that carry it, one rule each;
/// `after` runs once the probe's fate is known. `dies_at`: the index of the
/// namespace where the kernel's routes say the packet dies, when it is not
/// the first: once the probe has passed that namespace's prerouting
/// untouched, the probe's answer is not waited for (see [`certain`]).
/// `devices`: per namespace, the devices the probe enters it by, whose
/// netdev ingress chains are traced too.
pub fn trace(
    namespaces: &[(String, &File)],
    devices: &[Vec<String>],
    matchers: &[String],
    dies_at: Option<usize>,
    send: impl FnOnce() -> Sent,
    after: impl FnOnce(),
) -> Result<Traced, String> {
    let table = table_name();
    let tables = TraceTables {
        table: table.clone(),
        namespaces: Vec::new(),
    };
    let mut tables = tables;
    let ruleset = ruleset(&table, matchers);
    for (role, ns) in namespaces {
        nft::load(Path::new("nft"), Some(ns), &ruleset)
            .map_err(|e| format!("{role}: cannot add the trace table: {e}"))?;
        tables.namespaces.push((role.clone(), ns));
    }
    // The bridge and netdev families' hooks, best effort (a kernel without
    // them traces the rest).
    for (i, (_, ns)) in namespaces.iter().enumerate() {
        let devices = devices.get(i).map(Vec::as_slice).unwrap_or_default();
        for early in early_rulesets(&table, matchers, devices) {
            let _ = nft::load(Path::new("nft"), Some(ns), &early);
        }
    }
    let mut monitors = start_monitors(namespaces)?;
    marker(&mut monitors, namespaces, &table, "ready", &mut Vec::new())?;
    let mut events = Vec::new();
    let sent = send();
    wait(&monitors, sent, (&table, dies_at), &mut events);
    after();
    marker(&mut monitors, namespaces, &table, "done", &mut events)?;
    drop(monitors);
    drop(tables);
    let mut traced = Traced::default();
    for (i, (role, _)) in namespaces.iter().enumerate() {
        let parsed: Vec<Event> = events
            .iter()
            .filter(|(n, _)| *n == i)
            .filter_map(|(_, line)| parse(role, line))
            .collect();
        // The probe's packets here: those one of this trace's own rules
        // matched (a packet another trace marked crosses this table's
        // chains too, and shows in them, but matches none of its rules).
        let ours: Vec<&str> = parsed
            .iter()
            .filter(|e| e.table == table && matches!(e.what, EventKind::Rule { .. }))
            .map(|e| e.id.as_str())
            .collect();
        if !ours.is_empty() {
            traced.seen.push(role.clone());
        }
        let theirs = parsed
            .iter()
            .filter(|e| ours.contains(&e.id.as_str()) && !e.table.starts_with(TABLE_PREFIX));
        traced.events.extend(theirs.cloned());
    }
    Ok(traced)
}

/// The trace's own table: at the earliest priority of every hook, a chain
/// whose one rule marks the probe for nftables' trace. Every hook has one,
/// so that each packet of the probe is claimed by a rule of this table in
/// every hook it passes (what [`trace`] keeps of the events).
fn ruleset(table: &str, matchers: &[String]) -> String {
    let mut ruleset = format!("table inet {table} {{\n");
    for (name, hook) in [
        ("pre", "prerouting"),
        ("input", "input"),
        ("forward", "forward"),
        ("out", "output"),
        ("post", "postrouting"),
    ] {
        ruleset.push_str(&chain(name, hook, "-2147483647", matchers));
    }
    // The end of prerouting: a probe seen here was not rewritten there.
    ruleset.push_str(&chain("late", "prerouting", "2147483647", matchers));
    ruleset.push_str("}\n");
    ruleset
}

/// The trace's own tables in the families whose hooks come before inet's:
/// bridge prerouting (a bridge-family filter's drop) and netdev ingress on
/// each of `devices` (a drop on a device's ingress hook), so their rules
/// show in the trace with their handles.
fn early_rulesets(table: &str, matchers: &[String], devices: &[String]) -> Vec<String> {
    const FIRST: &str = "-2147483647";
    let bridge = format!(
        "table bridge {table} {{\n{}}}\n",
        chain("pre", "prerouting", FIRST, matchers)
    );
    let ingress: String = devices
        .iter()
        .enumerate()
        .map(|(i, dev)| {
            let hook = format!("ingress device \"{dev}\"");
            chain(&format!("in{i}"), &hook, FIRST, matchers)
        })
        .collect();
    let mut out = vec![bridge];
    if !ingress.is_empty() {
        out.push(format!("table netdev {table} {{\n{ingress}}}\n"));
    }
    out
}

fn chain(name: &str, hook: &str, priority: &str, matchers: &[String]) -> String {
    let rules: String = matchers
        .iter()
        .map(|m| format!("\t\t{m} meta nftrace set 1\n"))
        .collect();
    format!("\tchain {name} {{ type filter hook {hook} priority {priority}; policy accept;\n{rules}\t}}\n")
}

/// How often the probe is asked whether it ended while no monitor prints.
const POLL: Duration = Duration::from_millis(10);

/// Waits until the probe ends by itself or, with `dies_at`, until its
/// death there is [`certain`]; the monitors' lines meanwhile go to `seen`.
fn wait(
    monitors: &Monitors,
    mut sent: Sent,
    (table, dies_at): (&str, Option<usize>),
    seen: &mut Vec<(usize, String)>,
) {
    while !sent.finished() {
        match monitors.lines.recv_timeout(POLL) {
            Ok(line) => {
                let at = line.0;
                seen.push(line);
                if dies_at == Some(at) && certain(seen, at, table) {
                    return;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(POLL),
        }
    }
}

/// True when the monitor of namespace `at` showed a packet of the probe at
/// the end of prerouting (this trace's `late` chain) with no rule of any
/// other table matched before: it reached the namespace where the
/// kernel's routes drop it, unchanged (no DNAT, no mark), and whatever
/// happens to it there or after decides nothing (the routing death there
/// stands; what only comes after it is not read). Every event of the
/// namespaces before is already on its monitor's socket.
fn certain(seen: &[(usize, String)], at: usize, table: &str) -> bool {
    let events: Vec<Event> = seen
        .iter()
        .filter(|(i, _)| *i == at)
        .filter_map(|(_, line)| parse("", line))
        .collect();
    events.iter().enumerate().any(|(i, e)| {
        e.table == table
            && e.chain == "late"
            && matches!(e.what, EventKind::Rule { .. })
            && !events[..i].iter().any(|o| {
                o.id == e.id
                    && !o.table.starts_with(TABLE_PREFIX)
                    && matches!(o.what, EventKind::Rule { .. })
            })
    })
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

/// The events of the probe itself, without those of the VXLAN outer
/// packets that carry it (a NAT rule an outer packet met rewrites no
/// address of the probe). An event belongs to the packet whose `packet:`
/// line came last in its namespace (nftables prints each chain's packet
/// line before its rules).
pub(super) fn inner(
    events: &[Event],
    outer: &[(Option<std::net::IpAddr>, std::net::IpAddr, u16)],
) -> Vec<Event> {
    let is_outer = |p: &str| {
        outer.iter().any(|(_, vtep, port)| {
            p.contains(&format!("daddr {vtep} ")) && p.contains(&format!("udp dport {port}"))
        })
    };
    let mut current: std::collections::BTreeMap<&str, bool> = Default::default();
    events
        .iter()
        .filter(|e| {
            if let EventKind::Packet(p) = &e.what {
                current.insert(&e.namespace, is_outer(p));
            }
            !current.get(e.namespace.as_str()).copied().unwrap_or(false)
        })
        .cloned()
        .collect()
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

    /// The probe's fate is certain where routing drops it only once it
    /// passed the end of prerouting there, and no other table's rule
    /// matched it on the way (a DNAT or a mark would change the route).
    #[test]
    fn a_death_is_certain_only_after_an_untouched_prerouting() {
        let t = "cnilab_trace_1_1";
        let line = |i: usize, l: String| (i, l);
        let pre = format!(
            "trace id aa inet {t} pre rule ip daddr 10.0.0.2 meta nftrace set 1 (verdict continue)"
        );
        let late = format!("trace id aa inet {t} late rule ip daddr 10.0.0.2 meta nftrace set 1 (verdict continue)");
        let dnat = "trace id aa ip nat PREROUTING rule ip daddr 10.0.0.2 dnat to 10.0.0.9 (verdict accept)";
        let other = "trace id bb ip nat PREROUTING rule ip daddr 10.0.0.7 dnat to 10.0.0.9 (verdict accept)";
        let clean = [line(1, pre.clone()), line(1, late.clone())];
        assert!(certain(&clean, 1, t));
        // Seen in another namespace than the one routing drops it in.
        assert!(!certain(&clean, 2, t));
        // Not yet at the end of prerouting.
        assert!(!certain(&clean[..1], 1, t));
        let rewritten = [
            line(1, pre.clone()),
            line(1, dnat.into()),
            line(1, late.clone()),
        ];
        assert!(!certain(&rewritten, 1, t));
        // Another packet's rule says nothing of this one.
        let unrelated = [line(1, pre), line(1, other.into()), line(1, late)];
        assert!(certain(&unrelated, 1, t));
    }
}
