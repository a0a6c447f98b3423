//! `cnilab lab perf`: the flags, the labs measured (a standing one, or
//! throwaway ones built for the run: ours and `--vs-plugin-dir`'s), and
//! the report with its exit code.

use super::lab_prep::{self, Prepared, TopologyFlags};
use super::CliResult;
use crate::lab::base::UpOptions;
use crate::lab::built::Lab;
use crate::perf::report::PerfReport;
use crate::perf::{Options, Subject};
use crate::report::progress::Progress;
use crate::report::{self, Rendered};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// How `lab perf` measures and judges.
#[derive(clap::Args)]
pub struct PerfFlags {
    /// Measure this standing lab (`lab up --name`) instead of building one.
    #[arg(long)]
    pub name: Option<String>,
    /// Rounds: every path is measured once a round, rounds interleaved
    /// across paths and labs; figures are medians over the rounds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=100))]
    pub rounds: u64,
    /// Each measurement's window in milliseconds (four a path a round).
    #[arg(long, value_name = "MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(20..=10_000))]
    pub duration: u64,
    /// The UDP stream's rate in Mbit/s (loss is measured at this rate).
    #[arg(long, value_name = "MBIT", default_value_t = 500.0)]
    pub udp_rate: f64,
    /// Also measure a lab of this plugin directory, interleaved, and print
    /// ours against theirs (a throwaway lab of the same topology).
    #[arg(long, value_name = "DIR", conflicts_with = "name")]
    pub vs_plugin_dir: Option<String>,
    /// The config template of `--vs-plugin-dir`'s lab (lab/configs/).
    #[arg(long, value_name = "TEMPLATE", requires = "vs_plugin_dir")]
    pub vs_config: Option<PathBuf>,
    /// Write the result (JSON, kind PerfReport) to this file.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Judge against a saved result: a path and metric worse by more than
    /// the tolerance plus both runs' spreads FAILs, naming both.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// Tolerance in percent of each path's ratio to the underlay.
    #[arg(long, value_name = "PCT", default_value_t = 10.0)]
    pub tolerance: f64,
    #[command(flatten)]
    pub output: super::args::CheckOutputArgs,
    /// Also write JUnit XML to this file.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Also write an HTML page with a chart per metric to this file.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
}

/// A label for a lab's plugin: its config template's name when one was
/// given, `cnilab-bridge` for the bundled plugin, else the directory.
fn label(plugin_dir: &str, config: Option<&Path>) -> String {
    if let Some(stem) = config.and_then(|c| c.file_name()) {
        return stem.to_string_lossy().trim_end_matches(".tmpl").to_string();
    }
    let bundled = plugin_dir
        .split(':')
        .any(|d| Path::new(d).join("cnilab-bridge").is_file());
    if bundled {
        "cnilab-bridge".into()
    } else {
        plugin_dir.to_string()
    }
}

/// Builds a throwaway lab (with a Service: the service path needs one).
fn build(flags: &TopologyFlags) -> Result<Lab, Box<dyn std::error::Error>> {
    let Prepared { recipe, host } = lab_prep::prepare(flags, false)?;
    let opts = UpOptions {
        plugin_dir: flags.plugin_dir.clone(),
        persistent: None,
        run_dir: crate::lab::scratch_run_dir(),
        runtime: flags.runtime,
    };
    let mut lab = Lab::build(recipe, opts)?;
    crate::lab::pin_if_needed(&mut lab, &host)?;
    Ok(lab)
}

/// `cnilab lab perf`.
pub fn run(mut topology: TopologyFlags, flags: &PerfFlags) -> CliResult {
    crate::netns::require_root()?;
    let baseline = flags
        .baseline
        .as_deref()
        .map(PerfReport::load)
        .transpose()?;
    if topology.nodes.is_some_and(|n| n < 2) {
        return Err("lab perf needs 2 nodes or more (--nodes 2): its baseline is the underlay between two nodes".into());
    }
    if !(flags.udp_rate > 0.0 && flags.udp_rate <= 100_000.0) {
        return Err("--udp-rate: a rate in Mbit/s above 0 and up to 100000".into());
    }
    let options = Options {
        rounds: flags.rounds as usize,
        window_ms: flags.duration,
        udp_mbit: flags.udp_rate,
    };
    let started = Instant::now();
    let matrices = match &flags.name {
        Some(name) => {
            if topology.nodes.is_some()
                || topology.topology.is_some()
                || topology.plugin_dir.is_some()
            {
                return Err("--name measures a standing lab as it is: drop --nodes, --topology and --plugin-dir".into());
            }
            let lab = crate::lab::state::adopt(name)?;
            let subject = Subject {
                label: label(&lab.plugin_dir, None),
                lab: &lab,
            };
            crate::perf::measure(&[subject], &options, Progress::stderr())?
        }
        None => {
            topology.service = true;
            throwaway(&topology, flags, &options)?
        }
    };
    let judged = match (&baseline, &flags.baseline) {
        (Some(b), Some(file)) => {
            let ours = matrices.first().ok_or("no lab was measured")?;
            let base = b
                .labs
                .first()
                .ok_or("--baseline: the saved result measured no lab")?;
            Some((
                file.display().to_string(),
                crate::perf::compare::against(base, ours, flags.tolerance),
            ))
        }
        _ => None,
    };
    let rep = PerfReport::new(
        options,
        matrices,
        judged,
        started.elapsed().as_millis() as u64,
    );
    emit(&rep, flags)?;
    Ok(ExitCode::from(rep.exit_code()))
}

/// Ours, and `--vs-plugin-dir`'s when asked, each built, measured
/// interleaved, and taken down (also on an error in between).
fn throwaway(
    topology: &TopologyFlags,
    flags: &PerfFlags,
    options: &Options,
) -> Result<Vec<crate::perf::Matrix>, Box<dyn std::error::Error>> {
    crate::lab::cleanup_on_interrupt(None);
    let ours = build(topology)?;
    let plugin_dir = ours.plugin_dir.clone();
    let theirs = match &flags.vs_plugin_dir {
        Some(dir) => {
            let mut other = topology.clone();
            other.plugin_dir = Some(dir.clone());
            other.config = flags.vs_config.clone();
            match build(&other) {
                Ok(lab) => Some((lab, label(dir, flags.vs_config.as_deref()))),
                Err(e) => {
                    ours.down();
                    return Err(e);
                }
            }
        }
        None => None,
    };
    let mut subjects = vec![Subject {
        label: label(&plugin_dir, topology.config.as_deref()),
        lab: &ours,
    }];
    if let Some((lab, l)) = &theirs {
        subjects.push(Subject {
            label: l.clone(),
            lab,
        });
    }
    let measured = crate::perf::measure(&subjects, options, Progress::stderr());
    drop(subjects);
    ours.down();
    if let Some((lab, _)) = theirs {
        lab.down();
    }
    Ok(measured?)
}

fn emit(rep: &PerfReport, flags: &PerfFlags) -> Result<(), Box<dyn std::error::Error>> {
    report::emit(
        rep,
        flags.output.output,
        flags.junit.as_deref(),
        flags.report.as_deref(),
    )?;
    if let Some(path) = &flags.save {
        report::write_file(path, &rep.json())?;
        eprintln!(
            "cnilab: result saved to {} (--baseline {0} judges a later run against it)",
            path.display()
        );
    }
    Ok(())
}
