//! The agent binary given hostile paths: a FIFO as `--nodes-file` or
//! `--netns` must be refused at once with a clear error, never hang, and a
//! bad CIDR in the nodes file must name the node and the field. Every run
//! has a deadline: a hang fails the test instead of blocking it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const AGENT: &str = env!("CARGO_BIN_EXE_cnilab-agent");

/// Runs the agent with `args` and `--once`; fails the test if it is still
/// running after 20 s. Returns (success, stderr).
fn run_with_deadline(args: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("net.d");
    let bin = dir.path().join("bin");
    let mut child = Command::new(AGENT)
        .args(args)
        .args([
            "--node-name",
            "a",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--once",
        ])
        .arg("--cni-conf-dir")
        .arg(&conf)
        .arg("--cni-bin-dir")
        .arg(&bin)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent runs");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cnilab-agent {args:?} hung (killed after 20 s)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
    }
    assert!(
        !conf.exists(),
        "nothing is written when the input is refused"
    );
    (status.success(), err)
}

fn fifo(dir: &Path, name: &str) -> String {
    let path = dir.join(name);
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    path.display().to_string()
}

#[test]
fn a_fifo_as_nodes_file_is_refused_without_hanging() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fifo(dir.path(), "nodes.json");
    let (ok, err) = run_with_deadline(&["--nodes-file", &path]);
    assert!(!ok, "refused");
    assert!(
        err.contains("nodes.json") && err.contains("FIFO"),
        "the error names the file and what it is: {err}"
    );
}

#[test]
fn a_fifo_as_netns_is_refused_without_hanging() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = dir.path().join("nodes.json");
    std::fs::write(
        &nodes,
        r#"[{"name":"a","internalIP":"10.250.0.1","podCIDRs":["10.244.1.0/24"]}]"#,
    )
    .expect("write");
    let path = fifo(dir.path(), "ns");
    let (ok, err) = run_with_deadline(&[
        "--netns",
        &path,
        "--nodes-file",
        nodes.to_str().expect("utf-8"),
    ]);
    assert!(!ok, "refused");
    assert!(
        err.contains("--netns") && err.contains("FIFO"),
        "the error says why: {err}"
    );
}

#[test]
fn a_regular_file_as_netns_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = dir.path().join("nodes.json");
    std::fs::write(&nodes, "[]").expect("write");
    let (ok, err) = run_with_deadline(&[
        "--netns",
        nodes.to_str().expect("utf-8"),
        "--nodes-file",
        nodes.to_str().expect("utf-8"),
    ]);
    assert!(!ok, "refused");
    assert!(err.contains("not a network namespace"), "{err}");
}

#[test]
fn a_bad_cidr_in_the_nodes_file_names_the_node_and_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = dir.path().join("nodes.json");
    std::fs::write(
        &nodes,
        r#"[{"name":"a","internalIP":"10.250.0.1","podCIDRs":["10.244.1.0/24"]},
            {"name":"node2","internalIP":"10.250.0.2","podCIDRs":["10.244.2.0/33"]}]"#,
    )
    .expect("write");
    let (ok, err) = run_with_deadline(&["--nodes-file", nodes.to_str().expect("utf-8")]);
    assert!(!ok, "refused");
    assert!(
        err.contains("\"node2\"") && err.contains("podCIDRs") && err.contains("10.244.2.0/33"),
        "{err}"
    );
    assert!(!err.contains("untagged enum"), "{err}");
}
