//! The capture figures (a bench, not a timed test: it asserts what the
//! capture holds, never how long it took), for docs/src/performance.md
//! ("Capture"):
//!
//! ```sh
//! cargo build --release -p cnilab-harness --bin cnilab
//! CNILAB_BIN=$PWD/target/release/cnilab \
//!   cargo test -p cnilab-tests --test capture_bench -- --ignored --nocapture
//! ```
//!
//! One node with 110 pods (the kubelet's default maximum) the way Calico
//! makes them (a `cali*` veth with Calico's MAC, a /32 route, proxy ARP,
//! the pod's permanent neighbour for 169.254.1.1) and kube-proxy's
//! iptables-nft chains for one Service per pod (KUBE-SVC/KUBE-SEP with
//! DNAT and comments), in throwaway namespaces. `cnilab capture --netns`
//! runs three times, plain and `--redact`; the times and the file size
//! are printed. The same node captured by the capture script
//! (`cnilab capture --script`, run under `dash` with `CNILAB_NETNS`), three
//! times: its run time, its file's size, and the time of
//! `cnilab capture --from-script` reading it; the script's capture holds
//! the same pods. Then the script's file replayed (`lab up --capture`)
//! and checked (`lab check`, which must pass), each timed once. The script reads every namespace on the machine (those
//! with no link out only by their links), so its figure grows with what
//! else runs there.

mod capture_common;

use capture_common::*;
use cnilab_net::netns::Netns;
use cnilab_tests::host_untouched;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const PODS: usize = 110;

/// `CNILAB_BIN` (an absolute path: a release build for the figures), else
/// the test profile's.
fn cnilab_bin() -> PathBuf {
    std::env::var_os("CNILAB_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| cnilab_tests::workspace_bin("cnilab"))
}

/// kube-proxy's nat chains for one Service per pod, as iptables-save text.
fn services(pods: usize) -> String {
    let mut chains = String::from(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n",
    );
    // The hairpin: a pod reaching its own Service is masqueraded, or its
    // answer would come from its own address to itself.
    let mut rules = String::from(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n",
    );
    for i in 0..pods {
        let (svc, sep) = (
            format!("KUBE-SVC-BENCH{i:04}"),
            format!("KUBE-SEP-BENCH{i:04}"),
        );
        let (vip, ep) = (format!("10.96.1.{}", i + 2), format!("10.65.1.{}", i + 2));
        chains.push_str(&format!(":{svc} - [0:0]\n:{sep} - [0:0]\n"));
        rules.push_str(&format!(
            "-A KUBE-SERVICES -d {vip}/32 -p tcp -m comment --comment \"bench/svc{i}:http cluster IP\" -m tcp --dport 80 -j {svc}\n\
             -A {svc} -m comment --comment \"bench/svc{i}:http -> {ep}:8080\" -j {sep}\n\
             -A {sep} -s {ep}/32 -m comment --comment \"bench/svc{i}:http\" -j KUBE-MARK-MASQ\n\
             -A {sep} -p tcp -m comment --comment \"bench/svc{i}:http\" -m tcp -j DNAT --to-destination {ep}:8080\n"
        ));
    }
    format!("{chains}{rules}COMMIT\n")
}

/// One capture of `node` into `file`: how long it took.
fn timed_capture(node: &Netns, file: &std::path::Path, extra: &[&str]) -> Duration {
    let started = Instant::now();
    let out = Command::new(cnilab_bin())
        .args(["capture", "--netns", &node.path().display().to_string()])
        .args(["-o", &file.display().to_string()])
        .args(extra)
        .output()
        .expect("cnilab runs");
    let took = started.elapsed();
    assert!(out.status.success(), "{}", all(&out));
    took
}

/// The 110-pod node with kube-proxy's Services (see the header).
fn bench_node() -> (Netns, Vec<Netns>, tempfile::TempDir) {
    let n = node("cap-bench", "198.18.11.1/24");
    run(&n, "ip", &["route add blackhole 10.65.1.0/24 proto bird"]);
    // A Calico node forwards (the replay's check needs it).
    sysctl(&n, "net/ipv4/ip_forward", "1");
    let pods: Vec<Netns> = (0..PODS)
        .map(|i| calico_pod(&n, &format!("cali{i:03}"), &format!("10.65.1.{}", i + 2)))
        .collect();
    let dir = tempfile::tempdir().expect("tmp");
    let rules = dir.path().join("services.txt");
    std::fs::write(&rules, services(PODS)).expect("write the rules");
    run_args(&n, "iptables-nft-restore", &[&rules.display().to_string()]);
    (n, pods, dir)
}

#[test]
#[ignore]
fn bench_capture_of_a_110_pod_node() {
    let _host = host_untouched();
    let (n, pods, dir) = bench_node();
    let file = dir.path().join("node.json");
    for (label, extra) in [("plain", &[][..]), ("--redact", &["--redact-key", "k"][..])] {
        let times: Vec<Duration> = (0..3).map(|_| timed_capture(&n, &file, extra)).collect();
        let c: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).expect("file")).expect("JSON");
        assert_conforms(&c);
        assert_eq!(c["pods"].as_array().map(Vec::len), Some(pods.len()));
        let routes = c["node"]["routes"].as_array().map_or(0, Vec::len);
        assert!(routes > PODS, "a /32 route per pod: {routes}");
        let text = iptables_text(&c["node"], "nft");
        assert_eq!(text.matches("-j DNAT").count(), PODS, "{label}");
        let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        let ms: Vec<String> = times
            .iter()
            .map(|t| format!("{:.0}", t.as_secs_f64() * 1000.0))
            .collect();
        println!(
            "capture ({label}) of a node with {} pods and {PODS} Services: {} ms, {size} bytes ({:.2} MB)",
            pods.len(),
            ms.join(" / "),
            size as f64 / 1e6
        );
    }
}

