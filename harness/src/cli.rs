//! What each `cnilab` subcommand does once its arguments are parsed.

use crate::bench::{self, BenchOptions};
use crate::conform::{self, ConformOptions, Progress};
use crate::netns;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;

/// Output format of `cnilab conform`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

pub fn conform(opts: &ConformOptions, format: Format, junit: Option<&Path>) -> CliResult {
    netns::require_root()?;
    let tty = std::io::stderr().is_terminal();
    let mut progress = |p: Progress<'_>| {
        let mut err = std::io::stderr();
        match p.elapsed {
            None if tty => {
                let _ = write!(err, "\r\x1b[2K[{}/{}] {} …", p.done + 1, p.total, p.group);
            }
            None => {}
            Some(t) => {
                if tty {
                    let _ = write!(err, "\r\x1b[2K");
                }
                let _ = writeln!(
                    err,
                    "[{}/{}] {} ({:.1} s)",
                    p.done,
                    p.total,
                    p.group,
                    t.as_secs_f64()
                );
            }
        }
        let _ = err.flush();
    };
    let report = conform::run(opts, &mut progress)?;
    match format {
        Format::Table => print!("{}", report.table()),
        Format::Json => println!("{}", report.json()),
    }
    if let Some(path) = junit {
        std::fs::write(path, report.junit())
            .map_err(|e| format!("cannot write JUnit XML to {}: {e}", path.display()))?;
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A command failure, printed by `main` as `cnilab: <message>`.
pub type CliResult = Result<ExitCode, Box<dyn std::error::Error>>;

pub fn bench(opts: &BenchOptions, json: bool) -> CliResult {
    netns::require_root()?;
    let report = bench::run(opts)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `cnilab soak`: exit 0 iff no finding (leak, duplicate address, failed ADD, ...).
pub fn soak(opts: &crate::soak::SoakOptions, format: Format, log: Option<&Path>) -> CliResult {
    netns::require_root()?;
    eprintln!(
        "cnilab soak: seed {} (replay with --seed {})",
        opts.seed, opts.seed
    );
    let report = crate::soak::run(opts)?;
    match format {
        Format::Table => print!("{}", report.table()),
        Format::Json => println!("{}", report.json()),
    }
    if let Some(path) = log {
        std::fs::write(path, report.log_jsonl())
            .map_err(|e| format!("cannot write the operations log to {}: {e}", path.display()))?;
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn sweep() -> CliResult {
    netns::require_root()?;
    let swept = crate::lab::sweep::sweep(
        std::path::Path::new(crate::lab::sweep::RUN_ROOT),
        netns::PREFIX,
    )?;
    let scratch = crate::util::sweep_scratch().map_err(|e| {
        format!(
            "cannot sweep scratch directories in {}: {e}",
            std::env::temp_dir().display()
        )
    })?;
    if swept.agents.is_empty()
        && swept.namespaces.is_empty()
        && swept.dirs.is_empty()
        && scratch.is_empty()
    {
        println!(
            "nothing to sweep: no {}* namespace, run directory, agent or scratch directory of a dead process",
            netns::PREFIX
        );
    }
    for (pid, pidfile) in &swept.agents {
        println!("stopped agent {pid} (proved by {})", pidfile.display());
    }
    for name in &swept.namespaces {
        println!("removed netns {name}");
    }
    for dir in &swept.dirs {
        println!("removed run directory {}", dir.display());
    }
    for path in scratch {
        println!("removed scratch directory {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn lifecycle(plugin_dir: &str, config: &std::path::Path, ifname: &str) -> CliResult {
    use crate::lifecycle::{Lab, Lifecycle};
    use crate::runtime::{NetworkConfig, Runtime};
    netns::require_root()?;
    let mut net = NetworkConfig::load(config)?;
    let store = crate::util::ScratchDir::new("ipam")?;
    net.set_ipam_data_dir(store.path());
    let host = netns::Netns::with_label("host")?;
    host.set_lo_up()?;
    let runtime = Runtime::new(plugin_dir).in_netns(&host)?;
    let lab = Lab::new(&runtime, &host, &net);
    let findings = Lifecycle::new(&lab).ifname(ifname).run()?;
    for f in &findings {
        println!("{:<4} {:<3} {}", f.verdict, f.id, f.detail);
        if f.verdict == crate::verdict::Verdict::Fail {
            for e in &f.executions {
                println!("       $ {}", e.shell_line());
                println!(
                    "       {} stdout={:?} stderr={:?}",
                    e.status_text(),
                    e.stdout.trim(),
                    e.stderr.trim()
                );
            }
        }
    }
    Ok(if crate::lifecycle::all_ok(&findings) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
