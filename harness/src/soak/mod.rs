//! `cnilab soak`: a randomized, reproducible churn of ADD/CHECK/DEL/GC
//! against any plugin, with ADDs SIGKILLed at random moments, DELs repeated,
//! made after the namespace is gone or without `CNI_NETNS`, and an account
//! at the end of everything the plugin left behind.
//!
//! Everything runs in a throwaway host namespace (the plugin runs inside
//! it through [`Runtime::in_netns`]); every pod is a throwaway namespace;
//! the IPAM `dataDir` is a scratch directory. The run ends with the final
//! cleanup a runtime would make (DEL of every live pod) and only then
//! counts, so what it reports is really left behind.
//!
//! Reproducibility: each step's plan comes from its own PRNG stream of
//! `(seed, step)` ([`plan::CyclePlan`]), and each step's pod has container
//! ID `soak-<step>`, so every finding names the step, the exact plan and
//! the operations log, and `--seed X --replay N` runs that step alone.

pub use crate::corpus;
mod inject;
pub mod plan;
pub mod report;
pub mod rng;

use crate::accounting;
use crate::host_state;
use crate::netns::{Netns, NetnsError};
use crate::runtime::{GcKey, NetworkConfig, Runtime, RuntimeConf, RuntimeError};
use crate::util::ScratchDir;
use cnilab_net::spec::{Attachment, Version};
use ipnet::IpNet;
use plan::{CyclePlan, DelVariant, PlanKnobs};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

pub use report::{Finding, FindingKind, OpOutcome, OpRecord, SoakReport};

#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Runtime(#[from] Box<RuntimeError>),
    #[error("scratch directory: {0}")]
    Scratch(std::io::Error),
    #[error("{0}")]
    BadOptions(String),
    #[error("warm-up {op} of pod {pod} failed, so the config cannot be soaked (fix it with `cnilab lifecycle` first): {source}")]
    Warmup {
        op: &'static str,
        pod: String,
        source: Box<RuntimeError>,
    },
    #[error("cannot inject leaks: {0}")]
    Inject(String),
}

/// How long the churn runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// This many steps (pod lifecycles).
    Cycles(u64),
    /// Steps are started until this much time has passed.
    Duration(Duration),
}

/// What to run.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// Colon-separated plugin directories (CNI_PATH).
    pub plugin_dir: String,
    pub config: PathBuf,
    /// Resident pods: added first, alive for the whole run (they must keep
    /// their addresses through churn and GC), deleted by the final cleanup.
    pub pods: usize,
    /// Workers running steps at once.
    pub parallel: usize,
    pub budget: Budget,
    /// Probability that a step's ADD is SIGKILLed.
    pub kill_rate: f64,
    /// Probability that the runtime then loses the pod (no DEL ever comes,
    /// as when the runtime itself dies with the ADD): only GC can clean up.
    /// With it, a last GC runs before the final cleanup.
    pub lose_rate: f64,
    pub seed: u64,
    /// A GC (when supported) every this many steps; 0 disables GC.
    pub gc_every: u64,
    /// Leaks planted after the resident pods are up (records with no pod in
    /// a host-local-layout store and one stray veth), which the plugin's
    /// GC must reclaim. A self-test of the plugin's GC and of this account.
    pub inject_leaks: usize,
    /// Run only this step (with the same seed and knobs) to replay it.
    pub replay: Option<u64>,
    pub ifname: String,
    /// Per-call timeout.
    pub timeout: Duration,
    /// A status line of finished steps on stderr when it is a TTY.
    pub progress: bool,
}

impl SoakOptions {
    /// Defaults for everything but the plugin and its config.
    pub fn new(plugin_dir: &str, config: &Path) -> SoakOptions {
        SoakOptions {
            plugin_dir: plugin_dir.to_string(),
            config: config.to_path_buf(),
            pods: 4,
            parallel: 8,
            budget: Budget::Cycles(200),
            kill_rate: 0.1,
            lose_rate: 0.0,
            seed: rng::seed_from_clock(),
            gc_every: 100,
            inject_leaks: 0,
            replay: None,
            ifname: "eth0".into(),
            timeout: crate::runtime::DEFAULT_TIMEOUT,
            progress: false,
        }
    }

    pub(crate) fn knobs(&self) -> PlanKnobs {
        PlanKnobs {
            seed: self.seed,
            kill_rate: self.kill_rate,
            lose_rate: self.lose_rate,
            gc_every: self.gc_every,
        }
    }

    /// The command line that replays `step` of this run.
    pub fn replay_command(&self, step: u64) -> String {
        format!(
            "cnilab soak --plugin-dir {} --config {} --seed {} --kill-rate {} --lose-rate {} --gc-every {} --pods {} --replay {step}",
            self.plugin_dir,
            self.config.display(),
            self.seed,
            self.kill_rate,
            self.lose_rate,
            self.gc_every,
            self.pods
        )
    }

