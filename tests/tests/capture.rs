//! `cnilab capture` (root): nodes built the way real CNIs build them, with
//! plain `ip`, `bridge`, `tc`, `iptables` and `nft` commands in throwaway
//! namespaces (not by the lab): flannel (VXLAN with FDB and permanent
//! neighbours, a bridge with veth pods, FORWARD policy DROP and an accept
//! chain), Calico (/32 routes to `cali*` veths with proxy ARP, a blackhole
//! aggregate, legacy iptables, a macvlan pod), kube-proxy (Service chains,
//! DNAT), a pod held only by a process. Each checks the file holds what was
//! made, by name and value, and that every namespace is as it was before
//! the capture. (`capture_cli.rs`: redaction, a lab node, bad input, the
//! 110-pod figure; `capture_styles.rs`: two-node clusters of each style,
//! with the relations between the nodes.)

mod capture_common;

use capture_common::*;
use cnilab_tests::host_untouched;
use std::path::Path;
use std::process::Command;

#[test]
fn a_flannel_node_is_captured() {
    let _host = host_untouched();
    let n = node("cap-flannel", "192.0.2.1/24");
    run(
        &n,
        "ip",
        &[
            "link add flannel.1 type vxlan id 1 local 192.0.2.1 dev eth0 dstport 8472 nolearning",
            "link set flannel.1 up",
            "addr add 10.244.1.0/32 dev flannel.1",
            "neigh add 10.244.2.0 lladdr 02:aa:00:00:00:02 dev flannel.1 nud permanent",
            "route add 10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink",
            "link add cni0 type bridge",
            "link set cni0 up",
            "addr add 10.244.1.1/24 dev cni0",
        ],
    );
    run(
        &n,
        "bridge",
        &["fdb append 02:aa:00:00:00:02 dev flannel.1 dst 192.0.2.2"],
    );
    run(&n, "tc", &["qdisc add dev eth0 root handle 1: pfifo"]);
    let p1 = pod(
        &n,
        "veth1",
        "10.244.1.2/24",
        &["route add default via 10.244.1.1"],
    );
    let p2 = pod(
        &n,
        "veth2",
        "10.244.1.3/24",
        &["route add default via 10.244.1.1"],
    );
    run(
        &n,
        "ip",
        &["link set veth1 master cni0", "link set veth2 master cni0"],
    );
    run(
        &n,
        "iptables-nft",
        &[
            "-P FORWARD DROP",
            "-N FLANNEL-FWD",
            "-A FORWARD -j FLANNEL-FWD",
            "-A FLANNEL-FWD -s 10.244.0.0/16 -j ACCEPT",
        ],
    );

    let c = capture(&n, &[], &[&n, &p1, &p2]);
    assert_eq!(c["schemaVersion"], 1);
    assert_eq!(c["provenance"]["nodeName"], n.name());
    assert!(c["provenance"]["kernel"]
        .as_str()
        .is_some_and(|k| !k.is_empty()));
    let node = &c["node"];
    assert_eq!(node["name"], n.name());
    let vx = link(node, "flannel.1");
    assert_eq!(vx["kind"], "vxlan");
    assert_eq!(
        vx["vxlan"],
        serde_json::json!({"vni": 1, "local": "192.0.2.1", "port": 8472, "dev": "eth0", "learning": false})
    );
    assert_eq!(vx["addresses"], serde_json::json!(["10.244.1.0/32"]));
    assert!(
        has(
            &node["fdb"],
            serde_json::json!({"dev": "flannel.1", "mac": "02:aa:00:00:00:02", "dst": "192.0.2.2"})
        ),
        "{}",
        node["fdb"]
    );
    assert!(
        has(
            &node["neighbours"],
            serde_json::json!({"dev": "flannel.1", "addr": "10.244.2.0", "mac": "02:aa:00:00:00:02", "state": "permanent"})
        ),
        "{}",
        node["neighbours"]
    );
    assert!(
        has(
            &node["routes"],
            serde_json::json!({"dst": "10.244.2.0/24", "gateway": "10.244.2.0", "dev": "flannel.1", "onlink": true})
        ),
        "{}",
        node["routes"]
    );
    assert!(
        has(
            &node["qdiscs"],
            serde_json::json!({"dev": "eth0", "kind": "pfifo", "handle": "1:"})
        ),
        "{}",
        node["qdiscs"]
    );
    assert_eq!(link(node, "cni0")["kind"], "bridge");
    for (host_if, p, addr) in [
        ("veth1", &p1, "10.244.1.2/24"),
        ("veth2", &p2, "10.244.1.3/24"),
    ] {
        let l = link(node, host_if);
        assert_eq!(l["controller"], "cni0");
        assert_eq!(
            l["veth"],
            serde_json::json!({"namespace": p.name(), "name": "eth0"})
        );
        let pod = pod_named(&c, p.name());
        assert_eq!(link(pod, "eth0")["addresses"], serde_json::json!([addr]));
        assert!(
            has(
                &pod["routes"],
                serde_json::json!({"dst": "0.0.0.0/0", "gateway": "10.244.1.1"})
            ),
            "{}",
            pod["routes"]
        );
        assert!(
            has(
                &c["pods"],
                serde_json::json!({"name": p.name(), "netns": p.name()})
            ),
            "{}",
            c["pods"]
        );
    }
    assert_eq!(
        c["node"]["pods"].as_array().map(Vec::len),
        Some(2),
        "{}",
        c["pods"]
    );
    let filter = node["nftables"]
        .as_array()
        .and_then(|t| {
            t.iter()
                .find(|t| t["family"] == "ip" && t["name"] == "filter")
        })
        .unwrap_or_else(|| panic!("no ip filter in {}", node["nftables"]));
    let text = filter["text"].as_str().unwrap_or_default();
    for line in [
        "chain FORWARD {",
        "type filter hook forward priority filter; policy drop;",
        "counter jump FLANNEL-FWD",
        "ip saddr 10.244.0.0/16 counter accept",
    ] {
        assert!(
            text.lines().any(|l| l.trim() == line),
            "{line:?} not in {text}"
        );
    }
    assert_eq!(node["sysctls"]["net/ipv4/conf/cni0/forwarding"], "0");
}

