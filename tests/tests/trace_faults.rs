//! `cnilab lab trace` and `lab check` (root) on faults no diagnosis rule
//! knows, each made by hand in a standing 2-node lab with plain `ip`,
//! `bridge`, `tc`, `sysctl`, `iptables` and `nft`: the trace names the
//! namespace, the cause and the object, and `lab check` FAILs naming the
//! same (its cause id, where it died, the object, a command that repeats
//! it); nothing of the trace is left behind.

mod trace_common;

use cnilab_tests::{host_untouched, StandingLab as Standing};
use trace_common::{address, assert_check_names, assert_check_says, assert_died, Lab};

/// Strict reverse-path filtering on node2 while its route back to node1's
/// pods leaves by the pods' bridge: the packet from node1-pod0 arriving on
/// eth0 is a martian source.
#[test]
fn reverse_path_filtering_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tfrp", &[]);
    lab.sh(
        "node2",
        "sysctl",
        &[
            "-qw",
            "net.ipv4.conf.all.rp_filter=1",
            "net.ipv4.conf.eth0.rp_filter=1",
        ],
    );
    lab.sh(
        "node2",
        "ip",
        &["route", "replace", "10.244.1.0/24", "dev", "cnilab0"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "reverse-path", "rp_filter on eth0");
    let evidence = t.1["death"]["evidence"].to_string();
    assert!(evidence.contains("leaves by cnilab0"), "{evidence}");
    // A diagnosis rule knows this one; the trace agrees with it.
    assert_check_says(&lab, &["node2", "rp_filter on eth0"]);
}

/// NOARP on node2's pod bridge: node2 never resolves its pod.
#[test]
fn noarp_on_a_link_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tfna", &[]);
    lab.sh("node2", "ip", &["link", "set", "cnilab0", "arp", "off"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "noarp", "link cnilab0");
    assert_check_names(&lab, "noarp", "node2", "link cnilab0");
}

/// A permanent neighbour on node2 for its pod with a MAC that is not the
/// pod's.
#[test]
fn a_permanent_neighbour_with_a_wrong_mac_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tfnm", &[]);
    let pod = address(&lab, "node2-pod0", "-4", "eth0");
    lab.sh(
        "node2",
        "ip",
        &[
            "neigh",
            "replace",
            &pod,
            "lladdr",
            "02:00:00:00:00:99",
            "dev",
            "cnilab0",
            "nud",
            "permanent",
        ],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    let object = format!("neighbour {pod} dev cnilab0");
    assert_died(&t, "node2", "neighbour-wrong-mac", &object);
    assert_check_names(&lab, "neighbour-wrong-mac", "node2", &object);
}

