//! The kernel's own account of where a probe went and why it died, read
//! through tracefs without eBPF. A tracefs instance of the process's own
//! (`instances/cnilab-<pid>-<n>`: its buffer, events and filters are
//! separate from every other user of tracing) records `net:net_dev_queue`
//! and `net:netif_receive_skb` (device name, skb address, length) filtered
//! on the lengths of the probes in flight, and `skb:kfree_skb` (skb
//! address, the dropping function, the drop reason) filtered on their
//! protocols. Traces side by side share it: each writes a marker of its
//! own into it before its probe leaves, and reads what came after its
//! marker with its probe's length. The probe's skbs are followed device by
//! device from the source namespace; the first of them the kernel frees
//! before the destination receives it is the death: namespace, device,
//! reason and function.
//!
//! The events are global (every namespace): a device name alone is
//! ambiguous, so each device is placed by the caller ([`follow`] takes a
//! placer), which knows the namespaces the walk crossed and their veth
//! peers. The instance is made by the first trace and removed when the
//! last [`Instance`] and [`Hold`] drop (also after a panic), so a batch of
//! traces that holds it ([`hold`]) makes and removes it once; `cnilab
//! sweep` removes those of dead processes ([`sweep`]).

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Every instance's name starts with this, then the pid (`sweep` reads it).
pub const INSTANCE_PREFIX: &str = "cnilab-";

/// Where tracefs is looked for, in order (the first is where it is mounted
/// when it is nowhere).
const ROOTS: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The three events, as `events/<system>/<name>`.
const EVENTS: [&str; 3] = [
    "skb/kfree_skb",
    "net/netif_receive_skb",
    "net/net_dev_queue",
];

/// The per-CPU buffer of the instance, in KiB (a probe makes a few dozen
/// events; the buffer is emptied whenever no probe is in flight).
const BUFFER_KB: &str = "1024";

/// How much longer a packet is queued on a device than it is received
/// (its Ethernet header).
const ETHERNET: u32 = 14;

/// What the kernel offers: tracefs's root and the drop reasons' names by
/// value (read from `kfree_skb`'s format), or why drop reasons are skipped.
#[derive(Debug)]
pub struct Support {
    pub root: PathBuf,
    reasons: BTreeMap<u32, String>,
}

/// The environment that turns drop reasons off (a host where tracefs must
/// not be touched; and to measure what they cost).
pub const OFF: (&str, &str) = ("CNILAB_DROP_REASONS", "off");

/// Whether drop reasons can be read here, asked once per process: the
/// reason they cannot is a SKIP, said once by the caller.
pub fn support() -> &'static Result<Support, String> {
    static SUPPORT: OnceLock<Result<Support, String>> = OnceLock::new();
    SUPPORT.get_or_init(|| {
        if std::env::var(OFF.0).is_ok_and(|v| v == OFF.1) {
            return Err(format!("turned off ({}={})", OFF.0, OFF.1));
        }
        let root = tracefs()?;
        let format = std::fs::read_to_string(root.join("events/skb/kfree_skb/format"))
            .map_err(|e| format!("tracefs has no skb:kfree_skb event: {e}"))?;
        if !format.contains(" reason;") {
            return Err(
                "the kernel has no drop reasons (skb:kfree_skb has no `reason` field; \
                 kernels before 5.17)"
                    .into(),
            );
        }
        for e in &EVENTS[1..] {
            if !root.join("events").join(e).join("format").exists() {
                return Err(format!("tracefs has no {e} event"));
            }
        }
        Ok(Support {
            root,
            reasons: reason_names(&format),
        })
    })
}

/// tracefs's root: where it is mounted, else mounted at the first of
/// [`ROOTS`] (as root; the kernel's usual place, left mounted as boot
/// would have it).
fn tracefs() -> Result<PathBuf, String> {
    if let Some(r) = ROOTS.iter().find(|r| Path::new(r).join("events").is_dir()) {
        return Ok(PathBuf::from(r));
    }
    let at = Path::new(ROOTS[0]);
    nix::mount::mount(
        Some("tracefs"),
        at,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| {
        format!(
            "tracefs is not mounted and cannot be mounted at {}: {e}",
            at.display()
        )
    })?;
    Ok(at.to_path_buf())
}