    fn validate(&self) -> Result<(), SoakError> {
        let bad = |m: &str| Err(SoakError::BadOptions(m.to_string()));
        if self.parallel == 0 {
            return bad("--parallel must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.kill_rate) || !(0.0..=1.0).contains(&self.lose_rate) {
            return bad("--kill-rate and --lose-rate must be between 0 and 1");
        }
        if matches!(self.budget, Budget::Cycles(0))
            || self.budget == Budget::Duration(Duration::ZERO)
        {
            return bad("--cycles / --duration must be more than 0");
        }
        if let Err(why) = cnilab_net::spec::check_ifname(&self.ifname) {
            return Err(SoakError::BadOptions(format!(
                "--ifname {:?} {why}",
                self.ifname
            )));
        }
        Ok(())
    }
}

/// A pod the runtime considers attached (ADD succeeded, no DEL succeeded yet).
#[derive(Clone, Debug)]
struct LivePod {
    conf: RuntimeConf,
    ips: Vec<IpNet>,
    /// Its teardown has begun (its namespace may be gone): still listed to
    /// GC, but not CHECKed any more.
    tearing_down: bool,
}

#[derive(Default)]
struct Live {
    pods: BTreeMap<String, LivePod>,
    by_ip: HashMap<IpAddr, String>,
}

/// Who did an operation: the label used in the log and in findings.
#[derive(Clone, Copy, Debug)]
enum Actor {
    Warmup(usize),
    Resident(usize),
    Step(u64),
    Cleanup,
}

impl Actor {
    fn label(self) -> String {
        match self {
            Actor::Warmup(i) => format!("warm-up {i}"),
            Actor::Resident(i) => format!("resident {i}"),
            Actor::Step(s) => format!("step {s}"),
            Actor::Cleanup => "final cleanup".into(),
        }
    }

    fn step(self) -> Option<u64> {
        match self {
            Actor::Step(s) => Some(s),
            _ => None,
        }
    }
}

/// Container ID of a step's pod (the account maps IDs back to steps).
pub fn step_container_id(step: u64) -> String {
    format!("soak-{step}")
}

fn resident_container_id(i: usize) -> String {
    format!("soak-resident-{i}")
}

/// The step a container ID belongs to, when it is a step's pod.
pub fn step_of(container_id: &str) -> Option<u64> {
    container_id.strip_prefix("soak-")?.parse().ok()
}

/// Shared state of a running soak.
struct Soak<'a> {
    opts: &'a SoakOptions,
    runtime: &'a Runtime,
    net: &'a NetworkConfig,
    started: Instant,
    /// The same moment on the wall clock (file times are compared to it).
    started_wall: std::time::SystemTime,
    /// A typical ADD's duration under the current load (an exponentially
    /// weighted mean of successful ADDs, in µs): kills land uniformly in
    /// it. Starts from the warm-up's median.
    kill_window_us: AtomicU64,
    check_supported: bool,
    gc_supported: bool,
    /// Container operations hold it shared, GC exclusively: GC never runs
    /// while an operation is in flight, and sees every pod whose ADD
    /// returned (the registration happens under the same guard).
    gate: RwLock<()>,
    live: Mutex<Live>,
    log: Mutex<Vec<OpRecord>>,
    findings: Mutex<Vec<Finding>>,
    /// Attachments whose DEL kept failing: the final cleanup retries them.
    undeleted: Mutex<Vec<RuntimeConf>>,
    /// Pod namespaces with interfaces left after a DEL without CNI_NETNS
    /// (allowed: the runtime deletes the namespace next).
    left_without_netns: AtomicU64,
    kills_landed: AtomicU64,
    /// Pods the runtime lost after a killed ADD (never DELeted).
    lost: Mutex<BTreeSet<String>>,
    kills_missed: AtomicU64,
    gc_runs: AtomicU64,
    next_step: AtomicU64,
    steps_done: AtomicU64,
    /// Addresses the config's range holds, when it says.
    capacity: Option<u128>,
}

