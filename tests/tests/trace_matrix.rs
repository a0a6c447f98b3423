//! The fault matrix of `lab check` and `lab trace` (root): each
//! class of fault made by hand (plain `ip`, `bridge`, `nft`, `iptables`,
//! `tc`, `sysctl`) in ONE standing lab per shape, in turn (make the fault,
//! `lab check -o json` or `lab trace`, assert the cause id, where it died
//! and the object on each path it breaks, apply the registry's fix for
//! the cause, `lab check` passes again, next), so the cells come
//! cheap. What covers which cell:
//!
//! ```text
//! class / cause        pod-pod x-node           pod-to-node          node-to-pod          Service
//! routing
//!  blackhole           l2 TC[t] TC[m]           l2 C[m] (in pod)     l2 C[m]              l2 T[p] C[m]
//!                      ctr C[m], v6 T[m]        v6 T[m] (in pod)     ctr C[m], v6 T[m]
//!  no-route            l2 T[t]
//!  unreachable         routed TC[p], T[m]       .                    routed T[m]          routed T[m]
//!  prohibit            routed T[p]
//!  wrong next hop      l2 TC[f]
//!  wrong device        l2 TC[m], v6 T[m]        .                    l2 TC[m], v6 T[m]    l2 TC[m]
//!  detour              l2 TC[f]
//!  reverse path        l2 TC[f]
//!  route mtu           l2 TC[f], routed T[p]    .                    l2 T[f]
//!                      v6 T[p]
//! firewall
//!  nft drop/reject     l2 T[p] every hook       l2 T[p] C[m]         l2 T[p] C[m]         l2 C[m]
//!                      nat TC[p], routed TC[m]  routed TC[m]         routed TC[m]         routed TC[m]
//!                      vxlan outer TC[t]
//!  ip6 firewall        v6 T[p]                  v6 T[m]              v6 T[m]
//!  chain policy        l2 TC[f]
//!  legacy iptables     l2 TC[f]                 l2 TC[p]
//!  ct state new        l2 TC[f]                 l2 T[f]              l2 T[f]              l2 T[f]
//!  ct INVALID          l2 T[f]                  l2 T[f]              l2 T[f]
//! links, bridges
//!  link down           l2 T[t] C[m], routed     l2 C[m], routed T[m] l2 C[m], routed T[m] l2 C[m], routed T[m]
//!                      T[p] T[m], vxlan T[p],
//!                      nat T[p]
//!  link mtu            l2 TC[f]                 .                    .                    .
//!  noarp               l2 TC[f]
//!  port isolated       l2 TC[f]
//!  port blocked        l2 TC[f] C[m]            l2 C[m]              l2 C[m]              l2 C[m]
//!  fdb (bridge)        l2 TC[f]                 .                    l2 T[f]              l2 T[f]
//!  fdb (vxlan)         vxlan TC[p] T[t]         .                    vxlan T[p]
//! neighbours
//!  FAILED/INCOMPLETE   l2 T[t], v6 T[p]
//!  wrong MAC           l2 TC[f] C[m]            routed T[m] (in pod) l2 C[m], routed T[m] l2 C[m], routed T[m]
//!                      routed T[m]
//! queues, sysctls
//!  qdisc drop          l2 TC[f] C[m]            routed T[m] (in pod) l2 T[p] C[m]         l2 T[p] C[m]
//!                      routed T[m]                                   routed T[m]          routed T[m]
//!  forwarding off      l2 T[t] C[m], routed     routed T[m]          l2 C[m]              l2 C[m]
//!                      T[p] T[m], v6 T[p]
//!  rp_filter           l2 TC[f]
//!  arp_ignore          l2 T[f]
//!  arp_announce        .                        .                    l2 T[f]
//!  accept_local        l2 TC[f]
//! ```
//!
//! T: `lab trace` names the node and object; C: `lab check` FAILs naming
//! the cause id, the node and the object on that path (its check group);
//! [t] trace.rs, [f] trace_faults.rs, [p] trace_paths.rs, [m] this file.
//! Shapes: l2, routed, vxlan (`--vxlan`), nat (lab/topologies/nat.toml).
//! Family: IPv4 but v6 (lab/topologies/ipv6-only.toml). Runtime: direct
//! but ctr (`--runtime containerd`). `.`: that fault cannot break that
//! path (a pod-to-node path leaves by no pod veth or bridge port of the
//! node it goes to; arp_announce only decides a node's own ARP sender).
//! Blank: not covered. Not covered at all: the VXLAN shape's Service path,
//! and route faults on the nat shape (its agent puts its routes back every
//! 200 ms, so a hand-made route there does not hold; its firewall and link
//! faults, which the agent leaves alone, stand for it).

