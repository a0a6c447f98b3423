//! `cnilab soak`: randomized churn against a plugin, then an account of leftovers.
//!
//! Where things happen: `preflight` decides what may run, `engine` holds
//! the shared state, each operation and the phases (residents, churn,
//! teardown), [`plan`] each step's plan, `inject` the planted leaks,
//! `account` what was left behind, [`report`] the findings; [`run`] calls
//! the phases in order.
//!
//! A randomized, reproducible churn of ADD/CHECK/DEL/GC
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
mod account;
mod engine;
mod inject;
pub mod plan;
mod preflight;
pub mod report;
pub use crate::rng;

use crate::accounting;
use crate::host_state;
use crate::netns::{Netns, NetnsError};
use crate::runtime::session::Session;
use crate::runtime::{GcKey, NetworkConfig, Runtime, RuntimeConf, RuntimeError};
use crate::util::ScratchDir;
use cnilab_net::spec::Attachment;
use engine::{Live, Soak};
use ipnet::IpNet;
use plan::{CyclePlan, DelVariant, PlanKnobs};
use preflight::Preflight;
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

/// Runs a soak. Needs root (namespaces).
pub fn run(opts: &SoakOptions) -> Result<SoakReport, SoakError> {
    opts.validate()?;
    crate::netns::require_root()?;
    let net = NetworkConfig::load(&opts.config).map_err(Box::new)?;
    let scratch = ScratchDir::new("soak").map_err(SoakError::Scratch)?;
    let Session {
        net,
        data_dir: _,
        host,
        runtime,
    } = Session::open::<SoakError>(
        &opts.plugin_dir,
        &net,
        &scratch.path().join("ipam"),
        "soak-host",
        opts.timeout,
    )?;
    let Preflight {
        mut notes,
        plugin_versions,
        check_supported,
        gc_supported,
    } = preflight::preflight(opts, &runtime, &net)?;

    // The shared state, then the warm-up ([`Soak::warm_up`]): what it
    // leaves is the baseline, and it times an ADD for the kill window.
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
    let store_dir = net.ipam_store_dir();
    let layout = soak.warm_up(store_dir.as_deref())?;
    let baseline_links = host.links()?;
    let baseline_rules = host_state::firewall_rules(&host);

    let residents = soak.add_residents()?;
    let injected = if opts.inject_leaks > 0 {
        Some(inject::plant(&host, &net, store_dir.as_deref(), opts)?)
    } else {
        None
    };
    let churn_time = soak.churn();
    soak.tear_down();
    drop(residents);
    let account = soak.account(
        &host,
        account::Baseline {
            links: &baseline_links,
            rules: baseline_rules.as_deref(),
            store_dir: store_dir.as_deref(),
            layout,
        },
        injected.as_ref(),
        &mut notes,
    )?;
    let kill_window = soak.kill_window();
    let lost_pods = soak.lost.lock().map(|l| l.len()).unwrap_or(0) as u64;
    let log = soak.log.into_inner().unwrap_or_default();
    let mut findings = account.findings;
    for f in &mut findings {
        f.attach(&log, opts);
    }
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
        injected: account.injected,
        notes,
    }))
}
