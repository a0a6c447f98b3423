//! `cnilab scenario …`: replay bug scenarios: the flags, the files given,
//! the step lines, the summary and the exit code (the replay itself is
//! `crate::scenario`).

use super::args::{CheckOutputArgs, OutputArgs};
use super::lab_prep;
use super::CliResult;
use crate::lab::base::RuntimeKind;
use crate::netns;
use crate::report::{self, Format};
use crate::scenario::StepLog;
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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
        cnilab scenario run lab/scenarios -o json\n  \
        cnilab scenario run missing-route --keep bug   # then capture it, `lab check --name bug`\n\n\
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
        #[arg(long, value_enum, default_value_t = RuntimeKind::Direct)]
        runtime: RuntimeKind,
        #[command(flatten)]
        output: CheckOutputArgs,
        /// Also write JUnit XML to this file.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Leave one scenario's lab standing in its faulted state, as the
        /// lab NAME: only the steps through the first check expected to fail
        /// run (or, without one, those before the first heal), and the lab
        /// stays up when they behaved as written (`cnilab lab down --name
        /// NAME` removes it).
        #[arg(long, value_name = "NAME")]
        keep: Option<String>,
    },
}

impl Scenario {
    pub fn run(self) -> CliResult {
        match self.command {
            ScenarioCmd::List { dir, output } => list(&dir, output.output),
            ScenarioCmd::Run {
                files,
                plugin_dir,
                config,
                runtime,
                output,
                junit,
                keep,
            } => run(&ScenarioRun {
                files: scenario_paths(&files)?,
                plugin_dir,
                config,
                runtime,
                format: output.output,
                junit,
                keep,
            }),
        }
    }
}

/// Scenario files in `dir` (default `lab/scenarios`: the built-in ones when
/// that directory is not in the working directory).
fn scenario_files(dir: &Path) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
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
fn scenario_paths(given: &[PathBuf]) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
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
fn list(dir: &Path, format: Format) -> CliResult {
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
        let entry = match crate::scenario::Scenario::load(&path) {
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
    /// The steps as data (none when the scenario could not be set up).
    steps: Vec<StepLog>,
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
struct ScenarioRun {
    files: Vec<PathBuf>,
    /// `--plugin-dir` (default: the bundled cnilab-bridge).
    plugin_dir: Option<String>,
    /// `--config TEMPLATE`: the plugin's config template for every scenario.
    config: Option<PathBuf>,
    runtime: RuntimeKind,
    format: Format,
    junit: Option<PathBuf>,
    /// `--keep NAME`: the one scenario's faulted lab stays up as lab NAME.
    keep: Option<String>,
}

/// A scenario's topology made ready for `run`'s plugin, or why it cannot be
/// (a setup error: nothing is built).
fn prepare(
    s: &mut crate::scenario::Scenario,
    run: &ScenarioRun,
) -> Result<(), Box<dyn std::error::Error>> {
    // A `[capture]` scenario runs no plugin: its nodes hold what was captured.
    if s.capture.is_some() {
        return Ok(());
    }
    if let Some(config) = &run.config {
        s.topology.use_template(config, true);
    }
    lab_prep::check_plugin(&run.plugin_dir, &s.topology)
}

/// Replays one scenario; `say` prints a step line.
fn replay(
    s: &mut crate::scenario::Scenario,
    path: &Path,
    run: &ScenarioRun,
    say: &dyn Fn(&str),
) -> ScenarioResult {
    let mut log = |l: &StepLog| {
        say(&format!(
            "  {} step {}: {} — {}",
            if l.ok { "✅" } else { "❌" },
            l.step,
            l.what,
            l.detail
        ))
    };
    let result = prepare(s, run).map_err(|e| e.to_string()).and_then(|()| {
        crate::scenario::run(
            s,
            run.plugin_dir.clone(),
            run.runtime,
            run.keep.as_deref(),
            &mut log,
        )
        .map_err(|e| e.to_string())
    });
    let (outcome, reason, detail, steps) = match result {
        Ok(r) => {
            let detail = r
                .steps
                .iter()
                .map(|l| format!("step {}: {} — {}", l.step, l.what, l.detail))
                .collect();
            let (outcome, why) = match (r.passed, r.skipped) {
                (_, Some(why)) => (Outcome::Skip, Some(why)),
                (true, None) => (Outcome::Pass, None),
                (false, None) => (Outcome::Fail, None),
            };
            (outcome, why, detail, r.steps)
        }
        Err(e) => (Outcome::Error, Some(e.clone()), vec![e], Vec::new()),
    };
    ScenarioResult {
        name: s.name.clone(),
        file: path.to_path_buf(),
        passed: outcome == Outcome::Pass,
        outcome,
        reason,
        detail,
        steps,
    }
}

/// `--keep NAME` needs one scenario and a free, valid lab name.
fn check_keep(name: &str, files: &[PathBuf]) -> Result<(), Box<dyn std::error::Error>> {
    crate::lab::state::check_name(name).map_err(|e| format!("--keep {name}: {e}"))?;
    if files.len() != 1 {
        return Err(format!(
            "--keep {name} keeps one scenario's lab, and {} scenarios were given: name one scenario",
            files.len()
        )
        .into());
    }
    if crate::lab::state::load_state(name).is_ok() {
        return Err(format!(
            "--keep {name}: lab {name:?} is already up; `cnilab lab down --name {name}` first"
        )
        .into());
    }
    Ok(())
}

/// `cnilab scenario run FILE…`: exit 0 iff every scenario behaved as
/// written (2 when one could not be set up, 3 when all were skipped).
/// Step lines go to stdout with the table, to stderr with JSON or JUnit.
fn run(run: &ScenarioRun) -> CliResult {
    netns::require_root()?;
    if let Some(name) = &run.keep {
        check_keep(name, &run.files)?;
    }
    if let Some(config) = &run.config {
        crate::assets::read_to_string(config)
            .map_err(|e| format!("--config {}: {e}", config.display()))?;
    }
    crate::lab::cleanup_on_interrupt(None);
    lab_prep::runtime_header(run.runtime)?;
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
        let mut s = crate::scenario::Scenario::load(path)?;
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
        if let (Some(name), true) = (&run.keep, r.passed) {
            say(&format!("lab {name} is up with the fault in place: `cnilab lab check --name {name}`, `cnilab lab down --name {name}` to remove it"));
        }
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
        report::write_file(path, &summary.junit())?;
    }
    let _ = std::fs::remove_dir_all(crate::lab::scratch_run_dir());
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
