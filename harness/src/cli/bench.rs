//! `cnilab bench`.

use super::args::{OutputArgs, PluginArgs};
use super::CliResult;
use crate::bench::{self, BenchOptions};
use crate::report::{self, Format};
use std::path::PathBuf;

/// Measure ADD/DEL latency of a plugin (optionally beside another one).
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab bench --plugin-dir target/release --config harness/examples/cnilab-bridge.conflist --pods 100\n  \
    cnilab bench --plugin-dir target/release --config harness/examples/cnilab-bridge.conflist \\\n      \
    --vs-plugin-dir /usr/lib/cni --vs-config harness/examples/reference-bridge.conflist --lab 10x100\n\n",
    crate::exit_codes_help!()))]
pub struct Bench {
    #[command(flatten)]
    pub plugin: PluginArgs,
    /// Pods per phase.
    #[arg(long, default_value_t = 50)]
    pub pods: usize,
    /// Workers in the parallel phases.
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Plugin directory of the plugin to compare with.
    #[arg(long, requires = "vs_config")]
    pub vs_plugin_dir: Option<String>,
    /// Network config of the plugin to compare with.
    #[arg(long, requires = "vs_plugin_dir")]
    pub vs_config: Option<PathBuf>,
    /// Also run a throwaway lab of NODESxPODS (`10x100`) with the bundled
    /// cnilab-bridge and print its verdict, phases, attach time per pod and
    /// peak memory; with --vs-plugin-dir, also conform's wall time on that
    /// plugin.
    #[arg(long, value_name = "NODESxPODS", value_parser = crate::bench::lab::parse_size)]
    pub lab: Option<(usize, usize)>,
    /// With --lab: raise the host's neighbour-table thresholds for the run
    /// if the lab needs it (restored afterwards).
    #[arg(long, requires = "lab")]
    pub tune_host: bool,
    /// Directory holding `cnilab-floor`, the floor every figure is also
    /// compared with, plain and bridged (default: next to cnilab, else in
    /// --plugin-dir).
    #[arg(long)]
    pub floor_dir: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Same as `-o json` (older spelling).
    #[arg(long)]
    pub json: bool,
}

impl Bench {
    pub fn run(self) -> CliResult {
        crate::netns::require_root()?;
        let opts = BenchOptions {
            plugin_dir: self.plugin.plugin_dir,
            config: self.plugin.config,
            ifname: self.plugin.ifname,
            pods: self.pods,
            parallel: self.parallel,
            versus: self.vs_plugin_dir.zip(self.vs_config),
            timeout: self.plugin.timeout,
            floor_dir: self.floor_dir,
        };
        let mut result = bench::run(&opts)?;
        let mut passed = true;
        if let Some(size) = self.lab {
            let figures = run_lab(size, self.tune_host)?;
            passed = figures.passed;
            result.lab = Some(figures);
            if let Some((dir, config)) = &opts.versus {
                result.conform = Some(run_conform(dir, config)?);
            }
        }
        if self.json || self.output.output == Format::Json {
            println!("{}", report::json("BenchReport", &result));
        } else {
            report::print_human(&result.to_string());
        }
        Ok(report::verdict(passed))
    }
}

/// `cnilab conform` on `dir` and `config` as the CLI runs it (the built-in
/// corpus included), its wall time.
fn run_conform(
    dir: &str,
    config: &std::path::Path,
) -> Result<crate::bench::lab::ConformFigures, Box<dyn std::error::Error>> {
    let mut opts = crate::conform::ConformOptions::new(dir, config);
    opts.corpus = Some(PathBuf::from(crate::assets::CORPUS));
    let started = std::time::Instant::now();
    let report = crate::conform::run(&opts, &mut |_| {})?;
    Ok(crate::bench::lab::ConformFigures {
        plugin_dir: dir.to_string(),
        config: config.display().to_string(),
        checks: report.summary.checks,
        failed: report.summary.failed,
        wall_ms: started.elapsed().as_secs_f64() * 1000.0,
    })
}

/// One throwaway `cnilab lab run` of `size`, its figures.
fn run_lab(
    (nodes, pods): (usize, usize),
    tune_host: bool,
) -> Result<crate::bench::lab::LabFigures, Box<dyn std::error::Error>> {
    use super::{lab::run_report, lab_prep::TopologyFlags};
    let args = TopologyFlags {
        nodes: Some(nodes),
        pods_per_node: Some(pods),
        ..TopologyFlags::default()
    };
    let started = std::time::Instant::now();
    let report = run_report(&args, tune_host, &[])?;
    let verdict = if report.inconclusive.is_some() {
        "inconclusive"
    } else if report.passed() {
        "pass"
    } else {
        "fail"
    };
    Ok(crate::bench::lab::LabFigures::new(
        (nodes, pods),
        verdict,
        report.probes,
        &report.phases_ms,
        started.elapsed(),
    ))
}