#[test]
#[ignore]
fn bench_script_capture_of_a_110_pod_node() {
    let _host = host_untouched();
    let (n, pods, dir) = bench_node();
    let script = dir.path().join("node.sh");
    let printed = Command::new(cnilab_bin())
        .args(["capture", "--script"])
        .output()
        .expect("cnilab runs");
    assert!(printed.status.success(), "{}", all(&printed));
    std::fs::write(&script, &printed.stdout).expect("write the script");
    let file = dir.path().join("node.capture");
    let json = dir.path().join("node.json");
    let mut runs = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let out = Command::new("dash")
            .arg(&script)
            .arg(&file)
            .env("CNILAB_NETNS", n.path())
            .output()
            .expect("dash runs");
        let ran = started.elapsed();
        assert!(out.status.success(), "{}", all(&out));
        let started = Instant::now();
        let conv = Command::new(cnilab_bin())
            .args(["capture", "--from-script", &file.display().to_string()])
            .args(["-o", &json.display().to_string()])
            .output()
            .expect("cnilab runs");
        let read = started.elapsed();
        assert!(conv.status.success(), "{}", all(&conv));
        runs.push((ran, read));
    }
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("file")).expect("JSON");
    assert_conforms(&c);
    assert_eq!(c["pods"].as_array().map(Vec::len), Some(pods.len()));
    let text = iptables_text(&c["node"], "nft");
    assert_eq!(text.matches("-j DNAT").count(), PODS);
    let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
    let namespaces = std::fs::read_dir("/run/netns").map_or(0, |d| d.count());
    let (up, check) = timed_replay(&file, pods.len());
    println!(
        "capture script (dash) of a node with {} pods and {PODS} Services, {namespaces} namespaces under /run/netns on the machine: script {} ms, file {size} bytes ({:.2} MB); capture --from-script {} ms",
        pods.len(),
        runs.iter().map(|r| ms(r.0)).collect::<Vec<_>>().join(" / "),
        size as f64 / 1e6,
        runs.iter().map(|r| ms(r.1)).collect::<Vec<_>>().join(" / "),
    );
    println!(
        "replay of the script's file: lab up --capture {} ms, lab check {} ms (exit 0)",
        ms(up),
        ms(check)
    );
}

/// `lab up --capture FILE` and `lab check` of the replay (which must pass
/// with every pod up), timed; the lab is taken down after.
fn timed_replay(file: &std::path::Path, pods: usize) -> (Duration, Duration) {
    let lab = format!("cbench{}", std::process::id() % 100_000);
    let run = |args: &[&str]| {
        let started = Instant::now();
        let out = Command::new(cnilab_bin())
            .args(args)
            .output()
            .expect("cnilab runs");
        (out, started.elapsed())
    };
    let path = file.display().to_string();
    let (up, up_took) = run(&["lab", "up", "--name", &lab, "--capture", &path]);
    let _down = cnilab_tests::StandingLab(lab.clone());
    assert!(up.status.success(), "{}", all(&up));
    assert!(
        all(&up).contains(&format!("1 nodes, {pods} pods")),
        "{}",
        all(&up)
    );
    let (check, check_took) = run(&["lab", "check", "--name", &lab]);
    assert!(check.status.success(), "{}", all(&check));
    (up_took, check_took)
}
