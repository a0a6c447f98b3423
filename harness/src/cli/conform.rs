//! `cnilab conform`.

use super::args::{CheckOutputArgs, PluginArgs};
use super::CliResult;
use crate::conform::{self, ConformOptions, Progress as GroupProgress};
use crate::report::{self, progress::Progress};
use std::path::PathBuf;
use std::process::ExitCode;

/// Check a plugin against the CNI conformance checklist.
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab conform --plugin-dir /usr/lib/cni --config harness/examples/reference-bridge.conflist\n  \
    cnilab conform --plugin-dir /usr/lib/cni --config harness/examples/debian-macvlan.conflist \\\n      \
    --host-setup harness/examples/macvlan-host-setup.sh -o junit > conform.xml\n\n",
    crate::exit_codes_help!(),
    " (2 also when the first ADD failed for want of a kernel module, a master link or a plugin \
    binary; 3 when every check was skipped)"))]
pub struct Conform {
    #[command(flatten)]
    pub plugin: PluginArgs,
    /// Only these checks, comma-separated (e.g. A5,D7,E3).
    #[arg(long, value_delimiter = ',')]
    pub only: Option<Vec<String>>,
    #[command(flatten)]
    pub output: CheckOutputArgs,
    /// Also write JUnit XML to this file.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Hostile-input corpus whose generic cases make check X1 (default: the
    /// built-in corpus, or tests/corpus when that directory exists here).
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Shell script run (`sh FILE`) inside each fresh host namespace before every group,
    /// e.g. to create the macvlan/ipvlan master: harness/examples/macvlan-host-setup.sh.
    #[arg(long, value_name = "FILE")]
    pub host_setup: Option<PathBuf>,
    /// Check groups run at once, each in its own namespaces and store (1 for a plugin
    /// that keeps state outside ipam.dataDir).
    #[arg(long, default_value_t = crate::conform::DEFAULT_JOBS)]
    pub jobs: usize,
    /// Seed of the container IDs (64 hex characters, like a runtime's; a
    /// new seed per run without it, printed on stderr).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl Conform {
    pub fn options(&self) -> ConformOptions {
        ConformOptions {
            plugin_dir: self.plugin.plugin_dir.clone(),
            config: self.plugin.config.clone(),
            ifname: self.plugin.ifname.clone(),
            only: self.only.clone(),
            timeout: self.plugin.timeout,
            corpus: Some(
                self.corpus
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(crate::assets::CORPUS)),
            ),
            host_setup: self.host_setup.clone(),
            jobs: self.jobs,
            seed: self.seed,
        }
    }

    pub fn run(self) -> CliResult {
        crate::netns::require_root()?;
        // A corpus the user names must load before any rule runs (exit 2).
        if let Some(dir) = &self.corpus {
            crate::corpus::load_dir(dir)?;
        }
        let bar = Progress::stderr();
        // Finished groups are always listed on stderr (stdout stays the report).
        let mut progress = |p: GroupProgress<'_>| match p.elapsed {
            None => bar.status(&format!("[{}/{}] {} …", p.done + 1, p.total, p.group)),
            Some(t) => bar.line(&format!(
                "[{}/{}] {} ({:.1} s)",
                p.done,
                p.total,
                p.group,
                t.as_secs_f64()
            )),
        };
        let mut opts = self.options();
        let seed = opts.seed.unwrap_or_else(crate::rng::seed_from_clock);
        opts.seed = Some(seed);
        let report = conform::run(&opts, &mut progress)?;
        // After the run, so that an error stays the first line on stderr.
        bar.line(&format!("container IDs from --seed {seed}"));
        report::emit(&report, self.output.output, self.junit.as_deref(), None)?;
        let s = &report.summary;
        Ok(if s.failed > 0 {
            ExitCode::from(report::exit::FAIL)
        } else if s.checks > 0 && s.skipped == s.checks {
            ExitCode::from(report::exit::INCONCLUSIVE)
        } else {
            ExitCode::from(report::exit::PASS)
        })
    }
}