#[test]
fn a_calico_node_is_captured() {
    let _host = host_untouched();
    let k = calico();
    let c = capture(&k.node, &[], &[&k.node, &k.pods[0], &k.pods[1], &k.macvlan]);
    let node = &c["node"];
    let routes = &node["routes"];
    assert!(
        has(
            routes,
            serde_json::json!({"dst": "10.65.1.0/26", "type": "blackhole", "proto": "bird"})
        ),
        "{routes}"
    );
    assert!(
        has(
            routes,
            serde_json::json!({"dst": "203.0.113.0/24", "type": "unreachable"})
        ),
        "{routes}"
    );
    assert!(
        has(
            routes,
            serde_json::json!({"dst": "198.51.100.0/24", "type": "prohibit"})
        ),
        "{routes}"
    );
    assert!(
        has(
            routes,
            serde_json::json!({"dst": "100.70.0.0/16", "nexthops": [
        {"dev": "eth0", "gateway": "198.18.7.2", "weight": 1},
        {"dev": "eth0", "gateway": "198.18.7.3", "weight": 2}]})
        ),
        "{routes}"
    );
    for (i, p) in k.pods.iter().enumerate() {
        let cali = format!("cali{i}abc");
        let addr = format!("10.65.1.{}", i + 2);
        assert!(
            has(
                routes,
                serde_json::json!({"dst": format!("{addr}/32"), "dev": cali, "scope": "link"})
            ),
            "{routes}"
        );
        assert_eq!(
            node["sysctls"][format!("net/ipv4/conf/{cali}/proxy_arp")],
            "1"
        );
        assert_eq!(link(node, &cali)["veth"]["namespace"], p.name());
        let pod = pod_named(&c, p.name());
        assert_eq!(
            link(pod, "eth0")["addresses"],
            serde_json::json!([format!("{addr}/32")])
        );
        assert!(
            has(
                &pod["routes"],
                serde_json::json!({"dst": "0.0.0.0/0", "gateway": "169.254.1.1", "dev": "eth0"})
            ),
            "{}",
            pod["routes"]
        );
    }
    let mv = pod_named(&c, k.macvlan.name());
    assert_eq!(link(mv, "mv0")["kind"], "macvlan");
    assert_eq!(
        link(mv, "mv0")["lower"],
        serde_json::json!({"namespace": k.node.name(), "name": "eth0", "mode": "bridge"})
    );
    let text = iptables_text(node, "legacy");
    assert!(
        text.lines()
            .any(|l| l == "-A FORWARD -i cali+ -m comment --comment cali-from-wl -j ACCEPT"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l == ":FORWARD ACCEPT"),
        "counters are left out: {text}"
    );
}

