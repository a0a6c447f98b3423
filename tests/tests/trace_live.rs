//! `cnilab trace` on a live node (root): nodes built by hand the way
//! flannel and kube-router leave them (`capture_common::styles`: pods in
//! `cni-<uuid>` namespaces or held by a process only, iptables-nft as the
//! CNI writes it), joined by a switch namespace as their uplinks would be
//! by a real network. The trace reads one node and its pods, never a lab:
//! a pod's packet to another node's pod leaves by the uplink, to a pod of
//! the same node arrives, and a fault made by hand in the node is named
//! there. Every namespace is as it was after each trace (no nft table, no
//! sysctl, no link of the trace's left), and so is the machine's own.

mod capture_common;

use capture_common::styles::{self, Cluster};
use capture_common::{all, assert_conforms_to, cnilab, run, run_args};
use cnilab_net::netns::Netns;
use cnilab_net::testing::network_of;
use cnilab_tests::host_untouched;
use serde_json::Value;

/// The nodes' uplinks (`eth0`, whose veth peer the style leaves in the
/// node) moved into one switch namespace and bridged, so that what leaves
/// a node reaches the other.
fn switch(c: &Cluster) -> Netns {
    let sw = Netns::with_label("trl-sw").expect("netns");
    run(
        &sw,
        "ip",
        &[
            "link set lo up",
            "link add br0 type bridge",
            "link set br0 up",
        ],
    );
    for (i, n) in c.nodes.iter().enumerate() {
        run(n, "ip", &[&format!("link set eth0p netns {}", sw.name())]);
        run(
            &sw,
            "ip",
            &[
                &format!("link set eth0p name up{i}"),
                &format!("link set up{i} master br0"),
                &format!("link set up{i} up"),
            ],
        );
    }
    sw
}