/// node1's pod port on its bridge put in STP state disabled.
#[test]
fn a_blocked_bridge_port_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tfbb", &[]);
    let veth = lab.pod_veth("node1");
    lab.sh(
        "node1",
        "bridge",
        &["link", "set", "dev", &veth, "state", "0"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    let object = format!("port {veth} of cnilab0");
    assert_died(&t, "node1", "bridge-port-blocked", &object);
    assert_check_names(&lab, "bridge-port-blocked", "node1", &object);
}

/// Both nodes' ports on the underlay switch isolated: the switch forwards
/// nothing between them.
#[test]
fn isolated_bridge_ports_are_named() {
    let _host = host_untouched();
    let lab = Standing::up("tfbi", &[]);
    for port in ["p-node1", "p-node2"] {
        lab.sh(
            "switch",
            "bridge",
            &["link", "set", "dev", port, "isolated", "on"],
        );
    }
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(
        &t,
        "switch",
        "bridge-port-isolated",
        "port p-node2 of underlay",
    );
    assert_check_names(&lab, "bridge-port-isolated", "switch", "of underlay");
}

/// node1 routes node2's pod CIDR via an underlay address nobody owns: the
/// death is named at node1, whose route chose that next hop.
#[test]
fn a_wrong_next_hop_is_named_at_the_node_whose_route_chose_it() {
    let _host = host_untouched();
    let lab = Standing::up("tfnh", &[]);
    lab.sh(
        "node1",
        "ip",
        &["route", "replace", "10.244.2.0/24", "via", "10.250.0.99"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node1", "wrong-next-hop", "next hop 10.250.0.99");
    // A diagnosis rule knows this one (a stale route); the trace agrees.
    assert_check_says(&lab, &["node1", "10.250.0.99"]);
}

/// An MTU smaller than the packet: node2's pod bridge at 1000 stops a
/// 1400-byte packet with DF (`--size`); node2-pod0's eth0 at 68 stops even
/// ping's default, and `lab check`'s DF probe.
#[test]
fn an_mtu_smaller_than_the_packet_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tfmt", &[]);
    let small = lab.trace("node1-pod0", "node2-pod0", &["--size", "1400"]);
    assert_eq!(small.1["verdict"], "arrived", "{:#}", small.1);
    lab.sh("node2", "ip", &["link", "set", "cnilab0", "mtu", "1000"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &["--size", "1400"]);
    assert_died(&t, "node2", "mtu", "link cnilab0 mtu 1000");
    assert!(
        t.1["reproduce"].to_string().contains("--size 1400"),
        "{:#}",
        t.1
    );
    lab.sh("node2", "ip", &["link", "set", "cnilab0", "mtu", "1500"]);
    lab.sh("node2-pod0", "ip", &["link", "set", "eth0", "mtu", "68"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2-pod0", "mtu", "link eth0 mtu 68");
    assert_check_names(&lab, "mtu", "node2-pod0 (node node2)", "link eth0 mtu 68");
}

/// A qdisc that drops everything (`pfifo limit 0`) on node2's pod veth:
/// its drop counter moved while the probe passed.
#[test]
fn a_qdisc_that_drops_is_named_by_its_counter() {
    let _host = host_untouched();
    let lab = Standing::up("tfqd", &[]);
    let veth = lab.pod_veth("node2");
    lab.sh(
        "node2",
        "tc",
        &["qdisc", "add", "dev", &veth, "root", "pfifo", "limit", "0"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    let object = format!("dev {veth}");
    assert_died(&t, "node2", "qdisc-drop", &object);
    assert_check_names(&lab, "qdisc-drop", "node2", &object);
}

/// node2-pod0 ignores every ARP request (arp_ignore 8), with node2's
/// neighbour cache flushed: the pod is named, not only node2's neighbour.
/// (`lab check` passes here: the pod's own ARP requests teach node2 its MAC
/// before any probe needs it.)
#[test]
fn arp_ignore_is_named_at_the_pod_that_ignores() {
    let _host = host_untouched();
    let lab = Standing::up("tfai", &[]);
    lab.sh(
        "node2-pod0",
        "sysctl",
        &["-qw", "net.ipv4.conf.all.arp_ignore=8"],
    );
    lab.sh("node2", "ip", &["neigh", "flush", "dev", "cnilab0"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    let object = "net/ipv4/conf/all/arp_ignore";
    assert_died(&t, "node2-pod0", "arp-ignore", object);
    assert_eq!(t.1["death"]["node"], "node2", "{:#}", t.1);
    lab.assert_no_trace_tables();
}

/// node1-pod0's address also on node2's lo: a packet from the pod to
/// node2-pod0 (not masqueraded) arrives at node2 with a source node2 holds
/// itself (accept_local off).
#[test]
fn a_local_source_refused_by_accept_local_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tfal", &[]);
    let pod = address(&lab, "node1-pod0", "-4", "eth0");
    lab.sh(
        "node2",
        "ip",
        &["addr", "add", &format!("{pod}/32"), "dev", "lo"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    let object = "net/ipv4/conf/eth0/accept_local";
    assert_died(&t, "node2", "accept-local", object);
    assert_check_names(&lab, "accept-local", "node2", object);
}

/// Legacy iptables (x_tables, which nftables' trace does not see): a DROP
/// rule in node1's FORWARD chain, then FORWARD's policy DROP, each named by
/// the counter that moved.
#[test]
fn legacy_iptables_drops_are_named_by_their_counters() {
    let _host = host_untouched();
    if std::process::Command::new("iptables-legacy")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIP legacy_iptables_drops_are_named_by_their_counters: no iptables-legacy here (install the iptables package)");
        return;
    }
    let lab = Standing::up("tflg", &[]);
    lab.sh(
        "node1",
        "iptables-legacy",
        &["-A", "FORWARD", "-d", "10.244.2.0/24", "-j", "DROP"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    let rule = "iptables-legacy filter FORWARD rule 1";
    assert_died(&t, "node1", "iptables-legacy-drop", rule);
    assert_check_names(&lab, "iptables-legacy-drop", "node1", rule);
    lab.sh("node1", "iptables-legacy", &["-F", "FORWARD"]);
    lab.sh("node1", "iptables-legacy", &["-P", "FORWARD", "DROP"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    let policy = "iptables-legacy filter FORWARD policy DROP";
    assert_died(&t, "node1", "iptables-legacy-policy", policy);
    assert_check_names(&lab, "iptables-legacy-policy", "node1", policy);
}

/// An iptables-nft chain policy (`iptables -P FORWARD DROP`, as Docker
/// sets) is named as the chain's policy.
#[test]
fn a_chain_policy_drop_is_named_as_the_policy() {
    let _host = host_untouched();
    let lab = Standing::up("tfpo", &[]);
    lab.sh("node1", "iptables-nft", &["-P", "FORWARD", "DROP"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    let object = "ip filter FORWARD policy drop";
    assert_died(&t, "node1", "firewall-policy", object);
    // A diagnosis rule knows this one; the trace agrees with it.
    assert_check_says(&lab, &["node1", "FORWARD", "policy drop"]);
}
