//! What `cnilab lab …` and `cnilab scenario …` do once parsed.

use super::build::{Lab, UpOptions};
use super::report::Report;
use super::scenario::{self, Scenario};
use super::state;
use super::topology::Topology;
use crate::cli::CliResult;
use crate::netns;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LabFormat {
    Table,
    Json,
}

/// Where the lab comes from.
#[derive(Clone, Debug, Default)]
pub struct TopologyArgs {
    pub topology: Option<PathBuf>,
    pub nodes: Option<usize>,
    pub pods_per_node: Option<usize>,
}

/// Where reports go.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    pub format: Option<LabFormat>,
    pub junit: Option<PathBuf>,
    pub report: Option<PathBuf>,
}

fn topology(args: &TopologyArgs) -> Result<Topology, Box<dyn std::error::Error>> {
    let mut topo = match (&args.topology, args.nodes) {
        (Some(_), Some(_)) => return Err("give either --topology or --nodes, not both".into()),
        (Some(path), None) => Topology::load(path)?,
        (None, nodes) => Topology::generated(nodes.unwrap_or(2), args.pods_per_node.unwrap_or(2))?,
    };
    if let (Some(p), Some(_)) = (args.pods_per_node, &args.topology) {
        topo.pods_per_node = p;
        topo.validate(Path::new("--pods-per-node"))?;
    }
    Ok(topo)
}

fn default_plugin_check(
    plugin_dir: &Option<String>,
    topo: &Topology,
) -> Result<(), Box<dyn std::error::Error>> {
    let uses_default =
        plugin_dir.is_none() && topo.plugin.as_ref().and_then(|p| p.dir.as_ref()).is_none();
    if uses_default {
        let dir = super::build::own_dir().unwrap_or_default();
        if !dir.join("cnilab-bridge").is_file() {
            return Err(format!(
                "the bundled plugin is not built: {} is missing. Run `cargo build --release --workspace` (or pass --plugin-dir)",
                dir.join("cnilab-bridge").display()
            )
            .into());
        }
    }
    Ok(())
}