/// `cnilab trace FROM TO --netns NODE -o json EXTRA…`: the exit code and
/// the trace, which conforms to its schema; asserts that no namespace of
/// `same` changed.
fn trace(node: &Netns, from: &str, to: &str, extra: &[&str], same: &[&Netns]) -> (i32, Value) {
    let before: Vec<_> = same.iter().map(|n| network_of(n)).collect();
    let path = node.path().display().to_string();
    let mut args = vec!["trace", from, to, "--netns", &path, "-o", "json"];
    args.extend_from_slice(extra);
    let out = cnilab(&args);
    for (n, b) in same.iter().zip(&before) {
        let changes = network_of(n).changes_since(b);
        assert!(
            changes.is_empty(),
            "trace changed {}: {changes:?}",
            n.name()
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("trace JSON: {e}: {}", all(&out)));
    assert_conforms_to("trace", &v);
    (out.status.code().unwrap_or(-1), v)
}

fn everything<'a>(c: &'a Cluster, sw: &'a Netns) -> Vec<&'a Netns> {
    let mut v = c.all();
    v.push(sw);
    v
}

/// Healthy flannel nodes: a pod's ping to the other node's pod works (the
/// fixture is a working cluster); traced on node 1, it leaves by `eth0` as
/// the outer packet of `flannel.1`, toward node 2's VTEP, and the kernel
/// saw it queued there (exit 0); without that record (drop reasons off)
/// it is INCONCLUSIVE. To the other pod of the same node it arrives. The
/// pod is named as a runtime names its namespace.
#[test]
fn flannel_pods_packets_leave_by_the_vxlan_or_arrive_on_the_node() {
    let _host = host_untouched();
    let c = styles::flannel();
    let sw = switch(&c);
    let same = everything(&c, &sw);
    let pod = &c.names[0][0];
    let ping = c.pods[0][0]
        .command("ping")
        .args(["-c", "1", "-W", "3", "10.244.2.2"])
        .output()
        .expect("ping runs");
    assert!(
        ping.status.success(),
        "the fixture is no working cluster: {}",
        all(&ping)
    );

    let (code, t) = trace(&c.nodes[0], pod, "10.244.2.2", &[], &same);
    assert_eq!(t["verdict"], "left", "{t:#}");
    assert_eq!(code, 0, "{t:#}");
    assert_eq!(t["left"]["device"], "eth0", "{t:#}");
    assert_eq!(t["left"]["encapsulatedBy"], "flannel.1", "{t:#}");
    assert_eq!(t["left"]["nextHop"], "192.0.2.2", "{t:#}");
    assert_eq!(t["from"], pod.as_str());

    // Without the kernel's record, leaving is not shown: no verdict.
    let path = c.nodes[0].path().display().to_string();
    let unseen = std::process::Command::new(cnilab_tests::workspace_bin("cnilab"))
        .args(["trace", pod, "10.244.2.2", "--netns", &path])
        .env("CNILAB_DROP_REASONS", "off")
        .output()
        .expect("cnilab runs");
    let text = all(&unseen);
    assert_eq!(unseen.status.code(), Some(3), "{text}");
    assert!(
        text.contains("INCONCLUSIVE") && text.contains("by eth0 toward 192.0.2.2"),
        "{text}"
    );
    let out = cnilab(&["trace", pod, "10.244.2.2", "--netns", &path]);
    let text = all(&out);
    assert!(
        text.contains("LEFT ") && text.contains("(encapsulated by flannel.1)"),
        "{text}"
    );

    let (code, t) = trace(&c.nodes[0], pod, "10.244.1.3", &[], &same);
    assert_eq!((code, t["verdict"].as_str()), (0, Some("arrived")), "{t:#}");
    let to = t["hops"]
        .as_array()
        .and_then(|h| h.last())
        .map(|h| h["namespace"].clone());
    assert_eq!(to, Some(Value::from(c.names[0][1].clone())), "{t:#}");
}

/// flanneld's forward accept gone from node 1 (its FORWARD policy is
/// DROP): the trace dies in node 1 at the policy, names the node, and
/// exits 1; the node is left as the fault made it.
#[test]
fn a_forward_policy_drop_on_a_flannel_node_is_named_there() {
    let _host = host_untouched();
    let c = styles::flannel();
    let sw = switch(&c);
    let same = everything(&c, &sw);
    run_args(
        &c.nodes[0],
        "iptables-nft",
        &[
            "-D",
            "FORWARD",
            "-m",
            "comment",
            "--comment",
            "flanneld forward",
            "-j",
            "FLANNEL-FWD",
        ],
    );
    let node = c.nodes[0].name().to_string();
    let (code, t) = trace(&c.nodes[0], &c.names[0][1], "10.244.2.3", &[], &same);
    assert_eq!((code, t["verdict"].as_str()), (1, Some("died")), "{t:#}");
    let d = &t["death"];
    assert_eq!(d["namespace"], node.as_str(), "{t:#}");
    assert_eq!(d["node"], node.as_str(), "{t:#}");
    assert_eq!(d["cause"], "firewall-policy", "{t:#}");
    assert!(
        d["object"].as_str().is_some_and(|o| o.contains("FORWARD")),
        "the object names the chain: {t:#}"
    );
}

/// kube-router nodes, whose pods no `/run/netns` name holds: FROM as
/// `pid:N` of the pod's process. A blackhole route to the other node's
/// pod subnet on node 1 is named, with the route.
#[test]
fn a_pod_held_by_a_process_is_traced_by_its_pid_and_a_blackhole_named() {
    let _host = host_untouched();
    let c = styles::kube_router();
    let sw = switch(&c);
    let same = everything(&c, &sw);
    let pid = c.names[0]
        .iter()
        .find(|n| n.starts_with("pid:"))
        .expect("a pod held by its process only")
        .clone();
    let (code, healthy) = trace(&c.nodes[0], &pid, "10.244.2.2", &[], &same);
    assert_eq!(
        (code, healthy["verdict"].as_str()),
        (0, Some("left")),
        "{healthy:#}"
    );
    run(
        &c.nodes[0],
        "ip",
        &["route replace blackhole 10.244.2.0/24"],
    );
    let (code, t) = trace(&c.nodes[0], &pid, "10.244.2.2", &[], &same);
    assert_eq!((code, t["verdict"].as_str()), (1, Some("died")), "{t:#}");
    assert_eq!(t["death"]["cause"], "blackhole", "{t:#}");
    assert!(
        t["death"]["object"]
            .as_str()
            .is_some_and(|o| o.contains("10.244.2.0/24")),
        "{t:#}"
    );
}

/// Names that are nobody here are a usage error (exit 2) that lists the
/// node and its pods; nothing is changed.
#[test]
fn an_unknown_from_is_a_usage_error_naming_the_pods() {
    let _host = host_untouched();
    let c = styles::flannel();
    let sw = switch(&c);
    let same = everything(&c, &sw);
    let before: Vec<_> = same.iter().map(|n| network_of(n)).collect();
    let path = c.nodes[0].path().display().to_string();
    let out = cnilab(&["trace", "default/nope", "10.244.2.2", "--netns", &path]);
    assert_eq!(out.status.code(), Some(2), "{}", all(&out));
    let text = all(&out);
    assert!(
        text.contains("default/nope") && text.contains(&c.names[0][0]),
        "{text}"
    );
    for (n, b) in same.iter().zip(&before) {
        assert!(network_of(n).changes_since(b).is_empty(), "{}", n.name());
    }
    let out = cnilab(&[
        "trace",
        &c.names[0][0],
        "10.244.2.2",
        "--netns",
        &path,
        "--proto",
        "tcp",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", all(&out));
    assert!(all(&out).contains("--port"), "{}", all(&out));
}

/// Calico nodes: to the other node's pod the packet leaves by `eth0`
/// toward that node (BIRD's route, no encapsulation). A workload route
/// Felix never programmed (the pod's /32 on its `cali` veth deleted) sends
/// a same-node packet into the IPAM block's blackhole, which is named.
#[test]
fn a_calico_pod_missing_its_workload_route_dies_in_the_blocks_blackhole() {
    let _host = host_untouched();
    let c = styles::calico_cluster();
    let sw = switch(&c);
    let same = everything(&c, &sw);
    let pod = &c.names[0][0];
    let (code, t) = trace(&c.nodes[0], pod, "10.65.2.2", &[], &same);
    assert_eq!((code, t["verdict"].as_str()), (0, Some("left")), "{t:#}");
    assert_eq!(t["left"]["device"], "eth0", "{t:#}");
    assert_eq!(t["left"]["nextHop"], "192.0.2.2", "{t:#}");
    assert!(t["left"].get("encapsulatedBy").is_none(), "{t:#}");
    let (code, t) = trace(&c.nodes[0], pod, "10.65.1.3", &[], &same);
    assert_eq!((code, t["verdict"].as_str()), (0, Some("arrived")), "{t:#}");

    run(&c.nodes[0], "ip", &["route del 10.65.1.3/32"]);
    let (code, t) = trace(&c.nodes[0], pod, "10.65.1.3", &[], &same);
    assert_eq!((code, t["verdict"].as_str()), (1, Some("died")), "{t:#}");
    assert_eq!(t["death"]["cause"], "blackhole", "{t:#}");
    assert_eq!(t["death"]["namespace"], c.nodes[0].name(), "{t:#}");
    assert!(
        t["death"]["object"]
            .as_str()
            .is_some_and(|o| o.contains("10.65.1.0/26")),
        "{t:#}"
    );
}

/// Policy routing on a kube-router node: a rule sending node 1's pod
/// traffic to table 100 is named on the hop it decided; a blackhole in
/// that table is the death, named as the route of table 100 with the rule;
/// a rule whose own action refuses the packet is named as the rule.
#[test]
fn a_policy_rule_and_its_table_are_named() {
    let _host = host_untouched();
    let c = styles::kube_router();
    let sw = switch(&c);
    let same = everything(&c, &sw);
    let pod = c.names[0][0].clone();
    let node = &c.nodes[0];
    run(
        node,
        "ip",
        &[
            "rule add from 10.244.1.0/24 lookup 100 prio 100",
            "route add 10.244.2.0/24 via 192.0.2.2 dev eth0 table 100",
        ],
    );
    let (code, t) = trace(node, &pod, "10.244.2.2", &[], &same);
    assert_eq!((code, t["verdict"].as_str()), (0, Some("left")), "{t:#}");
    let chosen = t["hops"].as_array().is_some_and(|h| {
        h.iter().any(|h| {
            h["namespace"] == node.name()
                && h["evidence"].as_str().is_some_and(|e| {
                    e.contains("table 100; chosen by rule 100: from 10.244.1.0/24 lookup 100")
                })
        })
    });
    assert!(chosen, "{t:#}");

    run(
        node,
        "ip",
        &["route replace blackhole 10.244.2.0/24 table 100"],
    );
    let (code, t) = trace(node, &pod, "10.244.2.2", &[], &same);
    assert_eq!((code, t["verdict"].as_str()), (1, Some("died")), "{t:#}");
    let d = &t["death"];
    assert_eq!(d["cause"], "blackhole", "{t:#}");
    assert_eq!(
        d["object"], "route blackhole 10.244.2.0/24 table 100",
        "{t:#}"
    );
    assert!(
        d["evidence"]
            .as_str()
            .is_some_and(|e| e.contains("chosen by rule 100: from 10.244.1.0/24 lookup 100")),
        "{t:#}"
    );

    run(
        node,
        "ip",
        &["rule add from 10.244.1.0/24 to 10.244.2.0/24 prohibit prio 90"],
    );
    let (code, t) = trace(node, &pod, "10.244.2.2", &[], &same);
    assert_eq!((code, t["verdict"].as_str()), (1, Some("died")), "{t:#}");
    assert_eq!(t["death"]["cause"], "prohibit", "{t:#}");
    assert_eq!(
        t["death"]["object"], "rule 90: from 10.244.1.0/24 to 10.244.2.0/24 prohibit",
        "{t:#}"
    );
}
