//! The `cnilab` binary as a user runs it.

mod common;

use assert_cmd::Command;
use common::*;

fn cnilab() -> Command {
    Command::cargo_bin("cnilab").expect("cnilab binary")
}

#[test]
fn conform_exit_code_json_and_junit() {
    require_root();
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let junit = tmp.path().join("junit.xml");
    let out = cnilab()
        .args(["conform", "--plugin-dir", REFERENCE_DIR, "--config"])
        .arg(examples_dir().join("reference-bridge.conflist"))
        .args(["--only", "E1,C1,D3", "--format", "json", "--junit"])
        .arg(&junit)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(report["summary"]["checks"], 3);
    assert_eq!(report["summary"]["failed"], 0);
    let xml = std::fs::read_to_string(&junit).expect("junit written");
    assert!(
        xml.contains("name=\"E1 unknown CNI_COMMAND -&gt; code 4\""),
        "{xml}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("[3/3]"),
        "progress is shown"
    );
}

#[test]
fn conform_fails_with_exit_1_on_a_broken_plugin() {
    require_root();
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let text =
        std::fs::read_to_string(examples_dir().join("reference-bridge.conflist")).expect("config");
    let config = tmp.path().join("c.conflist");
    std::fs::write(
        &config,
        text.replace("\"type\": \"bridge\"", "\"type\": \"version-garbage\""),
    )
    .expect("write");
    let out = cnilab()
        .args(["conform", "--plugin-dir"])
        .arg(format!(
            "{}:{REFERENCE_DIR}",
            broken_plugins_dir().display()
        ))
        .arg("--config")
        .arg(&config)
        .args(["--only", "V1"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("V1   FAIL"), "{text}");
    assert!(
        text.contains("1 checks: 0 passed, 1 failed, 0 warnings, 0 skipped"),
        "{text}"
    );
}

#[test]
fn user_errors_say_what_to_fix() {
    let out = cnilab()
        .args([
            "conform",
            "--plugin-dir",
            "/nonexistent",
            "--config",
            "/nonexistent.conflist",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("cnilab: "), "{err}");
    assert!(
        err.contains("root") || err.contains("/nonexistent.conflist"),
        "{err}"
    );

    require_root();
    let out = cnilab()
        .args(["conform", "--plugin-dir", "/nonexistent", "--config"])
        .arg(examples_dir().join("reference-bridge.conflist"))
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not found in CNI_PATH /nonexistent") && err.contains("--plugin-dir"),
        "{err}"
    );
    let out = cnilab()
        .args([
            "conform",
            "--plugin-dir",
            REFERENCE_DIR,
            "--only",
            "Z9",
            "--config",
        ])
        .arg(examples_dir().join("reference-bridge.conflist"))
        .output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown check ID(s) in --only: Z9"));
}

#[test]
fn bench_prints_both_plugins_and_the_baseline() {
    require_root();
    require_reference();
    let config = examples_dir().join("reference-bridge.conflist");
    let out = cnilab()
        .args(["bench", "--plugin-dir", REFERENCE_DIR, "--config"])
        .arg(&config)
        .args([
            "--pods",
            "4",
            "--parallel",
            "2",
            "--vs-plugin-dir",
            REFERENCE_DIR,
            "--vs-config",
        ])
        .arg(&config)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "ADD sequential",
        "DEL sequential",
        "ADD parallel (2)",
        "DEL parallel (2)",
        "B/A median",
        "veth delete in pod netns",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn sweep_runs_and_reports() {
    require_root();
    let out = cnilab().arg("sweep").output().expect("runs");
    assert!(out.status.success());
    assert!(!out.stdout.is_empty());
}

#[test]
fn refuses_clearly_when_not_root() {
    require_root();
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    assert!(
        setpriv.is_file(),
        "this test needs setpriv (util-linux) to drop root"
    );
    let bin = assert_cmd::cargo::cargo_bin("cnilab");
    let out = std::process::Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["conform", "--plugin-dir", REFERENCE_DIR, "--config"])
        .arg(examples_dir().join("reference-bridge.conflist"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs root") && err.contains("run cnilab"),
        "{err}"
    );
}
