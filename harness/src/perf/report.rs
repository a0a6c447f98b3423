//! `lab perf`'s report (`kind: PerfReport`): a table, JSON (the file
//! `--save` writes and `--baseline` reads), JUnit (a case per lab, path
//! and metric) and an HTML page with a chart per metric.

use super::compare::{Judged, Verdict};
use super::{Matrix, Metric, Options};
use crate::report::junit::{self, escape, Case, Outcome, Suite};
use crate::report::Rendered;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

pub const KIND: &str = "PerfReport";

/// The largest `--baseline` file read: a result of 2 labs is about 30 KB.
pub const MAX_BYTES: u64 = 16 << 20;

/// A chart's bar: the median and its spread, in the metric's unit.
type Bar = Option<(f64, f64)>;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PerfReport {
    pub options: Options,
    /// One per lab measured: ours first, then `--vs-plugin-dir`'s.
    pub labs: Vec<Matrix>,
    /// The file judged against (`--baseline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub judged: Vec<Judged>,
    /// pass, regression, inconclusive, fail; or measured (nothing judged).
    pub verdict: String,
    pub duration_ms: u64,
}

impl PerfReport {
    /// The verdict from what was judged (and every path's traffic).
    pub fn new(
        options: Options,
        labs: Vec<Matrix>,
        baseline: Option<(String, Vec<Judged>)>,
        duration_ms: u64,
    ) -> PerfReport {
        let broken = labs
            .iter()
            .flat_map(|m| &m.paths)
            .any(|p| p.error.is_some());
        let (baseline, judged) = baseline.map_or((None, Vec::new()), |(f, j)| (Some(f), j));
        let verdict = if broken {
            "fail".to_string()
        } else if baseline.is_some() {
            match super::compare::overall(&judged) {
                Verdict::Pass => "pass",
                Verdict::Regression => "regression",
                Verdict::Inconclusive => "inconclusive",
                Verdict::Fail => "fail",
            }
            .to_string()
        } else {
            "measured".to_string()
        };
        PerfReport {
            options,
            labs,
            baseline,
            judged,
            verdict,
            duration_ms,
        }
    }

    /// 0 measured or passed, 1 regression or a path without traffic,
    /// 3 inconclusive.
    pub fn exit_code(&self) -> u8 {
        match self.verdict.as_str() {
            "fail" | "regression" => 1,
            "inconclusive" => 3,
            _ => 0,
        }
    }

    /// A saved report read back (`--baseline`), with what is wrong with it.
    pub fn load(path: &std::path::Path) -> Result<PerfReport, String> {
        let file = crate::capture::open_capped_as(
            path,
            MAX_BYTES,
            ("a lab perf result", "cnilab lab perf --save FILE"),
        )
        .map_err(|e| format!("--baseline {e}"))?;
        let doc: serde_json::Value = serde_json::from_reader(file)
            .map_err(|e| format!("--baseline {}: not JSON: {e}", path.display()))?;
        if doc.get("kind").and_then(|k| k.as_str()) != Some(KIND) {
            return Err(format!(
                "--baseline {}: not a lab perf report (kind {KIND}); write one with `cnilab lab perf --save FILE`",
                path.display()
            ));
        }
        let problems = crate::report::schema::check_report(&doc);
        if !problems.is_empty() {
            return Err(format!(
                "--baseline {}: {}",
                path.display(),
                problems.join("; ")
            ));
        }
        serde_json::from_value(doc).map_err(|e| format!("--baseline {}: {e}", path.display()))
    }

    /// Ours against theirs, per path and metric: each ratio to its own
    /// underlay, and ours over theirs.
    fn versus(&self) -> String {
        let [ours, theirs] = match self.labs.as_slice() {
            [a, b] => [a, b],
            _ => return String::new(),
        };
        let mut out = format!(
            "\n{} against {} (ratios to each lab's own underlay, with spreads; ours over theirs):\n",
            ours.label, theirs.label
        );
        for p in ours
            .paths
            .iter()
            .filter(|p| p.path != super::paths::BASELINE)
        {
            let Some(q) = theirs.path(&p.path) else {
                continue;
            };
            let _ = write!(out, "  {:<12}", p.path);
            for metric in Metric::ALL.iter().filter(|m| m.is_ratio()) {
                let ratio = |c: Option<&super::Cell>| {
                    c.and_then(|c| Some((c.ratio?, c.ratio_spread.unwrap_or(0.0))))
                };
                let text = match (ratio(p.cell(*metric)), ratio(q.cell(*metric))) {
                    (Some((a, sa)), Some((b, sb))) if b > 0.0 => format!(
                        "{} {a:.2}×±{sa:.0}% vs {b:.2}×±{sb:.0}% ({:.2})",
                        metric.name(),
                        a / b
                    ),
                    _ => format!("{} -", metric.name()),
                };
                let _ = write!(out, "  {text}");
            }
            out.push('\n');
        }
        out
    }

