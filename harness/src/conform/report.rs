//! The conformance report: per-check verdicts, evidence, timing; rendered
//! as a terminal table, JSON, or JUnit XML (through `crate::report`).

use super::ConformOptions;
use crate::runtime::{Execution, NetworkConfig, Timing};
use crate::util::clip;
use crate::util::{fmt_ms, Percentiles};
use crate::verdict::{Finding, Verdict};
use std::fmt::Write as _;
use std::time::Duration;

/// Evidence kept per check (the first failing executions).
const MAX_EVIDENCE: usize = 3;

#[derive(Clone, Debug, serde::Serialize)]
pub struct CheckReport {
    pub id: String,
    pub name: String,
    pub verdict: Verdict,
    /// Every observation, worst first.
    pub details: Vec<String>,
    /// Plugin calls behind the failures and warnings.
    pub evidence: Vec<Execution>,
    /// How to fix the rule (FAIL and WARN only).
    pub fix: Option<String>,
}

fn ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

impl CheckReport {
    pub fn from_findings(id: &str, name: &str, findings: &[&Finding]) -> CheckReport {
        let verdict = if findings.is_empty() {
            Verdict::Fail
        } else {
            super::worst(findings)
        };
        let mut sorted: Vec<&&Finding> = findings.iter().collect();
        sorted.sort_by_key(|f| std::cmp::Reverse(f.verdict));
        let mut details: Vec<String> = sorted
            .iter()
            .map(|f| format!("{}: {}", f.verdict, f.detail))
            .collect();
        if findings.is_empty() {
            details.push("FAIL: no observation was made for this check (harness defect)".into());
        }
        let evidence = sorted
            .iter()
            .filter(|f| matches!(f.verdict, Verdict::Fail | Verdict::Warn))
            .flat_map(|f| f.executions.iter().cloned())
            .take(MAX_EVIDENCE)
            .collect();
        CheckReport {
            id: id.to_string(),
            name: name.to_string(),
            fix: matches!(verdict, Verdict::Fail | Verdict::Warn)
                .then(|| super::advice::fix_for(id).map(String::from))
                .flatten(),
            verdict,
            details,
            evidence,
        }
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct OperationTiming {
    pub command: String,
    pub calls: usize,
    pub failed: usize,
    pub timing: Percentiles,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct GroupTiming {
    pub group: String,
    #[serde(serialize_with = "ms")]
    pub wall_time: Duration,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    pub checks: usize,
    pub passed: usize,
    pub failed: usize,
    pub warnings: usize,
    pub skipped: usize,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ConformReport {
    pub plugin_dir: String,
    pub config: String,
    pub network: String,
    pub config_version: String,
    pub plugin: String,
    pub plugin_versions: Vec<String>,
    /// Causes behind several failed rules at once, most rules first: what to
    /// fix first.
    pub root_causes: Vec<super::advice::RootCause>,
    pub checks: Vec<CheckReport>,
    pub operations: Vec<OperationTiming>,
    pub groups: Vec<GroupTiming>,
    pub summary: Summary,
    #[serde(serialize_with = "ms")]
    pub wall_time: Duration,
}

impl ConformReport {
    pub(crate) fn new(
        opts: &ConformOptions,
        net: &NetworkConfig,
        plugin_versions: Vec<String>,
        checks: Vec<CheckReport>,
        timings: &[Timing],
        groups: Vec<(String, Duration)>,
        wall_time: Duration,
    ) -> ConformReport {
        let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
        let summary = Summary {
            checks: checks.len(),
            passed: count(Verdict::Pass),
            failed: count(Verdict::Fail),
            warnings: count(Verdict::Warn),
            skipped: count(Verdict::Skip),
        };
        let mut commands: Vec<String> = timings.iter().map(|t| t.command.clone()).collect();
        commands.sort();
        commands.dedup();
        let order = ["ADD", "CHECK", "DEL", "VERSION", "STATUS", "GC"];
        commands.sort_by_key(|c| order.iter().position(|o| o == c).unwrap_or(order.len()));
        let operations = commands
            .into_iter()
            .map(|command| {
                let mine: Vec<&Timing> = timings.iter().filter(|t| t.command == command).collect();
                OperationTiming {
                    calls: mine.len(),
                    failed: mine.iter().filter(|t| !t.success).count(),
                    timing: Percentiles::of(&mine.iter().map(|t| t.duration).collect::<Vec<_>>()),
                    command,
                }
            })
            .collect();
        ConformReport {
            plugin_dir: opts.plugin_dir.clone(),
            config: opts.config.display().to_string(),
            network: net.name.clone(),
            config_version: net.version.to_string(),
            plugin: net.plugin_type(0).to_string(),
            plugin_versions,
            root_causes: super::advice::root_causes(
                checks
                    .iter()
                    .filter(|c| c.verdict == Verdict::Fail)
                    .map(|c| (c.id.as_str(), c.details.as_slice())),
            ),
            checks,
            operations,
            groups: groups
                .into_iter()
                .map(|(group, wall_time)| GroupTiming { group, wall_time })
                .collect(),
            summary,
            wall_time,
        }
    }

    /// Exit status: success iff no check failed.
    pub fn passed(&self) -> bool {
        self.summary.failed == 0
    }

    pub fn summary_line(&self) -> String {
        let s = &self.summary;
        format!(
            "{} checks: {} passed, {} failed, {} warnings, {} skipped",
            s.checks, s.passed, s.failed, s.warnings, s.skipped
        )
    }
}

fn write_evidence(out: &mut String, e: &Execution) {
    let _ = writeln!(
        out,
        "    evidence: {} ({}, {})",
        e.command().unwrap_or("?"),
        e.status_text(),
        fmt_ms(e.duration)
    );
    let _ = writeln!(out, "      command: {}", e.shell_line());
    let _ = writeln!(out, "      stdout:  {}", one_line(&clip(&e.stdout), 400));
    let _ = writeln!(out, "      stderr:  {}", one_line(&clip(&e.stderr), 400));
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    } else {
        flat
    }
}

impl crate::report::Rendered for ConformReport {
    /// The terminal table, failures with evidence, timing, summary line.
    fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "cnilab conform: plugin {} from {} · network {} ({}) · plugin supports {}",
            self.plugin,
            self.plugin_dir,
            self.network,
            self.config_version,
            if self.plugin_versions.is_empty() {
                "?".to_string()
            } else {
                self.plugin_versions.join(", ")
            }
        );
        let _ = writeln!(out);
        if !self.root_causes.is_empty() {
            let _ = writeln!(out, "Fix first");
            for (n, r) in self.root_causes.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "  {}. {} — explains {} ({})",
                    n + 1,
                    r.cause,
                    r.ids.join(", "),
                    r.ids.len()
                );
                let _ = writeln!(out, "     how to fix: {}", r.fix);
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(out, "{:<4} {:<5} {:<48} NOTE", "ID", "", "CHECK");
        for c in &self.checks {
            let note = c
                .details
                .first()
                .map(|d| d.split_once(": ").map(|(_, r)| r).unwrap_or(d))
                .unwrap_or("");
            let _ = writeln!(
                out,
                "{:<4} {:<5} {:<48} {}",
                c.id,
                c.verdict.as_str(),
                c.name,
                one_line(note, 80)
            );
        }
        let troubled: Vec<&CheckReport> = self
            .checks
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::Fail | Verdict::Warn))
            .collect();
        if !troubled.is_empty() {
            let _ = writeln!(out, "\nDetails");
            for c in troubled {
                let _ = writeln!(out, "\n{} {} — {}", c.id, c.verdict, c.name);
                if let Some(fix) = &c.fix {
                    let _ = writeln!(out, "  how to fix: {fix}");
                }
                for d in c
                    .details
                    .iter()
                    .filter(|d| !d.starts_with("PASS") && !d.starts_with("SKIP"))
                {
                    let _ = writeln!(out, "  {d}");
                }
                if c.verdict == Verdict::Fail {
                    for e in &c.evidence {
                        write_evidence(&mut out, e);
                    }
                }
            }
        }
        let _ = writeln!(out, "\nTiming per operation");
        let _ = writeln!(
            out,
            "  {:<12} {:>6} {:>7} {:>10} {:>10} {:>10}",
            "OP", "calls", "failed", "median", "p95", "max"
        );
        for o in &self.operations {
            let _ = writeln!(
                out,
                "  {:<12} {:>6} {:>7} {:>10} {:>10} {:>10}",
                o.command,
                o.calls,
                o.failed,
                fmt_ms(o.timing.median),
                fmt_ms(o.timing.p95),
                fmt_ms(o.timing.max)
            );
        }
        let groups: Vec<String> = self
            .groups
            .iter()
            .map(|g| format!("{} {:.1} s", g.group, g.wall_time.as_secs_f64()))
            .collect();
        let _ = writeln!(
            out,
            "  (failed = non-zero exits, most of them requested by the checks)"
        );
        let _ = writeln!(out, "  per group: {}", groups.join(" · "));
        let _ = writeln!(
            out,
            "\n{} (in {:.1} s)",
            self.summary_line(),
            self.wall_time.as_secs_f64()
        );
        out
    }

    fn json(&self) -> String {
        crate::report::json("ConformReport", self)
    }

    /// JUnit XML: one testcase per check; WARN passes with system-out.
    fn junit(&self) -> String {
        use crate::report::junit::{Case, Outcome, Report, Suite};
        let mut suite = Suite::new(format!(
            "cnilab conform {} ({})",
            self.plugin, self.plugin_dir
        ));
        suite.time = Some(self.wall_time);
        for c in &self.checks {
            let details = c.details.join("\n");
            let name = format!("{} {}", c.id, c.name);
            let case = match c.verdict {
                Verdict::Pass => Case::pass(name),
                Verdict::Skip => Case::new(
                    name,
                    Outcome::Skipped {
                        message: one_line(&details, 200),
                    },
                ),
                Verdict::Warn => Case::pass(name).system_out(details),
                Verdict::Fail => {
                    let mut body = details.clone();
                    for e in &c.evidence {
                        write_evidence(&mut body, e);
                    }
                    Case::failure(name, one_line(&details, 200), body)
                }
            };
            suite.cases.push(case.classname("cnilab.conform"));
        }
        let mut report = Report::new("cnilab conform");
        report.time = Some(self.wall_time);
        report.suites.push(suite);
        report.to_xml()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_finding_decides_and_empty_is_a_failure() {
        let a = Finding::pass("A1", "ok");
        let b = Finding::warn("A1", "dns");
        let r = CheckReport::from_findings("A1", "n", &[&a, &b]);
        assert_eq!(r.verdict, Verdict::Warn);
        assert!(r.details[0].starts_with("WARN"));
        let none = CheckReport::from_findings("A2", "n", &[]);
        assert_eq!(none.verdict, Verdict::Fail);
    }
}
