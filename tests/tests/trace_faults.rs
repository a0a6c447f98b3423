//! `cnilab lab trace` and `lab check` (root) on faults no diagnosis rule
//! knows, each made by hand in a standing 2-node lab with plain `ip`,
//! `bridge`, `tc`, `sysctl`, `iptables` and `nft`: the trace names the
//! namespace, the cause and the object, and `lab check` FAILs naming the
//! same (its cause id, where it died, the object, a command that repeats
//! it); nothing of the trace is left behind.

mod trace_common;

use cnilab_tests::{host_untouched, StandingLab as Standing};
use trace_common::{
    address, assert_arrived, assert_check_names, assert_check_says, assert_died,
    assert_every_failure_is, assert_fixed, assert_fixed_on, assert_kernel_drop, route_of, Lab,
};

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
    let back = route_of(&lab, "node2", "10.244.1.0/24");
    lab.sh(
        "node2",
        "ip",
        &["route", "replace", "10.244.1.0/24", "dev", "cnilab0"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "reverse-path", "rp_filter on eth0");
    let evidence = t.1["death"]["evidence"].to_string();
    assert!(evidence.contains("leaves by cnilab0"), "{evidence}");
    // The kernel's own word beside it.
    assert_kernel_drop(&t.1, "IP_RPFILTER", "node2", "eth0");
    assert!(evidence.contains("IP_RPFILTER"), "{evidence}");
    // A diagnosis rule knows this one; the trace agrees with it.
    assert_check_says(&lab, &["node2", "rp_filter on eth0"]);
    // The fix: a symmetric route back (rp_filter stays strict).
    let back: Vec<&str> = back.iter().map(String::as_str).collect();
    lab.sh("node2", "ip", &[&["route", "replace"][..], &back].concat());
    assert_fixed(&lab, "reverse-path");
}