    fn verdicts(&self) -> String {
        let Some(file) = &self.baseline else {
            return format!(
                "\nmeasured in {:.1} s (no --baseline: no verdict)\n",
                self.duration_ms as f64 / 1000.0
            );
        };
        let mut out = format!("\nagainst {file}:\n");
        for j in self.judged.iter().filter(|j| j.verdict != Verdict::Pass) {
            let word = match j.verdict {
                Verdict::Regression => "REGRESSION",
                Verdict::Fail => "FAIL",
                _ => "INCONCLUSIVE",
            };
            let _ = writeln!(
                out,
                "  {word:<12} {} {}: {}",
                j.path,
                j.metric.name(),
                j.reason
            );
        }
        let passed = self
            .judged
            .iter()
            .filter(|j| j.verdict == Verdict::Pass)
            .count();
        let _ = writeln!(
            out,
            "{}: {passed} of {} path metrics within tolerance, in {:.1} s",
            self.verdict.to_uppercase(),
            self.judged.len(),
            self.duration_ms as f64 / 1000.0
        );
        out
    }

    /// One page: a bar chart per metric (a bar per path and lab, the
    /// spread as a whisker), then the verdicts.
    pub fn html(&self) -> String {
        let mut charts = String::new();
        for metric in Metric::ALL {
            let _ = write!(
                charts,
                "<h2>{} ({})</h2>{}",
                metric.name(),
                escape(metric.unit()),
                self.chart(metric)
            );
        }
        let verdicts = escape(&self.verdicts());
        format!(
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>cnilab lab perf</title><style>body{{font-family:sans-serif;margin:2em}}pre{{background:#f4f4f4;padding:1em}}</style></head><body><h1>cnilab lab perf: {}</h1><pre>{}</pre>{charts}<h2>Verdict</h2><pre>{verdicts}</pre></body></html>\n",
            escape(&self.verdict.to_uppercase()),
            escape(&self.table()),
        )
    }

    /// An SVG bar chart of one metric: a group per path, a bar per lab.
    fn chart(&self, metric: Metric) -> String {
        const COLORS: [&str; 2] = ["#3a6ea5", "#d08c2b"];
        let rows: Vec<(&str, Vec<Bar>)> = super::paths::ALL
            .iter()
            .map(|path| {
                let bars = self
                    .labs
                    .iter()
                    .map(|m| {
                        let c = m.path(path)?.cell(metric)?;
                        let spread = if metric.is_ratio() {
                            c.median * c.spread / 100.0
                        } else {
                            c.spread
                        };
                        Some((c.median, spread))
                    })
                    .collect();
                (*path, bars)
            })
            .collect();
        let max = rows
            .iter()
            .flat_map(|(_, b)| b.iter().flatten())
            .map(|(v, s)| v + s)
            .fold(0.0f64, f64::max)
            .max(f64::MIN_POSITIVE);
        let bar_h = 14;
        let group_h = bar_h * self.labs.len().max(1) + 10;
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"{}\" font-family=\"monospace\" font-size=\"11\">",
            group_h * rows.len() + 10 + 16 * self.labs.len()
        );
        for (gi, (path, bars)) in rows.iter().enumerate() {
            let y0 = 5 + gi * group_h;
            let _ = write!(
                svg,
                "<text x=\"0\" y=\"{}\">{}</text>",
                y0 + bar_h,
                escape(path)
            );
            for (li, bar) in bars.iter().enumerate() {
                let Some((v, s)) = bar else { continue };
                let y = y0 + li * bar_h;
                let w = 480.0 * v / max;
                let (lo, hi) = (
                    120.0 + 480.0 * (v - s).max(0.0) / max,
                    120.0 + 480.0 * (v + s) / max,
                );
                let _ = write!(
                    svg,
                    "<rect x=\"120\" y=\"{y}\" width=\"{w:.1}\" height=\"{}\" fill=\"{}\"/><line x1=\"{lo:.1}\" x2=\"{hi:.1}\" y1=\"{m}\" y2=\"{m}\" stroke=\"#000\"/><text x=\"{:.1}\" y=\"{}\">{}</text>",
                    bar_h - 2,
                    COLORS[li % 2],
                    hi + 4.0,
                    y + bar_h - 3,
                    metric.display(*v),
                    m = y + bar_h / 2,
                );
            }
        }
        for (li, m) in self.labs.iter().enumerate() {
            let y = group_h * rows.len() + 16 * (li + 1);
            let _ = write!(svg, "<rect x=\"120\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"135\" y=\"{y}\">{}</text>", y - 9, COLORS[li % 2], escape(&m.label));
        }
        svg.push_str("</svg>");
        svg
    }
}

impl crate::report::Rendered for PerfReport {
    /// The table: a row per path and a column per metric, each figure
    /// with its spread and (off the underlay) its ratio; then ours against
    /// theirs, then the verdicts.
    fn table(&self) -> String {
        let mut out = String::new();
        for m in &self.labs {
            let _ = writeln!(
                out,
                "{} ({}): {} rounds of {} ms, UDP at {} Mbit/s",
                m.label,
                m.plugin_dir,
                self.options.rounds,
                self.options.window_ms,
                self.options.udp_mbit
            );
            let _ = write!(out, "  {:<12} {:<34}", "PATH", "FROM → TO");
            for metric in Metric::ALL {
                let _ = write!(
                    out,
                    " {:>22}",
                    format!("{} {}", metric.name(), metric.unit())
                );
            }
            out.push('\n');
            for p in &m.paths {
                let _ = write!(
                    out,
                    "  {:<12} {:<34}",
                    p.path,
                    format!("{} → {}", p.from, p.to)
                );
                if let Some(e) = &p.error {
                    let _ = writeln!(out, " FAIL: {e}");
                    continue;
                }
                for c in &p.cells {
                    let ratio = c.ratio.filter(|_| p.path != super::paths::BASELINE);
                    let spread = if c.metric.is_ratio() {
                        format!("±{:.0}%", c.spread)
                    } else {
                        format!("±{:.2}", c.spread)
                    };
                    let text = match ratio {
                        Some(r) => format!("{} {spread} {r:.2}×", c.metric.display(c.median)),
                        None => format!("{} {spread}", c.metric.display(c.median)),
                    };
                    let _ = write!(out, " {text:>22}");
                }
                out.push('\n');
            }
            for s in &m.skipped {
                let _ = writeln!(out, "  {:<12} SKIP: {}", s.path, s.reason);
            }
        }
        out.push_str(&self.versus());
        out.push_str(&self.verdicts());
        out
    }

