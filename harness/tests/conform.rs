//! The conformance suite against real plugins: the reference bridge passes
//! with warnings only, cnilab-bridge passes (built-in and host-local IPAM),
//! Debian's other plugins get no false FAIL, each deliberately broken plugin
//! in `tests/broken-plugins/` fails the rule it breaks (the own-store IPAM
//! plugins exactly those rules and no other), and an environment the config
//! cannot run in is one environment error.

mod common;

use cnilab_harness::conform::{self, ConformOptions, ConformReport};
use cnilab_harness::report::Rendered;
use cnilab_harness::verdict::Verdict;
use common::*;
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn run(plugin_dir: &str, config: &Path, only: Option<&[&str]>) -> ConformReport {
    run_with(plugin_dir, config, only, None)
}

fn run_with(
    plugin_dir: &str,
    config: &Path,
    only: Option<&[&str]>,
    host_setup: Option<PathBuf>,
) -> ConformReport {
    require_root();
    let _host = host_untouched();
    let opts = ConformOptions {
        plugin_dir: plugin_dir.to_string(),
        config: config.to_path_buf(),
        ifname: "eth0".into(),
        only: only.map(|ids| ids.iter().map(|s| s.to_string()).collect()),
        timeout: Duration::from_secs(60),
        corpus: Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus")),
        host_setup,
        jobs: conform::DEFAULT_JOBS,
        seed: None,
    };
    conform::run(&opts, &mut |_| {}).expect("the suite runs")
}

fn verdict(report: &ConformReport, id: &str) -> Verdict {
    report
        .checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("{id} missing from the report"))
        .verdict
}

/// The reference example config with `type` replaced by a broken plugin.
fn broken_config(dir: &Path, plugin: &str) -> PathBuf {
    let text = std::fs::read_to_string(examples_dir().join("reference-bridge.conflist"))
        .expect("example config");
    let text = text.replace("\"type\": \"bridge\"", &format!("\"type\": \"{plugin}\""));
    assert!(
        text.contains(plugin),
        "example config must name the bridge type"
    );
    let path = dir.join(format!("{plugin}.conflist"));
    std::fs::write(&path, text).expect("write config");
    path
}

#[test]
fn reference_bridge_passes_with_warnings_only() {
    require_reference();
    let report = run(
        REFERENCE_DIR,
        &examples_dir().join("reference-bridge.conflist"),
        None,
    );
    let failed: Vec<String> = report
        .checks
        .iter()
        .filter(|c| c.verdict == Verdict::Fail)
        .map(|c| format!("{} {:?}", c.id, c.details))
        .collect();
    assert!(failed.is_empty(), "{}", report.table());
    assert!(report.passed());
    // The known deviations show up as warnings, not silently as passes.
    assert_eq!(verdict(&report, "V2"), Verdict::Warn);
    assert_eq!(verdict(&report, "A1"), Verdict::Warn);
    // 1.0.0 only: STATUS and GC are skipped because VERSION says so.
    assert_eq!(verdict(&report, "S1"), Verdict::Skip);
    assert_eq!(verdict(&report, "G2"), Verdict::Skip);
    assert!(report.summary.passed >= 25, "{}", report.summary_line());
    let junit = report.junit();
    assert!(junit.contains("<testsuites") && junit.ends_with("</testsuites>\n"));
    assert_eq!(junit.matches("<testcase ").count(), report.checks.len());
}

#[test]
fn reference_chain_carries_prev_result() {
    require_reference();
    let report = run(
        REFERENCE_DIR,
        &examples_dir().join("reference-bridge-chain.conflist"),
        Some(&["A8", "K5"]),
    );
    assert_eq!(report.checks.len(), 2);
    assert_eq!(verdict(&report, "A8"), Verdict::Pass, "{}", report.table());
    assert_eq!(verdict(&report, "K5"), Verdict::Pass, "{}", report.table());
}

/// cnilab-bridge from this workspace's target dir (built by `cargo test --workspace`).
fn cnilab_bridge_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    // target/<profile>/deps/conform-xxxx -> target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let bin = profile_dir.join("cnilab-bridge");
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `cargo build -p cnilab-plugin` (cargo test --workspace does)",
        bin.display()
    );
    let dir = tempfile::Builder::new()
        .prefix("cnilab-bridge-dir")
        .tempdir()
        .expect("tmp")
        .keep();
    std::os::unix::fs::symlink(&bin, dir.join("cnilab-bridge")).expect("symlink");
    dir
}

