//! Root tests of `cnilab lab` and `cnilab scenario`, through the real CLI:
//! labs pass, every shipped scenario fails with its diagnosis and passes
//! after the heal, and nothing is left behind (after a run, a failed run
//! and Ctrl-C).

use cnilab_harness::lab::checks::GROUPS;
use cnilab_harness::lab::{self, build};
use cnilab_tests::{host_untouched, require_root, workspace_bin};
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `cnilab ARGS` from the repository root (needs root: fails without).
fn cnilab_command(args: &[&str]) -> Command {
    require_root();
    let mut cmd = Command::new(workspace_bin("cnilab"));
    cmd.args(args).current_dir(repo());
    cmd
}

fn cnilab(args: &[&str]) -> Output {
    cnilab_command(args).output().expect("cnilab runs")
}

/// Runs `cnilab ARGS` to its end: its pid (to look for what it left) and
/// its output.
fn cnilab_with_pid(args: &[&str]) -> (u32, Output) {
    let child = cnilab_command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cnilab runs");
    let pid = child.id();
    (pid, child.wait_with_output().expect("wait"))
}

/// Fails when a namespace of process `pid` still exists.
fn assert_no_leftovers(pid: u32) {
    let left = leftovers_of(pid);
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Namespaces of process `pid` that still exist.
fn leftovers_of(pid: u32) -> Vec<String> {
    namespaces_starting_with(&format!("cnilab-{pid}-"))
}

fn namespaces_starting_with(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// One `<testsuite>` of a JUnit report, as its attributes claim and as its
/// `<testcase>` children show.
#[derive(Debug)]
struct Suite {
    name: String,
    tests: usize,
    failures: usize,
    cases: usize,
    failed_cases: usize,
}

/// Parses a lab JUnit report: a `<testsuites>` root whose `tests` and
/// `failures` agree with its suites, each suite's counts with its cases.
fn junit_suites(xml: &str) -> Vec<Suite> {
    let doc = roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("JUnit XML: {e}\n{xml}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites", "{xml}");
    let count = |node: roxmltree::Node<'_, '_>, attr: &str| -> usize {
        node.attribute(attr)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("<{}> without a numeric {attr}", node.tag_name().name()))
    };
    let suites: Vec<Suite> = root
        .children()
        .filter(|n| n.has_tag_name("testsuite"))
        .map(|suite| {
            let cases: Vec<_> = suite
                .children()
                .filter(|n| n.has_tag_name("testcase"))
                .collect();
            Suite {
                name: suite.attribute("name").unwrap_or_default().to_string(),
                tests: count(suite, "tests"),
                failures: count(suite, "failures"),
                cases: cases.len(),
                failed_cases: cases
                    .iter()
                    .filter(|c| c.children().any(|n| n.has_tag_name("failure")))
                    .count(),
            }
        })
        .collect();
    assert_eq!(
        count(root, "tests"),
        suites.iter().map(|s| s.cases).sum::<usize>(),
        "{xml}"
    );
    assert_eq!(
        count(root, "failures"),
        suites.iter().map(|s| s.failed_cases).sum::<usize>(),
        "{xml}"
    );
    suites
}

#[test]
fn junit_parsing_sees_a_failure_in_any_suite() {
    let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="x" tests="2" failures="1">
  <testsuite name="a" tests="1" failures="0">
    <testcase name="p1" time="0.1"/>
  </testsuite>
  <testsuite name="b" tests="1" failures="1">
    <testcase name="p2" time="0.0"><failure message="timeout">diag</failure></testcase>
  </testsuite>
</testsuites>"#;
    let suites = junit_suites(xml);
    assert_eq!(suites.len(), 2);
    assert_eq!((suites[0].failures, suites[0].failed_cases), (0, 0));
    assert_eq!((suites[1].failures, suites[1].failed_cases), (1, 1));
}

#[test]
fn default_two_node_lab_passes_and_leaves_nothing() {
    let _host = host_untouched();
    let (pid, out) = cnilab_with_pid(&["lab", "run", "--format", "json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "lab run failed: {stdout}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["nodes"].as_array().map(Vec::len), Some(2));
    assert!(report["failures"].as_array().is_some_and(Vec::is_empty));
    let groups = report["groups"].as_array().expect("groups");
    let names: Vec<&str> = groups.iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(names, GROUPS, "every check group ran: {groups:?}");
    for g in groups {
        assert_eq!(g["probes"], g["passed"], "{g}");
        assert!(g["probes"].as_u64().unwrap_or(0) > 0);
    }
    assert_no_leftovers(pid);
}

#[test]
fn reports_are_written_in_every_format() {
    let _host = host_untouched();
    let dir = tempfile::tempdir().expect("tmp");
    let junit = dir.path().join("lab.xml");
    let html = dir.path().join("lab.html");
    let out = cnilab(&[
        "lab",
        "run",
        "--nodes",
        "2",
        "--pods-per-node",
        "2",
        "--junit",
        junit.to_str().expect("utf8"),
        "--report",
        html.to_str().expect("utf8"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("All 6 checks"), "{}", text(&out));
    let xml = std::fs::read_to_string(&junit).expect("junit");
    let suites = junit_suites(&xml);
    let names: Vec<&str> = suites.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, GROUPS, "one testsuite per check group, in order");
    for suite in &suites {
        assert!(suite.cases > 0, "{suite:?}");
        assert_eq!(suite.tests, suite.cases, "{suite:?}");
        assert_eq!((suite.failures, suite.failed_cases), (0, 0), "{suite:?}");
    }
    let page = std::fs::read_to_string(&html).expect("html");
    assert!(page.contains("<svg") && page.contains("node1") && page.contains("All 6 checks"));
    assert!(
        !page.contains("http://") || page.contains("http://www.w3.org/2000/svg"),
        "no external assets"
    );
}

/// Shipped topologies that must pass, each with a line that shows the
/// topology was really used.
#[rstest]
#[case::reference_plugins_pass_a_two_node_lab("lab/topologies/reference.toml", "/usr/lib/cni")]
#[case::agent_routed_lab_passes("lab/topologies/agent.toml", "routing Agent")]
fn shipped_topology_passes(#[case] topology: &str, #[case] shows: &str) {
    let _host = host_untouched();
    let out = cnilab(&["lab", "run", "--topology", topology]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(shows), "{}", text(&out));
}

#[test]
fn failed_run_reports_and_cleans_up() {
    let _host = host_untouched();
    // No plugin binaries in that directory: the first ADD fails.
    let empty = tempfile::tempdir().expect("tmp");
    let (pid, out) = cnilab_with_pid(&[
        "lab",
        "run",
        "--plugin-dir",
        empty.path().to_str().expect("utf8"),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("cnilab-bridge"),
        "names the missing plugin: {}",
        text(&out)
    );
    assert_no_leftovers(pid);
}

#[test]
fn ctrl_c_removes_the_lab() {
    let _host = host_untouched();
    let mut child = cnilab_command(&["lab", "run", "--nodes", "3", "--pods-per-node", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs");
    let pid = child.id();
    let signal = |sig| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)
            .unwrap_or_else(|e| panic!("{sig:?}: {e}"))
    };
    // Interrupt while the lab is being built. The run is frozen (SIGSTOP)
    // before it is looked at, so the interrupt lands where the test saw it:
    // namespaces made and the run not finished (a finished run could not
    // tell its own cleanup from the interrupt's).
    let deadline = Instant::now() + Duration::from_secs(20);
    while leftovers_of(pid).len() < 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(nix::sys::signal::Signal::SIGSTOP);
    // SIGSTOP takes effect asynchronously: wait for the stopped state.
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|st| st.rsplit(") ").next().map(|r| r.starts_with('T')))
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stopped() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the lab finished before it could be interrupted"
    );
    assert!(!leftovers_of(pid).is_empty(), "the lab started");
    signal(nix::sys::signal::Signal::SIGINT);
    signal(nix::sys::signal::Signal::SIGCONT);
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130), "exits 130 after Ctrl-C");
    assert_no_leftovers(pid);
}

