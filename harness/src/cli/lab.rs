//! `cnilab lab …`: simulated multi-node clusters in namespaces: the flags,
//! and what each command does once parsed (printing and exit codes here;
//! the lab itself is `crate::lab`).

use super::args::{CheckOutputArgs, OutputArgs};
use super::lab_prep::{self, Prepared, TopologyFlags};
use super::CliResult;
use crate::lab::base::RuntimeKind;
use crate::lab::base::UpOptions;
use crate::lab::report::Report;
use crate::lab::state;
use crate::netns;
use crate::report::{self, Format};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Simulated multi-node clusters in namespaces: build, check, tear down.
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab lab run --nodes 3\n  \
    cnilab lab run --nodes 4 --pods-per-node 25 --vxlan --service\n  \
    cnilab lab run --shape routed\n  \
    cnilab lab up --name demo && cnilab lab check --name demo -o junit > lab.xml\n\n",
    crate::exit_codes_help!()))]
pub struct LabArgs {
    #[command(subcommand)]
    pub command: LabCmd,
}

/// Where the check's report goes, and which checks run.
#[derive(clap::Args)]
pub struct ReportFlags {
    #[command(flatten)]
    pub output: CheckOutputArgs,
    /// Also write JUnit XML to this file.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Also write a self-contained HTML report to this file.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Only these check groups (prefixes, comma-separated), e.g. pod-to-pod,mtu;
    /// add @ipv4 or @ipv6 for one address family (pod-to-pod/cross-node@ipv6).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

#[derive(Subcommand)]
pub enum LabCmd {
    /// Build a lab, run the connectivity checks, tear it down (exit 0 iff all passed).
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab run\n  \
        cnilab lab run --topology lab/topologies/agent.toml --only pod-to-pod -o json\n  \
        cnilab lab run --topology lab/topologies/dual-stack.toml\n  \
        cnilab lab run --plugin-dir /usr/lib/cni --config lab/configs/lab-ptp.conflist.tmpl\n  \
        cnilab lab run --nodes 10 --pods-per-node 100\n  \
        cnilab lab run --runtime containerd\n  \
        cnilab lab run --capture node1.json node2.json --kernel auto\n\n\
        Large labs: the host's neighbour tables (one per family for every namespace) hold\n\
        gc_thresh3 entries; a lab that needs more gets permanent entries for its bulk probe\n\
        paths (the first pod of each node still resolves through ARP/NDP), or is refused\n\
        up front with the numbers. A run that hits the limit anyway is INCONCLUSIVE (3).\n\n\
        Labs over the probe budget (pods × nodes × 7 > 100,000 a family: above 10 × 100)\n\
        sample pod-to-pod/cross-node, pod-to-node and node-to-pod, and say so up front:\n\
        every pod is probed as a source and as a destination, and every ordered node pair\n\
        is covered by at least 2 pods (rotating positions).\n\n",
        crate::exit_codes_help!()))]
    Run {
        #[command(flatten)]
        topology: TopologyFlags,
        /// If the lab needs more neighbour entries than the host's tables
        /// hold, raise net.ipv4/ipv6.neigh.default.gc_thresh1/2/3 for the
        /// run (IPv6 also for every interface's link-local entries); they
        /// are restored afterwards, also on Ctrl-C.
        #[arg(long)]
        tune_host: bool,
        #[command(flatten)]
        kernel: super::vm::KernelFlags,
        #[command(flatten)]
        output: ReportFlags,
    },
    /// Build a lab and leave it standing (namespaces cnilab-lab-NAME-*).
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab up --name demo --nodes 3\n  \
        cnilab lab up --name demo --topology lab/topologies/agent.toml -o json\n  \
        cnilab lab up --name demo --runtime containerd\n\n",
        crate::exit_codes_help!()))]
    Up {
        #[command(flatten)]
        topology: TopologyFlags,
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
        /// Not for a standing lab: a lab in a microVM ends with the VM
        /// (`lab run --capture … --kernel auto` replays and checks there).
        #[arg(long, value_name = "auto|VERSION|PATH", requires = "capture")]
        kernel: Option<String>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Run the checks against a standing lab.
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab check --name demo\n  \
        cnilab lab check --name demo -o junit > lab.xml\n\n",
        crate::exit_codes_help!()))]
    Check {
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
        #[command(flatten)]
        output: ReportFlags,
    },
    /// Show standing labs.
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab status\n  \
        cnilab lab status --name demo -o json\n\n",
        crate::exit_codes_help!()))]
    Status {
        /// Only this lab (default: every standing lab).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Print a standing lab's network as read from its namespaces: links,
    /// addresses, routes, rules, neighbours, FDB, nftables tables, sysctls
    /// (the lab model; `-o json` for the model itself).
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab show --name demo\n  \
        cnilab lab show --name demo -o json\n\n",
        crate::exit_codes_help!()))]
    Show {
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Follow one packet from FROM to TO through every namespace it crosses
    /// and say where it died: the kernel's routing answer at each hop and
    /// nftables' own trace of one real probe (exit 0 arrived, 1 died,
    /// 3 inconclusive).
    #[command(after_help = concat!("FROM and TO are pods, nodes or addresses of the lab.\n\n\
        Examples:\n  \
        cnilab lab trace --name demo node1-pod0 node2-pod0\n  \
        cnilab lab trace --name demo node1-pod0 node2 --proto tcp --port 7777 -o json\n  \
        cnilab lab trace --name demo node1-pod0 node2-pod0 --size 1500\n  \
        cnilab lab trace --name demo node1-pod0 node2-pod0 --proto tcp --invalid\n\n",
        crate::exit_codes_help!()))]
    Trace {
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
        /// Where the packet starts: a pod, a node or an address.
        from: String,
        /// Where it should arrive: a pod, a node or an address.
        to: String,
        /// The probe's protocol.
        #[arg(long, value_enum, default_value_t = crate::trace::Proto::Icmp)]
        proto: crate::trace::Proto,
        /// Destination port (tcp, udp; default the lab's probe port).
        #[arg(long)]
        port: Option<u16>,
        /// The probe's size in bytes, IP header included, sent with DF
        /// (icmp; default ping's 84, or 104 for IPv6): finds an MTU too small.
        #[arg(long, value_parser = clap::value_parser!(u32).range(48..=65535))]
        size: Option<u32>,
        /// Send a TCP segment with no flags set, which conntrack classes
        /// INVALID, instead of a SYN (tcp): finds what drops INVALID
        /// packets (`ct state invalid drop`). `lab check` never does: its
        /// probes each open a new flow.
        #[arg(long)]
        invalid: bool,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// How fast each path of a lab is (same node, across nodes, node to
    /// pod, through a Service, out through the masquerade) as a ratio to
    /// the underlay between its nodes, with spreads over interleaved
    /// rounds; against a saved result (`--baseline`) it FAILs a regression
    /// and names the path and the metric (exit 0, 1 regression or no
    /// traffic, 3 too noisy for a verdict).
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab perf --nodes 2 --pods-per-node 2\n  \
        cnilab lab perf --save perf.json && cnilab lab perf --baseline perf.json\n  \
        cnilab lab perf --vs-plugin-dir /usr/lib/cni --vs-config lab/configs/lab-reference.conflist.tmpl\n  \
        cnilab lab perf --vxlan --report perf.html -o json > perf.json\n  \
        cnilab lab perf --name demo --rounds 9\n\n",
        crate::exit_codes_help!()))]
    Perf {
        #[command(flatten)]
        topology: TopologyFlags,
        #[command(flatten)]
        perf: super::lab_perf::PerfFlags,
    },
    /// Every cause `lab check`, `lab trace` and the in-cluster check name for
    /// a failed probe: what it means, the object that proves it, the fix.
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab causes\n  \
        cnilab lab causes vxlan-fdb-missing\n  \
        cnilab lab causes -o json\n\n",
        crate::exit_codes_help!()))]
    Causes {
        /// One cause's id (as a report names it).
        #[arg(value_name = "CAUSE")]
        id: Option<String>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Remove a standing lab.
    #[command(after_help = concat!("Examples:\n  \
        cnilab lab down --name demo\n\n",
        crate::exit_codes_help!()))]
    Down {
        /// Lab name.
        #[arg(long, default_value = "default")]
        name: String,
    },
}