/// Runs a soak. Needs root (namespaces).
pub fn run(opts: &SoakOptions) -> Result<SoakReport, SoakError> {
    opts.validate()?;
    crate::netns::require_root()?;
    let mut net = NetworkConfig::load(&opts.config).map_err(Box::new)?;
    let scratch = ScratchDir::new("soak").map_err(SoakError::Scratch)?;
    let data_dir = scratch.path().join("ipam");
    net.set_ipam_data_dir(&data_dir);
    let host = Netns::with_label("soak-host")?;
    host.set_lo_up()?;
    let runtime = Runtime::new(&opts.plugin_dir)
        .in_netns(&host)
        .map_err(Box::new)?
        .with_timeout(opts.timeout);
    let mut notes = Vec::new();
    let mut plugin_versions = Vec::new();
    for index in 0..net.plugins.len() {
        let name = net.plugin_type(index).to_string();
        runtime.find_plugin(&name).map_err(Box::new)?;
        match runtime.version(&name, &net.version.to_string()) {
            Ok((info, _)) => plugin_versions.push((name, info.supported_versions)),
            Err(e) => {
                notes.push(format!(
                    "VERSION of {name} failed ({e}): GC is not attempted"
                ));
                plugin_versions.push((name, Vec::new()));
            }
        }
    }
    let every_plugin_lists = |v: &str| {
        plugin_versions
            .iter()
            .all(|(_, l)| l.iter().any(|s| s == v))
    };
    let check_supported = net.version >= Version::V0_4_0 && !net.disable_check;
    if !check_supported {
        notes.push(format!(
            "CHECK is not run: config version {}{}",
            net.version,
            if net.disable_check {
                ", disableCheck"
            } else {
                ""
            }
        ));
    }
    let gc_supported = opts.gc_every > 0
        && net.version >= Version::V1_1_0
        && !net.disable_gc
        && every_plugin_lists("1.1.0");
    if !gc_supported {
        let why = if opts.gc_every == 0 {
            "--gc-every 0".to_string()
        } else if net.version < Version::V1_1_0 {
            format!("the config's version {} is below 1.1.0", net.version)
        } else if net.disable_gc {
            "the config sets disableGC".into()
        } else {
            let missing: Vec<&str> = plugin_versions
                .iter()
                .filter(|(_, l)| !l.iter().any(|s| s == "1.1.0"))
                .map(|(n, _)| n.as_str())
                .collect();
            format!("VERSION of {} does not list 1.1.0", missing.join(", "))
        };
        notes.push(format!("GC is never called: {why}"));
    }

    // Warm-up: a few plain ADD/DELs, one at a time. They create what the
    // plugin keeps between pods (bridge, firewall tables), which is then
    // the baseline, and they time an ADD for the kill window.
    let mut soak = Soak {
        opts,
        runtime: &runtime,
        net: &net,
        started: Instant::now(),
        started_wall: std::time::SystemTime::now(),
        kill_window_us: AtomicU64::new(0),
        check_supported,
        gc_supported,
        gate: RwLock::new(()),
        live: Mutex::new(Live::default()),
        log: Mutex::new(Vec::new()),
        findings: Mutex::new(Vec::new()),
        undeleted: Mutex::new(Vec::new()),
        left_without_netns: AtomicU64::new(0),
        kills_landed: AtomicU64::new(0),
        lost: Mutex::new(BTreeSet::new()),
        kills_missed: AtomicU64::new(0),
        gc_runs: AtomicU64::new(0),
        next_step: AtomicU64::new(0),
        steps_done: AtomicU64::new(0),
        capacity: accounting::capacity(&net),
    };
    let mut warm = Vec::new();
    let store_dir = net.ipam_store_dir();
    let mut layout = false;
    for i in 0..3 {
        let pod = Netns::with_label("soak-warm")?;
        let id = format!("soak-warmup-{i}");
        let conf = RuntimeConf::new(&id, Some(pod.path()), &opts.ifname);
        let t = Instant::now();
        let added = runtime.add(&net, &conf);
        let took = t.elapsed();
        soak.record(
            Actor::Warmup(i),
            "ADD",
            &id,
            t,
            outcome_of(&added, false),
            ips_of(&added),
            call_of(&added),
        );
        let added = match added {
            Ok(a) => a,
            Err(e) => {
                let _ = runtime.del(&net, &conf);
                return Err(SoakError::Warmup {
                    op: "ADD",
                    pod: id,
                    source: Box::new(e),
                });
            }
        };
        let ips: Vec<IpAddr> = added.result.ips.iter().map(|i| i.address.addr()).collect();
        layout |= accounting::layout_applies(store_dir.as_deref(), &id, &ips);
        warm.push(took);
        let t = Instant::now();
        let deleted = runtime.del(&net, &conf);
        soak.record(
            Actor::Warmup(i),
            "DEL",
            &id,
            t,
            outcome_of(&deleted, false),
            Vec::new(),
            call_of(&deleted),
        );
        if let Err(e) = deleted {
            return Err(SoakError::Warmup {
                op: "DEL",
                pod: id,
                source: Box::new(e),
            });
        }
    }
    warm.sort();
    let warm_median = warm.get(warm.len() / 2).copied().unwrap_or_default();
    soak.kill_window_us = AtomicU64::new(warm_median.as_micros().max(1000) as u64);
    let baseline_links = host.links()?;
    let baseline_rules = host_state::firewall_rules(&host);

    // Resident pods, added in parallel.
    let residents: Vec<Netns> = (0..opts.pods)
        .map(|_| Netns::with_label("soak-res"))
        .collect::<Result<_, _>>()?;
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..opts.parallel.min(opts.pods) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(ns) = residents.get(i) else { break };
                let conf =
                    RuntimeConf::new(&resident_container_id(i), Some(ns.path()), &opts.ifname);
                if !soak.add(Actor::Resident(i), &conf, None) {
                    soak.del_with_retries(Actor::Resident(i), &conf, "DEL");
                }
            });
        }
    });

    let injected = if opts.inject_leaks > 0 {
        Some(inject::plant(&host, &net, store_dir.as_deref(), opts)?)
    } else {
        None
    };

    // The churn.
    let churn_started = Instant::now();
    let steps: Option<Vec<u64>> = opts.replay.map(|s| vec![s]);
    let workers = if steps.is_some() { 1 } else { opts.parallel };
    let bar = if opts.progress {
        crate::report::progress::Progress::stderr()
    } else {
        crate::report::progress::Progress::quiet()
    };
    let of = match opts.budget {
        Budget::Cycles(c) => format!("/{c}"),
        Budget::Duration(d) => format!(" in {}s", d.as_secs()),
    };
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let n = soak.next_step.fetch_add(1, Ordering::Relaxed);
                let step = match (&steps, opts.budget) {
                    (Some(list), _) => match list.get(n as usize) {
                        Some(step) => *step,
                        None => break,
                    },
                    (None, Budget::Cycles(c)) if n < c => n,
                    (None, Budget::Duration(d)) if churn_started.elapsed() < d => n,
                    _ => break,
                };
                soak.cycle(&CyclePlan::new(&opts.knobs(), step));
                let done = soak.steps_done.fetch_add(1, Ordering::Relaxed) + 1;
                if done.is_multiple_of(10) {
                    bar.status(&format!("⌛ soak: {done}{of} steps"));
                }
            });
        }
    });
    bar.clear();
    let churn_time = churn_started.elapsed();

    // A runtime that loses pods relies on GC: one last GC with the live
    // pods, before their cleanup, reclaims what the lost ones left.
    if opts.lose_rate > 0.0 && gc_supported {
        soak.gc(Actor::Cleanup);
    }

    // Final cleanup, as a runtime tearing everything down: DEL every live
    // pod, retry the DELs that failed, then the namespaces go.
    let live: Vec<LivePod> = soak
        .live
        .lock()
        .map(|l| l.pods.values().cloned().collect())
        .unwrap_or_default();
    for pod in &live {
        soak.del_with_retries(Actor::Cleanup, &pod.conf, "DEL");
    }
    let undeleted: Vec<RuntimeConf> = soak.undeleted.lock().map(|u| u.clone()).unwrap_or_default();
    for mut conf in undeleted {
        conf.netns = None;
        soak.del_with_retries(Actor::Cleanup, &conf, "DEL (no CNI_NETNS)");
    }
    drop(residents);

    // The account.
    let mut findings = soak.findings.lock().map(|f| f.clone()).unwrap_or_default();
    let leftover_links = settled_leftovers(&host, &baseline_links)?;
    let ids_seen: BTreeSet<String> = soak
        .log
        .lock()
        .map(|l| l.iter().map(|r| r.container_id.clone()).collect())
        .unwrap_or_default();
    let veth_owner: HashMap<String, String> = ids_seen
        .iter()
        .chain(injected.iter().flat_map(|i| i.container_ids.iter()))
        .map(|id| {
            (
                cnilab_net::naming::host_veth_name(id, &opts.ifname),
                id.clone(),
            )
        })
        .collect();
    for link in &leftover_links {
        let owner = veth_owner.get(&link.name).cloned();
        let injected_here = injected
            .as_ref()
            .is_some_and(|i| i.links.contains(&link.name));
        findings.push(Finding::new(
            FindingKind::LeakedLink,
            format!(
                "{} {} is left in the host namespace{}{}",
                link.kind.as_deref().unwrap_or("link"),
                link.name,
                match &owner {
                    Some(id) => format!(" (host side of {id})"),
                    None => String::new(),
                },
                if injected_here {
                    " — planted on purpose, GC did not reclaim it"
                } else {
                    ""
                }
            ),
            owner.into_iter().collect(),
        ));
    }
    if let (Some(before), Some(after)) = (&baseline_rules, host_state::firewall_rules(&host)) {
        for rule in host_state::new_lines(before, &after) {
            findings.push(Finding::new(
                FindingKind::LeakedRule,
                format!("firewall rule left: {rule}"),
                Vec::new(),
            ));
        }
    }
    let mut store_readable = false;
    let mut leftover_ips: BTreeSet<IpAddr> = BTreeSet::new();
    if let Some(dir) = store_dir.as_ref().filter(|_| layout) {
        if dir.is_dir() {
            store_readable = true;
            let records = host_state::reservations(dir).map_err(SoakError::Scratch)?;
            for r in records {
                leftover_ips.insert(r.ip);
                let planted = injected.as_ref().is_some_and(|i| i.records.contains(&r.ip));
                let lost_pod = soak
                    .lost
                    .lock()
                    .map(|l| l.contains(&r.container_id))
                    .unwrap_or(false);
                let mut owners = Vec::new();
                let why = if planted {
                    " — planted on purpose, GC did not reclaim it".to_string()
                } else if lost_pod {
                    " — the runtime lost this pod after its ADD was killed: only GC could reclaim it"
                        .to_string()
                } else if r.container_id.is_empty() {
                    // Its writer died between creating the file and filling
                    // it: the ADDs killed while the file was made are the
                    // suspects (a DEL matches records by owner, so it never
                    // releases this one, and GC skips what it cannot parse).
                    let suspects = soak.killed_adds_around(&dir.join(r.ip.to_string()));
                    owners.extend(suspects.iter().cloned());
                    format!(
                        " — an empty record, left by an ADD killed between creating and writing it ({})",
                        if suspects.is_empty() {
                            "no killed ADD ran when the file was made".to_string()
                        } else {
                            format!("made during the killed ADD of {}", suspects.join(", "))
                        }
                    )
                } else {
                    String::new()
                };
                if !r.container_id.is_empty() {
                    owners.insert(0, r.container_id.clone());
                }
                findings.push(Finding::new(
                    FindingKind::LeakedAddress,
                    format!(
                        "{} is still reserved in {} for container {:?} ifname {:?}{why}",
                        r.ip,
                        dir.display(),
                        r.container_id,
                        r.ifname,
                    ),
                    owners,
                ));
            }
        }
    }
    if !store_readable {
        match &store_dir {
            Some(dir) => {
                notes.push(format!(
                    "the store at {} is not in host-local's layout: addresses are accounted by probing (ADDs after the cleanup until every address handed out came back, or the range ran out)",
                    dir.display()
                ));
                soak.account_by_probing(&mut findings, &mut notes);
            }
            None => {
                notes.push("the config has no ipam section: no address store to account".into())
            }
        }
    }
    let without_netns = soak.left_without_netns.load(Ordering::Relaxed);
    if without_netns > 0 {
        notes.push(format!(
            "{without_netns} pod namespace(s) still had the pod interface after a DEL without CNI_NETNS (allowed: the plugin cannot reach it, the runtime deletes the namespace next)"
        ));
    }
    let kill_window = soak.kill_window();
    let lost_pods = soak.lost.lock().map(|l| l.len()).unwrap_or(0) as u64;
    let log = soak.log.into_inner().unwrap_or_default();
    for f in &mut findings {
        f.attach(&log, opts);
    }
    let injected_summary = injected.map(|i| {
        let kept_records = i
            .records
            .iter()
            .filter(|ip| leftover_ips.contains(ip))
            .count();
        let kept_links = i
            .links
            .iter()
            .filter(|n| leftover_links.iter().any(|l| &l.name == *n))
            .count();
        report::Injected {
            records: i.records.len(),
            links: i.links.len(),
            records_reclaimed: i.records.len() - kept_records,
            links_reclaimed: i.links.len() - kept_links,
        }
    });
    Ok(SoakReport::build(report::Inputs {
        opts,
        net: &net,
        plugin_versions,
        steps: soak.steps_done.load(Ordering::Relaxed),
        churn_time,
        kill_window,
        kills_landed: soak.kills_landed.load(Ordering::Relaxed),
        kills_missed: soak.kills_missed.load(Ordering::Relaxed),
        lost_pods,
        gc_runs: soak.gc_runs.load(Ordering::Relaxed),
        gc_supported,
        findings,
        log,
        injected: injected_summary,
        notes,
    }))
}