mod trace_common;

use cnilab_tests::{host_untouched, output_text as all, StandingLab as Standing};
use std::process::Command;
use trace_common::{
    address, assert_arrived, assert_check_names_on, assert_died, assert_fixed, route_of,
    up_topology, Lab,
};

/// The Service VIP the lab pins to node2-pod0, and how to probe it.
const VIP: [&str; 5] = ["10.96.0.12", "--proto", "tcp", "--port", "7777"];

/// One fault made by hand: commands `(namespace, command line)` that make
/// it and that apply the registry's fix for its cause, the cause `lab
/// check` names, where it died (`node2`, or `node2-pod0 (node node2)`),
/// the object, and the paths it breaks.
struct Fault<'a> {
    make: Vec<(&'a str, String)>,
    fix: Vec<(&'a str, String)>,
    cause: &'a str,
    at: &'a str,
    object: String,
    paths: &'a [&'a str],
}

/// Runs a command line (split at blanks) in the lab's namespace `role`.
fn run(lab: &Standing, role: &str, line: &str) {
    let words: Vec<&str> = line.split_whitespace().collect();
    lab.sh(role, words[0], &words[1..]);
}

/// Makes each fault in turn, has `lab check` name it on its paths, applies
/// its cause's fix; the lab passes again after each.
fn each_fault_named_by_check(lab: &Standing, faults: &[Fault]) {
    for f in faults {
        for (role, line) in &f.make {
            run(lab, role, line);
        }
        assert_check_names_on(lab, f.cause, f.at, &f.object, f.paths);
        for (role, line) in &f.fix {
            run(lab, role, line);
        }
        assert_fixed(lab, f.cause);
    }
}

/// A route out of the wrong device: node1 sends node2's pod CIDR out of
/// its own pods' bridge (connected) instead of via node2 on eth0. Named as
/// that route at node1 (not as a next hop nobody owns) on the pod-to-pod,
/// node-to-pod and Service paths, by the trace and by `lab check`; the
/// same with a gateway forced onto the wrong device (`onlink`). Routed via
/// eth0 again, the lab passes.
#[test]
fn a_route_out_of_the_wrong_device_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tmwd", &["--service"]);
    let object = "route 10.244.2.0/24 dev cnilab0";
    for route in [
        "ip route replace 10.244.2.0/24 dev cnilab0",
        "ip route replace 10.244.2.0/24 via 10.250.0.2 dev cnilab0 onlink",
    ] {
        run(&lab, "node1", route);
        for (from, to, extra) in [
            ("node1-pod0", "node2-pod0", &[][..]),
            ("node1", "node2-pod0", &[][..]),
            ("node1-pod0", VIP[0], &VIP[1..]),
        ] {
            let t = lab.trace(from, to, extra);
            assert_died(&t, "node1", "wrong-device", object);
            let evidence = t.1["death"]["evidence"].to_string();
            assert!(evidence.contains("eth0"), "{route}: {evidence}");
        }
    }
    assert_check_names_on(
        &lab,
        "wrong-device",
        "node1",
        object,
        &["pod-to-pod", "node-to-pod", "service"],
    );
    // The fix: the route via the device that leads to node2, eth0.
    run(
        &lab,
        "node1",
        "ip route replace 10.244.2.0/24 via 10.250.0.2 dev eth0",
    );
    assert_fixed(&lab, "wrong-device");
}