/// A routing loop: node2 routes one of its own pods' addresses back to
/// node1 (a /32 via node1, as a stale route of an agent would). Named at
/// node2, which holds the pod and routes its traffic away, with the route:
/// the probe to the pod (node1 and node2 hand it back and forth), and the
/// answer node1 sends a probe from that pod (it comes back to node1, where
/// the kernel drops it as a martian source, but the loop is why); `lab
/// check` has every failure under that one cause. The route deleted, the
/// lab passes again.
#[test]
fn a_route_sending_a_pods_address_back_is_named_as_a_loop() {
    let _host = host_untouched();
    let lab = Standing::up("tfrl", &[]);
    let pod = address(&lab, "node2-pod0", "-4", "eth0");
    let node1 = address(&lab, "node1", "-4", "eth0");
    let route = format!("{pod}/32");
    lab.sh("node2", "ip", &["route", "add", &route, "via", &node1]);
    let object = format!("route to {pod}");
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "routing-loop", &object);
    // The terminal shows the loop's first and last device crossings.
    let args = ["lab", "trace", "--name", &lab.0, "node1-pod0", "node2-pod0"];
    let text = cnilab_tests::output_text(&cnilab_tests::cnilab(&args));
    let crossed = text
        .lines()
        .find(|l| l.trim_start().starts_with("kernel: out"))
        .unwrap_or_default();
    assert!(
        crossed.contains(" more … ") && crossed.matches(" → ").count() <= 24,
        "{text}"
    );
    let t = lab.trace("node2-pod0", "node1", &[]);
    assert_arrived(&t, "node1");
    let answer = &t.1["replyDeath"];
    assert_eq!(
        (&answer["namespace"], &answer["cause"], &answer["object"]),
        (
            &"node2".into(),
            &"routing-loop".into(),
            &object.as_str().into()
        ),
        "{:#}",
        t.1
    );
    assert_every_failure_is(&lab, "routing-loop", "node2", &object);
    // The fix: the route that sends it back, deleted.
    lab.sh("node2", "ip", &["route", "del", &route]);
    assert_fixed(&lab, "routing-loop");
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
    lab.sh("node2", "ip", &["link", "set", "cnilab0", "arp", "on"]);
    assert_fixed(&lab, "noarp");
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
    lab.sh("node2", "ip", &["neigh", "del", &pod, "dev", "cnilab0"]);
    assert_fixed(&lab, "neighbour-wrong-mac");
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
    lab.sh(
        "node1",
        "bridge",
        &["link", "set", "dev", &veth, "state", "3"],
    );
    assert_fixed(&lab, "bridge-port-blocked");
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
    // Isolation off on one of the two ports is enough.
    lab.sh(
        "switch",
        "bridge",
        &["link", "set", "dev", "p-node1", "isolated", "off"],
    );
    assert_fixed(&lab, "bridge-port-isolated");
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
    lab.sh(
        "node1",
        "ip",
        &["route", "replace", "10.244.2.0/24", "via", "10.250.0.2"],
    );
    assert_fixed(&lab, "wrong-next-hop");
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
    lab.sh("node2-pod0", "ip", &["link", "set", "eth0", "mtu", "1500"]);
    assert_fixed(&lab, "mtu");
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
    lab.sh("node2", "tc", &["qdisc", "del", "dev", &veth, "root"]);
    assert_fixed(&lab, "qdisc-drop");
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
    lab.sh(
        "node2-pod0",
        "sysctl",
        &["-qw", "net.ipv4.conf.all.arp_ignore=0"],
    );
    assert_fixed_on(&lab, "arp-ignore", "node1-pod0", "node2-pod0", &[]);
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
    // The fix: the sender's address is its own again.
    lab.sh(
        "node2",
        "ip",
        &["addr", "del", &format!("{pod}/32"), "dev", "lo"],
    );
    assert_fixed(&lab, "accept-local");
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
    lab.sh(
        "node1",
        "iptables-legacy",
        &["-D", "FORWARD", "-d", "10.244.2.0/24", "-j", "DROP"],
    );
    assert_fixed(&lab, "iptables-legacy-drop");
    lab.sh("node1", "iptables-legacy", &["-P", "FORWARD", "DROP"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    let policy = "iptables-legacy filter FORWARD policy DROP";
    assert_died(&t, "node1", "iptables-legacy-policy", policy);
    assert_check_names(&lab, "iptables-legacy-policy", "node1", policy);
    lab.sh("node1", "iptables-legacy", &["-P", "FORWARD", "ACCEPT"]);
    assert_fixed(&lab, "iptables-legacy-policy");
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
    lab.sh("node1", "iptables-nft", &["-P", "FORWARD", "ACCEPT"]);
    assert_fixed(&lab, "firewall-policy");
}

/// node2's pod port neither learns nor floods unknown unicast and the
/// entry it learned is deleted: node2's bridge sends the frame for its pod
/// nowhere. Named on the pod-to-pod, node-to-pod and Service paths (all
/// leave node2 by that port); a pod-to-node path never goes out of it.
#[test]
fn a_bridge_port_that_neither_learns_nor_floods_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tffl", &["--service"]);
    let veth = lab.pod_veth("node2");
    let mac = lab.sh("node2-pod0", "cat", &["/sys/class/net/eth0/address"]);
    let mac = mac.trim();
    lab.sh(
        "node2",
        "bridge",
        &[
            "link", "set", "dev", &veth, "learning", "off", "flood", "off",
        ],
    );
    // The entry learned so far, if it has not aged out yet.
    let fdb = lab.sh("node2", "bridge", &["fdb", "show", "dev", &veth]);
    if fdb.contains(mac) {
        lab.sh(
            "node2",
            "bridge",
            &["fdb", "del", mac, "dev", &veth, "master"],
        );
    }
    let object = format!("port {veth} of cnilab0");
    for (from, to, extra) in [
        ("node1-pod0", "node2-pod0", &[][..]),
        ("node1", "node2-pod0", &[][..]),
        (
            "node1-pod0",
            "10.96.0.12",
            &["--proto", "tcp", "--port", "7777"][..],
        ),
    ] {
        let t = lab.trace(from, to, extra);
        assert_died(&t, "node2", "bridge-fdb-missing", &object);
        let evidence = t.1["death"]["evidence"].to_string();
        assert!(evidence.contains(mac), "{from} -> {to}: {evidence}");
    }
    assert_check_names(&lab, "bridge-fdb-missing", "node2", &object);
    // Flooding back on: the same port gets the frame again.
    lab.sh(
        "node2",
        "bridge",
        &["link", "set", "dev", &veth, "flood", "on"],
    );
    assert_arrived(&lab.trace("node1-pod0", "node2-pod0", &[]), "node2-pod0");
    assert_fixed(&lab, "bridge-fdb-missing");
}

