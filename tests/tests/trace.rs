//! `cnilab lab trace` (root): on standing 2-node labs, each fault is made
//! by hand with plain `ip`, `nft` and `sysctl` in the lab's namespaces (no
//! scenario), and the trace must name the node, the cause and the object;
//! a healthy lab's trace arrives (pod to pod across nodes, pod to node, and
//! node to pod over TCP, on the l2 and the routed shape); no trace leaves
//! an nft table behind.

mod trace_common;

use cnilab_tests::{cnilab, host_untouched, output_text as all, StandingLab as Standing};
use serde_json::Value;
use trace_common::{address, assert_arrived, assert_check_names, assert_died, Lab};

/// A healthy lab: pod to pod across nodes, pod to node, node to pod (TCP)
/// arrive on the l2 and the routed shape, through the expected namespaces;
/// nothing of the trace is left behind.
#[test]
fn a_healthy_lab_trace_arrives_and_leaves_nothing() {
    let _host = host_untouched();
    for (label, extra) in [("trok", &[][..]), ("trrt", &["--shape", "routed"][..])] {
        let lab = Standing::up(label, extra);
        let pod = lab.trace("node1-pod0", "node2-pod0", &[]);
        assert_arrived(&pod, "node2-pod0");
        let crossed: Vec<String> = pod.1["hops"]
            .as_array()
            .map(|h| {
                h.iter()
                    .map(|h| h["namespace"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default();
        for ns in ["node1-pod0", "node1", "switch", "node2"] {
            assert!(
                crossed.iter().any(|c| c == ns),
                "{label}: no hop in {ns}: {crossed:?}"
            );
        }
        if label == "trrt" {
            assert!(crossed.iter().any(|c| c == "router"), "{crossed:?}");
        }
        assert_arrived(&lab.trace("node1-pod0", "node2", &[]), "node2");
        assert_arrived(
            &lab.trace("node2", "node1-pod0", &["--proto", "tcp"]),
            "node1-pod0",
        );
        lab.assert_no_trace_tables();
    }
}

/// A blackhole route to the other node's pod CIDR on node1.
#[test]
fn a_blackhole_route_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("trbh", &[]);
    lab.sh(
        "node1",
        "ip",
        &["route", "replace", "blackhole", "10.244.2.0/24"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node1", "blackhole", "10.244.2.0/24");
    assert_eq!(t.1["death"]["node"], "node1");
}

/// node1's route to node2's pod CIDR is missing.
#[test]
fn a_missing_route_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("trnr", &[]);
    lab.sh("node1", "ip", &["route", "del", "10.244.2.0/24"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node1", "no-route", "10.244.2.2");
    lab.sh(
        "node1",
        "ip",
        &["route", "add", "10.244.2.0/24", "via", "10.250.0.2"],
    );
    trace_common::assert_fixed(&lab, "no-route");
}

/// The host end of node1's pod veth set down.
#[test]
fn a_pods_host_veth_down_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("trvd", &[]);
    let veth = lab.pod_veth("node1");
    lab.sh("node1", "ip", &["link", "set", &veth, "down"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node1", "link-down", &veth);
}

/// Forwarding off on node2 (the receiving node): named per interface.
#[test]
fn forwarding_off_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("trfw", &[]);
    lab.sh(
        "node2",
        "sysctl",
        &["-qw", "net.ipv4.conf.eth0.forwarding=0"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(
        &t,
        "node2",
        "forwarding-off",
        "net/ipv4/conf/eth0/forwarding",
    );
}

/// An nft drop rule in node1's forward chain: table, chain and handle are
/// named from nftables' own trace, and the trace's table is gone after.
#[test]
fn an_nft_drop_rule_is_named_by_table_chain_and_handle() {
    let _host = host_untouched();
    let lab = Standing::up("trnf", &[]);
    lab.sh("node1", "nft", &["add", "table", "ip", "filter"]);
    lab.sh(
        "node1",
        "nft",
        &["add chain ip filter forward { type filter hook forward priority 0; policy accept; }"],
    );
    lab.sh(
        "node1",
        "nft",
        &["add rule ip filter forward ip daddr 10.244.2.0/24 counter drop"],
    );
    let listing = lab.sh(
        "node1",
        "nft",
        &["-a", "list", "chain", "ip", "filter", "forward"],
    );
    let handle = listing
        .lines()
        .find(|l| l.contains("drop"))
        .and_then(|l| l.rsplit("# handle ").next())
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|| panic!("no handle in {listing}"));
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(
        &t,
        "node1",
        "firewall-drop",
        &format!("ip filter forward handle {handle}"),
    );
    assert!(
        t.1["death"]["evidence"]
            .as_str()
            .unwrap_or("")
            .contains("ip daddr 10.244.2.0/24"),
        "{:#}",
        t.1
    );
    lab.assert_no_trace_tables();
}

/// The VXLAN overlay: a healthy trace follows the outer packet to node2's
/// VTEP and the inner one on to the pod; node1's FDB entry for node2's
/// VTEP MAC deleted by hand is named, with the device.
#[test]
fn vxlan_outer_packet_is_followed_and_a_missing_fdb_entry_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("trvx", &["--vxlan"]);
    let ok = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_arrived(&ok, "node2-pod0");
    let hops = ok.1["hops"].to_string();
    assert!(hops.contains("encapsulate to VTEP 10.250.0.2"), "{hops}");
    assert!(hops.contains("outer: bridge underlay"), "{hops}");
    let fdb = lab.sh("node1", "bridge", &["fdb", "show", "dev", "vxlan0"]);
    let entry = fdb
        .lines()
        .find(|l| l.contains("dst 10.250.0.2"))
        .unwrap_or_else(|| panic!("no FDB entry to node2 in {fdb}"));
    let mac = entry
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    lab.sh(
        "node1",
        "bridge",
        &["fdb", "del", &mac, "dev", "vxlan0", "dst", "10.250.0.2"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(
        &t,
        "node1",
        "vxlan-fdb-missing",
        &format!("fdb {mac} dev vxlan0"),
    );
    lab.assert_no_trace_tables();
    lab.sh(
        "node1",
        "bridge",
        &["fdb", "append", &mac, "dev", "vxlan0", "dst", "10.250.0.2"],
    );
    trace_common::assert_fixed(&lab, "vxlan-fdb-missing");
}

/// node2-pod0 stops answering ARP (`ip link set eth0 arp off` in the pod):
/// routing and the firewall let the probe through, and node2's neighbour
/// entry for the pod, left INCOMPLETE or FAILED by the probe, is named.
#[test]
fn a_neighbour_that_never_resolves_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("trnb", &[]);
    lab.sh("node2-pod0", "ip", &["link", "set", "eth0", "arp", "off"]);
    let pod_ip = lab.sh(
        "node2-pod0",
        "ip",
        &["-4", "-o", "addr", "show", "dev", "eth0"],
    );
    let pod_ip = pod_ip
        .split_whitespace()
        .nth(3)
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no address: {pod_ip}"));
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(
        &t,
        "node2",
        "neighbour-failed",
        &format!("neighbour {pod_ip} dev cnilab0"),
    );
    // The fix: the owner answers ARP again.
    lab.sh("node2-pod0", "ip", &["link", "set", "eth0", "arp", "on"]);
    trace_common::assert_fixed(&lab, "neighbour-failed");
}

/// `lab check` on a lab with a blackhole route that no diagnosis rule
/// knows: the failures get the trace's cause (`blackhole`, at node1, the
/// route) instead of `undiagnosed`, with a command that reproduces it.
#[test]
fn lab_check_names_what_no_rule_explains_by_a_trace() {
    let _host = host_untouched();
    let lab = Standing::up("trck", &[]);
    lab.sh(
        "node1",
        "ip",
        &["route", "replace", "blackhole", "10.244.2.0/24"],
    );
    let out = cnilab(&["lab", "check", "--name", &lab.0, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", all(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let flat = v.to_string();
    assert!(flat.contains(r#""id":"blackhole""#), "{v:#}");
    assert!(
        flat.contains("died at node1: blackhole route blackhole 10.244.2.0/24"),
        "{v:#}"
    );
    assert!(flat.contains("cnilab lab trace --name"), "{v:#}");
    // The hop where it died, as `lab trace` shows it (and `scenario run`,
    // which prints the same diagnoses).
    assert!(
        flat.contains("at hop 2: node1 died: blackhole (ip route get 10.244.2."),
        "{v:#}"
    );
    assert!(!flat.contains("undiagnosed"), "{v:#}");
    // One root cause, one entry: every probe the route kills, whatever
    // its pair, protocol or group, counted under it.
    let causes = v["causes"].as_array().expect("causes");
    let blackhole: Vec<&Value> = causes.iter().filter(|c| c["id"] == "blackhole").collect();
    assert_eq!(blackhole.len(), 1, "{:#}", v["causes"]);
    let failed = v["failures"].as_array().map_or(0, Vec::len);
    assert_eq!(
        blackhole[0]["count"].as_u64(),
        Some(failed as u64),
        "{:#}",
        v["causes"]
    );
    assert!(
        blackhole[0]["protocols"].as_array().map_or(0, Vec::len) > 1,
        "{:#}",
        v["causes"]
    );
    lab.assert_no_trace_tables();
}

/// Two traces at once between the same pods, with different fates: ICMP
/// dies at node2 (a blackhole route to the pod), TCP at node1 (an nft drop
/// rule for TCP only). Each monitor prints every traced packet of its
/// namespace, so each trace must keep only its own packet's events: were
/// the TCP probe's drop taken for the ICMP probe's, ICMP would die at
/// node1. Run side by side several times (their probes overlap in time
/// nearly always; what is asserted holds whichever way they overlap);
/// then `lab check`, whose traces run side by side, names both causes.
#[test]
fn two_traces_at_once_each_get_their_own_verdict() {
    let _host = host_untouched();
    let lab = Standing::up("trmx", &[]);
    let ip = address(&lab, "node2-pod0", "-4", "eth0");
    let host_route = format!("{ip}/32");
    lab.sh("node2", "ip", &["route", "add", "blackhole", &host_route]);
    lab.sh("node1", "nft", &["add", "table", "ip", "tcponly"]);
    lab.sh(
        "node1",
        "nft",
        &["add chain ip tcponly forward { type filter hook forward priority 0; policy accept; }"],
    );
    lab.sh(
        "node1",
        "nft",
        &["add rule ip tcponly forward meta l4proto tcp ip daddr 10.244.2.0/24 counter drop"],
    );
    for _ in 0..3 {
        let (icmp, tcp) = std::thread::scope(|s| {
            let icmp = s.spawn(|| lab.trace("node1-pod0", "node2-pod0", &[]));
            let tcp = s.spawn(|| lab.trace("node1-pod0", "node2-pod0", &["--proto", "tcp"]));
            (icmp.join(), tcp.join())
        });
        let (icmp, tcp) = (
            icmp.expect("the ICMP trace ran"),
            tcp.expect("the TCP trace ran"),
        );
        assert_died(&icmp, "node2", "blackhole", &host_route);
        assert_died(&tcp, "node1", "firewall-drop", "ip tcponly forward handle");
        // The ICMP probe passes the TCP-only chain (its policy accepts
        // it) but shows no drop: that was the TCP probe's.
        let flat = icmp.1["firewall"].to_string();
        assert!(!flat.contains("(verdict drop)"), "{:#}", icmp.1);
    }
    lab.assert_no_trace_tables();
    // `lab check` traces its failure signatures side by side: each keeps
    // its own cause.
    assert_check_names(&lab, "blackhole", "node2", &host_route);
    assert_check_names(&lab, "firewall-drop", "node1", "ip tcponly forward");
}

/// FROM or TO that is nothing of the lab: exit 2 and what exists.
#[test]
fn an_unknown_endpoint_is_a_usage_error() {
    let _host = host_untouched();
    let lab = Standing::up("trus", &[]);
    let out = cnilab(&["lab", "trace", "--name", &lab.0, "node1-pod0", "nosuchpod"]);
    assert_eq!(out.status.code(), Some(2), "{}", all(&out));
    assert!(all(&out).contains("node2-pod0"), "{}", all(&out));
}

/// A firewall that drops the VXLAN outer packet (node2's input, the VXLAN
/// device's UDP port): the trace's rules follow the outer packet too, so
/// the rule is named by table, chain and handle at node2 on the pod-to-pod
/// and node-to-pod paths (before, the verdict was INCONCLUSIVE: only the
/// inner packet was traced), and `lab check` FAILs naming it.
#[test]
fn a_firewall_dropping_the_vxlan_outer_packet_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("trvo", &["--vxlan"]);
    let link = lab.sh("node2", "ip", &["-d", "link", "show", "vxlan0"]);
    let port = link
        .split_whitespace()
        .skip_while(|w| *w != "dstport")
        .nth(1)
        .unwrap_or_else(|| panic!("no dstport: {link}"))
        .to_string();
    for cmd in [
        "add table inet vxo".to_string(),
        "add chain inet vxo in { type filter hook input priority 0; }".to_string(),
        format!("add rule inet vxo in udp dport {port} drop"),
    ] {
        lab.sh("node2", "nft", &[&cmd]);
    }
    for from in ["node1-pod0", "node1"] {
        let t = lab.trace(from, "node2-pod0", &[]);
        assert_died(&t, "node2", "firewall-drop", "inet vxo in handle");
        let evidence = t.1["death"]["evidence"].to_string();
        assert!(
            evidence.contains(&format!("udp dport {port} drop")),
            "{evidence}"
        );
    }
    trace_common::assert_check_names(&lab, "firewall-drop", "node2", "inet vxo in handle");
}
