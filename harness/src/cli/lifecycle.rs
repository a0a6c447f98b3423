//! `cnilab lifecycle`.

use super::args::{OutputArgs, PluginArgs};
use super::CliResult;
use crate::lifecycle::{self, Lab, Lifecycle as Steps};
use crate::netns;
use crate::report::{self, Format};
use crate::runtime::{NetworkConfig, Runtime};
use crate::verdict::{Finding, Verdict};

/// Run one pod's full lifecycle (ADD, verify, CHECK, tamper, DEL, cleanup, DEL variants).
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab lifecycle --plugin-dir /usr/lib/cni --config harness/examples/reference-bridge.conflist\n  \
    cnilab lifecycle --plugin-dir target/release --config lab/bridge.conflist -o json\n\n",
    crate::exit_codes_help!()))]
pub struct Lifecycle {
    #[command(flatten)]
    pub plugin: PluginArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(serde::Serialize)]
struct LifecycleReport<'a> {
    plugin_dir: &'a str,
    config: String,
    ifname: &'a str,
    passed: bool,
    findings: &'a [Finding],
}

impl Lifecycle {
    pub fn run(self) -> CliResult {
        netns::require_root()?;
        let p = &self.plugin;
        let mut net = NetworkConfig::load(&p.config)?;
        let store = crate::util::ScratchDir::new("ipam")?;
        net.set_ipam_data_dir(store.path());
        let host = netns::Netns::with_label("host")?;
        host.set_lo_up()?;
        let runtime = Runtime::new(&p.plugin_dir)
            .with_timeout(p.timeout)
            .in_netns(&host)?;
        let lab = Lab::new(&runtime, &host, &net);
        let findings = Steps::new(&lab).ifname(&p.ifname).run()?;
        let passed = lifecycle::all_ok(&findings);
        match self.output.output {
            Format::Json | Format::Junit => {
                let r = LifecycleReport {
                    plugin_dir: &p.plugin_dir,
                    config: p.config.display().to_string(),
                    ifname: &p.ifname,
                    passed,
                    findings: &findings,
                };
                println!("{}", report::json("LifecycleReport", &r));
            }
            Format::Table => print_table(&findings),
        }
        Ok(report::verdict(passed))
    }
}

fn print_table(findings: &[Finding]) {
    use std::fmt::Write as _;
    let mut out = String::new();
    for f in findings {
        let _ = writeln!(out, "{:<4} {:<3} {}", f.verdict, f.id, f.detail);
        if f.verdict == Verdict::Fail {
            for e in &f.executions {
                let _ = writeln!(out, "       $ {}", e.shell_line());
                let _ = writeln!(
                    out,
                    "       {} stdout={:?} stderr={:?}",
                    e.status_text(),
                    e.stdout.trim(),
                    e.stderr.trim()
                );
            }
        }
    }
    report::print_human(&out);
}