impl LabArgs {
    pub fn run(self) -> CliResult {
        match self.command {
            LabCmd::Run {
                topology,
                tune_host,
                kernel,
                output,
            } if !topology.capture.is_empty() => {
                replay_run(&topology.capture, tune_host, &kernel, &output)
            }
            LabCmd::Run { kernel, .. } if kernel.kernel.is_some() => Err(format!(
                "--kernel {}: replays captures on another kernel: add --capture FILE...; \
                 for a lab of your own there: `cnilab vm --kernel VERSION -- lab run …`",
                kernel.kernel.unwrap_or_default()
            )
            .into()),
            LabCmd::Up {
                kernel: Some(k), ..
            } => Err(format!(
                "--kernel {k}: a standing lab cannot live in a microVM, which ends with its command; \
                 replay and check there with `cnilab lab run --capture FILE... --kernel {k}`, or run a \
                 [capture] scenario with check and trace steps in `cnilab vm --kernel VERSION -- scenario run FILE`"
            )
            .into()),
            LabCmd::Up { topology, name, .. } if !topology.capture.is_empty() => {
                replay_up(&topology.capture, &name)
            }
            LabCmd::Run {
                topology,
                tune_host,
                output,
                ..
            } => run(&topology, tune_host, &output),
            LabCmd::Up {
                topology,
                name,
                output,
                ..
            } => up(&topology, &name, output.output),
            LabCmd::Check { name, output } => check(&name, &output),
            LabCmd::Status { name, output } => status(name.as_deref(), output.output),
            LabCmd::Show { name, output } => show(&name, output.output),
            LabCmd::Trace {
                name,
                from,
                to,
                proto,
                port,
                size,
                invalid,
                output,
            } => trace(
                &name,
                &from,
                &to,
                (proto, port, size, invalid),
                output.output,
            ),
            LabCmd::Perf { topology, perf } => super::lab_perf::run(topology, &perf),
            LabCmd::Causes { id, output } => super::causes::run(id.as_deref(), output.output),
            LabCmd::Down { name } => down(&name),
        }
    }
}