/// The reasons' names by value, from the `__print_symbolic` of the format
/// (`{ 12, "NETFILTER_DROP" }`): for traces printed with raw fields.
fn reason_names(format: &str) -> BTreeMap<u32, String> {
    let mut names = BTreeMap::new();
    for part in format.split('{').skip(1) {
        let Some((value, rest)) = part.split_once(',') else {
            continue;
        };
        let name = rest.split('"').nth(1);
        if let (Ok(v), Some(n)) = (value.trim().parse::<u32>(), name) {
            names.insert(v, n.to_string());
        }
    }
    names
}

/// Who uses the process's instance, and the instance while anyone does.
struct Shared {
    /// Batches of traces holding it ([`Hold`]).
    holds: usize,
    open: Option<Open>,
}

/// The process's instance.
struct Open {
    dir: PathBuf,
    /// Traces recording in it.
    traces: usize,
    /// Its events are enabled (after the first trace set the filters).
    enabled: bool,
    /// The lengths and protocols its filters pass: those of every trace
    /// since it was made.
    lens: BTreeSet<u32>,
    protocols: BTreeSet<u16>,
}

static SHARED: Mutex<Shared> = Mutex::new(Shared {
    holds: 0,
    open: None,
});

fn shared() -> MutexGuard<'static, Shared> {
    SHARED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes the instance once no trace records in it and no batch holds it.
fn close_if_unused(sh: &mut Shared) {
    let unused = sh.holds == 0 && sh.open.as_ref().is_some_and(|o| o.traces == 0);
    let Some(open) = sh.open.take_if(|_| unused) else {
        return;
    };
    if std::fs::remove_dir(&open.dir).is_err() {
        // Busy while it records: stopped, then removed.
        let _ = std::fs::write(open.dir.join("tracing_on"), "0");
        let _ = std::fs::remove_dir(&open.dir);
    }
}

/// Keeps the instance, once a trace has made it, until this drops: the
/// traces of one batch share one instance instead of each making and
/// removing its own (about 50 ms each, serialized by the kernel).
pub struct Hold(());

/// Holds the instance for a batch of traces (nothing is made here).
pub fn hold() -> Hold {
    shared().holds += 1;
    Hold(())
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut sh = shared();
        sh.holds = sh.holds.saturating_sub(1);
        close_if_unused(&mut sh);
    }
}

/// One trace's recording in the process's instance: what comes after its
/// marker, of its probe's length.
pub struct Instance {
    dir: PathBuf,
    marker: String,
    len: u32,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let mut sh = shared();
        if let Some(open) = sh.open.as_mut() {
            open.traces = open.traces.saturating_sub(1);
            if open.traces == 0 {
                // Nothing in flight and everything recorded read: the
                // next trace starts with an empty buffer.
                let _ = std::fs::write(open.dir.join("trace"), "");
            }
        }
        close_if_unused(&mut sh);
    }
}

impl Instance {
    /// A recording of the probe's device crossings (`len`: its size from
    /// the IP header on, as received; queued on a device it is 14 more,
    /// with its Ethernet header) and every drop of `protocol` (0x0800,
    /// 0x86dd), from now on.
    pub fn create(s: &Support, len: u32, protocol: u16) -> Result<Instance, String> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut sh = shared();
        if sh.open.is_none() {
            sh.open = Some(make(s, n)?);
        }
        let result = match sh.open.as_mut() {
            Some(open) => open.record(len, protocol, n),
            None => Err("the instance is gone".into()),
        };
        if result.is_err() {
            close_if_unused(&mut sh);
        }
        result
    }

    /// What was recorded of the probe so far, as [`Record`]s in time order.
    pub fn records(&self, s: &Support) -> Result<Vec<Record>, String> {
        let path = self.dir.join("trace");
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let after = after_marker(&text, &self.marker).ok_or_else(|| {
            format!(
                "the kernel's events of this trace were overwritten in {} \
                 (too many drops elsewhere at once)",
                path.display()
            )
        })?;
        let mut symbols = Symbols::new(&s.reasons);
        Ok(after
            .lines()
            .filter_map(|l| parse(l, &mut symbols))
            .filter(|r| of_length(r, self.len))
            .collect())
    }
}

