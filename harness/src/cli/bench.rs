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
    cnilab bench --plugin-dir target/release --config a.conflist \\\n      \
    --vs-plugin-dir /usr/lib/cni --vs-config harness/examples/reference-bridge.conflist -o json\n\n",
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
    /// Directory holding `cnilab-floor`, the floor every figure is also
    /// compared with (default: next to cnilab, else in --plugin-dir).
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
        let result = bench::run(&opts)?;
        if self.json || self.output.output == Format::Json {
            println!("{}", report::json("BenchReport", &result));
        } else {
            report::print_human(&result.to_string());
        }
        Ok(report::verdict(true))
    }
}
