//! `cnilab soak`.

use super::args::{CheckOutputArgs, PluginArgs};
use super::CliResult;
use crate::report;
use crate::soak::{Budget, SoakOptions};
use crate::util::parse_duration;
use std::path::PathBuf;
use std::time::Duration;

/// Churn a plugin (parallel ADD/CHECK/DEL/GC, killed ADDs, DELs after the
/// netns is gone or without CNI_NETNS) and account for what it leaks
/// (exit 0 iff no leak and no duplicate address).
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab soak --plugin-dir /usr/lib/cni --config harness/examples/reference-bridge.conflist --duration 2m\n  \
    cnilab soak --plugin-dir target/debug --config harness/examples/cnilab-bridge.conflist --seed 42 --replay 17 -o json\n\n",
    crate::exit_codes_help!()))]
pub struct Soak {
    #[command(flatten)]
    pub plugin: PluginArgs,
    /// Resident pods, alive for the whole run (they must survive churn and GC).
    #[arg(long, default_value_t = 4)]
    pub pods: usize,
    /// Steps running at once.
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Run for this long (30s, 2m; a bare number is seconds).
    #[arg(long, conflicts_with = "cycles", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Run this many steps (pod lifecycles); the default is 200.
    #[arg(long)]
    pub cycles: Option<u64>,
    /// Probability that a step's ADD is SIGKILLed at a random moment.
    #[arg(long, default_value_t = 0.1)]
    pub kill_rate: f64,
    /// Probability that the runtime then loses the killed pod (never sends its DEL; only GC can reclaim).
    #[arg(long, default_value_t = 0.0)]
    pub lose_rate: f64,
    /// PRNG seed (printed when chosen at random): same seed, same plan.
    #[arg(long)]
    pub seed: Option<u64>,
    /// A GC with the live attachments every N steps (when the plugin supports GC); 0: never.
    #[arg(long, default_value_t = 100)]
    pub gc_every: u64,
    /// Plant N leaked store records and a stray veth that GC must reclaim (self-test).
    #[arg(long, default_value_t = 0)]
    pub inject_leaks: usize,
    /// Run only this step of the seeded plan (replay a finding).
    #[arg(long)]
    pub replay: Option<u64>,
    #[command(flatten)]
    pub output: CheckOutputArgs,
    /// Also write JUnit XML to this file.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Write every operation to this file (JSON lines).
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
}

impl Soak {
    pub fn options(&self) -> SoakOptions {
        let p = &self.plugin;
        let mut opts = SoakOptions::new(&p.plugin_dir, &p.config);
        opts.pods = self.pods;
        opts.parallel = self.parallel;
        opts.budget = match self.duration {
            Some(d) => Budget::Duration(d),
            None => Budget::Cycles(self.cycles.unwrap_or(200)),
        };
        opts.kill_rate = self.kill_rate;
        opts.lose_rate = self.lose_rate;
        opts.seed = self.seed.unwrap_or(opts.seed);
        opts.gc_every = self.gc_every;
        opts.inject_leaks = self.inject_leaks;
        opts.replay = self.replay;
        opts.ifname = p.ifname.clone();
        opts.timeout = p.timeout;
        opts.progress = true;
        opts
    }

    pub fn run(self) -> CliResult {
        crate::netns::require_root()?;
        let opts = self.options();
        eprintln!(
            "cnilab soak: seed {} (replay with --seed {})",
            opts.seed, opts.seed
        );
        let result = crate::soak::run(&opts)?;
        report::emit(&result, self.output.output, self.junit.as_deref(), None)?;
        if let Some(path) = &self.log {
            std::fs::write(path, result.log_jsonl()).map_err(|e| {
                format!("cannot write the operations log to {}: {e}", path.display())
            })?;
        }
        Ok(report::verdict(result.passed()))
    }
}
