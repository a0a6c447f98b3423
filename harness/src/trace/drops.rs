//! The kernel's own account of where a probe went and why it died, read
//! through tracefs without eBPF. A tracefs instance of the trace's own
//! (`instances/cnilab-<pid>-<n>`: its buffer, events and filters are
//! separate from every other user of tracing, and traces running side by
//! side in one process each have one) records `net:net_dev_queue` and
//! `net:netif_receive_skb` (device name, skb address, length) filtered on
//! the probe's length, and `skb:kfree_skb` (skb address, the dropping
//! function, the drop reason) filtered on the probe's protocol. The
//! probe's skbs are followed device by device from the source namespace;
//! the first of them the kernel frees before the destination receives it
//! is the death: namespace, device, reason and function.
//!
//! The events are global (every namespace): a device name alone is
//! ambiguous, so each device is placed by the caller ([`follow`] takes a
//! placer), which knows the namespaces the walk crossed and their veth
//! peers. The instance is removed when [`Instance`] drops (also after a
//! panic); `cnilab sweep` removes those of dead processes ([`sweep`]).

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

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

/// The per-CPU buffer of an instance, in KiB (a probe makes a few dozen
/// events; the default buffer is over a MiB per CPU).
const BUFFER_KB: &str = "256";

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

/// One trace's tracefs instance, removed on drop.
pub struct Instance {
    dir: PathBuf,
}