impl Open {
    /// Widens the filters to the probe's length and protocol, enables the
    /// events, and marks where trace `n`'s recording starts.
    fn record(&mut self, len: u32, protocol: u16, n: u64) -> Result<Instance, String> {
        let set = |file: &str, value: &str| {
            let path = self.dir.join(file);
            std::fs::write(&path, value).map_err(|e| format!("{}: {e}", path.display()))
        };
        let new_len = !self.lens.contains(&len);
        let new_protocol = !self.protocols.contains(&protocol);
        let mut lens = self.lens.clone();
        lens.insert(len);
        let mut protocols = self.protocols.clone();
        protocols.insert(protocol);
        if new_len || new_protocol {
            let either = |extra: u32| -> String {
                let terms: Vec<String> = lens
                    .iter()
                    .map(|l| format!("len == {}", l + extra))
                    .collect();
                terms.join(" || ")
            };
            set("events/net/netif_receive_skb/filter", &either(0))?;
            // Devices without an Ethernet header (tunnels of layer 3)
            // queue it without those 14 bytes: not seen there.
            set("events/net/net_dev_queue/filter", &either(ETHERNET))?;
            let terms: Vec<String> = protocols
                .iter()
                .map(|p| format!("protocol == {p}"))
                .collect();
            set("events/skb/kfree_skb/filter", &terms.join(" || "))?;
        }
        if !self.enabled {
            for e in EVENTS {
                set(&format!("events/{e}/enable"), "1")?;
            }
        }
        let marker = format!("cnilab-trace-{n}");
        set("trace_marker", &marker)?;
        self.enabled = true;
        self.lens = lens;
        self.protocols = protocols;
        self.traces += 1;
        Ok(Instance {
            dir: self.dir.clone(),
            marker,
            len,
        })
    }
}

/// Makes the process's instance: its buffer and clock (the filters and
/// events come with the first trace).
fn make(s: &Support, n: u64) -> Result<Open, String> {
    let name = format!("{INSTANCE_PREFIX}{}-{n}", std::process::id());
    let dir = s.root.join("instances").join(&name);
    std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    let buffer = dir.join("buffer_size_kb");
    if let Err(e) = std::fs::write(&buffer, BUFFER_KB) {
        let _ = std::fs::remove_dir(&dir);
        return Err(format!("{}: {e}", buffer.display()));
    }
    // The default clock (`local`) is per CPU and not in step across them:
    // a probe sent on after ARP resolves (on another CPU) could sort before
    // the crossings that led to it. A kernel without it keeps the default.
    let _ = std::fs::write(dir.join("trace_clock"), "global");
    Ok(Open {
        dir,
        traces: 0,
        enabled: false,
        lens: BTreeSet::new(),
        protocols: BTreeSet::new(),
    })
}

/// The text after the line of `marker` (`None`: the marker is not there:
/// overwritten).
fn after_marker<'t>(text: &'t str, marker: &str) -> Option<&'t str> {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        at += line.len();
        if line
            .trim_end()
            .ends_with(&format!("tracing_mark_write: {marker}"))
        {
            return Some(&text[at..]);
        }
    }
    None
}

/// A record of the probe of `len` bytes (a drop: any, matched later by
/// its skb).
fn of_length(r: &Record, len: u32) -> bool {
    match r {
        Record::Device {
            rx: true, len: l, ..
        } => *l == len,
        Record::Device { len: l, .. } => *l == len + ETHERNET,
        Record::Drop { .. } => true,
    }
}

/// One event of the probe's kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Received on (`rx`) or queued on a device, `len` bytes long.
    Device {
        rx: bool,
        dev: String,
        skb: String,
        len: u32,
    },
    /// Freed by the kernel as a drop.
    Drop {
        skb: String,
        reason: String,
        function: String,
    },
}

/// What turns a line's numbers into names: the reasons' names, and the
/// kernel's symbols (read from `/proc/kallsyms` only when a raw address
/// comes).
pub struct Symbols<'a> {
    reasons: &'a BTreeMap<u32, String>,
    kallsyms: Option<Vec<(u64, String)>>,
}

impl<'a> Symbols<'a> {
    pub fn new(reasons: &'a BTreeMap<u32, String>) -> Symbols<'a> {
        Symbols {
            reasons,
            kallsyms: None,
        }
    }

    /// The function an address is in (`None`: not a kernel text address,
    /// or a hashed pointer).
    fn function(&mut self, addr: u64) -> Option<String> {
        let table = self.kallsyms.get_or_insert_with(|| {
            let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
            kallsyms(&text)
        });
        let i = table.partition_point(|(a, _)| *a <= addr);
        (i > 0).then(|| table[i - 1].1.clone())
    }
}

/// The text symbols of `/proc/kallsyms`, by address (zeros: hidden).
fn kallsyms(text: &str) -> Vec<(u64, String)> {
    let mut table: Vec<(u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let addr = u64::from_str_radix(w.next()?, 16).ok()?;
            let kind = w.next()?;
            let name = w.next()?;
            (addr != 0 && matches!(kind, "t" | "T")).then(|| (addr, name.to_string()))
        })
        .collect();
    table.sort();
    table
}

