//! A new matrix judged against a saved one (`lab perf --baseline FILE`),
//! path by path and metric by metric. Ratios to the underlay are compared,
//! not raw figures: the machine's own speed on the day cancels out.
//!
//! A cell regresses when it got worse by more than the tolerance plus the
//! spread of both runs (k8s-netperf's 10% by default; a spread of 4% on
//! each side makes that 18%). UDP loss is compared in percentage points
//! ([`LOSS_POINTS`] plus both spreads). Within a band wider than
//! [`WIDEST`] (a figure that could double and pass) a cell gets no
//! verdict: INCONCLUSIVE, never FAIL.

use super::{Cell, Matrix, Metric};
use serde::{Deserialize, Serialize};

/// The widest band (tolerance plus both spreads, in percent or points)
/// in which a cell still gets a verdict: p99 latency over a 100 ms window
/// on a busy 2-core machine has spreads of 10–50%.
pub const WIDEST: f64 = 75.0;

/// How many more percentage points of UDP loss count as a regression,
/// before the spreads are added.
pub const LOSS_POINTS: f64 = 1.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Regression,
    Inconclusive,
    /// The path carried no traffic.
    Fail,
}

/// One path and metric, judged.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Judged {
    pub path: String,
    pub metric: Metric,
    pub verdict: Verdict,
    /// The compared figure: the ratio to the underlay, or udp-loss in %.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<f64>,
    /// How much worse (positive) or better (negative): percent, or
    /// percentage points for udp-loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worse_by: Option<f64>,
    /// What `worse_by` may reach before it is a regression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<f64>,
    pub reason: String,
}

impl Judged {
    /// A verdict with no figures (yet): a path without traffic, a cell the
    /// baseline lacks, or the start of [`judge`].
    fn bare(path: &str, metric: Metric, verdict: Verdict, reason: String) -> Judged {
        Judged {
            path: path.to_string(),
            metric,
            verdict,
            baseline: None,
            current: None,
            worse_by: None,
            allowed: None,
            reason,
        }
    }
}

/// The compared figure of a cell and its spread (in the figure's terms).
fn figure(c: &Cell) -> Option<(f64, f64)> {
    if c.metric.is_ratio() {
        Some((c.ratio?, c.ratio_spread?))
    } else {
        Some((c.median, c.spread))
    }
}

/// One cell against its baseline.
pub fn judge(path: &str, base: &Cell, cur: &Cell, tolerance: f64) -> Judged {
    let metric = cur.metric;
    let mut j = Judged::bare(path, metric, Verdict::Inconclusive, String::new());
    let (Some((b, bs)), Some((c, cs))) = (figure(base), figure(cur)) else {
        j.reason = "no ratio to the underlay in one of the runs".into();
        return j;
    };
    (j.baseline, j.current) = (Some(b), Some(c));
    let (worse, allowed) = if metric.is_ratio() {
        if b <= 0.0 || !b.is_finite() || !c.is_finite() {
            j.reason = format!("a figure is not usable (baseline {b}, now {c})");
            return j;
        }
        let change = 100.0 * (c - b) / b;
        let worse = if metric.higher_is_better() {
            -change
        } else {
            change
        };
        (worse, tolerance + bs + cs)
    } else {
        (c - b, LOSS_POINTS + bs + cs)
    };
    (j.worse_by, j.allowed) = (Some(worse), Some(allowed));
    let unit = if metric.is_ratio() { "%" } else { " points" };
    if worse > allowed {
        j.verdict = Verdict::Regression;
        j.reason = format!(
            "worse by {worse:.1}{unit} (allowed {allowed:.1}{unit}: tolerance plus both runs' spreads)"
        );
    } else if allowed > WIDEST {
        j.reason = format!(
            "too noisy for a verdict: spreads {bs:.1} then {cs:.1}{unit} make the band {allowed:.0}{unit} (over {WIDEST:.0}); a quieter machine or more --rounds"
        );
    } else {
        j.verdict = Verdict::Pass;
        j.reason = format!("within {allowed:.1}{unit} ({:+.1}{unit})", -worse);
    }
    j
}