/// Links in `host` that are not in `baseline`, after giving the kernel time
/// to finish destroying deleted namespaces (their veth peers go with them,
/// asynchronously).
fn settled_leftovers(
    host: &Netns,
    baseline: &[crate::netns::Link],
) -> Result<Vec<crate::netns::Link>, SoakError> {
    let known: BTreeSet<(&str, Option<&str>)> = baseline
        .iter()
        .map(|l| (l.name.as_str(), l.kind.as_deref()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let extra: Vec<crate::netns::Link> = host
            .links()?
            .into_iter()
            .filter(|l| !known.contains(&(l.name.as_str(), l.kind.as_deref())))
            .collect();
        if extra.is_empty() || Instant::now() >= deadline {
            return Ok(extra);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn ips_of<T: AddOutput>(r: &Result<T, RuntimeError>) -> Vec<IpNet> {
    r.as_ref().map(|a| a.ips()).unwrap_or_default()
}

/// What an operation's result contributes to the log.
trait AddOutput {
    fn ips(&self) -> Vec<IpNet>;
}

impl AddOutput for crate::runtime::AddResult {
    fn ips(&self) -> Vec<IpNet> {
        self.result.ips.iter().map(|i| i.address).collect()
    }
}

impl AddOutput for Vec<crate::runtime::Execution> {
    fn ips(&self) -> Vec<IpNet> {
        Vec::new()
    }
}

fn outcome_of<T>(r: &Result<T, RuntimeError>, kill_planned: bool) -> OpOutcome {
    match r {
        Ok(_) => OpOutcome::Ok,
        Err(e) => OpOutcome::of_error(e, kill_planned),
    }
}

fn call_of<T>(r: &Result<T, RuntimeError>) -> Option<String> {
    r.as_ref()
        .err()
        .and_then(|e| e.execution())
        .map(|x| x.shell_line())
}

impl Soak<'_> {
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        who: Actor,
        op: &str,
        container_id: &str,
        started: Instant,
        outcome: OpOutcome,
        ips: Vec<IpNet>,
        call: Option<String>,
    ) {
        let rec = OpRecord {
            who: who.label(),
            step: who.step(),
            op: op.to_string(),
            container_id: container_id.to_string(),
            at_ms: started.duration_since(self.started).as_secs_f64() * 1000.0,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            outcome,
            ips,
            call,
        };
        if let Ok(mut log) = self.log.lock() {
            log.push(rec);
        }
    }

    fn kill_window(&self) -> Duration {
        Duration::from_micros(self.kill_window_us.load(Ordering::Relaxed))
    }

    /// Folds a successful ADD's duration into the kill window (weight 1/8).
    fn observe_add(&self, took: Duration) {
        let sample = took.as_micros() as u64;
        let _ = self
            .kill_window_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                Some(w - w / 8 + sample / 8)
            });
    }

    fn finding(&self, kind: FindingKind, detail: String, container_ids: Vec<String>) {
        if let Ok(mut f) = self.findings.lock() {
            f.push(Finding::new(kind, detail, container_ids));
        }
    }

    /// ADD, optionally killed after `kill_at` × the kill window. Returns
    /// whether the pod is now attached (and registered as live).
    fn add(&self, who: Actor, conf: &RuntimeConf, kill_at: Option<f64>) -> bool {
        let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
        let t = Instant::now();
        let (result, op) = match kill_at {
            Some(f) => {
                let after = self.kill_window().mul_f64(f);
                (
                    self.runtime.add_killed_after(self.net, conf, after),
                    format!("ADD (kill at {:.1} ms)", after.as_secs_f64() * 1000.0),
                )
            }
            None => (self.runtime.add(self.net, conf), "ADD".to_string()),
        };
        let outcome = outcome_of(&result, kill_at.is_some());
        if kill_at.is_some() {
            let counter = if outcome == OpOutcome::Killed {
                &self.kills_landed
            } else {
                &self.kills_missed
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let ips = ips_of(&result);
        let call = call_of(&result);
        let ok = result.is_ok();
        if ok {
            self.register(conf, &ips);
            // Also an ADD whose kill came too late: a full ADD's duration.
            self.observe_add(t.elapsed());
        }
        let failed = match &result {
            Err(e) if !matches!(outcome, OpOutcome::Killed | OpOutcome::Harness { .. }) => {
                Some(accounting::error_text(e))
            }
            _ => None,
        };
        self.record(who, &op, &conf.container_id, t, outcome, ips, call);
        if let Some(msg) = failed {
            self.add_failed(who, &conf.container_id, &msg);
        }
        ok
    }

    /// A failed ADD is a finding. One that ran out of addresses while
    /// fewer pods were live than the range holds is a leak: the live pods
    /// cannot explain it.
    fn add_failed(&self, who: Actor, container_id: &str, msg: &str) {
        // Pods the runtime lost keep their addresses until a GC: they explain
        // an exhaustion as much as live ones.
        let live = self.live.lock().map(|l| l.pods.len()).unwrap_or(0)
            + self.lost.lock().map(|l| l.len()).unwrap_or(0);
        if accounting::looks_exhausted(msg) {
            let (kind, why) = match self.capacity {
                Some(cap) if (live as u128) < cap => (
                    FindingKind::LeakedAddress,
                    format!(
                        "the range ran out while only {live} pods were live and the config's range holds {cap}: {} addresses were not released",
                        cap - live as u128
                    ),
                ),
                Some(cap) => (
                    FindingKind::AddFailed,
                    format!("the range ran out with {live} live pods (it holds {cap}): use a bigger range or fewer --pods/--parallel"),
                ),
                None => (
                    FindingKind::LeakedAddress,
                    format!(
                        "the range ran out while {live} pods were live (its size is not in the config, but a churn of at most {} pods at once should not exhaust it)",
                        self.opts.pods + self.opts.parallel
                    ),
                ),
            };
            self.finding(
                kind,
                format!(
                    "ADD of {container_id} ({}) failed: {msg}; {why}",
                    who.label()
                ),
                vec![container_id.to_string()],
            );
        } else {
            self.finding(
                FindingKind::AddFailed,
                format!("ADD of {container_id} ({}) failed: {msg}", who.label()),
                vec![container_id.to_string()],
            );
        }
    }

    /// Marks a pod attached; two live pods with one address is a finding.
    fn register(&self, conf: &RuntimeConf, ips: &[IpNet]) {
        let Ok(mut live) = self.live.lock() else {
            return;
        };
        for ip in ips {
            if let Some(other) = live.by_ip.get(&ip.addr()) {
                if *other != conf.container_id {
                    let detail = format!(
                        "{} was handed to {} while {} still held it",
                        ip.addr(),
                        conf.container_id,
                        other
                    );
                    let ids = vec![other.clone(), conf.container_id.clone()];
                    drop(live);
                    self.finding(FindingKind::DuplicateAddress, detail, ids);
                    live = match self.live.lock() {
                        Ok(l) => l,
                        Err(_) => return,
                    };
                }
            }
            live.by_ip.insert(ip.addr(), conf.container_id.clone());
        }
        live.pods.insert(
            conf.container_id.clone(),
            LivePod {
                conf: conf.clone(),
                ips: ips.to_vec(),
                tearing_down: false,
            },
        );
    }

    fn unregister(&self, container_id: &str) {
        if let Ok(mut live) = self.live.lock() {
            if let Some(pod) = live.pods.remove(container_id) {
                for ip in pod.ips {
                    if live
                        .by_ip
                        .get(&ip.addr())
                        .is_some_and(|o| o == container_id)
                    {
                        live.by_ip.remove(&ip.addr());
                    }
                }
            }
        }
    }

    fn begin_teardown(&self, container_id: &str) {
        if let Ok(mut live) = self.live.lock() {
            if let Some(pod) = live.pods.get_mut(container_id) {
                pod.tearing_down = true;
            }
        }
    }

    fn check(&self, who: Actor, conf: &RuntimeConf, op: &str) -> bool {
        let t = Instant::now();
        let result = self.runtime.check(self.net, conf);
        let ok = result.is_ok();
        self.record(
            who,
            op,
            &conf.container_id,
            t,
            outcome_of(&result, false),
            Vec::new(),
            call_of(&result),
        );
        ok
    }

    /// DEL, retried twice on failure like kubelet; the pod stops being live
    /// on the first success.
    fn del_with_retries(&self, who: Actor, conf: &RuntimeConf, op: &str) -> bool {
        for attempt in 0..3 {
            let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
            let t = Instant::now();
            let result = self.runtime.del(self.net, conf);
            let ok = result.is_ok();
            if ok {
                self.unregister(&conf.container_id);
            }
            let label = if attempt == 0 {
                op.to_string()
            } else {
                format!("{op} (retry {attempt})")
            };
            self.record(
                who,
                &label,
                &conf.container_id,
                t,
                outcome_of(&result, false),
                Vec::new(),
                call_of(&result),
            );
            if ok {
                return true;
            }
        }
        false
    }

    /// GC with every live attachment, exclusive of all other operations;
    /// then every live pod not being torn down must still pass CHECK.
    fn gc(&self, who: Actor) {
        let _exclusive = self.gate.write().unwrap_or_else(|e| e.into_inner());
        let pods: Vec<LivePod> = self
            .live
            .lock()
            .map(|l| l.pods.values().cloned().collect())
            .unwrap_or_default();
        let keep: Vec<Attachment> = pods
            .iter()
            .map(|p| Attachment {
                container_id: p.conf.container_id.clone(),
                ifname: p.conf.ifname.clone(),
            })
            .collect();
        let t = Instant::now();
        let result = self.runtime.gc(self.net, &keep, GcKey::Both);
        self.gc_runs.fetch_add(1, Ordering::Relaxed);
        self.record(
            who,
            &format!("GC (keeping {})", keep.len()),
            "",
            t,
            outcome_of(&result, false),
            Vec::new(),
            call_of(&result),
        );
        if !self.check_supported {
            return;
        }
        for pod in pods.iter().filter(|p| !p.tearing_down) {
            if !self.check(who, &pod.conf, "CHECK (after GC)") {
                self.finding(
                    FindingKind::LiveAttachmentBroken,
                    format!(
                        "{} was in the GC's list of live attachments but fails CHECK after the GC of {}",
                        pod.conf.container_id,
                        who.label()
                    ),
                    vec![pod.conf.container_id.clone()],
                );
            }
        }
    }

    /// One step: a pod from ADD to its last DEL.
    fn cycle(&self, plan: &CyclePlan) {
        let who = Actor::Step(plan.step);
        let id = step_container_id(plan.step);
        let t = Instant::now();
        let pod = match Netns::with_label("soak") {
            Ok(p) => p,
            Err(e) => {
                self.record(
                    who,
                    "create pod netns",
                    &id,
                    t,
                    OpOutcome::Harness { msg: e.to_string() },
                    Vec::new(),
                    None,
                );
                return;
            }
        };
        let pod_path = pod.path().to_path_buf();
        let mut conf = RuntimeConf::new(&id, Some(&pod_path), &self.opts.ifname);
        let attached = self.add(who, &conf, plan.kill_at);
        if plan.lost && !attached && self.last_add_was_killed(&id) {
            // The runtime died with the ADD and forgot the pod: its sandbox
            // goes away, no DEL is ever sent.
            let t = Instant::now();
            if let Ok(mut l) = self.lost.lock() {
                l.insert(id.clone());
            }
            let outcome = match pod.delete() {
                Ok(()) => OpOutcome::Ok,
                Err(e) => OpOutcome::Harness { msg: e.to_string() },
            };
            self.record(who, "pod lost (no DEL)", &id, t, outcome, Vec::new(), None);
            if plan.gc && self.gc_supported {
                self.gc(who);
            }
            return;
        }
        if plan.gc && self.gc_supported {
            self.gc(who);
        }
        if attached && self.check_supported {
            for _ in 0..plan.checks {
                let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
                self.check(who, &conf, "CHECK");
            }
        }
        let mut pod = Some(pod);
        {
            // Under the shared gate: a GC (exclusive) never sees a pod it
            // is about to CHECK lose its namespace halfway.
            let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
            self.begin_teardown(&id);
            match plan.del {
                DelVariant::Normal => {}
                DelVariant::NoNetns => conf.netns = None,
                DelVariant::NetnsGone => {
                    if let Some(p) = pod.take() {
                        if let Err(e) = p.delete() {
                            self.record(
                                who,
                                "delete pod netns",
                                &id,
                                Instant::now(),
                                OpOutcome::Harness { msg: e.to_string() },
                                Vec::new(),
                                None,
                            );
                        }
                    }
                }
            }
        }
        let deleted = self.del_with_retries(who, &conf, plan.del.label());
        if let Some(p) = &pod {
            self.inspect_pod_after_del(who, &id, p, plan.del, deleted);
        }
        drop(pod);
        for i in 0..plan.repeat_dels {
            let (netns, label) = if i % 2 == 0 {
                (Some(pod_path.clone()), "DEL (repeat, netns gone)")
            } else {
                (None, "DEL (repeat, no CNI_NETNS)")
            };
            let repeat = RuntimeConf {
                netns,
                ..conf.clone()
            };
            let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
            let t = Instant::now();
            let result = self.runtime.del(self.net, &repeat);
            self.record(
                who,
                label,
                &id,
                t,
                outcome_of(&result, false),
                Vec::new(),
                call_of(&result),
            );
        }
        if !deleted {
            if let Ok(mut u) = self.undeleted.lock() {
                u.push(conf);
            }
        }
    }

    /// After a DEL with the namespace still there: nothing of the plugin
    /// may be left in it (with CNI_NETNS set).
    fn inspect_pod_after_del(
        &self,
        who: Actor,
        id: &str,
        pod: &Netns,
        del: DelVariant,
        deleted: bool,
    ) {
        let t = Instant::now();
        let links = match pod.links() {
            Ok(l) => l,
            Err(e) => {
                self.record(
                    who,
                    "inspect pod netns",
                    id,
                    t,
                    OpOutcome::Harness { msg: e.to_string() },
                    Vec::new(),
                    None,
                );
                return;
            }
        };
        let left: Vec<String> = links
            .iter()
            .filter(|l| l.name != "lo")
            .map(|l| format!("{} ({})", l.name, l.kind.as_deref().unwrap_or("?")))
            .collect();
        if left.is_empty() || !deleted {
            return;
        }
        match del {
            DelVariant::Normal => self.finding(
                FindingKind::LeftInPodNetns,
                format!(
                    "after a successful DEL with CNI_NETNS={}, the pod namespace still has {}",
                    pod.path().display(),
                    left.join(", ")
                ),
                vec![id.to_string()],
            ),
            DelVariant::NoNetns => {
                self.left_without_netns.fetch_add(1, Ordering::Relaxed);
            }
            DelVariant::NetnsGone => {}
        }
    }

    /// After the final cleanup (no pod is live): ADD probe pods until every
    /// address the run handed out comes back. One the range ran out
    /// without is leaked, and attributed to its last owner.
    fn account_by_probing(&self, findings: &mut Vec<Finding>, notes: &mut Vec<String>) {
        let mut owner: BTreeMap<IpAddr, String> = BTreeMap::new();
        if let Ok(log) = self.log.lock() {
            for r in log.iter().filter(|r| r.op.starts_with("ADD")) {
                for ip in &r.ips {
                    owner.insert(ip.addr(), r.container_id.clone());
                }
            }
        }
        let wanted: BTreeSet<IpAddr> = owner.keys().copied().collect();
        let budget = match self.capacity {
            Some(c) => (c.min(1024) as usize) + 1,
            None => 64,
        };
        let probe = accounting::Probe {
            runtime: self.runtime,
            net: self.net,
            ifname: &self.opts.ifname,
            prefix: "soak-probe".into(),
            budget,
        };
        let outcome = probe.run(&wanted, &BTreeMap::new());
        for (ip, holder, second) in &outcome.duplicates {
            findings.push(Finding::new(
                FindingKind::DuplicateAddress,
                format!("{ip} was handed to probe pod {second} while probe pod {holder} still held it (after the cleanup)"),
                Vec::new(),
            ));
        }
        let mut unknown = Vec::new();
        for ip in &wanted {
            let id = owner.get(ip).cloned().unwrap_or_default();
            match outcome.release_of(*ip) {
                accounting::Release::Released(_) => {}
                accounting::Release::Held(why) => {
                    let lost = self.lost.lock().is_ok_and(|l| l.contains(&id));
                    findings.push(Finding::new(
                        FindingKind::LeakedAddress,
                        format!(
                            "{ip}, last handed to {id}, is still held after every pod was deleted: {why}{}",
                            if lost {
                                " — the runtime lost this pod after its ADD was killed: only GC could reclaim it"
                            } else {
                                ""
                            }
                        ),
                        vec![id],
                    ));
                }
                accounting::Release::Unknown(why) => unknown.push(why),
            }
        }
        if !unknown.is_empty() {
            notes.push(format!(
                "cannot tell whether {} address(es) were released: {}",
                unknown.len(),
                unknown[0]
            ));
        }
    }

    /// Whether the last ADD of `container_id` was killed as planned.
    fn last_add_was_killed(&self, container_id: &str) -> bool {
        self.log.lock().is_ok_and(|log| {
            log.iter()
                .rev()
                .find(|r| r.container_id == container_id && r.op.starts_with("ADD"))
                .is_some_and(|r| r.outcome == OpOutcome::Killed)
        })
    }

    /// Containers whose killed ADD was running when `path` was last
    /// modified (with 5 ms of slack on both sides).
    fn killed_adds_around(&self, path: &Path) -> Vec<String> {
        let Some(at_ms) = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(self.started_wall).ok())
            .map(|d| d.as_secs_f64() * 1000.0)
        else {
            return Vec::new();
        };
        let Ok(log) = self.log.lock() else {
            return Vec::new();
        };
        let mut out: Vec<String> = log
            .iter()
            .filter(|r| r.outcome == OpOutcome::Killed)
            .filter(|r| r.at_ms - 5.0 <= at_ms && at_ms <= r.at_ms + r.duration_ms + 5.0)
            .map(|r| r.container_id.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}
