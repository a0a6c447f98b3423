//! Root tests: the real agent binary with the nodes-file source, working on
//! a node namespace the test creates (`--netns`). Everything is checked in
//! the kernel (`ip -j route`, `nft list`), nothing outside the namespace is
//! touched, and the namespace goes away on drop.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::{netns, require_root, wait_until, AgentProcess, Netns, NetnsExt};

const AGENT: &str = env!("CARGO_BIN_EXE_cnilab-agent");
const CLUSTER: &str = "10.244.0.0/16,fd00:10:244::/56";

fn write_nodes(path: &Path, nodes: &[(&str, &[&str], &[&str])]) {
    let list: Vec<serde_json::Value> = nodes
        .iter()
        .map(|(name, ips, cidrs)| serde_json::json!({"name": name, "internalIP": ips, "podCIDRs": cidrs}))
        .collect();
    // Through a rename, as the lab should: the agent never reads half a file.
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, serde_json::to_vec_pretty(&list).expect("json")).expect("write nodes");
    std::fs::rename(&temp, path).expect("rename nodes");
}

const A: (&str, &[&str], &[&str]) = (
    "a",
    &["192.168.77.1", "fd00:77::1"],
    &["10.244.1.0/24", "fd00:10:244:1::/64"],
);
const B: (&str, &[&str], &[&str]) = (
    "b",
    &["192.168.77.2", "fd00:77::2"],
    &["10.244.2.0/24", "fd00:10:244:2::/64"],
);
const C: (&str, &[&str], &[&str]) = ("c", &["192.168.77.3"], &["10.244.3.0/24"]);
const D: (&str, &[&str], &[&str]) = ("d", &["192.168.77.4"], &["10.244.4.0/24"]);

fn node_a() -> Netns {
    let ns = netns();
    ns.uplink("192.168.77.1/24", "fd00:77::1/64");
    ns
}

