//! The floor comparison of `cnilab bench`: ADD (one IPv4 address, no
//! masquerade), ADD with `ipMasq: true`, ADD dual-stack and DEL, for the
//! floor (`cnilab-floor`: one veth pair into the pod namespace with one
//! address, executed like a plugin), the bridged floor (the same, its host
//! end made a port of a bridge in its creation: the cheapest ADD of a
//! bridge plugin), the measured plugin and the one it is compared with,
//! interleaved pod by pod in one run (in each pod every variant of every
//! side, in turns: [`schedule`]) so that a busy machine slows all of them
//! alike. Every figure is also a ratio to the floor.

use super::BenchError;
use crate::netns::Netns;
use crate::runtime::session::Session;
use crate::runtime::{NetworkConfig, RuntimeConf};
use crate::util::{Percentiles, ScratchDir};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The name of the floor binary, looked for in a plugin directory.
pub const FLOOR: &str = "cnilab-floor";

/// The four operations every side is measured on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// One IPv4 range, `ipMasq: false`.
    Add,
    /// One IPv4 range, `ipMasq: true`.
    AddMasq,
    /// An IPv4 and an IPv6 range, `ipMasq: false`.
    AddDualStack,
    /// DEL of what `Add` made.
    Del,
}

impl Variant {
    pub fn label(self) -> &'static str {
        match self {
            Variant::Add => "ADD",
            Variant::AddMasq => "ADD ipMasq",
            Variant::AddDualStack => "ADD dual-stack",
            Variant::Del => "DEL",
        }
    }
}

/// One side's figures, in [`Variant`] order.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SideFigures {
    pub label: String,
    pub add: Percentiles,
    pub add_masq: Percentiles,
    pub add_dual_stack: Percentiles,
    pub del: Percentiles,
    /// The CPU time of each call (user + system of every process it
    /// started, from the call's cgroup), in [`Variant`] order; `None`
    /// where calls run without a cgroup of their own.
    pub cpu: Option<[Percentiles; 4]>,
}

impl SideFigures {
    pub fn get(&self, v: Variant) -> Percentiles {
        match v {
            Variant::Add => self.add,
            Variant::AddMasq => self.add_masq,
            Variant::AddDualStack => self.add_dual_stack,
            Variant::Del => self.del,
        }
    }
}

/// Floor, bridged floor, ours and (optionally) the compared plugin,
/// measured together.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FloorComparison {
    pub floor: SideFigures,
    /// The floor with its host end a port of a bridge: what a bridge
    /// plugin's ADD cannot go below (the kernel's cost of a bridge port).
    pub bridged_floor: SideFigures,
    pub ours: SideFigures,
    pub versus: Option<SideFigures>,
}

/// One side to measure: where its plugins are and its network config.
pub struct Side<'a> {
    pub label: String,
    pub plugin_dir: &'a str,
    pub net: NetworkConfig,
}

/// The bridge of the bridged floor (in a host namespace of its own).
pub const FLOOR_BRIDGE: &str = "cnilab-floor0";

/// The floor's own config: `addresses` are what it gives the pod; with
/// `bridge`, its host end is made a port of that bridge.
pub fn floor_config(dual_stack: bool, bridge: Option<&str>) -> NetworkConfig {
    let mut addresses = vec![json!("10.99.0.2/24")];
    if dual_stack {
        addresses.push(json!("fd99::2/64"));
    }
    let mut plugin = json!({"type": FLOOR, "addresses": addresses});
    if let Some(bridge) = bridge {
        plugin["bridge"] = json!(bridge);
    }
    NetworkConfig {
        name: "cnilab-floor".into(),
        version: cnilab_net::spec::Version::new(1, 1, 0),
        disable_check: true,
        disable_gc: true,
        plugins: vec![plugin.as_object().cloned().unwrap_or_default()],
        source: Path::new("(built-in floor config)").to_path_buf(),
    }
}

