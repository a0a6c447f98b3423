//! The kernel's drop reasons in `cnilab lab trace` and `lab check` (root):
//! faults made by hand in a standing 2-node lab, where the kernel's own
//! account (tracefs: `skb:kfree_skb`'s reason and function, the devices the
//! probe crossed) shows in the trace, with the namespace and device, and
//! `lab check` names the node and the object; no tracefs instance is left.

mod trace_common;

use cnilab_tests::{host_untouched, output_text, workspace_bin, StandingLab as Standing};
use serde_json::Value;
use trace_common::{assert_check_names, assert_died, assert_kernel_drop, Lab};

/// An nft drop in a netdev-family chain on node2's uplink (the ingress
/// hook, before any inet chain): the trace names the chain and the rule's
/// handle, and the kernel says NETFILTER_DROP in node2 on eth0.
#[test]
fn a_netdev_ingress_drop_on_the_uplink_shows_the_kernels_reason() {
    let _host = host_untouched();
    let lab = Standing::up("tdnd", &[]);
    lab.sh("node2", "nft", &["add", "table", "netdev", "edge"]);
    lab.sh(
        "node2",
        "nft",
        &["add chain netdev edge ingress { type filter hook ingress device eth0 priority 0; }"],
    );
    lab.sh(
        "node2",
        "nft",
        &["add rule netdev edge ingress ip daddr 10.244.2.0/24 drop"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "firewall-drop", "netdev edge ingress handle");
    assert_kernel_drop(&t.1, "NETFILTER_DROP", "node2", "eth0");
    let evidence = t.1["death"]["evidence"].as_str().unwrap_or_default();
    assert!(
        evidence.contains("dropped in node2 on eth0: NETFILTER_DROP"),
        "{evidence}"
    );
    assert_check_names(&lab, "firewall-drop", "node2", "netdev edge ingress handle");
    // The trace's tracefs instances (`cnilab-<its pid>-<n>`) are gone
    // when it is.
    let child = std::process::Command::new(workspace_bin("cnilab"))
        .args(["lab", "trace", "--name", &lab.0, "node1-pod0", "node2-pod0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cnilab runs");
    let own = format!("cnilab-{}-", child.id());
    let out = child.wait_with_output().expect("cnilab ends");
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("dropped in node2 on eth0: NETFILTER_DROP"),
        "{text}"
    );
    let instances = std::fs::read_dir("/sys/kernel/tracing/instances").expect("tracefs");
    for e in instances.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with(&own), "{name} was left");
    }
    // Drop reasons turned off: said once as a SKIP, and the trace is what
    // it is without them (the nft trace still names the rule).
    let off = std::process::Command::new(workspace_bin("cnilab"))
        .args(["lab", "trace", "--name", &lab.0, "node1-pod0", "node2-pod0"])
        .args(["-o", "json"])
        .env("CNILAB_DROP_REASONS", "off")
        .output()
        .expect("cnilab runs");
    let v: Value = serde_json::from_slice(&off.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", output_text(&off)));
    assert_eq!(off.status.code(), Some(1), "{v:#}");
    let skipped = v["dropReasonsSkipped"].as_str().unwrap_or_default();
    assert!(skipped.contains("CNILAB_DROP_REASONS=off"), "{v:#}");
    assert!(
        v.get("kernelDrop").is_none() && v.get("devices").is_none(),
        "{v:#}"
    );
    assert_eq!(v["death"]["cause"], "firewall-drop", "{v:#}");
    let check = std::process::Command::new(workspace_bin("cnilab"))
        .args(["lab", "check", "--name", &lab.0, "-o", "json"])
        .env("CNILAB_DROP_REASONS", "off")
        .output()
        .expect("cnilab runs");
    let v: Value = serde_json::from_slice(&check.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", output_text(&check)));
    let skips: Vec<&Value> = v["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["id"] == "drop-reasons-skipped")
        .collect();
    assert_eq!(skips.len(), 1, "said once: {v:#}");
}

/// A bridge-family filter on node2 dropping what its bridge sends to its
/// pod: the trace names the bridge chain and handle, the kernel the
/// bridge device; where only the answer is dropped (the pod's own probes
/// out), the kernel's drop of the answer is the cause.
#[test]
fn a_bridge_family_drop_shows_the_kernels_reason() {
    let _host = host_untouched();
    let lab = Standing::up("tdbr", &[]);
    lab.sh("node2", "nft", &["add", "table", "bridge", "pods"]);
    lab.sh(
        "node2",
        "nft",
        &["add chain bridge pods out { type filter hook output priority 0; }"],
    );
    lab.sh(
        "node2",
        "nft",
        &["add rule bridge pods out ip daddr 10.244.2.2 drop"],
    );
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node2", "firewall-drop", "bridge pods out handle");
    assert_kernel_drop(&t.1, "NETFILTER_DROP", "node2", "cnilab0");
    // From the pod, the probe arrives; its answer is what the bridge drops.
    let (code, v) = lab.trace("node2-pod0", "node1", &[]);
    assert_eq!(
        (code, &v["verdict"]),
        (Some(0), &Value::from("arrived")),
        "{v:#}"
    );
    assert_eq!(v["replyDrop"]["reason"], "NETFILTER_DROP", "{v:#}");
    assert_eq!(v["replyDrop"]["namespace"], "node2", "{v:#}");
    assert_eq!(v["replyDrop"]["device"], "cnilab0", "{v:#}");
    // Every ICMP failure has a cause: the rule on the way there, the
    // kernel's drop of the answer on the way back; none is undiagnosed (a
    // TCP probe's answer is followed only when it has the SYN's length: a
    // SYN-ACK, not a RST).
    let out = cnilab_tests::cnilab(&["lab", "check", "--name", &lab.0, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", output_text(&out)));
    let diagnoses: Vec<&Value> = v["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["outcome"]["spec"]["proto"] == "icmp")
        .flat_map(|f| f["diagnoses"].as_array().into_iter().flatten())
        .collect();
    let said = |id: &str, words: &[&str]| {
        diagnoses.iter().any(|d| {
            let msg = d["message"].as_str().unwrap_or_default();
            d["id"] == id && words.iter().all(|w| msg.contains(w))
        })
    };
    assert!(
        said(
            "firewall-drop",
            &["died at node2", "bridge pods out handle"]
        ),
        "{v:#}"
    );
    let answer = [
        "answer died at node2",
        "dropped in node2 on cnilab0: NETFILTER_DROP",
    ];
    assert!(said("kernel-drop", &answer), "{v:#}");
    assert!(!diagnoses.iter().any(|d| d["id"] == "undiagnosed"), "{v:#}");
    lab.assert_no_trace_tables();
}

/// Forwarding off on node1: the kernel says IP_INADDRERRORS in ip_error,
/// on the bridge the pod's packet came in by.
#[test]
fn forwarding_off_shows_the_kernels_reason() {
    let _host = host_untouched();
    let lab = Standing::up("tdfw", &[]);
    lab.sh("node1", "sysctl", &["-qw", "net.ipv4.ip_forward=0"]);
    let t = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_died(&t, "node1", "forwarding-off", "forwarding");
    assert_kernel_drop(&t.1, "IP_INADDRERRORS", "node1", "cnilab0");
    assert_eq!(t.1["kernelDrop"]["function"], "ip_error", "{:#}", t.1);
}

/// A blackhole route on node2 to node1's pods: node1's probe arrives and
/// its answer dies on node2. The kernel says where the answer was dropped;
/// the answer's own walk names the route that killed it, and `lab check`
/// (whose first failures are node1's probes, whose answers die) counts
/// those answers under the same root cause as the requests from node2.
#[test]
fn an_answer_killed_by_a_route_names_the_route() {
    let _host = host_untouched();
    let lab = Standing::up("tdan", &[]);
    lab.sh(
        "node2",
        "ip",
        &["route", "replace", "blackhole", "10.244.1.0/24"],
    );
    let (code, v) = lab.trace("node1-pod0", "node2-pod0", &[]);
    assert_eq!(
        (code, &v["verdict"]),
        (Some(0), &Value::from("arrived")),
        "{v:#}"
    );
    assert_eq!(v["replyDrop"]["namespace"], "node2", "{v:#}");
    assert_eq!(v["replyDeath"]["namespace"], "node2", "{v:#}");
    assert_eq!(v["replyDeath"]["cause"], "blackhole", "{v:#}");
    let object = v["replyDeath"]["object"].as_str().unwrap_or_default();
    assert!(object.contains("10.244.1.0/24"), "{v:#}");
    let out = cnilab_tests::cnilab(&["lab", "check", "--name", &lab.0, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", output_text(&out)));
    let answers: Vec<&str> = r["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| f["diagnoses"].as_array().into_iter().flatten())
        .filter_map(|d| d["message"].as_str())
        .filter(|m| m.contains("its answer died at node2: blackhole"))
        .collect();
    assert!(!answers.is_empty(), "{r:#}");
    let blackhole = r["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["id"] == "blackhole")
        .count();
    assert_eq!(blackhole, 1, "{:#}", r["causes"]);
    lab.assert_no_trace_tables();
}

/// The traces of one batch share one tracefs instance of this process:
/// made by the first trace, kept while the batch holds it (the traces'
/// lengths and protocols all in its filters), and removed when the batch
/// ends; without a hold, the last trace's end removes it.
#[test]
fn a_batch_of_traces_shares_one_instance_removed_after_it() {
    use cnilab_harness::trace::drops;
    cnilab_tests::require_root();
    let support = match drops::support() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("SKIP a_batch_of_traces_shares_one_instance_removed_after_it: {why}");
            return;
        }
    };
    let own = format!("cnilab-{}-", std::process::id());
    let mine = || -> Vec<String> {
        std::fs::read_dir(support.root.join("instances"))
            .expect("tracefs instances")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&own))
            .collect()
    };
    // One read: a filter file answers only a read from its start (a
    // second read of a longer filter is its end of file).
    let filter = |name: &str, event: &str| {
        use std::io::Read;
        let path = support
            .root
            .join("instances")
            .join(name)
            .join(event)
            .join("filter");
        let mut buf = vec![0u8; 4096];
        let n = std::fs::File::open(&path)
            .and_then(|mut f| f.read(&mut buf))
            .expect("filter");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    {
        let _batch = drops::hold();
        assert!(mine().is_empty(), "{:?}", mine());
        let a = drops::Instance::create(support, 1111, 0x0800).expect("first trace");
        let b = drops::Instance::create(support, 1113, 0x86dd).expect("second trace");
        let made = mine();
        assert_eq!(made.len(), 1, "one instance for both: {made:?}");
        let rx = filter(&made[0], "events/net/netif_receive_skb");
        assert!(rx.contains("1111") && rx.contains("1113"), "{rx}");
        let queued = filter(&made[0], "events/net/net_dev_queue");
        assert!(
            queued.contains("1125") && queued.contains("1127"),
            "{queued}"
        );
        let freed = filter(&made[0], "events/skb/kfree_skb");
        assert!(freed.contains("2048") && freed.contains("34525"), "{freed}");
        drop((a, b));
        assert_eq!(mine(), made, "kept while the batch holds it");
        let c = drops::Instance::create(support, 1115, 0x0800).expect("third trace");
        assert_eq!(mine(), made, "the third trace uses the same instance");
        // Nothing recorded is a trace's own but what follows its marker.
        assert!(c.records(support).expect("records").is_empty());
    }
    assert!(mine().is_empty(), "removed with the batch: {:?}", mine());
    let alone = drops::Instance::create(support, 1117, 0x0800).expect("a trace alone");
    assert_eq!(mine().len(), 1);
    drop(alone);
    assert!(
        mine().is_empty(),
        "removed with its only trace: {:?}",
        mine()
    );
}
