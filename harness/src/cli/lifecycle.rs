//! `cnilab lifecycle`.

use super::args::{OutputArgs, PluginArgs};
use super::CliResult;
use crate::lifecycle::{self, Lifecycle as Steps, Target};
use crate::netns;
use crate::report::{self, Format};
use crate::runtime::{NetworkConfig, Runtime};
use crate::verdict::{Finding, Verdict};

/// Run one pod's full lifecycle (ADD, verify, CHECK, tamper, DEL, cleanup, DEL variants).
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab lifecycle --plugin-dir /usr/lib/cni --config harness/examples/reference-bridge.conflist\n  \
    cnilab lifecycle --plugin-dir target/release --config harness/examples/cnilab-bridge.conflist -o json\n\n",
    crate::exit_codes_help!()))]
pub struct Lifecycle {
    #[command(flatten)]
    pub plugin: PluginArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// One ID's verdict: the worst of its findings, with every detail.
#[derive(serde::Serialize)]
struct IdVerdict {
    id: &'static str,
    verdict: Verdict,
    details: Vec<String>,
}

/// Steps that were not run, and why.
#[derive(serde::Serialize)]
struct NotRun {
    ids: Vec<&'static str>,
    why: String,
}

#[derive(serde::Serialize)]
struct Summary {
    ids: usize,
    passed: usize,
    failed: usize,
    warnings: usize,
    skipped: usize,
    not_run: usize,
}

#[derive(serde::Serialize)]
struct LifecycleReport<'a> {
    plugin_dir: &'a str,
    config: String,
    plugin: &'a str,
    network: &'a str,
    config_version: String,
    ifname: &'a str,
    passed: bool,
    checks: Vec<IdVerdict>,
    not_run: Vec<NotRun>,
    summary: Summary,
    findings: &'a [Finding],
}

/// One verdict per ID (the worst of its findings), in the order the
/// lifecycle first reached each ID.
fn per_id(findings: &[Finding]) -> Vec<IdVerdict> {
    let mut out: Vec<IdVerdict> = Vec::new();
    for f in findings {
        let detail = format!("{}: {}", f.verdict, f.detail);
        match out.iter_mut().find(|v| v.id == f.id) {
            Some(v) => {
                v.verdict = v.verdict.max(f.verdict);
                v.details.push(detail);
            }
            None => out.push(IdVerdict {
                id: f.id,
                verdict: f.verdict,
                details: vec![detail],
            }),
        }
    }
    for v in &mut out {
        v.details.sort_by_key(|d| {
            std::cmp::Reverse(
                [Verdict::Pass, Verdict::Skip, Verdict::Warn, Verdict::Fail]
                    .iter()
                    .position(|x| d.starts_with(x.as_str())),
            )
        });
    }
    out
}

/// The steps the lifecycle leaves out for this config, and why.
fn not_run(net: &NetworkConfig) -> Vec<NotRun> {
    let check = vec!["K2", "K4", "K5"];
    if net.version < cnilab_net::spec::Version::V0_4_0 {
        vec![NotRun {
            ids: check,
            why: format!(
                "CHECK and the tamper steps: CHECK exists from cniVersion 0.4.0; the config's is {}",
                net.version
            ),
        }]
    } else if net.disable_check {
        vec![NotRun {
            ids: check,
            why: "CHECK and the tamper steps: the config sets \"disableCheck\": true".into(),
        }]
    } else {
        Vec::new()
    }
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
        let target = Target::new(&runtime, &host, &net);
        let findings = Steps::new(&target).ifname(&p.ifname).run()?;
        let passed = lifecycle::all_ok(&findings);
        let checks = per_id(&findings);
        let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
        let not_run = not_run(&net);
        let r = LifecycleReport {
            plugin_dir: &p.plugin_dir,
            config: p.config.display().to_string(),
            plugin: net.plugin_type(0),
            network: &net.name,
            config_version: net.version.to_string(),
            ifname: &p.ifname,
            passed,
            summary: Summary {
                ids: checks.len(),
                passed: count(Verdict::Pass),
                failed: count(Verdict::Fail),
                warnings: count(Verdict::Warn),
                skipped: count(Verdict::Skip),
                not_run: not_run.iter().map(|n| n.ids.len()).sum(),
            },
            checks,
            not_run,
            findings: &findings,
        };
        match self.output.output {
            Format::Json | Format::Junit => println!("{}", report::json("LifecycleReport", &r)),
            Format::Table => print_table(&r),
        }
        Ok(report::verdict(passed))
    }
}

fn print_table(r: &LifecycleReport<'_>) {
    use std::fmt::Write as _;
    // Plugin text (details, stdout, stderr) reaches the terminal only
    // through the one escaper.
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cnilab lifecycle: plugin {} from {} · network {} ({}) · ifname {}",
        r.plugin, r.plugin_dir, r.network, r.config_version, r.ifname
    );
    let _ = writeln!(out);
    for c in &r.checks {
        let first = c.details.first().map(String::as_str).unwrap_or("");
        let note = first.split_once(": ").map(|(_, n)| n).unwrap_or(first);
        let _ = writeln!(out, "{:<4} {:<4} {}", c.id, c.verdict, note);
        for d in c.details.iter().skip(1) {
            let _ = writeln!(out, "          {d}");
        }
        if c.verdict == Verdict::Fail {
            let execs = r
                .findings
                .iter()
                .filter(|f| f.id == c.id && f.verdict == Verdict::Fail)
                .flat_map(|f| &f.executions);
            for e in execs {
                let _ = writeln!(out, "          $ {}", e.shell_line());
                let _ = writeln!(
                    out,
                    "          {} stdout={:?} stderr={:?}",
                    e.status_text(),
                    e.stdout.trim(),
                    e.stderr.trim()
                );
            }
        }
    }
    for n in &r.not_run {
        let _ = writeln!(out, "not run: {} — {}", n.ids.join(", "), n.why);
    }
    let s = &r.summary;
    let _ = writeln!(
        out,
        "\n{} IDs: {} passed, {} failed, {} warnings, {} skipped; {} not run",
        s.ids, s.passed, s.failed, s.warnings, s.skipped, s.not_run
    );
    report::print_human(&out);
}
