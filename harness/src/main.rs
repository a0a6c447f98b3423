//! `cnilab`: parses the command line and dispatches to the library.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "cnilab",
    version,
    about = "Write, test and debug Kubernetes CNI plugins"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure ADD/DEL latency of a plugin (optionally beside another one).
    Bench {
        /// Directory (or colon-separated list, like CNI_PATH) with the plugin binaries.
        #[arg(long)]
        plugin_dir: String,
        /// Network config (.conf or .conflist).
        #[arg(long)]
        config: PathBuf,
        /// Pods per phase.
        #[arg(long, default_value_t = 50)]
        pods: usize,
        /// Workers in the parallel phases.
        #[arg(long, default_value_t = 8)]
        parallel: usize,
        /// Plugin directory of the plugin to compare with.
        #[arg(long, requires = "vs_config")]
        vs_plugin_dir: Option<String>,
        /// Network config of the plugin to compare with.
        #[arg(long, requires = "vs_plugin_dir")]
        vs_config: Option<PathBuf>,
        /// Per-call timeout in seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Check a plugin against the CNI conformance checklist (exit 0 iff no check fails).
    Conform {
        /// Directory (or colon-separated list, like CNI_PATH) with the plugin binaries.
        #[arg(long)]
        plugin_dir: String,
        /// Network config (.conf or .conflist). Its ipam.dataDir is replaced by a scratch directory.
        #[arg(long)]
        config: PathBuf,
        /// Container interface name.
        #[arg(long, default_value = "eth0")]
        ifname: String,
        /// Only these checks, comma-separated (e.g. A5,D7,E3).
        #[arg(long, value_delimiter = ',')]
        only: Option<Vec<String>>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = cnilab_harness::cli::Format::Table)]
        format: cnilab_harness::cli::Format,
        /// Also write JUnit XML to this file.
        #[arg(long)]
        junit: Option<PathBuf>,
        /// Per-call timeout in seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Run one pod's full lifecycle (ADD, verify, CHECK, tamper, DEL, cleanup, DEL variants).
    Lifecycle {
        /// Directory (or colon-separated list, like CNI_PATH) with the plugin binaries.
        #[arg(long)]
        plugin_dir: String,
        /// Network config (.conf or .conflist).
        #[arg(long)]
        config: PathBuf,
        /// Container interface name.
        #[arg(long, default_value = "eth0")]
        ifname: String,
    },
    /// Remove namespaces left behind by killed cnilab runs.
    Sweep,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Cmd::Bench {
            plugin_dir,
            config,
            pods,
            parallel,
            vs_plugin_dir,
            vs_config,
            timeout,
            json,
        } => cnilab_harness::cli::bench(
            &cnilab_harness::bench::BenchOptions {
                plugin_dir,
                config,
                pods,
                parallel,
                versus: vs_plugin_dir.zip(vs_config),
                timeout: Duration::from_secs(timeout),
            },
            json,
        ),
        Cmd::Conform {
            plugin_dir,
            config,
            ifname,
            only,
            format,
            junit,
            timeout,
        } => cnilab_harness::cli::conform(
            &cnilab_harness::conform::ConformOptions {
                plugin_dir,
                config,
                ifname,
                only,
                timeout: Duration::from_secs(timeout),
            },
            format,
            junit.as_deref(),
        ),
        Cmd::Lifecycle {
            plugin_dir,
            config,
            ifname,
        } => cnilab_harness::cli::lifecycle(&plugin_dir, &config, &ifname),
        Cmd::Sweep => cnilab_harness::cli::sweep(),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cnilab: {e}");
            ExitCode::from(2)
        }
    }
}