/// Conntrack state. The trace's probes (an echo request, a TCP SYN, a UDP
/// datagram) are each the first packet of a flow, NEW to conntrack, never
/// INVALID: a `ct state invalid drop` rule on the way is crossed and not
/// blamed. A rule whose conntrack state does match the probe (`ct state
/// new`) is named by table, chain, handle and text on the pod-to-pod,
/// node-to-pod, Service and pod-to-node paths.
#[test]
fn conntrack_state_rules_are_named_only_when_they_drop_the_probe() {
    let _host = host_untouched();
    let lab = Standing::up("tfct", &["--service"]);
    let pod = address(&lab, "node2-pod0", "-4", "eth0");
    let nft = |rule: &str| {
        lab.sh("node2", "nft", &[rule]);
    };
    nft("add table inet ctlab");
    nft("add chain inet ctlab ctfwd { type filter hook forward priority 0; }");
    nft("add chain inet ctlab ctin { type filter hook input priority 0; }");
    nft("add rule inet ctlab ctfwd ct state invalid drop");
    nft("add rule inet ctlab ctin ct state invalid drop");
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_arrived(&t, "node2-pod0");
    assert!(
        t.1["firewall"].to_string().contains("ctlab"),
        "the probe crossed the ctlab chains: {:#}",
        t.1
    );
    nft(&format!(
        "add rule inet ctlab ctfwd ip daddr {pod} ct state new drop"
    ));
    nft("add rule inet ctlab ctin meta l4proto icmp ct state new drop");
    for (from, to, extra, chain) in [
        ("node1-pod0", "node2-pod0", &[][..], "ctfwd"),
        ("node1", "node2-pod0", &[][..], "ctfwd"),
        (
            "node1-pod0",
            "10.96.0.12",
            &["--proto", "tcp", "--port", "7777"][..],
            "ctfwd",
        ),
        ("node1-pod0", "node2", &[][..], "ctin"),
    ] {
        let t = lab.trace(from, to, extra);
        assert_died(
            &t,
            "node2",
            "firewall-drop",
            &format!("inet ctlab {chain} handle"),
        );
        let evidence = t.1["death"]["evidence"].to_string();
        assert!(
            evidence.contains("ct state new"),
            "{from} -> {to}: {evidence}"
        );
    }
    assert_check_names(&lab, "firewall-drop", "node2", "inet ctlab ctfwd handle");
}

/// arp_announce where it decides an ARP request's sender: node2 reaches
/// its pods' subnet with `src` its underlay address, and node2-pod0
/// answers only requests from its own subnet (arp_ignore 2). With
/// arp_announce 2 on node2 the request carries the bridge's address and
/// node2's own packet to the pod arrives; with 0 (the kernel's default) it
/// carries the underlay address, the pod ignores it, and the trace names
/// node2's arp_announce. Only node2's own packets: for a forwarded packet
/// the kernel takes the bridge's address whatever arp_announce says, so
/// no pod-to-pod path (and no probe of `lab check`) fails this way.
#[test]
fn arp_announce_is_named_where_it_chooses_the_arp_sender() {
    let _host = host_untouched();
    let lab = Standing::up("tfaa", &[]);
    lab.sh(
        "node2-pod0",
        "sysctl",
        &["-qw", "net.ipv4.conf.all.arp_ignore=2"],
    );
    lab.sh(
        "node2",
        "ip",
        &[
            "route",
            "replace",
            "10.244.2.0/24",
            "dev",
            "cnilab0",
            "src",
            "10.250.0.2",
        ],
    );
    let announce = |value: &str| {
        lab.sh(
            "node2",
            "sysctl",
            &["-qw", &format!("net.ipv4.conf.all.arp_announce={value}")],
        );
        lab.sh("node2", "ip", &["neigh", "flush", "dev", "cnilab0"]);
    };
    announce("2");
    assert_arrived(&lab.trace("node2", "node2-pod0", &[]), "node2-pod0");
    announce("0");
    let t = lab.trace("node2", "node2-pod0", &[]);
    assert_died(
        &t,
        "node2",
        "arp-announce",
        "net/ipv4/conf/cnilab0/arp_announce",
    );
    let evidence = t.1["death"]["evidence"].to_string();
    assert!(evidence.contains("from 10.250.0.2"), "{evidence}");
    lab.assert_no_trace_tables();
    announce("2");
    assert_fixed_on(&lab, "arp-announce", "node2", "node2-pod0", &[]);
}

