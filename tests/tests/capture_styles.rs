//! `cnilab capture` of two-node clusters in three real node styles, built
//! with plain `ip`, `bridge`, `iptables-nft` and sysctl writes in throwaway
//! namespaces (not by the lab), the way the CNI or kube-proxy builds them:
//! - flannel: a `flannel.1` VXLAN with one permanent neighbour and one FDB
//!   entry per peer naming the peer's VTEP MAC, an onlink route to the
//!   peer's pod subnet, a `cni0` bridge with veth pods, and iptables-nft
//!   FORWARD policy DROP with flannel's accept chain;
//! - Calico: /32 routes to `cali*` veths with proxy ARP, a blackhole
//!   aggregate for the node's block and a `proto bird` route to the peer's;
//! - kube-proxy: KUBE-SERVICES / KUBE-SVC-* / KUBE-SEP-* chains with DNAT
//!   to one endpoint on each node, via iptables-nft.
//!
//! Each node is captured with `--netns`; the test asserts the file holds
//! the objects (links with kinds and attributes, routes of each type,
//! sysctls, rules text with comments), the pods with their names, and that
//! every namespace of the cluster is the same after the capture as before.
//! The flannel cluster is also captured redacted with one key: a node's
//! FDB entry and neighbour still name the other node's (mapped) VTEP MAC
//! and (mapped) address.

mod capture_common;

use capture_common::styles::{calico_cluster, flannel, kube_proxy, kube_router};
use capture_common::*;
use cnilab_tests::host_untouched;
use serde_json::{json, Value};

/// Asserts `text` has each of `lines` as a whole line (trimmed).
fn has_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            text.lines().any(|l| l.trim() == *line),
            "{line:?} not in\n{text}"
        );
    }
}

/// The text of the nftables table `family name` in a captured namespace.
fn nft_table(ns: &Value, family: &str, name: &str) -> String {
    ns["nftables"]
        .as_array()
        .and_then(|t| {
            t.iter()
                .find(|t| t["family"] == family && t["name"] == name)
        })
        .and_then(|t| t["text"].as_str())
        .unwrap_or_else(|| panic!("no {family} {name} in {}", ns["nftables"]))
        .to_string()
}

#[test]
fn a_flannel_cluster_is_captured_node_by_node() {
    let _host = host_untouched();
    let k = flannel();
    let caps: Vec<Value> = (0..2).map(|i| k.capture(i, &[])).collect();
    for (i, c) in caps.iter().enumerate() {
        let (me, peer) = (i + 1, 2 - i);
        let node = &c["node"];
        assert_eq!(c["provenance"]["nodeName"], k.nodes[i].name());
        let vx = link(node, "flannel.1");
        assert_eq!(vx["kind"], "vxlan");
        assert_eq!(
            vx["vxlan"],
            json!({"vni": 1, "local": format!("192.0.2.{me}"), "port": 8472, "dev": "eth0", "learning": false})
        );
        assert_eq!(vx["addresses"], json!([format!("10.244.{me}.0/32")]));
        // The peer's VTEP MAC, as the peer's own capture has it.
        let peer_mac = link(&caps[peer - 1]["node"], "flannel.1")["mac"].clone();
        assert!(peer_mac.is_string(), "{peer_mac}");
        assert!(
            has(
                &node["fdb"],
                json!({"dev": "flannel.1", "mac": peer_mac, "dst": format!("192.0.2.{peer}")})
            ),
            "{}",
            node["fdb"]
        );
        assert!(
            has(
                &node["neighbours"],
                json!({"dev": "flannel.1", "addr": format!("10.244.{peer}.0"), "mac": peer_mac, "state": "permanent"})
            ),
            "{}",
            node["neighbours"]
        );
        assert!(
            has(
                &node["routes"],
                json!({"dst": format!("10.244.{peer}.0/24"), "gateway": format!("10.244.{peer}.0"), "dev": "flannel.1", "onlink": true, "type": "unicast"})
            ),
            "{}",
            node["routes"]
        );
        let cni0 = link(node, "cni0");
        assert_eq!(cni0["kind"], "bridge");
        assert_eq!(cni0["addresses"], json!([format!("10.244.{me}.1/24")]));
        for (j, p) in k.pods[i].iter().enumerate() {
            let l = link(node, &format!("veth{me}{j}"));
            assert_eq!(l["kind"], "veth");
            assert_eq!(l["controller"], "cni0");
            assert_eq!(l["veth"], json!({"namespace": p.name(), "name": "eth0"}));
            assert!(
                has(
                    &pod_named(c, p.name())["routes"],
                    json!({"dst": "0.0.0.0/0", "gateway": format!("10.244.{me}.1")})
                ),
                "{}",
                pod_named(c, p.name())
            );
        }
        let addrs: Vec<String> = (2..4).map(|h| format!("10.244.{me}.{h}/24")).collect();
        k.assert_pods(c, i, &addrs);
        assert_eq!(node["sysctls"]["net/ipv4/ip_forward"], "1");
        has_lines(
            &iptables_text(node, "nft"),
            &[
                ":FORWARD DROP",
                "-A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD",
                "-A FLANNEL-FWD -s 10.244.0.0/16 -m comment --comment \"flanneld forward\" -j ACCEPT",
                "-A FLANNEL-FWD -d 10.244.0.0/16 -m comment --comment \"flanneld forward\" -j ACCEPT",
            ],
        );
        has_lines(
            &nft_table(node, "ip", "filter"),
            &[
                "type filter hook forward priority filter; policy drop;",
                "chain FLANNEL-FWD {",
            ],
        );
    }

    // Redacted with one key, node by node: the relations across nodes hold.
    let red: Vec<Value> = (0..2)
        .map(|i| k.capture(i, &["--redact-key", "one cluster"]))
        .collect();
    for (i, c) in red.iter().enumerate() {
        let peer = &red[1 - i]["node"];
        let peer_mac = link(peer, "flannel.1")["mac"].clone();
        let plain_mac = link(&caps[1 - i]["node"], "flannel.1")["mac"].clone();
        assert_ne!(peer_mac, plain_mac, "the VTEP MAC is mapped");
        let peer_vtep = link(peer, "flannel.1")["vxlan"]["local"].clone();
        assert_ne!(
            peer_vtep,
            link(&caps[1 - i]["node"], "flannel.1")["vxlan"]["local"]
        );
        assert!(
            has(
                &c["node"]["fdb"],
                json!({"dev": "flannel.1", "mac": peer_mac, "dst": peer_vtep})
            ),
            "node {i}'s FDB names node {}'s mapped VTEP: {peer_mac} {peer_vtep} {}",
            2 - i,
            c["node"]["fdb"]
        );
        assert!(
            has(
                &c["node"]["neighbours"],
                json!({"dev": "flannel.1", "mac": peer_mac})
            ),
            "{}",
            c["node"]["neighbours"]
        );
    }
}

