//! The `cnilab` binary as a user runs it.

mod common;

use assert_cmd::Command;
use common::*;

fn cnilab() -> Command {
    Command::cargo_bin("cnilab").expect("cnilab binary")
}

#[test]
fn conform_exit_code_json_and_junit() {
    let _host = host_untouched();
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
    let _host = host_untouched();
    require_root();
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = reference_config_edited(
        tmp.path(),
        "c.conflist",
        "\"type\": \"bridge\"",
        "\"type\": \"version-garbage\"",
    );
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

fn bench_args(config: &std::path::Path) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = ["bench", "--plugin-dir", REFERENCE_DIR, "--config"]
        .map(Into::into)
        .to_vec();
    args.push(config.into());
    args.extend(
        [
            "--pods",
            "4",
            "--parallel",
            "2",
            "--vs-plugin-dir",
            REFERENCE_DIR,
            "--vs-config",
        ]
        .map(Into::into),
    );
    args.push(config.into());
    args
}

/// The numbers of one table line: every `<x> ms` and every `<r>x` ratio.
fn figures(line: &str) -> (Vec<f64>, Vec<f64>) {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let mut ms = Vec::new();
    let mut ratios = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if tokens.get(i + 1).map(|u| u.trim_end_matches(',')) == Some("ms") {
            if let Ok(v) = t.trim_start_matches('+').parse::<f64>() {
                ms.push(v);
            }
        } else if let Some(r) = t.strip_suffix('x').and_then(|r| r.parse::<f64>().ok()) {
            ratios.push(r);
        }
    }
    (ms, ratios)
}

/// The first line of `table` that is row `row` (its label, then figures),
/// and its figures.
fn row_figures(table: &str, row: &str) -> (String, (Vec<f64>, Vec<f64>)) {
    let rest = table
        .lines()
        .find_map(|l| {
            l.strip_prefix(row)
                .filter(|r| r.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        })
        .unwrap_or_else(|| panic!("missing {row:?} in:\n{table}"));
    (format!("{row}{rest}"), figures(rest))
}

/// `shown` is `b / a` rounded to 2 decimals, where `a` and `b` were shown
/// rounded to 0.1 ms.
fn ratio_agrees(shown: f64, a: f64, b: f64) -> bool {
    let (lo, hi) = ((b - 0.05) / (a + 0.05), (b + 0.05) / (a - 0.05).max(1e-9));
    shown >= lo - 0.005 && shown <= hi + 0.005
}

#[test]
fn ratio_check_accepts_rounding_and_refuses_wrong_arithmetic() {
    assert!(ratio_agrees(2.0, 1.0, 2.0));
    assert!(ratio_agrees(1.05, 2.0, 2.1));
    assert!(!ratio_agrees(0.5, 1.0, 2.0), "A/B instead of B/A");
    assert!(!ratio_agrees(1.2, 1.0, 1.0));
    let (ms, r) = figures(
        "ADD parallel (2)      12.3 ms    15.0 ms    13.1 ms    20.0 ms          1.07x       1.33x",
    );
    assert_eq!((ms, r), (vec![12.3, 15.0, 13.1, 20.0], vec![1.07, 1.33]));
    let (ms, _) = figures(" A +17.7 ms, B -0.4 ms");
    assert_eq!(ms, vec![17.7, -0.4]);
}

#[test]
fn bench_prints_both_plugins_and_the_baseline() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let config = examples_dir().join("reference-bridge.conflist");
    let out = cnilab().args(bench_args(&config)).output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // Each phase: A median, A p95, B median, B p95, then B/A of both.
    let mut del_sequential_median = (0.0, 0.0);
    for phase in [
        "ADD sequential",
        "DEL sequential",
        "ADD parallel (2)",
        "DEL parallel (2)",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(phase))
            .unwrap_or_else(|| panic!("missing {phase:?} in:\n{text}"));
        let (ms, ratios) = figures(&line[phase.len()..]);
        let (&[a_med, a_p95, b_med, b_p95], &[r_med, r_p95]) = (&ms[..], &ratios[..]) else {
            panic!("{phase}: expected 4 latencies and 2 ratios in {line:?}");
        };
        assert!(
            [a_med, a_p95, b_med, b_p95].iter().all(|v| *v > 0.0),
            "{line}"
        );
        assert!(a_med <= a_p95 && b_med <= b_p95, "median above p95: {line}");
        assert!(ratio_agrees(r_med, a_med, b_med), "B/A median: {line}");
        assert!(ratio_agrees(r_p95, a_p95, b_p95), "B/A p95: {line}");
        if phase == "DEL sequential" {
            del_sequential_median = (a_med, b_med);
        }
    }
    let baseline = |label: &str| -> (f64, f64) {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("missing baseline {label:?} in:\n{text}"));
        let (ms, _) = figures(line);
        assert!(ms.len() >= 2, "{line}");
        assert!(ms[0] > 0.0 && ms[0] <= ms[1], "{line}");
        (ms[0], ms[1])
    };
    baseline("veth create");
    baseline("veth delete, one netns");
    let (pod_delete, _) = baseline("veth delete in pod netns");
    // "DEL sequential median minus bare pod veth delete: A +x ms, B +y ms"
    let line = text
        .lines()
        .find(|l| l.starts_with("DEL sequential median minus"))
        .unwrap_or_else(|| panic!("missing the DEL overhead line in:\n{text}"));
    let (over, _) = figures(line.split(':').nth(1).unwrap_or(""));
    assert_eq!(over.len(), 2, "{line}");
    for (shown, del) in over
        .iter()
        .zip([del_sequential_median.0, del_sequential_median.1])
    {
        assert!(
            (shown - (del - pod_delete)).abs() <= 0.16,
            "{shown} != {del} - {pod_delete}: {line}"
        );
    }

    // The JSON form carries the raw figures: every phase measured every pod.
    let out = cnilab()
        .args(bench_args(&config))
        .arg("--json")
        .output()
        .expect("runs");
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for side in ["ours", "versus"] {
        for phase in [
            "add_sequential",
            "del_sequential",
            "add_parallel",
            "del_parallel",
        ] {
            let p = &report[side][phase];
            assert_eq!(p["count"], 4, "{side}.{phase}: {p}");
            let f = |k: &str| p[k].as_f64().unwrap_or(-1.0);
            assert!(
                f("median") > 0.0 && f("median") <= f("p95") && f("p95") <= f("max"),
                "{side}.{phase}: {p}"
            );
        }
    }
}

