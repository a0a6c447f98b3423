//! The soak's account: the operations log, the findings (each with its
//! replay command, the step's plan and its log), failed operations by code,
//! latency per operation, and the table / JSON renderings.

use super::plan::CyclePlan;
use super::{step_of, Budget, SoakOptions};
use crate::runtime::{NetworkConfig, RuntimeError};
use crate::util::{fmt_ms, Percentiles};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OpOutcome {
    Ok,
    /// SIGKILLed on purpose (a planned kill that landed).
    Killed,
    /// The plugin answered with a CNI error.
    Error {
        code: u32,
        msg: String,
    },
    /// Non-zero exit or a signal without a CNI error body on stdout.
    Crashed {
        status: String,
        stderr: String,
    },
    Timeout,
    /// The plugin broke the protocol (e.g. exit 0 with a non-result).
    Defect {
        reason: String,
    },
    /// The harness could not do its part (namespace, cache, config).
    Harness {
        msg: String,
    },
}

impl OpOutcome {
    pub fn of_error(e: &RuntimeError, kill_planned: bool) -> OpOutcome {
        match e {
            RuntimeError::Crashed(x) if kill_planned && x.signal == Some(9) && !x.timed_out => {
                OpOutcome::Killed
            }
            RuntimeError::Plugin { error, .. } => OpOutcome::Error {
                code: error.code,
                msg: error.msg.clone(),
            },
            RuntimeError::Crashed(x) => OpOutcome::Crashed {
                status: x.status_text(),
                stderr: tail(&x.stderr, 300),
            },
            RuntimeError::Timeout(_) => OpOutcome::Timeout,
            RuntimeError::Defect { reason, .. } => OpOutcome::Defect {
                reason: reason.clone(),
            },
            other => OpOutcome::Harness {
                msg: other.to_string(),
            },
        }
    }

    /// Short text: `ok`, `killed`, `code 11`, `crashed (signal 6)`, ...
    pub fn short(&self) -> String {
        match self {
            OpOutcome::Ok => "ok".into(),
            OpOutcome::Killed => "killed".into(),
            OpOutcome::Error { code, .. } => format!("code {code}"),
            // A signal is a crash; a plain non-zero exit is a failure
            // without the error JSON, not a crash.
            OpOutcome::Crashed { status, .. } if status.starts_with("signal") => {
                format!("crashed ({status})")
            }
            OpOutcome::Crashed { status, .. } => format!("{status}, no error JSON"),
            OpOutcome::Timeout => "timeout".into(),
            OpOutcome::Defect { .. } => "protocol defect".into(),
            OpOutcome::Harness { .. } => "harness error".into(),
        }
    }

    fn message(&self) -> String {
        match self {
            OpOutcome::Error { msg, .. } => msg.clone(),
            OpOutcome::Crashed { stderr, .. } if stderr.is_empty() => {
                "no CNI error JSON on stdout, nothing on stderr".into()
            }
            OpOutcome::Crashed { stderr, .. } => stderr.clone(),
            OpOutcome::Defect { reason } => reason.clone(),
            OpOutcome::Harness { msg } => msg.clone(),
            _ => String::new(),
        }
    }
}

/// The last `max` characters of `s` (trimmed), marked when cut.
fn tail(s: &str, max: usize) -> String {
    let s = s.trim();
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let cut: String = s.chars().skip(n - max).collect();
    format!("…{cut}")
}

/// One operation of the run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OpRecord {
    /// `step 17`, `resident 2`, `warm-up 0`, `final cleanup`.
    pub who: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// `ADD`, `ADD (kill at 3.2 ms)`, `CHECK`, `DEL (netns gone)`, `GC (keeping 9)`, ...
    pub op: String,
    pub container_id: String,
    /// Start, since the run began.
    pub at_ms: f64,
    pub duration_ms: f64,
    pub outcome: OpOutcome,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpNet>,
    /// A shell line that repeats the failing plugin call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
}

impl OpRecord {
    /// The row an operation is counted under in the latency table.
    fn group(&self) -> String {
        let base = self.op.split(" (retry").next().unwrap_or(&self.op);
        if base.starts_with("ADD (kill") {
            return if self.outcome == OpOutcome::Killed {
                "ADD (killed)".into()
            } else {
                "ADD (kill missed)".into()
            };
        }
        if base.starts_with("GC") {
            return "GC".into();
        }
        base.to_string()
    }

