//! Root test of the sampled probe plan (labs over the probe budget): the
//! budget is lowered with `CNILAB_PROBE_BUDGET` so that a small lab is
//! sampled; the plan says so, and a fault of one pod and a fault of one
//! node pair are still FAILed and named.

use cnilab_tests::{host_untouched, output_text, require_root, workspace_bin, StandingLab};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// `cnilab lab check --name NAME -o json` with the probe budget `budget`
/// (`None`: the default one).
fn check(name: &str, budget: Option<&str>) -> (Output, Value) {
    require_root();
    let mut cmd = Command::new(workspace_bin("cnilab"));
    cmd.args(["lab", "check", "--name", name, "-o", "json"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    match budget {
        Some(b) => cmd.env("CNILAB_PROBE_BUDGET", b),
        None => cmd.env_remove("CNILAB_PROBE_BUDGET"),
    };
    let out = cmd.output().expect("cnilab runs");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, json)
}

/// Every failed probe as (group, from, to).
fn failed(report: &Value) -> Vec<(String, String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    report["failures"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|f| {
                    let spec = &f["outcome"]["spec"];
                    (
                        text(&spec["group"]),
                        text(&spec["from"]["name"]),
                        text(&spec["to"]["name"]),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// 4 nodes of 3 pods: 12 × 4 × 7 = 336 probes of the O(pods × nodes)
/// groups, over a budget of 100, so sampled (each pod pairs with 2 of the 3
/// other nodes). One pod's eth0 down, and node3 without its route to
/// node4's pods: every sampled group still fails for the pod, as a source
/// and as a destination, and the node pair fails in both directions.
#[test]
fn a_sampled_plan_still_fails_and_names_a_pod_fault_and_a_node_pair_fault() {
    let _host = host_untouched();
    let lab = StandingLab::sized("smp", 4, 3, &[]);
    let (full_out, full) = check(&lab.0, None);
    assert!(full_out.status.success(), "{}", output_text(&full_out));
    assert!(
        full.get("sampled").is_none(),
        "a small lab keeps its full plan"
    );
    let (ok_out, ok) = check(&lab.0, Some("100"));
    assert!(ok_out.status.success(), "{}", output_text(&ok_out));
    assert!(
        ok["sampled"]
            .as_str()
            .is_some_and(|s| s.contains("every pod")),
        "the report says the plan is sampled: {}",
        output_text(&ok_out)
    );
    let (all, some) = (full["probes"].as_u64(), ok["probes"].as_u64());
    assert!(some < all && some > Some(0), "{some:?} of {all:?}");

    let pod_ns = format!("cnilab-lab-{}-node2-pod1", lab.0);
    let node3 = format!("cnilab-lab-{}-node3", lab.0);
    let faults: [(&str, &[&str]); 2] = [
        (&pod_ns, &["link", "set", "eth0", "down"]),
        (&node3, &["route", "del", "10.244.4.0/24"]),
    ];
    for (ns, args) in faults {
        let out = Command::new("ip")
            .args(["-n", ns])
            .args(args)
            .output()
            .expect("ip");
        assert!(out.status.success(), "{}", output_text(&out));
    }
    let (bad_out, bad) = check(&lab.0, Some("100"));
    assert_eq!(bad_out.status.code(), Some(1), "{}", output_text(&bad_out));
    let failed = failed(&bad);
    let pod = "node2/node2-pod1";
    for group in ["pod-to-pod/cross-node", "pod-to-node", "node-to-pod"] {
        let from_pod = failed.iter().any(|(g, f, _)| g == group && f == pod);
        let to_pod = failed.iter().any(|(g, _, t)| g == group && t == pod);
        let named = match group {
            "pod-to-node" => from_pod,
            "node-to-pod" => to_pod,
            _ => from_pod && to_pod,
        };
        assert!(named, "{group}: {pod} not named in {failed:?}");
    }
    // node3 → node4's pods, and the replies of node4's pods to node3's.
    let between = |a: &str, b: &str| {
        failed
            .iter()
            .any(|(g, f, t)| g == "pod-to-pod/cross-node" && f.starts_with(a) && t.starts_with(b))
    };
    assert!(between("node3/", "node4/"), "node3 -> node4: {failed:?}");
    assert!(between("node4/", "node3/"), "node4 -> node3: {failed:?}");
    // Nothing else fails: every failure has the pod at one end, or node3
    // (or its pods) and node4 (or its pods) at the two.
    let side = |x: &str| x.starts_with("node3") || x.starts_with("node4");
    assert!(
        failed
            .iter()
            .all(|(_, f, t)| f == pod || t == pod || (side(f) && side(t))),
        "{failed:?}"
    );
}