/// `net` as one variant: its first plugin's `ipMasq` set, and its IPAM
/// ranges narrowed to the first IPv4 range (plus an IPv6 one when
/// `dual_stack`: the config's own, else `fd00:99::/64`).
pub fn variant_config(
    net: &NetworkConfig,
    masq: bool,
    dual_stack: bool,
) -> Result<NetworkConfig, String> {
    let mut net = net.clone();
    let Some(plugin) = net.plugins.first_mut() else {
        return Err("the config names no plugin".into());
    };
    plugin.insert("ipMasq".into(), Value::Bool(masq));
    let Some(Value::Object(ipam)) = plugin.get_mut("ipam") else {
        return Err("the first plugin has no `ipam` object to vary".into());
    };
    let subnets: Vec<String> = match (ipam.get("ranges"), ipam.get("subnet")) {
        (Some(Value::Array(sets)), _) => sets
            .iter()
            .filter_map(|set| set.get(0)?.get("subnet")?.as_str().map(str::to_string))
            .collect(),
        (None, Some(Value::String(s))) => vec![s.clone()],
        _ => Vec::new(),
    };
    let is_v4 = |s: &&String| s.parse::<ipnet::IpNet>().is_ok_and(|n| n.addr().is_ipv4());
    let v4 = subnets
        .iter()
        .find(is_v4)
        .ok_or("the first plugin's IPAM has no IPv4 range (`ipam.ranges` or `ipam.subnet`)")?;
    let mut ranges = vec![json!([{ "subnet": v4 }])];
    if dual_stack {
        let v6 = subnets
            .iter()
            .find(|s| !is_v4(s))
            .cloned()
            .unwrap_or_else(|| "fd00:99::/64".into());
        ranges.push(json!([{ "subnet": v6 }]));
    }
    ipam.remove("subnet");
    ipam.insert("ranges".into(), Value::Array(ranges));
    Ok(net)
}

/// One side's session for one variant: its own host namespace and store.
struct Run {
    session: Session,
    _store: ScratchDir,
}

