//! Two pods behind one bridge that answer as one (root): one takes the
//! other's address, or its MAC, by hand with plain `ip`, in a standing
//! lab of 2 nodes with 2 pods each. `lab trace` and `lab check` name the
//! twins at the bridge's node, every failing probe under that one cause;
//! the fix the cause asks for (the pod's own address, or MAC, back) makes
//! `lab check` pass again.

mod trace_common;

use cnilab_tests::{cnilab, host_untouched, output_text, StandingLab as Standing};
use serde_json::Value;
use trace_common::{address, assert_died, Lab};

/// `lab check -o json`: its exit code and document (one check at a time
/// in this process: its probes time out after 1 s).
fn check(lab: &Standing) -> (Option<i32>, Value) {
    static ONE_CHECK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_CHECK.lock().unwrap_or_else(|e| e.into_inner());
    let out = cnilab(&["lab", "check", "--name", &lab.0, "-o", "json"]);
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", output_text(&out)));
    (out.status.code(), v)
}

/// `lab check` FAILs and every failing probe has the one cause, named at
/// `node` with `object`; no probe is left `undiagnosed`.
fn assert_every_failure_is(lab: &Standing, cause: &str, node: &str, object: &str) {
    let (code, v) = check(lab);
    assert_eq!(code, Some(1), "{v:#}");
    let failures = v["failures"].as_array().cloned().unwrap_or_default();
    assert!(!failures.is_empty(), "{v:#}");
    for f in &failures {
        let ids: Vec<&str> = f["diagnoses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["id"].as_str())
            .collect();
        assert_eq!(ids, [cause], "{f:#}");
        let msg = f["diagnoses"][0]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(&format!("died at {node}")), "{msg}");
        assert!(msg.contains(object), "{msg}");
    }
    let causes: Vec<&str> = v["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(causes, [cause], "one root cause, one entry: {v:#}");
    lab.assert_no_trace_tables();
}

fn assert_check_passes(lab: &Standing) {
    let (code, v) = check(lab);
    assert_eq!(code, Some(0), "{v:#}");
}

fn flush_neighbours(lab: &Standing) {
    lab.sh("node2", "ip", &["neigh", "flush", "dev", "cnilab0"]);
    for pod in ["node2-pod0", "node2-pod1"] {
        lab.sh(pod, "ip", &["neigh", "flush", "dev", "eth0"]);
    }
}

fn mac(lab: &Standing, role: &str) -> String {
    let out = lab.sh(role, "ip", &["-o", "link", "show", "dev", "eth0"]);
    out.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no MAC on {role}/eth0: {out}"))
}

/// node2-pod1 drops its own address and takes node2-pod0's, as a pod
/// configured by hand (or an IPAM that handed one address out twice).
#[test]
fn a_pod_holding_another_pods_address_is_named_at_the_bridge() {
    let _host = host_untouched();
    let lab = Standing::sized("twad", 2, 2, &[]);
    let taken = address(&lab, "node2-pod0", "-4", "eth0");
    let own = address(&lab, "node2-pod1", "-4", "eth0");
    let set = |verb: &str, ip: &str| {
        lab.sh(
            "node2-pod1",
            "ip",
            &["addr", verb, &format!("{ip}/24"), "dev", "eth0"],
        );
    };
    let route = lab.sh("node2-pod1", "ip", &["-4", "route", "show", "default"]);
    let gateway = route
        .split_whitespace()
        .skip_while(|w| *w != "via")
        .nth(1)
        .unwrap_or_else(|| panic!("no default route in node2-pod1: {route}"))
        .to_string();
    let default_route = |verb: &str| {
        lab.sh(
            "node2-pod1",
            "ip",
            &["route", verb, "default", "via", &gateway],
        );
    };
    set("del", &own);
    set("add", &taken);
    default_route("replace");
    let object = format!("address {taken} on bridge cnilab0");
    // To the pod whose address was taken, to the pod known by the address
    // nobody holds now, and from it: the same twins.
    for (from, to) in [
        ("node1-pod0", "node2-pod0"),
        ("node1-pod0", "node2-pod1"),
        ("node2-pod1", "node1-pod0"),
    ] {
        let t = lab.trace(from, to, &[]);
        assert_died(&t, "node2", "duplicate-address", &object);
        let evidence = t.1["death"]["evidence"].as_str().unwrap_or_default();
        for holder in ["node2-pod0/eth0", "node2-pod1/eth0"] {
            assert!(evidence.contains(holder), "{from} → {to}: {evidence}");
        }
        assert!(
            t.1["reproduce"]
                .to_string()
                .contains(&format!("ip neigh show {taken} dev cnilab0")),
            "{:#}",
            t.1
        );
    }
    let missing = lab.trace("node1-pod0", "node2-pod1", &[]);
    let evidence = missing.1["death"]["evidence"].to_string();
    assert!(
        evidence.contains(&format!(
            "node2-pod1 is known by {own}, which it does not hold"
        )),
        "{evidence}"
    );
    assert_every_failure_is(&lab, "duplicate-address", "node2", &object);
    // The fix: the pod's own address back, and the neighbour entries
    // that learned the twin's MAC flushed.
    set("del", &taken);
    set("add", &own);
    default_route("replace");
    flush_neighbours(&lab);
    assert_check_passes(&lab);
}

/// node2-pod1 takes node2-pod0's MAC: the bridge's FDB follows whichever
/// of the two sent last.
#[test]
fn a_pod_with_another_pods_mac_is_named_at_the_bridge() {
    let _host = host_untouched();
    let lab = Standing::sized("twmc", 2, 2, &[]);
    let (theirs, own) = (mac(&lab, "node2-pod0"), mac(&lab, "node2-pod1"));
    let set = |m: &str| {
        lab.sh("node2-pod1", "ip", &["link", "set", "eth0", "address", m]);
    };
    set(&theirs);
    let object = format!("MAC {theirs} on bridge cnilab0");
    let t = lab.trace("node1-pod0", "node2-pod1", &[]);
    assert_died(&t, "node2", "duplicate-mac", &object);
    let evidence = t.1["death"]["evidence"].to_string();
    assert!(evidence.contains("node2-pod0/eth0"), "{evidence}");
    assert_every_failure_is(&lab, "duplicate-mac", "node2", &object);
    // The fix: the pod's own MAC back, and the neighbour entries that
    // learned the twin's MAC flushed.
    set(&own);
    flush_neighbours(&lab);
    assert_check_passes(&lab);
}

/// A correct lab of 2 pods a node: no twins, every trace arrives.
#[test]
fn pods_with_their_own_addresses_and_macs_are_no_twins() {
    let _host = host_untouched();
    let lab = Standing::sized("twok", 2, 2, &[]);
    for to in ["node2-pod0", "node2-pod1"] {
        let t = lab.trace("node1-pod0", to, &[]);
        trace_common::assert_arrived(&t, to);
    }
}
