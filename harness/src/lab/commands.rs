//! What `cnilab lab …` and `cnilab scenario …` do once parsed.

use super::build::{Lab, UpOptions};
use super::report::Report;
use super::scenario::{self, Scenario};
use super::state;
use super::topology::{Masquerade, Topology};
use crate::netns;
use crate::report::CliResult;
use crate::report::{self, Format};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Where the lab comes from.
#[derive(Clone, Debug, Default)]
pub struct TopologyArgs {
    pub topology: Option<PathBuf>,
    pub nodes: Option<usize>,
    pub pods_per_node: Option<usize>,
    /// A plugin config template (overrides the topology's).
    pub config: Option<PathBuf>,
    /// Raise the host's neighbour-table thresholds for the run if needed.
    pub tune_host: bool,
    /// Underlay shape of a generated lab.
    pub shape: Option<super::underlay::Shape>,
    /// `routing = "vxlan"`.
    pub vxlan: bool,
    /// A `[service]` with its defaults.
    pub service: bool,
    /// How pods are attached (`--runtime`).
    pub runtime: super::cri::RuntimeKind,
}

/// Where reports go.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    pub format: Format,
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
    if let Some(config) = &args.config {
        use_template(&mut topo, config, args.topology.is_none());
    }
    super::underlay::apply_flags(&mut topo, args.shape, args.vxlan, args.service)?;
    Ok(topo)
}

/// Makes `config` the plugin's template. A template that cannot tell the
/// plugin to masquerade (no `{{ip_masq}}`) in a lab whose masquerade was not
/// chosen by a topology file for its plugin (`generated`: a `--nodes` lab,
/// or a scenario's, which describes the cluster): the nodes masquerade, as an
/// agent would.
fn use_template(topo: &mut Topology, config: &Path, generated: bool) {
    let tells_plugin = crate::assets::read_to_string(config)
        .map(|t| t.contains("{{ip_masq}}"))
        .unwrap_or(true);
    if generated && !tells_plugin && topo.masquerade == Masquerade::Plugin {
        topo.masquerade = Masquerade::Node;
    }
    let dir = topo.plugin.as_ref().and_then(|p| p.dir.clone());
    topo.plugin = Some(super::topology::PluginSpec {
        dir,
        config: Some(config.to_path_buf()),
    });
}

/// How the lab will fit the host's neighbour tables; printed when it
/// changes anything.
fn host_plan(
    topo: &Topology,
    tune_host: bool,
) -> Result<super::neighbours::HostPlan, Box<dyn std::error::Error>> {
    let plan = super::neighbours::plan(topo, tune_host)?;
    if plan.pin || !plan.tune.is_empty() || plan.unchecked {
        eprintln!("🧮 {}", plan.summary);
    }
    Ok(plan)
}

fn default_plugin_check(
    plugin_dir: &Option<String>,
    topo: &Topology,
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = plugin_dir
        .clone()
        .or_else(|| topo.plugin.as_ref().and_then(|p| p.dir.clone()));
    let template = topo.plugin.as_ref().and_then(|p| p.config.as_ref());
    if let (Some(dir), None) = (&dir, template) {
        let has_bridge = std::env::split_paths(dir).any(|d| d.join("cnilab-bridge").is_file());
        if !has_bridge {
            return Err(format!(
                "--plugin-dir {dir} has no cnilab-bridge, which the default config template uses: pass --config TEMPLATE for your plugin (see `cnilab lab run --help` for the placeholders)"
            )
            .into());
        }
    }
    if dir.is_none() {
        super::build::bundled_plugin_dir()?;
    }
    Ok(())
}

