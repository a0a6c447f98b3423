//! Replaying a scenario: a fresh lab, each step checked or injected in
//! turn, the lab torn down (or, with `keep`, left standing in its faulted
//! state: through the first check expected to fail).

use super::faults::{self, Undo};
use super::file::{Expect, Scenario, ScenarioError, Step, TraceStep};
use crate::lab::base::RuntimeKind;
use crate::lab::report::Report;
use crate::lab::LabError;
use crate::lab::{base::UpOptions, built::Lab};

/// One step's outcome, for the log.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepLog {
    pub step: usize,
    pub what: String,
    pub ok: bool,
    pub detail: String,
    /// A trace step's: where the kernel dropped the probe and why (its
    /// drop reason), as the running kernel names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_drop: Option<crate::trace::drops::KernelDrop>,
}

/// A trace step judged: whether the trace ended as written, the end in
/// words with the kernel's account, and the kernel's drop.
fn judge_trace(
    t: &crate::trace::Trace,
    step: &TraceStep,
) -> (bool, String, Option<crate::trace::drops::KernelDrop>) {
    let death = t.death.as_ref();
    let node = death.and_then(|d| d.node.as_deref().or(Some(d.namespace.as_str())));
    let ok = t.verdict == step.expect
        && step
            .cause
            .as_ref()
            .is_none_or(|c| death.is_some_and(|d| &d.cause == c))
        && step.at.as_ref().is_none_or(|n| node == Some(n.as_str()));
    let verdict = t.verdict.word();
    let mut detail = match death {
        Some(d) => format!(
            "{verdict} at {}: {} ({})",
            node.unwrap_or("?"),
            d.cause,
            d.object
        ),
        None => match &t.reason {
            Some(r) => format!("{verdict}: {r}"),
            None => verdict.to_string(),
        },
    };
    match (&t.kernel_drop, &t.drop_reasons_skipped) {
        (Some(k), _) => detail.push_str(&format!("; the kernel: {}", k.describe())),
        (None, Some(why)) => detail.push_str(&format!("; the kernel's account: SKIP ({why})")),
        (None, None) => detail.push_str("; the kernel: no drop"),
    }
    (ok, detail, t.kernel_drop.clone())
}

/// A failed check's diagnoses as text: each distinct diagnosis once, its id
/// and what it says (`missing-route: node1 has no route …`).
fn diagnoses_text(report: &Report) -> String {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for d in report.failures.iter().flat_map(|f| &f.diagnoses) {
        if !seen.contains(&(d.id, d.message.as_str())) {
            seen.push((d.id, d.message.as_str()));
        }
    }
    if seen.is_empty() {
        return "no diagnosis".into();
    }
    let lines: Vec<String> = seen
        .iter()
        .map(|(id, message)| format!("{id}: {message}"))
        .collect();
    format!("diagnoses: {}", lines.join("; "))
}

/// The whole replay's verdict.
#[derive(Debug, serde::Serialize)]
pub struct ScenarioResult {
    pub name: String,
    pub passed: bool,
    /// Why the scenario cannot apply to this plugin (a step needed what the
    /// plugin does not make); the steps before it are in `steps`.
    pub skipped: Option<String>,
    pub steps: Vec<StepLog>,
}

/// The steps `run` replays: all of them, or with `keep` those up to the
/// faulted state: through the first check expected to fail, else (a
/// scenario whose fault is expected to pass) the steps before the first
/// heal.
fn planned(scenario: &Scenario, keep: bool) -> &[Step] {
    let steps = &scenario.steps;
    let failing = |s: &Step| {
        matches!(
            s,
            Step::Check {
                expect: Expect::Fail,
                ..
            }
        )
    };
    let end = match keep {
        true => steps.iter().position(failing).map_or_else(
            || {
                steps
                    .iter()
                    .position(|s| matches!(s, Step::Heal))
                    .unwrap_or(steps.len())
            },
            |i| i + 1,
        ),
        false => steps.len(),
    };
    &steps[..end]
}

/// A check step: what it expects, and whether the lab's check behaved so.
fn check_step(
    lab: &Lab,
    expect: &Expect,
    diagnosis: Option<&str>,
    groups: &[String],
) -> (String, Result<(bool, String), LabError>) {
    let what = format!(
        "check, expect {}{}",
        if *expect == Expect::Pass {
            "pass"
        } else {
            "fail"
        },
        diagnosis
            .as_ref()
            .map(|d| format!(" with {d}"))
            .unwrap_or_default()
    );
    let outcome = crate::lab::check(lab, groups, false).map(|report| {
        let passed = report.passed();
        let ids = report.diagnosis_ids();
        let ok = match expect {
            Expect::Pass => passed,
            Expect::Fail => {
                !passed
                    && diagnosis
                        .as_ref()
                        .is_none_or(|d| ids.iter().any(|id| id == d))
            }
        };
        let detail = if passed {
            format!("all {} probes passed", report.probes)
        } else {
            format!(
                "{}/{} probes failed; {}",
                report.failures.len(),
                report.probes,
                diagnoses_text(&report)
            )
        };
        (ok, detail)
    });
    (what, outcome)
}

