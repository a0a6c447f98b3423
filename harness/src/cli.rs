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