/// One line of an instance's `trace` (`None`: a comment or another
/// event). Both forms the kernel prints: the event's own format
/// (`dev=eth0 skbaddr=… len=84`, `location=nft_do_chain+0x46f/0x690
/// reason: NETFILTER_DROP`) and raw fields (`name=eth0`, `len=0x54 (84)`,
/// `reason=0xc (12)`); a location printed as an address is resolved
/// through the kernel's symbols.
pub fn parse(line: &str, symbols: &mut Symbols) -> Option<Record> {
    let (event, rest) = ["net_dev_queue", "netif_receive_skb", "kfree_skb"]
        .iter()
        .find_map(|e| line.split_once(&format!(": {e}: ")).map(|(_, r)| (*e, r)))?;
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    let words: Vec<&str> = rest.split_whitespace().collect();
    for (i, w) in words.iter().enumerate() {
        if let Some((k, v)) = w.split_once('=') {
            // Raw fields print `0x54 (84)`: the decimal in brackets.
            let decimal = words
                .get(i + 1)
                .and_then(|n| n.strip_prefix('(')?.strip_suffix(')'));
            let v = match decimal {
                Some(d) if k != "skbaddr" && k != "location" => d,
                _ => v,
            };
            fields.insert(k, v);
        } else if *w == "reason:" {
            fields.insert("reason", words.get(i + 1).copied().unwrap_or(""));
        }
    }
    let skb = fields.get("skbaddr")?.trim_start_matches("0x").to_string();
    if event != "kfree_skb" {
        let dev = fields.get("dev").or_else(|| fields.get("name"))?;
        return Some(Record::Device {
            rx: event == "netif_receive_skb",
            dev: dev.to_string(),
            skb,
            len: fields.get("len")?.parse().ok()?,
        });
    }
    let reason = fields.get("reason").copied().unwrap_or("?");
    let reason = match reason.parse::<u32>() {
        Ok(v) => symbols
            .reasons
            .get(&v)
            .cloned()
            .unwrap_or_else(|| format!("reason {v}")),
        Err(_) => reason.to_string(),
    };
    let location = fields.get("location").copied().unwrap_or("?");
    Some(Record::Drop {
        skb,
        reason,
        function: function(location, symbols),
    })
}

/// `nft_do_chain+0x46f/0x690` → `nft_do_chain`; an address → its symbol
/// (kept as printed when it resolves to nothing; a hashed pointer, as a
/// kernel that prints the location with `%p` shows it, is said to be one).
fn function(location: &str, symbols: &mut Symbols) -> String {
    let hex = location.trim_start_matches("0x");
    let is_address = !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit());
    if is_address {
        let kernel_text = u64::from_str_radix(hex, 16).ok().filter(|a| *a >> 63 == 1);
        return match kernel_text {
            Some(a) => symbols.function(a).unwrap_or_else(|| location.to_string()),
            None => format!("hashed location {location}"),
        };
    }
    location.split('+').next().unwrap_or(location).to_string()
}

/// One device the probe crossed, in the namespace it is in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceHop {
    /// The namespace by role (`?`: none the trace knows).
    pub namespace: String,
    pub device: String,
    /// `in` (received) or `out` (queued to send).
    pub direction: &'static str,
}

/// Where the kernel dropped the probe and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelDrop {
    pub namespace: String,
    pub device: String,
    /// The kernel's drop reason (`NETFILTER_DROP`, `IP_RPFILTER`, …).
    pub reason: String,
    /// The function that dropped it.
    pub function: String,
}

impl KernelDrop {
    /// `dropped in node2 on eth0: NETFILTER_DROP (nft_do_chain)`.
    pub fn describe(&self) -> String {
        format!(
            "dropped in {} on {}: {} ({})",
            self.namespace, self.device, self.reason, self.function
        )
    }
}

/// What the kernel showed of the probe.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Followed {
    pub devices: Vec<DeviceHop>,
    pub drop: Option<KernelDrop>,
    /// The destination namespace received it.
    pub arrived: bool,
    /// Where the kernel dropped its answer on the way back.
    pub reply_drop: Option<KernelDrop>,
}

