//! `cnilab capture` (root): nodes built the way real CNIs build them, with
//! plain `ip`, `bridge`, `tc`, `iptables` and `nft` commands in throwaway
//! namespaces (not by the lab): flannel (VXLAN with FDB and permanent
//! neighbours, a bridge with veth pods, FORWARD policy DROP and an accept
//! chain), Calico (/32 routes to `cali*` veths with proxy ARP, a blackhole
//! aggregate, legacy iptables, a macvlan pod), kube-proxy (Service chains,
//! DNAT), a pod held only by a process, and a standing lab's node. Each
//! checks the file holds what was made, by name and value, and that every
//! namespace is as it was before the capture.

use cnilab_net::netns::Netns;
use cnilab_net::testing::network_of;
use cnilab_tests::{host_untouched, require_root, workspace_bin};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn all(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn cnilab(args: &[&str]) -> Output {
    Command::new(workspace_bin("cnilab"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("cnilab runs")
}

/// Runs each `program` line (split on spaces) inside `ns`.
fn run(ns: &Netns, program: &str, lines: &[&str]) {
    for line in lines {
        let args: Vec<&str> = line.split(' ').collect();
        let out = ns.command(program).args(&args).output().expect("runs");
        assert!(out.status.success(), "{program} {line}: {}", all(&out));
    }
}

/// A throwaway node with `lo` up and an uplink `eth0` (a veth whose peer
/// stays in the node: no other namespace is linked) at `addr`.
fn node(label: &str, addr: &str) -> Netns {
    require_root();
    let ns = Netns::with_label(label).expect("netns");
    run(
        &ns,
        "ip",
        &[
            "link set lo up",
            "link add eth0 type veth peer name eth0p",
            "link set eth0p up",
            "link set eth0 up",
            &format!("addr add {addr} dev eth0"),
        ],
    );
    ns
}

/// A pod namespace whose `eth0` is a veth to `host_if` in `node`, with
/// `addr` and the routes in `routes`.
fn pod(node: &Netns, host_if: &str, addr: &str, routes: &[&str]) -> Netns {
    let pod = Netns::with_label("cap-pod").expect("netns");
    run(
        node,
        "ip",
        &[
            &format!(
                "link add {host_if} type veth peer name eth0 netns {}",
                pod.name()
            ),
            &format!("link set {host_if} up"),
        ],
    );
    run(
        &pod,
        "ip",
        &[
            "link set lo up",
            "link set eth0 up",
            &format!("addr add {addr} dev eth0"),
        ],
    );
    run(&pod, "ip", routes);
    pod
}

/// `cnilab capture --netns NODE -o FILE EXTRA…`, parsed; asserts every
/// namespace in `same` is unchanged by it.
fn capture(node: &Netns, extra: &[&str], same: &[&Netns]) -> Value {
    let before: Vec<_> = same.iter().map(|n| network_of(n)).collect();
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("node.json");
    let path = node.path().display().to_string();
    let file_arg = file.display().to_string();
    let mut args = vec!["capture", "--netns", &path, "-o", &file_arg];
    args.extend_from_slice(extra);
    let out = cnilab(&args);
    assert!(out.status.success(), "{}", all(&out));
    for (n, b) in same.iter().zip(&before) {
        let changes = network_of(n).changes_since(b);
        assert!(
            changes.is_empty(),
            "capture changed {}: {changes:?}",
            n.name()
        );
    }
    let text = std::fs::read_to_string(&file).expect("the capture file");
    serde_json::from_str(&text).expect("JSON")
}

fn link<'a>(ns: &'a Value, name: &str) -> &'a Value {
    ns["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("no link {name} in {}", ns["links"]))
}

fn pod_named<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["node"]["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no pod {name} in {}", c["pods"]))
}

/// The IPv4 iptables-save text of `backend` (`legacy`, `nft`) in `ns`.
fn iptables_text(ns: &Value, backend: &str) -> String {
    ns["iptables"]
        .as_array()
        .and_then(|t| {
            t.iter()
                .find(|t| t["backend"] == backend && t["family"] == "ipv4")
        })
        .and_then(|t| t["text"].as_str())
        .unwrap_or_else(|| panic!("no {backend} ipv4 iptables in {}", ns["iptables"]))
        .to_string()
}

fn has(list: &Value, want: Value) -> bool {
    let want = want.as_object().expect("object");
    list.as_array().is_some_and(|l| {
        l.iter()
            .any(|item| want.iter().all(|(k, v)| item.get(k) == Some(v)))
    })
}

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

/// A Calico node, and the same node redacted.
struct Calico {
    node: Netns,
    pods: Vec<Netns>,
    macvlan: Netns,
}

