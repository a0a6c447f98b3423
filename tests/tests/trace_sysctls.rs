//! Per-namespace and per-interface sysctls no diagnosis rule knows (root),
//! set by hand with plain `sysctl` in a standing lab of 2 nodes with 2
//! pods each: `lab trace` and `lab check` name the sysctl where it is set,
//! every failing probe under the one cause, and the fix (the sysctl set
//! back) makes `lab check` pass again.

mod trace_common;

use cnilab_tests::{host_untouched, StandingLab as Standing};
use trace_common::{assert_died, assert_every_failure_is, assert_fixed, Lab};

/// node2-pod0 ignores every ICMP echo: the pings to it arrive and go
/// unanswered; TCP and UDP to it still pass.
#[test]
fn a_pod_that_ignores_echo_requests_is_named() {
    let _host = host_untouched();
    let lab = Standing::sized("scei", 2, 2, &[]);
    let set = |v: &str| {
        let kv = format!("net.ipv4.icmp_echo_ignore_all={v}");
        lab.sh("node2-pod0", "sysctl", &["-qw", &kv]);
    };
    set("1");
    let key = "net/ipv4/icmp_echo_ignore_all";
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2-pod0", "echo-ignored", key);
    assert_every_failure_is(&lab, "echo-ignored", "node2-pod0", key);
    set("0");
    assert_fixed(&lab, "echo-ignored");
}

/// Forwarding off on node2's uplink only (`conf.eth0.forwarding`): what
/// arrives on eth0 for a pod is not forwarded, the pods' masqueraded
/// traffic out included (its answers come back on eth0): the one sysctl
/// named for every path.
#[test]
fn forwarding_off_on_one_interface_is_named_for_the_answers_too() {
    let _host = host_untouched();
    let lab = Standing::sized("scfw", 2, 2, &[]);
    let set = |v: &str| {
        let kv = format!("net.ipv4.conf.eth0.forwarding={v}");
        lab.sh("node2", "sysctl", &["-qw", &kv]);
    };
    set("0");
    let key = "net/ipv4/conf/eth0/forwarding";
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "forwarding-off", key);
    // Out through the masquerade: it arrives, and its answer dies.
    let out = lab.trace("node2-pod0", "node1", &["--proto", "tcp"]);
    assert_eq!(out.1["verdict"], "arrived", "{:#}", out.1);
    assert_eq!(
        out.1["replyDeath"]["cause"], "forwarding-off",
        "{:#}",
        out.1
    );
    assert_eq!(out.1["replyDeath"]["object"], key, "{:#}", out.1);
    assert_every_failure_is(&lab, "forwarding-off", "node2", key);
    set("1");
    assert_fixed(&lab, "forwarding-off");
}
