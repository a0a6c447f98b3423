//! `cnilab vm` and `cnilab matrix` (root, QEMU): one kernel other than the
//! host's is booted in a microVM (TCG where KVM cannot serve) and one
//! conformance check of the bundled plugin runs inside it; the kernel said
//! inside is the one asked for, a report written under the working
//! directory comes back, and nothing of the run is left. A run killed
//! halfway leaves no QEMU, and `cnilab sweep` removes its directory. A
//! scenario's trace names a VXLAN fault alike inside the VM and here,
//! though the two kernels give the drop different reasons; captures replay
//! on the kernel they name.
//!
//! The kernel is `CNILAB_TEST_KERNEL` (default `6.1`, from Debian's
//! archive into the kernel cache, which later runs reuse; on a runner
//! whose archive has no Debian kernels, its own: `/boot/vmlinuz-$(uname
//! -r)`).

use cnilab_tests::{cnilab, output_text as all, require_root};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn kernel() -> String {
    std::env::var("CNILAB_TEST_KERNEL").unwrap_or_else(|_| "6.1".into())
}

/// The scratch directories of `cnilab vm` runs (`/tmp/cnilab-vm-<pid>-…`).
fn vm_dirs() -> Vec<String> {
    std::fs::read_dir(std::env::temp_dir())
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("cnilab-vm-"))
                .collect()
        })
        .unwrap_or_default()
}

/// The scratch directories of the `cnilab vm` run of process `pid` (tests
/// run side by side: each looks at its own run only).
fn vm_dirs_of(pid: u32) -> Vec<String> {
    let prefix = format!("cnilab-vm-{pid}-");
    vm_dirs()
        .into_iter()
        .filter(|d| d.starts_with(&prefix))
        .collect()
}

/// Runs `cmd` to its end, its output kept: its pid (which names its scratch
/// directory) and its output.
fn run_with_pid(mut cmd: Command) -> (u32, std::process::Output) {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cnilab starts");
    let pid = child.id();
    (pid, child.wait_with_output().expect("cnilab runs"))
}

/// QEMU processes whose command line names `needle`.
fn qemus_with(needle: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.starts_with("qemu-system") && c.contains(needle))
        .count()
}