#[test]
fn cnilab_bridge_passes() {
    let dir = cnilab_bridge_dir();
    let report = run(
        &dir.display().to_string(),
        &examples_dir().join("cnilab-bridge.conflist"),
        None,
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(report.passed(), "{}", report.table());
    assert_eq!(
        verdict(&report, "G2"),
        Verdict::Pass,
        "1.1.0 GC must be exercised"
    );
    // Skips are not passes: built-in IPAM skips A9, K6, S3, G3, G4 (and a
    // single plugin A8); everything else must pass with evidence.
    assert!(report.summary.passed >= 43, "{}", report.summary_line());
    assert!(report.summary.skipped <= 6, "{}", report.summary_line());
}

#[rstest]
#[case::del_does_nothing("no-del", &["D7", "D4", "D5"])]
#[case::log_line_on_stdout("garbage-stdout", &["A1"])]
#[case::result_version("wrong-result-version", &["A2"])]
#[case::bad_env_succeeds("ok-on-bad-env", &["E1", "E2"])]
#[case::veth_left_on_del("leaky-del", &["D7"])]
#[case::no_sandbox("no-sandbox", &["A3"])]
#[case::check_always_ok("check-always-ok", &["K3", "K4"])]
#[case::existing_ifname("ignores-existing-ifname", &["A6"])]
#[case::decode_error_code("wrong-error-code", &["C1"])]
#[case::reported_mac("wrong-mac", &["A5"])]
#[case::version_output("version-garbage", &["V1"])]
#[case::plain_text_errors("text-errors", &["X1"])]
fn broken_plugins_fail_the_rule_they_break(#[case] plugin: &str, #[case] ids: &[&str]) {
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = broken_config(tmp.path(), plugin);
    let plugin_dir = format!("{}:{REFERENCE_DIR}", broken_plugins_dir().display());
    let report = run(&plugin_dir, &config, Some(ids));
    for id in ids {
        let check = report
            .checks
            .iter()
            .find(|c| c.id == *id)
            .expect("check reported");
        assert_eq!(
            check.verdict,
            Verdict::Fail,
            "{plugin} must fail {id}:\n{}",
            report.table()
        );
        assert!(
            check.details.iter().any(|d| d.starts_with("FAIL")),
            "a failure must say why: {:?}",
            check.details
        );
    }
    assert!(!report.passed());
}

/// The reference bridge with a bash IPAM plugin from `tests/broken-plugins`
/// that keeps its own store (not host-local's layout) in a /28.
fn own_store_config(dir: &Path, ipam: &str, subnet: &str) -> PathBuf {
    let path = dir.join(format!("{ipam}.conflist"));
    let text = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": format!("own-{ipam}"),
        "plugins": [{
            "type": "bridge",
            "bridge": "cnilab-own0",
            "isGateway": true,
            "ipam": {"type": ipam, "subnet": subnet, "routes": [{"dst": "0.0.0.0/0"}]}
        }]
    });
    std::fs::write(&path, text.to_string()).expect("write config");
    path
}

fn failed_ids(report: &ConformReport) -> Vec<String> {
    report
        .checks
        .iter()
        .filter(|c| c.verdict == Verdict::Fail)
        .map(|c| c.id.clone())
        .collect()
}