/// Every path and metric of `cur` against `base`. The underlay itself is
/// the yardstick, not judged; a path the baseline lacks is INCONCLUSIVE.
pub fn against(base: &Matrix, cur: &Matrix, tolerance: f64) -> Vec<Judged> {
    let mut out = Vec::new();
    for p in cur
        .paths
        .iter()
        .filter(|p| p.path != super::paths::BASELINE)
    {
        let judged = |metric, verdict, reason| Judged::bare(&p.path, metric, verdict, reason);
        if let Some(e) = &p.error {
            out.push(judged(
                Metric::Throughput,
                Verdict::Fail,
                format!("{}: no traffic: {e}", p.path),
            ));
            continue;
        }
        for cur_cell in p.cells.iter().filter(|c| c.metric.judged()) {
            let base_cell = base.path(&p.path).and_then(|b| b.cell(cur_cell.metric));
            out.push(match base_cell {
                Some(b) => judge(&p.path, b, cur_cell, tolerance),
                None => judged(
                    cur_cell.metric,
                    Verdict::Inconclusive,
                    "the baseline has no figure for this path".into(),
                ),
            });
        }
    }
    out
}

/// The verdict of a whole comparison: FAIL on any regression or broken
/// path, else INCONCLUSIVE on any cell without a verdict, else PASS.
pub fn overall(judged: &[Judged]) -> Verdict {
    let any = |v: Verdict| judged.iter().any(|j| j.verdict == v);
    if any(Verdict::Fail) {
        Verdict::Fail
    } else if any(Verdict::Regression) {
        Verdict::Regression
    } else if any(Verdict::Inconclusive) {
        Verdict::Inconclusive
    } else {
        Verdict::Pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(metric: Metric, ratio: f64, spread: f64) -> Cell {
        Cell {
            metric,
            samples: vec![ratio],
            median: ratio,
            spread,
            ratio: metric.is_ratio().then_some(ratio),
            ratio_spread: metric.is_ratio().then_some(spread),
        }
    }

    #[test]
    fn slower_beyond_tolerance_and_spreads_is_a_regression() {
        let base = cell(Metric::Throughput, 0.8, 2.0);
        // 0.8 → 0.6 is 25% worse; allowed 10 + 2 + 3 = 15.
        let j = judge(
            "cross-node",
            &base,
            &cell(Metric::Throughput, 0.6, 3.0),
            10.0,
        );
        assert_eq!(j.verdict, Verdict::Regression, "{j:?}");
        assert!(j.reason.contains("worse by 25.0%"), "{}", j.reason);
        // 0.8 → 0.7 is 12.5% worse: within 15.
        let j = judge(
            "cross-node",
            &base,
            &cell(Metric::Throughput, 0.7, 3.0),
            10.0,
        );
        assert_eq!(j.verdict, Verdict::Pass, "{j:?}");
    }

    #[test]
    fn latency_regresses_upward_and_faster_is_no_regression() {
        let base = cell(Metric::LatencyP50, 1.5, 1.0);
        assert_eq!(
            judge(
                "same-node",
                &base,
                &cell(Metric::LatencyP50, 2.0, 1.0),
                10.0
            )
            .verdict,
            Verdict::Regression
        );
        assert_eq!(
            judge(
                "same-node",
                &base,
                &cell(Metric::LatencyP50, 1.0, 1.0),
                10.0
            )
            .verdict,
            Verdict::Pass
        );
    }

    #[test]
    fn noise_without_a_regression_is_inconclusive() {
        let base = cell(Metric::ConnectRate, 0.5, 60.0);
        let j = judge(
            "service",
            &base,
            &cell(Metric::ConnectRate, 0.5, 10.0),
            10.0,
        );
        assert_eq!(j.verdict, Verdict::Inconclusive, "{j:?}");
        assert!(j.reason.contains("too noisy"), "{}", j.reason);
    }

    #[test]
    fn udp_loss_is_judged_in_points() {
        let base = cell(Metric::UdpLoss, 0.2, 0.1);
        assert_eq!(
            judge("external", &base, &cell(Metric::UdpLoss, 1.0, 0.1), 10.0).verdict,
            Verdict::Pass
        );
        assert_eq!(
            judge("external", &base, &cell(Metric::UdpLoss, 5.0, 0.1), 10.0).verdict,
            Verdict::Regression
        );
    }

    #[test]
    fn the_worst_verdict_wins() {
        let j = |verdict| Judged::bare("p", Metric::Throughput, verdict, String::new());
        assert_eq!(
            overall(&[j(Verdict::Pass), j(Verdict::Inconclusive)]),
            Verdict::Inconclusive
        );
        assert_eq!(
            overall(&[j(Verdict::Inconclusive), j(Verdict::Regression)]),
            Verdict::Regression
        );
        assert_eq!(
            overall(&[j(Verdict::Regression), j(Verdict::Fail)]),
            Verdict::Fail
        );
        assert_eq!(overall(&[]), Verdict::Pass);
    }
}
