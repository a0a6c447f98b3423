//! The `cnilab` command line: one file per subcommand (its flags, examples
//! and what it does once parsed: all printing and exit codes are here),
//! shared flag groups in [`args`], what `lab` and `scenario` do before a lab
//! is built in `lab_prep`, and the one output convention from
//! [`crate::report`]: `-o table|json[|junit]`, `schemaVersion` in JSON, the
//! same exit codes everywhere.

pub mod args;
pub mod bench;
pub mod capture;
mod causes;
pub mod completions;
pub mod conform;
pub mod e2e;
pub mod e2e_vagrant;
pub mod lab;
mod lab_perf;
mod lab_prep;
pub mod lifecycle;
pub mod scenario;
pub mod schema;
pub mod soak;
pub mod sweep;
pub mod trace;
pub mod vm;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub use crate::report::Format;

pub use crate::report::CliResult;

#[derive(Parser)]
#[command(
    name = "cnilab",
    version,
    about = "Write, test and debug Kubernetes CNI plugins",
    after_help = concat!(
        "Examples:\n  \
        cnilab conform --plugin-dir /usr/lib/cni --config harness/examples/reference-bridge.conflist\n  \
        cnilab lab run --nodes 3 -o json\n\n",
        crate::exit_codes_help!()
    )
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    Bench(bench::Bench),
    Capture(capture::CaptureCmd),
    Conform(conform::Conform),
    Lifecycle(lifecycle::Lifecycle),
    Lab(lab::LabArgs),
    Scenario(scenario::Scenario),
    Schema(schema::Schema),
    Soak(soak::Soak),
    Sweep(sweep::Sweep),
    Trace(trace::TraceCmd),
    Vm(vm::Vm),
    Matrix(vm::Matrix),
    E2e(e2e::E2e),
    Completions(completions::Completions),
}

impl Cli {
    pub fn run(self) -> CliResult {
        match self.command {
            Cmd::Bench(c) => c.run(),
            Cmd::Capture(c) => c.run(),
            Cmd::Conform(c) => c.run(),
            Cmd::Lifecycle(c) => c.run(),
            Cmd::Lab(c) => c.run(),
            Cmd::Scenario(c) => c.run(),
            Cmd::Schema(c) => c.run(),
            Cmd::Soak(c) => c.run(),
            Cmd::Sweep(c) => c.run(),
            Cmd::Trace(c) => c.run(),
            Cmd::Vm(c) => c.run(),
            Cmd::Matrix(c) => c.run(),
            Cmd::E2e(c) => c.run(),
            Cmd::Completions(c) => c.run(),
        }
    }
}

/// Parses the command line, runs the command, maps errors to exit 2.
/// (clap's own usage errors exit 2 too.)
pub fn main() -> ExitCode {
    let result = Cli::parse().run();
    // A Ctrl-C being handled ends the process itself (exit 130) once the
    // lab is removed: an error caused by that removal must not exit first.
    crate::interrupt::hold_if_interrupted();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cnilab: {}", crate::report::human(&e.to_string()));
            ExitCode::from(crate::report::exit::USAGE)
        }
    }
}
