//! Every report kind the suite can produce cheaply, produced by the real
//! `cnilab` and checked against the schema `cnilab schema KIND` prints
//! (root: most reports run a plugin or a lab).

use cnilab_harness::report::schema;
use cnilab_tests::{host_untouched, require_root, workspace_bin};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cnilab(args: &[&str]) -> Output {
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

/// `out`'s stdout is a JSON report of `kind` that its schema accepts.
fn conforms(kind: &str, out: &Output) -> Result<(), String> {
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{kind}: not JSON ({e}): {}", text(out)))?;
    if doc["kind"] != kind {
        return Err(format!("{kind}: got kind {}", doc["kind"]));
    }
    let errors = schema::check_report(&doc);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{kind}: {errors:#?}"))
    }
}

const PLUGIN: [&str; 4] = [
    "--plugin-dir",
    "/usr/lib/cni",
    "--config",
    "harness/examples/reference-bridge.conflist",
];

#[test]
fn every_report_the_suite_produces_matches_its_schema() {
    require_root();
    let _host = host_untouched();
    let lab = format!("s{}", std::process::id());
    let node1 = format!("cnilab-lab-{lab}-node1");
    let with = |cmd: &[&str], extra: &[&str]| -> Output {
        let mut args: Vec<&str> = cmd.to_vec();
        args.extend(extra);
        args.extend(["-o", "json"]);
        cnilab(&args)
    };
    let mut runs: Vec<(&str, Output)> = vec![
        ("ScenarioList", with(&["scenario", "list"], &[])),
        ("CauseList", with(&["lab", "causes"], &[])),
        (
            "ConformReport",
            with(&["conform", "--only", "E1,C1"], &PLUGIN),
        ),
        ("LifecycleReport", with(&["lifecycle"], &PLUGIN)),
        (
            "SoakReport",
            with(&["soak", "--pods", "2", "--cycles", "2"], &PLUGIN),
        ),
        (
            "BenchReport",
            with(&["bench", "--pods", "2", "--parallel", "1"], &PLUGIN),
        ),
        (
            "LabReport",
            with(&["lab", "run", "--nodes", "2", "--pods-per-node", "1"], &[]),
        ),
        (
            "ScenarioReport",
            with(&["scenario", "run", "missing-route"], &[]),
        ),
        ("SweepReport", with(&["sweep"], &[])),
        (
            "PerfReport",
            with(&["lab", "perf", "--rounds", "2", "--duration", "20"], &[]),
        ),
        (
            "MatrixReport",
            cnilab(
                &[
                    &["matrix", "--kernels", "host", "-o", "json", "--"][..],
                    &["conform", "--only", "E1"],
                    &PLUGIN,
                ]
                .concat(),
            ),
        ),
        (
            "LabStatus",
            with(&["lab", "up", "--name", &lab, "--pods-per-node", "1"], &[]),
        ),
    ];
    // A failing check: failures, causes and diagnoses in the report.
    let _ = Command::new("ip")
        .args([
            "netns",
            "exec",
            &node1,
            "ip",
            "route",
            "del",
            "10.244.2.0/24",
        ])
        .output();
    runs.push(("LabReport", with(&["lab", "check", "--name", &lab], &[])));
    // A trace is no report: its own schema (`cnilab schema trace`).
    let trace = with(
        &["lab", "trace", "--name", &lab, "node1-pod0", "node2-pod0"],
        &[],
    );
    runs.push(("LabStatus", with(&["lab", "status", "--name", &lab], &[])));
    let down = cnilab(&["lab", "down", "--name", &lab]);
    assert!(down.status.success(), "{}", text(&down));
    let failing = &runs[runs.len() - 2].1;
    assert_eq!(
        failing.status.code(),
        Some(1),
        "the route is gone: {}",
        text(failing)
    );
    let mut problems: Vec<String> = runs
        .iter()
        .filter_map(|(kind, out)| conforms(kind, out).err())
        .collect();
    let trace_doc: serde_json::Value = serde_json::from_slice(&trace.stdout)
        .unwrap_or_else(|e| panic!("trace: not JSON ({e}): {}", text(&trace)));
    assert_eq!(
        trace_doc["verdict"], "died",
        "the route is gone: {trace_doc}"
    );
    let trace_schema: serde_json::Value =
        serde_json::from_str(schema::schema("trace").expect("the trace schema")).expect("JSON");
    problems.extend(
        schema::validate(&trace_schema, &trace_doc)
            .into_iter()
            .map(|e| format!("trace: {e}")),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let covered: Vec<&str> = runs.iter().map(|(k, _)| *k).collect();
    for (kind, _) in schema::KINDS {
        assert!(covered.contains(kind), "{kind} is never produced here");
    }
}

/// `cnilab schema KIND` prints the schema the validator uses; an unknown
/// kind is exit 2 naming the kinds.
#[test]
fn schema_prints_each_kind_and_refuses_an_unknown_one() {
    let list = cnilab(&["schema"]);
    assert!(list.status.success(), "{}", text(&list));
    for (kind, text_of) in schema::KINDS.iter().chain(schema::DOCUMENTS) {
        assert!(String::from_utf8_lossy(&list.stdout)
            .lines()
            .any(|l| l == *kind));
        let out = cnilab(&["schema", kind]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), *text_of);
    }
    let bad = cnilab(&["schema", "Nope"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad).contains("LabReport"), "{}", text(&bad));
}