    fn line(&self) -> String {
        let mut s = format!(
            "+{:>9.1} ms  {:<14} {:<28} {:<16} {:>8.1} ms",
            self.at_ms,
            self.who,
            self.op,
            self.outcome.short(),
            self.duration_ms
        );
        if !self.ips.is_empty() {
            let ips: Vec<String> = self.ips.iter().map(|i| i.to_string()).collect();
            let _ = write!(s, "  ips {}", ips.join(","));
        }
        let msg = self.outcome.message();
        if !msg.is_empty() {
            let _ = write!(s, "  {}", tail(&msg, 200));
        }
        s
    }
}

/// What kind of thing was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A reservation left in the store after every pod was deleted.
    LeakedAddress,
    /// A link (host veth, ...) left in the host namespace.
    LeakedLink,
    /// A firewall rule left in the host namespace.
    LeakedRule,
    /// An interface left in a pod's namespace after a DEL with CNI_NETNS.
    LeftInPodNetns,
    /// One address handed to two live pods.
    DuplicateAddress,
    /// A pod in GC's list of live attachments was damaged by the GC.
    LiveAttachmentBroken,
    /// An ADD that was not killed failed (the runtime would retry it; the
    /// pod never started).
    AddFailed,
}

impl FindingKind {
    /// Every kind, in report order.
    pub const ALL: [FindingKind; 7] = [
        FindingKind::LeakedAddress,
        FindingKind::LeakedLink,
        FindingKind::LeakedRule,
        FindingKind::LeftInPodNetns,
        FindingKind::DuplicateAddress,
        FindingKind::LiveAttachmentBroken,
        FindingKind::AddFailed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FindingKind::LeakedAddress => "leaked address",
            FindingKind::LeakedLink => "leaked link",
            FindingKind::LeakedRule => "leaked firewall rule",
            FindingKind::LeftInPodNetns => "left in pod netns",
            FindingKind::DuplicateAddress => "duplicate address",
            FindingKind::LiveAttachmentBroken => "live pod broken by GC",
            FindingKind::AddFailed => "failed ADD",
        }
    }
}

/// One finding, with what is needed to replay it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub detail: String,
    /// The pods involved (empty when it cannot be attributed).
    pub container_ids: Vec<String>,
    /// The steps of those pods.
    pub steps: Vec<u64>,
    /// `cnilab soak ... --replay N`, one per step.
    pub replay: Vec<String>,
    /// The plans of those steps.
    pub plans: Vec<CyclePlan>,
    /// Every operation on those pods, in order.
    pub log: Vec<OpRecord>,
}

impl Finding {
    pub fn new(kind: FindingKind, detail: String, container_ids: Vec<String>) -> Finding {
        Finding {
            kind,
            detail,
            container_ids,
            steps: Vec::new(),
            replay: Vec::new(),
            plans: Vec::new(),
            log: Vec::new(),
        }
    }

    /// Adds the steps, replay commands, plans and operations of the pods.
    pub(super) fn attach(&mut self, log: &[OpRecord], opts: &SoakOptions) {
        let knobs = opts.knobs();
        let steps: BTreeSet<u64> = self
            .container_ids
            .iter()
            .filter_map(|c| step_of(c))
            .collect();
        self.steps = steps.iter().copied().collect();
        self.replay = steps.iter().map(|s| opts.replay_command(*s)).collect();
        self.plans = steps.iter().map(|s| CyclePlan::new(&knobs, *s)).collect();
        self.log = log
            .iter()
            .filter(|r| {
                self.container_ids.contains(&r.container_id)
                    || r.step.is_some_and(|s| steps.contains(&s))
            })
            .cloned()
            .collect();
    }
}

/// Latency and failures of one kind of operation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OpStats {
    pub op: String,
    pub count: usize,
    pub failed: usize,
    /// Over the successful ones (for killed ADDs: the time until the kill).
    pub latency: Percentiles,
}

/// Failed operations of one kind with one outcome.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FailureGroup {
    pub op: String,
    pub outcome: String,
    pub count: usize,
    /// Who failed first, and its message.
    pub example: String,
    pub msg: String,
}

/// Leaks planted with `--inject-leaks` and what became of them.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Injected {
    pub records: usize,
    pub links: usize,
    pub records_reclaimed: usize,
    pub links_reclaimed: usize,
}