/// A route's own MTU (`ip route replace … mtu lock 1000`) on node1 for
/// node2's pod CIDR: a packet with DF that fits it arrives; a larger one is
/// named as that route at node1 (the kernel's FIB answer carries the
/// route's MTU), by `lab trace --size` and by `lab check`'s DF group,
/// whose probes are as large as the pods' MTU.
#[test]
fn a_route_mtu_smaller_than_the_packet_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tfrm", &[]);
    let route = lab.sh("node1", "ip", &["route", "show", "10.244.2.0/24"]);
    let words: Vec<&str> = route.split_whitespace().collect();
    let after = |key: &str| {
        words
            .iter()
            .position(|w| *w == key)
            .and_then(|i| words.get(i + 1))
            .copied()
            .unwrap_or_else(|| panic!("no {key} in node1's route: {route}"))
    };
    let (via, dev) = (after("via"), after("dev"));
    lab.sh(
        "node1",
        "ip",
        &[
            "route",
            "replace",
            "10.244.2.0/24",
            "via",
            via,
            "dev",
            dev,
            "mtu",
            "lock",
            "1000",
        ],
    );
    let fits = lab.trace("node1-pod0", "node2-pod0", &["--size", "1000"]);
    assert_arrived(&fits, "node2-pod0");
    let t = lab.trace("node1-pod0", "node2-pod0", &["--size", "1400"]);
    let object = "route 10.244.2.0/24 mtu 1000";
    assert_died(&t, "node1", "mtu", object);
    let evidence = t.1["death"]["evidence"].to_string();
    assert!(evidence.contains("1400-byte"), "{evidence}");
    // Node to pod: node1's own packet takes the same route.
    let t = lab.trace("node1", "node2-pod0", &["--size", "1400"]);
    assert_died(&t, "node1", "mtu", object);
    assert_check_names(&lab, "mtu", "node1", object);
}

/// Conntrack INVALID. `lab trace --proto tcp --invalid` sends a TCP
/// segment with no flags set, which conntrack classes INVALID in every
/// namespace that tracks it (the kernel's "invalid tcp flag combination",
/// whatever nf_conntrack_tcp_loose says): without a rule against it, it
/// arrives; with node2's `ct state invalid drop` in forward and input, the
/// rule is named by table, chain and handle on the pod-to-pod, node-to-pod
/// and pod-to-node paths, node2's own count of INVALID packets moved, and a
/// plain TCP probe (NEW) still arrives. `lab check` cannot fail this way:
/// its probes each open a new flow.
#[test]
fn an_invalid_probe_is_named_at_the_ct_state_invalid_rule() {
    let _host = host_untouched();
    let lab = Standing::up("tfiv", &[]);
    let tcp = ["--proto", "tcp", "--invalid"];
    assert_arrived(&lab.trace("node1-pod0", "node2-pod0", &tcp), "node2-pod0");
    let nft = |rule: &str| {
        lab.sh("node2", "nft", &[rule]);
    };
    nft("add table inet ivlab");
    nft("add chain inet ivlab ivfwd { type filter hook forward priority 0; }");
    nft("add chain inet ivlab ivin { type filter hook input priority 0; }");
    nft("add rule inet ivlab ivfwd ct state invalid drop");
    nft("add rule inet ivlab ivin ct state invalid drop");
    let plain = lab.trace("node1-pod0", "node2-pod0", &["--proto", "tcp"]);
    assert_arrived(&plain, "node2-pod0");
    let invalid_count = || -> u64 {
        let stat = lab.sh("node2", "cat", &["/proc/net/stat/nf_conntrack"]);
        let mut lines = stat.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let column = header
            .iter()
            .position(|h| *h == "invalid")
            .unwrap_or_else(|| panic!("no invalid column: {stat}"));
        lines
            .filter_map(|l| l.split_whitespace().nth(column))
            .map(|v| u64::from_str_radix(v, 16).unwrap_or_else(|e| panic!("{v}: {e}")))
            .sum()
    };
    for (from, to, chain) in [
        ("node1-pod0", "node2-pod0", "ivfwd"),
        ("node1", "node2-pod0", "ivfwd"),
        ("node1-pod0", "node2", "ivin"),
    ] {
        let before = invalid_count();
        let t = lab.trace(from, to, &tcp);
        assert_died(
            &t,
            "node2",
            "conntrack-invalid",
            &format!("inet ivlab {chain} handle"),
        );
        let evidence = t.1["death"]["evidence"].to_string();
        assert!(
            evidence.contains("ct state invalid"),
            "{from} -> {to}: {evidence}"
        );
        assert!(
            t.1["reproduce"].to_string().contains("--invalid"),
            "{:#}",
            t.1
        );
        assert!(
            invalid_count() > before,
            "{from} -> {to}: node2's conntrack counted no INVALID packet"
        );
    }
    lab.assert_no_trace_tables();
    // The fix: the rules dropped.
    nft("delete table inet ivlab");
    assert_fixed_on(&lab, "conntrack-invalid", "node1-pod0", "node2-pod0", &tcp);
}