/// The l2 shape with a Service: one fault of each class in turn, each
/// named by one `lab check` on every path it breaks (pod to pod, pod to
/// node, node to pod, the Service).
#[test]
fn l2_each_class_is_named_by_lab_check_on_every_path_it_breaks() {
    let _host = host_untouched();
    let lab = Standing::up("tmlt", &["--service"]);
    let veth = lab.pod_veth("node2");
    let pod = address(&lab, "node2-pod0", "-4", "eth0");
    let cross = &["pod-to-pod", "node-to-pod", "service"][..];
    let fw = "nft add table ip h1fw";
    let faults = [
        Fault {
            make: vec![("node1", "ip route replace blackhole 10.244.2.0/24".into())],
            fix: vec![(
                "node1",
                "ip route replace 10.244.2.0/24 via 10.250.0.2".into(),
            )],
            cause: "blackhole",
            at: "node1",
            object: "10.244.2.0/24".into(),
            paths: cross,
        },
        Fault {
            make: vec![("node1-pod0", "ip route add blackhole 10.250.0.2/32".into())],
            fix: vec![("node1-pod0", "ip route del blackhole 10.250.0.2/32".into())],
            cause: "blackhole",
            at: "node1-pod0 (node node1)",
            object: "10.250.0.2/32".into(),
            paths: &["pod-to-node"],
        },
        Fault {
            make: vec![
                ("node2", fw.into()),
                (
                    "node2",
                    "nft add chain ip h1fw cin { type filter hook input priority 0 ; }".into(),
                ),
                ("node2", "nft add rule ip h1fw cin iifname eth0 drop".into()),
                (
                    "node2",
                    "nft add chain ip h1fw cfw { type filter hook forward priority 0 ; }".into(),
                ),
                (
                    "node2",
                    format!("nft add rule ip h1fw cfw ip daddr {pod} drop"),
                ),
            ],
            fix: vec![("node2", "nft delete table ip h1fw".into())],
            cause: "firewall-drop",
            at: "node2",
            object: "ip h1fw".into(),
            paths: &["pod-to-pod", "pod-to-node", "node-to-pod", "service"],
        },
        Fault {
            make: vec![("node2", format!("ip link set {veth} down"))],
            fix: vec![("node2", format!("ip link set {veth} up"))],
            cause: "link-down",
            at: "node2",
            object: veth.clone(),
            paths: &["pod-to-pod", "pod-to-node", "node-to-pod", "service"],
        },
        Fault {
            make: vec![("node2", format!("bridge link set dev {veth} state 0"))],
            fix: vec![("node2", format!("bridge link set dev {veth} state 3"))],
            cause: "bridge-port-blocked",
            at: "node2",
            object: format!("port {veth} of cnilab0"),
            paths: &["pod-to-pod", "pod-to-node", "node-to-pod", "service"],
        },
        Fault {
            make: vec![(
                "node2",
                format!(
                    "ip neigh replace {pod} lladdr 02:00:00:00:00:99 dev cnilab0 nud permanent"
                ),
            )],
            fix: vec![("node2", format!("ip neigh del {pod} dev cnilab0"))],
            cause: "neighbour-wrong-mac",
            at: "node2",
            object: format!("neighbour {pod} dev cnilab0"),
            paths: cross,
        },
        Fault {
            make: vec![(
                "node2",
                format!("tc qdisc add dev {veth} root pfifo limit 0"),
            )],
            fix: vec![("node2", format!("tc qdisc del dev {veth} root"))],
            cause: "qdisc-drop",
            at: "node2",
            object: format!("dev {veth}"),
            paths: cross,
        },
        Fault {
            make: vec![("node2", "sysctl -qw net.ipv4.conf.eth0.forwarding=0".into())],
            fix: vec![("node2", "sysctl -qw net.ipv4.conf.eth0.forwarding=1".into())],
            cause: "forwarding-off",
            at: "node2",
            object: "net/ipv4/conf/eth0/forwarding".into(),
            paths: cross,
        },
    ];
    each_fault_named_by_check(&lab, &faults);
    // The same queue once the pod's own entry for its gateway has failed
    // (the answers to its ARP requests are what the queue drops): a Service
    // probe from the pod never leaves it, and is named at that queue, not
    // at a route to the VIP where the probe never got.
    run(
        &lab,
        "node2",
        &format!("tc qdisc add dev {veth} root pfifo limit 0"),
    );
    run(&lab, "node2-pod0", "ip neigh flush dev eth0");
    let gateway = address(&lab, "node2", "-4", "cnilab0");
    let ping = Command::new("ip")
        .args(["netns", "exec", &lab.netns("node2-pod0")])
        .args(["ping", "-n", "-c", "1", "-W", "1", &gateway])
        .output()
        .expect("ip netns exec runs");
    assert!(!ping.status.success(), "{}", all(&ping));
    let to_node1 = ("node2-pod0", "10.96.0.11", &VIP[1..]);
    each_path_names(
        &lab,
        &[to_node1],
        "node2",
        "qdisc-drop",
        &format!("dev {veth}"),
    );
    run(&lab, "node2", &format!("tc qdisc del dev {veth} root"));
}

/// Traces `paths` `(from, to, extra)`; each dies at `at` of `cause`, its
/// object holding `object`.
fn each_path_names(
    lab: &Standing,
    paths: &[(&str, &str, &[&str])],
    at: &str,
    cause: &str,
    object: &str,
) {
    for (from, to, extra) in paths {
        let t = lab.trace(from, to, extra);
        assert_died(&t, at, cause, object);
    }
}

