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
    #[command(after_help = "Examples:\n  \
        cnilab conform --plugin-dir /usr/lib/cni --config harness/examples/reference-bridge.conflist\n  \
        cnilab conform --plugin-dir /usr/lib/cni --config harness/examples/debian-macvlan.conflist \\\n      \
        --host-setup harness/examples/macvlan-host-setup.sh\n\n\
        Exit codes: 0 no check failed, 1 a check failed, 2 usage or environment (the first ADD \
        failed for want of a kernel module, a master link or a plugin binary: nothing was judged)")]
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
        /// Hostile-input corpus whose generic cases make check X1 (default: tests/corpus when present).
        #[arg(long)]
        corpus: Option<PathBuf>,
        /// Shell script run (`sh FILE`) inside each fresh host namespace before every group,
        /// e.g. to create the macvlan/ipvlan master: harness/examples/macvlan-host-setup.sh.
        #[arg(long, value_name = "FILE")]
        host_setup: Option<PathBuf>,
        /// Check groups run at once, each in its own namespaces and store (1 for a plugin
        /// that keeps state outside ipam.dataDir).
        #[arg(long, default_value_t = cnilab_harness::conform::DEFAULT_JOBS)]
        jobs: usize,
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
    /// Simulated multi-node clusters in namespaces: build, check, tear down.
    Lab {
        #[command(subcommand)]
        command: LabCmd,
    },
    /// Replay bug scenarios (`lab/scenarios/*.toml`).
    Scenario {
        #[command(subcommand)]
        command: ScenarioCmd,
    },
    /// Churn a plugin (parallel ADD/CHECK/DEL/GC, killed ADDs, DELs after the
    /// netns is gone or without CNI_NETNS) and account for what it leaks
    /// (exit 0 iff no leak and no duplicate address).
    Soak {
        /// Directory (or colon-separated list, like CNI_PATH) with the plugin binaries.
        #[arg(long)]
        plugin_dir: String,
        /// Network config (.conf or .conflist). Its ipam.dataDir is replaced by a scratch directory.
        #[arg(long)]
        config: PathBuf,
        /// Resident pods, alive for the whole run (they must survive churn and GC).
        #[arg(long, default_value_t = 4)]
        pods: usize,
        /// Steps running at once.
        #[arg(long, default_value_t = 8)]
        parallel: usize,
        /// Run for this many seconds.
        #[arg(long, conflicts_with = "cycles")]
        duration: Option<u64>,
        /// Run this many steps (pod lifecycles); the default is 200.
        #[arg(long)]
        cycles: Option<u64>,
        /// Probability that a step's ADD is SIGKILLed at a random moment.
        #[arg(long, default_value_t = 0.1)]
        kill_rate: f64,
        /// Probability that the runtime then loses the killed pod (never sends its DEL; only GC can reclaim).
        #[arg(long, default_value_t = 0.0)]
        lose_rate: f64,
        /// PRNG seed (printed when chosen at random): same seed, same plan.
        #[arg(long)]
        seed: Option<u64>,
        /// A GC with the live attachments every N steps (when the plugin supports GC); 0: never.
        #[arg(long, default_value_t = 100)]
        gc_every: u64,
        /// Plant N leaked store records and a stray veth that GC must reclaim (self-test).
        #[arg(long, default_value_t = 0)]
        inject_leaks: usize,
        /// Run only this step of the seeded plan (replay a finding).
        #[arg(long)]
        replay: Option<u64>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = cnilab_harness::cli::Format::Table)]
        format: cnilab_harness::cli::Format,
        /// Write every operation to this file (JSON lines).
        #[arg(long)]
        log: Option<PathBuf>,
        /// Container interface name.
        #[arg(long, default_value = "eth0")]
        ifname: String,
        /// Per-call timeout in seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Remove namespaces left behind by killed cnilab runs.
    Sweep,
    /// Real clusters: kind and minikube step by step, and the in-cluster check.
    E2e {
        #[command(subcommand)]
        command: cnilab_harness::e2e::args::E2eCmd,
    },
}

#[derive(clap::Args)]
struct TopologyFlags {
    /// Topology file (TOML; examples in lab/topologies/).
    #[arg(long, conflicts_with = "nodes")]
    topology: Option<PathBuf>,
    /// Number of nodes (instead of a topology file) [default: 2].
    #[arg(long)]
    nodes: Option<usize>,
    /// Pods per node [default: 2, or the topology's].
    #[arg(long)]
    pods_per_node: Option<usize>,
    /// Plugin directory (default: the topology's, else the bundled cnilab-bridge next to this binary).
    #[arg(long)]
    plugin_dir: Option<String>,
}

impl TopologyFlags {
    fn args(&self) -> cnilab_harness::lab::commands::TopologyArgs {
        cnilab_harness::lab::commands::TopologyArgs {
            topology: self.topology.clone(),
            nodes: self.nodes,
            pods_per_node: self.pods_per_node,
        }
    }
}

