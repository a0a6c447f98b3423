//! `cnilab lab perf`: how fast each path of a lab is, as a ratio to the
//! underlay between its nodes measured in the same rounds, so that a busy
//! neighbour moves both. Every path of every lab is measured once per
//! round, rounds interleaved (lab A's paths, lab B's, then A's again), and
//! each figure comes with its spread over the rounds.
//!
//! The measurements are [`load`]'s; the paths are [`paths`]'; a saved
//! result is judged against a new one in [`compare`]; [`report`] prints.

pub mod compare;
pub mod load;
pub mod paths;
pub mod report;

use crate::lab::built::Lab;
use crate::report::progress::Progress;
use paths::{Path, Skipped, BASELINE};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// What is measured on each path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// TCP stream, bits per second.
    Throughput,
    /// TCP request/response round trip, microseconds.
    LatencyP50,
    LatencyP90,
    LatencyP99,
    /// TCP connect/request/close, connections per second.
    ConnectRate,
    /// UDP stream at a fixed rate, percent of datagrams lost.
    UdpLoss,
}

impl Metric {
    pub const ALL: [Metric; 6] = [
        Metric::Throughput,
        Metric::LatencyP50,
        Metric::LatencyP90,
        Metric::LatencyP99,
        Metric::ConnectRate,
        Metric::UdpLoss,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::Throughput => "throughput",
            Metric::LatencyP50 => "latency-p50",
            Metric::LatencyP90 => "latency-p90",
            Metric::LatencyP99 => "latency-p99",
            Metric::ConnectRate => "connect-rate",
            Metric::UdpLoss => "udp-loss",
        }
    }

    /// The unit of [`Metric::display`].
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Throughput => "Gbit/s",
            Metric::LatencyP50 | Metric::LatencyP90 | Metric::LatencyP99 => "µs",
            Metric::ConnectRate => "conn/s",
            Metric::UdpLoss => "% lost",
        }
    }

    /// A figure in [`Metric::unit`].
    pub fn display(self, v: f64) -> String {
        match self {
            Metric::Throughput => format!("{:.2}", v / 1e9),
            Metric::UdpLoss => format!("{v:.2}"),
            _ => format!("{v:.0}"),
        }
    }

    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::Throughput | Metric::ConnectRate)
    }

    /// Whether a comparison judges it. p99 latency is reported, not
    /// judged: over a 100 ms window on a busy 2-core machine it moved by
    /// half again and more between runs with nothing changed, where p50
    /// and p90 stayed within their spreads (docs/src/perf.md).
    pub fn judged(self) -> bool {
        self != Metric::LatencyP99
    }

    /// Whether the metric is judged as a ratio to the baseline (UDP loss
    /// is judged in percentage points: the baseline's is about 0).
    pub fn is_ratio(self) -> bool {
        self != Metric::UdpLoss
    }
}

/// How long and how often.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Options {
    pub rounds: usize,
    /// Each measurement's window, in milliseconds.
    pub window_ms: u64,
    /// The UDP stream's rate, in Mbit/s.
    pub udp_mbit: f64,
}

impl Options {
    fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }
}

/// One metric of one path over the rounds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    pub metric: Metric,
    /// One figure per round, in the metric's base unit (bit/s, µs,
    /// conn/s, %).
    pub samples: Vec<f64>,
    pub median: f64,
    /// Median absolute deviation: in percent of the median, or for
    /// udp-loss in percentage points.
    pub spread: f64,
    /// The median over the rounds of this path's figure divided by the
    /// baseline's of the same round (none for udp-loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// The ratio's median absolute deviation, in percent of the ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_spread: Option<f64>,
}

/// One path's cells, or why it could not be measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PathResult {
    pub path: String,
    pub from: String,
    pub to: String,
    pub cells: Vec<Cell>,
    /// The measurement that failed (the path carries no traffic: a
    /// connectivity failure, for `lab check` to explain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PathResult {
    pub fn cell(&self, m: Metric) -> Option<&Cell> {
        self.cells.iter().find(|c| c.metric == m)
    }
}