/// Plugins with their own store layout: the correct one passes (its
/// releases proven by addresses handed out again), each broken one fails
/// exactly the rules it breaks and no other.
#[rstest]
#[case::correct("leasefile-ipam", &[])]
#[case::del_forgets_the_lease("leasefile-ipam-forgets", &["A10", "D4", "D5", "D6", "D7"])]
#[case::no_lock_in_add("counter-ipam-nolock", &["A12"])]
fn own_store_plugins_fail_exactly_the_rules_they_break(
    #[case] ipam: &str,
    #[case] expected: &[&str],
) {
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = own_store_config(tmp.path(), ipam, "10.93.0.0/28");
    let plugin_dir = format!("{}:{REFERENCE_DIR}", broken_plugins_dir().display());
    let report = run(&plugin_dir, &config, None);
    assert_eq!(failed_ids(&report), expected, "{}", report.table());
    for id in expected {
        let check = report.checks.iter().find(|c| c.id == *id).expect("check");
        assert!(
            check.details.iter().any(|d| d.starts_with("FAIL")),
            "a failure must say why: {:?}",
            check.details
        );
    }
    let details = |id: &str| {
        report
            .checks
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.details.join("\n"))
            .unwrap_or_default()
    };
    match ipam {
        // A release is only a PASS with evidence: the address came back.
        "leasefile-ipam" => {
            for id in ["D4", "D5", "D7"] {
                assert_eq!(verdict(&report, id), Verdict::Pass, "{}", report.table());
                assert!(
                    details(id).contains("was handed out again"),
                    "{id}: {}",
                    details(id)
                );
            }
        }
        "leasefile-ipam-forgets" => {
            assert!(
                details("D7").contains("the range ran out"),
                "{}",
                details("D7")
            );
        }
        _ => {
            // The clashing pods are named (container IDs like a runtime's).
            let a12 = details("A12");
            let hex_id = |s: &str| s.len() >= 64 && s[..64].bytes().all(|b| b.is_ascii_hexdigit());
            let named = a12
                .split("handed to ")
                .skip(1)
                .any(|rest| hex_id(rest) && rest[64..].strip_prefix(" and ").is_some_and(hex_id));
            assert!(named, "{a12}");
        }
    }
}

/// cnilab-bridge with its IPAM delegated to host-local: A8-style skips of
/// the built-in config become real checks (A9, K6), and A6's rollback is
/// exercised through a real IPAM.
#[test]
fn cnilab_bridge_with_host_local_passes_with_evidence() {
    require_reference();
    let dir = cnilab_bridge_dir();
    // host-local next to cnilab-bridge.
    std::os::unix::fs::symlink(
        Path::new(REFERENCE_DIR).join("host-local"),
        dir.join("host-local"),
    )
    .expect("symlink");
    let report = run(
        &dir.display().to_string(),
        &examples_dir().join("cnilab-bridge-host-local.conflist"),
        None,
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failed_ids(&report).is_empty(), "{}", report.table());
    for id in ["A6", "A9", "A10", "A11", "K6", "D4", "D5", "D7"] {
        assert_eq!(
            verdict(&report, id),
            Verdict::Pass,
            "{id}:\n{}",
            report.table()
        );
    }
    assert!(report.summary.passed >= 39, "{}", report.summary_line());
}

/// Debian's plugins in the configs of `harness/examples/debian-*`: no false
/// FAIL; what they genuinely do differently is a WARN or SKIP with the
/// reason (docs/src/conformance.md lists them).
#[rstest]
#[case::ptp("debian-ptp.conflist", None, 26)]
#[case::macvlan("debian-macvlan.conflist", Some("macvlan-host-setup.sh"), 28)]
#[case::bridge_and_four_chained("debian-bridge-chain.conflist", None, 27)]
#[case::static_ipam("debian-static.conflist", None, 21)]
#[case::dual_stack("debian-dual-stack.conflist", None, 28)]
fn debian_plugins_get_no_false_fail(
    #[case] config: &str,
    #[case] setup: Option<&str>,
    #[case] min_passed: usize,
) {
    require_reference();
    let report = run_with(
        REFERENCE_DIR,
        &examples_dir().join(config),
        None,
        setup.map(|f| examples_dir().join(f)),
    );
    assert!(failed_ids(&report).is_empty(), "{}", report.table());
    assert!(
        report.summary.passed >= min_passed,
        "{}",
        report.summary_line()
    );
    let first = |id: &str| {
        report
            .checks
            .iter()
            .find(|c| c.id == id)
            .map(|c| (c.verdict, c.details.join("\n")))
            .expect("check reported")
    };
    match config {
        // A second interface in one container is refused cleanly: a WARN
        // naming why, and D8 depends on it.
        "debian-ptp.conflist" | "debian-bridge-chain.conflist" => {
            let (v, why) = first("A7");
            assert_eq!(v, Verdict::Warn, "{why}");
            assert!(why.contains("refuses a second interface"), "{why}");
            let (v, why) = first("D8");
            assert_eq!(v, Verdict::Skip, "{why}");
            assert!(why.contains("depends on A7"), "{why}");
        }
        "debian-static.conflist" => {
            for id in ["A7", "A12"] {
                let (v, why) = first(id);
                assert_eq!(v, Verdict::Skip, "{why}");
                assert!(why.contains("static IPAM"), "{why}");
            }
        }
        _ => {
            for id in ["A7", "D4", "D5", "D7"] {
                assert_eq!(first(id).0, Verdict::Pass, "{id}: {}", report.table());
            }
        }
    }
}

