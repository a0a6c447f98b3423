//! Real node styles replayed (root): the flannel, Calico and kube-proxy
//! clusters of `capture_common::styles` (built with plain commands, not by
//! the lab) are captured node by node, stood up with `cnilab lab up
//! --capture` and checked with `cnilab lab check`:
//! - healthy, every style passes: the pods answer probes like lab pods,
//!   and a group the style has nothing for is reported as skipped with its
//!   reason, never failed;
//! - with one fault made by hand before the capture (flannel: a peer's FDB
//!   entry deleted; Calico: a pod's /32 route removed, or a pod's proxy
//!   ARP off), the replay fails and the report names the node and the
//!   object (a diagnosis or a traced cause). The kube-proxy style's
//!   Services (read from its KUBE-SERVICES/KUBE-SVC/KUBE-SEP chains) are
//!   probed by `service/cluster-ip`; one endpoint's DNAT rule deleted on
//!   one node is named by node and chain.

mod capture_common;

use capture_common::styles::{
    calico_cluster, flannel, kube_proxy, kube_router, mac_of, Cluster, KUBE_SEP_DNS_DNAT,
    KUBE_SERVICES_DNS, KUBE_SVC_DNS_JUMP,
};
use capture_common::{all, cnilab, run, sysctl};
use cnilab_net::netns::Netns;
use cnilab_tests::host_untouched;
use serde_json::Value;
use std::path::Path;

/// A standing lab taken down when dropped (also after a failed assert).
struct Up(String);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = cnilab(&["lab", "down", "--name", &self.0]);
    }
}

/// Captures every node of `k` as `<style><n>` into `dir` and stands the
/// captures up as lab `name`.
fn replay(k: &Cluster, style: &str, name: &str, dir: &Path) -> Up {
    let mut files = Vec::new();
    for (i, n) in k.nodes.iter().enumerate() {
        let node = format!("{style}{}", i + 1);
        let file = dir.join(format!("{node}.json")).display().to_string();
        let path = n.path().display().to_string();
        let out = cnilab(&[
            "capture",
            "--netns",
            &path,
            "--node-name",
            &node,
            "-o",
            &file,
        ]);
        assert!(out.status.success(), "capture {node}: {}", all(&out));
        files.push(file);
    }
    let mut args = vec!["lab", "up", "--name", name, "--capture"];
    args.extend(files.iter().map(String::as_str));
    let out = cnilab(&args);
    let up = Up(name.to_string());
    assert!(out.status.success(), "lab up --capture: {}", all(&out));
    up
}

/// `cnilab lab check --name NAME -o json`: its exit code and report.
fn check(name: &str) -> (Option<i32>, Value, String) {
    let out = cnilab(&["lab", "check", "--name", name, "-o", "json"]);
    let text = all(&out);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("lab check -o json: {e}: {text}"));
    (out.status.code(), report, text)
}

/// A lab name of its own for each call (tests run in parallel).
fn lab_name(tag: &str) -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{tag}{k}-{}", std::process::id() % 100_000)
}

/// Asserts the healthy replay of `k` passes: exit 0, every group with
/// probes passed them all, and the groups in `skipped` were skipped with
/// a reason.
fn assert_passes(k: &Cluster, style: &str, groups_run: &[&str], skipped: &[(&str, &str)]) {
    let name = lab_name(&format!("rp{}", &style[..2]));
    let dir = tempfile::tempdir().expect("dir");
    let _lab = replay(k, style, &name, dir.path());
    let (code, r, text) = check(&name);
    assert_eq!(code, Some(0), "{style}: lab check of the replay: {text}");
    assert_pods_named(k, &name, &text);
    let groups = r["groups"].as_array().expect("groups");
    for g in groups {
        assert_eq!(g["passed"], g["probes"], "{style}: {g}");
    }
    for want in groups_run {
        assert!(
            groups
                .iter()
                .any(|g| g["name"] == *want && g["probes"].as_u64() > Some(0)),
            "{style}: no {want} probes in {}",
            r["groups"]
        );
    }
    let table = all(&cnilab(&["lab", "check", "--name", &name]));
    for (s, why) in skipped {
        assert!(
            !groups.iter().any(|g| g["name"] == *s),
            "{style}: {s} ran: {}",
            r["groups"]
        );
        assert!(
            r["skipped"].as_array().is_some_and(|k| {
                k.iter().any(|k| {
                    k["group"] == *s && k["reason"].as_str().is_some_and(|r| r.contains(why))
                })
            }),
            "{style}: {s} is not skipped with a reason saying {why:?}: {}",
            r["skipped"]
        );
        assert!(
            table.contains(&format!("SKIP [{s}]")),
            "{style}: the table does not say SKIP [{s}]: {table}"
        );
    }
}

