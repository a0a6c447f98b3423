//! The fault matrix of `lab check` and `lab trace` (root, issue 22): each
//! class of fault made by hand (plain `ip`, `bridge`, `nft`, `iptables`,
//! `tc`, `sysctl`) in ONE standing lab per shape, in turn (make the fault,
//! `lab check -o json` or `lab trace`, assert the cause id, where it died
//! and the object on each path it breaks, undo, next), so the cells come
//! cheap. What covers which cell:
//!
//! ```text
//! class \ path      pod-pod x-node      pod-to-node        node-to-pod        Service
//! routing
//!  blackhole        l2 T+C(trace)       l2 C (matrix)      l2 C (matrix)      l2 T(paths) C(matrix)
//!                   ctr C (matrix)      v6 T (matrix)      v6 T (matrix)
//!  no-route         l2 T (trace)
//!  unreachable      routed T+C(paths)
//!  prohibit         routed T (paths)
//!  wrong next hop   l2 T+C (faults)     .                  .                  .
//!  wrong device     l2 T+C (matrix)     .                  l2 T (matrix)      l2 T (matrix)
//!                   v6 T (matrix)                          v6 T (matrix)
//!  detour           l2 T+C (faults)
//!  reverse path     l2 T+C (faults)
//!  route mtu        l2 T+C, routed T,   .                  l2 T (faults)
//!                   v6 T (faults/paths)
//! firewall
//!  nft drop/reject  l2 every hook T     l2 T (paths)       l2 T (paths)       l2 C (matrix)
//!                   nat T+C, routed T   l2 C (matrix)      routed T (matrix)  routed T (matrix)
//!                   (matrix)            routed T (matrix)
//!  ip6 firewall     v6 T (paths)        v6 T (matrix)      v6 T (matrix)
//!  chain policy     l2 T+C (faults)
//!  legacy iptables  l2 T+C (faults)     l2 T+C (paths)
//!  ct state         l2 T+C (faults)     l2 T (faults)      l2 T (faults)      l2 T (faults)
//!  ct INVALID       l2 T (faults)       l2 T (faults)      l2 T (faults)
//! links, bridges
//!  link down        l2 T, routed T,     l2 C (matrix)      l2 C (matrix)      l2 C (matrix)
//!                   vxlan T, nat T      routed T (matrix)  routed T (matrix)  routed T (matrix)
//!  link mtu         l2 T+C (faults)
//!  noarp            l2 T+C (faults)
//!  port isolated    l2 T+C (faults)
//!  port blocked     l2 T+C (faults)     l2 C (matrix)      l2 C (matrix)      l2 C (matrix)
//!  fdb (bridge)     l2 T+C (faults)     .                  l2 T (faults)      l2 T (faults)
//!  fdb (vxlan)      vxlan T+C (paths)   .                  vxlan T (paths)
//! neighbours
//!  FAILED           l2 T (trace), v6 T
//!  wrong MAC        l2 T+C (faults)     .                  l2 C (matrix)      l2 C (matrix)
//!                   routed T (matrix)                      routed T (matrix)  routed T (matrix)
//! queues, sysctls
//!  qdisc drop       l2 T+C (faults)     .                  l2 T (paths)       l2 T (paths)
//!                   routed T (matrix)                      l2 C (matrix)      l2 C (matrix)
//!                                                          routed T (matrix)  routed T (matrix)
//!  forwarding off   l2 T (trace),       .                  l2 C (matrix)      l2 C (matrix)
//!                   routed T, v6 T
//!  rp_filter, arp_ignore/announce, accept_local: l2 T(+C) (faults)
//! ```
//!
//! T: `lab trace` names it; C: `lab check` FAILs naming it; (file): where,
//! among trace.rs, trace_faults.rs, trace_paths.rs and this file (matrix);
//! ctr: a lab run with `--runtime containerd`; v6: the ipv6-only topology;
//! `.`: a path that fault does not break. Families: IPv4 everywhere, IPv6
//! where marked v6. Runtimes: direct everywhere, containerd where marked
//! ctr. Not covered: the VXLAN shape on the Service path, and the nat
//! shape's route faults (its agent puts its routes back every 200 ms; a
//! firewall or link fault, which it leaves, is used there instead).

mod trace_common;

use cnilab_tests::{cnilab, host_untouched, output_text as all, StandingLab as Standing};
use trace_common::{address, assert_check_names_on, assert_died, Lab};

/// The Service VIP the lab pins to node2-pod0, and how to probe it.
const VIP: [&str; 5] = ["10.96.0.12", "--proto", "tcp", "--port", "7777"];

/// One fault made by hand: commands `(namespace, command line)` that make
/// and undo it, the cause `lab check` names, where it died (`node2`, or
/// `node2-pod0 (node node2)`), the object, and the paths it breaks.
struct Fault<'a> {
    make: Vec<(&'a str, String)>,
    undo: Vec<(&'a str, String)>,
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

/// Makes each fault in turn, has `lab check` name it on its paths, undoes
/// it; the lab passes again at the end.
fn each_fault_named_by_check(lab: &Standing, faults: &[Fault]) {
    for f in faults {
        for (role, line) in &f.make {
            run(lab, role, line);
        }
        assert_check_names_on(lab, f.cause, f.at, &f.object, f.paths);
        for (role, line) in &f.undo {
            run(lab, role, line);
        }
    }
    let out = cnilab(&["lab", "check", "--name", &lab.0]);
    assert_eq!(out.status.code(), Some(0), "{}", all(&out));
}

/// A route out of the wrong device: node1 sends node2's pod CIDR out of
/// its own pods' bridge (connected) instead of via node2 on eth0. Named as
/// that route at node1 (not as a next hop nobody owns) on the pod-to-pod,
/// node-to-pod and Service paths, by the trace and by `lab check`; the
/// same with a gateway forced onto the wrong device (`onlink`).
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
            undo: vec![(
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
            undo: vec![("node1-pod0", "ip route del blackhole 10.250.0.2/32".into())],
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
            undo: vec![("node2", "nft delete table ip h1fw".into())],
            cause: "firewall-drop",
            at: "node2",
            object: "ip h1fw".into(),
            paths: &["pod-to-pod", "pod-to-node", "node-to-pod", "service"],
        },
        Fault {
            make: vec![("node2", format!("ip link set {veth} down"))],
            undo: vec![("node2", format!("ip link set {veth} up"))],
            cause: "link-down",
            at: "node2",
            object: veth.clone(),
            paths: &["pod-to-pod", "pod-to-node", "node-to-pod", "service"],
        },
        Fault {
            make: vec![("node2", format!("bridge link set dev {veth} state 0"))],
            undo: vec![("node2", format!("bridge link set dev {veth} state 3"))],
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
            undo: vec![("node2", format!("ip neigh del {pod} dev cnilab0"))],
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
            undo: vec![("node2", format!("tc qdisc del dev {veth} root"))],
            cause: "qdisc-drop",
            at: "node2",
            object: format!("dev {veth}"),
            paths: cross,
        },
        Fault {
            make: vec![("node2", "sysctl -qw net.ipv4.conf.eth0.forwarding=0".into())],
            undo: vec![("node2", "sysctl -qw net.ipv4.conf.eth0.forwarding=1".into())],
            cause: "forwarding-off",
            at: "node2",
            object: "net/ipv4/conf/eth0/forwarding".into(),
            paths: cross,
        },
    ];
    each_fault_named_by_check(&lab, &faults);
}