#[derive(clap::Args)]
struct OutputFlags {
    /// Output format.
    #[arg(long, value_enum, default_value_t = cnilab_harness::lab::commands::LabFormat::Table)]
    format: cnilab_harness::lab::commands::LabFormat,
    /// Also write JUnit XML to this file.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Also write a self-contained HTML report to this file.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Only these check groups (prefixes, comma-separated), e.g. pod-to-pod,mtu.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

impl OutputFlags {
    fn outputs(&self) -> cnilab_harness::lab::commands::Outputs {
        cnilab_harness::lab::commands::Outputs {
            format: Some(self.format),
            junit: self.junit.clone(),
            report: self.report.clone(),
        }
    }
}

#[derive(Subcommand)]
enum LabCmd {
    /// Build a lab, run the connectivity checks, tear it down (exit 0 iff all passed).
    Run {
        #[command(flatten)]
        topology: TopologyFlags,
        #[command(flatten)]
        output: OutputFlags,
    },
    /// Build a lab and leave it standing (namespaces cnilab-lab-NAME-*).
    Up {
        #[command(flatten)]
        topology: TopologyFlags,
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
    },
    /// Run the checks against a standing lab.
    Check {
        #[arg(long, default_value = "default")]
        name: String,
        #[command(flatten)]
        output: OutputFlags,
    },
    /// Show standing labs.
    Status {
        #[arg(long)]
        name: Option<String>,
    },
    /// Remove a standing lab.
    Down {
        #[arg(long, default_value = "default")]
        name: String,
    },
}

#[derive(Subcommand)]
enum ScenarioCmd {
    /// List the scenarios in a directory.
    List {
        #[arg(long, default_value = "lab/scenarios")]
        dir: PathBuf,
    },
    /// Replay scenario files (exit 0 iff each behaved as written).
    Run {
        /// Scenario files (or a directory of them).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Plugin directory (default: the bundled cnilab-bridge).
        #[arg(long)]
        plugin_dir: Option<String>,
        /// Write JUnit XML to this file.
        #[arg(long)]
        junit: Option<PathBuf>,
    },
}

fn scenario_paths(files: &[PathBuf]) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for f in files {
        if f.is_dir() {
            out.extend(cnilab_harness::lab::commands::scenario_files(f)?);
        } else {
            out.push(f.clone());
        }
    }
    Ok(out)
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
            corpus,
            host_setup,
            jobs,
        } => cnilab_harness::cli::conform(
            &cnilab_harness::conform::ConformOptions {
                plugin_dir,
                config,
                ifname,
                only,
                timeout: Duration::from_secs(timeout),
                corpus: corpus.or_else(|| {
                    let default = PathBuf::from("tests/corpus");
                    default.is_dir().then_some(default)
                }),
                host_setup,
                jobs,
            },
            format,
            junit.as_deref(),
        ),
        Cmd::Lifecycle {
            plugin_dir,
            config,
            ifname,
        } => cnilab_harness::cli::lifecycle(&plugin_dir, &config, &ifname),
        Cmd::Lab { command } => {
            use cnilab_harness::lab::commands as lab;
            match command {
                LabCmd::Run { topology, output } => lab::run(
                    &topology.args(),
                    topology.plugin_dir.clone(),
                    &output.only,
                    &output.outputs(),
                ),
                LabCmd::Up { topology, name } => {
                    lab::up(&topology.args(), topology.plugin_dir.clone(), &name)
                }
                LabCmd::Check { name, output } => {
                    lab::check(&name, &output.only, &output.outputs())
                }
                LabCmd::Status { name } => lab::status(name.as_deref()),
                LabCmd::Down { name } => lab::down(&name),
            }
        }
        Cmd::Scenario { command } => match command {
            ScenarioCmd::List { dir } => cnilab_harness::lab::commands::scenario_list(&dir),
            ScenarioCmd::Run {
                files,
                plugin_dir,
                junit,
            } => scenario_paths(&files).and_then(|paths| {
                cnilab_harness::lab::commands::scenario_run(&paths, plugin_dir, junit.as_deref())
            }),
        },
        Cmd::Soak {
            plugin_dir,
            config,
            pods,
            parallel,
            duration,
            cycles,
            kill_rate,
            lose_rate,
            seed,
            gc_every,
            inject_leaks,
            replay,
            format,
            log,
            ifname,
            timeout,
        } => {
            let mut opts = cnilab_harness::soak::SoakOptions::new(&plugin_dir, &config);
            opts.pods = pods;
            opts.parallel = parallel;
            opts.budget = match duration {
                Some(s) => cnilab_harness::soak::Budget::Duration(Duration::from_secs(s)),
                None => cnilab_harness::soak::Budget::Cycles(cycles.unwrap_or(200)),
            };
            opts.kill_rate = kill_rate;
            opts.lose_rate = lose_rate;
            opts.seed = seed.unwrap_or(opts.seed);
            opts.gc_every = gc_every;
            opts.inject_leaks = inject_leaks;
            opts.replay = replay;
            opts.ifname = ifname;
            opts.timeout = Duration::from_secs(timeout);
            cnilab_harness::cli::soak(&opts, format, log.as_deref())
        }
        Cmd::Sweep => cnilab_harness::cli::sweep(),
        Cmd::E2e { command } => cnilab_harness::e2e::args::dispatch(command).map_err(Into::into),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cnilab: {e}");
            ExitCode::from(2)
        }
    }
}