/// Every pod of `k` is probed under the name its runtime gave it
/// (`cni-<uuid>`, a Docker mount's id, `pid:<n>`), in `lab check`'s report
/// (`report`) and in `lab show`, which says what made it a pod; the
/// replay's namespace roles (`<node>-pod<k>`) are named nowhere.
fn assert_pods_named(k: &Cluster, lab: &str, report: &str) {
    let show = all(&cnilab(&["lab", "show", "--name", lab]));
    for name in k.names.iter().flatten() {
        assert!(!name.contains("-pod"), "{name}");
        assert!(
            report.contains(&format!("\"{name}\"")),
            "pod {name} is not named in lab check's report: {report}"
        );
        assert!(
            show.lines()
                .any(|l| l.contains(&format!("{name} on ")) && l.ends_with(": probed")),
            "lab show does not say {name} is probed: {show}"
        );
    }
    assert!(
        show.contains("    evidence: its default route (0.0.0.0/0) leads into the node"),
        "{show}"
    );
    assert!(
        !report.contains("-pod0"),
        "a namespace role in the report: {report}"
    );
}

/// The groups a cluster with two pods on each node runs.
const TWO_PODS_A_NODE: &[&str] = &[
    "pod-to-pod/same-node",
    "pod-to-pod/cross-node",
    "node-to-pod",
    "pod-to-node",
    "mtu/df-cross-node",
];

/// What a replay of nodes without Services skips, and why (the styles'
/// nodes have no default route, so nothing names the outside world).
const NO_EXTERNAL_NOR_SERVICE: &[(&str, &str)] = &[
    ("pod-to-external", "no captured node has a default route"),
    ("service/cluster-ip", "no Service"),
];

#[test]
fn a_replayed_flannel_cluster_passes_lab_check() {
    let _host = host_untouched();
    assert_passes(
        &flannel(),
        "flannel",
        TWO_PODS_A_NODE,
        NO_EXTERNAL_NOR_SERVICE,
    );
}

#[test]
fn a_replayed_calico_cluster_passes_lab_check() {
    let _host = host_untouched();
    assert_passes(
        &calico_cluster(),
        "calico",
        TWO_PODS_A_NODE,
        NO_EXTERNAL_NOR_SERVICE,
    );
}

/// Pods named by their CRI sandboxes, as `capture` names them where the
/// node's CRI answers (`<namespace>/<name>`, here written into the captures
/// of a flannel cluster in place of their `cni-<uuid>` names): the replay
/// probes them under those names and passes, `lab show` lists them, and
/// `lab trace` takes them as FROM and TO.
#[test]
fn pods_with_cri_names_replay_under_those_names() {
    let _host = host_untouched();
    let k = flannel();
    const CRI: [[&str; 2]; 2] = [
        [
            "kube-system/coredns-5d78c9869d-x2x7k",
            "default/web-7c5ddbdf54-9wv2q",
        ],
        [
            "kube-system/coredns-5d78c9869d-pq8zn",
            "monitoring/node-exporter-h4m2t",
        ],
    ];
    let dir = tempfile::tempdir().expect("dir");
    let mut files = Vec::new();
    for (i, n) in k.nodes.iter().enumerate() {
        let file = dir.path().join(format!("flannel{}.json", i + 1));
        let out = cnilab(&[
            "capture",
            "--netns",
            &n.path().display().to_string(),
            "--node-name",
            &format!("flannel{}", i + 1),
            "-o",
            &file.display().to_string(),
        ]);
        assert!(out.status.success(), "{}", all(&out));
        let mut text = std::fs::read_to_string(&file).expect("read");
        for (p, cri) in k.pods[i].iter().zip(CRI[i]) {
            assert!(text.contains(p.name()), "{} not in the capture", p.name());
            text = text.replace(p.name(), cri);
        }
        let mut c: Value = serde_json::from_str(&text).expect("json");
        for p in c["pods"].as_array_mut().into_iter().flatten() {
            p["cri"] = p["name"].clone();
        }
        std::fs::write(&file, c.to_string()).expect("write");
        files.push(file.display().to_string());
    }
    let name = lab_name("rpcri");
    let mut args = vec!["lab", "up", "--name", &name, "--capture"];
    args.extend(files.iter().map(String::as_str));
    let up = cnilab(&args);
    let _lab = Up(name.clone());
    assert!(up.status.success(), "{}", all(&up));
    let (code, r, text) = check(&name);
    assert_eq!(code, Some(0), "{text}");
    let show = all(&cnilab(&["lab", "show", "--name", &name]));
    for pod in CRI.iter().flatten() {
        assert!(text.contains(&format!("\"{pod}\"")), "{pod} not in {text}");
        assert!(
            show.lines()
                .any(|l| l.contains(&format!("{pod} on ")) && l.ends_with(": probed")),
            "{show}"
        );
    }
    assert!(r["groups"].as_array().is_some_and(|g| !g.is_empty()), "{r}");
    let trace = cnilab(&["lab", "trace", "--name", &name, CRI[0][0], CRI[1][1]]);
    let said = all(&trace);
    assert!(trace.status.success(), "{said}");
    assert!(
        said.contains(CRI[0][0]) && said.contains(CRI[1][1]),
        "{said}"
    );
}