/// Replays a scenario in a fresh lab whose pods `runtime` attaches
/// (`--runtime`); `log` hears each step as it ends. The lab is torn down,
/// except with `keep`: then only the steps up to the faulted state run
/// (see [`planned`]) and, when each behaved as written, the lab stays up as
/// the standing lab `keep` names, faults in place (`cnilab lab down
/// --name` removes it).
pub fn run(
    scenario: &Scenario,
    plugin_dir: Option<String>,
    runtime: RuntimeKind,
    keep: Option<&str>,
    log: &mut dyn FnMut(&StepLog),
) -> Result<ScenarioResult, ScenarioError> {
    let opts = UpOptions {
        plugin_dir,
        persistent: keep.map(str::to_string),
        run_dir: match keep {
            Some(name) => crate::lab::state::run_dir(name),
            None => crate::lab::scratch_run_dir().join(&scenario.name),
        },
        runtime,
    };
    let planned = planned(scenario, keep.is_some());
    let mut lab = match &scenario.capture {
        Some(c) => crate::lab::replay::replay(&scenario.name, &c.files, opts)?.0,
        None => Lab::up(scenario.topology.clone(), opts)?,
    };
    let mut undos: Vec<Undo> = Vec::new();
    let mut steps = Vec::new();
    let mut error = None;
    let mut skipped = None;
    for (i, step) in planned.iter().enumerate() {
        let n = i + 1;
        let mut kernel_drop = None;
        let (what, outcome): (String, Result<(bool, String), LabError>) = match step {
            Step::Check {
                expect,
                diagnosis,
                groups,
            } => check_step(&lab, expect, diagnosis.as_deref(), groups),
            Step::Fault { fault } => {
                let what = format!("fault: {}", fault.describe());
                let outcome = faults::apply(&mut lab, fault).map(|u| {
                    undos.push(u);
                    (true, "injected".to_string())
                });
                (what, outcome)
            }
            Step::Heal => {
                let mut result = Ok((true, format!("{} fault(s) undone", undos.len())));
                while let Some(u) = undos.pop() {
                    if let Err(e) = faults::undo(&mut lab, u) {
                        result = Err(e);
                        break;
                    }
                }
                ("heal".to_string(), result)
            }
            Step::Sleep { ms } => {
                std::thread::sleep(std::time::Duration::from_millis(*ms));
                (format!("sleep {ms} ms"), Ok((true, String::new())))
            }
            Step::Trace(t) => {
                let probe = (t.proto, t.port, None);
                let outcome = crate::lab::trace::in_lab(&lab, &t.from, &t.to, probe).map(|trace| {
                    let (ok, detail, drop) = judge_trace(&trace, t);
                    kernel_drop = drop;
                    (ok, detail)
                });
                (t.describe(), outcome)
            }
        };
        let entry = match outcome {
            Ok((ok, detail)) => StepLog {
                step: n,
                what,
                ok,
                detail,
                kernel_drop,
            },
            Err(LabError::Unsupported(reason)) => {
                skipped = Some(reason.clone());
                StepLog {
                    step: n,
                    what,
                    ok: false,
                    detail: format!("cannot apply: {reason}"),
                    kernel_drop: None,
                }
            }
            Err(e) => {
                error = Some(ScenarioError::Step {
                    step: n,
                    what: what.clone(),
                    reason: e.to_string(),
                });
                StepLog {
                    step: n,
                    what,
                    ok: false,
                    detail: e.to_string(),
                    kernel_drop: None,
                }
            }
        };
        log(&entry);
        let stop = !entry.ok;
        steps.push(entry);
        if stop {
            break;
        }
    }
    let passed = steps.iter().all(|s| s.ok) && steps.len() == planned.len();
    if keep.is_some() && passed && error.is_none() {
        crate::lab::state::persist(lab)?;
    } else {
        let run_dir = lab.opts.run_dir.clone();
        lab.down();
        let _ = std::fs::remove_dir_all(&run_dir);
    }
    if let Some(e) = error {
        return Err(e);
    }
    Ok(ScenarioResult {
        name: scenario.name.clone(),
        passed,
        skipped,
        steps,
    })
}
