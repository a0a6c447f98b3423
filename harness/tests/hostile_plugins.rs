//! `cnilab conform` against plugins that attack the harness itself (issue
//! 25): a `setsid` child holding stdout, unbounded output, changes to the
//! namespace conform runs in, escape sequences in error messages. The real
//! `cnilab` binary runs each; the plugins are the shell scripts in
//! `tests/broken-plugins/`.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CNILAB: &str = env!("CARGO_BIN_EXE_cnilab");

/// The reference example config with `type` replaced by a broken plugin.
fn broken_config(dir: &Path, plugin: &str) -> PathBuf {
    let text = std::fs::read_to_string(examples_dir().join("reference-bridge.conflist"))
        .expect("example config");
    let text = text.replace("\"type\": \"bridge\"", &format!("\"type\": \"{plugin}\""));
    assert!(text.contains(plugin), "example config names the bridge");
    let path = dir.join(format!("{plugin}.conflist"));
    std::fs::write(&path, text).expect("write config");
    path
}

fn plugin_dir() -> String {
    format!("{}:{REFERENCE_DIR}", broken_plugins_dir().display())
}

/// `cnilab conform` on `plugin` with `args`, run as `prefix... cnilab ...`
/// (as root, with the reference plugins, the machine's network untouched);
/// killed (and the test failed) if it has not ended after `watchdog`, far
/// beyond any `--timeout` given.
fn conform(prefix: &[&str], plugin: &str, args: &[&str], watchdog: Duration) -> Output {
    require_root();
    require_reference();
    let _host = host_untouched();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = broken_config(tmp.path(), plugin);
    let (program, pre) = match prefix.split_first() {
        Some((p, rest)) => (*p, rest),
        None => (CNILAB, &[][..]),
    };
    let mut cmd = Command::new(program);
    cmd.args(pre);
    if !prefix.is_empty() {
        cmd.arg(CNILAB);
    }
    let mut child = cmd
        .args(["conform", "--plugin-dir", &plugin_dir(), "--config"])
        .arg(&config)
        .args(args)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cnilab runs");
    let until = Instant::now() + watchdog;
    // Read on threads so a large report never blocks the child.
    let mut out_pipe = child.stdout.take().expect("stdout");
    let mut err_pipe = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out_pipe, &mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err_pipe, &mut buf);
        buf
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            kill_marked_sleeps();
            panic!(
                "cnilab conform {args:?} on {plugin} had not ended after {} s",
                watchdog.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out_reader.join().expect("stdout reader"),
        stderr: err_reader.join().expect("stderr reader"),
    }
}

/// The `sleep` arguments the plugins of these tests leave running:
/// `setsid-holds-stdout` 3601, `leaves-its-cgroup` 3602,
/// `leaves-cgroup-and-session` 3603.
const MARKS: [&str; 3] = ["3601", "3602", "3603"];

/// Pids of the processes running `sleep <mark>`.
fn sleeps_marked(mark: &str) -> Vec<i32> {
    let cmdline = format!("sleep\0{mark}\0");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == cmdline.as_bytes())
        })
        .collect()
}