#[test]
fn a_calico_cluster_is_captured_node_by_node() {
    let _host = host_untouched();
    let k = calico_cluster();
    for i in 0..2 {
        let c = k.capture(i, &[]);
        let (me, peer) = (i + 1, 2 - i);
        let node = &c["node"];
        let routes = &node["routes"];
        for want in [
            json!({"dst": format!("10.65.{me}.0/26"), "type": "blackhole", "proto": "bird"}),
            json!({"dst": format!("10.65.{peer}.0/26"), "type": "unicast", "gateway": format!("192.0.2.{peer}"), "dev": "eth0", "proto": "bird"}),
        ] {
            assert!(has(routes, want.clone()), "{want} not in {routes}");
        }
        let mut addrs = Vec::new();
        for (j, p) in k.pods[i].iter().enumerate() {
            let cali = format!("cali{me}{j}f00d");
            let addr = format!("10.65.{me}.{}", j + 2);
            let l = link(node, &cali);
            assert_eq!(l["kind"], "veth");
            assert_eq!(l["mac"], "ee:ee:ee:ee:ee:ee");
            assert_eq!(l["veth"], json!({"namespace": p.name(), "name": "eth0"}));
            assert!(
                has(
                    routes,
                    json!({"dst": format!("{addr}/32"), "dev": cali, "scope": "link", "type": "unicast"})
                ),
                "{routes}"
            );
            assert_eq!(
                node["sysctls"][format!("net/ipv4/conf/{cali}/proxy_arp")],
                "1"
            );
            let pod = pod_named(&c, p.name());
            assert!(
                has(
                    &pod["neighbours"],
                    json!({"dev": "eth0", "addr": "169.254.1.1", "mac": "ee:ee:ee:ee:ee:ee", "state": "permanent"})
                ),
                "{}",
                pod["neighbours"]
            );
            assert!(
                has(
                    &pod["routes"],
                    json!({"dst": "0.0.0.0/0", "gateway": "169.254.1.1", "dev": "eth0"})
                ),
                "{}",
                pod["routes"]
            );
            addrs.push(format!("{addr}/32"));
        }
        k.assert_pods(&c, i, &addrs);
        assert_eq!(node["sysctls"]["net/ipv4/conf/eth0/proxy_arp"], "0");
        has_lines(
            &iptables_text(node, "nft"),
            &[
                "-A FORWARD -m comment --comment \"cali:wUHhoiAYhphO9Mso\" -j cali-FORWARD",
                "-A cali-FORWARD -i cali+ -m comment --comment \"cali:from-wl-dispatch\" -j ACCEPT",
            ],
        );
    }
}