fn emit(report: &Report, out: &Outputs) -> Result<(), Box<dyn std::error::Error>> {
    match out.format.unwrap_or(LabFormat::Table) {
        LabFormat::Table => print!("{}", report.table()),
        LabFormat::Json => println!("{}", report.json()),
    }
    if let Some(path) = &out.junit {
        write(path, &report.junit())?;
    }
    if let Some(path) = &out.report {
        write(path, &report.html())?;
        eprintln!("cnilab: HTML report written to {}", path.display());
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}

fn header(topo: &Topology, plugin_dir: Option<&str>) {
    let plugin_dir = plugin_dir
        .or(topo.plugin.as_ref().and_then(|p| p.dir.as_deref()))
        .unwrap_or("(bundled cnilab-bridge)");
    let pods: usize = topo.nodes.len() * topo.pods_per_node;
    eprintln!(
        "🔭 cnilab lab {}: {} nodes, {pods} pods, plugin dir {plugin_dir}, routing {:?}, masquerade {:?}",
        topo.name,
        topo.nodes.len(),
        topo.routing,
        topo.masquerade
    );
}

fn verdict(report: &Report) -> ExitCode {
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `cnilab lab run`.
pub fn run(
    args: &TopologyArgs,
    plugin_dir: Option<String>,
    groups: &[String],
    out: &Outputs,
) -> CliResult {
    netns::require_root()?;
    super::checks::check_groups(groups)?;
    let topo = topology(args)?;
    default_plugin_check(&plugin_dir, &topo)?;
    super::cleanup_on_interrupt(None);
    header(&topo, plugin_dir.as_deref());
    let opts = UpOptions {
        plugin_dir,
        persistent: None,
        run_dir: super::scratch_run_dir(),
    };
    let run_dir = opts.run_dir.clone();
    let report = super::run(topo, opts, groups, true);
    let _ = std::fs::remove_dir_all(&run_dir);
    let report = report?;
    emit(&report, out)?;
    Ok(verdict(&report))
}

/// `cnilab lab up`.
pub fn up(args: &TopologyArgs, plugin_dir: Option<String>, name: &str) -> CliResult {
    netns::require_root()?;
    state::check_name(name)?;
    if state::load_state(name).is_ok() {
        return Err(
            format!("lab {name:?} is already up; `cnilab lab down --name {name}` first").into(),
        );
    }
    let topo = topology(args)?;
    default_plugin_check(&plugin_dir, &topo)?;
    let lab_name = name.to_string();
    let nodes: Vec<String> = topo.nodes.iter().map(|n| n.name.clone()).collect();
    super::cleanup_on_interrupt(Some(Box::new(move |ns: &str| {
        state::owns_namespace(&lab_name, &nodes, ns)
    })));
    header(&topo, plugin_dir.as_deref());
    let opts = UpOptions {
        plugin_dir,
        persistent: Some(name.to_string()),
        run_dir: state::run_dir(name),
    };
    let lab = Lab::up(topo, opts)?;
    let phases: Vec<String> = lab
        .phases
        .iter()
        .map(|(p, d)| format!("{p} {} ms", d.as_millis()))
        .collect();
    let saved = state::persist(lab)?;
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
pub fn check(name: &str, groups: &[String], out: &Outputs) -> CliResult {
    netns::require_root()?;
    super::checks::check_groups(groups)?;
    let lab = state::adopt(name)?;
    let report = super::check(&lab, groups, true);
    state::release(lab);
    let report = report?;
    emit(&report, out)?;
    Ok(verdict(&report))
}

/// `cnilab lab status`.
pub fn status(name: Option<&str>) -> CliResult {
    let names = match name {
        Some(n) => vec![n.to_string()],
        None => state::list(),
    };
    if names.is_empty() {
        println!("no lab is up (start one with `cnilab lab up --name NAME`)");
        return Ok(ExitCode::SUCCESS);
    }
    for n in names {
        let s = state::load_state(&n)?;
        let missing: Vec<&str> = std::iter::once(s.switch.as_str())
            .chain(s.nodes.iter().map(|x| x.netns.as_str()))
            .chain(
                s.nodes
                    .iter()
                    .flat_map(|x| x.pods.iter().map(|p| p.netns.as_str())),
            )
            .filter(|ns| !Path::new(netns::NETNS_DIR).join(ns).exists())
            .collect();
        println!(
            "lab {n}: {} nodes, {} pods{}",
            s.nodes.len(),
            s.nodes.iter().map(|x| x.pods.len()).sum::<usize>(),
            if missing.is_empty() {
                String::new()
            } else {
                format!(" — MISSING namespaces: {}", missing.join(", "))
            }
        );
        print_state(&s);
    }
    Ok(ExitCode::SUCCESS)
}

/// `cnilab lab down`.
pub fn down(name: &str) -> CliResult {
    netns::require_root()?;
    let s = state::load_state(name)?;
    state::stop_agents(&s);
    match state::adopt(name) {
        Ok(lab) => {
            lab.down();
        }
        Err(e) => eprintln!("cnilab: {e}; removing what is left by name"),
    }
    let nodes = state::node_names(&s);
    let removed = netns::remove_matching(|ns| state::owns_namespace(name, &nodes, ns))?;
    if !removed.is_empty() {
        eprintln!("cnilab: removed leftover namespaces {}", removed.join(", "));
    }
    std::fs::remove_dir_all(state::run_dir(name))
        .map_err(|e| format!("remove {}: {e}", state::run_dir(name).display()))?;
    println!("lab {name} is down");
    Ok(ExitCode::SUCCESS)
}

/// Scenario files in `dir` (default `lab/scenarios`).
pub fn scenario_files(dir: &Path) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read scenarios in {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

/// `cnilab scenario list`.
pub fn scenario_list(dir: &Path) -> CliResult {
    for path in scenario_files(dir)? {
        match Scenario::load(&path) {
            Ok(s) => println!("{:<28} {}  [{}]", s.name, s.summary, path.display()),
            Err(e) => println!("{:<28} INVALID: {e}", path.display()),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `cnilab scenario run FILE…`: exit 0 iff every scenario behaved as written.
pub fn scenario_run(
    files: &[PathBuf],
    plugin_dir: Option<String>,
    junit: Option<&Path>,
) -> CliResult {
    netns::require_root()?;
    super::cleanup_on_interrupt(None);
    let mut cases = String::new();
    let mut failed = 0;
    for path in files {
        let s = Scenario::load(path)?;
        eprintln!("🎬 scenario {}: {}", s.name, s.summary);
        let mut log = |l: &scenario::StepLog| {
            eprintln!(
                "  {} step {}: {} — {}",
                if l.ok { "✅" } else { "❌" },
                l.step,
                l.what,
                l.detail
            );
        };
        let (passed, detail) = match scenario::run(&s, plugin_dir.clone(), &mut log) {
            Ok(result) => {
                let detail: Vec<String> = result
                    .steps
                    .iter()
                    .map(|l| format!("step {}: {} — {}", l.step, l.what, l.detail))
                    .collect();
                (result.passed, detail.join("\n"))
            }
            Err(e) => (false, e.to_string()),
        };
        println!(
            "{} scenario {}",
            if passed { "✅ PASS" } else { "❌ FAIL" },
            s.name
        );
        if passed {
            cases.push_str(&format!(
                "  <testcase name=\"{}\"/>\n",
                super::report::xml(&s.name)
            ));
        } else {
            failed += 1;
            cases.push_str(&format!(
                "  <testcase name=\"{}\"><failure message=\"scenario did not behave as written\">{}</failure></testcase>\n",
                super::report::xml(&s.name),
                super::report::xml(&detail)
            ));
        }
    }
    if let Some(path) = junit {
        let xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"cnilab scenarios\" tests=\"{}\" failures=\"{failed}\">\n{cases}</testsuite>\n",
            files.len()
        );
        write(path, &xml)?;
    }
    let _ = std::fs::remove_dir_all(super::scratch_run_dir());
    println!("{} passed, {failed} failed", files.len() - failed);
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