/// The result of a soak.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SoakReport {
    pub plugin_dir: String,
    pub config: PathBuf,
    pub network: String,
    pub config_version: String,
    /// Each plugin of the chain and the versions its VERSION lists
    /// (JSON: `[{"plugin": …, "versions": […]}]`).
    #[serde(serialize_with = "plugin_versions")]
    pub plugin_versions: Vec<(String, Vec<String>)>,
    pub seed: u64,
    pub parallel: usize,
    pub resident_pods: usize,
    pub kill_rate: f64,
    pub gc_every: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<u64>,
    /// Steps run.
    pub steps: u64,
    pub churn_seconds: f64,
    pub kill_window_ms: f64,
    pub kills_landed: u64,
    pub kills_missed: u64,
    pub lose_rate: f64,
    /// Pods the runtime lost after a killed ADD (never DELeted).
    pub lost_pods: u64,
    pub gc_supported: bool,
    pub gc_runs: u64,
    /// The command that repeats the whole run.
    pub rerun: String,
    pub operations: Vec<OpStats>,
    pub failures: Vec<FailureGroup>,
    pub findings: Vec<Finding>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injected: Option<Injected>,
    pub notes: Vec<String>,
    /// Every operation (written with `--log`, not part of the JSON report).
    #[serde(skip)]
    pub log: Vec<OpRecord>,
}

fn plugin_versions<S: serde::Serializer>(
    v: &[(String, Vec<String>)],
    s: S,
) -> Result<S::Ok, S::Error> {
    crate::report::pairs_as_objects(v, "plugin", "versions", s)
}

/// What [`SoakReport::build`] summarizes.
pub(super) struct Inputs<'a> {
    pub opts: &'a SoakOptions,
    pub net: &'a NetworkConfig,
    pub plugin_versions: Vec<(String, Vec<String>)>,
    pub steps: u64,
    pub churn_time: Duration,
    pub kill_window: Duration,
    pub kills_landed: u64,
    pub kills_missed: u64,
    pub lost_pods: u64,
    pub gc_runs: u64,
    pub gc_supported: bool,
    pub findings: Vec<Finding>,
    pub log: Vec<OpRecord>,
    pub injected: Option<Injected>,
    pub notes: Vec<String>,
}

impl SoakReport {
    pub(super) fn build(i: Inputs<'_>) -> SoakReport {
        let opts = i.opts;
        let mut groups: BTreeMap<String, (usize, usize, Vec<Duration>)> = BTreeMap::new();
        let mut failures: BTreeMap<(String, String), FailureGroup> = BTreeMap::new();
        for rec in &i.log {
            let g = groups.entry(rec.group()).or_default();
            g.0 += 1;
            let expected = matches!(rec.outcome, OpOutcome::Ok | OpOutcome::Killed);
            if expected {
                g.2.push(Duration::from_secs_f64(rec.duration_ms / 1000.0));
            } else {
                g.1 += 1;
                let key = (rec.group(), rec.outcome.short());
                failures
                    .entry(key.clone())
                    .or_insert_with(|| FailureGroup {
                        op: key.0.clone(),
                        outcome: key.1.clone(),
                        count: 0,
                        example: rec.who.clone(),
                        msg: tail(&rec.outcome.message(), 300),
                    })
                    .count += 1;
            }
        }
        let order = |op: &str| -> usize {
            const ORDER: &[&str] = &["ADD", "ADD (kill", "CHECK", "DEL", "GC"];
            ORDER
                .iter()
                .rposition(|p| op.starts_with(p))
                .unwrap_or(ORDER.len())
        };
        let mut operations: Vec<OpStats> = groups
            .into_iter()
            .map(|(op, (count, failed, samples))| OpStats {
                latency: Percentiles::of(&samples),
                op,
                count,
                failed,
            })
            .collect();
        operations.sort_by(|a, b| order(&a.op).cmp(&order(&b.op)).then(a.op.cmp(&b.op)));
        let mut findings = i.findings;
        findings.sort_by(|a, b| a.kind.cmp(&b.kind).then(a.steps.cmp(&b.steps)));
        let budget = match opts.budget {
            Budget::Cycles(c) => format!("--cycles {c}"),
            Budget::Duration(d) => format!("--duration {}s", d.as_secs()),
        };
        SoakReport {
            plugin_dir: opts.plugin_dir.clone(),
            config: opts.config.clone(),
            network: i.net.name.clone(),
            config_version: i.net.version.to_string(),
            plugin_versions: i.plugin_versions,
            seed: opts.seed,
            parallel: opts.parallel,
            resident_pods: opts.pods,
            kill_rate: opts.kill_rate,
            gc_every: opts.gc_every,
            replay: opts.replay,
            steps: i.steps,
            churn_seconds: i.churn_time.as_secs_f64(),
            kill_window_ms: i.kill_window.as_secs_f64() * 1000.0,
            kills_landed: i.kills_landed,
            kills_missed: i.kills_missed,
            lose_rate: opts.lose_rate,
            lost_pods: i.lost_pods,
            gc_supported: i.gc_supported,
            gc_runs: i.gc_runs,
            rerun: format!(
                "cnilab soak --plugin-dir {} --config {} --seed {} --kill-rate {} --lose-rate {} --gc-every {} --pods {} --parallel {} {budget}",
                opts.plugin_dir,
                opts.config.display(),
                opts.seed,
                opts.kill_rate,
                opts.lose_rate,
                opts.gc_every,
                opts.pods,
                opts.parallel
            ),
            operations,
            failures: failures.into_values().collect(),
            findings,
            injected: i.injected,
            notes: i.notes,
            log: i.log,
        }
    }