/// macvlan without its master link: one clear environment error naming
/// what to provide, not a FAIL per check.
#[test]
fn a_missing_master_link_is_an_environment_error() {
    require_root();
    let _host = host_untouched();
    require_reference();
    let mut opts = ConformOptions::new(
        REFERENCE_DIR,
        &examples_dir().join("debian-macvlan.conflist"),
    );
    opts.timeout = Duration::from_secs(60);
    match conform::run(&opts, &mut |_| {}) {
        Err(e @ conform::ConformError::Environment(_)) => {
            let text = e.to_string();
            assert!(
                text.contains("Link not found") && text.contains("--host-setup"),
                "{text}"
            );
        }
        Err(e) => panic!("expected an environment error, got {e}"),
        Ok(r) => panic!(
            "expected an environment error, got a report:\n{}",
            r.table()
        ),
    }
    // From the command line: exit 2 and one message, no table of FAILs.
    let out = assert_cmd::Command::new(env!("CARGO_BIN_EXE_cnilab"))
        .args(["conform", "--plugin-dir", REFERENCE_DIR, "--config"])
        .arg(examples_dir().join("debian-macvlan.conflist"))
        .output()
        .expect("cnilab runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--host-setup"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("FAIL"));
}

/// ipvlan (with its master from `--host-setup`): on a kernel with ipvlan no
/// false FAIL; on one without, one environment error naming the module,
/// never a FAIL per check. Which of the two depends on the kernel; both
/// outcomes are asserted to be right.
#[test]
fn ipvlan_runs_or_names_the_missing_kernel_feature() {
    require_root();
    let _host = host_untouched();
    require_reference();
    let mut opts = ConformOptions::new(
        REFERENCE_DIR,
        &examples_dir().join("debian-ipvlan.conflist"),
    );
    opts.timeout = Duration::from_secs(60);
    opts.host_setup = Some(examples_dir().join("macvlan-host-setup.sh"));
    opts.corpus = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus"));
    match conform::run(&opts, &mut |_| {}) {
        Ok(report) => assert!(failed_ids(&report).is_empty(), "{}", report.table()),
        Err(e @ conform::ConformError::Environment(_)) => {
            let text = e.to_string();
            assert!(
                text.contains("operation not supported") && text.contains("modprobe ipvlan"),
                "{text}"
            );
        }
        Err(e) => panic!("expected a report or an environment error, got {e}"),
    }
}

#[test]
fn evidence_of_a_failure_names_command_env_stdin_and_output() {
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = broken_config(tmp.path(), "ok-on-bad-env");
    let plugin_dir = format!("{}:{REFERENCE_DIR}", broken_plugins_dir().display());
    let report = run(&plugin_dir, &config, Some(&["E1"]));
    let e1 = &report.checks[0];
    let evidence = e1.evidence.first().expect("evidence attached");
    assert!(evidence
        .env
        .iter()
        .any(|(k, v)| k == "CNI_COMMAND" && v == "NOTACOMMAND"));
    assert!(evidence.stdin.contains("\"name\""));
    assert_eq!(evidence.exit_code, Some(0));
    let table = report.table();
    assert!(table.contains("command: "), "{table}");
    assert!(table.contains("CNI_COMMAND=NOTACOMMAND"), "{table}");
    assert!(
        table.contains("stdout:") && table.contains("stderr:"),
        "{table}"
    );
    assert!(table.contains("1 checks: 0 passed, 1 failed"), "{table}");
}