/// A detour: node1 routes node2's pod CIDR via the external host, which
/// does not forward. The packet dies there (forwarding off), and the death
/// names the route that sent it: node1's, via the external host (before,
/// only the external host's forwarding was named).
#[test]
fn a_detour_names_the_route_that_sent_the_packet_there() {
    let _host = host_untouched();
    let lab = Standing::up("tfdt", &[]);
    let external = address(&lab, "external", "-4", "eth0");
    lab.sh(
        "node1",
        "ip",
        &["route", "replace", "10.244.2.0/24", "via", &external],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "external", "forwarding-off", "forwarding");
    let evidence = t.1["death"]["evidence"].to_string();
    let sent = format!("node1 sent it here: forward via {external}");
    assert!(evidence.contains(&sent), "{evidence}");
    // A diagnosis rule knows this one (a stale route); it names node1's
    // route too.
    assert_check_says(&lab, &["node1", "10.244.2.0/24", &external]);
}

/// A tc filter on node2's uplink (a clsact qdisc, a u32 filter on
/// node2-pod0's address) redirects the probe back out of the device it
/// came in by, before node2's firewall and routing see it: the switch
/// does not send a frame back out of the port it came in by, so it is
/// lost there. Neither the routes nor nftables account for it; the trace names the
/// filter at node2, `lab check` FAILs naming it, and deleting the filter
/// (the registry's fix) makes the lab pass again.
#[test]
fn a_tc_redirect_off_the_path_is_named_at_its_filter() {
    let _host = host_untouched();
    let lab = Standing::up("tftc", &[]);
    let pod = address(&lab, "node2-pod0", "-4", "eth0");
    lab.sh("node2", "tc", &["qdisc", "add", "dev", "eth0", "clsact"]);
    let dst = format!("{pod}/32");
    lab.sh(
        "node2",
        "tc",
        &[
            "filter", "add", "dev", "eth0", "ingress", "protocol", "ip", "u32", "match", "ip",
            "dst", &dst, "action", "mirred", "egress", "redirect", "dev", "eth0",
        ],
    );
    let object = "tc ingress filter u32 on eth0";
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "tc-filter", object);
    let evidence = t.1["death"]["evidence"].to_string();
    assert!(evidence.contains("last seen in"), "{evidence}");
    assert_eq!(
        t.1["death"]["check"], "tc -s filter show dev eth0 ingress",
        "{:#}",
        t.1
    );
    assert_check_names(&lab, "tc-filter", "node2", object);
    lab.sh("node2", "tc", &["filter", "del", "dev", "eth0", "ingress"]);
    assert_fixed(&lab, "tc-filter");
}

/// Policy routing: a rule on node1 sends its pods' traffic to a table of
/// its own (100), where node2's pod CIDR is a blackhole. The death is named
/// at node1 as the route of table 100, with the rule that chose the table
/// (priority and selector), by the trace and by `lab check`; node1's main
/// table, which is right, is not blamed.
#[test]
fn a_policy_rule_sending_pod_traffic_to_another_table_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tfpr", &[]);
    lab.sh(
        "node1",
        "ip",
        &["route", "add", "blackhole", "10.244.2.0/24", "table", "100"],
    );
    lab.sh(
        "node1",
        "ip",
        &[
            "rule",
            "add",
            "from",
            "10.244.1.0/24",
            "lookup",
            "100",
            "prio",
            "100",
        ],
    );
    let object = "route blackhole 10.244.2.0/24 table 100";
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node1", "blackhole", object);
    let evidence = t.1["death"]["evidence"].to_string();
    assert!(
        evidence.contains("chosen by rule 100: from 10.244.1.0/24 lookup 100"),
        "{evidence}"
    );
    assert_check_names(&lab, "blackhole", "node1", object);
    assert_check_says(&lab, &["node1", object, "rule 100"]);
}