/// One lab's matrix.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Matrix {
    /// What was measured: `cnilab-bridge`, or the plugin directory's name.
    pub label: String,
    pub plugin_dir: String,
    pub paths: Vec<PathResult>,
    #[serde(default)]
    pub skipped: Vec<Skipped>,
}

impl Matrix {
    pub fn path(&self, name: &str) -> Option<&PathResult> {
        self.paths.iter().find(|p| p.path == name)
    }
}

/// One lab to measure.
pub struct Subject<'a> {
    pub label: String,
    pub lab: &'a Lab,
}

/// A round's figures of one path, by [`Metric::ALL`]'s order; `Err` once a
/// measurement failed.
type Figures = Result<[f64; 6], String>;

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// The median absolute deviation of `v`, in percent of its median when
/// `relative` (0 for a zero median).
pub fn spread(v: &[f64], relative: bool) -> f64 {
    let med = median(v);
    let dev: Vec<f64> = v.iter().map(|x| (x - med).abs()).collect();
    let mad = median(&dev);
    match (relative, med == 0.0) {
        (false, _) => mad,
        (true, true) => 0.0,
        (true, false) => 100.0 * mad / med.abs(),
    }
}

/// The `q` quantile (0..=1) of sorted round trips, in microseconds.
fn quantile_us(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

/// The four measurements, in the order of a round.
#[derive(Clone, Copy)]
enum Load {
    Stream,
    RequestResponse,
    Connect,
    Udp,
}

const LOADS: [Load; 4] = [
    Load::Stream,
    Load::RequestResponse,
    Load::Connect,
    Load::Udp,
];

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Stream => "TCP stream",
            Load::RequestResponse => "TCP request/response",
            Load::Connect => "TCP connect/request/close",
            Load::Udp => "UDP stream",
        }
    }
}

/// One measurement of one path into its slots of `f` (by
/// [`Metric::ALL`]'s order).
fn measure_one(p: &Path, load: Load, opts: &Options, f: &mut [f64; 6]) -> Result<(), String> {
    let w = opts.window();
    let fail = |e: std::io::Error| format!("{} to {}: {e}", load.name(), p.dst);
    match load {
        Load::Stream => f[0] = load::stream(&p.src, p.dst, w).map_err(fail)?,
        Load::RequestResponse => {
            let mut rtts = load::request_response(&p.src, p.dst, w).map_err(fail)?;
            rtts.sort();
            f[1] = quantile_us(&rtts, 0.5);
            f[2] = quantile_us(&rtts, 0.9);
            f[3] = quantile_us(&rtts, 0.99);
        }
        Load::Connect => f[4] = load::connect_rate(&p.src, p.dst, w).map_err(fail)?,
        Load::Udp => {
            f[5] = load::udp(&p.src, p.dst, opts.udp_mbit * 1e6, w)
                .map_err(fail)?
                .loss_percent()
        }
    }
    Ok(())
}

/// The inode of a namespace handle: one server per namespace.
fn inode(f: &File) -> Option<(u64, u64)> {
    f.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// Starts one server in every namespace `paths` lead to.
fn servers(paths: &[Path]) -> Result<Vec<load::Server>, String> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for p in paths {
        let key = inode(&p.server);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let s = load::Server::start(&p.server)
            .map_err(|e| format!("a load server for {} on port {}: {e}", p.to, load::PORT))?;
        out.push(s);
    }
    Ok(out)
}

