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
    calico_cluster, flannel, kube_proxy, mac_of, Cluster, KUBE_SEP_DNS_DNAT,
};
use capture_common::{all, cnilab, run, sysctl};
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

/// Makes `fault` in `k` by hand, captures and replays it: `lab check`
/// fails (exit 1) and a diagnosis or traced cause names every word of
/// `names` (the node and the object) in one message.
fn assert_fault_named(k: Cluster, style: &str, fault: impl FnOnce(&Cluster), names: &[&str]) {
    let _host = host_untouched();
    fault(&k);
    let name = lab_name(&format!("rf{}", &style[..2]));
    let dir = tempfile::tempdir().expect("dir");
    let _lab = replay(&k, style, &name, dir.path());
    let (code, r, text) = check(&name);
    assert_eq!(code, Some(1), "{style}: the replay of the fault: {text}");
    let messages: Vec<&str> = r["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| f["diagnoses"].as_array().into_iter().flatten())
        .filter_map(|d| d["message"].as_str())
        .collect();
    assert!(
        messages.iter().any(|m| names.iter().all(|n| m.contains(n))),
        "{style}: no diagnosis names {names:?}: {messages:#?}"
    );
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

#[test]
fn a_kube_sep_dnat_rule_deleted_before_capture_is_named_in_the_replay() {
    assert_fault_named(
        kube_proxy(),
        "kubeproxy",
        |k| {
            // Node 1 loses the DNS endpoint's DNAT: its pods' lookups of
            // 10.96.0.53 fall through un-NATed (node 2 keeps it).
            let mut args = vec!["-t", "nat", "-D"];
            args.extend(&KUBE_SEP_DNS_DNAT[1..]);
            capture_common::run_args(&k.nodes[0], "iptables-nft", &args);
        },
        &["kubeproxy1", "KUBE-SEP-NODE2DNS", "default/dns:dns"],
    );
}