#[test]
fn standing_lab_up_check_status_down() {
    let _host = host_untouched();
    let name = format!("t{}", std::process::id());
    let up = cnilab(&["lab", "up", "--name", &name, "--pods-per-node", "1"]);
    assert!(up.status.success(), "{}", text(&up));
    let ns = format!("cnilab-lab-{name}-node1");
    assert!(
        Path::new("/run/netns").join(&ns).exists(),
        "named namespace for ip netns exec"
    );
    let check = cnilab(&["lab", "check", "--name", &name]);
    let status = cnilab(&["lab", "status", "--name", &name]);
    let down = cnilab(&["lab", "down", "--name", &name]);
    assert!(check.status.success(), "{}", text(&check));
    assert!(text(&status).contains("node1") && !text(&status).contains("MISSING"));
    assert!(down.status.success(), "{}", text(&down));
    assert!(
        !Path::new("/run/netns").join(&ns).exists(),
        "down removes it"
    );
    let again = cnilab(&["lab", "check", "--name", &name]);
    assert!(
        !again.status.success() && text(&again).contains("lab up"),
        "{}",
        text(&again)
    );
}

#[test]
fn bad_topology_is_refused_with_the_line() {
    let _host = host_untouched();
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "name = \"x\"\n[[node]]\nname = \"a\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\nmtu = \"big\"\n").expect("write");
    let out = cnilab(&["lab", "run", "--topology", file.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(2));
    let msg = text(&out);
    assert!(msg.contains("bad.toml") && msg.contains("line 6"), "{msg}");
}

