//! Two pods behind one bridge that answer as one (root): one takes the
//! other's address, or its MAC, by hand with plain `ip`, in a standing
//! lab of 2 nodes with 2 pods each. `lab trace` and `lab check` name the
//! twins at the bridge's node, every failing probe under that one cause;
//! the fix the cause asks for (the pod's own address, or MAC, back) makes
//! `lab check` pass again.

mod trace_common;

use cnilab_tests::{host_untouched, StandingLab as Standing};
use trace_common::{
    address, address_cidr, assert_died, assert_every_failure_is, assert_fixed, flush_neighbours,
    Lab,
};

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
    assert_fixed(&lab, "duplicate-address");
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
    assert_fixed(&lab, "duplicate-mac");
}

/// node2's bridge without its address (no connected route to its pods,
/// and their gateway gone), then with another address than the pods'
/// gateway: both named at node2, every failing probe under the one cause.
#[test]
fn a_bridge_without_the_pods_gateway_is_named() {
    let _host = host_untouched();
    let lab = Standing::sized("twbr", 2, 2, &[]);
    let own = address_cidr(&lab, "node2", "-4", "cnilab0");
    let gateway = own.split('/').next().unwrap_or_default().to_string();
    let other = format!(
        "{}.254/24",
        gateway.rsplit_once('.').map(|(n, _)| n).unwrap_or_default()
    );
    let bridge = |verb: &str, a: &str| {
        lab.sh("node2", "ip", &["addr", verb, a, "dev", "cnilab0"]);
    };
    bridge("del", &own);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "bridge-address-missing", "bridge cnilab0");
    let evidence = t.1["death"]["evidence"].to_string();
    assert!(evidence.contains("holds no address on"), "{evidence}");
    assert_every_failure_is(&lab, "bridge-address-missing", "node2", "bridge cnilab0");
    // The fix: the bridge's gateway address back.
    bridge("add", &own);
    flush_neighbours(&lab);
    assert_fixed(&lab, "bridge-address-missing");
    // Another address on the bridge instead of the pods' gateway, once
    // the pods' entries for the gateway (learned while it answered) are
    // gone.
    bridge("del", &own);
    bridge("add", &other);
    flush_neighbours(&lab);
    let object = format!("address {gateway} on bridge cnilab0");
    let t = lab.trace("node2-pod0", "node1-pod0", &[]);
    assert_died(&t, "node2", "address-missing", &object);
    assert_every_failure_is(&lab, "address-missing", "node2", &object);
    // The fix: the bridge's own address back.
    bridge("del", &other);
    bridge("add", &own);
    flush_neighbours(&lab);
    assert_fixed(&lab, "address-missing");
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