/// The routed shape with a Service: a firewall, a link, a neighbour and a
/// queue fault made on node2 in turn, each named by the trace on the pod to
/// pod, pod to node, node to pod and Service paths it breaks; `lab check`
/// names the firewall's drop on every path.
#[test]
fn routed_each_class_is_named_on_every_path_it_breaks() {
    let _host = host_untouched();
    let lab = Standing::up("tmrt", &["--shape", "routed", "--service"]);
    let veth = lab.pod_veth("node2");
    let pod = address(&lab, "node2-pod0", "-4", "eth0");
    let pod_to_pod = ("node1-pod0", "node2-pod0", &[][..]);
    let node_to_pod = ("node1", "node2-pod0", &[][..]);
    let service = ("node1-pod0", VIP[0], &VIP[1..]);
    let into_pod = [pod_to_pod, node_to_pod, service];
    // Firewall: node2 drops what comes in by eth0 for itself and forwards
    // nothing to its pod.
    for line in [
        "nft add table ip h1rt".to_string(),
        "nft add chain ip h1rt cin { type filter hook input priority 0 ; }".into(),
        "nft add rule ip h1rt cin iifname eth0 drop".into(),
        "nft add chain ip h1rt cfw { type filter hook forward priority 0 ; }".into(),
        format!("nft add rule ip h1rt cfw ip daddr {pod} drop"),
    ] {
        run(&lab, "node2", &line);
    }
    let pod_to_node = ("node1-pod0", "node2", &[][..]);
    each_path_names(
        &lab,
        &[pod_to_pod, pod_to_node, node_to_pod, service],
        "node2",
        "firewall-drop",
        "ip h1rt c",
    );
    assert_check_names_on(
        &lab,
        "firewall-drop",
        "node2",
        "ip h1rt c",
        &["pod-to-pod", "pod-to-node", "node-to-pod", "service"],
    );
    run(&lab, "node2", "nft delete table ip h1rt");
    // Links: node2's pod veth down (its pod's own way out too).
    run(&lab, "node2", &format!("ip link set {veth} down"));
    let out_of_pod = ("node2-pod0", "node1", &[][..]);
    each_path_names(&lab, &into_pod, "node2", "link-down", &veth);
    each_path_names(&lab, &[out_of_pod], "node2", "link-down", &veth);
    run(&lab, "node2", &format!("ip link set {veth} up"));
    // Neighbours: a permanent entry for the pod with a MAC not its own.
    let neigh =
        format!("ip neigh replace {pod} lladdr 02:00:00:00:00:99 dev cnilab0 nud permanent");
    run(&lab, "node2", &neigh);
    let object = format!("neighbour {pod} dev cnilab0");
    each_path_names(&lab, &into_pod, "node2", "neighbour-wrong-mac", &object);
    run(&lab, "node2", &format!("ip neigh del {pod} dev cnilab0"));
    // Queues: a qdisc that drops everything on the pod's veth.
    run(
        &lab,
        "node2",
        &format!("tc qdisc add dev {veth} root pfifo limit 0"),
    );
    each_path_names(
        &lab,
        &into_pod,
        "node2",
        "qdisc-drop",
        &format!("dev {veth}"),
    );
    run(&lab, "node2", &format!("tc qdisc del dev {veth} root"));
    // Routing: the router refuses node2's pod prefix.
    run(&lab, "router", "ip route replace unreachable 10.244.2.0/24");
    let object = "route unreachable 10.244.2.0/24";
    each_path_names(&lab, &into_pod, "router", "unreachable", object);
    run(
        &lab,
        "router",
        "ip route replace 10.244.2.0/24 via 10.250.2.10",
    );
    // From node1-pod0 to node2: a neighbour, a queue and a sysctl fault on
    // its way out (its gateway's entry with a wrong MAC, a dropping qdisc
    // on its eth0, node1 not forwarding from the pods' bridge).
    let gateway = address(&lab, "node1", "-4", "cnilab0");
    let wrong =
        format!("ip neigh replace {gateway} lladdr 02:00:00:00:00:98 dev eth0 nud permanent");
    run(&lab, "node1-pod0", &wrong);
    let at = "node1-pod0";
    let object = format!("neighbour {gateway} dev eth0");
    each_path_names(&lab, &[pod_to_node], at, "neighbour-wrong-mac", &object);
    run(&lab, at, &format!("ip neigh del {gateway} dev eth0"));
    run(&lab, at, "tc qdisc add dev eth0 root pfifo limit 0");
    each_path_names(&lab, &[pod_to_node], at, "qdisc-drop", "dev eth0");
    run(&lab, at, "tc qdisc del dev eth0 root");
    let forwarding = |v: &str| format!("sysctl -qw net.ipv4.conf.cnilab0.forwarding={v}");
    run(&lab, "node1", &forwarding("0"));
    let object = "net/ipv4/conf/cnilab0/forwarding";
    each_path_names(
        &lab,
        &[pod_to_node, pod_to_pod],
        "node1",
        "forwarding-off",
        object,
    );
    run(&lab, "node1", &forwarding("1"));
    for (from, to, extra) in into_pod {
        assert_arrived(&lab.trace(from, to, extra), "node2-pod0");
    }
    assert_arrived(&lab.trace("node1-pod0", "node2", &[]), "node2");
    lab.assert_no_trace_tables();
}