impl Drop for Instance {
    fn drop(&mut self) {
        if std::fs::remove_dir(&self.dir).is_err() {
            // Busy while it records: stopped, then removed.
            let _ = std::fs::write(self.dir.join("tracing_on"), "0");
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

impl Instance {
    /// A new instance recording the probe's device crossings (`len`: its
    /// size from the IP header on, as received; queued on a device it is
    /// 14 more, with its Ethernet header) and every drop of `protocol`
    /// (0x0800, 0x86dd).
    pub fn create(s: &Support, len: u32, protocol: u16) -> Result<Instance, String> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{INSTANCE_PREFIX}{}-{n}", std::process::id());
        let dir = s.root.join("instances").join(&name);
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let instance = Instance { dir };
        let set = |file: &str, value: &str| {
            let path = instance.dir.join(file);
            std::fs::write(&path, value).map_err(|e| format!("{}: {e}", path.display()))
        };
        set("buffer_size_kb", BUFFER_KB)?;
        // The default clock (`local`) is per CPU and not in step across
        // them: a probe sent on after ARP resolves (on another CPU) could
        // sort before the crossings that led to it. A kernel without it
        // keeps the default.
        let _ = set("trace_clock", "global");
        set(
            "events/net/netif_receive_skb/filter",
            &format!("len == {len}"),
        )?;
        // Devices without an Ethernet header (tunnels of layer 3) queue it
        // without those 14 bytes: not seen there.
        set(
            "events/net/net_dev_queue/filter",
            &format!("len == {}", len + 14),
        )?;
        set(
            "events/skb/kfree_skb/filter",
            &format!("protocol == {protocol}"),
        )?;
        for e in EVENTS {
            set(&format!("events/{e}/enable"), "1")?;
        }
        Ok(instance)
    }

    /// What the instance recorded so far, as [`Record`]s in time order.
    pub fn records(&self, s: &Support) -> Result<Vec<Record>, String> {
        let path = self.dir.join("trace");
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut symbols = Symbols::new(&s.reasons);
        Ok(text
            .lines()
            .filter_map(|l| parse(l, &mut symbols))
            .collect())
    }
}

/// One event of the probe's kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Received on (`rx`) or queued on a device.
    Device { rx: bool, dev: String, skb: String },
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
            Record::Device { rx, dev, skb } => {
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
mod tests {
    use super::*;

    /// Recorded on this kernel (6.18): a ping of 133 bytes from spA to spB
    /// through veths, dropped by an nft input rule in spB, in the event's
    /// own format, then with raw fields (`options/fields`), then with
    /// pointers unhashed (`options/hash-ptr` 0). The reply of a probe that
    /// arrived, freed by ping_rcv, comes after the arrival.
    const OWN: &[&str] = &[
        "            ping-5017    [001] b.s1.  1617.287921: net_dev_queue: dev=spa skbaddr=00000000db09e15f len=147",
        "            ping-5017    [001] ..s1.  1617.287927: netif_receive_skb: dev=spb skbaddr=00000000db09e15f len=133",
        "            ping-5017    [001] ..s1.  1617.287936: kfree_skb: skbaddr=00000000db09e15f rx_sk=0000000000000000 protocol=2048 location=nft_do_chain+0x46f/0x690 reason: NETFILTER_DROP",
    ];
    const FIELDS: &[&str] = &[
        "            ping-5035    [001] b....  1620.639949: net_dev_queue: skbaddr=0xffff8881723c2200 (-131385428008448) len=0x93 (147) name=spa",
        "            ping-5035    [001] ..s1.  1620.639959: netif_receive_skb: skbaddr=0xffff8881723c2200 (-131385428008448) len=0x85 (133) name=spb",
        "            ping-5035    [001] ..s1.  1620.639973: kfree_skb: skbaddr=0xffff8881723c2200 (-131385428008448) location=nft_do_chain+0x46f/0x690 (-2114198529) rx_sk=0x0 (0) protocol=0x800 (2048) reason=0xc (12)",
    ];

    fn reasons() -> BTreeMap<u32, String> {
        reason_names(
            r#"print fmt: "skbaddr=%p rx_sk=%p protocol=%u location=%pS reason: %s", REC->skbaddr, REC->rx_sk, REC->protocol, REC->location, __print_symbolic(REC->reason, { 2, "NOT_SPECIFIED" }, { 3, "NO_SOCKET" }, { 12, "NETFILTER_DROP" }, { 16, "IP_RPFILTER" })"#,
        )
    }

    /// Both printed forms give the same records: the device crossings and
    /// a drop with its reason by name and the function without offset.
    #[test]
    fn both_printed_forms_parse_to_devices_and_a_named_drop() {
        let names = reasons();
        assert_eq!(names.get(&12).map(String::as_str), Some("NETFILTER_DROP"));
        assert_eq!(names.len(), 4);
        for lines in [OWN, FIELDS] {
            let mut symbols = Symbols::new(&names);
            let records: Vec<Record> = lines
                .iter()
                .filter_map(|l| parse(l, &mut symbols))
                .collect();
            assert_eq!(records.len(), 3, "{lines:?}");
            let Record::Device { rx, dev, skb } = &records[0] else {
                panic!("{records:?}");
            };
            assert_eq!((*rx, dev.as_str()), (false, "spa"));
            assert!(
                matches!(&records[1], Record::Device { rx: true, dev, skb: s } if dev == "spb" && s == skb)
            );
            assert_eq!(
                records[2],
                Record::Drop {
                    skb: skb.clone(),
                    reason: "NETFILTER_DROP".into(),
                    function: "nft_do_chain".into()
                }
            );
        }
        let mut symbols = Symbols::new(&names);
        assert_eq!(parse("# tracer: nop", &mut symbols), None);
        assert_eq!(
            parse(
                "  ping-1 [000] ..... 1.0: consume_skb: skbaddr=00000000db09e15f",
                &mut symbols
            ),
            None
        );
    }

    /// A location printed as an address is the function it falls in,
    /// from the kernel's symbols; a hashed pointer resolves to nothing and
    /// is said to be one, with the value printed.
    #[test]
    fn a_raw_location_resolves_through_the_kernels_symbols() {
        let names = reasons();
        let mut symbols = Symbols {
            reasons: &names,
            kallsyms: Some(kallsyms(
                "0000000000000000 T hidden\nffffffff81fbdf90 T nft_do_chain\nffffffff81fbe620 t nft_do_chain_ipv4\nffffffff82000000 D some_data\n",
            )),
        };
        let line = "  ping-5 [000] ..s1. 1.0: kfree_skb: skbaddr=ffff8881040ad900 rx_sk=0000000000000000 protocol=2048 location=ffffffff81fbe3ff reason: NETFILTER_DROP";
        let Some(Record::Drop { function, .. }) = parse(line, &mut symbols) else {
            panic!("a drop");
        };
        assert_eq!(function, "nft_do_chain");
        assert_eq!(
            function_of("0xffffffff81fbe630", &mut symbols),
            "nft_do_chain_ipv4"
        );
        assert_eq!(
            function_of("00000000a1b2c3d4", &mut symbols),
            "hashed location 00000000a1b2c3d4"
        );
        let numeric = "  p-5 [000] ..s1. 1.0: kfree_skb: skbaddr=0x1 (1) location=0xffffffff81fbdf99 (1) rx_sk=0x0 (0) protocol=0x800 (2048) reason=0x10 (16)";
        let Some(Record::Drop {
            function, reason, ..
        }) = parse(numeric, &mut symbols)
        else {
            panic!("a drop");
        };
        assert_eq!(
            (function.as_str(), reason.as_str()),
            ("nft_do_chain", "IP_RPFILTER")
        );
    }

    fn function_of(location: &str, symbols: &mut Symbols) -> String {
        function(location, symbols)
    }

    /// The probe is followed from its source's device to the drop; a drop
    /// of another skb, events of other packets before the probe left, and
    /// a packet that left a device of the same name elsewhere, are not its.
    /// An answer is followed back from where the probe arrived.
    #[test]
    fn the_probe_is_followed_to_its_drop_and_not_past_its_arrival() {
        let dev = |rx: bool, dev: &str, skb: &str| Record::Device {
            rx,
            dev: dev.into(),
            skb: skb.into(),
        };
        let drop = |skb: &str, reason: &str| Record::Drop {
            skb: skb.into(),
            reason: reason.into(),
            function: "f".into(),
        };
        // Devices: a0 in pod, r0/r1 in node, b0 in dst; anything else: unknown.
        let place = |_: Option<&DeviceHop>, d: &str, _: bool, _: bool| match d {
            "a0" => Some("pod".to_string()),
            "r0" | "r1" => Some("node".to_string()),
            "b0" => Some("dst".to_string()),
            _ => None,
        };
        let records = vec![
            dev(true, "r0", "other"),
            // Another pod's a0 of the same name: its peer is none of ours.
            dev(false, "a0", "foreign"),
            dev(true, "x7", "foreign"),
            drop("foreign", "NETFILTER_DROP"),
            // Another packet of the probe's length queued on an a0, then
            // on a device of the walk: not received where it left.
            dev(false, "a0", "foreign2"),
            dev(false, "r1", "foreign2"),
            drop("other", "NO_SOCKET"),
            dev(false, "a0", "p"),
            dev(true, "r0", "p"),
            dev(true, "x9", "q"),
            drop("q", "QDISC_DROP"),
            drop("p", "IP_RPFILTER"),
        ];
        let f = follow(&records, ("pod", "dst"), place);
        assert!(!f.arrived);
        assert_eq!(f.devices.len(), 2, "{f:?}");
        let d = f.drop.expect("a drop");
        assert_eq!(d.describe(), "dropped in node on r0: IP_RPFILTER (f)");
        let arrived = vec![
            dev(false, "a0", "p"),
            dev(true, "r0", "p"),
            dev(false, "r1", "p"),
            dev(true, "b0", "p"),
            drop("p", "NO_SOCKET"),
        ];
        let f = follow(&arrived, ("pod", "dst"), place);
        assert!(f.arrived && f.drop.is_none(), "{f:?}");
        assert_eq!(f.devices.last().map(|h| h.namespace.as_str()), Some("dst"));
        // The answer, on the same skb address, dropped on its way back.
        let mut answered = arrived.clone();
        answered.truncate(4);
        answered.extend([
            dev(false, "b0", "p"),
            dev(true, "r1", "p"),
            drop("p", "NETFILTER_DROP"),
        ]);
        let f = follow(&answered, ("pod", "dst"), place);
        assert!(f.arrived && f.drop.is_none(), "{f:?}");
        let back = f.reply_drop.expect("the answer's drop");
        assert_eq!(back.describe(), "dropped in node on r1: NETFILTER_DROP (f)");
    }

    /// Only names of cnilab's own form give a pid (another tool's
    /// instance that starts with the prefix is never swept).
    #[test]
    fn an_instance_name_gives_its_pid_only_in_cnilabs_form() {
        assert_eq!(instance_pid("cnilab-4242-3"), Some(4242));
        assert_eq!(instance_pid("cnilab-4242"), Some(4242));
        assert_eq!(instance_pid("cnilab-lab-x"), None);
        assert_eq!(instance_pid("cnilab-42-x"), None);
        assert_eq!(instance_pid("perf-42"), None);
    }
}