/// The build's own directory (`target/<profile>`), which must hold
/// `names` (`cargo build --workspace` builds them all).
fn built_dir(names: &[&str]) -> std::path::PathBuf {
    let cnilab = assert_cmd::cargo::cargo_bin("cnilab");
    let dir = cnilab.parent().expect("target dir").to_path_buf();
    for name in names {
        assert!(
            dir.join(name).is_file(),
            "{} is missing: build it first with `cargo build --workspace`",
            dir.join(name).display()
        );
    }
    dir
}

#[test]
fn bench_measures_ours_and_the_reference_against_the_floor() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let dir = built_dir(&["cnilab-bridge", "cnilab-floor"]);
    let out = cnilab()
        .args(["bench", "--pods", "3", "--parallel", "1", "--plugin-dir"])
        .arg(&dir)
        .arg("--config")
        .arg(examples_dir().join("cnilab-bridge.conflist"))
        .args(["--vs-plugin-dir", REFERENCE_DIR, "--vs-config"])
        .arg(examples_dir().join("reference-bridge.conflist"))
        .arg("--floor-dir")
        .arg(&dir)
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = text
        .split("against the floor")
        .nth(1)
        .unwrap_or_else(|| panic!("no floor table in:\n{text}"));
    // F median, F p95, A median, A p95, A/F, A-F, Fb median, A-Fb,
    // B median, B p95, B/F, B/A.
    for row in ["ADD", "ADD ipMasq", "ADD dual-stack", "DEL"] {
        let (line, (ms, ratios)) = row_figures(table, row);
        let (
            &[f_med, f_p95, a_med, a_p95, a_minus_f, fb_med, a_minus_fb, b_med, b_p95],
            &[a_f, b_f, b_a],
        ) = (&ms[..], &ratios[..])
        else {
            panic!("{row}: expected 9 ms figures and 3 ratios in {line:?}");
        };
        assert!(fb_med > 0.0, "{line}");
        assert!(
            (a_minus_fb - (a_med - fb_med)).abs() <= 0.011,
            "A-Fb: {line}"
        );
        for (med, p95) in [(f_med, f_p95), (a_med, a_p95), (b_med, b_p95)] {
            assert!(med > 0.0 && med <= p95, "{line}");
        }
        assert!(ratio_agrees(a_f, f_med, a_med), "A/F: {line}");
        assert!(ratio_agrees(b_f, f_med, b_med), "B/F: {line}");
        assert!(ratio_agrees(b_a, a_med, b_med), "B/A: {line}");
        assert!((a_minus_f - (a_med - f_med)).abs() <= 0.011, "A-F: {line}");
    }
    assert!(table.contains("cnilab-floor"), "{table}");
    assert!(table.contains("with bridge cnilab-floor0"), "{table}");
    // CPU per call (from each call's cgroup): F, A, A/F, A-F, Fb, A-Fb, B,
    // B/F, B/A.
    let cpu = table
        .split("CPU median")
        .nth(1)
        .unwrap_or_else(|| panic!("no CPU table in:\n{table}"));
    for row in ["ADD", "ADD ipMasq", "ADD dual-stack", "DEL"] {
        let (line, (ms, ratios)) = row_figures(cpu, row);
        let (&[f, a, a_minus_f, fb, a_minus_fb, b], &[a_f, b_f, b_a]) = (&ms[..], &ratios[..])
        else {
            panic!("{row}: expected 6 ms figures and 3 ratios in {line:?}");
        };
        assert!(
            f > 0.0 && a > 0.0 && fb > 0.0 && b > 0.0,
            "a call uses CPU: {line}"
        );
        assert!((a_minus_fb - (a - fb)).abs() <= 0.011, "A-Fb: {line}");
        assert!(ratio_agrees(a_f, f, a), "A/F: {line}");
        assert!(ratio_agrees(b_f, f, b), "B/F: {line}");
        assert!(ratio_agrees(b_a, a, b), "B/A: {line}");
        assert!((a_minus_f - (a - f)).abs() <= 0.011, "A-F: {line}");
    }

    let out = cnilab()
        .args([
            "bench",
            "--pods",
            "2",
            "--parallel",
            "1",
            "-o",
            "json",
            "--plugin-dir",
        ])
        .arg(&dir)
        .arg("--config")
        .arg(examples_dir().join("cnilab-bridge.conflist"))
        .arg("--floor-dir")
        .arg(&dir)
        .output()
        .expect("runs");
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for side in ["floor", "bridged_floor", "ours"] {
        for variant in ["add", "add_masq", "add_dual_stack", "del"] {
            assert_eq!(
                report["floor"][side][variant]["count"], 2,
                "{side}.{variant}"
            );
        }
        let cpu = report["floor"][side]["cpu"]
            .as_array()
            .unwrap_or_else(|| panic!("{side}.cpu: {}", report["floor"][side]));
        assert_eq!(cpu.len(), 4, "{side}.cpu: one per variant");
        for v in cpu {
            assert_eq!(v["count"], 2, "{side}.cpu: {v}");
            assert!(
                v["median"].as_f64().is_some_and(|m| m > 0.0),
                "{side}.cpu: {v}"
            );
        }
    }
    assert!(report["floor"]["versus"].is_null());

    // A --floor-dir without the floor is said, not ignored.
    let out = reference_bench_without_floor(&[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("no floor comparison: --floor-dir /nonexistent has no cnilab-floor"),
        "{text}"
    );
}