    /// No leak, no duplicate, no live pod broken, no failed ADD.
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }

    /// The findings of one kind, in report order.
    pub fn of_kind(&self, kind: FindingKind) -> impl Iterator<Item = &Finding> + '_ {
        self.findings.iter().filter(move |f| f.kind == kind)
    }

    pub fn count(&self, kind: FindingKind) -> usize {
        self.of_kind(kind).count()
    }

    /// The whole operations log, one JSON object per line.
    pub fn log_jsonl(&self) -> String {
        let mut out = String::new();
        for rec in &self.log {
            if let Ok(line) = serde_json::to_string(rec) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }

    /// The findings: counted by kind, then each with how to replay it, the
    /// plans of its steps and its operation log.
    fn findings_table(&self, s: &mut String) {
        if self.findings.is_empty() {
            let _ = writeln!(s, "findings: none (no leak, no duplicate, no failed ADD)");
        } else {
            let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
            for f in &self.findings {
                *by_kind.entry(f.kind.label()).or_default() += 1;
            }
            let summary: Vec<String> = by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
            let _ = writeln!(s, "findings: {}", summary.join(", "));
            for f in &self.findings {
                let _ = writeln!(s);
                let _ = writeln!(s, "[{}] {}", f.kind.label(), f.detail);
                for r in &f.replay {
                    let _ = writeln!(s, "  replay: {r}");
                }
                if f.replay.is_empty() {
                    let _ = writeln!(
                        s,
                        "  {}; rerun the whole run (see rerun above), with --log FILE for every operation",
                        if f.log.is_empty() {
                            "not attributable to a pod"
                        } else {
                            "a warm-up or resident pod, not a churn step"
                        }
                    );
                }
                for p in &f.plans {
                    let _ = writeln!(
                        s,
                        "  plan of step {}: {}, {} CHECK(s), {}, {} repeated DEL(s){}",
                        p.step,
                        match (p.kill_at, p.lost) {
                            (Some(f), true) => format!(
                                "ADD killed at {f:.2} of the window and the pod lost (no DEL)"
                            ),
                            (Some(f), false) => format!("ADD killed at {f:.2} of the window"),
                            (None, _) => "ADD not killed".into(),
                        },
                        p.checks,
                        p.del,
                        p.repeat_dels,
                        if p.gc { ", GC after ADD" } else { "" }
                    );
                }
                for rec in &f.log {
                    let _ = writeln!(s, "    {}", rec.line());
                }
            }
        }
    }
}

