//! NAT in the wrong place (root), made by hand with plain `nft` in a
//! standing lab of 2 nodes with 2 pods each: a masquerade on the pods'
//! own node that rewrites what comes in to them, and a DNAT that sends a
//! pod's address to one nobody holds. `lab check` names the node and the
//! rule, every failing probe under the one cause; the rule deleted, it
//! passes again.

mod trace_common;

use cnilab_tests::{host_untouched, StandingLab as Standing};
use trace_common::{address, assert_died, assert_every_failure_is, assert_fixed, Lab};

/// A nat table of the test's own in `role`, with one chain on `hook`.
fn nat_chain(lab: &Standing, role: &str, hook: &str, priority: &str) {
    lab.sh(role, "nft", &["add", "table", "ip", "faulty"]);
    let spec = format!("{{ type nat hook {hook} priority {priority}; }}");
    lab.sh(role, "nft", &["add", "chain", "ip", "faulty", hook, &spec]);
}

/// node2 masquerades everything it sends out of its pods' bridge: the
/// pods see node2's bridge address as every peer's source. Named at
/// node2 (not at the probes' source node, whose rules are correct).
#[test]
fn a_masquerade_on_the_way_in_is_named_at_its_node() {
    let _host = host_untouched();
    let lab = Standing::sized("ntmq", 2, 2, &[]);
    nat_chain(&lab, "node2", "postrouting", "srcnat");
    let rule = [
        "add",
        "rule",
        "ip",
        "faulty",
        "postrouting",
        "oifname",
        "cnilab0",
        "masquerade",
    ];
    lab.sh("node2", "nft", &rule);
    let (code, v) = trace_common::check(&lab);
    assert_eq!(code, Some(1), "{v:#}");
    let causes = v["causes"].as_array().cloned().unwrap_or_default();
    assert_eq!(causes.len(), 1, "one root cause, one entry: {v:#}");
    let message = causes[0]["message"].as_str().unwrap_or_default();
    assert_eq!(causes[0]["id"], "masquerade-too-broad", "{v:#}");
    assert!(message.starts_with("node2 masquerades"), "{message}");
    assert!(
        message.contains("table ip faulty chain postrouting"),
        "{message}"
    );
    lab.sh("node2", "nft", &["delete", "table", "ip", "faulty"]);
    assert_fixed(&lab, "masquerade-too-broad");
}

/// node1 rewrites node2-pod0's address to one in node2's pod subnet that
/// nobody holds: named at node1 as that DNAT, not as the subnet where the
/// packet then went nowhere.
#[test]
fn a_dnat_to_an_address_nobody_holds_is_named_at_its_rule() {
    let _host = host_untouched();
    let lab = Standing::sized("ntdn", 2, 2, &[]);
    let pod = address(&lab, "node2-pod0", "-4", "eth0");
    let nowhere = format!(
        "{}.250",
        pod.rsplit_once('.').map(|(n, _)| n).unwrap_or_default()
    );
    nat_chain(&lab, "node1", "prerouting", "dstnat");
    let rule = [
        "add",
        "rule",
        "ip",
        "faulty",
        "prerouting",
        "ip",
        "daddr",
        &pod,
        "dnat",
        "to",
        &nowhere,
    ];
    lab.sh("node1", "nft", &rule);
    let object = format!("dnat to {nowhere}");
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node1", "dnat-nowhere", &object);
    assert!(
        t.1["reproduce"]
            .to_string()
            .contains("nft -a list chain ip faulty prerouting"),
        "{:#}",
        t.1
    );
    assert_every_failure_is(&lab, "dnat-nowhere", "node1", &object);
    lab.sh("node1", "nft", &["delete", "table", "ip", "faulty"]);
    assert_fixed(&lab, "dnat-nowhere");
}