/// `cnilab bench` of one reference pod, with a --floor-dir that has no floor.
fn reference_bench_without_floor(extra: &[&str]) -> std::process::Output {
    cnilab()
        .args([
            "bench",
            "--pods",
            "1",
            "--parallel",
            "1",
            "--plugin-dir",
            REFERENCE_DIR,
        ])
        .arg("--config")
        .arg(examples_dir().join("reference-bridge.conflist"))
        .args(["--floor-dir", "/nonexistent"])
        .args(extra)
        .output()
        .expect("runs")
}

#[test]
fn bench_with_lab_prints_the_lab_figures() {
    let _host = host_untouched();
    require_root();
    require_reference();
    built_dir(&["cnilab-bridge"]);
    let bench = reference_bench_without_floor;
    let out = bench(&["--lab", "2x2", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let lab = &report["lab"];
    assert_eq!(lab["verdict"], "pass", "{lab}");
    assert_eq!(
        (lab["nodes"].as_u64(), lab["pods_per_node"].as_u64()),
        (Some(2), Some(2))
    );
    assert!(lab["probes"].as_u64().unwrap_or(0) > 0, "{lab}");
    let phase = |name: &str| {
        lab["phases"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["phase"] == name))
            .and_then(|p| p["ms"].as_f64())
            .unwrap_or_else(|| panic!("no {name} phase in {lab}"))
    };
    let attach = phase("attach");
    assert!(
        attach > 0.0 && phase("up") > 0.0 && phase("checks") > 0.0,
        "{lab}"
    );
    let per_pod = lab["attach_ms_per_pod"].as_f64().unwrap_or(-1.0);
    assert!((per_pod - attach / 4.0).abs() < 1e-6, "{lab}");
    assert!(lab["total_ms"].as_f64().unwrap_or(0.0) >= attach, "{lab}");
    assert!(lab["max_rss_kib"].as_u64().unwrap_or(0) > 0, "{lab}");

    let out = bench(&["--lab", "0x5"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected NODESxPODS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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

/// The sweep tests each sweep the whole machine: one at a time, so neither
/// sweeps what the other planted.
static SWEEPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sweep removes what a dead run left (a namespace named after its pid, its
/// run directory with conflists and IPAM records), stops the agent its
/// pidfile proves is ours, and leaves alone a live run's directory and a
/// process whose pid sits in a pidfile with another start time.
#[test]
fn sweep_runs_and_reports() {
    use cnilab_harness::lab::pidfile::{self, Identity};
    require_root();
    let _one_at_a_time = SWEEPS.lock().unwrap_or_else(|e| e.into_inner());
    // A process that made a namespace and died: its name, and the owner
    // record it wrote first (pid and start time, read while it was a
    // zombie), as `Netns::with_label` leaves them.
    let mut gone = std::process::Command::new("true").spawn().expect("true");
    let dead = gone.id();
    let start = pidfile::start_time(dead).expect("a zombie has its stat");
    gone.wait().expect("wait");
    let owners = std::path::Path::new(cnilab_harness::netns::owner::OWNERS_DIR);
    std::fs::create_dir_all(owners).expect("owners dir");
    std::fs::write(owners.join(dead.to_string()), format!("{dead} {start}\n")).expect("record");
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
    // node1's agent is ours (pid and start time match, and like every lab
    // agent it carries its run dir in CNILAB_RUN_DIR): it must be stopped.
    let mut agent = Reaped(
        std::process::Command::new("sleep")
            .arg("60")
            .env("CNILAB_RUN_DIR", run.join("node1"))
            .spawn()
            .expect("sleep"),
    );
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

/// A pidfile with the right pid and start time is not proof enough: one
/// naming PID 1, or a process that has nothing to do with the run dir, is
/// never signalled nor reported as stopped.
#[test]
fn sweep_ignores_pidfiles_naming_processes_that_are_not_the_runs() {
    use cnilab_harness::lab::pidfile::{self, Identity};
    require_root();
    let _one_at_a_time = SWEEPS.lock().unwrap_or_else(|e| e.into_inner());
    let dead = dead_pid();
    let run = std::path::PathBuf::from(format!("/run/cnilab/run-{dead}"));
    std::fs::create_dir_all(run.join("node1")).expect("node1");
    std::fs::create_dir_all(run.join("node2")).expect("node2");
    let init = Identity::of(1).expect("PID 1 runs");
    pidfile::write(&run.join("node1").join("agent.pid"), init).expect("pidfile");
    let stranger = sleeper();
    let stranger_id = Identity::of(stranger.0.id()).expect("running");
    pidfile::write(&run.join("node2").join("agent.pid"), stranger_id).expect("pidfile");

    let out = cnilab().arg("sweep").output().expect("runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = std::fs::remove_dir_all(&run);
    let mut stranger = stranger;
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains("stopped agent 1 "),
        "PID 1 was signalled as an agent: {text}"
    );
    assert!(
        stranger.0.try_wait().expect("try_wait").is_none(),
        "a process whose pidfile matched but which is not the run's was killed: {text}"
    );
    assert!(
        !text.contains(&format!("stopped agent {}", stranger_id.pid)),
        "{text}"
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

/// `lab causes`: the whole table, one cause in full, JSON, and an unknown
/// cause refused with how to list them (no root: it reads no lab).
#[test]
fn lab_causes_lists_explains_and_refuses_an_unknown_cause() {
    let all = cnilab().args(["lab", "causes"]).output().expect("runs");
    assert!(all.status.success());
    let table = String::from_utf8_lossy(&all.stdout);
    for id in ["missing-route", "vxlan-fdb-missing", "qdisc-drop", "dns"] {
        assert!(table.lines().any(|l| l.starts_with(id)), "{id}: {table}");
    }
    let one = cnilab()
        .args(["lab", "causes", "vxlan-fdb-missing"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&one.stdout);
    assert!(one.status.success(), "{text}");
    assert!(text.contains("bridge fdb append"), "the fix: {text}");
    assert!(text.contains("named by rule, trace"), "{text}");
    // The tests that prove its fix, as commands.
    assert!(
        text.contains("proven:   cnilab scenario run vxlan-fdb-missing-after-rejoin")
            && text.contains("cargo test -p cnilab-tests --test trace vxlan_outer_packet"),
        "{text}"
    );
    let json = cnilab()
        .args(["lab", "causes", "-o", "json"])
        .output()
        .expect("runs");
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(doc["kind"], "CauseList");
    let causes = doc["causes"].as_array().expect("causes");
    assert!(causes.len() > 60, "{}", causes.len());
    let proven = causes
        .iter()
        .filter(|c| c["proven_by"].as_array().is_some_and(|p| !p.is_empty()))
        .count();
    assert!(proven >= 50, "{proven} causes with a tested fix");
    assert!(cnilab_harness::report::schema::check_report(&doc).is_empty());
    let unknown = cnilab()
        .args(["lab", "causes", "gremlins"])
        .output()
        .expect("runs");
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("`cnilab lab causes` lists"));
}