/// Follows the probe's skbs through `records`: from the first queued on a
/// device of `from_ns` until `to_ns` receives one or the kernel drops one;
/// once it arrived, its answer the same way back (an echo reply, a SYN-ACK:
/// the same length), until `from_ns` receives it or the kernel drops it
/// (`reply_drop`). `place(previous, device, rx, back)` names the namespace
/// of a device (by the previous crossing: a veth's peer, the same
/// namespace, the next on the walk, or the one before it on the way
/// `back`), `None` when it is in none the trace knows.
pub fn follow(
    records: &[Record],
    (from_ns, to_ns): (&str, &str),
    place: impl Fn(Option<&DeviceHop>, &str, bool, bool) -> Option<String>,
) -> Followed {
    let (mut out, at) = follow_one(records, (from_ns, to_ns), |p, d, rx| place(p, d, rx, false));
    if out.arrived {
        let rest = records.get(at + 1..).unwrap_or_default();
        let (back, _) = follow_one(rest, (to_ns, from_ns), |p, d, rx| place(p, d, rx, true));
        out.reply_drop = back.drop;
    }
    out
}

/// One way of [`follow`], and the index of the record it stopped at. An
/// skb not yet followed joins when it is received where the placer puts
/// it (a decapsulated or cloned packet of the same length).
fn follow_one(
    records: &[Record],
    (from_ns, to_ns): (&str, &str),
    place: impl Fn(Option<&DeviceHop>, &str, bool) -> Option<String>,
) -> (Followed, usize) {
    let mut out = Followed::default();
    let mut skbs: BTreeSet<&str> = BTreeSet::new();
    let mut last: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        match r {
            Record::Device { rx, dev, skb, .. } => {
                let ns = place(out.devices.last(), dev, *rx);
                let joins = match (out.devices.last(), &ns) {
                    (None, Some(ns)) => !*rx && ns == from_ns,
                    (Some(_), Some(_)) => *rx,
                    _ => false,
                };
                let ours = skbs.contains(skb.as_str());
                let elsewhere = match (&ns, out.devices.first()) {
                    (Some(ns), Some(first)) => !*rx && *ns != first.namespace,
                    _ => true,
                };
                if ours && elsewhere && out.devices.len() == 1 {
                    // Another packet of the same length left a device of
                    // the same name elsewhere: its next device is none of
                    // the walk's (the probe's is received on the far end
                    // of the device it left by, or queued on another in
                    // the same namespace: a bridge's port). The probe's is
                    // still to come.
                    out.devices.clear();
                    skbs.clear();
                    last.clear();
                    continue;
                }
                if !ours && !joins {
                    continue;
                }
                skbs.insert(skb);
                let namespace = ns.unwrap_or_else(|| "?".into());
                let arrived = *rx && namespace == to_ns;
                out.devices.push(DeviceHop {
                    namespace,
                    device: dev.clone(),
                    direction: if *rx { "in" } else { "out" },
                });
                last.insert(skb, out.devices.len() - 1);
                if arrived {
                    out.arrived = true;
                    return (out, i);
                }
            }
            Record::Drop {
                skb,
                reason,
                function,
            } => {
                let Some(at) = last.get(skb.as_str()).map(|i| &out.devices[*i]) else {
                    continue;
                };
                out.drop = Some(KernelDrop {
                    namespace: at.namespace.clone(),
                    device: at.device.clone(),
                    reason: reason.clone(),
                    function: function.clone(),
                });
                return (out, i);
            }
        }
    }
    (out, records.len())
}

/// `cnilab sweep`: removes the instances of processes that are gone
/// (`cnilab-<pid>-<n>`, `cnilab-<pid>`), wherever tracefs is mounted
/// (it is not mounted for this). Returns their names.
pub fn sweep(alive: impl Fn(u32) -> bool) -> Vec<String> {
    let mut removed = Vec::new();
    for root in ROOTS {
        let dir = Path::new(root).join("instances");
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if instance_pid(&name).is_some_and(|p| !alive(p))
                && std::fs::remove_dir(entry.path()).is_ok()
            {
                removed.push(name);
            }
        }
    }
    removed
}

/// The pid an instance's name carries (`cnilab-<pid>-<n>`, `cnilab-<pid>`).
fn instance_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(INSTANCE_PREFIX)?;
    let pid = rest.split('-').next()?;
    let n = rest[pid.len()..].trim_start_matches('-');
    let numbers = n.chars().all(|c| c.is_ascii_digit());
    pid.parse().ok().filter(|_| numbers)
}

#[cfg(test)]
#[path = "drops_tests.rs"]
mod tests;