fn calico() -> Calico {
    let n = node("cap-calico", "198.18.7.1/24");
    run(
        &n,
        "ip",
        &[
            "route add blackhole 10.65.1.0/26 proto bird",
            "route add unreachable 203.0.113.0/24",
            "route add prohibit 198.51.100.0/24",
            "route add 100.70.0.0/16 nexthop via 198.18.7.2 weight 1 nexthop via 198.18.7.3 weight 2",
            "route add default via 198.18.7.254",
        ],
    );
    let mut pods = Vec::new();
    for (i, addr) in ["10.65.1.2", "10.65.1.3"].iter().enumerate() {
        let cali = format!("cali{i}abc");
        let p = pod(
            &n,
            &cali,
            &format!("{addr}/32"),
            &[
                "route add 169.254.1.1 dev eth0 scope link",
                "route add default via 169.254.1.1 dev eth0",
            ],
        );
        run(
            &n,
            "ip",
            &[&format!("route add {addr}/32 dev {cali} scope link")],
        );
        cnilab_net::netns::write_sysctl(
            Some(n.file()),
            &format!("net/ipv4/conf/{cali}/proxy_arp"),
            "1",
        )
        .expect("proxy_arp");
        pods.push(p);
    }
    let mv = Netns::with_label("cap-mv").expect("netns");
    run(
        &n,
        "ip",
        &[
            "link add mv0 link eth0 type macvlan mode bridge",
            &format!("link set mv0 netns {}", mv.name()),
        ],
    );
    run(
        &mv,
        "ip",
        &["link set mv0 up", "addr add 198.18.7.50/24 dev mv0"],
    );
    run(
        &n,
        "iptables-legacy",
        &["-A FORWARD -i cali+ -m comment --comment cali-from-wl -j ACCEPT"],
    );
    Calico {
        node: n,
        pods,
        macvlan: mv,
    }
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

/// Every string of `v`, keys too.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.iter().for_each(|(k, x)| {
            out.push(k.clone());
            strings(x, out)
        }),
        _ => {}
    }
}

/// Whether `word` appears in `text` as a whole word (not inside a longer
/// address or name).
fn has_word(text: &str, word: &str) -> bool {
    let part = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == ':' || c == '-';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back().is_none_or(|c| !part(c));
        let after = text[i + word.len()..]
            .chars()
            .next()
            .is_none_or(|c| !part(c) || c == '/');
        before && after
    })
}

#[test]
fn a_redacted_capture_keeps_relations_and_no_original() {
    let _host = host_untouched();
    let k = calico();
    let same = [&k.node, &k.pods[0], &k.pods[1], &k.macvlan];
    let c = capture(&k.node, &["--redact-key", "one cluster"], &same);
    let again = capture(&k.node, &["--redact-key", "one cluster"], &same);
    assert_eq!(c["node"], again["node"], "the same key maps the same way");
    assert_eq!(c["provenance"]["redacted"], true);
    let mut texts = Vec::new();
    strings(&c, &mut texts);
    let text = texts.join("\n");
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let mut originals: Vec<String> = [
        "198.18.7.1",
        "198.18.7.0/24",
        "10.65.1.0/26",
        "10.65.1.2",
        "10.65.1.3",
        "203.0.113.0/24",
        "198.51.100.0/24",
        "100.70.0.0/16",
        "198.18.7.2",
        "198.18.7.3",
        "198.18.7.254",
        "198.18.7.50",
        "cali-from-wl",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    originals.push(hostname.trim().to_string());
    originals.extend(same.iter().map(|n| n.name().to_string()));
    for o in &originals {
        assert!(!has_word(&text, o), "{o} is still in the redacted capture");
    }
    // Relations: each cali's /32 route names its pod's (mapped) address, the
    // blackhole aggregate holds both, the uplink's gateways stay in its subnet,
    // 169.254.1.1 stays link-local, the veth names its (mapped) pod.
    let node = &c["node"];
    let net = |s: &Value| {
        s.as_str()
            .and_then(|s| s.parse::<ipnet::IpNet>().ok())
            .expect("prefix")
    };
    let aggregate = node["routes"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["type"] == "blackhole"))
        .map(|r| net(&r["dst"]))
        .expect("blackhole");
    assert_eq!(aggregate.prefix_len(), 26);
    let uplink = net(&link(node, "eth0")["addresses"][0]);
    assert_eq!(uplink.prefix_len(), 24);
    for i in 0..2 {
        let cali = link(node, &format!("cali{i}abc"));
        let pod_name = cali["veth"]["namespace"].as_str().expect("pod name");
        assert!(pod_name.starts_with("pod-"), "{pod_name}");
        let pod = pod_named(&c, pod_name);
        let addr = net(&link(pod, "eth0")["addresses"][0]);
        assert_eq!(addr.prefix_len(), 32);
        assert!(aggregate.contains(&addr.addr()), "{aggregate} holds {addr}");
        assert!(
            addr.addr().to_string().starts_with("10."),
            "10/8 stays recognisable: {addr}"
        );
        assert!(
            has(
                &node["routes"],
                serde_json::json!({"dst": addr.to_string(), "dev": format!("cali{i}abc")})
            ),
            "{}",
            node["routes"]
        );
        assert!(
            has(&pod["routes"], serde_json::json!({"dst": "169.254.1.1/32"})),
            "link-local is kept: {}",
            pod["routes"]
        );
    }
    let gateway: std::net::IpAddr = node["routes"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["dst"] == "0.0.0.0/0"))
        .and_then(|r| r["gateway"].as_str())
        .and_then(|g| g.parse().ok())
        .expect("default gateway");
    assert!(
        uplink.trunc().contains(&gateway),
        "{uplink} holds {gateway}"
    );
    let mv = c["node"]["pods"]
        .as_array()
        .and_then(|p| {
            p.iter()
                .find_map(|p| p["links"].as_array()?.iter().find(|l| l["name"] == "mv0"))
        })
        .expect("the macvlan pod");
    assert!(
        uplink.trunc().contains(&net(&mv["addresses"][0]).addr()),
        "the macvlan pod stays on the uplink's subnet"
    );
    assert!(c["provenance"]["nodeName"]
        .as_str()
        .is_some_and(|n| n.starts_with("node-")));
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
    let read = |p: &str| {
        cnilab_harness::lab::model::read::namespace_at(Path::new(p), "pod").expect("read")
    };
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