fn agent_args<'a>(ns: &'a str, nodes: &'a str, dir: &'a str) -> Vec<String> {
    [
        "--netns",
        ns,
        "--node-name",
        "a",
        "--nodes-file",
        nodes,
        "--cluster-cidr",
        CLUSTER,
        "--cni-conf-dir",
        &format!("{dir}/net.d"),
        "--cni-bin-dir",
        &format!("{dir}/bin"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn once(args: &[String]) -> (bool, String) {
    let out = Command::new(AGENT)
        .args(args)
        .arg("--once")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .output()
        .expect("run agent");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn root_once_programs_routes_rules_conflist_and_a_restart_changes_nothing() {
    let _host = cnilab_net::testing::host_untouched();
    require_root();
    let ns = node_a();
    // A route somebody else made, to a CIDR no node has: must survive.
    ns.ip(&[
        "route",
        "add",
        "10.99.0.0/24",
        "via",
        "192.168.77.99",
        "proto",
        "static",
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = dir.path().join("nodes.json");
    write_nodes(&nodes, &[A, B, C]);
    let plugin = dir.path().join("fake-plugin");
    std::fs::write(&plugin, b"#!/bin/sh\n").expect("plugin");
    let mut args = agent_args(
        ns.path().to_str().expect("utf-8"),
        nodes.to_str().expect("utf-8"),
        dir.path().to_str().expect("utf-8"),
    );
    args.extend(["--plugin-binary".to_string(), plugin.display().to_string()]);

    let (ok, log) = once(&args);
    assert!(ok, "agent --once failed:\n{log}");
    assert_eq!(
        ns.own_routes(),
        vec![
            "10.244.2.0/24 via 192.168.77.2 proto 199",
            "10.244.3.0/24 via 192.168.77.3 proto 199",
            "fd00:10:244:2::/64 via fd00:77::2 proto 199",
        ]
    );
    let table = ns.nft_table().expect("table inet cnilab_agent exists");
    assert!(
        table.contains("ip saddr 10.244.1.0/24 ip daddr != 10.244.0.0/16"),
        "{table}"
    );
    assert!(table.contains("masquerade"), "{table}");
    assert!(table.contains("ip6 daddr fd00:10:244::/56"), "{table}");
    assert_eq!(ns.sysctl("net.ipv4.ip_forward"), "1");
    assert_eq!(ns.sysctl("net.ipv6.conf.all.forwarding"), "1");
    let conflist: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("net.d/10-cnilab.conflist")).expect("conflist written"),
    )
    .expect("conflist is JSON");
    assert_eq!(
        conflist["plugins"][0]["ipMasq"], false,
        "agent masquerades, plugin must not"
    );
    assert_eq!(
        conflist["plugins"][0]["ipam"]["ranges"][1][0]["subnet"],
        "fd00:10:244:1::/64"
    );
    assert!(
        dir.path().join("bin/cnilab-bridge").exists(),
        "plugin installed"
    );

    // A restart: same kernel state, and the agent says it changed nothing.
    let before = ns.all_routes();
    let (ok, log) = once(&args);
    assert!(ok, "second --once failed:\n{log}");
    assert!(
        log.contains("added=0 replaced=0 deleted=0 failed=0"),
        "{log}"
    );
    assert!(
        !log.contains("loaded nftables table"),
        "table reloaded on restart:\n{log}"
    );
    assert!(
        !log.contains("wrote CNI conflist"),
        "conflist rewritten on restart:\n{log}"
    );
    assert_eq!(ns.all_routes(), before);
    assert!(before.contains(&"10.99.0.0/24 via 192.168.77.99 proto static".to_string()));

    // Uninstall removes what the agent made, and only that.
    let out = Command::new(AGENT)
        .args(["uninstall", "--netns", ns.path().to_str().expect("utf-8")])
        .args(["--cni-conf-dir", &format!("{}/net.d", dir.path().display())])
        .args(["--cni-bin-dir", &format!("{}/bin", dir.path().display())])
        .output()
        .expect("run uninstall");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ns.own_routes().is_empty());
    assert!(ns.nft_table().is_none(), "nft table removed");
    assert!(!dir.path().join("net.d/10-cnilab.conflist").exists());
    assert!(!dir.path().join("bin/cnilab-bridge").exists());
    assert!(ns
        .all_routes()
        .contains(&"10.99.0.0/24 via 192.168.77.99 proto static".to_string()));
}

#[test]
fn root_refuses_to_start_without_a_pod_cidr() {
    let _host = cnilab_net::testing::host_untouched();
    require_root();
    let ns = node_a();
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = dir.path().join("nodes.json");
    write_nodes(&nodes, &[("a", &["192.168.77.1"], &[]), B]);
    let args = agent_args(
        ns.path().to_str().expect("utf-8"),
        nodes.to_str().expect("utf-8"),
        dir.path().to_str().expect("utf-8"),
    );
    let (ok, log) = once(&args);
    assert!(!ok);
    assert!(
        log.contains("has no podCIDR") && log.contains("--allocate-node-cidrs"),
        "{log}"
    );
    assert!(ns.own_routes().is_empty(), "nothing programmed");
    assert!(ns.nft_table().is_none());

    write_nodes(&nodes, &[B]);
    let (ok, log) = once(&args);
    assert!(!ok);
    assert!(log.contains("is not in the node list"), "{log}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = write!(stream, "GET {path} HTTP/1.1\r\nHost: agent\r\n\r\n");
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    out
}

/// The value of an unlabelled metric in a Prometheus text answer.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The agent running (polling the nodes file every 100 ms) on node `ns`,
/// with `/metrics` on the port returned; its log in `dir`.
fn running_agent(ns: &Netns, nodes: &Path, dir: &Path) -> (AgentProcess, u16) {
    let port = free_port();
    let mut args = agent_args(
        ns.path().to_str().expect("utf-8"),
        nodes.to_str().expect("utf-8"),
        dir.to_str().expect("utf-8"),
    );
    args.extend(["--poll-ms", "100", "--metrics-addr"].map(String::from));
    args.push(format!("127.0.0.1:{port}"));
    let log = dir.join("agent.log");
    let agent = AgentProcess {
        child: Command::new(AGENT)
            .args(&args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start agent"),
        log,
    };
    (agent, port)
}

/// Node a with b and c in the nodes file and the agent running on it.
fn agent_on_a_with_b_and_c() -> (
    Netns,
    tempfile::TempDir,
    std::path::PathBuf,
    AgentProcess,
    u16,
) {
    require_root();
    let ns = node_a();
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = dir.path().join("nodes.json");
    write_nodes(&nodes, &[A, B, C]);
    let (agent, port) = running_agent(&ns, &nodes, dir.path());
    (ns, dir, nodes, agent, port)
}

#[test]
fn root_running_agent_follows_the_nodes_file_and_leaves_routes_on_sigterm() {
    let _host = cnilab_net::testing::host_untouched();
    let (ns, _dir, nodes, mut agent, port) = agent_on_a_with_b_and_c();
    let timeout = Duration::from_secs(30);
    wait_until(timeout, "routes to b and c", || ns.own_routes().len() == 3);
    wait_until(timeout, "/healthz 200", || {
        http_get(port, "/healthz").starts_with("HTTP/1.1 200")
    });
    let metrics = http_get(port, "/metrics");
    assert!(
        metrics.contains("\ncnilab_agent_routes_managed 3\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cnilab_agent_last_reconcile_timestamp_seconds"),
        "{metrics}"
    );

    // c leaves: its route goes, the others stay.
    write_nodes(&nodes, &[A, B]);
    wait_until(timeout, "c's route removed", || {
        !ns.own_routes()
            .iter()
            .any(|r| r.starts_with("10.244.3.0/24"))
    });
    assert_eq!(ns.own_routes().len(), 2);

    // d joins late: routed without a restart. b's InternalIP moves: replaced.
    let b_moved: (&str, &[&str], &[&str]) = ("b", &["192.168.77.22", "fd00:77::2"], B.2);
    write_nodes(&nodes, &[A, b_moved, D]);
    wait_until(timeout, "d routed and b's route replaced", || {
        let routes = ns.own_routes();
        routes.contains(&"10.244.4.0/24 via 192.168.77.4 proto 199".to_string())
            && routes.contains(&"10.244.2.0/24 via 192.168.77.22 proto 199".to_string())
    });

    // A half-written or broken file keeps the last good list. The source
    // error counter proves the agent has read the broken file (a sleep could
    // not tell "kept the list" from "has not looked yet").
    let source_errors = || {
        metric(
            &http_get(port, "/metrics"),
            "cnilab_agent_source_errors_total",
        )
    };
    let errors_before = source_errors().expect("source error counter");
    std::fs::write(&nodes, b"[{\"name\": ").expect("write broken file");
    wait_until(timeout, "the broken nodes file reported", || {
        source_errors().is_some_and(|n| n > errors_before)
    });
    assert_eq!(ns.own_routes().len(), 3, "{}", agent.log_text());
    assert!(
        agent.log_text().contains("keeping the last good node list"),
        "{}",
        agent.log_text()
    );

    // SIGTERM: clean exit, routes and rules stay for the running pods.
    let status = agent.terminate();
    assert!(status.success(), "exit {status}:\n{}", agent.log_text());
    assert_eq!(ns.own_routes().len(), 3);
    assert!(ns.nft_table().is_some());
    assert!(agent.log_text().contains("routes and rules left in place"));
}

/// Connects `a` and `b` with a veth pair `a_if`/`b_if`.
fn link(a: &Netns, a_if: &str, b: &Netns, b_if: &str) {
    a.ip(&[
        "link",
        "add",
        a_if,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ]);
    a.ip(&["link", "set", a_if, "up"]);
    b.ip(&["link", "set", b_if, "up"]);
}

/// A stand-in pod behind node `node`: its own namespace, `addr` with the
/// node side as gateway (what the bridge plugin would set up).
fn pod(node: &Netns, if_name: &str, gateway: &str, addr: &str) -> Netns {
    let pod = netns();
    link(node, if_name, &pod, "eth0");
    node.ip(&["addr", "add", gateway, "dev", if_name]);
    pod.ip(&["addr", "add", addr, "dev", "eth0"]);
    let gw = gateway.split('/').next().expect("gateway address");
    pod.ip(&["route", "add", "default", "via", gw]);
    pod
}

fn ping(from: &Netns, to: &str) -> bool {
    from.exec("ping", &["-c", "1", "-W", "2", to])
        .status
        .success()
}

fn masquerade_packets(node: &Netns) -> u64 {
    let table = node.nft_table().unwrap_or_default();
    table
        .lines()
        .find(|l| l.contains("masquerade"))
        .and_then(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "packets")?;
            words.next()?.parse().ok()
        })
        .unwrap_or(0)
}

#[test]
fn root_two_nodes_route_pod_traffic_and_masquerade_only_egress() {
    let _host = cnilab_net::testing::host_untouched();
    require_root();
    // node a ── node b on 192.168.77.0/24; a pod behind each node; an
    // "internet" host behind node a that has no route to the pod network.
    let node_a = netns();
    let node_b = netns();
    link(&node_a, "up0", &node_b, "up0");
    node_a.ip(&["addr", "add", "192.168.77.1/24", "dev", "up0"]);
    node_b.ip(&["addr", "add", "192.168.77.2/24", "dev", "up0"]);
    let pod_a = pod(&node_a, "pod0", "10.244.1.1/24", "10.244.1.10/24");
    let pod_b = pod(&node_b, "pod0", "10.244.2.1/24", "10.244.2.10/24");
    let internet = netns();
    link(&node_a, "wan0", &internet, "eth0");
    node_a.ip(&["addr", "add", "198.51.100.1/24", "dev", "wan0"]);
    internet.ip(&["addr", "add", "198.51.100.2/24", "dev", "eth0"]);

    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = dir.path().join("nodes.json");
    let a: (&str, &[&str], &[&str]) = ("a", &["192.168.77.1"], &["10.244.1.0/24"]);
    let b: (&str, &[&str], &[&str]) = ("b", &["192.168.77.2"], &["10.244.2.0/24"]);
    write_nodes(&nodes, &[a, b]);
    assert!(
        !ping(&pod_a, "10.244.2.10"),
        "no route yet, yet the ping worked"
    );

    for (node, name) in [(&node_a, "a"), (&node_b, "b")] {
        let node_dir = dir.path().join(name);
        let out = Command::new(AGENT)
            .arg("--once")
            .args(["--node-name", name, "--cluster-cidr", "10.244.0.0/16"])
            .arg("--netns")
            .arg(node.path())
            .arg("--nodes-file")
            .arg(&nodes)
            .arg("--cni-conf-dir")
            .arg(node_dir.join("net.d"))
            .env("NO_COLOR", "1")
            .output()
            .expect("run agent");
        assert!(
            out.status.success(),
            "agent {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    assert!(ping(&pod_a, "10.244.2.10"), "pod a -> pod b across nodes");
    assert!(ping(&pod_b, "10.244.1.10"), "pod b -> pod a across nodes");
    assert!(ping(&node_b, "10.244.1.10"), "node b -> pod on node a");
    assert_eq!(
        masquerade_packets(&node_a),
        0,
        "pod-to-pod traffic must not be masqueraded"
    );
    assert!(
        ping(&pod_a, "198.51.100.2"),
        "egress works only when masqueraded"
    );
    assert!(
        masquerade_packets(&node_a) > 0,
        "egress went through the masquerade rule"
    );
}

#[test]
fn root_a_peer_cidr_covering_the_underlay_is_refused_and_the_others_are_routed() {
    require_root();
    let ns = node_a();
    let dir = tempfile::tempdir().expect("tempdir");
    let nodes = dir.path().join("nodes.json");
    // b claims half of the underlay 192.168.77.0/24 (and a's own address).
    let bad_b: (&str, &[&str], &[&str]) = ("b", &["192.168.77.2"], &["192.168.77.0/25"]);
    write_nodes(&nodes, &[A, bad_b, C]);
    let args = agent_args(
        ns.path().to_str().expect("utf-8"),
        nodes.to_str().expect("utf-8"),
        dir.path().to_str().expect("utf-8"),
    );
    let (ok, log) = once(&args);
    assert!(ok, "agent --once failed:\n{log}");
    let routes = ns.own_routes();
    assert_eq!(
        routes,
        vec!["10.244.3.0/24 via 192.168.77.3 proto 199".to_string()],
        "only c is routed:\n{log}"
    );
    assert!(
        !ns.all_routes()
            .iter()
            .any(|r| r.starts_with("192.168.77.0/25")),
        "no route hijacks the underlay: {:?}",
        ns.all_routes()
    );
    assert!(
        log.contains("node b") && log.contains("192.168.77.0/25") && log.contains("refused"),
        "the log names the node and the CIDR:\n{log}"
    );
}

/// A peer podCIDR outside every `--cluster-cidr`, or in a special-purpose
/// block (the metadata address, loopback, multicast, broadcast, link-local,
/// half the address space), is refused with a warning and the
/// `cnilab_agent_pod_cidrs_refused` gauge; the peer's last good route stays,
/// and the other peers stay routed.
#[test]
fn root_peer_cidrs_outside_the_cluster_or_special_are_refused_keeping_the_last_good_routes() {
    let _host = cnilab_net::testing::host_untouched();
    let (ns, _dir, nodes, agent, port) = agent_on_a_with_b_and_c();
    let timeout = Duration::from_secs(30);
    wait_until(timeout, "routes to b and c", || ns.own_routes().len() == 3);
    let good = ns.own_routes();

    // b's IPv4 podCIDR turns into the metadata address; new peers claim
    // special-purpose blocks and a block outside the cluster CIDRs.
    let bad_b: (&str, &[&str], &[&str]) = ("b", B.1, &["169.254.169.254/32", "fd00:10:244:2::/64"]);
    let hostile: [(&str, &[&str], &[&str]); 6] = [
        ("d", &["192.168.77.4"], &["127.0.0.0/8"]),
        ("e", &["192.168.77.5"], &["224.0.0.0/4"]),
        ("f", &["192.168.77.6"], &["255.255.255.255/32"]),
        ("g", &["192.168.77.7"], &["128.0.0.0/1"]),
        ("h", &["192.168.77.8"], &["10.96.0.0/16"]),
        ("i", &["fd00:77::9"], &["fe80::/64"]),
    ];
    let mut list = vec![A, bad_b, C];
    list.extend(hostile);
    write_nodes(&nodes, &list);
    let metrics = || http_get(port, "/metrics");
    wait_until(timeout, "the hostile node list reconciled", || {
        metric(&metrics(), "cnilab_agent_nodes") == Some(list.len() as u64)
            && metric(&metrics(), "cnilab_agent_reconciles_total").is_some()
    });
    // One more pass after the list was seen, so its routes are in place.
    let passes = metric(&metrics(), "cnilab_agent_reconciles_total").unwrap_or(0);
    wait_until(timeout, "another reconcile pass", || {
        metric(&metrics(), "cnilab_agent_reconciles_total").is_some_and(|n| n > passes)
    });
    assert_eq!(
        ns.own_routes(),
        good,
        "only the last good routes, nothing hostile:\n{}",
        agent.log_text()
    );
    let all = ns.all_routes();
    for (_, _, cidrs) in &hostile {
        let via = format!("{} via", cidrs[0]);
        assert!(
            !all.iter().any(|r| r.starts_with(&via)),
            "{} is routed: {all:?}",
            cidrs[0]
        );
    }
    assert_eq!(
        metric(&metrics(), "cnilab_agent_pod_cidrs_refused"),
        Some(7),
        "{}",
        metrics()
    );
    let text = agent.log_text();
    for cidr in [
        "169.254.169.254/32",
        "127.0.0.0/8",
        "224.0.0.0/4",
        "10.96.0.0/16",
        "fe80::/64",
    ] {
        assert!(
            text.lines()
                .any(|l| l.contains(cidr) && l.contains("refused")),
            "no warning names {cidr}:\n{text}"
        );
    }
}