impl crate::report::Rendered for SoakReport {
    fn table(&self) -> String {
        let mut s = String::new();
        let plugins: Vec<&str> = self
            .plugin_versions
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        let _ = writeln!(
            s,
            "cnilab soak: {} ({}), network {} at config version {}",
            plugins.join(" + "),
            self.plugin_dir,
            self.network,
            self.config_version
        );
        let _ = writeln!(
            s,
            "seed {} · {} steps in {:.1} s · {} workers · {} resident pods{}",
            self.seed,
            self.steps,
            self.churn_seconds,
            self.parallel,
            self.resident_pods,
            match self.replay {
                Some(step) => format!(" · replay of step {step}"),
                None => String::new(),
            }
        );
        let _ = writeln!(
            s,
            "kill rate {} within a typical ADD (at the end {:.1} ms): {} kills landed, {} came after the ADD had finished · GC: {}",
            self.kill_rate,
            self.kill_window_ms,
            self.kills_landed,
            self.kills_missed,
            if self.gc_supported {
                format!("{} runs (every {} steps)", self.gc_runs, self.gc_every)
            } else {
                "not called".into()
            }
        );
        if self.lose_rate > 0.0 {
            let _ = writeln!(
                s,
                "lose rate {}: the runtime lost {} pods after their ADD was killed (no DEL; only GC reclaims)",
                self.lose_rate, self.lost_pods
            );
        }
        let _ = writeln!(s, "rerun: {}", self.rerun);
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<28} {:>7} {:>7} {:>10} {:>10} {:>10}",
            "operation", "count", "failed", "median", "p95", "max"
        );
        for op in &self.operations {
            let _ = writeln!(
                s,
                "{:<28} {:>7} {:>7} {:>10} {:>10} {:>10}",
                op.op,
                op.count,
                op.failed,
                fmt_ms(op.latency.median),
                fmt_ms(op.latency.p95),
                fmt_ms(op.latency.max)
            );
        }
        if !self.failures.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(s, "failed operations:");
            for f in &self.failures {
                let msg = if f.msg.is_empty() {
                    String::new()
                } else {
                    format!(": {}", f.msg)
                };
                let _ = writeln!(
                    s,
                    "  {:<26} {:<20} x{:<5} first: {}{msg}",
                    f.op, f.outcome, f.count, f.example
                );
            }
        }
        if let Some(inj) = &self.injected {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "planted leaks: {}/{} store records and {}/{} links reclaimed",
                inj.records_reclaimed, inj.records, inj.links_reclaimed, inj.links
            );
        }
        let _ = writeln!(s);
        self.findings_table(&mut s);
        if !self.notes.is_empty() {
            let _ = writeln!(s);
            for n in &self.notes {
                let _ = writeln!(s, "note: {n}");
            }
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "verdict: {}",
            if self.passed() {
                "PASS (no leak, no duplicate, no failed ADD)"
            } else {
                "FAIL"
            }
        );
        s
    }

    fn json(&self) -> String {
        crate::report::json("SoakReport", self)
    }

    /// JUnit XML: one test case per kind of finding (failed when the soak
    /// found one), with the details and replay commands.
    fn junit(&self) -> String {
        use crate::report::junit::{Case, Report, Suite};
        let mut suite = Suite::new(format!(
            "cnilab soak {} (seed {})",
            self.plugin_dir, self.seed
        ));
        suite.time = Some(Duration::from_secs_f64(self.churn_seconds.max(0.0)));
        for kind in FindingKind::ALL {
            let mine: Vec<&Finding> = self.of_kind(kind).collect();
            let name = format!("no {}", kind.label());
            suite.cases.push(if mine.is_empty() {
                Case::pass(name).classname("cnilab.soak")
            } else {
                let body: Vec<String> = mine
                    .iter()
                    .map(|f| format!("{}\n  {}", f.detail, f.replay.join("\n  ")))
                    .collect();
                Case::failure(
                    name,
                    format!("{} {}", mine.len(), kind.label()),
                    body.join("\n"),
                )
                .classname("cnilab.soak")
            });
        }
        let mut report = Report::new("cnilab soak");
        report.time = suite.time;
        report.suites.push(suite);
        report.to_xml()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_non_zero_exit_is_not_called_a_crash_and_always_says_something() {
        let exit = OpOutcome::Crashed {
            status: "exit 1".into(),
            stderr: String::new(),
        };
        assert_eq!(exit.short(), "exit 1, no error JSON");
        assert!(!exit.message().is_empty());
        let signal = OpOutcome::Crashed {
            status: "signal 6".into(),
            stderr: "abort".into(),
        };
        assert_eq!(signal.short(), "crashed (signal 6)");
        assert_eq!(signal.message(), "abort");
    }

    fn rec(op: &str, outcome: OpOutcome, ms: f64) -> OpRecord {
        OpRecord {
            who: "step 1".into(),
            step: Some(1),
            op: op.into(),
            container_id: "soak-1".into(),
            at_ms: 0.0,
            duration_ms: ms,
            outcome,
            ips: Vec::new(),
            call: None,
        }
    }

    #[test]
    fn operations_are_grouped_for_latency() {
        assert_eq!(
            rec("ADD (kill at 3.0 ms)", OpOutcome::Killed, 1.0).group(),
            "ADD (killed)"
        );
        assert_eq!(
            rec("ADD (kill at 3.0 ms)", OpOutcome::Ok, 1.0).group(),
            "ADD (kill missed)"
        );
        assert_eq!(
            rec("DEL (netns gone) (retry 2)", OpOutcome::Ok, 1.0).group(),
            "DEL (netns gone)"
        );
        assert_eq!(rec("GC (keeping 7)", OpOutcome::Ok, 1.0).group(), "GC");
    }

    #[test]
    fn tail_keeps_the_end() {
        assert_eq!(tail("abcdef", 3), "…def");
        assert_eq!(tail(" ab ", 3), "ab");
        assert_eq!(tail("abc", 3), "abc");
    }
}