/// Measures every side on every variant, `pods` of each, interleaved.
pub fn measure(
    floor_dir: &str,
    sides: &[Side<'_>],
    pods: &[Netns],
    ifname: &str,
    timeout: Duration,
) -> Result<Vec<SideFigures>, BenchError> {
    // The floors come first: `bridges[i]` is side i's bridge, if a floor.
    let bridges = [None, Some(FLOOR_BRIDGE)];
    let floors = bridges.map(|bridge| Side {
        label: match bridge {
            None => format!("{FLOOR} ({floor_dir})"),
            Some(b) => format!("{FLOOR} with bridge {b} ({floor_dir})"),
        },
        plugin_dir: floor_dir,
        net: floor_config(false, bridge),
    });
    let all: Vec<&Side<'_>> = floors.iter().chain(sides).collect();
    let variant_net = |i: usize, masq: bool, dual: bool| -> Result<NetworkConfig, BenchError> {
        if let Some(bridge) = bridges.get(i) {
            return Ok(floor_config(dual, *bridge));
        }
        variant_config(&all[i].net, masq, dual).map_err(|reason| BenchError::Variant {
            plugin: all[i].label.clone(),
            reason,
        })
    };
    let mut samples: Vec<[Vec<Duration>; 4]> = all.iter().map(|_| Default::default()).collect();
    // CPU per call; a side loses its figures at its first call without one.
    let mut cpu: Vec<Option<[Vec<Duration>; 4]>> =
        all.iter().map(|_| Some(Default::default())).collect();
    // Every variant of every side has its own session (host namespace,
    // store), opened and warmed up before the first measured call.
    let mut runs: Vec<Vec<Run>> = Vec::new();
    for (_, masq, dual) in MEASURED {
        let mut sides = Vec::new();
        for (i, side) in all.iter().enumerate() {
            sides.push(open(
                side,
                &variant_net(i, masq, dual)?,
                pods,
                ifname,
                timeout,
            )?);
        }
        runs.push(sides);
    }
    for turn in schedule(pods.len(), all.len()) {
        let variant = MEASURED[turn.variant].0;
        let tag = variant.label().replace(' ', "-").to_lowercase();
        let rt = RuntimeConf::new(
            &format!("bench-{tag}-{}", turn.pod),
            Some(pods[turn.pod].path()),
            ifname,
        );
        let (side, run) = (all[turn.side], &runs[turn.variant][turn.side]);
        let t = Instant::now();
        let add_cpu = call(side, run, &rt, "ADD")?;
        samples[turn.side][variant as usize].push(t.elapsed());
        let t = Instant::now();
        let del_cpu = call(side, run, &rt, "DEL")?;
        let mut measured = vec![(variant, add_cpu)];
        if variant == Variant::Add {
            samples[turn.side][Variant::Del as usize].push(t.elapsed());
            measured.push((Variant::Del, del_cpu));
        }
        for (v, used) in measured {
            let slot = &mut cpu[turn.side];
            match (slot.as_mut(), used) {
                (Some(per_variant), Some(used)) => per_variant[v as usize].push(used),
                _ => *slot = None,
            }
        }
    }
    Ok(all
        .iter()
        .zip(samples)
        .zip(cpu)
        .map(|((side, [add, masq, dual, del]), cpu)| SideFigures {
            label: side.label.clone(),
            add: Percentiles::of(&add),
            add_masq: Percentiles::of(&masq),
            add_dual_stack: Percentiles::of(&dual),
            del: Percentiles::of(&del),
            cpu: cpu.map(|per_variant| per_variant.map(|s| Percentiles::of(&s))),
        })
        .collect())
}

/// The ADD variants measured, with their `ipMasq` and dual-stack settings
/// (DEL is measured after [`Variant::Add`]).
const MEASURED: [(Variant, bool, bool); 3] = [
    (Variant::Add, false, false),
    (Variant::AddMasq, true, false),
    (Variant::AddDualStack, false, true),
];

/// One measured ADD and DEL: a side, in a variant, in a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Turn {
    pub pod: usize,
    /// Index into the measured variants (ADD, ADD ipMasq, ADD dual-stack).
    pub variant: usize,
    pub side: usize,
}

/// The order of every measured call: pod by pod, and in each pod every
/// variant (in [`side_order`] of the variants) of every side (in
/// [`side_order`] of the sides). Each side's DEL follows its ADD, before
/// the next ADD. Measured variant after variant instead, the first one
/// took whatever slowed the machine at the start (the kernel still tearing
/// down the namespaces of the bench's earlier phases): ADD looked slower
/// than ADD dual-stack.
pub fn schedule(pods: usize, sides: usize) -> Vec<Turn> {
    let mut turns = Vec::new();
    for pod in 0..pods {
        for variant in side_order(pod, MEASURED.len()) {
            for side in side_order(pod, sides) {
                turns.push(Turn { pod, variant, side });
            }
        }
    }
    turns
}

/// The order in which the `sides` are measured in pod `pod`, the rows of a
/// balanced Latin square (Williams' design: `0, 1, n-1, 2, n-2, …` shifted
/// by the row) and then the same rows reversed: over `2 × sides` pods each
/// side takes every position equally often and follows every other side
/// equally often, so that no side always runs right after the same one
/// (whose teardown the kernel may still be doing).
pub fn side_order(pod: usize, sides: usize) -> Vec<usize> {
    if sides == 0 {
        return Vec::new();
    }
    let row = pod % (2 * sides);
    let shift = row % sides;
    let mut order: Vec<usize> = (0..sides)
        .map(|k| {
            let base = if k % 2 == 1 {
                k.div_ceil(2)
            } else {
                (sides - k / 2) % sides
            };
            (base + shift) % sides
        })
        .collect();
    if row >= sides {
        order.reverse();
    }
    order
}

