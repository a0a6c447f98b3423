//! Root tests of the throwaway namespaces: naming, cleanup (also on panic),
//! sweep of a killed run's leftovers, and the netlink readers.

mod common;

use cnilab_harness::netns::{self, Netns, PREFIX};
use cnilab_harness::testing;
use common::*;
use rstest::rstest;
use std::path::Path;
use std::process::Command;

fn listed(name: &str) -> bool {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

#[test]
fn a_namespace_is_named_mounted_and_removed_on_drop() {
    let _host = host_untouched();
    require_root();
    let ns = Netns::with_label("naming").expect("create");
    let name = ns.name().to_string();
    assert!(
        name.starts_with(&format!("{PREFIX}{}-", std::process::id())),
        "{name}"
    );
    assert!(name.ends_with("-naming"));
    assert!(ns.path().exists());
    assert!(listed(&name), "`ip netns list` must show {name}");
    let path = ns.path().to_path_buf();
    drop(ns);
    assert!(!path.exists(), "{} must be gone after drop", path.display());
    assert!(!listed(&name));
}

#[test]
fn a_namespace_is_removed_when_its_owner_panics() {
    let _host = host_untouched();
    require_root();
    let (tx, rx) = std::sync::mpsc::channel();
    let joined = std::thread::spawn(move || {
        let ns = Netns::with_label("panics").expect("create");
        tx.send(ns.path().to_path_buf()).expect("send path");
        panic!("deliberate panic while the namespace is alive");
    })
    .join();
    assert!(joined.is_err(), "the thread must have panicked");
    let path = rx.recv().expect("path");
    assert!(
        !path.exists(),
        "{} must be removed while unwinding",
        path.display()
    );
}

#[test]
fn bad_labels_are_refused() {
    require_root();
    assert!(Netns::with_label("../x").is_err());
    assert!(Netns::with_label("way-too-long-label").is_err());
    assert!(Netns::with_label("").is_err());
}

/// Set for the copy of this test binary that
/// [`sweep_removes_namespaces_of_dead_processes_only`] starts and kills.
const HELPER: &str = "CNILAB_SWEEP_TEST_HELPER";

/// Not a test of its own: the process that makes a namespace and is then
/// SIGKILLed (run only with [`HELPER`] set).
#[test]
#[ignore]
fn helper_makes_a_namespace_and_waits() {
    if std::env::var_os(HELPER).is_none() {
        return;
    }
    let ns = Netns::with_label("sweeptest").expect("create");
    println!("NETNS={}", ns.name());
    std::thread::sleep(std::time::Duration::from_secs(600));
}

/// `ip netns del` on drop, for namespaces made by hand.
struct ByHand(String);

impl Drop for ByHand {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// A namespace a SIGKILLed process made (with the owner record it wrote)
/// goes; one of the same shape with a dead pid but no record stays, and so
/// does a live process's.
#[test]
fn sweep_removes_namespaces_of_dead_processes_only() {
    use std::io::BufRead;
    let _host = host_untouched();
    require_root();
    let mut helper = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "helper_makes_a_namespace_and_waits",
            "--ignored",
            "--nocapture",
        ])
        .env(HELPER, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("helper");
    let out = helper.stdout.take().expect("stdout");
    let leftover = std::io::BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("NETNS=").map(str::to_string))
        .expect("the helper names its namespace");
    helper.kill().expect("SIGKILL");
    helper.wait().expect("reap");
    let _leftover_guard = ByHand(leftover.clone());

    let mut child = Command::new("true").spawn().expect("spawn true");
    let dead = child.id();
    child.wait().expect("wait");
    let unrecorded = format!("{PREFIX}{dead}-0-sweeptest");
    let status = Command::new("ip")
        .args(["netns", "add", &unrecorded])
        .status()
        .expect("ip netns add");
    assert!(status.success());
    let _unrecorded_guard = ByHand(unrecorded.clone());
    let alive = Netns::with_label("alive").expect("create");

    let removed = netns::sweep(PREFIX).expect("sweep");
    // Another cnilab process on the machine (a second test run, a user's
    // `cnilab sweep`) may sweep the dead namespace first: what must hold
    // whoever swept is that it is gone and the others are not.
    let exists = |n: &str| Path::new(netns::NETNS_DIR).join(n).exists();
    assert!(
        !exists(&leftover),
        "the killed process's namespace is still there; sweep removed {removed:?}"
    );
    assert!(
        exists(&unrecorded),
        "a namespace without an owner record was removed by its name"
    );
    assert!(
        alive.path().exists(),
        "a namespace of a live process must survive"
    );
    assert!(!removed.iter().any(|n| n == alive.name()));
}

#[rstest]
fn readers_see_links_addresses_and_routes(host: Netns) {
    let _host = host_untouched();
    let run = |args: &[&str]| {
        let status = host.command("ip").args(args).status().expect("ip");
        assert!(status.success(), "ip {args:?}");
    };
    run(&["link", "add", "t-br", "type", "bridge"]);
    run(&[
        "link", "add", "t-veth", "type", "veth", "peer", "name", "t-peer",
    ]);
    run(&[
        "link", "set", "t-veth", "master", "t-br", "mtu", "1400", "up",
    ]);
    run(&["link", "set", "t-br", "up"]);
    run(&["addr", "add", "10.200.0.1/24", "dev", "t-br"]);
    run(&["route", "add", "10.201.0.0/16", "via", "10.200.0.2"]);

    let state = host.snapshot().expect("snapshot");
    let br = state.link("t-br").expect("bridge listed");
    assert_eq!(br.kind.as_deref(), Some("bridge"));
    let veth = state.link("t-veth").expect("veth listed");
    assert_eq!(veth.kind.as_deref(), Some("veth"));
    assert_eq!(veth.mtu, Some(1400));
    assert!(veth.up);
    assert_eq!(veth.controller, Some(br.index));
    assert_eq!(veth.mac.as_deref().map(str::len), Some(17));
    assert!(state
        .addresses_of(br.index)
        .contains(&"10.200.0.1/24".parse().expect("net")));
    assert!(state
        .routes
        .iter()
        .any(|r| r.dst.to_string() == "10.201.0.0/16"
            && r.gateway == Some("10.200.0.2".parse().expect("ip"))));
    // Nothing of this is in the real host namespace.
    let out = Command::new("ip")
        .args(["-o", "link"])
        .output()
        .expect("ip link");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("t-br"));
}