#[test]
fn kube_proxy_service_chains_are_captured() {
    let _host = host_untouched();
    let n = node("cap-kproxy", "198.18.9.1/24");
    let p = pod(
        &n,
        "vethsvc",
        "10.244.1.2/24",
        &["route add default via 10.244.1.1 dev eth0 onlink"],
    );
    run(
        &n,
        "iptables-nft",
        &[
            "-t nat -N KUBE-SERVICES",
            "-t nat -N KUBE-SVC-ABCDEF",
            "-t nat -N KUBE-SEP-123456",
            "-t nat -A PREROUTING -j KUBE-SERVICES",
            "-t nat -A OUTPUT -j KUBE-SERVICES",
            "-t nat -A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment default/web:http -m tcp --dport 80 -j KUBE-SVC-ABCDEF",
            "-t nat -A KUBE-SVC-ABCDEF -j KUBE-SEP-123456",
            "-t nat -A KUBE-SEP-123456 -p tcp -m tcp -j DNAT --to-destination 10.244.1.2:8080",
        ],
    );
    let c = capture(&n, &[], &[&n, &p]);
    let nat = c["node"]["nftables"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["family"] == "ip" && t["name"] == "nat"))
        .unwrap_or_else(|| panic!("no ip nat in {}", c["node"]["nftables"]));
    let text = nat["text"].as_str().unwrap_or_default();
    for needle in [
        "chain KUBE-SERVICES {",
        "chain KUBE-SVC-ABCDEF {",
        "chain KUBE-SEP-123456 {",
        "ip daddr 10.96.0.10 tcp dport 80",
        "jump KUBE-SVC-ABCDEF",
        "dnat to 10.244.1.2:8080",
    ] {
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    // nft does not print iptables-nft's comments: the iptables-save text has them.
    let save_text = iptables_text(&c["node"], "nft");
    assert!(
        save_text.lines().any(|l| l == "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/web:http\" -m tcp --dport 80 -j KUBE-SVC-ABCDEF"),
        "{save_text}"
    );
    assert_eq!(c["pods"][0]["name"], p.name());

    let r = capture(&n, &["--redact-key", "k"], &[&n, &p]);
    let nat = format!(
        "{}\n{}",
        r["node"]["nftables"].to_string().replace("\\n", "\n"),
        r["node"]["iptables"][0]["text"]
            .as_str()
            .unwrap_or_default()
    );
    for gone in ["10.96.0.10", "10.244.1.2", "default/web"] {
        assert!(!has_word(&nat, gone), "{gone} in {nat}");
    }
    assert!(
        nat.contains("chain KUBE-SVC-ABCDEF {") && nat.contains("dport 80"),
        "{nat}"
    );
    let pod_addr = r["node"]["pods"][0]["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "eth0"))
        .and_then(|l| l["addresses"][0].as_str())
        .and_then(|a| a.split('/').next())
        .expect("pod address")
        .to_string();
    assert!(
        nat.contains(&format!("dnat to {pod_addr}:8080")),
        "the DNAT still names the pod: {pod_addr} {nat}"
    );
}

/// Kills the process when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_pod_held_only_by_a_process_is_found() {
    let _host = host_untouched();
    let n = node("cap-held", "198.18.10.1/24");
    let child = Child(
        Command::new("unshare")
            .args(["-n", "sleep", "300"])
            .spawn()
            .expect("unshare -n sleep"),
    );
    let pid = child.0.id();
    let ns_path = format!("/proc/{pid}/ns/net");
    // `unshare` execs sleep in its new namespace: wait until it has one.
    let own =
        std::fs::metadata("/proc/self/ns/net").map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    for _ in 0..200 {
        let theirs = std::fs::metadata(&ns_path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        if theirs.is_ok() && theirs.ok() != own.as_ref().ok().copied() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    run(
        &n,
        "ip",
        &[
            &format!("link add hp0 type veth peer name eth0 netns {pid}"),
            "link set hp0 up",
        ],
    );
    let held = cnilab_net::netns::open_network_namespace(&ns_path).expect("the held namespace");
    let ip = |args: &[&str]| {
        let mut cmd = Command::new("ip");
        cmd.args(args);
        let out = cnilab_net::netns::spawn_in(&held, &mut cmd)
            .and_then(|c| c.wait_with_output())
            .expect("ip");
        assert!(out.status.success(), "{args:?}: {}", all(&out));
    };
    ip(&["addr", "add", "10.244.7.2/24", "dev", "eth0"]);
    ip(&["link", "set", "eth0", "up"]);
    let read =
        |p: &str| cnilab_harness::lab::layout::namespace_at(Path::new(p), "pod").expect("read");
    let before = read(&ns_path);
    let c = capture(&n, &[], &[&n]);
    assert_eq!(read(&ns_path), before, "the held namespace is unchanged");
    let name = format!("pid:{pid}");
    assert!(
        has(&c["pods"], serde_json::json!({"name": name, "pid": pid})),
        "{}",
        c["pods"]
    );
    assert!(c["pods"][0].get("netns").is_none(), "{}", c["pods"]);
    let pod = pod_named(&c, &name);
    assert_eq!(
        link(pod, "eth0")["addresses"],
        serde_json::json!(["10.244.7.2/24"])
    );
    assert_eq!(
        link(&c["node"], "hp0")["veth"],
        serde_json::json!({"namespace": name, "name": "eth0"})
    );
}