/// A standing lab's node: its pods are found, the switch is a peer.
#[test]
fn a_standing_lab_node_is_captured_with_its_pods() {
    let _host = host_untouched();
    require_root();
    let name = format!("cap{}", std::process::id());
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = cnilab(&["lab", "down", "--name", &self.0]);
        }
    }
    let _down = Down(name.clone());
    let up = cnilab(&[
        "lab",
        "up",
        "--name",
        &name,
        "--nodes",
        "2",
        "--pods-per-node",
        "2",
    ]);
    assert!(up.status.success(), "{}", all(&up));
    let node_ns = format!("cnilab-lab-{name}-node1");
    let read = || {
        let path = Path::new("/run/netns").join(&node_ns);
        cnilab_harness::lab::model::read::namespace_at(&path, "node1").expect("read")
    };
    let before = read();
    let out = cnilab(&["capture", "--netns", &node_ns, "-o", "json"]);
    assert!(out.status.success(), "{}", all(&out));
    assert_eq!(read(), before, "the node is unchanged");
    let c: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(c["provenance"]["nodeName"], node_ns.as_str());
    let pods: Vec<&str> = c["pods"]
        .as_array()
        .map(|p| p.iter().filter_map(|p| p["netns"].as_str()).collect())
        .unwrap_or_default();
    let mut sorted = pods.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [format!("{node_ns}-pod0"), format!("{node_ns}-pod1")],
        "{}",
        c["pods"]
    );
    let peers = c["peers"].to_string();
    assert!(
        peers.contains(&format!("cnilab-lab-{name}-switch")),
        "{peers}"
    );
    for p in c["node"]["pods"].as_array().into_iter().flatten() {
        let eth0 = link(p, "eth0");
        assert!(
            eth0["addresses"][0]
                .as_str()
                .is_some_and(|a| a.starts_with("10.244.1.")),
            "{eth0}"
        );
    }
}

/// Bad input: a namespace that does not exist or is no namespace, an
/// unwritable -o (checked first, so it is named even with a bad --netns).
#[test]
fn bad_input_exits_2_with_the_fix() {
    for (args, says) in [
        (
            &["capture", "--netns", "cnilab-no-such-ns"][..],
            "ip netns list",
        ),
        (
            &["capture", "--netns", "/etc/hostname"],
            "not a network namespace",
        ),
        (
            &["capture", "--netns", "/proc/self/ns/uts"],
            "not a network namespace",
        ),
        (
            &[
                "capture",
                "-o",
                "/nonexistent-dir/x.json",
                "--netns",
                "cnilab-no-such-ns",
            ],
            "-o /nonexistent-dir/x.json: cannot write there",
        ),
        (&["capture", "-o", "/tmp"], "is a directory"),
        (&["capture", "--redact-key", ""], "--redact-key is empty"),
    ] {
        let out = cnilab(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", all(&out));
        assert!(all(&out).contains(says), "{args:?}: {}", all(&out));
    }
    assert!(!Path::new("/nonexistent-dir").exists());
}

/// The figure (not a timed test): capture time and file size of a node with
/// 110 pods. `cargo test -p cnilab-tests --test capture -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_capture_of_a_110_pod_node() {
    let _host = host_untouched();
    let n = node("cap-bench", "198.18.11.1/24");
    let pods: Vec<Netns> = (0..110)
        .map(|i| {
            let addr = format!("10.244.1.{}/32", i + 2);
            let p = pod(
                &n,
                &format!("cali{i:03}"),
                &addr,
                &["route add default dev eth0"],
            );
            run(
                &n,
                "ip",
                &[&format!(
                    "route add 10.244.1.{}/32 dev cali{i:03} scope link",
                    i + 2
                )],
            );
            p
        })
        .collect();
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("node.json");
    let path = n.path().display().to_string();
    let started = std::time::Instant::now();
    let out = cnilab(&[
        "capture",
        "--netns",
        &path,
        "-o",
        &file.display().to_string(),
    ]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", all(&out));
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("file")).expect("JSON");
    assert_eq!(c["pods"].as_array().map(Vec::len), Some(pods.len()));
    let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    println!(
        "capture of a node with {} pods: {:.0} ms, {} bytes ({:.2} MB)",
        pods.len(),
        took.as_secs_f64() * 1000.0,
        size,
        size as f64 / 1e6
    );
}