/// Pods held only by processes, one also under a Docker-style mount: both
/// are found, probed under `pid:<n>` and the mount's id, and pass.
#[test]
fn a_replayed_kube_router_cluster_passes_lab_check() {
    let _host = host_untouched();
    let k = kube_router();
    let names: Vec<&String> = k.names.iter().flatten().collect();
    assert!(names.iter().any(|n| n.starts_with("pid:")), "{names:?}");
    assert!(
        names
            .iter()
            .any(|n| n.len() == 12 && n.bytes().all(|b| b.is_ascii_hexdigit())),
        "{names:?}"
    );
    assert_passes(&k, "kuberouter", TWO_PODS_A_NODE, NO_EXTERNAL_NOR_SERVICE);
}

/// A kube-router node whose BGP route to the other node's pods is gone
/// before the capture: the replay fails and names the node and the
/// missing route's destination.
#[test]
fn a_kube_router_route_removed_before_capture_is_named_in_the_replay() {
    assert_fault_named(
        kube_router(),
        "kuberouter",
        |k| run(&k.nodes[0], "ip", &["route del 10.244.2.0/24 proto 17"]),
        &["kuberouter1", "10.244.2"],
    );
}

#[test]
fn a_replayed_kube_proxy_cluster_passes_lab_check() {
    let _host = host_untouched();
    assert_passes(
        &kube_proxy(),
        "kubeproxy",
        &[
            "pod-to-pod/cross-node",
            "node-to-pod",
            "pod-to-node",
            "mtu/df-cross-node",
            "service/cluster-ip",
        ],
        &[
            ("pod-to-pod/same-node", "two pods"),
            ("service/hairpin", "probed by service/cluster-ip"),
            ("pod-to-external", "no captured node has a default route"),
        ],
    );
}

/// A fault's replay, as [`assert_fault_named`] checked it.
struct Faulty {
    /// The replayed lab (down when dropped).
    lab: Up,
    /// `lab check -o json` of it.
    report: Value,
    /// The check's whole output.
    text: String,
}