/// `lab down` on a lab that has no state of its own in the way.
struct LabGuard(String);

impl Drop for LabGuard {
    fn drop(&mut self) {
        let _ = Command::new(workspace_bin("cnilab"))
            .args(["lab", "down", "--name", &self.0])
            .current_dir(repo())
            .output();
    }
}

/// `lab up --name NAME` with one node and one pod; `lab down` on drop.
fn up_one_node_lab(name: &str) -> LabGuard {
    let guard = LabGuard(name.to_string());
    let up = cnilab(&[
        "lab",
        "up",
        "--name",
        name,
        "--nodes",
        "1",
        "--pods-per-node",
        "1",
    ]);
    assert!(up.status.success(), "{}", text(&up));
    guard
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

#[test]
fn lab_down_removes_only_the_named_lab() {
    let short = format!("d{}", std::process::id());
    let long = format!("{short}-y");
    let _long_guard = up_one_node_lab(&long);
    let _short_guard = up_one_node_lab(&short);
    let long_ns = [
        format!("cnilab-lab-{long}-switch"),
        format!("cnilab-lab-{long}-external"),
        format!("cnilab-lab-{long}-node1"),
        format!("cnilab-lab-{long}-node1-pod0"),
    ];
    for ns in &long_ns {
        assert!(netns_exists(ns), "{ns} is up");
    }
    let down = cnilab(&["lab", "down", "--name", &short]);
    assert!(down.status.success(), "{}", text(&down));
    assert!(
        !netns_exists(&format!("cnilab-lab-{short}-node1")),
        "{short} is down"
    );
    for ns in &long_ns {
        assert!(
            netns_exists(ns),
            "{ns} of lab {long} survives `lab down --name {short}`: {}",
            text(&down)
        );
    }
    let status = cnilab(&["lab", "status", "--name", &long]);
    assert!(
        status.status.success() && !text(&status).contains("MISSING"),
        "{}",
        text(&status)
    );
    let down = cnilab(&["lab", "down", "--name", &long]);
    assert!(down.status.success(), "{}", text(&down));
    for ns in &long_ns {
        assert!(!netns_exists(ns), "{ns} removed");
    }
}

/// Processes whose command line mentions `needle` (zombies have none).
fn processes_mentioning(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .map(|c| String::from_utf8_lossy(&c).contains(needle))
                        .unwrap_or(false)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Fails unless no process mentions `needle` within 10 s (a SIGKILLed
/// process may still be on its way out).
fn assert_no_process_mentions(needle: &str, context: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_mentioning(needle).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = processes_mentioning(needle);
    assert!(
        left.is_empty(),
        "processes of the killed lab still run: {left:?}: {context}"
    );
}

/// `lab run` with agents, SIGKILLed once an agent runs: `cnilab sweep`
/// leaves no run directory, no agent and no namespace of it, and does not
/// touch a process whose pid sits in a stale pidfile with another start
/// time. Every assertion holds wherever the kill lands.
#[test]
fn sweep_after_a_sigkilled_agent_lab() {
    let mut child = cnilab_command(&["lab", "run", "--topology", "lab/topologies/agent.toml"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs");
    let pid = child.id();
    let run = PathBuf::from(format!("/run/cnilab/run-{pid}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !run.join("node2/agent.pid").exists() && Instant::now() < deadline {
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "lab run ended before its agents started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL");
    child.wait().expect("reap");

    // A decoy: a dead run whose pidfile names a live process that is not ours.
    let mut decoy = Command::new("sleep").arg("60").spawn().expect("sleep");
    let mut gone = Command::new("true").spawn().expect("true");
    let dead = gone.id();
    gone.wait().expect("reap");
    let fake = PathBuf::from(format!("/run/cnilab/run-{dead}"));
    std::fs::create_dir_all(fake.join("node1")).expect("fake run dir");
    let start = cnilab_harness::lab::pidfile::start_time(decoy.id()).expect("running");
    std::fs::write(
        fake.join("node1/agent.pid"),
        format!("{} {}\n", decoy.id(), start + 1),
    )
    .expect("stale pidfile");

    let sweep = cnilab(&["sweep"]);
    let decoy_alive = decoy.try_wait().expect("try_wait").is_none();
    let _ = decoy.kill();
    let _ = decoy.wait();
    let _ = std::fs::remove_dir_all(&fake);
    assert!(sweep.status.success(), "{}", text(&sweep));
    assert!(
        decoy_alive,
        "a process that is not ours was killed: {}",
        text(&sweep)
    );
    assert!(
        !run.exists(),
        "run dir {} left: {}",
        run.display(),
        text(&sweep)
    );
    assert!(
        !fake.exists() || !decoy_alive,
        "the decoy's dead run dir is removed too"
    );
    assert_no_leftovers(pid);
    assert_no_process_mentions(&format!("/run/cnilab/run-{pid}/"), &text(&sweep));
}

/// `lab up` with agents, SIGKILLed while it builds: whatever moment the
/// kill lands, after `cnilab sweep` (and `lab down` if the lab had already
/// stood) no namespace, no agent and no directory of that lab remain. A
/// standing lab's agents do not die with `lab up`: only their pidfiles,
/// written by each agent before exec, let sweep find and stop them.
#[test]
fn sweep_after_a_sigkilled_lab_up() {
    require_root();
    let name = format!("k{}", std::process::id());
    let _guard = LabGuard(name.clone());
    let mut child = cnilab_command(&[
        "lab",
        "up",
        "--name",
        &name,
        "--topology",
        "lab/topologies/agent.toml",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("runs");
    let dir = PathBuf::from(format!("/run/cnilab/labs/{name}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join("node2/agent.pid").exists() && Instant::now() < deadline {
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    child.wait().expect("reap");
    let needle = format!("/run/cnilab/labs/{name}/");

    let sweep = cnilab(&["sweep"]);
    assert!(sweep.status.success(), "{}", text(&sweep));
    if dir.join("state.json").exists() {
        // The kill came after the lab stood: it is a lab like any other.
        let down = cnilab(&["lab", "down", "--name", &name]);
        assert!(down.status.success(), "{}", text(&down));
    }
    assert!(!dir.exists(), "{} left: {}", dir.display(), text(&sweep));
    let left = namespaces_starting_with(&format!("cnilab-lab-{name}-"));
    assert!(
        left.is_empty(),
        "namespaces left: {left:?}: {}",
        text(&sweep)
    );
    assert_no_process_mentions(&needle, &text(&sweep));
}

/// Hostile topology values: exit 2, the error names field and line, and
/// nothing is created (no namespace, no run directory).
#[rstest]
#[case::probe_timeout_zero("probe_timeout_ms = 0\n", &[], "probe_timeout_ms", "line 1")]
#[case::pods_per_node_zero("pods_per_node = 0\n", &[], "pods_per_node", "line 1")]
#[case::pods_per_node_flag("", &["--pods-per-node", "0"], "pods_per_node", "--pods-per-node")]
#[case::unknown_group("", &["--only", "pod-to-moon"], "pod-to-moon", "the groups are")]
#[case::mtu_576_ipv6("mtu = 576\n", &[], "mtu", "line 1")]
fn hostile_topology_exits_2_and_creates_nothing(
    #[case] head: &str,
    #[case] flags: &[&str],
    #[case] field: &str,
    #[case] place: &str,
) {
    require_root();
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("hostile.toml");
    let v6 = if head.starts_with("mtu") {
        ", \"fd00:244:1::/64\""
    } else {
        ""
    };
    std::fs::write(
        &file,
        format!("{head}[[node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"{v6}]\n"),
    )
    .expect("write");
    let mut args = vec!["lab", "run", "--topology", file.to_str().expect("utf8")];
    args.extend_from_slice(flags);
    let (pid, out) = cnilab_with_pid(&args);
    let msg = text(&out);
    assert_eq!(out.status.code(), Some(2), "{msg}");
    assert!(msg.contains(field) && msg.contains(place), "{msg}");
    assert!(leftovers_of(pid).is_empty(), "nothing created");
    assert!(
        !Path::new(&format!("/run/cnilab/run-{pid}")).exists(),
        "no run dir"
    );
}

#[test]
fn scenario_with_an_unknown_group_exits_2() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "name = \"bad\"\nsummary = \"x\"\n[topology]\n[[topology.node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n[[step]]\ndo = \"check\"\nexpect = \"pass\"\ngroups = [\"pod-to-moon\"]\n",
    )
    .expect("write");
    let out = cnilab(&["scenario", "run", file.to_str().expect("utf8")]);
    let msg = text(&out);
    assert_eq!(out.status.code(), Some(2), "{msg}");
    assert!(
        msg.contains("groups") && msg.contains("line 11") && msg.contains("pod-to-moon"),
        "{msg}"
    );
}

/// A lab built by this test process through the library (its run dir
/// goes with the returned guard).
fn lab_in_process(
    nodes: usize,
    pods: usize,
) -> (tempfile::TempDir, cnilab_harness::lab::build::Lab) {
    use cnilab_harness::lab::{build::Lab, Topology, UpOptions};
    require_root();
    let run = tempfile::tempdir().expect("run dir");
    let bin = workspace_bin("cnilab-bridge");
    let opts = UpOptions {
        plugin_dir: bin.parent().map(|d| d.display().to_string()),
        persistent: None,
        run_dir: run.path().to_path_buf(),
        ..Default::default()
    };
    let topo = Topology::generated(nodes, pods).expect("topology");
    (run, Lab::up(topo, opts).expect("lab up"))
}

/// Pins a wrong MAC for `address` in node `i`'s neighbour table (PERMANENT:
/// no ARP traffic may change it).
fn pin_wrong_mac(lab: &cnilab_harness::lab::build::Lab, i: usize, address: &str) {
    let node = lab.nodes[i].ns.name().to_string();
    let pinned = Command::new("ip")
        .args(["-n", &node, "neigh", "replace", address])
        .args([
            "lladdr",
            "02:00:00:00:00:01",
            "dev",
            "eth0",
            "nud",
            "permanent",
        ])
        .status()
        .expect("ip neigh");
    assert!(pinned.success());
}

/// The flake of `podcidr-overlap` (after the heal, "2/12 probes failed;
/// diagnoses: " with none): node1 kept a neighbour entry mapping node2's
/// address to the MAC of the node2 that was removed, because the new node2's
/// gratuitous ARP was lost while its switch port came up. Here the entry is
/// planted PERMANENT, which no gratuitous ARP may override: a node that
/// joins must still be reachable at once.
#[test]
fn a_recreated_node_is_reachable_despite_a_stale_neighbour_entry() {
    let (_run, mut lab) = lab_in_process(2, 2);
    let groups = vec!["pod-to-pod/cross-node".to_string()];
    assert!(lab::check(&lab, &groups, false).expect("check").passed());
    let spec = lab.topo.nodes[1].clone();
    lab.remove_node(&spec.name).expect("remove node2");
    pin_wrong_mac(&lab, 0, &spec.address.to_string());
    lab.add_node(spec, 2).expect("node2 re-created");
    let report = lab::check(&lab, &groups, false).expect("check");
    lab.down();
    assert!(report.passed(), "{}", report.table());
}

/// Checks pod-to-pod/cross-node, tears the lab down, and returns the report
/// of a check that must have failed with exactly the diagnosis `id`, whose
/// table shows `line`.
fn failing_cross_node_check(lab: build::Lab, id: &str, line: &str) -> lab::report::Report {
    let groups = vec!["pod-to-pod/cross-node".to_string()];
    let report = lab::check(&lab, &groups, false).expect("check");
    lab.down();
    let table = report.table();
    assert!(!report.passed(), "{table}");
    assert!(
        report.diagnosis_ids() == vec![id] && table.contains(line),
        "{table}"
    );
    report
}

/// A node that maps a peer's address to a MAC the peer does not have (what
/// a lost gratuitous ARP leaves) is named as the cause.
#[test]
fn a_stale_neighbour_entry_is_diagnosed() {
    let (_run, lab) = lab_in_process(2, 1);
    pin_wrong_mac(&lab, 0, "10.250.0.2");
    failing_cross_node_check(
        lab,
        "stale-neighbour",
        "maps node2's address 10.250.0.2 to MAC 02:00:00:00:00:01",
    );
}

/// A failed probe that no rule explains is reported as "undiagnosed" with
/// the probe, never with an empty list of causes.
#[test]
fn an_unexplained_failure_says_undiagnosed() {
    let (_run, lab) = lab_in_process(2, 1);
    // node1 drops forwarded traffic to node2's pods with a rule in a chain
    // whose policy is accept: no diagnosis rule looks for that.
    build::nft(
        &lab.nodes[0].ns,
        "table inet cnilab_test_drop {\n  chain forward {\n    type filter hook forward priority 0; policy accept;\n    ip daddr 10.244.2.0/24 drop\n  }\n}\n",
    )
    .expect("nft");
    let report = failing_cross_node_check(
        lab,
        "undiagnosed",
        "undiagnosed: no known cause matched: node1/node1-pod0 (10.244.1.",
    );
    for f in &report.failures {
        assert!(!f.diagnoses.is_empty(), "{}", report.table());
    }
}

#[rstest]
#[case("missing-route")]
#[case("stale-route")]
#[case("ip-forward-off")]
#[case("forward-policy-drop")]
#[case("mtu-mismatch")]
#[case("masquerade-missing")]
#[case("masquerade-too-broad")]
#[case("podcidr-overlap")]
#[case("agent-node-joins-late")]
#[case("agent-missed-node")]
fn shipped_scenario_behaves_as_written(#[case] name: &str) {
    let _host = host_untouched();
    let file = format!("lab/scenarios/{name}.toml");
    let out = cnilab(&["scenario", "run", &file]);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains(&format!("PASS scenario {name}")), "{log}");
    // Each scenario must have failed with its diagnosis before the heal,
    // unless it is one that expects the cluster to cope.
    if !name.starts_with("agent-node") {
        assert!(log.contains("expect fail"), "{log}");
    }
}

#[test]
fn every_shipped_scenario_is_tested() {
    let mut shipped: Vec<String> = std::fs::read_dir(repo().join("lab/scenarios"))
        .expect("scenarios")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".toml"))
                .map(str::to_string)
        })
        .collect();
    shipped.sort();
    let source = include_str!("lab.rs");
    for name in &shipped {
        assert!(
            source.contains(&format!("#[case(\"{name}\")]")),
            "scenario {name} has no test case"
        );
    }
    assert!(shipped.len() >= 8);
}

/// The scenario JUnit report names each scenario and marks exactly the one
/// that did not behave as written (here: a copy of `missing-route` whose
/// fault step is gone, so its "expect fail" check passes).
#[test]
fn scenario_junit_marks_the_scenario_that_misbehaved() {
    let _host = host_untouched();
    let dir = tempfile::tempdir().expect("tmp");
    let shipped =
        std::fs::read_to_string(repo().join("lab/scenarios/missing-route.toml")).expect("read");
    let (head, rest) = shipped
        .split_once("[[step]]\ndo = \"fault\"")
        .expect("missing-route has a fault step");
    let after_fault = rest
        .split_once("[[step]]")
        .expect("steps after the fault")
        .1;
    let no_fault = format!("{head}[[step]]{after_fault}")
        .replace("name = \"missing-route\"", "name = \"no-fault\"");
    let broken = dir.path().join("no-fault.toml");
    std::fs::write(&broken, no_fault).expect("write");
    let junit = dir.path().join("scenarios.xml");
    let out = cnilab(&[
        "scenario",
        "run",
        "lab/scenarios/missing-route.toml",
        broken.to_str().expect("utf8"),
        "--junit",
        junit.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let xml = std::fs::read_to_string(&junit).expect("junit");
    let doc = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("{e}\n{xml}"));
    // One writer for every JUnit report: <testsuites> around one <testsuite>.
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites", "{xml}");
    let suites: Vec<_> = root
        .children()
        .filter(|n| n.has_tag_name("testsuite"))
        .collect();
    assert_eq!(suites.len(), 1, "{xml}");
    let suite = suites[0];
    for node in [root, suite] {
        assert_eq!(
            (node.attribute("tests"), node.attribute("failures")),
            (Some("2"), Some("1")),
            "{xml}"
        );
    }
    let cases: Vec<(&str, bool)> = suite
        .children()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|c| {
            let failed = c.children().any(|n| n.has_tag_name("failure"));
            (c.attribute("name").unwrap_or_default(), failed)
        })
        .collect();
    assert_eq!(
        cases,
        vec![("missing-route", false), ("no-fault", true)],
        "{xml}"
    );
}
