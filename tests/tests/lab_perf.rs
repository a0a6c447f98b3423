//! `cnilab lab perf` (root): a standing lab of 2 nodes with 2 pods each
//! and a Service is measured and saved; a `tbf` rate limit put by hand on
//! one pod's host veth (what this kernel has: no netem) is then caught as
//! a regression of the path into that pod. Only what holds for every
//! timing is asserted: a 200 Mbit/s limit on a path that carries
//! gigabits. That the other paths stay green run after run is measured
//! (docs/src/perf.md), not asserted here.

mod trace_common;

use cnilab_harness::report::schema;
use cnilab_tests::{cnilab, host_untouched, StandingLab as Standing};
use serde_json::Value;
use trace_common::Lab;

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "lab perf -o json: {e}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The host end of a pod's veth in its node: the peer index of the pod's
/// eth0 (`eth0@if5`), looked up in the node.
fn host_veth(lab: &Standing, node: &str, pod: &str) -> String {
    let link = lab.sh(pod, "ip", &["-o", "link", "show", "eth0"]);
    let index = link
        .split_once("@if")
        .and_then(|(_, rest)| rest.split(':').next())
        .unwrap_or_else(|| panic!("no peer index in {link:?}"));
    let links = lab.sh(node, "ip", &["-o", "link"]);
    links
        .lines()
        .find_map(|l| {
            let (i, rest) = l.split_once(": ")?;
            (i == index).then(|| {
                rest.split(['@', ':'])
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
        })
        .unwrap_or_else(|| panic!("no link {index} in {node}: {links}"))
}

#[test]
fn a_rate_limit_on_one_pods_veth_is_a_regression_of_the_path_into_it() {
    let _host = host_untouched();
    let lab = Standing::sized("perf", 2, 2, &["--service"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let saved = dir.path().join("base.json");
    let saved_arg = saved.to_string_lossy().to_string();
    let short = ["--rounds", "3", "--duration", "50"];
    let mut args = vec![
        "lab", "perf", "--name", &lab.0, "--save", &saved_arg, "-o", "json",
    ];
    args.extend(short);
    let out = cnilab(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json(&out);
    assert_eq!(schema::check_report(&doc), Vec::<String>::new());
    assert_eq!(doc["verdict"], "measured");
    let paths = doc["labs"][0]["paths"].as_array().expect("paths");
    let names: Vec<&str> = paths.iter().filter_map(|p| p["path"].as_str()).collect();
    assert_eq!(
        names,
        [
            "underlay",
            "same-node",
            "cross-node",
            "node-to-pod",
            "service",
            "external"
        ]
    );
    for p in paths {
        assert!(p.get("error").is_none(), "{p}");
        let cells = p["cells"].as_array().expect("cells");
        assert_eq!(cells.len(), 6, "{p}");
        assert!(
            cells[0]["median"].as_f64().unwrap_or(0.0) > 1e8,
            "{p}: under 100 Mbit/s"
        );
        assert_eq!(cells[0]["samples"].as_array().map(Vec::len), Some(3), "{p}");
        if p["path"] != "underlay" {
            assert!(
                cells[0]["ratio"].as_f64().is_some(),
                "{p}: no ratio to the underlay"
            );
        }
    }
    // The saved file is what --baseline reads.
    let text = std::fs::read_to_string(&saved).expect("saved");
    let again: Value = serde_json::from_str(&text).expect("saved JSON");
    assert_eq!(again["kind"], "PerfReport");

    let veth = host_veth(&lab, "node1", "node1-pod1");
    lab.sh(
        "node1",
        "tc",
        &[
            "qdisc", "add", "dev", &veth, "root", "tbf", "rate", "200mbit", "burst", "64kb",
            "latency", "20ms",
        ],
    );
    let mut args = vec![
        "lab",
        "perf",
        "--name",
        &lab.0,
        "--baseline",
        &saved_arg,
        "-o",
        "json",
    ];
    args.extend(short);
    let out = cnilab(&args);
    lab.sh("node1", "tc", &["qdisc", "del", "dev", &veth, "root"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json(&out);
    assert_eq!(doc["verdict"], "regression");
    let caught = doc["judged"].as_array().expect("judged").iter().any(|j| {
        j["path"] == "same-node" && j["metric"] == "throughput" && j["verdict"] == "regression"
    });
    assert!(
        caught,
        "same-node throughput not judged a regression: {}",
        doc["judged"]
    );
}

/// A baseline that is no perf report, or no file, and a lab of one node
/// are refused before any lab is built: exit 2 and what to do.
#[test]
fn a_baseline_that_is_no_perf_report_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("other.json");
    std::fs::write(&file, r#"{"schemaVersion":2,"kind":"LabReport"}"#).expect("write");
    let out = cnilab(&["lab", "perf", "--baseline", &file.to_string_lossy()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("not a lab perf report") && err.contains("--save"),
        "{err}"
    );
    assert!(!err.contains("🔭"), "a lab was built: {err}");
    // A directory (or a FIFO) is refused before it is read.
    let out = cnilab(&["lab", "perf", "--baseline", &dir.path().to_string_lossy()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("not a regular file") && err.contains("lab perf --save"),
        "{err}"
    );
    let out = cnilab(&["lab", "perf", "--nodes", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("2 nodes"), "{err}");
    assert!(!err.contains("🔭"), "a lab was built: {err}");
}
