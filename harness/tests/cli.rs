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

/// A pid that no process has now (a child that already exited and was reaped).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().expect("true");
    let pid = child.id();
    child.wait().expect("wait");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} was reused at once; run again"
    );
    pid
}

/// Kills and reaps a child on drop, so a failing test leaves no `sleep`.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sleeper() -> Reaped {
    Reaped(
        std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep"),
    )
}

/// Sweep removes what a dead run left (a namespace named after its pid, its
/// run directory with conflists and IPAM records), stops the agent its
/// pidfile proves is ours, and leaves alone a live run's directory and a
/// process whose pid sits in a pidfile with another start time.
#[test]
fn sweep_runs_and_reports() {
    use cnilab_harness::lab::pidfile::{self, Identity};
    require_root();
    let dead = dead_pid();
    let ns = format!("cnilab-{dead}-0-swept");
    let added = std::process::Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .expect("ip netns add");
    assert!(added.success());
    let run = std::path::PathBuf::from(format!("/run/cnilab/run-{dead}"));
    std::fs::create_dir_all(run.join("node1/ipam/net")).expect("run dir");
    std::fs::write(run.join("node1/net.conflist"), "{}").expect("conflist");
    std::fs::write(run.join("node1/ipam/net/10.244.1.2"), "c1").expect("record");
    // node1's agent is ours (pid and start time match): it must be stopped.
    let mut agent = sleeper();
    let agent_id = Identity::of(agent.0.id()).expect("running");
    pidfile::write(&run.join("node1").join("agent.pid"), agent_id).expect("pidfile");
    // node2's pidfile names a live process with another start time: a reused
    // pid, not ours. It must survive.
    let decoy = sleeper();
    let decoy_id = Identity::of(decoy.0.id()).expect("running");
    std::fs::create_dir_all(run.join("node2")).expect("node2");
    pidfile::write(
        &run.join("node2").join("agent.pid"),
        Identity {
            pid: decoy_id.pid,
            start: decoy_id.start + 1,
        },
    )
    .expect("pidfile");
    // A live run (this test process) keeps its directory.
    let live = std::path::PathBuf::from(format!("/run/cnilab/run-{}", std::process::id()));
    std::fs::create_dir_all(&live).expect("live run dir");
    pidfile::write(&live.join("owner.pid"), Identity::current().expect("me")).expect("owner");

    let out = cnilab().arg("sweep").output().expect("runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let ns_left = std::path::Path::new("/run/netns").join(&ns).exists();
    let run_left = run.exists();
    let live_kept = live.exists();
    let _ = std::fs::remove_dir_all(&live);
    if ns_left {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &ns])
            .status();
    }
    let _ = std::fs::remove_dir_all(&run);

    assert!(out.status.success(), "{text}");
    assert!(!ns_left, "the dead run's namespace is removed: {text}");
    assert!(!run_left, "the dead run's directory is removed: {text}");
    assert!(live_kept, "a live run's directory is kept: {text}");
    assert!(text.contains(&format!("removed netns {ns}")), "{text}");
    assert!(
        text.contains(&format!("removed run directory {}", run.display())),
        "{text}"
    );
    assert!(!text.contains("nothing to sweep"), "{text}");
    let status = agent.0.wait().expect("wait");
    assert!(!status.success(), "our agent was stopped");
    assert!(
        text.contains(&format!("stopped agent {}", agent_id.pid)),
        "{text}"
    );
    let mut decoy = decoy;
    assert!(
        decoy.0.try_wait().expect("try_wait").is_none(),
        "a process that is not ours is never signalled"
    );
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
