//! Root tests of `cnilab lab` and `cnilab scenario`, through the real CLI:
//! labs pass, every shipped scenario fails with its diagnosis and passes
//! after the heal, and nothing is left behind (after a run, a failed run
//! and Ctrl-C).

use cnilab_harness::lab::checks::GROUPS;
use cnilab_tests::{host_untouched, require_root, workspace_bin};
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cnilab(args: &[&str]) -> Output {
    require_root();
    Command::new(workspace_bin("cnilab"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("cnilab runs")
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
    let prefix = format!("cnilab-{pid}-");
    std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with(&prefix))
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
    let mut child = {
        require_root();
        Command::new(workspace_bin("cnilab"))
            .args(["lab", "run", "--format", "json"])
            .current_dir(repo())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cnilab runs")
    };
    let pid = child.id();
    let status = child.wait().expect("wait");
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().expect("stdout"), &mut stdout)
        .expect("read");
    assert!(status.success(), "lab run failed: {stdout}");
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
    assert!(
        leftovers_of(pid).is_empty(),
        "namespaces left: {:?}",
        leftovers_of(pid)
    );
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

#[test]
fn reference_plugins_pass_a_two_node_lab() {
    let _host = host_untouched();
    let out = cnilab(&["lab", "run", "--topology", "lab/topologies/reference.toml"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("/usr/lib/cni"));
}

#[test]
fn agent_routed_lab_passes() {
    let _host = host_untouched();
    let out = cnilab(&["lab", "run", "--topology", "lab/topologies/agent.toml"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("routing Agent"));
}

#[test]
fn failed_run_reports_and_cleans_up() {
    let _host = host_untouched();
    // No plugin binaries in that directory: the first ADD fails.
    let empty = tempfile::tempdir().expect("tmp");
    let child = {
        require_root();
        Command::new(workspace_bin("cnilab"))
            .args([
                "lab",
                "run",
                "--plugin-dir",
                empty.path().to_str().expect("utf8"),
            ])
            .current_dir(repo())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runs")
    };
    let pid = child.id();
    let out = child.wait_with_output().expect("wait");
    assert!(!out.status.success());
    assert!(
        text(&out).contains("cnilab-bridge"),
        "names the missing plugin: {}",
        text(&out)
    );
    assert!(
        leftovers_of(pid).is_empty(),
        "namespaces left: {:?}",
        leftovers_of(pid)
    );
}

#[test]
fn ctrl_c_removes_the_lab() {
    let _host = host_untouched();
    require_root();
    let mut child = Command::new(workspace_bin("cnilab"))
        .args(["lab", "run", "--nodes", "3", "--pods-per-node", "30"])
        .current_dir(repo())
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
    assert!(
        leftovers_of(pid).is_empty(),
        "namespaces left: {:?}",
        leftovers_of(pid)
    );
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
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuite", "{xml}");
    assert_eq!(
        (root.attribute("tests"), root.attribute("failures")),
        (Some("2"), Some("1")),
        "{xml}"
    );
    let cases: Vec<(&str, bool)> = root
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