/// Measures every path of every subject, `opts.rounds` times, interleaved.
pub fn measure(
    subjects: &[Subject],
    opts: &Options,
    progress: Progress,
) -> Result<Vec<Matrix>, String> {
    let mut labs = Vec::new();
    for s in subjects {
        let (paths, skipped) = paths::of(s.lab)?;
        let servers = servers(&paths)?;
        labs.push((paths, skipped, servers));
    }
    // figures[lab][path][round]
    let mut figures: Vec<Vec<Vec<Figures>>> = labs
        .iter()
        .map(|(p, _, _)| p.iter().map(|_| Vec::new()).collect())
        .collect();
    // A round measures one load on every path of every lab before the
    // next load: the paths' figures and their baseline's are taken within
    // a second of each other, so a slow phase of the machine moves them
    // together.
    for round in 0..opts.rounds {
        for lab in figures.iter_mut() {
            for path in lab.iter_mut() {
                path.push(Ok([f64::NAN; 6]));
            }
        }
        for load in LOADS {
            for (li, (paths, _, _)) in labs.iter().enumerate() {
                for (pi, p) in paths.iter().enumerate() {
                    progress.status(&format!(
                        "⏱  round {}/{} {} {}: {} ({} → {})",
                        round + 1,
                        opts.rounds,
                        subjects[li].label,
                        p.name,
                        load.name(),
                        p.from,
                        p.to
                    ));
                    let broke = figures[li][pi][..round].iter().any(Result::is_err);
                    let slot = &mut figures[li][pi][round];
                    if broke {
                        *slot = Err("failed in an earlier round".into());
                    }
                    if let Ok(f) = slot {
                        if let Err(e) = measure_one(p, load, opts, f) {
                            *slot = Err(e);
                        }
                    }
                }
            }
        }
    }
    progress.clear();
    Ok(subjects
        .iter()
        .zip(labs)
        .zip(figures)
        .map(|((s, (paths, skipped, _servers)), f)| matrix(s, &paths, skipped, &f))
        .collect())
}

/// One lab's matrix from its figures.
fn matrix(s: &Subject, paths: &[Path], skipped: Vec<Skipped>, figures: &[Vec<Figures>]) -> Matrix {
    let base = paths.iter().position(|p| p.name == BASELINE);
    let base_rounds: Option<&Vec<Figures>> = base.map(|b| &figures[b]);
    let results = paths
        .iter()
        .zip(figures)
        .map(|(p, rounds)| path_result(p, rounds, base_rounds))
        .collect();
    Matrix {
        label: s.label.clone(),
        plugin_dir: s.lab.plugin_dir.clone(),
        paths: results,
        skipped,
    }
}

fn path_result(p: &Path, rounds: &[Figures], base: Option<&Vec<Figures>>) -> PathResult {
    let mut result = PathResult {
        path: p.name.to_string(),
        from: p.from.clone(),
        to: p.to.clone(),
        cells: Vec::new(),
        error: None,
    };
    let ok: Vec<&[f64; 6]> = match rounds
        .iter()
        .map(Result::as_ref)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(v) => v,
        Err(e) => {
            result.error = Some(e.to_string());
            return result;
        }
    };
    for (mi, metric) in Metric::ALL.iter().enumerate() {
        let samples: Vec<f64> = ok.iter().map(|r| r[mi]).collect();
        let ratios: Option<Vec<f64>> = base.filter(|_| metric.is_ratio()).and_then(|b| {
            b.iter()
                .zip(&ok)
                .map(|(br, r)| br.as_ref().ok().map(|br| r[mi] / br[mi]))
                .collect()
        });
        result.cells.push(Cell {
            metric: *metric,
            median: median(&samples),
            spread: spread(&samples, metric.is_ratio()),
            ratio: ratios.as_deref().map(median),
            ratio_spread: ratios.as_deref().map(|r| spread(r, true)),
            samples,
        });
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        // deviations from 10: 0, 1, 1, 0, 5 → median 1 → 10 %.
        assert!((spread(&[10.0, 9.0, 11.0, 10.0, 15.0], true) - 10.0).abs() < 1e-9);
        assert!((spread(&[0.0, 0.5, 2.0], false) - 0.5).abs() < 1e-9);
        assert_eq!(spread(&[0.0, 0.0], true), 0.0);
    }

    #[test]
    fn quantiles_of_round_trips() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert!((quantile_us(&v, 0.5) - 51.0).abs() < 1e-6);
        assert!((quantile_us(&v, 0.99) - 99.0).abs() < 1e-6);
        assert!(quantile_us(&[], 0.5).is_nan());
    }
}