/// `cnilab lab trace`: one packet followed; the exit code is the verdict's.
fn trace(
    name: &str,
    from: &str,
    to: &str,
    (proto, port, size, invalid): (crate::trace::Proto, Option<u16>, Option<u32>, bool),
    format: Format,
) -> CliResult {
    super::trace::check_probe(crate::trace::live::Probe {
        proto,
        port,
        size,
        invalid,
    })?;
    let t = crate::lab::trace::run(name, from, to, (proto, port, size), invalid)?;
    super::trace::print(&t, format)
}

/// `cnilab lab show`: the standing lab read back into the lab model.
fn show(name: &str, format: Format) -> CliResult {
    let model = crate::lab::layout::standing(name)?;
    if format == Format::Table {
        report::print_human(&model.to_text());
        let state = crate::lab::state::load_state(name)?;
        for n in &state.not_made {
            report::print_human(&format!("not made here: {n}\n"));
        }
        report::print_human(&captured_pods(&state.captured_pods));
    } else {
        // The model is its own document (versioned by its own
        // `schemaVersion`; captures will be files of it), not a report.
        println!("{}", serde_json::to_string_pretty(&model)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// A replay's captured pods, one paragraph each: the name, the node, the
/// namespace, whether probed and what says it is a pod.
fn captured_pods(pods: &[crate::lab::state::FoundPod]) -> String {
    if pods.is_empty() {
        return String::new();
    }
    let mut out = String::from("\ncaptured pods (a pod by evidence, never by name):\n");
    for p in pods {
        let verdict = match &p.skipped {
            None => "probed".to_string(),
            Some(why) => format!("not probed: {why}"),
        };
        out.push_str(&format!(
            "  {} on {} (namespace role {}): {verdict}\n",
            p.name, p.node, p.role
        ));
        for e in &p.evidence {
            out.push_str(&format!("    evidence: {e}\n"));
        }
    }
    out
}

/// Prints `report` as `out` asks; the exit code is its verdict's.
fn emit(report: &Report, out: &ReportFlags) -> CliResult {
    report::emit(
        report,
        out.output.output,
        out.junit.as_deref(),
        out.report.as_deref(),
    )?;
    Ok(ExitCode::from(report.exit_code()))
}

/// `cnilab lab run`.
fn run(args: &TopologyFlags, tune_host: bool, out: &ReportFlags) -> CliResult {
    let report = run_report(args, tune_host, &out.only)?;
    emit(&report, out)
}

/// `cnilab lab run` up to its report (`cnilab bench --lab` prints its
/// figures).
pub(crate) fn run_report(
    args: &TopologyFlags,
    tune_host: bool,
    groups: &[String],
) -> Result<Report, Box<dyn std::error::Error>> {
    netns::require_root()?;
    crate::lab::checks::check_groups(groups)?;
    let Prepared { recipe, host } = lab_prep::prepare(args, tune_host)?;
    crate::lab::cleanup_on_interrupt(None);
    // Restores the thresholds when dropped (and the Ctrl-C handler does).
    let _tuning = crate::lab::neighbours::HostTuning::apply(&host)?;
    let opts = UpOptions {
        plugin_dir: args.plugin_dir.clone(),
        persistent: None,
        run_dir: crate::lab::scratch_run_dir(),
        runtime: args.runtime,
    };
    let run_dir = opts.run_dir.clone();
    let report = crate::lab::run_recipe(recipe, opts, groups, true, &host);
    let _ = std::fs::remove_dir_all(&run_dir);
    Ok(report?)
}

/// `cnilab lab up`.
fn up(args: &TopologyFlags, name: &str, format: Format) -> CliResult {
    netns::require_root()?;
    state::check_name(name)?;
    if state::load_state(name).is_ok() {
        return Err(
            format!("lab {name:?} is already up; `cnilab lab down --name {name}` first").into(),
        );
    }
    // A standing lab outlives this process: it must fit without tuning.
    let Prepared { recipe, host } = lab_prep::prepare(args, false)?;
    let nodes: Vec<String> = recipe.topo.nodes.iter().map(|n| n.name.clone()).collect();
    crate::lab::cleanup_standing_on_interrupt(name, nodes);
    let opts = UpOptions {
        plugin_dir: args.plugin_dir.clone(),
        persistent: Some(name.to_string()),
        run_dir: state::run_dir(name),
        runtime: args.runtime,
    };
    let mut lab = crate::lab::built::Lab::build(recipe, opts)?;
    crate::lab::pin_if_needed(&mut lab, &host)?;
    let phases: Vec<String> = lab
        .phases
        .iter()
        .map(|(p, d)| format!("{p} {} ms", d.as_millis()))
        .collect();
    let saved = state::persist(lab)?;
    if format != Format::Table {
        let labs = vec![LabStatus {
            name: name.to_string(),
            nodes: saved.nodes.len(),
            pods: saved.nodes.iter().map(|x| x.pods.len()).sum(),
            missing: Vec::new(),
            state: saved,
        }];
        println!("{}", report::json("LabStatus", &StatusReport { labs }));
        return Ok(ExitCode::SUCCESS);
    }
    println!("lab {name} is up ({})", phases.join(", "));
    print_state(&saved);
    println!("next: `cnilab lab check --name {name}`, `ip netns exec <namespace> sh` to look around, `cnilab lab down --name {name}` to remove it");
    Ok(ExitCode::SUCCESS)
}

fn print_state(s: &state::LabState) {
    println!("  switch   {}", s.switch);
    if let Some(e) = &s.external {
        println!("  external {e}");
    }
    for e in &s.extra {
        println!("  shape    {e}");
    }
    for n in &s.nodes {
        let spec = s.topology.node(&n.name);
        println!(
            "  node {:<8} {:<14} podCIDR {:<28} netns {}",
            n.name,
            spec.map(|x| x.address.to_string()).unwrap_or_default(),
            spec.map(|x| x
                .pod_cidr
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","))
                .unwrap_or_default(),
            n.netns
        );
        for p in &n.pods {
            let ips: Vec<String> = p.ips.iter().map(|i| i.to_string()).collect();
            println!(
                "    pod {:<16} {:<30} netns {}",
                p.name,
                ips.join(","),
                p.netns
            );
        }
    }
}

/// `cnilab lab check`.
fn check(name: &str, out: &ReportFlags) -> CliResult {
    let groups = &out.only;
    netns::require_root()?;
    crate::lab::checks::check_groups(groups)?;
    let not_made = state::load_state(name)?.not_made;
    let lab = state::adopt(name).map_err(|e| {
        format!("{e}\n`cnilab lab status --name {name}` shows what is missing; `cnilab lab down --name {name}` removes the rest")
    })?;
    let mut report = crate::lab::check(&lab, groups, true)?;
    report.not_made = not_made;
    emit(&report, out)
}

/// One standing lab as `cnilab lab status -o json` shows it.
#[derive(serde::Serialize)]
struct LabStatus {
    name: String,
    nodes: usize,
    pods: usize,
    /// Namespaces the lab's state names that are gone.
    missing: Vec<String>,
    state: state::LabState,
}

#[derive(serde::Serialize)]
struct StatusReport {
    labs: Vec<LabStatus>,
}

/// `cnilab lab status`.
fn status(name: Option<&str>, format: Format) -> CliResult {
    let names = match name {
        Some(n) => vec![n.to_string()],
        None => state::list(),
    };
    let mut labs = Vec::new();
    for n in names {
        let s = state::load_state(&n)?;
        let missing: Vec<String> = std::iter::once(s.switch.as_str())
            .chain(s.extra.iter().map(String::as_str))
            .chain(s.nodes.iter().map(|x| x.netns.as_str()))
            .chain(
                s.nodes
                    .iter()
                    .flat_map(|x| x.pods.iter().map(|p| p.netns.as_str())),
            )
            .filter(|ns| !Path::new(netns::NETNS_DIR).join(ns).exists())
            .map(str::to_string)
            .collect();
        labs.push(LabStatus {
            name: n,
            nodes: s.nodes.len(),
            pods: s.nodes.iter().map(|x| x.pods.len()).sum(),
            missing,
            state: s,
        });
    }
    if format != Format::Table {
        println!("{}", report::json("LabStatus", &StatusReport { labs }));
        return Ok(ExitCode::SUCCESS);
    }
    if labs.is_empty() {
        println!("no lab is up (start one with `cnilab lab up --name NAME`)");
        return Ok(ExitCode::SUCCESS);
    }
    for l in labs {
        println!(
            "lab {}: {} nodes, {} pods{}",
            l.name,
            l.nodes,
            l.pods,
            if l.missing.is_empty() {
                String::new()
            } else {
                format!(" — MISSING namespaces: {}", l.missing.join(", "))
            }
        );
        print_state(&l.state);
    }
    Ok(ExitCode::SUCCESS)
}

/// `cnilab lab down`. A lab that is not up (no run dir: never started, or
/// already down) is nothing to remove: exit 0 with a note, as `kind delete
/// cluster` does — and nothing is removed, since only the lab's own record
/// proves a namespace is its own ([`state::owns`]).
fn down(name: &str) -> CliResult {
    netns::require_root()?;
    state::check_name(name)?;
    if !state::run_dir(name).exists() {
        eprintln!("cnilab: lab {name} is not up; nothing to remove");
        return Ok(ExitCode::SUCCESS);
    }
    let dir = state::run_dir(name);
    if crate::sweep::unfinished(&dir) {
        // A `lab up` killed before its lab stood: what its records prove.
        let mut swept = crate::sweep::Swept::default();
        crate::sweep::remove_unfinished_lab(&dir, name, &mut swept)?;
        std::fs::remove_dir_all(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
        println!(
            "lab {name} is down (its `lab up` had died before the lab stood: {} namespaces removed)",
            swept.namespaces.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let s = state::load_state(name)?;
    state::stop_agents(&s);
    match state::adopt(name) {
        Ok(lab) => {
            lab.down();
        }
        Err(e) => eprintln!("cnilab: {e}; removing what is left by name"),
    }
    // Whatever containerd (and shims) of the lab still run, proved by pidfile.
    crate::lab::cri::daemon::teardown_node_dirs(&s.run_dir);
    let nodes = state::node_names(&s);
    let removed = netns::remove_matching(|ns| state::owns(&s.run_dir, name, &nodes, ns))?;
    if !removed.is_empty() {
        eprintln!("cnilab: removed leftover namespaces {}", removed.join(", "));
    }
    std::fs::remove_dir_all(state::run_dir(name))
        .map_err(|e| format!("remove {}: {e}", state::run_dir(name).display()))?;
    println!("lab {name} is down");
    Ok(ExitCode::SUCCESS)
}

/// `lab up --capture FILE...`: a standing lab replayed from captures.
fn replay_up(files: &[PathBuf], name: &str) -> CliResult {
    use crate::lab::state;
    crate::netns::require_root()?;
    state::check_name(name)?;
    if state::load_state(name).is_ok() {
        return Err(
            format!("lab {name:?} is already up; `cnilab lab down --name {name}` first").into(),
        );
    }
    // A standing lab outlives this process: it must fit without tuning.
    let prepared = crate::lab::replay::prepare(name, files, false)?;
    let nodes = prepared.node_names();
    crate::lab::cleanup_standing_on_interrupt(name, nodes);
    let opts = crate::lab::UpOptions {
        plugin_dir: None,
        persistent: Some(name.to_string()),
        run_dir: state::run_dir(name),
        runtime: RuntimeKind::Direct,
    };
    let built = crate::lab::replay::build_prepared(prepared, opts);
    let (lab, replayed) = match built {
        Ok(b) => b,
        Err(e) => {
            crate::lab::replay::forget_run_dir(&state::run_dir(name));
            return Err(e.into());
        }
    };
    let saved = state::persist_with(lab, replayed)?;
    let pods: usize = saved.nodes.iter().map(|n| n.pods.len()).sum();
    println!(
        "lab {name} is up, replayed from {} capture(s): {} nodes, {pods} pods",
        files.len(),
        saved.nodes.len()
    );
    for n in &saved.not_made {
        report::print_human(&format!("  not made here: {n}\n"));
    }
    for p in saved.captured_pods.iter() {
        if let Some(why) = &p.skipped {
            report::print_human(&format!("  not probed: {} on {}: {why}\n", p.name, p.node));
        }
    }
    println!(
        "next: `cnilab lab check --name {name}`, `cnilab lab down --name {name}` to remove it"
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// `lab run --capture FILE...`: replay, check, tear down (with
/// `--kernel`, in a microVM on that kernel: this command again inside).
fn replay_run(
    files: &[PathBuf],
    tune_host: bool,
    kernel: &super::vm::KernelFlags,
    out: &ReportFlags,
) -> CliResult {
    let groups = &out.only;
    crate::netns::require_root()?;
    crate::lab::checks::check_groups(groups)?;
    if let Some(spec) = &kernel.kernel {
        let mut captured = Vec::new();
        for f in files {
            for c in crate::capture::load_all(f)? {
                captured.push((c.provenance.node_name, c.provenance.kernel));
            }
        }
        let modules = kernel.modules.as_deref();
        if let Some(k) = super::vm::replay_kernel(spec, modules, &captured)? {
            return super::vm::rerun_in_vm(&k, files);
        }
    }
    crate::lab::cleanup_on_interrupt(None);
    let report = crate::lab::check_replayed("replay", files, groups, true, tune_host)?;
    for n in &report.not_made {
        eprintln!("⚠ not made here: {}", report::human(&n.to_string()));
    }
    emit(&report, out)
}

#[cfg(test)]
mod tests {
    /// Every print of text a capture can carry (a model's lines, a trace,
    /// capture's summary, a not-made entry) goes through `report::human`:
    /// a print macro of these files that names one of them without
    /// `human(` fails here. (The behaviour: `tests/tests/lab_replay.rs::
    /// captured_names_reach_the_terminal_escaped_through_every_command`.)
    #[test]
    fn captured_text_is_printed_only_through_the_escaper() {
        const CARRIERS: &[&str] = &["to_text()", "render(", "summary(", "not_made", "{n}", "{n:"];
        let mut bypass = Vec::new();
        for (file, src) in [
            ("lab.rs", include_str!("lab.rs")),
            ("capture.rs", include_str!("capture.rs")),
        ] {
            let src = src.split("#[cfg(test)]").next().unwrap_or(src);
            for mac in ["print!(", "println!(", "eprint!(", "eprintln!("] {
                for (at, _) in src.match_indices(mac) {
                    let rest = &src[at + mac.len()..];
                    let mut depth = 1;
                    let end = rest
                        .char_indices()
                        .find(|(_, c)| {
                            depth += match c {
                                '(' => 1,
                                ')' => -1,
                                _ => 0,
                            };
                            depth == 0
                        })
                        .map_or(rest.len(), |(i, _)| i);
                    let args = &rest[..end];
                    if CARRIERS.iter().any(|c| args.contains(c)) && !args.contains("human(") {
                        bypass.push(format!("{file}: {mac}{args})"));
                    }
                }
            }
        }
        assert!(
            bypass.is_empty(),
            "printed without report::human: {bypass:#?}"
        );
    }

    /// `cnilab lab run --help` documents every placeholder the lab fills in.
    #[test]
    fn help_lists_every_placeholder() {
        use clap::CommandFactory;
        let mut cli = crate::cli::Cli::command();
        let help = cli
            .find_subcommand_mut("lab")
            .and_then(|l| l.find_subcommand_mut("run"))
            .map(|r| r.render_long_help().to_string())
            .expect("lab run");
        for (name, _) in crate::lab::template::PLACEHOLDERS {
            assert!(
                help.contains(&format!("{{{{{name}}}}}")),
                "{name} missing from:\n{help}"
            );
        }
    }
}