fn open(
    side: &Side<'_>,
    net: &NetworkConfig,
    pods: &[Netns],
    ifname: &str,
    timeout: Duration,
) -> Result<Run, BenchError> {
    let store = ScratchDir::new("bench-floor-ipam").map_err(BenchError::Scratch)?;
    let mut session =
        Session::open::<BenchError>(side.plugin_dir, net, store.path(), "bench-fhost", timeout)?;
    session.runtime = session.runtime.with_cpu_accounting();
    session
        .runtime
        .find_plugins(&session.net)
        .map_err(Box::new)?;
    let run = Run {
        session,
        _store: store,
    };
    // A warm-up pod, so that bridge and table creation are not counted.
    let warm = RuntimeConf::new("bench-warmup", Some(pods[0].path()), ifname);
    call(side, &run, &warm, "ADD")?;
    call(side, &run, &warm, "DEL")?;
    Ok(run)
}

/// One call of the side's chain; the CPU all its plugins used, where
/// every one of them ran in a cgroup of its own.
fn call(
    side: &Side<'_>,
    run: &Run,
    rt: &RuntimeConf,
    op: &'static str,
) -> Result<Option<Duration>, BenchError> {
    let (runtime, net) = (&run.session.runtime, &run.session.net);
    let cpu = |execs: &[crate::runtime::Execution]| -> Option<Duration> {
        execs.iter().map(|e| e.cpu).sum()
    };
    let outcome = match op {
        "ADD" => runtime.add(net, rt).map(|r| cpu(&r.executions)),
        _ => runtime.del(net, rt).map(|execs| cpu(&execs)),
    };
    outcome.map_err(|source| BenchError::Op {
        plugin: side.label.clone(),
        op,
        pod: rt.container_id.clone(),
        source: Box::new(source),
    })
}

/// `x` over the floor, as a ratio.
fn over(x: Duration, floor: Duration) -> String {
    if floor.is_zero() {
        return "-".into();
    }
    format!("{:.2}x", x.as_secs_f64() / floor.as_secs_f64())
}

/// `x - y` in ms, signed.
fn minus(x: Duration, y: Duration) -> String {
    format!("{:+.2} ms", (x.as_secs_f64() - y.as_secs_f64()) * 1000.0)
}

fn ms2(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

impl std::fmt::Display for FloorComparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "against the floor (F: {}; Fb: {}), sequential, interleaved pod by pod:",
            self.floor.label, self.bridged_floor.label
        )?;
        let mut header = format!(
            "{:<15} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9}",
            "", "F median", "F p95", "A median", "A p95", "A/F", "A-F", "Fb median", "A-Fb"
        );
        if self.versus.is_some() {
            header.push_str(&format!(
                " {:>9} {:>9} {:>8} {:>7}",
                "B median", "B p95", "B/F", "B/A"
            ));
        }
        writeln!(f, "{header}")?;
        for v in [
            Variant::Add,
            Variant::AddMasq,
            Variant::AddDualStack,
            Variant::Del,
        ] {
            let (fl, fb, a) = (
                self.floor.get(v),
                self.bridged_floor.get(v),
                self.ours.get(v),
            );
            let mut line = format!(
                "{:<15} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9}",
                v.label(),
                ms2(fl.median),
                ms2(fl.p95),
                ms2(a.median),
                ms2(a.p95),
                over(a.median, fl.median),
                minus(a.median, fl.median),
                ms2(fb.median),
                minus(a.median, fb.median),
            );
            if let Some(b) = self.versus.as_ref().map(|s| s.get(v)) {
                line.push_str(&format!(
                    " {:>9} {:>9} {:>8} {:>7}",
                    ms2(b.median),
                    ms2(b.p95),
                    over(b.median, fl.median),
                    over(b.median, a.median),
                ));
            }
            writeln!(f, "{line}")?;
        }
        writeln!(
            f,
            "(the floors have no masquerade: their ipMasq row is a plain ADD; their dual-stack row adds an IPv6 address; Fb is a bridge plugin's floor, the kernel's cost of a bridge port included)"
        )?;
        self.fmt_cpu(f)
    }
}