#[rstest]
fn run_and_command_execute_inside(host: Netns) {
    let _host = host_untouched();
    let inside = host
        .run(|| std::fs::read_link("/proc/thread-self/ns/net").map(|p| p.display().to_string()))
        .expect("run")
        .expect("readlink");
    let outside = std::fs::read_link("/proc/self/ns/net")
        .expect("readlink")
        .display()
        .to_string();
    assert_ne!(
        inside, outside,
        "the closure must run in the other namespace"
    );
    let out = host
        .command("ip")
        .args(["-o", "link"])
        .output()
        .expect("ip");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.lines().count(),
        1,
        "a fresh namespace has only lo: {text}"
    );
    assert!(host
        .links()
        .expect("links")
        .iter()
        .any(|l| l.name == "lo" && l.up));
}

/// The snapshot behind `host_untouched` sees each kind of change, shown on
/// a throwaway namespace (the machine's own is never touched).
#[rstest]
fn the_host_snapshot_sees_routes_rules_links_and_sysctls(host: Netns) {
    let before = testing::network_of(&host);
    assert!(testing::network_of(&host).changes_since(&before).is_empty());
    let run = |program: &str, args: &[&str]| {
        let out = host.command(program).args(args).output().expect("runs");
        assert!(out.status.success(), "{program} {args:?}: {out:?}");
    };
    run(
        "ip",
        &[
            "link", "add", "t-dummy", "type", "veth", "peer", "name", "t-dummy1",
        ],
    );
    run("ip", &["link", "set", "t-dummy", "up"]);
    run("ip", &["addr", "add", "10.211.0.1/24", "dev", "t-dummy"]);
    run(
        "ip",
        &["route", "add", "10.212.0.0/16", "via", "10.211.0.2"],
    );
    run(
        "ip",
        &["-6", "route", "add", "fd00:212::/64", "dev", "t-dummy"],
    );
    run("nft", &["add", "table", "inet", "t_snap"]);
    run("iptables", &["-P", "FORWARD", "DROP"]);
    run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
    let changes = testing::network_of(&host).changes_since(&before).join("\n");
    for needle in [
        "new link t-dummy",
        "new address 10.211.0.1/24",
        "new route 10.212.0.0/16 via 10.211.0.2",
        "new route fd00:212::/64",
        "now: nft: table inet t_snap",
        "now: iptables-save: :FORWARD DROP",
        "now: sysctl net/ipv4/ip_forward = 1",
        "was: sysctl net/ipv4/ip_forward = 0",
    ] {
        assert!(
            changes.contains(needle),
            "{needle:?} missing in:\n{changes}"
        );
    }
    run("ip", &["link", "del", "t-dummy"]);
    let gone = testing::network_of(&host).changes_since(&before).join("\n");
    assert!(!gone.contains("t-dummy"), "{gone}");
}

/// A namespace made here starts at the kernel's values, whatever the host
/// has: on a host with `ip_forward = 1` or `rp_filter = 2` (`.ci/run`'s
/// second pass sets both), it would otherwise inherit them.
#[rstest]
fn a_new_namespace_has_the_kernels_values_not_the_hosts(host: Netns) {
    let differ = netns::run_in(host.file(), netns::defaults::inherited_differences)
        .expect("enter")
        .expect("read");
    assert!(differ.is_empty(), "inherited from the host: {differ:?}");
}

/// The reset finds every setting that differs from the kernel's value, in
/// `all`, `default` and `lo`, and sets it back.
#[rstest]
fn the_kernels_values_are_set_back_wherever_they_differ(host: Netns) {
    let changed = [
        ("net/ipv4/conf/all/forwarding", "1"),
        ("net/ipv4/conf/all/rp_filter", "2"),
        ("net/ipv4/conf/default/rp_filter", "2"),
        ("net/ipv4/conf/lo/accept_local", "1"),
        ("net/ipv6/conf/default/accept_ra", "0"),
    ];
    for (key, value) in changed {
        netns::write_sysctl(Some(host.file()), key, value).expect("write");
    }
    let differ = netns::run_in(host.file(), netns::defaults::inherited_differences)
        .expect("enter")
        .expect("read");
    let keys: Vec<&str> = differ.iter().map(|(k, _)| k.as_str()).collect();
    for (key, _) in changed {
        assert!(keys.contains(&key), "{key} not found in {keys:?}");
    }
    netns::run_in(host.file(), netns::defaults::reset_to_kernel_values)
        .expect("enter")
        .expect("reset");
    let after = netns::run_in(host.file(), netns::defaults::inherited_differences)
        .expect("enter")
        .expect("read");
    assert!(after.is_empty(), "{after:?}");
    assert_eq!(
        netns::read_sysctl(Some(host.file()), "net/ipv4/ip_forward").expect("read"),
        "0"
    );
}