fn kill_marked_sleeps() {
    for pid in MARKS.iter().flat_map(|m| sleeps_marked(m)) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Check `id` of a JSON conform report.
fn check<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["id"] == id))
        .unwrap_or_else(|| panic!("{id} is not in the report: {report}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Point 6: the plugin's `setsid` child holds stdout for an hour. With
/// `--timeout 3` conform must end (a FAIL naming the leftover), and the
/// child must be gone: killed through a cgroup per call, or, where there is
/// none, as a holder of the call's pipe.
#[test]
fn root_timeout_holds_when_a_setsid_child_keeps_stdout_open() {
    let (stdout, survivors) = timed_out("setsid-holds-stdout", "3601");
    assert!(
        stdout.contains("held its output open") || stdout.contains("still held its output"),
        "the report names the leftover process: {stdout}"
    );
    assert!(
        survivors.is_empty() || stdout.contains("could not be ended"),
        "sleep {survivors:?} survived and the report does not say so: {stdout}"
    );
}

/// `conform --only A1 --timeout 3 -o json` on `plugin`, which leaves
/// `sleep <mark>` behind: its stdout (the JSON report) and the pids of the
/// `sleep <mark>` that survived it (killed before returning). Fails unless
/// conform ended with 1.
fn timed_out(plugin: &str, mark: &str) -> (String, Vec<i32>) {
    let out = conform(
        &[],
        plugin,
        &["--only", "A1", "--timeout", "3", "-o", "json"],
        Duration::from_secs(120),
    );
    let survivors = sleeps_marked(mark);
    kill_marked_sleeps();
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    (stdout, survivors)
}

/// The plugin moves itself out of its call's cgroup (root may write its pid
/// to any cgroup's `cgroup.procs`) and hangs there. `cgroup.kill` no longer
/// reaches it; with `--timeout 3` conform must still end, A1 must be a
/// timeout, and the plugin must be gone (killed with its process group).
#[test]
fn root_timeout_holds_when_the_plugin_leaves_its_cgroup() {
    let (stdout, survivors) = timed_out("leaves-its-cgroup", "3602");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    let a1 = check(&report, "A1");
    assert_eq!(a1["verdict"], "fail", "{a1}");
    assert!(
        a1.to_string().contains("timed out"),
        "A1 is reported as a timeout: {a1}"
    );
    assert!(
        survivors.is_empty(),
        "the plugin {survivors:?} survived: {a1}"
    );
}

/// The plugin leaves its call's cgroup, then double-forks a child into a
/// session of its own that holds stdout open, and answers. Neither the
/// cgroup nor the process group reaches that child: conform must end, name
/// the leftover, and the child must be gone (killed as a holder of the
/// call's pipe).
#[test]
fn root_timeout_holds_when_a_child_leaves_the_cgroup_and_the_session() {
    let (stdout, survivors) = timed_out("leaves-cgroup-and-session", "3603");
    assert!(
        stdout.contains("held its output open"),
        "the report names the leftover process: {stdout}"
    );
    assert!(
        survivors.is_empty(),
        "sleep {survivors:?} survived the call's kill: {stdout}"
    );
}

/// Peak RSS of the waited-for children of this test process, in KiB.
fn children_max_rss_kib() -> i64 {
    // SAFETY: getrusage only writes into the struct it is given.
    let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { nix::libc::getrusage(nix::libc::RUSAGE_CHILDREN, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    usage.ru_maxrss
}

/// Point 7: 100 MB on stdout. conform keeps a bounded part, says the output
/// was cut, FAILs the rule, and its report and memory stay small.
#[test]
fn root_unbounded_plugin_output_is_cut_and_fails_the_rule() {
    let out = conform(
        &[],
        "huge-stdout",
        &["--only", "A1", "--timeout", "60", "-o", "json"],
        Duration::from_secs(300),
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        stdout.len() < 8 << 20,
        "the JSON report is {} bytes: the output was kept whole",
        stdout.len()
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    let a1 = check(&report, "A1");
    assert_eq!(a1["verdict"], "fail", "{a1}");
    assert!(
        a1.to_string().contains("output cut"),
        "the report says the output was cut: {a1}"
    );
    let rss = children_max_rss_kib();
    assert!(
        rss < 512 * 1024,
        "a child of this test peaked at {rss} KiB: the output was kept whole"
    );
}

/// Point 9: an error message with escape sequences. The table shows them
/// escaped (no ESC, CR or C1 byte reaches the terminal); the JSON report
/// keeps the raw text in its strings.
#[test]
fn root_plugin_escape_sequences_never_reach_the_terminal_raw() {
    let watchdog = Duration::from_secs(300);
    let table = conform(
        &[],
        "escape-error",
        &["--only", "A1", "--timeout", "30"],
        watchdog,
    );
    let stdout = text(&table.stdout);
    assert_eq!(table.status.code(), Some(1), "{stdout}");
    let raw: Vec<char> = stdout
        .chars()
        .filter(|c| *c != '\n' && c.is_control())
        .collect();
    assert!(
        raw.is_empty(),
        "raw control characters {raw:?} in:\n{stdout}"
    );
    assert!(
        stdout.contains(r"\u{1b}[2K\rPASS A1 all good"),
        "the message is shown, escaped:\n{stdout}"
    );
    let stderr = text(&table.stderr);
    assert!(!stderr.contains('\u{1b}'), "stderr: {stderr}");

    let json = conform(
        &[],
        "escape-error",
        &["--only", "A1", "--timeout", "30", "-o", "json"],
        watchdog,
    );
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON report");
    assert!(
        report.to_string().contains(r"\u001b[2K\rPASS A1 all good"),
        "JSON keeps the raw text (JSON-escaped): {report}"
    );
}

/// Point 8: the plugin enters its parent's namespace (the runtime's own)
/// and adds links there. conform runs inside a throwaway namespace (its
/// "machine"), sees the change and FAILs H1 naming the links; the real
/// machine's network is untouched.
#[test]
fn root_a_plugin_changing_conforms_own_namespace_fails_h1() {
    let own = cnilab_harness::testing::host_netns();
    let out = conform(
        &["ip", "netns", "exec", own.name()],
        "enters-parent-netns",
        &["--only", "A1", "--timeout", "30", "-o", "json"],
        Duration::from_secs(300),
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    // Reported although not asked for.
    let h1 = check(&report, "H1");
    assert_eq!(h1["verdict"], "fail", "{h1}");
    assert!(
        h1.to_string().contains("cnilabevil1"),
        "H1 names the link: {h1}"
    );
}