/// IPv6 only, routing and firewall: a blackhole and a route out of the
/// wrong device on node1 for node2's pod prefix (pod to pod, node to pod),
/// a blackhole in node1-pod0 for node2's address (pod to node), an ip6
/// INPUT drop on node2 (pod to node) and an ip6 FORWARD drop of the pod
/// (node to pod), each named.
#[test]
fn ipv6_routing_and_firewall_faults_are_named_on_every_path() {
    let _host = host_untouched();
    let lab = up_topology("tm6o", "lab/topologies/ipv6-only.toml");
    let prefix = "fd00:10:244:2::/64";
    let restore = format!(
        "ip -6 route replace {}",
        route_of(&lab, "node1", prefix).join(" ")
    );
    let to_pod = [
        ("node1-pod0", "node2-pod0", &[][..]),
        ("node1", "node2-pod0", &[][..]),
    ];
    run(
        &lab,
        "node1",
        &format!("ip -6 route replace blackhole {prefix}"),
    );
    each_path_names(&lab, &to_pod, "node1", "blackhole", prefix);
    run(
        &lab,
        "node1",
        &format!("ip -6 route replace {prefix} dev cnilab0"),
    );
    each_path_names(
        &lab,
        &to_pod,
        "node1",
        "wrong-device",
        &format!("route {prefix} dev cnilab0"),
    );
    run(&lab, "node1", &restore);
    let node2 = address(&lab, "node2", "-6", "eth0");
    let pod_to_node = [("node1-pod0", "node2", &[][..])];
    run(
        &lab,
        "node1-pod0",
        &format!("ip -6 route add blackhole {node2}/128"),
    );
    each_path_names(&lab, &pod_to_node, "node1-pod0", "blackhole", &node2);
    run(
        &lab,
        "node1-pod0",
        &format!("ip -6 route del blackhole {node2}/128"),
    );
    run(
        &lab,
        "node2",
        "ip6tables-nft -A INPUT -i eth0 -p ipv6-icmp --icmpv6-type echo-request -j DROP",
    );
    each_path_names(
        &lab,
        &pod_to_node,
        "node2",
        "firewall-drop",
        "ip6 filter INPUT",
    );
    run(&lab, "node2", "ip6tables-nft -F INPUT");
    let pod = address(&lab, "node2-pod0", "-6", "eth0");
    run(
        &lab,
        "node2",
        &format!("ip6tables-nft -A FORWARD -d {pod} -j DROP"),
    );
    each_path_names(
        &lab,
        &to_pod[1..],
        "node2",
        "firewall-drop",
        "ip6 filter FORWARD",
    );
    run(&lab, "node2", "ip6tables-nft -F FORWARD");
    for (from, to, extra) in to_pod.iter().chain(&pod_to_node) {
        assert_arrived(&lab.trace(from, to, extra), to);
    }
    lab.assert_no_trace_tables();
}

/// The containerd runtime: a blackhole made by hand on node1 of a lab whose
/// pods are CRI sandboxes is named by `lab check` as in the direct runtime,
/// on the pod-to-pod and node-to-pod paths.
#[test]
fn containerd_lab_blackhole_is_named_by_lab_check() {
    let _host = host_untouched();
    let lab = Standing::up("tmcd", &["--runtime", "containerd"]);
    run(&lab, "node1", "ip route replace blackhole 10.244.2.0/24");
    assert_check_names_on(
        &lab,
        "blackhole",
        "node1",
        "10.244.2.0/24",
        &["pod-to-pod", "node-to-pod"],
    );
}