#[test]
fn one_conformance_check_runs_inside_a_vm_on_another_kernel() {
    require_root();
    let work = tempfile::tempdir().expect("tempdir");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let plugin_dir = repo.join("target/debug");
    let config = repo.join("harness/examples/cnilab-bridge.conflist");
    let mut cmd = Command::new(cnilab_tests::workspace_bin("cnilab"));
    cmd.args(["vm", "--kernel", &kernel(), "--timeout", "15m", "--"])
        .args(["conform", "--plugin-dir"])
        .arg(&plugin_dir)
        .arg("--config")
        .arg(&config)
        .args(["--only", "A1", "--junit", "conform.xml", "-o", "json"])
        .current_dir(work.path());
    let (pid, out) = run_with_pid(cmd);
    let text = all(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    // The kernel inside is the one asked for, not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("the host's release");
    let host = host.trim();
    let ran = text
        .lines()
        .find_map(|l| l.strip_prefix("cnilab vm: ran on "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no `ran on` line: {text}"));
    assert_ne!(ran, host, "{text}");
    if !kernel().contains('/') {
        assert!(ran.starts_with(&format!("{}.", kernel())), "{ran}: {text}");
    }
    // The command's own report, from inside.
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(report["kind"], "ConformReport", "{text}");
    let checks = report["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), 1, "{text}");
    assert_eq!(checks[0]["id"], "A1");
    assert_eq!(checks[0]["verdict"], "pass", "{text}");
    // What it wrote under the working directory came back.
    let xml =
        std::fs::read_to_string(work.path().join("conform.xml")).expect("conform.xml came back");
    assert!(xml.contains("<testsuite") && xml.contains("A1"), "{xml}");
    // Nothing of the run is left (its scratch directory carries its pid).
    let left = vm_dirs_of(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_killed_run_leaves_no_vm_and_sweep_removes_its_directory() {
    require_root();
    let mut child = Command::new(cnilab_tests::workspace_bin("cnilab"))
        .args([
            "vm",
            "--kernel",
            &kernel(),
            "--",
            "lab",
            "run",
            "--nodes",
            "2",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("cnilab vm starts");
    // Its scratch directory appears; the run is killed wherever it is then
    // (the kernel being fetched, QEMU booting, or the command running).
    let deadline = Instant::now() + Duration::from_secs(120);
    let pid = child.id();
    let dir = loop {
        if let Some(d) = vm_dirs_of(pid).first() {
            break d.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no scratch directory after 120 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(3));
    child.kill().expect("kill");
    child.wait().expect("wait");
    // QEMU dies with it (PR_SET_PDEATHSIG), whenever the kill landed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while qemus_with(&dir) > 0 {
        assert!(
            Instant::now() < deadline,
            "QEMU of {dir} outlived its cnilab"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = cnilab(&["sweep"]);
    assert!(out.status.success(), "{}", all(&out));
    assert!(
        !std::env::temp_dir().join(&dir).exists(),
        "sweep left {dir}: {}",
        all(&out)
    );
}

/// The trace step of a `scenario run -o json` report of the VXLAN
/// scenario, after asserting the scenario passed: the trace died at node1
/// with vxlan-fdb-missing (the step is written so), and the kernel's own
/// account of the drop (`kernelDrop`).
fn vxlan_drop(out: &std::process::Output, on: &str) -> Value {
    let text = all(out);
    assert_eq!(out.status.code(), Some(0), "{on}: {text}");
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{on}: {e}: {text}"));
    let scenario = &report["scenarios"][0];
    assert_eq!(scenario["outcome"], "pass", "{on}: {text}");
    let steps = scenario["steps"].as_array().expect("steps");
    let trace = steps
        .iter()
        .find(|s| s["what"].as_str().is_some_and(|w| w.starts_with("trace ")))
        .unwrap_or_else(|| panic!("{on}: no trace step: {text}"));
    assert_eq!(trace["ok"], true, "{on}: {text}");
    let detail = trace["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("died at node1: vxlan-fdb-missing"),
        "{on}: {detail}"
    );
    let drop = trace["kernelDrop"].clone();
    assert_eq!(
        (&drop["namespace"], &drop["device"], &drop["function"]),
        (
            &Value::from("node1"),
            &Value::from("vxlan0"),
            &Value::from("vxlan_xmit")
        ),
        "{on}: {text}"
    );
    drop
}

/// A real difference between kernels, and the rule that holds across it:
/// a VXLAN device with no FDB entry for the peer's VTEP drops the packet
/// in `vxlan_xmit` on every kernel, and the trace names the fault
/// (`vxlan-fdb-missing` at node1) from the lab's own objects on each; but
/// the kernel's drop reason differs. 6.1's vxlan frees it with no reason
/// (`NOT_SPECIFIED`); later kernels name it (`VXLAN_NO_REMOTE`, renamed
/// `NO_TX_TARGET`), as the host kernel's own list of reasons says.
#[test]
fn a_vxlan_drop_is_named_alike_on_another_kernel_though_the_kernels_word_differs() {
    require_root();
    let scenario = [
        "scenario",
        "run",
        "vxlan-fdb-missing-after-rejoin",
        "-o",
        "json",
    ];
    let mut cmd = Command::new(cnilab_tests::workspace_bin("cnilab"));
    cmd.args(["vm", "--kernel", &kernel(), "--timeout", "15m", "--"])
        .args(scenario);
    let (pid, vm) = run_with_pid(cmd);
    let ran = all(&vm)
        .lines()
        .find_map(|l| l.strip_prefix("cnilab vm: ran on "))
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no `ran on` line: {}", all(&vm)));
    let there = vxlan_drop(&vm, &ran);
    assert!(vm_dirs_of(pid).is_empty(), "the VM's directory is left");
    let here = vxlan_drop(&cnilab(&scenario), "the host");
    // What the host kernel calls this drop, from its own list of reasons.
    let format = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .find_map(|t| std::fs::read_to_string(format!("{t}/events/skb/kfree_skb/format")).ok())
        .expect("the host's skb:kfree_skb format (tracefs)");
    let named = ["NO_TX_TARGET", "VXLAN_NO_REMOTE"]
        .into_iter()
        .find(|r| format.contains(&format!("\"{r}\"")))
        .unwrap_or("NOT_SPECIFIED");
    assert_eq!(here["reason"], named, "the host");
    if ran.starts_with("6.1.") {
        assert_eq!(there["reason"], "NOT_SPECIFIED", "{ran}");
    }
}

/// The failing groups of a `lab run -o json` report.
fn failing_groups(out: &std::process::Output, on: &str) -> Vec<String> {
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{on}: {e}: {}", all(out)));
    assert_eq!(report["kind"], "LabReport", "{on}: {}", all(out));
    report["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter(|g| g["passed"] != g["probes"])
        .filter_map(|g| g["name"].as_str().map(str::to_string))
        .collect()
}

/// `lab run --capture … --kernel auto` replays on the kernel the captures
/// name: here captures of two Calico-style nodes whose provenance names a
/// Debian release of the test kernel's series that the archive no longer
/// has (as a node not updated for a while would), so the newest of that
/// series replays them and says so. The replay on that kernel finds the
/// same failing groups as the replay here.
#[test]
fn a_capture_replays_on_the_kernel_it_names() {
    require_root();
    let work = tempfile::tempdir().expect("tempdir");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("release");
    // A kernel by path is the runner's own: the captures name it.
    let release = match kernel() {
        k if k.contains('/') => host.trim().to_string(),
        k => format!("{k}.0-13-amd64"),
    };
    let mut files = Vec::new();
    for node in ["node1", "node2"] {
        let from = repo.join(format!(
            "lab/scenarios/captures/calico-proxy-arp-off/{node}.json"
        ));
        let mut capture: Value =
            serde_json::from_slice(&std::fs::read(&from).expect("the shipped capture"))
                .expect("JSON");
        capture["provenance"]["kernel"] = Value::from(release.clone());
        let to = work.path().join(format!("{node}.json"));
        std::fs::write(&to, capture.to_string()).expect("write");
        files.push(to.to_string_lossy().into_owned());
    }
    let mut cmd = Command::new(cnilab_tests::workspace_bin("cnilab"));
    cmd.args(["lab", "run", "-o", "json", "--kernel", "auto", "--capture"])
        .args(&files)
        .current_dir(work.path());
    let (pid, there) = run_with_pid(cmd);
    let text = all(&there);
    assert_eq!(
        there.status.code(),
        Some(1),
        "the captures hold a fault: {text}"
    );
    if release != host.trim() {
        let ran = text
            .lines()
            .find_map(|l| l.strip_prefix("cnilab vm: ran on "))
            .unwrap_or_else(|| panic!("no `ran on` line: {text}"));
        assert!(ran.starts_with(&format!("{}.", kernel())), "{ran}");
        if !ran.starts_with(&release) {
            assert!(
                text.contains(&format!("the capture's kernel {release} is neither")),
                "the replay says it is not the captured kernel: {text}"
            );
        }
        // br_netfilter is loaded in the VM, as on a node.
        assert!(!text.contains("bridge-nf-call"), "{text}");
    } else {
        assert!(
            text.contains("replaying on this machine's kernel"),
            "{text}"
        );
    }
    assert!(vm_dirs_of(pid).is_empty(), "the VM's directory is left");
    let mut cmd = Command::new(cnilab_tests::workspace_bin("cnilab"));
    cmd.args(["lab", "run", "-o", "json", "--capture"])
        .args(&files)
        .current_dir(work.path());
    let here = cmd.output().expect("cnilab runs");
    let failing = failing_groups(&there, &release);
    assert!(!failing.is_empty(), "{text}");
    assert_eq!(failing, failing_groups(&here, "here"));
}

#[test]
fn bad_input_is_refused_before_anything_boots() {
    require_root();
    for (args, says) in [
        (
            &["vm", "--kernel", "6.1;reboot", "--", "lab", "run"][..],
            "not a version",
        ),
        (
            &["vm", "--kernel", "6.1", "--", "vm", "--kernel", "6.1"][..],
            "not another vm",
        ),
        (
            &["vm", "--kernel", "/nonexistent/vmlinuz", "--", "lab", "run"][..],
            "/nonexistent/vmlinuz",
        ),
        (
            &["matrix", "--kernels", ",", "--", "lab", "run"][..],
            "at least one kernel",
        ),
        (
            &["lab", "run", "--nodes", "2", "--kernel", "6.1"][..],
            "--capture",
        ),
        (
            &["lab", "up", "--capture", "n1.json", "--kernel", "auto"][..],
            "lab run --capture",
        ),
    ] {
        let mut cmd = Command::new(cnilab_tests::workspace_bin("cnilab"));
        cmd.args(args);
        let (pid, out) = run_with_pid(cmd);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", all(&out));
        assert!(all(&out).contains(says), "{args:?}: {}", all(&out));
        assert!(
            vm_dirs_of(pid).is_empty(),
            "{args:?} made a scratch directory"
        );
    }
}
