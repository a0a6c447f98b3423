//! `cnilab scenario …`: replay bug scenarios.

use super::args::{CheckOutputArgs, OutputArgs};
use super::CliResult;
use crate::lab::commands as lab;
use clap::Subcommand;
use std::path::PathBuf;

/// Replay bug scenarios (`lab/scenarios/*.toml`).
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab scenario list\n  \
    cnilab scenario run lab/scenarios -o junit > scenarios.xml\n\n",
    crate::exit_codes_help!()))]
pub struct Scenario {
    #[command(subcommand)]
    pub command: ScenarioCmd,
}

#[derive(Subcommand)]
pub enum ScenarioCmd {
    /// List the scenarios in a directory.
    #[command(after_help = concat!("Examples:\n  \
        cnilab scenario list\n  \
        cnilab scenario list --dir my/scenarios -o json\n\n",
        crate::exit_codes_help!()))]
    List {
        /// Directory of scenario files (default: the built-in scenarios, or
        /// lab/scenarios when that directory is here).
        #[arg(long, default_value = crate::assets::SCENARIOS)]
        dir: PathBuf,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Replay scenario files (exit 0 iff each behaved as written).
    #[command(after_help = concat!("Examples:\n  \
        cnilab scenario run lab/scenarios/missing-route.toml\n  \
        cnilab scenario run missing-route --plugin-dir /usr/lib/cni --config lab/configs/lab-ptp.conflist.tmpl\n  \
        cnilab scenario run lab/scenarios -o json\n\n\
        A scenario that cannot apply to the plugin (a fault that needs the bundled plugin's\n\
        bridge) is SKIP with the reason; one whose lab cannot be set up is ERROR (exit 2).\n\n",
        crate::exit_codes_help!()))]
    Run {
        /// Scenario files, directories of them, or built-in scenarios' names
        /// (`cnilab scenario list`).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Plugin directory, or several joined by ':' (default: the bundled
        /// cnilab-bridge). With your own plugin, pass --config too.
        #[arg(long, value_name = "DIR[:DIR]")]
        plugin_dir: Option<String>,
        /// Plugin config template for every scenario's nodes (placeholders:
        /// see `cnilab lab run --help`).
        #[arg(long, value_name = "TEMPLATE")]
        config: Option<PathBuf>,
        /// How the labs attach pods: `direct` or `containerd` (CRI, like kubelet).
        #[arg(long, value_enum, default_value_t = crate::lab::cri::RuntimeKind::Direct)]
        runtime: crate::lab::cri::RuntimeKind,
        #[command(flatten)]
        output: CheckOutputArgs,
        /// Also write JUnit XML to this file.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
    },
}

impl Scenario {
    pub fn run(self) -> CliResult {
        match self.command {
            ScenarioCmd::List { dir, output } => lab::scenario_list(&dir, output.output),
            ScenarioCmd::Run {
                files,
                plugin_dir,
                config,
                runtime,
                output,
                junit,
            } => lab::scenario_run(&lab::ScenarioRun {
                files: lab::scenario_paths(&files)?,
                plugin_dir,
                config,
                runtime,
                format: output.output,
                junit,
            }),
        }
    }
}