#[test]
fn kube_proxy_service_chains_are_captured_on_each_node() {
    let _host = host_untouched();
    let k = kube_proxy();
    let mut texts = Vec::new();
    for i in 0..2 {
        let c = k.capture(i, &[]);
        let me = i + 1;
        let node = &c["node"];
        let save = iptables_text(node, "nft");
        has_lines(
            &save,
            &[
                "*nat",
                ":KUBE-SERVICES -",
                "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
                "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-WEB4HTTP",
                "-A KUBE-SVC-WEB4HTTP -m comment --comment \"default/web:http -> 10.244.1.2:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-NODE1WEB",
                "-A KUBE-SVC-WEB4HTTP -m comment --comment \"default/web:http -> 10.244.2.2:8080\" -j KUBE-SEP-NODE2WEB",
                "-A KUBE-SEP-NODE1WEB -p tcp -m comment --comment \"default/web:http\" -m tcp -j DNAT --to-destination 10.244.1.2:8080",
                "-A KUBE-SEP-NODE2WEB -p tcp -m comment --comment \"default/web:http\" -m tcp -j DNAT --to-destination 10.244.2.2:8080",
                "-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE",
            ],
        );
        let nat = nft_table(node, "ip", "nat");
        for needle in [
            "chain KUBE-SERVICES {",
            "chain KUBE-SVC-WEB4HTTP {",
            "ip daddr 10.96.0.10 tcp dport 80",
            "dnat to 10.244.1.2:8080",
            "dnat to 10.244.2.2:8080",
            "masquerade",
        ] {
            assert!(nat.contains(needle), "{needle:?} not in\n{nat}");
        }
        assert!(
            has(
                &node["routes"],
                json!({"dst": format!("10.244.{me}.2/32"), "dev": format!("veth{me}web")})
            ),
            "{}",
            node["routes"]
        );
        k.assert_pods(&c, i, &[format!("10.244.{me}.2/24")]);
        texts.push(save);
    }
    assert_eq!(
        texts[0], texts[1],
        "kube-proxy writes the same chains on every node"
    );
}

/// kube-router-style nodes whose pods no runtime named: one held by its
/// process only (found as `pid:<n>`), one also mounted where Docker mounts
/// a sandbox's namespace (named by the mount's id, its path recorded). Both
/// are found with their addresses and the evidence that makes them pods.
#[test]
fn a_kube_router_cluster_with_pods_held_by_processes_is_captured() {
    let _host = host_untouched();
    let k = kube_router();
    for i in 0..2 {
        let me = i + 1;
        // The node's files as kube-router and libcni leave them: its
        // conflist (the bridge plugin, host-local on the node's pod CIDR)
        // and an ADD result for the first pod.
        let files = tempfile::tempdir().expect("dir");
        let (conf, cache) = (files.path().join("net.d"), files.path().join("results"));
        std::fs::create_dir_all(&conf).expect("mkdir");
        std::fs::create_dir_all(&cache).expect("mkdir");
        let conflist = json!({
            "cniVersion": "0.3.0", "name": "mynet",
            "plugins": [
                {"bridge": "kube-bridge", "ipam": {"subnet": format!("10.244.{me}.0/24"), "type": "host-local"},
                 "isDefaultGateway": true, "name": "kubernetes", "type": "bridge"},
                {"capabilities": {"portMappings": true, "snat": true}, "type": "portmap"}
            ]
        });
        std::fs::write(conf.join("10-kuberouter.conflist"), conflist.to_string()).expect("write");
        let id = "9d3c1f6a2b7e4c8d0a5f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";
        let entry = json!({
            "kind": "cniCacheV1", "containerId": id, "ifName": "eth0", "networkName": "mynet",
            "config": "", "result": {"cniVersion": "0.3.0", "ips": [{"version": "4", "address": format!("10.244.{me}.2/24")}]}
        });
        std::fs::write(cache.join(format!("mynet-{id}-eth0")), entry.to_string()).expect("write");
        let c = k.capture(
            i,
            &[
                "--cni-conf-dir",
                &conf.display().to_string(),
                "--cni-cache",
                &cache.display().to_string(),
            ],
        );
        let addrs: Vec<String> = (2..4).map(|h| format!("10.244.{me}.{h}/24")).collect();
        k.assert_pods(&c, i, &addrs);
        let mounted = &k.names[i][0];
        let source = c["pods"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == mounted.as_str()))
            .unwrap_or_else(|| panic!("{mounted} not found: {}", c["pods"]));
        assert!(
            source["netns"]
                .as_str()
                .is_some_and(|n| n.ends_with(&format!("/docker/netns/{mounted}"))),
            "{source}"
        );
        for p in c["pods"].as_array().into_iter().flatten() {
            let evidence = p["evidence"].to_string();
            assert!(
                evidence.contains("leads into the node") && evidence.contains("kube-bridge"),
                "{p}"
            );
            assert!(
                evidence.contains(&format!(
                    "subnet 10.244.{me}.0/24 of the node's CNI config 10-kuberouter.conflist (network mynet: bridge, portmap)"
                )),
                "{p}"
            );
            let first = pod_named(&c, &k.names[i][0])["links"].to_string();
            let cached = first.contains(&format!("10.244.{me}.2/24"));
            assert_eq!(
                evidence.contains(
                    "CNI cache has network mynet's ADD result for container 9d3c1f6a2b7e"
                ),
                p["name"] == k.names[i][0].as_str() && cached,
                "{p}"
            );
            assert!(p.get("skipped").is_none(), "{p}");
        }
        assert!(
            has(
                &c["node"]["routes"],
                json!({"dst": format!("10.244.{}.0/24", 3 - me), "proto": "17"})
            ),
            "{}",
            c["node"]["routes"]
        );
    }
}
