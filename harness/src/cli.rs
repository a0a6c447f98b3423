//! What each `cnilab` subcommand does once its arguments are parsed.

use crate::bench::{self, BenchOptions};
use crate::netns;
use std::process::ExitCode;

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

pub fn sweep() -> CliResult {
    netns::require_root()?;
    let removed = netns::sweep(netns::PREFIX)?;
    if removed.is_empty() {
        println!(
            "nothing to sweep: no {}* namespace of a dead process",
            netns::PREFIX
        );
    }
    for name in removed {
        println!("removed netns {name}");
    }
    Ok(ExitCode::SUCCESS)
}