impl FloorComparison {
    /// The CPU table: each call's user + system time (every process it
    /// started), median, beside the floor's; holds still when the machine
    /// is busy, unlike the latencies above.
    fn fmt_cpu(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (Some(fl), Some(fb), Some(a)) =
            (&self.floor.cpu, &self.bridged_floor.cpu, &self.ours.cpu)
        else {
            return writeln!(
                f,
                "no CPU figures: plugin calls run without a cgroup of their own here (cgroup v2 needed)"
            );
        };
        let b = self.versus.as_ref().and_then(|v| v.cpu.as_ref());
        let mut header = format!(
            "{:<15} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9}",
            "CPU median", "F", "A", "A/F", "A-F", "Fb", "A-Fb"
        );
        if b.is_some() {
            header.push_str(&format!(" {:>9} {:>8} {:>7}", "B", "B/F", "B/A"));
        }
        writeln!(f, "{header}")?;
        for (i, v) in [
            Variant::Add,
            Variant::AddMasq,
            Variant::AddDualStack,
            Variant::Del,
        ]
        .into_iter()
        .enumerate()
        {
            let (fm, fbm, am) = (fl[i].median, fb[i].median, a[i].median);
            let mut line = format!(
                "{:<15} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9}",
                v.label(),
                ms2(fm),
                ms2(am),
                over(am, fm),
                minus(am, fm),
                ms2(fbm),
                minus(am, fbm),
            );
            if let Some(b) = b {
                let bm = b[i].median;
                line.push_str(&format!(
                    " {:>9} {:>8} {:>7}",
                    ms2(bm),
                    over(bm, fm),
                    over(bm, am)
                ));
            }
            writeln!(f, "{line}")?;
        }
        writeln!(
            f,
            "(CPU: user + system of every process of a call, from its cgroup: the plugin, its IPAM plugin, an nft it starts)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(plugin: Value) -> NetworkConfig {
        let mut n = floor_config(false, None);
        n.plugins = vec![plugin.as_object().cloned().unwrap_or_default()];
        n
    }

    #[test]
    fn variants_set_masquerade_and_ranges() {
        let base = net(json!({"type": "x", "ipMasq": true, "ipam": {"ranges": [
            [{"subnet": "fd77::/64"}], [{"subnet": "10.77.0.0/16"}]]}}));
        let plain = variant_config(&base, false, false).expect("variant");
        assert_eq!(plain.plugins[0]["ipMasq"], json!(false));
        assert_eq!(
            plain.plugins[0]["ipam"]["ranges"],
            json!([[{"subnet": "10.77.0.0/16"}]])
        );
        let dual = variant_config(&base, true, true).expect("variant");
        assert_eq!(dual.plugins[0]["ipMasq"], json!(true));
        assert_eq!(
            dual.plugins[0]["ipam"]["ranges"],
            json!([[{"subnet": "10.77.0.0/16"}], [{"subnet": "fd77::/64"}]])
        );
        let single = net(json!({"type": "x", "ipam": {"subnet": "10.1.0.0/24"}}));
        let dual = variant_config(&single, false, true).expect("variant");
        assert_eq!(
            dual.plugins[0]["ipam"]["ranges"],
            json!([[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd00:99::/64"}]])
        );
        assert!(dual.plugins[0]["ipam"].get("subnet").is_none());
        let v6_only = net(json!({"type": "x", "ipam": {"subnet": "fd00::/64"}}));
        assert!(variant_config(&v6_only, false, false).is_err());
        assert!(variant_config(&net(json!({"type": "x"})), false, false).is_err());
    }

    #[test]
    fn the_side_order_turns_so_no_side_always_follows_the_same_one() {
        // A bench has at most four sides: the two floors, ours, the
        // compared one; more are checked all the same.
        for sides in 1..=6 {
            let pods = 2 * sides;
            let mut at = vec![vec![0; sides]; sides];
            let mut after = vec![vec![0; sides]; sides];
            let mut previous = None;
            for pod in 0..pods {
                let order = side_order(pod, sides);
                let mut sorted = order.clone();
                sorted.sort();
                assert_eq!(sorted, (0..sides).collect::<Vec<_>>(), "pod {pod}");
                for (position, &side) in order.iter().enumerate() {
                    at[side][position] += 1;
                    if let Some(before) = previous {
                        after[side][before] += 1;
                    }
                    previous = Some(side);
                }
            }
            for side in 0..sides {
                assert!(
                    at[side].iter().all(|&n| n == 2),
                    "{sides} sides: side {side} at positions {:?}",
                    at[side]
                );
                for before in (0..sides).filter(|&b| b != side) {
                    assert!(
                        after[side][before] > 0,
                        "{sides} sides: side {side} never follows side {before}"
                    );
                }
                // Within a pod, every other side comes right before it
                // equally often (twice over the `2 × sides` pods).
                let within: Vec<usize> = (0..sides)
                    .map(|before| {
                        (0..pods)
                            .filter(|&pod| {
                                side_order(pod, sides)
                                    .windows(2)
                                    .any(|w| w == [before, side])
                            })
                            .count()
                    })
                    .collect();
                for before in (0..sides).filter(|&b| b != side) {
                    assert_eq!(
                        within[before], 2,
                        "{sides} sides: side {side} after side {before}: {within:?}"
                    );
                }
            }
        }
    }

    /// Whatever slows the machine for a while (the kernel still tearing
    /// down the namespaces of the bench's earlier phases, another build)
    /// must fall on every variant alike: within each pod every variant of
    /// every side runs once, and over `2 × variants` pods each variant
    /// takes each position in the pod equally often.
    #[test]
    fn the_schedule_interleaves_the_variants_pod_by_pod() {
        let variants = MEASURED.len();
        for sides in 1..=4 {
            let pods = 2 * variants;
            let turns = schedule(pods, sides);
            assert_eq!(turns.len(), pods * variants * sides);
            let mut at = vec![vec![0; variants]; variants];
            for pod in 0..pods {
                let mine: Vec<&Turn> = turns.iter().filter(|t| t.pod == pod).collect();
                let first = turns.iter().position(|t| t.pod == pod).unwrap_or(0);
                assert!(
                    turns[first..first + mine.len()]
                        .iter()
                        .all(|t| t.pod == pod),
                    "{sides} sides: pod {pod}'s calls are not together"
                );
                let mut seen: Vec<(usize, usize)> =
                    mine.iter().map(|t| (t.variant, t.side)).collect();
                seen.sort();
                seen.dedup();
                assert_eq!(seen.len(), variants * sides, "{sides} sides, pod {pod}");
                let mut order: Vec<usize> = mine.iter().map(|t| t.variant).collect();
                order.dedup();
                assert_eq!(order.len(), variants, "{sides} sides, pod {pod}: {order:?}");
                for (position, &variant) in order.iter().enumerate() {
                    at[variant][position] += 1;
                }
            }
            for (variant, positions) in at.iter().enumerate() {
                assert!(
                    positions.iter().all(|&n| n == 2),
                    "{sides} sides: variant {variant} at positions {positions:?}"
                );
            }
        }
    }

    #[test]
    fn the_floor_config_gives_one_or_two_addresses_and_a_bridge_when_asked() {
        assert_eq!(
            floor_config(false, None).plugins[0]["addresses"],
            json!(["10.99.0.2/24"])
        );
        assert_eq!(
            floor_config(true, None).plugins[0]["addresses"],
            json!(["10.99.0.2/24", "fd99::2/64"])
        );
        assert_eq!(floor_config(true, None).plugin_type(0), FLOOR);
        assert!(floor_config(false, None).plugins[0].get("bridge").is_none());
        let bridged = floor_config(true, Some(FLOOR_BRIDGE));
        assert_eq!(bridged.plugins[0]["bridge"], json!(FLOOR_BRIDGE));
        assert_eq!(
            bridged.plugins[0]["addresses"],
            json!(["10.99.0.2/24", "fd99::2/64"])
        );
    }
}