    fn json(&self) -> String {
        crate::report::json(KIND, self)
    }

    /// A case per lab, path and metric; a judged one fails on a regression
    /// and is skipped when inconclusive.
    fn junit(&self) -> String {
        let mut doc = junit::Report::new("cnilab lab perf");
        for (i, m) in self.labs.iter().enumerate() {
            let mut suite = Suite::new(format!("lab perf {}", m.label));
            for p in &m.paths {
                if let Some(e) = &p.error {
                    suite.cases.push(Case::failure(
                        format!("{} traffic", p.path),
                        "no traffic",
                        e.clone(),
                    ));
                    continue;
                }
                for c in &p.cells {
                    let name = format!("{} {}", p.path, c.metric.name());
                    let figure = format!(
                        "{} {} ±{:.1} ratio {:?}",
                        c.metric.display(c.median),
                        c.metric.unit(),
                        c.spread,
                        c.ratio
                    );
                    let judged = self
                        .judged
                        .iter()
                        .find(|j| i == 0 && j.path == p.path && j.metric == c.metric);
                    let outcome = match judged.map(|j| (j.verdict, j.reason.clone())) {
                        Some((Verdict::Regression | Verdict::Fail, why)) => Outcome::Failure {
                            message: why.clone(),
                            body: why,
                        },
                        Some((Verdict::Inconclusive, why)) => Outcome::Skipped { message: why },
                        _ => Outcome::Pass,
                    };
                    suite.cases.push(
                        Case::new(name, outcome)
                            .classname(format!("lab perf.{}", m.label))
                            .system_out(figure),
                    );
                }
            }
            for s in &m.skipped {
                suite.cases.push(Case::new(
                    format!("{} throughput", s.path),
                    Outcome::Skipped {
                        message: s.reason.clone(),
                    },
                ));
            }
            doc.suites.push(suite);
        }
        doc.to_xml()
    }

    fn html(&self) -> Option<String> {
        Some(PerfReport::html(self))
    }
}
