//! `cnilab capture` (root), continued: `--redact` keeps relations and drops
//! every original address and name, a standing lab's node is captured with
//! its pods, bad input exits 2 with the fix. (The 110-pod figure:
//! `capture_bench.rs`.)

mod capture_common;

use capture_common::*;
use cnilab_tests::{host_untouched, require_root};
use serde_json::Value;
use std::path::Path;

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
    // Every unicast MAC the kernel or Calico gave (ee:ee:ee:ee:ee:ee).
    let plain = capture(&k.node, &[], &same);
    let macs = |ns: &Value| -> Vec<String> {
        ns["links"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["mac"].as_str().map(String::from))
            .filter(|m| m != "00:00:00:00:00:00")
            .collect()
    };
    let plain_pods = plain["node"]["pods"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let plain_macs: Vec<String> = std::iter::once(&plain["node"])
        .chain(&plain_pods)
        .flat_map(macs)
        .collect();
    assert!(
        plain_macs.iter().any(|m| m == "ee:ee:ee:ee:ee:ee"),
        "{plain_macs:?}"
    );
    originals.extend(plain_macs);
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
        // The pod's gateway neighbour still names its cali's (mapped) MAC,
        // which keeps its locally-administered bit.
        let cali_mac = cali["mac"].as_str().expect("cali mac");
        assert!(
            has(
                &pod["neighbours"],
                serde_json::json!({"addr": "169.254.1.1", "mac": cali_mac})
            ),
            "{cali_mac}: {}",
            pod["neighbours"]
        );
        let byte0 = u8::from_str_radix(&cali_mac[..2], 16).expect("hex");
        assert_eq!(byte0 & 3, 2, "{cali_mac}");
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

/// Takes a standing lab down when dropped (also after a failed assert).
struct LabDown(String);

impl Drop for LabDown {
    fn drop(&mut self) {
        let _ = cnilab(&["lab", "down", "--name", &self.0]);
    }
}

/// `cnilab lab up --name NAME --nodes N --pods-per-node 2 EXTRA…`, down
/// when the guard drops.
fn lab_up(name: &str, nodes: &str, extra: &[&str]) -> LabDown {
    let down = LabDown(name.to_string());
    let mut args = vec!["lab", "up", "--name", name, "--nodes", nodes];
    args.extend_from_slice(&["--pods-per-node", "2"]);
    args.extend_from_slice(extra);
    let up = cnilab(&args);
    assert!(up.status.success(), "{}", all(&up));
    down
}

/// A standing lab's node: its pods are found, the switch is a peer.
#[test]
fn a_standing_lab_node_is_captured_with_its_pods() {
    let _host = host_untouched();
    require_root();
    let name = format!("cap{}", std::process::id());
    let _down = lab_up(&name, "2", &[]);
    let node_ns = format!("cnilab-lab-{name}-node1");
    let read = || {
        let path = Path::new("/run/netns").join(&node_ns);
        cnilab_harness::lab::layout::namespace_at(&path, "node1").expect("read")
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

/// What cannot be read is a warning, not a failure: without `nft` and
/// `iptables-legacy-save` on the PATH, the Calico node (legacy tables and
/// all, and one nftables table: a namespace without any runs no `nft`) is
/// still captured, with a warning naming each tool.
#[test]
fn a_missing_tool_is_a_warning() {
    let _host = host_untouched();
    let k = calico();
    run(&k.node, "nft", &["add table inet cnilab-capture-test"]);
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("node.json");
    let out = std::process::Command::new(cnilab_tests::workspace_bin("cnilab"))
        .args(["capture", "--netns", &k.node.path().display().to_string()])
        .args(["-o", &file.display().to_string()])
        .env("PATH", dir.path())
        .output()
        .expect("cnilab runs");
    assert!(out.status.success(), "{}", all(&out));
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("file")).expect("JSON");
    let warnings = c["warnings"].to_string();
    assert!(warnings.contains("nft"), "{warnings}");
    assert!(
        warnings.contains("legacy ipv4 iptables tables filter not read")
            && warnings.contains("iptables-legacy-save"),
        "{warnings}"
    );
    assert!(c["node"].get("nftables").is_none(), "{}", c["node"]);
    assert_eq!(link(&c["node"], "cali0abc")["kind"], "veth");
    assert_eq!(c["pods"].as_array().map(Vec::len), Some(3), "{}", c["pods"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("⚠️") && shown.contains("iptables-legacy-save"),
        "{shown}"
    );
}

/// Pod names come from the CRI where a socket answers: a standing
/// containerd lab's node, captured with its node's CRI socket, names each
/// pod by its sandbox as kubectl does (`<namespace>/<name>`: the lab's
/// sandboxes are in namespace `cnilab`) and records its pause pid.
#[test]
fn pods_are_named_by_the_cri() {
    let _host = host_untouched();
    require_root();
    let name = format!("capc{}", std::process::id());
    let _down = lab_up(&name, "1", &["--runtime", "containerd"]);
    let socket = format!("/run/cnilab/labs/{name}/node1/cri/sock");
    let node_ns = format!("cnilab-lab-{name}-node1");
    let out = cnilab(&[
        "capture",
        "--netns",
        &node_ns,
        "--cri-socket",
        &socket,
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", all(&out));
    let c: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut named: Vec<(String, String)> = c["pods"]
        .as_array()
        .map(|p| {
            p.iter()
                .map(|p| (p["name"].to_string(), p["cri"].to_string()))
                .collect()
        })
        .unwrap_or_default();
    named.sort();
    let want = |p: &str| (format!("\"cnilab/{p}\""), format!("\"cnilab/{p}\""));
    assert_eq!(
        named,
        [want("node1-pod0"), want("node1-pod1")],
        "{}",
        c["pods"]
    );
    assert!(
        c["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|p| p["pid"].as_u64().is_some()),
        "the pause process holds each: {}",
        c["pods"]
    );
    let pod = pod_named(&c, "cnilab/node1-pod0");
    assert!(link(pod, "eth0")["addresses"][0]
        .as_str()
        .is_some_and(|a| a.starts_with("10.244.1.")));
    let cali_like = c["node"]["links"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| l["veth"]["namespace"] == "cnilab/node1-pod0")
        .count();
    assert_eq!(
        cali_like, 1,
        "the node's veth names the CRI pod: {}",
        c["node"]["links"]
    );
    assert!(
        !c["warnings"].to_string().contains("CRI"),
        "{}",
        c["warnings"]
    );
}

/// Not root: exit 2 with the fix, before anything is read.
#[test]
fn not_root_exits_2_with_the_fix() {
    require_root();
    let dir = tempfile::tempdir().expect("tmp");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(cnilab_tests::workspace_bin("cnilab"))
        .args(["capture", "-o", "json"])
        .current_dir(dir.path())
        .output()
        .expect("setpriv runs");
    assert_eq!(out.status.code(), Some(2), "{}", all(&out));
    assert!(
        all(&out).contains("needs root") && all(&out).contains("sudo"),
        "{}",
        all(&out)
    );
}

/// `-o DIR/node.json` in a directory others can write (a shared `/tmp`):
/// a symlink planted at the partial name cnilab once opened with
/// create+truncate (`.node.json.partial`), and one at the final name, are
/// never written through; the capture replaces the final symlink by its
/// file and leaves no partial file of its own.
#[test]
fn a_symlink_planted_beside_the_output_is_not_written_through() {
    let _host = host_untouched();
    require_root();
    let ns = cnilab_harness::netns::Netns::with_label("capo").expect("netns");
    let dir = tempfile::tempdir().expect("tmp");
    let target = dir.path().join("precious");
    std::fs::write(&target, "keep me").expect("write");
    let partial = dir.path().join(".node.json.partial");
    let file = dir.path().join("node.json");
    std::os::unix::fs::symlink(&target, &partial).expect("symlink");
    std::os::unix::fs::symlink(&target, &file).expect("symlink");
    let out = cnilab_tests::cnilab(&[
        "capture",
        "--netns",
        &ns.path().display().to_string(),
        "--node-name",
        "n1",
        "-o",
        &file.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", all(&out));
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep me");
    assert!(partial.is_symlink(), "the planted link is left as it was");
    assert!(!file.is_symlink(), "the final symlink is replaced");
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("file")).expect("JSON");
    assert_eq!(c["node"]["name"], "n1");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial") && n != ".node.json.partial")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