fn emit(report: &Report, out: &Outputs) -> Result<(), Box<dyn std::error::Error>> {
    match out.format {
        Format::Table => report::print_human(&report.table()),
        Format::Json => println!("{}", report.json()),
        Format::Junit => print!("{}", report.junit()),
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
    Ok(report::write_file(path, text)?)
}

fn header(topo: &Topology, plugin_dir: Option<&str>) {
    let plugin_dir = plugin_dir
        .or(topo.plugin.as_ref().and_then(|p| p.dir.as_deref()))
        .unwrap_or("(bundled cnilab-bridge)");
    let pods: usize = topo.nodes.len() * topo.pods_per_node;
    eprintln!(
        "🔭 cnilab lab {}: {} nodes, {pods} pods, plugin dir {plugin_dir}, {}, {}",
        topo.name,
        topo.nodes.len(),
        match topo.routing {
            super::topology::Routing::Static => "static routes",
            super::topology::Routing::Agent => "routes by the agent",
            super::topology::Routing::Vxlan => "a VXLAN overlay",
        },
        match topo.masquerade {
            Masquerade::Plugin => "the plugin masquerades",
            Masquerade::Node => "the nodes masquerade",
            Masquerade::None => "nobody masquerades",
        }
    );
}

/// With `--runtime containerd`: which containerd runs the pods and what it
/// supports; a missing or unusable containerd is an environment error (exit 2).
fn runtime_header(runtime: super::cri::RuntimeKind) -> Result<(), Box<dyn std::error::Error>> {
    if runtime == super::cri::RuntimeKind::Containerd {
        let support = super::cri::detect()?;
        eprintln!("🐳 runtime: {}", support.describe());
    }
    Ok(())
}

fn verdict(r: &Report) -> ExitCode {
    ExitCode::from(r.exit_code())
}

/// `cnilab lab run`.
pub fn run(
    args: &TopologyArgs,
    plugin_dir: Option<String>,
    groups: &[String],
    out: &Outputs,
) -> CliResult {
    let report = run_report(args, plugin_dir, groups)?;
    emit(&report, out)?;
    Ok(verdict(&report))
}

/// `cnilab lab run` up to its report (`cnilab bench --lab` prints its
/// figures).
pub fn run_report(
    args: &TopologyArgs,
    plugin_dir: Option<String>,
    groups: &[String],
) -> Result<Report, Box<dyn std::error::Error>> {
    netns::require_root()?;
    super::checks::check_groups(groups)?;
    let topo = topology(args)?;
    default_plugin_check(&plugin_dir, &topo)?;
    super::build::check_template_of(&topo)?;
    super::cleanup_on_interrupt(None);
    header(&topo, plugin_dir.as_deref());
    let host = host_plan(&topo, args.tune_host)?;
    // Restores the thresholds when dropped (and the Ctrl-C handler does).
    let _tuning = super::neighbours::HostTuning::apply(&host)?;
    runtime_header(args.runtime)?;
    let opts = UpOptions {
        plugin_dir,
        persistent: None,
        run_dir: super::scratch_run_dir(),
        runtime: args.runtime,
    };
    let run_dir = opts.run_dir.clone();
    let report = super::run_planned(topo, opts, groups, true, &host);
    let _ = std::fs::remove_dir_all(&run_dir);
    Ok(report?)
}

/// `cnilab lab up`.
pub fn up(
    args: &TopologyArgs,
    plugin_dir: Option<String>,
    name: &str,
    format: Format,
) -> CliResult {
    netns::require_root()?;
    state::check_name(name)?;
    if state::load_state(name).is_ok() {
        return Err(
            format!("lab {name:?} is already up; `cnilab lab down --name {name}` first").into(),
        );
    }
    let topo = topology(args)?;
    default_plugin_check(&plugin_dir, &topo)?;
    super::build::check_template_of(&topo)?;
    // A standing lab outlives this process: it must fit without tuning.
    let host = host_plan(&topo, false)?;
    let lab_name = name.to_string();
    let nodes: Vec<String> = topo.nodes.iter().map(|n| n.name.clone()).collect();
    super::cleanup_on_interrupt(Some(Box::new(move |ns: &str| {
        state::owns(&state::run_dir(&lab_name), &lab_name, &nodes, ns)
    })));
    header(&topo, plugin_dir.as_deref());
    runtime_header(args.runtime)?;
    let opts = UpOptions {
        plugin_dir,
        persistent: Some(name.to_string()),
        run_dir: state::run_dir(name),
        runtime: args.runtime,
    };
    let mut lab = Lab::up(topo, opts)?;
    super::pin_if_planned(&mut lab, &host)?;
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
pub fn status(name: Option<&str>, format: Format) -> CliResult {
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
pub fn down(name: &str) -> CliResult {
    netns::require_root()?;
    state::check_name(name)?;
    if !state::run_dir(name).exists() {
        eprintln!("cnilab: lab {name} is not up; nothing to remove");
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
    super::cri::daemon::teardown_node_dirs(&s.run_dir);
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

/// Scenario files in `dir` (default `lab/scenarios`: the built-in ones when
/// that directory is not in the working directory).
pub fn scenario_files(dir: &Path) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    Ok(crate::assets::list(dir)
        .map_err(|e| {
            format!(
                "cannot read scenarios in {}: {e} (--dir DIR names a directory of scenario files; without it the built-in scenarios are listed)",
                dir.display()
            )
        })?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect())
}

/// What `scenario run` was given, as scenario files: a file, a directory of
/// them, or the name of a built-in scenario (`missing-route`).
pub fn scenario_paths(given: &[PathBuf]) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for f in given {
        let by_name = Path::new(crate::assets::SCENARIOS)
            .join(f)
            .with_extension("toml");
        if f.is_dir() || (!f.exists() && crate::assets::list(f).is_ok()) {
            out.extend(scenario_files(f)?);
        } else if f.exists() || crate::assets::builtin(f).is_some() {
            out.push(f.clone());
        } else if f.components().count() == 1 && crate::assets::builtin(&by_name).is_some() {
            out.push(by_name);
        } else {
            return Err(format!(
                "no scenario {}: give a scenario file, a directory of them, or a built-in scenario's name (`cnilab scenario list`)",
                f.display()
            )
            .into());
        }
    }
    Ok(out)
}

/// `cnilab scenario list`.
pub fn scenario_list(dir: &Path, format: Format) -> CliResult {
    #[derive(serde::Serialize)]
    struct Entry {
        file: PathBuf,
        name: Option<String>,
        summary: Option<String>,
        /// Why the file is not a valid scenario.
        error: Option<String>,
    }
    #[derive(serde::Serialize)]
    struct List {
        scenarios: Vec<Entry>,
    }
    let mut scenarios = Vec::new();
    for path in scenario_files(dir)? {
        let entry = match Scenario::load(&path) {
            Ok(s) => Entry {
                file: path,
                name: Some(s.name),
                summary: Some(s.summary),
                error: None,
            },
            Err(e) => Entry {
                file: path,
                name: None,
                summary: None,
                error: Some(e.to_string()),
            },
        };
        scenarios.push(entry);
    }
    if format != Format::Table {
        println!("{}", report::json("ScenarioList", &List { scenarios }));
        return Ok(ExitCode::SUCCESS);
    }
    for e in scenarios {
        match (e.name, e.summary, e.error) {
            (Some(name), Some(summary), None) => println!(
                "{name:<28} {summary}  [{}{}]",
                e.file.display(),
                if crate::assets::is_builtin(&e.file) {
                    ", built in"
                } else {
                    ""
                }
            ),
            (_, _, error) => println!(
                "{:<28} INVALID: {}",
                e.file.display(),
                error.unwrap_or_default()
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How one scenario ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Outcome {
    /// Behaved as written.
    Pass,
    /// A step did not behave as written.
    Fail,
    /// Cannot apply to this plugin (`reason` says why).
    Skip,
    /// The lab or a step could not be set up (`reason` says why): nothing judged.
    Error,
}

/// One replayed scenario, as `-o json` shows it.
#[derive(serde::Serialize)]
struct ScenarioResult {
    name: String,
    file: PathBuf,
    passed: bool,
    outcome: Outcome,
    /// Why it was skipped or could not run.
    reason: Option<String>,
    /// The steps (or the error that stopped the scenario).
    detail: Vec<String>,
}

#[derive(serde::Serialize)]
struct ScenarioReport {
    passed: usize,
    failed: usize,
    skipped: usize,
    errors: usize,
    scenarios: Vec<ScenarioResult>,
}

impl ScenarioReport {
    fn count(&self, o: Outcome) -> usize {
        self.scenarios.iter().filter(|r| r.outcome == o).count()
    }

    fn junit(&self) -> String {
        use crate::report::junit::{Case, Outcome as Junit, Report as Doc, Suite};
        let mut suite = Suite::new("cnilab scenarios");
        for r in &self.scenarios {
            let reason = r.reason.clone().unwrap_or_default();
            suite.cases.push(match r.outcome {
                Outcome::Pass => Case::pass(&r.name),
                Outcome::Skip => Case::new(&r.name, Junit::Skipped { message: reason }),
                Outcome::Fail => Case::failure(
                    &r.name,
                    "scenario did not behave as written",
                    r.detail.join("\n"),
                ),
                Outcome::Error => Case::failure(
                    &r.name,
                    format!("setup error: {reason}"),
                    r.detail.join("\n"),
                ),
            });
        }
        let mut doc = Doc::new("cnilab scenarios");
        doc.suites.push(suite);
        doc.to_xml()
    }

    /// 2 when a scenario could not be set up (nothing it checks was
    /// judged), else 1 when one failed, 3 when every one was skipped, else 0.
    fn exit_code(&self) -> ExitCode {
        ExitCode::from(if self.errors > 0 {
            report::exit::USAGE
        } else if self.failed > 0 {
            report::exit::FAIL
        } else if self.skipped > 0 && self.skipped == self.scenarios.len() {
            report::exit::INCONCLUSIVE
        } else {
            report::exit::PASS
        })
    }
}

/// What `cnilab scenario run` replays, and with which plugin.
#[derive(Clone, Debug, Default)]
pub struct ScenarioRun {
    pub files: Vec<PathBuf>,
    /// `--plugin-dir` (default: the bundled cnilab-bridge).
    pub plugin_dir: Option<String>,
    /// `--config TEMPLATE`: the plugin's config template for every scenario.
    pub config: Option<PathBuf>,
    pub runtime: super::cri::RuntimeKind,
    pub format: Format,
    pub junit: Option<PathBuf>,
}

/// A scenario's topology made ready for `run`'s plugin, or why it cannot be
/// (a setup error: nothing is built).
fn prepare(s: &mut Scenario, run: &ScenarioRun) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(config) = &run.config {
        use_template(&mut s.topology, config, true);
    }
    default_plugin_check(&run.plugin_dir, &s.topology)?;
    super::build::check_template_of(&s.topology)?;
    Ok(())
}

/// Replays one scenario; `say` prints a step line.
fn replay(s: &mut Scenario, path: &Path, run: &ScenarioRun, say: &dyn Fn(&str)) -> ScenarioResult {
    let mut log = |l: &scenario::StepLog| {
        say(&format!(
            "  {} step {}: {} — {}",
            if l.ok { "✅" } else { "❌" },
            l.step,
            l.what,
            l.detail
        ))
    };
    let result = prepare(s, run).map_err(|e| e.to_string()).and_then(|()| {
        scenario::run_with(s, run.plugin_dir.clone(), run.runtime, &mut log)
            .map_err(|e| e.to_string())
    });
    let (outcome, reason, detail) = match result {
        Ok(r) => {
            let detail = r
                .steps
                .iter()
                .map(|l| format!("step {}: {} — {}", l.step, l.what, l.detail))
                .collect();
            match (r.passed, r.skipped) {
                (_, Some(why)) => (Outcome::Skip, Some(why), detail),
                (true, None) => (Outcome::Pass, None, detail),
                (false, None) => (Outcome::Fail, None, detail),
            }
        }
        Err(e) => (Outcome::Error, Some(e.clone()), vec![e]),
    };
    ScenarioResult {
        name: s.name.clone(),
        file: path.to_path_buf(),
        passed: outcome == Outcome::Pass,
        outcome,
        reason,
        detail,
    }
}

/// `cnilab scenario run FILE…`: exit 0 iff every scenario behaved as
/// written (2 when one could not be set up, 3 when all were skipped).
/// Step lines go to stdout with the table, to stderr with JSON or JUnit.
pub fn scenario_run(run: &ScenarioRun) -> CliResult {
    netns::require_root()?;
    if let Some(config) = &run.config {
        crate::assets::read_to_string(config)
            .map_err(|e| format!("--config {}: {e}", config.display()))?;
    }
    super::cleanup_on_interrupt(None);
    runtime_header(run.runtime)?;
    let table = run.format == Format::Table;
    let say = |line: &str| {
        if table {
            println!("{line}");
        } else {
            eprintln!("{line}");
        }
    };
    let mut results = Vec::new();
    for path in &run.files {
        let mut s = Scenario::load(path)?;
        say(&format!("🎬 scenario {}: {}", s.name, s.summary));
        let r = replay(&mut s, path, run, &say);
        let mark = match r.outcome {
            Outcome::Pass => "✅ PASS",
            Outcome::Fail => "❌ FAIL",
            Outcome::Skip => "⏭️ SKIP",
            Outcome::Error => "⚠️ ERROR",
        };
        let why = r
            .reason
            .as_ref()
            .map(|w| format!(": {w}"))
            .unwrap_or_default();
        say(&format!("{mark} scenario {}{why}", r.name));
        results.push(r);
    }
    let mut summary = ScenarioReport {
        passed: 0,
        failed: 0,
        skipped: 0,
        errors: 0,
        scenarios: results,
    };
    summary.passed = summary.count(Outcome::Pass);
    summary.failed = summary.count(Outcome::Fail);
    summary.skipped = summary.count(Outcome::Skip);
    summary.errors = summary.count(Outcome::Error);
    if let Some(path) = &run.junit {
        write(path, &summary.junit())?;
    }
    let _ = std::fs::remove_dir_all(super::scratch_run_dir());
    match run.format {
        Format::Table => println!(
            "{} passed, {} failed, {} skipped, {} could not run",
            summary.passed, summary.failed, summary.skipped, summary.errors
        ),
        Format::Json => println!("{}", report::json("ScenarioReport", &summary)),
        Format::Junit => print!("{}", summary.junit()),
    }
    Ok(summary.exit_code())
}