/// Every diagnosis of every failure of a `lab check -o json` report.
fn diagnoses(report: &Value) -> impl Iterator<Item = &Value> {
    report["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| f["diagnoses"].as_array().into_iter().flatten())
}

/// Makes `fault` in `k` by hand, captures and replays it: `lab check`
/// fails (exit 1) and a diagnosis or traced cause names every word of
/// `names` (the node and the object) in one message.
fn assert_fault_named(
    k: Cluster,
    style: &str,
    fault: impl FnOnce(&Cluster),
    names: &[&str],
) -> Faulty {
    let _host = host_untouched();
    fault(&k);
    let name = lab_name(&format!("rf{}", &style[..2]));
    let dir = tempfile::tempdir().expect("dir");
    let lab = replay(&k, style, &name, dir.path());
    let (code, r, text) = check(&name);
    assert_eq!(code, Some(1), "{style}: the replay of the fault: {text}");
    let messages: Vec<&str> = diagnoses(&r)
        .filter_map(|d| d["message"].as_str())
        .collect();
    assert!(
        messages.iter().any(|m| names.iter().all(|n| m.contains(n))),
        "{style}: no diagnosis names {names:?}: {messages:#?}"
    );
    Faulty {
        lab,
        report: r,
        text,
    }
}

#[test]
fn a_flannel_fdb_entry_deleted_before_capture_is_named_in_the_replay() {
    assert_fault_named(
        flannel(),
        "flannel",
        |k| {
            let mac = mac_of(&k.nodes[1], "flannel.1");
            run(
                &k.nodes[0],
                "bridge",
                &[&format!("fdb del {mac} dev flannel.1 dst 192.0.2.2")],
            );
        },
        &["flannel1", "flannel.1"],
    );
}

/// A state no healthy lab has: the bridge of node 1's pods captured down
/// comes back down (not up, as a replay that made every link up would
/// bring it), and the check fails naming the node and the bridge.
#[test]
fn a_flannel_bridge_down_before_capture_stays_down_in_the_replay() {
    let _host = host_untouched();
    let k = flannel();
    run(&k.nodes[0], "ip", &["link set cni0 down"]);
    let name = lab_name("rdfl");
    let dir = tempfile::tempdir().expect("dir");
    let _lab = replay(&k, "flannel", &name, dir.path());
    let shown = ip_in(
        &format!("cnilab-lab-{name}-flannel1"),
        &["-o", "link", "show", "cni0"],
    );
    let flags = shown.split('<').nth(1).and_then(|f| f.split('>').next());
    assert!(
        flags.is_some_and(|f| !f.split(',').any(|x| x == "UP")),
        "cni0 came back up: {shown}"
    );
    drop(_lab);
    assert_fault_named(
        flannel(),
        "flannel",
        |k| run(&k.nodes[0], "ip", &["link set cni0 down"]),
        &["flannel1", "cni0"],
    );
}

/// A pod with a second interface, as Multus attaches one (`net1`, a
/// macvlan of the node's second NIC `eth1`, on that NIC's network; a
/// macvlan of the node's own uplink could not reach the node, on a real
/// node as in a replay): the capture keeps both of its links, the replay
/// makes both, and the replay passes `lab check`.
#[test]
fn a_multus_pod_keeps_its_second_interface_in_the_replay() {
    let _host = host_untouched();
    let k = flannel();
    let pod = &k.pods[0][0];
    run(
        &k.nodes[0],
        "ip",
        &[
            "link add eth1 type veth peer name eth1p",
            "link set eth1p up",
            "link set eth1 up",
            "addr add 198.51.100.1/24 dev eth1",
            "link add net1 link eth1 type macvlan mode bridge",
            &format!("link set net1 netns {}", pod.name()),
        ],
    );
    run(
        pod,
        "ip",
        &["link set net1 up", "addr add 198.51.100.101/24 dev net1"],
    );
    let name = lab_name("rpmu");
    let dir = tempfile::tempdir().expect("dir");
    let _lab = replay(&k, "flannel", &name, dir.path());
    let file = dir.path().join("flannel1.json");
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("capture")).expect("JSON");
    let captured = c["node"]["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == k.names[0][0].as_str())
        .expect("the Multus pod is captured");
    let kinds: Vec<(&str, &str)> = captured["links"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| Some((l["name"].as_str()?, l["kind"].as_str()?)))
        .collect();
    assert!(kinds.contains(&("eth0", "veth")), "{kinds:?}");
    assert!(kinds.contains(&("net1", "macvlan")), "{kinds:?}");
    let made = cnilab_tests::lab_namespaces(&name)
        .into_iter()
        .filter(|ns| {
            let shown = ip_in(ns, &["-o", "addr", "show"]);
            shown.contains("net1") && shown.contains("198.51.100.101/24") && shown.contains("eth0")
        })
        .count();
    assert_eq!(
        made, 1,
        "one replayed pod holds eth0 and net1 at 198.51.100.101/24"
    );
    let (code, _, text) = check(&name);
    assert_eq!(code, Some(0), "lab check of the replay: {text}");
}

#[test]
fn a_calico_pod_route_removed_before_capture_is_named_in_the_replay() {
    assert_fault_named(
        calico_cluster(),
        "calico",
        |k| {
            run(
                &k.nodes[0],
                "ip",
                &["route del 10.65.1.2/32 dev cali10f00d"],
            )
        },
        &["calico1", "10.65.1.2"],
    );
}

#[test]
fn a_calico_proxy_arp_turned_off_before_capture_is_named_in_the_replay() {
    assert_fault_named(
        calico_cluster(),
        "calico",
        |k| {
            // The first pod loses its static neighbour for its gateway
            // (it must ARP, which proxy_arp answers) and its cali veth
            // proxy_arp.
            run(&k.pods[0][0], "ip", &["neigh del 169.254.1.1 dev eth0"]);
            sysctl(&k.nodes[0], "net/ipv4/conf/cali10f00d/proxy_arp", "0");
        },
        &["calico1", "cali10f00d", "proxy_arp"],
    );
}

/// A Calico node whose pods' veths stopped forwarding: the pods' packets
/// enter the node by their `cali*` veth's proxy ARP for 169.254.1.1 (so
/// the gateway is no wrong next hop), and the veth's forwarding is named.
#[test]
fn a_calico_node_that_stopped_forwarding_before_capture_is_named_in_the_replay() {
    let text = assert_fault_named(
        calico_cluster(),
        "calico",
        |k| {
            // The pods' veths only: the node's own ip_forward stays on.
            for c in ["cali10f00d", "cali11f00d"] {
                sysctl(&k.nodes[0], &format!("net/ipv4/conf/{c}/forwarding"), "0");
            }
        },
        &["calico1", "f00d/forwarding = 0"],
    )
    .text;
    assert!(
        !text.contains("does not own the next hop 169.254.1.1"),
        "the gateway that proxy ARP answers was blamed: {text}"
    );
}

#[test]
fn a_kube_sep_dnat_rule_deleted_before_capture_is_named_in_the_replay() {
    let fault = assert_fault_named(
        kube_proxy(),
        "kubeproxy",
        |k| {
            // Node 1 loses the DNS endpoint's DNAT: its pods' lookups of
            // 10.96.0.53 fall through un-NATed (node 2 keeps it).
            delete_on_node1(k, KUBE_SEP_DNS_DNAT)
        },
        &["kubeproxy1", "KUBE-SEP-NODE2DNS", "default/dns:dns"],
    );
    // The registry's fix: kube-proxy resyncs the chain (the rule back).
    assert_fixed_in(&fault, "kube-proxy-endpoint-dnat-missing", |name| {
        restore(name, KUBE_SEP_DNS_DNAT)
    });
}

#[test]
fn a_kube_services_rule_deleted_before_capture_is_named_in_the_replay() {
    let fault = assert_fault_named(
        kube_proxy(),
        "kubeproxy",
        // Node 1 loses the DNS Service's KUBE-SERVICES rule (node 2 keeps it).
        |k| delete_on_node1(k, KUBE_SERVICES_DNS),
        &["kubeproxy1", "KUBE-SERVICES", "default/dns:dns"],
    );
    // The registry's fix: kube-proxy restarts and writes the rule again.
    assert_fixed_in(&fault, "kube-proxy-service-missing", |name| {
        restore(name, KUBE_SERVICES_DNS)
    });
}

#[test]
fn a_kube_svc_jump_deleted_before_capture_is_named_in_the_replay() {
    let fault = assert_fault_named(
        kube_proxy(),
        "kubeproxy",
        // Node 1's DNS Service chain no longer jumps to its endpoint.
        |k| delete_on_node1(k, KUBE_SVC_DNS_JUMP),
        &["kubeproxy1", "KUBE-SVC-DNS4DNS", "KUBE-SEP-NODE2DNS"],
    );
    // The registry's fix: kube-proxy resyncs its endpoints on the node.
    assert_fixed_in(&fault, "kube-proxy-endpoint-missing", |name| {
        restore(name, KUBE_SVC_DNS_JUMP)
    });
}

/// Deletes the nat `rule` (as `-A CHAIN ...`) from node 1 of `k`.
fn delete_on_node1(k: &Cluster, rule: &[&str]) {
    let mut args = vec!["-t", "nat", "-D"];
    args.extend(&rule[1..]);
    capture_common::run_args(&k.nodes[0], "iptables-nft", &args);
}

/// Appends the nat `rule` again in the replayed node 1 of lab `name`.
fn restore(name: &str, rule: &[&str]) {
    let ns = format!("cnilab-lab-{name}-kubeproxy1");
    let mut args = vec!["netns", "exec", &ns, "iptables-nft", "-t", "nat"];
    args.extend(rule);
    let out = std::process::Command::new("ip")
        .args(&args)
        .output()
        .expect("ip runs");
    assert!(out.status.success(), "{}", all(&out));
}

/// The failed check of `fault` names `cause` by its id; after `fix` (the
/// fix the registry of causes gives for it, applied by hand to the
/// replayed lab, by name), `lab check` passes. The registry names the
/// tests that call this as the proof of its fix.
fn assert_fixed_in(fault: &Faulty, cause: &str, fix: impl FnOnce(&str)) {
    let declared = cnilab(&["lab", "causes", cause, "-o", "json"]);
    assert!(declared.status.success(), "{cause}: {}", all(&declared));
    assert!(
        diagnoses(&fault.report).any(|d| d["id"] == cause),
        "before the fix, {cause} is named: {}",
        fault.text
    );
    let name = &fault.lab.0;
    fix(name);
    let (code, _, text) = check(name);
    assert_eq!(code, Some(0), "after the fix of {cause}: {text}");
}

/// Two VMs as Vagrant makes them, each node network on `eth1`
/// (192.168.56.1x, the route to the other VM's pods through it) beside
/// `eth0`: with `nat`, VirtualBox's NAT (10.0.2.15 on every VM, the default
/// route via 10.0.2.2); without, libvirt's management network (an address
/// of its own on each VM, no default route), as `e2e vagrant`'s VMs capture.
/// Both NICs are veths here whose other end stays in the node, made
/// `device` without that end in the captures: a VM's virtio NIC has no link
/// kind, and no namespace can hold such a device.
fn vagrant_pair(nat: bool, dir: &Path) -> Vec<String> {
    // Every namespace lives until both captures are taken.
    let mut keep = Vec::new();
    let mut files = Vec::new();
    for i in 1..=2u8 {
        let other = 3 - i;
        cnilab_tests::require_root();
        let n = Netns::with_label(&format!("cap-vg{i}")).expect("netns");
        let eth0 = match nat {
            true => "10.0.2.15/24".to_string(),
            false => format!("192.168.121.{}/24", 60 + i),
        };
        run(
            &n,
            "ip",
            &[
                "link set lo up",
                "link add eth0 type veth peer name eth0p",
                "link set eth0 up",
                &format!("addr add {eth0} dev eth0"),
                "link add eth1 type veth peer name eth1p",
                "link set eth1 up",
                &format!("addr add 192.168.56.1{i}/24 dev eth1"),
                "link add cnilab0 type bridge",
                "link set cnilab0 up",
                &format!("addr add 10.244.{i}.1/24 dev cnilab0"),
                &format!("route add 10.244.{other}.0/24 via 192.168.56.1{other} dev eth1"),
            ],
        );
        if nat {
            run(&n, "ip", &["route add default via 10.0.2.2 dev eth0"]);
        }
        for j in 0..2u8 {
            let veth = format!("veth{i}{j}");
            let addr = format!("10.244.{i}.{}/24", j + 2);
            let gw = format!("route add default via 10.244.{i}.1");
            keep.push(capture_common::pod(&n, &veth, &addr, &[&gw]));
            run(&n, "ip", &[&format!("link set {veth} master cnilab0")]);
        }
        sysctl(&n, "net/ipv4/ip_forward", "1");
        let file = dir.join(format!("vg{i}.json"));
        let out = cnilab(&[
            "capture",
            "--netns",
            &n.path().display().to_string(),
            "--node-name",
            &format!("vg{i}"),
            "-o",
            &file.display().to_string(),
        ]);
        assert!(out.status.success(), "capture vg{i}: {}", all(&out));
        let mut c: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("JSON");
        // A NIC, as a VM captures it: no kind, no other end.
        let node = &mut c["node"];
        let links = node["links"].as_array_mut().expect("links");
        links.retain(|l| l["name"] != "eth0p" && l["name"] != "eth1p");
        for link in links
            .iter_mut()
            .filter(|l| l["name"] == "eth0" || l["name"] == "eth1")
        {
            link["kind"] = "device".into();
            link.as_object_mut().map(|l| l.remove("veth"));
        }
        let sysctls = node["sysctls"].as_object_mut().expect("sysctls");
        sysctls.retain(|k, _| !k.contains("/eth0p/") && !k.contains("/eth1p/"));
        std::fs::write(&file, c.to_string()).expect("write");
        files.push(file.display().to_string());
        keep.push(n);
    }
    files
}

/// A node model as JSON, made comparable across a capture and the capture
/// of its replay: its pods' names (a runtime's, then the replay's roles)
/// become `<pod>`, and the uplink `eth0` (a veth to the switch in the
/// replay) and its own peer `eth0p` (not replayed: it joined nothing) are
/// left out, with their sysctls, as is `ping_group_range` (the replay opens
/// it for the probes).
fn comparable(node: &Value) -> Value {
    let mut n = node.clone();
    let name = n["name"].clone();
    if let Some(links) = n["links"].as_array_mut() {
        links.retain(|l| l["name"] != "eth0" && l["name"] != "eth0p");
        for l in links.iter_mut() {
            if l["veth"]["namespace"].is_string() && l["veth"]["namespace"] != name {
                l["veth"]["namespace"] = "<pod>".into();
            }
        }
    }
    if let Some(sysctls) = n["sysctls"].as_object_mut() {
        sysctls.retain(|k, _| {
            !k.contains("/eth0/") && !k.contains("/eth0p/") && !k.ends_with("ping_group_range")
        });
    }
    if let Some(o) = n.as_object_mut() {
        o.remove("pods");
    }
    n
}

/// What a healthy lab never has, made on a flannel node before its capture
/// (its pods' bridge down, a port in promiscuous mode, routes of types
/// unreachable, prohibit, throw and blackhole in the main and another
/// table, a policy rule, a permanent neighbour, sysctls away from their
/// defaults), comes back in the replay: the replayed node captured again
/// holds every object of the first capture, field for field, except what
/// the replay said it did not make.
#[test]
fn odd_states_come_back_in_the_replay_or_are_said_not_made() {
    let _host = host_untouched();
    let k = flannel();
    let n = &k.nodes[0];
    run(
        n,
        "ip",
        &[
            "link set cni0 down",
            "link set veth11 promisc on",
            "route add unreachable 10.9.0.0/24",
            "route add prohibit 10.9.1.0/24",
            "route add throw 10.9.2.0/24 table 100",
            "route add blackhole 10.9.3.0/24 table 100 metric 7",
            "rule add from 10.244.1.0/24 lookup 100 pref 1000",
            "neigh add 10.244.1.200 lladdr 02:00:00:00:00:c8 dev cni0 nud permanent",
        ],
    );
    for (key, value) in [
        ("net/ipv4/conf/cni0/rp_filter", "1"),
        ("net/ipv4/conf/all/arp_ignore", "2"),
        ("net/ipv4/conf/veth10/proxy_arp", "1"),
        ("net/ipv6/conf/cni0/disable_ipv6", "1"),
    ] {
        sysctl(n, key, value);
    }
    let name = lab_name("rpodd");
    let dir = tempfile::tempdir().expect("dir");
    let _lab = replay(&k, "flannel", &name, dir.path());
    let first: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("flannel1.json")).expect("read"),
    )
    .expect("json");
    let out = cnilab(&[
        "capture",
        "--netns",
        &format!("cnilab-lab-{name}-flannel1"),
        "--node-name",
        "flannel1",
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", all(&out));
    let again: Value = serde_json::from_slice(&out.stdout).expect("json");
    let (a, b) = (comparable(&first["node"]), comparable(&again["node"]));
    let show = all(&cnilab(&["lab", "show", "--name", &name]));
    let not_made: Vec<&str> = show
        .lines()
        .filter(|l| l.starts_with("not made here: "))
        .collect();
    let mut lost = Vec::new();
    for field in [
        "links",
        "routes",
        "rules",
        "neighbours",
        "fdb",
        "nftables",
        "iptables",
    ] {
        for object in a[field].as_array().into_iter().flatten() {
            let back = b[field].as_array().is_some_and(|l| l.contains(object));
            if !back {
                lost.push(format!("{field}: {object}"));
            }
        }
    }
    for (key, value) in a["sysctls"].as_object().into_iter().flatten() {
        if b["sysctls"][key] != *value {
            lost.push(format!(
                "sysctl {key} = {value}, replayed {}",
                b["sysctls"][key]
            ));
        }
    }
    let unsaid: Vec<&String> = lost
        .iter()
        .filter(|l| {
            !not_made
                .iter()
                .any(|m| l.contains(m.trim_start_matches("not made here: ")))
        })
        .collect();
    assert!(
        unsaid.is_empty(),
        "lost in the replay and not said: {unsaid:#?}\nnot made: {not_made:#?}"
    );
    // The states are there to be lost: the comparison saw them.
    let routes = a["routes"].to_string();
    for t in ["unreachable", "prohibit", "throw", "blackhole"] {
        assert!(routes.contains(&format!("\"type\":\"{t}\"")), "{routes}");
    }
    assert!(
        a["links"].to_string().contains("\"promisc\""),
        "{}",
        a["links"]
    );
}

/// Loads the smallest eBPF program, an XDP program that passes every packet
/// (`r0 = XDP_PASS; exit`), and pins it at `path` (in a bpffs): the real
/// kernel object a Cilium-style datapath attaches, without a compiler.
fn pinned_xdp_pass(path: &Path) {
    use nix::libc::{c_long, syscall, SYS_bpf};
    const BPF_PROG_LOAD: c_long = 5;
    const BPF_OBJ_PIN: c_long = 6;
    const BPF_PROG_TYPE_XDP: u32 = 6;
    let insns: [u64; 2] = [0xb7 | (2 << 32), 0x95];
    let license = c"GPL";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_XDP.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    // SAFETY: bpf(2) reads `attr` (and the instructions and license it
    // points to, alive here) and returns a new descriptor or -1.
    let fd = unsafe { syscall(SYS_bpf, BPF_PROG_LOAD, attr.as_ptr(), attr.len()) };
    assert!(
        fd >= 0,
        "BPF_PROG_LOAD: {}",
        std::io::Error::last_os_error()
    );
    let pathname = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let mut pin = [0u8; 128];
    pin[0..8].copy_from_slice(&(pathname.as_ptr() as u64).to_ne_bytes());
    pin[8..12].copy_from_slice(&u32::try_from(fd).expect("fd").to_ne_bytes());
    // SAFETY: as above; the path lives until the call returns.
    let pinned = unsafe { syscall(SYS_bpf, BPF_OBJ_PIN, pin.as_ptr(), pin.len()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: `fd` is the descriptor bpf(2) returned, closed once.
    unsafe { nix::libc::close(i32::try_from(fd).expect("fd")) };
    assert_eq!(pinned, 0, "BPF_OBJ_PIN {}: {err}", path.display());
}

/// A node whose datapath has eBPF (an XDP program on a pod's veth) and a
/// tc filter (a classic-BPF `bpf` filter on clsact ingress) replays what
/// the kernel tables hold and says, object by object, that it made neither
/// and that the verdict does not cover them: in `lab up`'s output, in `lab
/// show` and in `lab check`'s report.
#[test]
fn ebpf_and_tc_filters_are_captured_and_said_not_replayed() {
    let _host = host_untouched();
    let k = flannel();
    let fs = tempfile::tempdir().expect("dir");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "bpf", "bpf"])
        .arg(fs.path())
        .status()
        .expect("mount runs");
    assert!(mounted.success(), "mount a bpffs");
    let prog = fs.path().join("xdp_pass");
    pinned_xdp_pass(&prog);
    let attach = format!("link set dev veth10 xdpgeneric pinned {}", prog.display());
    run(&k.nodes[0], "ip", &[&attach]);
    let _ = std::process::Command::new("umount").arg(fs.path()).status();
    run(&k.nodes[0], "tc", &["qdisc add dev veth11 clsact"]);
    capture_common::run_args(
        &k.nodes[0],
        "tc",
        &[
            "filter",
            "add",
            "dev",
            "veth11",
            "ingress",
            "bpf",
            "bytecode",
            "1,6 0 0 4294967295,",
        ],
    );
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("flannel1.json");
    let out = cnilab(&[
        "capture",
        "--netns",
        &k.nodes[0].path().display().to_string(),
        "--node-name",
        "flannel1",
        "-o",
        &file.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", all(&out));
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("json");
    let hooks = c["node"]["hooks"].to_string();
    assert!(
        hooks.contains(r#""dev":"veth10","hook":"xdp","kind":"generic""#),
        "{hooks}"
    );
    assert!(
        hooks.contains(r#""dev":"veth11","hook":"tc ingress","kind":"bpf""#),
        "{hooks}"
    );
    let name = lab_name("rpbpf");
    let up = cnilab(&[
        "lab",
        "up",
        "--name",
        &name,
        "--capture",
        &file.display().to_string(),
    ]);
    let _lab = Up(name.clone());
    let said = all(&up);
    assert!(up.status.success(), "{said}");
    for object in [
        "link veth10: XDP program id",
        "link veth11: tc ingress filter bpf",
    ] {
        assert!(
            said.lines().any(|l| l.contains("not made here")
                && l.contains(object)
                && l.contains("verdicts do not cover")),
            "{object}: {said}"
        );
    }
    let show = all(&cnilab(&["lab", "show", "--name", &name]));
    assert!(
        show.lines().any(|l| l.starts_with("not made here: ")
            && l.contains("link veth10: XDP program id")
            && l.contains("(generic mode)")),
        "{show}"
    );
    let (_, r, text) = check(&name);
    let listed = r["not_made"].to_string();
    assert!(
        listed.contains("XDP program") && listed.contains("tc ingress filter bpf"),
        "{text}"
    );
}

/// `ip -n NS ARGS`' standard output.
fn ip_in(ns: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("ip runs");
    assert!(out.status.success(), "ip -n {ns} {args:?}: {}", all(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Captured VMs replay to a passing lab: the node network is the uplink
/// (the link of the routes to the other VM), and the NAT or management
/// NIC, whose address every VM may hold, is a segment of each node's own
/// (`<node>-nat`), never one shared segment with duplicate addresses;
/// the NAT address and its default route are replayed on it.
#[rstest::rstest]
#[case::virtualbox_nat_on_every_vm(true)]
#[case::libvirt_management_network(false)]
fn captured_vagrant_vms_replay_and_pass_lab_check(#[case] nat: bool) {
    let _host = host_untouched();
    let dir = tempfile::tempdir().expect("dir");
    let files = vagrant_pair(nat, dir.path());
    let name = lab_name("rpvg");
    let mut args = vec!["lab", "up", "--name", &name, "--capture"];
    args.extend(files.iter().map(String::as_str));
    let out = cnilab(&args);
    let _lab = Up(name.clone());
    assert!(out.status.success(), "lab up --capture: {}", all(&out));
    let (code, r, text) = check(&name);
    assert_eq!(code, Some(0), "lab check of the replayed VMs: {text}");
    let groups = r["groups"].as_array().expect("groups");
    for want in TWO_PODS_A_NODE {
        let g = groups
            .iter()
            .find(|g| g["name"] == *want)
            .unwrap_or_else(|| panic!("{want} did not run: {}", r["groups"]));
        assert!(g["probes"].as_u64() > Some(0), "{g}");
        assert_eq!(g["passed"], g["probes"], "{g}");
    }
    let ports = ip_in(
        &format!("cnilab-lab-{name}-switch"),
        &["-o", "link", "show", "master", "underlay"],
    );
    assert_eq!(
        ports.lines().count(),
        2,
        "one switch port per node: {ports}"
    );
    for node in ["vg1", "vg2"] {
        let ns = format!("cnilab-lab-{name}-{node}");
        let stub = ip_in(&format!("{ns}-nat"), &["-o", "link", "show"]);
        assert_eq!(
            stub.lines().filter(|l| !l.contains(": lo:")).count(),
            1,
            "{node}'s eth0 has a segment of its own: {stub}"
        );
        if nat {
            let eth0 = ip_in(&ns, &["-4", "-o", "addr", "show", "dev", "eth0"]);
            assert!(eth0.contains(" 10.0.2.15/24 "), "{node}: {eth0}");
            let default = ip_in(&ns, &["-4", "route", "show", "default"]);
            assert!(
                default.contains("via 10.0.2.2 dev eth0"),
                "{node}: {default}"
            );
        }
    }
}
