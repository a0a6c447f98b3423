//! `cnilab lab trace` (root) along the paths besides pod to pod: a Service
//! VIP followed through its DNAT to the backend, a masquerade to the
//! outside, IPv6-only and dual-stack labs (ICMPv6, NDP), pod to node and
//! node to pod; faults made by hand on those paths are named. And every
//! topology of `lab/topologies/` stood up healthy: `lab check` passes with
//! no cause the trace made, and a trace across nodes arrives.

mod trace_common;

use cnilab_tests::{cnilab, host_untouched, output_text as all, StandingLab as Standing};
use serde_json::Value;
use trace_common::{
    address, assert_arrived, assert_check_names, assert_check_says, assert_died, assert_fixed,
    assert_fixed_on, up_topology, Lab,
};

/// The hops' decisions, one string.
fn decisions(t: &(Option<i32>, Value)) -> String {
    t.1["hops"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| format!("{}: {}", h["namespace"], h["decision"]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A Service VIP (the pinned one whose only backend is node2-pod0): the
/// trace shows node1's DNAT with the kube-proxy rule as evidence and walks
/// on to the backend; a blackhole on node1 and a dropping qdisc on node2
/// are then named on that Service path.
#[test]
fn a_service_vip_is_followed_through_its_dnat_and_faults_after_it_are_named() {
    let _host = host_untouched();
    let lab = Standing::up("tpsv", &["--service"]);
    let backend = address(&lab, "node2-pod0", "-4", "eth0");
    let vip = ["10.96.0.12", "--proto", "tcp", "--port", "7777"];
    let t = lab.trace("node1-pod0", vip[0], &vip[1..]);
    assert_arrived(&t, "node2-pod0");
    let hops = decisions(&t);
    assert!(
        hops.contains(&format!(
            "\"node1\": \"dnat: 10.96.0.12 → {backend} port 7777\""
        )),
        "{hops}"
    );
    assert!(t.1["hops"].to_string().contains("dnat to"), "{:#}", t.1);
    lab.sh(
        "node1",
        "ip",
        &["route", "replace", "blackhole", "10.244.2.0/24"],
    );
    let t = lab.trace("node1-pod0", vip[0], &vip[1..]);
    assert_died(&t, "node1", "blackhole", "10.244.2.0/24");
    lab.sh(
        "node1",
        "ip",
        &["route", "replace", "10.244.2.0/24", "via", "10.250.0.2"],
    );
    let veth = lab.pod_veth("node2");
    lab.sh(
        "node2",
        "tc",
        &["qdisc", "add", "dev", &veth, "root", "pfifo", "limit", "0"],
    );
    let t = lab.trace("node1-pod0", vip[0], &vip[1..]);
    assert_died(&t, "node2", "qdisc-drop", &format!("dev {veth}"));
    lab.assert_no_trace_tables();
}

/// A pod to an address outside the cluster: node1 masquerades it; the hops
/// after go on from node1's address.
#[test]
fn a_masquerade_is_shown_and_the_walk_goes_on_from_the_new_source() {
    let _host = host_untouched();
    let lab = Standing::up("tpmq", &[]);
    let pod = address(&lab, "node1-pod0", "-4", "eth0");
    let outside = address(&lab, "external", "-4", "eth0");
    let t = lab.trace("node1-pod0", &outside, &[]);
    assert_arrived(&t, "external");
    let hops = decisions(&t);
    assert!(
        hops.contains(&format!("\"node1\": \"snat: {pod} → 10.250.0.1\"")),
        "{hops}"
    );
    let last = t.1["hops"]
        .as_array()
        .and_then(|h| h.last())
        .map(|h| h["evidence"].to_string())
        .unwrap_or_default();
    assert!(last.contains("from 10.250.0.1"), "{last}");
    lab.assert_no_trace_tables();
}

/// Pod to node and node to pod: a legacy iptables INPUT drop of ICMP on
/// node2 (pod to node; node1 masquerades the pod, so the rule matches by
/// protocol) and a dropping qdisc on node2's pod veth (node to pod).
#[test]
fn faults_on_pod_to_node_and_node_to_pod_paths_are_named() {
    let _host = host_untouched();
    let lab = Standing::up("tppn", &[]);
    let veth = lab.pod_veth("node2");
    lab.sh(
        "node2",
        "tc",
        &["qdisc", "add", "dev", &veth, "root", "pfifo", "limit", "0"],
    );
    let t = lab.trace("node1", "node2-pod0", &[]);
    assert_died(&t, "node2", "qdisc-drop", &format!("dev {veth}"));
    lab.sh("node2", "tc", &["qdisc", "del", "dev", &veth, "root"]);
    // The qdisc also dropped node2's ARP requests for the pod: the entry
    // may be failed, or still resolving and about to fail, and a probe
    // sent now could die on it (the kernel says NEIGH_FAILED, truly).
    // Forget it, as an operator would after the fix.
    lab.sh("node2", "ip", &["neigh", "flush", "dev", "cnilab0"]);
    assert_arrived(&lab.trace("node1", "node2-pod0", &[]), "node2-pod0");
    if std::process::Command::new("iptables-legacy")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIP the pod-to-node half: no iptables-legacy here");
        return;
    }
    lab.sh(
        "node2",
        "iptables-legacy",
        &["-A", "INPUT", "-p", "icmp", "-j", "DROP"],
    );
    let t = lab.trace("node1-pod0", "node2", &[]);
    let rule = "iptables-legacy filter INPUT rule 1";
    assert_died(&t, "node2", "iptables-legacy-drop", rule);
    assert_check_names(&lab, "iptables-legacy-drop", "node2", rule);
}

/// IPv6 only: the ICMPv6 probe arrives; a pod that answers no NDP (its
/// node's cache flushed), IPv6 forwarding off on node1, an ip6 forward
/// drop on node2 and a route MTU on node1 are each named.
#[test]
fn ipv6_only_traces_arrive_and_ndp_forwarding_and_ip6_firewall_faults_are_named() {
    let _host = host_untouched();
    let lab = up_topology("tp6o", "lab/topologies/ipv6-only.toml");
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_arrived(&t, "node2-pod0");
    assert!(t.1["dst"].as_str().unwrap_or("").contains(':'), "{:#}", t.1);
    let pod = address(&lab, "node2-pod0", "-6", "eth0");
    lab.sh("node2-pod0", "ip", &["link", "set", "eth0", "arp", "off"]);
    lab.sh("node2", "ip", &["-6", "neigh", "flush", "dev", "cnilab0"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(
        &t,
        "node2",
        "neighbour-failed",
        &format!("neighbour {pod} dev cnilab0"),
    );
    lab.sh("node2-pod0", "ip", &["link", "set", "eth0", "arp", "on"]);
    lab.sh(
        "node1",
        "sysctl",
        &["-qw", "net.ipv6.conf.all.forwarding=0"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(
        &t,
        "node1",
        "forwarding-off",
        "net/ipv6/conf/all/forwarding",
    );
    lab.sh(
        "node1",
        "sysctl",
        &["-qw", "net.ipv6.conf.all.forwarding=1"],
    );
    lab.sh("node2", "ip6tables-nft", &["-A", "FORWARD", "-j", "DROP"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "firewall-drop", "ip6 filter FORWARD");
    lab.sh("node2", "ip6tables-nft", &["-F", "FORWARD"]);
    // A route's own MTU (IPv6 forwards nothing larger either).
    let route = lab.sh(
        "node1",
        "ip",
        &["-6", "route", "show", "fd00:10:244:2::/64"],
    );
    let mut args: Vec<&str> = vec!["-6", "route", "replace"];
    args.extend(route.split_whitespace().take_while(|w| *w != "proto"));
    args.extend(["mtu", "lock", "1300"]);
    lab.sh("node1", "ip", &args);
    let t = lab.trace("node1-pod0", "node2-pod0", &["--size", "1400"]);
    assert_died(&t, "node1", "mtu", "route fd00:10:244:2::/64 mtu 1300");
    assert_arrived(
        &lab.trace("node1-pod0", "node2-pod0", &["--size", "1300"]),
        "node2-pod0",
    );
    lab.assert_no_trace_tables();
}

/// Dual stack: the same pods traced by their IPv4 and IPv6 addresses both
/// arrive.
#[test]
fn dual_stack_traces_arrive_in_both_families() {
    let _host = host_untouched();
    let lab = up_topology("tpds", "lab/topologies/dual-stack.toml");
    for family in ["-4", "-6"] {
        let to = address(&lab, "node2-pod0", family, "eth0");
        let t = lab.trace("node1-pod0", &to, &[]);
        assert_arrived(&t, "node2-pod0");
        assert_eq!(t.1["dst"], to.as_str(), "{:#}", t.1);
    }
    lab.assert_no_trace_tables();
}

/// Every topology of `lab/topologies/`, healthy: `lab check` passes and
/// names no cause (trace-made or other); a trace from node1's first pod to
/// node2's first pod arrives, so the trace makes no cause of its own on a
/// correct lab.
#[test]
fn every_topology_healthy_gets_no_trace_made_cause() {
    let _host = host_untouched();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/topologies");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("lab/topologies is readable")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    for (i, file) in files.iter().enumerate() {
        let lab = up_topology(&format!("tph{i}"), &format!("lab/topologies/{file}"));
        let out = cnilab(&["lab", "check", "--name", &lab.0, "-o", "json"]);
        assert_eq!(out.status.code(), Some(0), "{file}: {}", all(&out));
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{file}: {e}: {}", all(&out)));
        let failures = v["failures"].as_array().map(Vec::len).unwrap_or(0);
        assert_eq!(failures, 0, "{file}: {v:#}");
        assert!(!v.to_string().contains("traced "), "{file}: {v:#}");
        let t = lab.trace("node1-pod0", "node2-pod0", &[]);
        assert_arrived(&t, "node2-pod0");
        lab.assert_no_trace_tables();
    }
}

/// A drop or reject in each netfilter hook and table the probe crosses,
/// made with plain `nft` and `iptables-nft`, on the path it stops: raw,
/// mangle and nat prerouting and a forward reject on node2 (pod to pod),
/// an input reject on node2 (pod to node), output and postrouting drops on
/// node1 (node to pod). Each is named by its family, table, chain and
/// handle (or chain), with its verdict; `lab check` names the raw drop and
/// the output drop at their node.
#[test]
fn drops_and_rejects_in_every_hook_are_named_on_their_path() {
    let _host = host_untouched();
    let lab = Standing::up("tphk", &[]);
    let pod = address(&lab, "node2-pod0", "-4", "eth0");
    let nft = |role: &str, cmd: &str| {
        lab.sh(role, "nft", &[cmd]);
    };
    let chain = |role: &str, table: &str, spec: &str, rule: &str| {
        nft(role, &format!("add table ip {table}"));
        nft(role, &format!("add chain ip {table} c {{ {spec}; }}"));
        nft(role, &format!("add rule ip {table} c {rule}"));
    };
    let echo = format!("ip daddr {pod} icmp type echo-request");
    // (where, table, chain spec, rule, from, to, cause, object)
    let cases = [
        (
            "node2",
            "hkraw",
            "type filter hook prerouting priority raw",
            format!("{echo} drop"),
            "node1-pod0",
            "node2-pod0",
            "firewall-drop",
            "ip hkraw c handle",
        ),
        (
            "node2",
            "hknat",
            "type nat hook prerouting priority dstnat",
            format!("{echo} drop"),
            "node1-pod0",
            "node2-pod0",
            "firewall-drop",
            "ip hknat c handle",
        ),
        (
            "node2",
            "hkfwd",
            "type filter hook forward priority 0",
            format!("{echo} reject"),
            "node1-pod0",
            "node2-pod0",
            "firewall-reject",
            "ip hkfwd c handle",
        ),
        (
            "node1",
            "hkout",
            "type filter hook output priority 0",
            format!("{echo} drop"),
            "node1",
            "node2-pod0",
            "firewall-drop",
            "ip hkout c handle",
        ),
        (
            "node1",
            "hkpost",
            "type filter hook postrouting priority 0",
            format!("{echo} drop"),
            "node1",
            "node2-pod0",
            "firewall-drop",
            "ip hkpost c handle",
        ),
    ];
    for (at, table, spec, rule, from, to, cause, object) in &cases {
        chain(at, table, spec, rule);
        let t = lab.trace(from, to, &[]);
        assert_died(&t, at, cause, object);
        let evidence = t.1["death"]["evidence"].to_string();
        assert!(evidence.contains(rule.as_str()), "{table}: {evidence}");
        if *table == "hkraw" || *table == "hkout" {
            assert_check_names(&lab, cause, at, object);
        }
        nft(at, &format!("delete table ip {table}"));
    }
    assert_arrived(&lab.trace("node1-pod0", "node2-pod0", &[]), "node2-pod0");
    // iptables-nft's own tables: mangle PREROUTING (pod to pod) and an
    // INPUT reject (pod to node).
    let ipt = |args: &[&str]| {
        lab.sh("node2", "iptables-nft", args);
    };
    ipt(&[
        "-t",
        "mangle",
        "-A",
        "PREROUTING",
        "-d",
        &pod,
        "-p",
        "icmp",
        "-j",
        "DROP",
    ]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "firewall-drop", "ip mangle PREROUTING handle");
    ipt(&["-t", "mangle", "-F", "PREROUTING"]);
    ipt(&["-A", "INPUT", "-p", "icmp", "-j", "REJECT"]);
    let t = lab.trace("node1-pod0", "node2", &[]);
    assert_died(&t, "node2", "firewall-reject", "ip filter INPUT handle");
    lab.assert_no_trace_tables();
    ipt(&["-D", "INPUT", "-p", "icmp", "-j", "REJECT"]);
    assert_fixed_on(&lab, "firewall-reject", "node1-pod0", "node2", &[]);
}

/// The routed shape (a router between the racks, no node of its own) and
/// the VXLAN overlay, faults made by hand: at the router an unreachable
/// route, a route MTU below the packet and forwarding off on the rack it
/// comes in by; a prohibit route on node1; the pod's own end of its veth
/// down (named at the pod, not as the bridge port its node then disables);
/// on VXLAN an FDB entry sending node2's VTEP MAC to the external host, on
/// the pod-to-pod and node-to-pod paths, and node2's VXLAN device down.
#[test]
fn faults_on_the_routed_and_vxlan_shapes_are_named() {
    let _host = host_untouched();
    let (from, to) = ("node1-pod0", "node2-pod0");
    let lab = Standing::up("tprt", &["--shape", "routed"]);
    let unreachable = "route unreachable 10.244.2.0/24";
    lab.sh(
        "router",
        "ip",
        &["route", "replace", "unreachable", "10.244.2.0/24"],
    );
    assert_died(
        &lab.trace(from, to, &[]),
        "router",
        "unreachable",
        unreachable,
    );
    assert_check_names(&lab, "unreachable", "router", unreachable);
    let route = ["route", "replace", "10.244.2.0/24", "via", "10.250.2.10"];
    lab.sh("router", "ip", &route);
    assert_fixed(&lab, "unreachable");
    lab.sh(
        "router",
        "ip",
        &[&route[..], &["mtu", "lock", "1000"]].concat(),
    );
    let t = lab.trace(from, to, &["--size", "1400"]);
    assert_died(&t, "router", "mtu", "route 10.244.2.0/24 mtu 1000");
    lab.sh("router", "ip", &route);
    let rack1 = |value: &str| {
        let key = format!("net.ipv4.conf.rack1.forwarding={value}");
        lab.sh("router", "sysctl", &["-qw", &key]);
    };
    rack1("0");
    let t = lab.trace(from, to, &[]);
    assert_died(
        &t,
        "router",
        "forwarding-off",
        "net/ipv4/conf/rack1/forwarding",
    );
    rack1("1");
    let prohibit = ["route", "add", "prohibit", "10.244.2.0/24"];
    lab.sh("node1", "ip", &prohibit);
    let t = lab.trace(from, to, &[]);
    assert_died(&t, "node1", "prohibit", "route prohibit 10.244.2.0/24");
    lab.sh(
        "node1",
        "ip",
        &["route", "del", "prohibit", "10.244.2.0/24"],
    );
    assert_fixed(&lab, "prohibit");
    lab.sh("node2-pod0", "ip", &["link", "set", "eth0", "down"]);
    let t = lab.trace(from, to, &[]);
    assert_died(&t, "node2-pod0", "link-down", "link eth0");
    assert_eq!(t.1["death"]["node"], "node2", "{:#}", t.1);
    lab.sh("node2-pod0", "ip", &["link", "set", "eth0", "up"]);
    assert_arrived(&lab.trace(from, to, &[]), to);
    drop(lab);

    let lab = Standing::up("tpvw", &["--vxlan"]);
    let fdb = lab.sh("node1", "bridge", &["fdb", "show", "dev", "vxlan0"]);
    let mac = fdb
        .lines()
        .find(|l| l.contains("dst 10.250.0.2 "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no FDB entry to node2 in {fdb}"))
        .to_string();
    let external = address(&lab, "external", "-4", "eth0");
    let entry = |dst: &str| {
        let args = [
            "fdb",
            "replace",
            &mac,
            "dev",
            "vxlan0",
            "dst",
            dst,
            "self",
            "permanent",
        ];
        lab.sh("node1", "bridge", &args);
    };
    entry(&external);
    let object = format!("fdb {mac} dev vxlan0 dst {external}");
    for from in ["node1-pod0", "node1"] {
        assert_died(
            &lab.trace(from, to, &[]),
            "node1",
            "vxlan-fdb-wrong",
            &object,
        );
    }
    // A diagnosis rule knows this one (no entry for node2's VTEP MAC with
    // node2's address); the check names node1, the MAC and the device.
    assert_check_says(&lab, &["node1", &mac, "vxlan0"]);
    entry("10.250.0.2");
    assert_fixed_on(&lab, "vxlan-fdb-wrong", from, to, &[]);
    lab.sh("node2", "ip", &["link", "set", "vxlan0", "down"]);
    assert_died(
        &lab.trace(from, to, &[]),
        "node2",
        "link-down",
        "link vxlan0",
    );
    lab.assert_no_trace_tables();
}

/// The NAT shape (a Vagrant-style node: eth1 the NAT interface, eth0 the
/// underlay, routes by the agent): a trace across nodes arrives; an nft
/// forward drop on node2 (`lab check` FAILs naming it) and the host end of
/// a pod's veth on node1 down are named.
#[test]
fn faults_on_the_nat_shape_are_named() {
    let _host = host_untouched();
    let lab = up_topology("tpnt", "lab/topologies/nat.toml");
    assert_arrived(&lab.trace("node1-pod0", "node2-pod0", &[]), "node2-pod0");
    let pod = address(&lab, "node2-pod0", "-4", "eth0");
    for cmd in [
        "add table ip ntf".to_string(),
        "add chain ip ntf nfwd { type filter hook forward priority 0; }".to_string(),
        format!("add rule ip ntf nfwd ip daddr {pod} drop"),
    ] {
        lab.sh("node2", "nft", &[&cmd]);
    }
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "firewall-drop", "ip ntf nfwd handle");
    assert_check_names(&lab, "firewall-drop", "node2", "ip ntf nfwd handle");
    lab.sh("node2", "nft", &["delete table ip ntf"]);
    let veth = lab.pod_veth("node1");
    lab.sh("node1", "ip", &["link", "set", &veth, "down"]);
    // Two pods on node1: the one behind that veth dies there.
    let died: Vec<_> = ["node1-pod0", "node1-pod1"]
        .iter()
        .map(|p| lab.trace(p, "node2-pod0", &[]))
        .filter(|t| t.1["verdict"] == "died")
        .collect();
    assert_eq!(died.len(), 1, "{died:#?}");
    assert_died(&died[0], "node1", "link-down", &veth);
    lab.assert_no_trace_tables();
}

/// Re-creates `role`'s VXLAN device `vxlan0` with VNI `id` and UDP port
/// `port` (`None`: as it was), as it was otherwise (MAC, MTU, local
/// address, underlay device, no learning), with its addresses, permanent
/// neighbours, FDB entries and routes: a VXLAN device's VNI and port
/// cannot change in place. Returns the VNI and port it had.
fn recreate_vxlan(lab: &Standing, role: &str, id: Option<u32>, port: Option<u16>) -> (u32, u16) {
    let json = lab.sh(role, "ip", &["-d", "-j", "link", "show", "vxlan0"]);
    let v: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let (link, data) = (&v[0], &v[0]["linkinfo"]["info_data"]);
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string).unwrap_or_default();
    let number = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{json}"));
    let was = (number(&data["id"]) as u32, number(&data["port"]) as u16);
    let addresses = lab.sh(role, "ip", &["-4", "-o", "addr", "show", "dev", "vxlan0"]);
    let neighbours = lab.sh(
        role,
        "ip",
        &["neigh", "show", "dev", "vxlan0", "nud", "permanent"],
    );
    let fdb = lab.sh(role, "bridge", &["fdb", "show", "dev", "vxlan0"]);
    let routes = lab.sh(role, "ip", &["-4", "route", "show", "dev", "vxlan0"]);
    lab.sh(role, "ip", &["link", "del", "vxlan0"]);
    let id = id.unwrap_or(was.0).to_string();
    let port = port.unwrap_or(was.1).to_string();
    let (mac, mtu) = (text(&link["address"]), number(&link["mtu"]).to_string());
    let (local, under) = (text(&data["local"]), text(&data["link"]));
    lab.sh(
        role,
        "ip",
        &[
            "link",
            "add",
            "vxlan0",
            "address",
            &mac,
            "mtu",
            &mtu,
            "type",
            "vxlan",
            "id",
            &id,
            "local",
            &local,
            "dev",
            &under,
            "dstport",
            &port,
            "nolearning",
        ],
    );
    lab.sh(role, "ip", &["link", "set", "vxlan0", "up"]);
    for a in addresses
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
    {
        lab.sh(role, "ip", &["addr", "add", a, "dev", "vxlan0"]);
    }
    for l in neighbours.lines() {
        if let [addr, "lladdr", mac, ..] = l.split_whitespace().collect::<Vec<_>>()[..] {
            let args = [
                "neigh",
                "replace",
                addr,
                "lladdr",
                mac,
                "dev",
                "vxlan0",
                "nud",
                "permanent",
            ];
            lab.sh(role, "ip", &args);
        }
    }
    for l in fdb.lines() {
        if let [mac, "dst", dst, ..] = l.split_whitespace().collect::<Vec<_>>()[..] {
            lab.sh(
                role,
                "bridge",
                &["fdb", "append", mac, "dev", "vxlan0", "dst", dst],
            );
        }
    }
    for l in routes.lines() {
        let words: Vec<&str> = l.split_whitespace().take_while(|w| *w != "proto").collect();
        lab.sh(
            role,
            "ip",
            &[&["route", "replace"][..], &words, &["dev", "vxlan0"]].concat(),
        );
    }
    was
}

/// VXLAN's VNI and port: node2's VXLAN device re-created with another VNI
/// on the same port (the kernel hands node1's outer packets to it, and it
/// takes no other VNI), then with the VNI on another port (nothing listens
/// where node1 sends). Each is named at node2 with the device and what
/// differs, by the trace and by `lab check`; then with both, so node2 has
/// no device of the VNI at all. Re-created as the other nodes' each time
/// (the registry's fix), the lab passes again.
#[test]
fn a_vxlan_device_of_another_vni_or_port_is_named() {
    let _host = host_untouched();
    let lab = Standing::up("tpvn", &["--vxlan"]);
    let (vni, port) = recreate_vxlan(&lab, "node2", Some(2), None);
    assert_ne!(vni, 2, "the lab's VNI is 2 already");
    let object = "link vxlan0 vni 2";
    assert_died(
        &lab.trace("node1-pod0", "node2-pod0", &[]),
        "node2",
        "vxlan-vni-mismatch",
        object,
    );
    assert_check_names(&lab, "vxlan-vni-mismatch", "node2", object);
    recreate_vxlan(&lab, "node2", Some(vni), None);
    assert_fixed(&lab, "vxlan-vni-mismatch");
    let other = port.wrapping_add(1);
    recreate_vxlan(&lab, "node2", None, Some(other));
    let object = format!("link vxlan0 dstport {other}");
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "vxlan-port-mismatch", &object);
    assert_check_names(&lab, "vxlan-port-mismatch", "node2", &object);
    recreate_vxlan(&lab, "node2", None, Some(port));
    assert_fixed(&lab, "vxlan-port-mismatch");
    // Both: no device of the VNI, and none on the port.
    recreate_vxlan(&lab, "node2", Some(2), Some(other));
    let object = format!("vni {vni}");
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "vxlan-no-device", &object);
    assert_check_names(&lab, "vxlan-no-device", "node2", &object);
    recreate_vxlan(&lab, "node2", Some(vni), Some(port));
    assert_fixed(&lab, "vxlan-no-device");
}
