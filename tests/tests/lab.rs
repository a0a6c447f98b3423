//! Root tests of `cnilab lab` and `cnilab scenario`, through the real CLI:
//! labs pass, every shipped scenario fails with its diagnosis and passes
//! after the heal, and nothing is left behind (after a run, a failed run
//! and Ctrl-C).

use cnilab_harness::lab::checks::GROUPS;
use cnilab_harness::lab::{self, base, built};
use cnilab_harness::report::Rendered;
use cnilab_tests::{host_untouched, require_root, workspace_bin, StandingLab};
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
#[case::agent_routed_lab_passes("lab/topologies/agent.toml", "routes by the agent")]
fn shipped_topology_passes(#[case] topology: &str, #[case] shows: &str) {
    let _host = host_untouched();
    let out = cnilab(&["lab", "run", "--topology", topology]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(shows), "{}", text(&out));
}

/// Dual-stack and IPv6-only labs: every group is probed in each family the
/// pods have (ICMPv6, TCP and UDP over IPv6, DF at the MTU), over an IPv6
/// or dual-stack underlay, and every probe passes.
#[rstest]
#[case::dual_stack("lab/topologies/dual-stack.toml", &["IPv4", "IPv6"])]
#[case::ipv6_only("lab/topologies/ipv6-only.toml", &["IPv6"])]
#[case::dual_stack_agent_routed("lab/topologies/dual-stack-agent.toml", &["IPv4", "IPv6"])]
fn every_address_family_is_probed(#[case] topology: &str, #[case] families: &[&str]) {
    let _host = host_untouched();
    let out = cnilab(&["lab", "run", "--topology", topology, "-o", "json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    let groups = report["groups"].as_array().expect("groups");
    let names: Vec<&str> = groups.iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(names, GROUPS, "every check group ran: {groups:?}");
    for g in groups {
        let seen: Vec<&str> = g["families"]
            .as_array()
            .expect("families")
            .iter()
            .filter_map(|f| f["family"].as_str())
            .collect();
        assert_eq!(seen, families, "{g}");
        for f in g["families"].as_array().expect("families") {
            assert!(f["probes"].as_u64().unwrap_or(0) > 0, "{g}");
            assert_eq!(f["probes"], f["passed"], "{g}");
        }
    }
    let matrices: Vec<&str> = report["matrix"]
        .as_array()
        .expect("matrix")
        .iter()
        .filter_map(|m| m["family"].as_str())
        .collect();
    assert_eq!(matrices, families);
    // The table names the family on every group line.
    let table = cnilab(&["lab", "run", "--topology", topology]);
    assert!(table.status.success(), "{}", text(&table));
    for line in text(&table).lines().filter(|l| l.contains("probes passed")) {
        assert!(line.contains("IPv6"), "{line}");
    }
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

#[rstest]
#[case::l2(&["lab", "run", "--nodes", "3", "--pods-per-node", "30"])]
#[case::nat_shape(&["lab", "run", "--shape", "nat", "--nodes", "3", "--pods-per-node", "30"])]
#[case::routed_vxlan_service(&["lab", "run", "--shape", "routed", "--vxlan", "--service", "--nodes", "3", "--pods-per-node", "30"])]
fn ctrl_c_removes_the_lab(#[case] args: &[&str]) {
    let _host = host_untouched();
    let mut child = cnilab_command(args)
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

/// `lab up --name NAME` with one node and one pod; `lab down` on drop.
fn up_one_node_lab(name: &str) -> StandingLab {
    let guard = StandingLab(name.to_string());
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

/// A standing lab one of whose namespaces was deleted by hand: `lab check`
/// says which is gone and exits 2, and removes nothing of the rest (the
/// namespaces it had reopened before it met the missing one stay, like
/// those after it); `lab status` names the missing one and `lab down`
/// removes the rest.
#[test]
fn a_check_of_a_lab_missing_a_namespace_removes_nothing() {
    let name = format!("m{}", std::process::id());
    let guard = StandingLab(name.clone());
    let up = cnilab(&[
        "lab",
        "up",
        "--name",
        &name,
        "--nodes",
        "2",
        "--pods-per-node",
        "2",
    ]);
    assert!(up.status.success(), "{}", text(&up));
    let gone = format!("cnilab-lab-{name}-node2-pod1");
    let del = Command::new("ip")
        .args(["netns", "delete", &gone])
        .output()
        .expect("ip runs");
    assert!(del.status.success(), "{}", text(&del));
    let rest: Vec<String> = [
        "switch",
        "external",
        "node1",
        "node1-pod0",
        "node1-pod1",
        "node2",
        "node2-pod0",
    ]
    .iter()
    .map(|n| format!("cnilab-lab-{name}-{n}"))
    .collect();
    for ns in &rest {
        assert!(netns_exists(ns), "{ns} is up");
    }
    let check = cnilab(&["lab", "check", "--name", &name]);
    assert_eq!(check.status.code(), Some(2), "{}", text(&check));
    assert!(
        text(&check).contains(&gone) && text(&check).contains("lab status --name"),
        "names what is gone, and how to see the rest: {}",
        text(&check)
    );
    for ns in &rest {
        assert!(
            netns_exists(ns),
            "{ns} was removed by a `lab check` that failed: {}",
            text(&check)
        );
    }
    let status = cnilab(&["lab", "status", "--name", &name]);
    assert!(
        text(&status).contains("MISSING") && text(&status).contains(&gone),
        "{}",
        text(&status)
    );
    drop(guard);
    for ns in rest.iter().chain([&gone]) {
        assert!(!netns_exists(ns), "{ns} is removed by lab down");
    }
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

/// `cnilab-lab-X-node1-pod5` is lab `X-node1`'s node `pod5` and, read the
/// other way, lab `X`'s node1 pod 5. `lab down X` must remove only what lab
/// X recorded as its own, never the other lab's namespace.
#[test]
fn lab_down_never_removes_a_namespace_another_lab_owns() {
    let short = format!("o{}", std::process::id());
    let other = format!("{short}-node1");
    let dir = tempfile::tempdir().expect("tmp");
    let topo = dir.path().join("pod5.toml");
    std::fs::write(
        &topo,
        "name = \"pod5\"\nrouting = \"static\"\nunderlay = \"10.250.0.0/24\"\npods_per_node = 1\n\n\
         [[node]]\nname = \"pod5\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n",
    )
    .expect("write topology");
    let _other_guard = StandingLab(other.clone());
    let up = cnilab(&[
        "lab",
        "up",
        "--name",
        &other,
        "--topology",
        topo.to_str().expect("utf-8"),
    ]);
    assert!(up.status.success(), "{}", text(&up));
    let contested = format!("cnilab-lab-{other}-pod5");
    assert!(netns_exists(&contested), "{contested} is up");

    let _short_guard = up_one_node_lab(&short);
    let down = cnilab(&["lab", "down", "--name", &short]);
    assert!(down.status.success(), "{}", text(&down));
    assert!(
        !netns_exists(&format!("cnilab-lab-{short}-node1")),
        "{short} is down"
    );
    assert!(
        netns_exists(&contested),
        "{contested} of lab {other} was removed by `lab down --name {short}`: {}",
        text(&down)
    );
    let status = cnilab(&["lab", "status", "--name", &other]);
    assert!(
        status.status.success() && !text(&status).contains("MISSING"),
        "{}",
        text(&status)
    );
}

/// Like `kind delete cluster` of a cluster that is gone: a second
/// `lab down` exits 0 and says there was nothing to remove — and removes
/// nothing, not even a namespace that merely has the lab's name shape
/// (the lab never recorded creating it).
#[test]
fn a_second_lab_down_exits_0_and_removes_nothing() {
    let _host = host_untouched();
    let name = format!("g{}", std::process::id());
    let stranger = format!("cnilab-lab-{name}-switch");
    let add = Command::new("ip")
        .args(["netns", "add", &stranger])
        .output()
        .expect("ip netns add");
    assert!(add.status.success(), "{}", text(&add));
    let first = cnilab(&["lab", "down", "--name", &name]);
    let second = cnilab(&["lab", "down", "--name", &name]);
    let kept = netns_exists(&stranger);
    let _ = Command::new("ip")
        .args(["netns", "del", &stranger])
        .output();
    for out in [&first, &second] {
        assert_eq!(out.status.code(), Some(0), "{}", text(out));
        assert!(
            text(out).contains(&format!("lab {name} is not up")),
            "{}",
            text(out)
        );
    }
    assert!(kept, "a namespace lab {name} never recorded was removed");
    let bad = cnilab(&["lab", "down", "--name", "no/such"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
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
    let _guard = StandingLab(name.clone());
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
) -> (tempfile::TempDir, cnilab_harness::lab::built::Lab) {
    let topo = cnilab_harness::lab::Topology::generated(nodes, pods).expect("topology");
    lab_of(topo)
}

/// A lab of `topo` built by this test process with the bundled plugin.
fn lab_of(
    topo: cnilab_harness::lab::Topology,
) -> (tempfile::TempDir, cnilab_harness::lab::built::Lab) {
    use cnilab_harness::lab::{built::Lab, UpOptions};
    require_root();
    let run = tempfile::tempdir().expect("run dir");
    let bin = workspace_bin("cnilab-bridge");
    let opts = UpOptions {
        plugin_dir: bin.parent().map(|d| d.display().to_string()),
        persistent: None,
        run_dir: run.path().to_path_buf(),
        ..Default::default()
    };
    (run, Lab::up(topo, opts).expect("lab up"))
}

/// Pins a wrong MAC for `address` in node `i`'s neighbour table (PERMANENT:
/// no ARP traffic may change it).
fn pin_wrong_mac(lab: &cnilab_harness::lab::built::Lab, i: usize, address: &str) {
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
fn failing_cross_node_check(lab: built::Lab, id: &str, line: &str) -> lab::report::Report {
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
    let node1 = lab.nodes[0].ns.name().to_string();
    // The fix: the entry flushed (`nud all`: this one was pinned), so
    // node1 resolves node2's address again.
    let report = assert_fixed_in(
        lab,
        "stale-neighbour",
        &["pod-to-pod/cross-node"],
        &["maps node2's address 10.250.0.2 to MAC 02:00:00:00:00:01"],
        |_| {
            ip_in(
                &node1,
                &["neigh", "flush", "to", "10.250.0.2", "nud", "all"],
            )
        },
    );
    assert_eq!(
        report.diagnosis_ids(),
        vec!["stale-neighbour"],
        "{}",
        report.table()
    );
}

/// A failed probe that no diagnosis rule explains is traced, and the
/// trace's finding is its cause (here the nft rule, by table, chain and
/// handle), never an empty list of causes.
#[test]
fn an_unexplained_failure_is_named_by_the_trace() {
    let (_run, lab) = lab_in_process(2, 1);
    // node1 drops forwarded traffic to node2's pods with a rule in a chain
    // whose policy is accept: no diagnosis rule looks for that.
    base::nft(
        &lab.nodes[0].ns,
        "table inet cnilab_test_drop {\n  chain forward {\n    type filter hook forward priority 0; policy accept;\n    ip daddr 10.244.2.0/24 drop\n  }\n}\n",
    )
    .expect("nft");
    let report = failing_cross_node_check(
        lab,
        "firewall-drop",
        "died at node1: firewall-drop inet cnilab_test_drop forward handle ",
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
#[case("host-gw-across-l3")]
#[case("vagrant-nat-internal-ip")]
#[case("vxlan-mtu-not-reduced")]
#[case("vxlan-fdb-missing-after-rejoin")]
#[case("asymmetric-route-rp-filter")]
#[case("clusterip-dnat-missing")]
#[case("hairpin-off")]
#[case("hairpin-masquerade-missing")]
#[case("ipv6-forwarding-off")]
#[case("calico-proxy-arp-off")]
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

/// `ip -n NS ARGS…` must succeed (a fault made by hand).
fn ip_in(ns: &str, args: &[&str]) {
    let out = Command::new("ip")
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("ip");
    assert!(
        out.status.success(),
        "ip -n {ns} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A sysctl written inside node `i`'s namespace.
fn node_sysctl(lab: &built::Lab, i: usize, key: &str, value: &str) {
    cnilab_net::netns::write_sysctl(Some(lab.nodes[i].ns.file()), key, value).expect("sysctl");
}

/// Checks `groups`, tears the lab down, and returns the report, which must
/// have failed with the diagnosis `id` whose message contains every `part`.
fn failing_check_with(
    lab: built::Lab,
    groups: &[&str],
    id: &str,
    parts: &[&str],
) -> lab::report::Report {
    let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
    let report = lab::check(&lab, &groups, false).expect("check");
    lab.down();
    assert_failed_with(report, id, parts)
}

/// [`failing_check_with`], then the fix the registry of causes gives for
/// `id` (`cnilab lab causes ID`) applied by hand in `fix`: the same groups
/// pass again. The registry names the tests that call this as the proof
/// of its fix.
fn assert_fixed_in(
    lab: built::Lab,
    id: &str,
    groups: &[&str],
    parts: &[&str],
    fix: impl FnOnce(&built::Lab),
) -> lab::report::Report {
    assert!(
        cnilab_harness::connectivity::causes::find(id).is_some(),
        "{id} is not a declared cause"
    );
    let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
    let before = lab::check(&lab, &groups, false).expect("check");
    fix(&lab);
    let namespaces: Vec<String> = lab
        .nodes
        .iter()
        .flat_map(|n| std::iter::once(&n.ns).chain(n.pods.iter().map(|p| &p.ns)))
        .map(|ns| ns.name().to_string())
        .collect();
    cnilab_tests::settle_neighbours(&namespaces);
    let after = lab::check(&lab, &groups, false).expect("check");
    lab.down();
    let report = assert_failed_with(before, id, parts);
    assert!(after.passed(), "after the fix of {id}:\n{}", after.table());
    report
}

/// `report` failed with the diagnosis `id`, whose message contains every
/// one of `parts`.
fn assert_failed_with(
    report: lab::report::Report,
    id: &str,
    parts: &[&str],
) -> lab::report::Report {
    let table = report.table();
    assert!(!report.passed(), "{table}");
    let found = report
        .failures
        .iter()
        .flat_map(|f| &f.diagnoses)
        .any(|d| d.id == id && parts.iter().all(|p| d.message.contains(p)));
    assert!(found, "no {id} naming {parts:?}:\n{table}");
    report
}

/// A node whose pod bridge is down (`ip link set cnilab0 down`).
#[test]
fn a_bridge_that_is_down_is_diagnosed() {
    let (_run, lab) = lab_in_process(2, 2);
    ip_in(lab.nodes[0].ns.name(), &["link", "set", "cnilab0", "down"]);
    assert_fixed_in(
        lab,
        "bridge-down",
        &["pod-to-pod"],
        &["node1: bridge cnilab0 is down", "2 pod port(s)"],
        |lab| ip_in(lab.nodes[0].ns.name(), &["link", "set", "cnilab0", "up"]),
    );
}

/// Same-node pod traffic crosses FORWARD when br_netfilter is on, and a
/// FORWARD policy DROP kills it.
#[test]
fn br_netfilter_forward_drop_between_same_node_pods_is_diagnosed() {
    let (_run, lab) = lab_in_process(1, 2);
    node_sysctl(&lab, 0, "net/bridge/bridge-nf-call-iptables", "1");
    base::nft(
        &lab.nodes[0].ns,
        "table ip cnilab_test_filter {\n  chain FORWARD {\n    type filter hook forward priority 0; policy drop;\n  }\n}\n",
    )
    .expect("nft");
    // The fix: the pod CIDR accepted in FORWARD (the drop policy stays).
    let accept = "add rule ip cnilab_test_filter FORWARD ip saddr 10.244.0.0/16 accept\n";
    assert_fixed_in(
        lab,
        "br-netfilter-forward-drop",
        &["pod-to-pod/same-node"],
        &[
            "node1: net.bridge.bridge-nf-call-iptables = 1",
            "chain FORWARD",
        ],
        |lab| base::nft(&lab.nodes[0].ns, accept).expect("nft"),
    );
}

/// node2 gets a second uplink (eth1, 10.250.0.102), node1 routes node2's
/// pods via that address, and node2 filters strictly on eth1 only (all = 0,
/// eth0 = 0): the packets enter on eth1 but the route back leaves via eth0.
/// The diagnosis names eth1 and the effective value; the route via node2's
/// own second address is not called stale.
#[test]
fn rp_filter_on_the_ingress_interface_is_diagnosed_and_a_second_address_is_not_stale() {
    // Two pods a node: two source addresses, one cause.
    let (_run, lab) = lab_in_process(2, 2);
    let switch = lab.switch.name().to_string();
    let node2 = lab.nodes[1].ns.name().to_string();
    ip_in(
        &switch,
        &[
            "link", "add", "p-node2b", "type", "veth", "peer", "name", "eth1", "netns", &node2,
        ],
    );
    ip_in(
        &switch,
        &["link", "set", "p-node2b", "master", "underlay", "up"],
    );
    ip_in(&node2, &["addr", "add", "10.250.0.102/24", "dev", "eth1"]);
    ip_in(&node2, &["link", "set", "eth1", "up"]);
    node_sysctl(&lab, 1, "net/ipv4/conf/all/arp_ignore", "1");
    node_sysctl(&lab, 1, "net/ipv4/conf/all/rp_filter", "0");
    node_sysctl(&lab, 1, "net/ipv4/conf/eth0/rp_filter", "0");
    node_sysctl(&lab, 1, "net/ipv4/conf/eth1/rp_filter", "1");
    ip_in(
        lab.nodes[0].ns.name(),
        &["route", "replace", "10.244.2.0/24", "via", "10.250.0.102"],
    );
    let report = failing_check_with(
        lab,
        &["pod-to-pod/cross-node"],
        "rp-filter",
        &[
            "node2 drops packets",
            "arriving on eth1",
            "rp_filter on eth1 is 1",
            "leaves via eth0",
        ],
    );
    assert!(
        !report.diagnosis_ids().contains(&"stale-route"),
        "{}",
        report.table()
    );
    assert_one_cause(&report, "rp-filter");
}

/// One cause is one line: the failures a diagnosis `id` explains group
/// into exactly one cause, however many sources they came from.
fn assert_one_cause(report: &lab::report::Report, id: &str) {
    let causes = cnilab_harness::connectivity::summary::causes(&report.failures);
    let lines: Vec<&str> = causes
        .iter()
        .filter(|c| c.id == id)
        .map(|c| c.message.as_str())
        .collect();
    assert_eq!(lines.len(), 1, "{id}: {lines:#?}\n{}", report.table());
}

/// node1 masquerades all pod traffic (the scenario's fault) next to the
/// plugin's correct rule: one line, naming the faulty rule's table and
/// chain, not the correct rule.
#[test]
fn masquerade_too_broad_names_the_one_rule_at_fault() {
    let (_run, lab) = lab_in_process(2, 2);
    base::nft(
        &lab.nodes[0].ns,
        "table ip cnilab_test_masq {\n  chain postrouting {\n    type nat hook postrouting priority srcnat - 10; policy accept;\n    ip saddr { 10.244.0.0/16 } oifname \"eth0\" masquerade\n  }\n}\n",
    )
    .expect("nft");
    let report = failing_check_with(
        lab,
        &["pod-to-pod/cross-node"],
        "masquerade-too-broad",
        &[
            "node1",
            "table ip cnilab_test_masq chain postrouting",
            "ip saddr 10.244.0.0/16 oifname \"eth0\" masquerade",
        ],
    );
    assert_one_cause(&report, "masquerade-too-broad");
    let cause = &cnilab_harness::connectivity::summary::causes(&report.failures)
        .into_iter()
        .find(|c| c.id == "masquerade-too-broad")
        .expect("cause");
    assert!(
        !cause.message.contains("daddr !="),
        "the correct rule is named too: {}",
        cause.message
    );
}

/// Three nodes; node1 routes node2's pods via node3, which forwards them
/// (redirects off, so node1 keeps the detour).
fn detour_lab() -> (tempfile::TempDir, built::Lab) {
    let (run, lab) = lab_in_process(3, 1);
    for key in ["all", "default", "eth0"] {
        node_sysctl(&lab, 2, &format!("net/ipv4/conf/{key}/send_redirects"), "0");
    }
    ip_in(
        lab.nodes[0].ns.name(),
        &["route", "replace", "10.244.2.0/24", "via", "10.250.0.3"],
    );
    (run, lab)
}

/// A route through a third node works, so it is no failure, but it is
/// wrong: a WARN naming the three nodes.
#[test]
fn a_detour_through_a_third_node_is_a_warning() {
    let (_run, lab) = detour_lab();
    let groups = vec!["pod-to-pod/cross-node".to_string()];
    let report = lab::check(&lab, &groups, false).expect("check");
    lab.down();
    let table = report.table();
    assert!(report.passed(), "{table}");
    assert_eq!(report.warnings.len(), 1, "{table}");
    let w = &report.warnings[0];
    assert_eq!(w.id, "detour");
    assert!(
        w.message
            .starts_with("node1 reaches node2's podCIDR 10.244.2.0/24 via node3 (10.250.0.3)"),
        "{table}"
    );
    assert!(table.contains("WARN detour"), "{table}");
}

/// The detour makes node3 see only one direction of each TCP connection:
/// conntrack calls the handshake's ACK INVALID, and a `ct state invalid
/// drop` rule on node3 drops it. The counters name node3 and the rule.
#[test]
fn conntrack_invalid_drops_are_diagnosed_from_the_counters() {
    let (_run, lab) = detour_lab();
    base::nft(
        &lab.nodes[2].ns,
        "table inet cnilab_test_ct {\n  chain forward {\n    type filter hook forward priority -10; policy accept;\n    ct state invalid counter drop\n  }\n}\n",
    )
    .expect("nft");
    failing_check_with(
        lab,
        &["pod-to-pod/cross-node"],
        "conntrack-invalid",
        &[
            "node3 drops conntrack INVALID packets",
            "table inet cnilab_test_ct chain forward",
        ],
    );
}

/// A pod without a default route (deleted by hand) gets a diagnosis that
/// names that pod (not "pods on node1": its neighbour still has the route)
/// and its routes.
#[test]
fn a_pod_without_a_default_route_is_diagnosed() {
    let (_run, lab) = lab_in_process(2, 2);
    let pod = lab.nodes[0].pods[0].ns.name().to_string();
    ip_in(&pod, &["route", "del", "default"]);
    // The fix: the default route the plugin gives (via the pods' gateway).
    let report = assert_fixed_in(
        lab,
        "pod-no-route",
        &["pod-to-pod"],
        &[
            "pod node1/node1-pod0 has no route to the cluster CIDR 10.244.0.0/16",
            "IPv4",
            "its routes",
        ],
        |_| ip_in(&pod, &["route", "add", "default", "via", "10.244.1.1"]),
    );
    let text = report.table();
    assert!(!text.contains("pods on node1"), "{text}");
}

/// One deleted route fails many probes: the terminal shows one line per
/// cause with its count and an example, JSON keeps every failed probe.
#[test]
fn failures_are_grouped_by_cause() {
    let (_run, lab) = lab_in_process(2, 4);
    ip_in(lab.nodes[0].ns.name(), &["route", "del", "10.244.2.0/24"]);
    let report = failing_check_with(
        lab,
        &[],
        "missing-route",
        &["node1 has no route to 10.244.2.0/24"],
    );
    let table = report.table();
    let cause_lines: Vec<&str> = table.lines().filter(|l| l.starts_with("  ↳ ")).collect();
    assert!(report.failures.len() >= 20, "{table}");
    assert!(
        !cause_lines.is_empty() && cause_lines.len() <= 3,
        "one line per cause: {cause_lines:?}"
    );
    let counted: usize = report
        .causes
        .iter()
        .filter(|c| c.id == "missing-route")
        .map(|c| c.count)
        .sum();
    assert!(counted >= report.failures.len(), "{:?}", report.causes);
    assert!(table.contains("e.g. [pod-to-pod/cross-node]"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&report.json()).expect("json");
    assert_eq!(
        json["failures"].as_array().map(Vec::len),
        Some(report.failures.len())
    );
    // The matrix shows where: node1 → node2 fails, node1 → node1 does not.
    let m = &report.matrix[0];
    assert!(
        m.cells[0][1].1 < m.cells[0][1].0 && m.cells[0][0].0 == m.cells[0][0].1,
        "{m:?}"
    );
    let html = report.html();
    assert!(
        html.contains("stroke=\"#c00\""),
        "node1 is marked in the drawing"
    );
}

/// Permanent entries for the bulk paths keep the lab working, and the
/// first pod of each node still resolves its gateway through ARP.
#[test]
fn pinned_bulk_paths_pass_and_leave_the_sample_to_arp() {
    let (_run, lab) = lab_in_process(2, 3);
    let pinned = lab::neighbours::pin_bulk(&lab).expect("pin");
    // Per node, pods 1 and 2: gateway + both same-node peers in the pod,
    // and the node's entry for the pod.
    assert_eq!(pinned, 2 * 2 * 4, "entries pinned");
    let permanent = |ns: &str| {
        let out = Command::new("ip")
            .args(["-n", ns, "neigh", "show", "nud", "permanent"])
            .output()
            .expect("ip");
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    assert_eq!(
        permanent(lab.nodes[0].pods[0].ns.name()),
        0,
        "the sample pod"
    );
    assert_eq!(permanent(lab.nodes[0].pods[1].ns.name()), 3);
    let report = lab::check(&lab, &[], false).expect("check");
    lab.down();
    assert!(report.passed(), "{}", report.table());
}

/// A selector that matches no probe of this lab is a usage error (exit 2),
/// never "0/0 checks failed".
#[test]
fn a_selector_that_matches_nothing_exits_2() {
    let _host = host_untouched();
    let out = cnilab(&[
        "lab",
        "run",
        "--topology",
        "lab/topologies/ipv6-only.toml",
        "--only",
        "nonsense",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// An unknown placeholder in a template is refused before anything is built.
#[test]
fn an_unknown_placeholder_exits_2_and_builds_nothing() {
    let _host = host_untouched();
    let dir = tempfile::tempdir().expect("tmp");
    let tmpl = dir.path().join("bad.conflist.tmpl");
    std::fs::write(
        &tmpl,
        "{\"cniVersion\":\"1.0.0\",\"name\":\"x\",\"plugins\":[{\"type\":\"ptp\",\n\"ipam\":{\"type\":\"host-local\",\"subnet\":\"{{podcidr}}\"}}]}\n",
    )
    .expect("write");
    let (pid, out) = cnilab_with_pid(&[
        "lab",
        "run",
        "--plugin-dir",
        "/usr/lib/cni",
        "--config",
        tmpl.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("line 2: unknown placeholder {{podcidr}}"),
        "{}",
        text(&out)
    );
    assert_no_leftovers(pid);
}

/// The bring-your-own-plugin examples of docs/src/cli/lab.md: the reference `ptp`
/// plugin, and a plugin in shell (with host-local from a second directory).
#[rstest]
#[case::reference_ptp("/usr/lib/cni", "lab/configs/lab-ptp.conflist.tmpl")]
#[case::shell_plugin("lab/plugins:/usr/lib/cni", "lab/configs/lab-shell-ptp.conflist.tmpl")]
fn a_plugin_of_your_own_runs_from_flags(#[case] dirs: &str, #[case] config: &str) {
    let _host = host_untouched();
    let out = cnilab(&["lab", "run", "--plugin-dir", dirs, "--config", config]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("All 6 checks"), "{}", text(&out));
}

/// Pinning in both families: on a dual-stack lab every bulk pod gets its
/// IPv4 and its IPv6 gateway and peer pinned, and everything still passes.
#[test]
fn pinned_bulk_paths_work_in_both_families() {
    let mut topo =
        cnilab_harness::lab::Topology::load(&repo().join("lab/topologies/dual-stack.toml"))
            .expect("topology");
    topo.pods_per_node = 3;
    let (_run, lab) = lab_of(topo);
    let pinned = lab::neighbours::pin_bulk(&lab).expect("pin");
    assert_eq!(pinned, 2 * 2 * 4 * 2, "entries pinned");
    let report = lab::check(&lab, &[], false).expect("check");
    lab.down();
    assert!(report.passed(), "{}", report.table());
}

/// Each underlay shape, the VXLAN overlay and the Service, as a standing
/// lab: `lab up` builds it (the shape is there: a default route via the
/// router, the NAT interface, pods with the VXLAN-reduced MTU), `lab check` passes every group, including the shape's
/// own, and `lab down` removes every namespace it made, routers and NAT
/// boxes included.
#[rstest]
#[case::routed(
    "routed",
    "lab/topologies/routed.toml",
    "node1",
    &["route", "show", "default"],
    &["default via 10.250.1.1"],
    "pod-to-pod/cross-node"
)]
#[case::nat(
    "nat",
    "lab/topologies/nat.toml",
    "node1",
    &["-4", "addr", "show", "eth1"],
    &["inet 10.0.2.15/24"],
    "pod-to-external"
)]
#[case::vxlan_service(
    "vxlan",
    "lab/topologies/vxlan.toml",
    "node1-pod0",
    &["link", "show", "eth0"],
    &["mtu 1450"],
    "service/hairpin"
)]
#[case::vxlan_device(
    "vxdev",
    "lab/topologies/vxlan.toml",
    "node2",
    &["-d", "link", "show", "vxlan0"],
    &["mtu 1450", "vxlan id 1", "local 10.250.0.2", "dev eth0", "dstport 8472", "nolearning"],
    "pod-to-pod/cross-node"
)]
fn shape_lab_up_check_down(
    #[case] tag: &str,
    #[case] topology: &str,
    #[case] role: &str,
    #[case] ip_args: &[&str],
    #[case] shows: &[&str],
    #[case] group: &str,
) {
    let _host = host_untouched();
    let name = format!("{tag}{}", std::process::id());
    let up = cnilab(&["lab", "up", "--name", &name, "--topology", topology]);
    assert!(up.status.success(), "{}", text(&up));
    let ns = format!("cnilab-lab-{name}-{role}");
    let evidence = Command::new("ip")
        .args(["-n", &ns])
        .args(ip_args)
        .output()
        .expect("ip runs");
    let check = cnilab(&["lab", "check", "--name", &name]);
    let down = cnilab(&["lab", "down", "--name", &name]);
    for needle in shows {
        assert!(text(&evidence).contains(needle), "{}", text(&evidence));
    }
    assert!(check.status.success(), "{}", text(&check));
    assert!(
        text(&check).contains(&format!("✅ [{group}]")),
        "{}",
        text(&check)
    );
    assert!(down.status.success(), "{}", text(&down));
    let left = namespaces_starting_with(&format!("cnilab-lab-{name}-"));
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

/// IPv6 forwarding off on a node of a dual-stack lab: its IPv6 pod traffic
/// between nodes fails with the IPv6 switch named, IPv4 still passes.
#[test]
fn ipv6_forwarding_off_is_diagnosed() {
    let topo = cnilab_harness::lab::Topology::load(&repo().join("lab/topologies/dual-stack.toml"))
        .expect("topology");
    let (_run, lab) = lab_of(topo);
    node_sysctl(&lab, 0, "net/ipv6/conf/all/forwarding", "0");
    let report = failing_check_with(
        lab,
        &["pod-to-pod/cross-node"],
        "ip-forward-off",
        &["net.ipv6.conf.all.forwarding = 0 on node1"],
    );
    let ipv4 = &report.groups[0].families[0];
    assert_eq!(
        (ipv4.family, ipv4.passed),
        ("IPv4", ipv4.probes),
        "{}",
        report.table()
    );
}

/// An IPv6 pod route via an address that is no node's, in a dual-stack
/// lab: a stale route, named with the owner's IPv6 address (not its IPv4
/// one), while the IPv4 routes stay right.
#[test]
fn a_stale_ipv6_route_in_a_dual_stack_lab_is_diagnosed() {
    let topo = cnilab_harness::lab::Topology::load(&repo().join("lab/topologies/dual-stack.toml"))
        .expect("topology");
    let (_run, lab) = lab_of(topo);
    let node1 = lab.nodes[0].ns.name().to_string();
    ip_in(
        &node1,
        &[
            "-6",
            "route",
            "replace",
            "fd00:10:244:2::/64",
            "via",
            "fd00:10:250::99",
        ],
    );
    failing_check_with(
        lab,
        &["pod-to-pod/cross-node@ipv6"],
        "stale-route",
        &["node1 routes fd00:10:244:2::/64 via fd00:10:250::99 but node2 is fd00:10:250::2"],
    );
}

/// A lab that cannot fit the host's neighbour table even with its bulk
/// paths pinned (enough nodes that the underlay alone, nodes × (nodes - 1)
/// entries, exceeds gc_thresh3: 33 nodes at the default 1024) is refused up
/// front, with the numbers and the remedy, and builds nothing.
#[test]
fn a_lab_too_big_for_the_neighbour_table_is_refused_up_front() {
    let _host = host_untouched();
    let t3: usize = std::fs::read_to_string("/proc/sys/net/ipv4/neigh/default/gc_thresh3")
        .expect("gc_thresh3")
        .trim()
        .parse()
        .expect("a number");
    let nodes = (1..=200).find(|n| n * (n - 1) > t3).unwrap_or_else(|| {
        panic!("gc_thresh3 = {t3}: no lab of at most 200 nodes overflows it; this test cannot run here")
    });
    let nodes = nodes.to_string();
    let (pid, out) = cnilab_with_pid(&["lab", "run", "--nodes", &nodes, "--pods-per-node", "1"]);
    let log = text(&out);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(
        log.contains("does not fit the host's neighbour tables")
            && log.contains("gc_thresh3 = ")
            && log.contains("--tune-host"),
        "{log}"
    );
    assert_no_leftovers(pid);
}
