//! Root tests of the work one `cnilab-bridge` ADD does besides the
//! kernel's: traced with strace, they pin down the threads,
//! processes and file writes of an ADD on a ready node, so a cut made for
//! speed is not silently undone, and the order it relies on (the
//! attachment's cache, with its address, before any link) holds.

use cnilab_harness::netns::Netns;
use cnilab_tests::{
    host_untouched, invoke, require_root, result_of, traced_plugin_command_of, workspace_bin, Call,
};
use rstest::rstest;
use serde_json::{json, Value};
use std::path::Path;

const NET: &str = "costnet";

fn config(dual: bool, data_dir: &Path) -> Value {
    let mut ranges = vec![json!([{"subnet": "10.89.0.0/24"}])];
    if dual {
        ranges.push(json!([{"subnet": "fd00:89::/64"}]));
    }
    json!({
        "cniVersion": "1.1.0",
        "name": NET,
        "type": "cnilab-bridge",
        "bridge": "cnicost0",
        "isGateway": true,
        "isDefaultGateway": true,
        "ipMasq": true,
        "ipam": {"ranges": ranges, "dataDir": data_dir},
    })
}

fn add_call<'a>(id: &'a str, pod: &'a Netns) -> Call<'a> {
    Call {
        command: "ADD",
        container_id: id,
        netns: Some(pod.path()),
        ifname: "eth0",
    }
}

/// The plugin process's lines of an `strace -f` trace that match `pred`.
fn lines(trace: &str, pred: impl Fn(&str) -> bool) -> Vec<&str> {
    trace.lines().filter(|l| pred(l)).collect()
}

/// The second ADD on a node (bridge, gateway and masquerade rules in place
/// from the first) writes its attachment cache exactly once, holding its
/// addresses, before the veth is created; rewrites the round-robin cursor
/// in place (no rename); creates the host veth down and
/// brings it up once marked; reads only the bridge's addresses from the
/// kernel; finds forwarding on (the first ADD turned it on) without
/// reading /proc/sys; starts no process (the masquerade is one
/// netlink batch); and starts one thread, which opens the pod namespace's
/// netlink connection, turns off router advertisements on the pod
/// interface (`accept_ra = 0`, so the pod sends no router solicitation for
/// the bridge to flood and takes no route from another pod's forged
/// advertisement) and (IPv6) writes its `accept_dad`.
#[rstest]
#[case::ipv4(false)]
#[case::dual_stack(true)]
fn a_ready_node_add_caches_once_before_any_link_and_starts_no_process(#[case] dual: bool) {
    let _host = host_untouched();
    require_root();
    let host = Netns::with_label("cost").expect("host netns");
    let data = tempfile::tempdir().expect("data dir");
    let conf = config(dual, data.path());
    let plugin = workspace_bin("cnilab-bridge");
    let first = Netns::with_label("cost-a").expect("pod");
    let sysctl = |ns: &Netns, key: &str| {
        let out = ns
            .command("sysctl")
            .args(["-n", key])
            .output()
            .expect("sysctl runs");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(sysctl(&host, "net.ipv4.ip_forward"), "0", "a new namespace");
    result_of(&invoke(&host, &plugin, &add_call("cost-a", &first), &conf));
    assert_eq!(
        sysctl(&host, "net.ipv4.ip_forward"),
        "1",
        "the gateway forwards"
    );
    if dual {
        assert_eq!(sysctl(&host, "net.ipv6.conf.all.forwarding"), "1");
    }

    let pod = Netns::with_label("cost-b").expect("pod");
    let trace_path = data.path().join("add.strace");
    let out = assert_cmd::Command::from_std(traced_plugin_command_of(
        &host,
        &plugin,
        &add_call("cost-b", &pod),
        &trace_path,
        "clone,clone3,vfork,execve,rename,renameat,renameat2,sendto,recvfrom,openat,fsopen",
    ))
    .write_stdin(conf.to_string())
    .output()
    .expect("strace runs");
    let res = result_of(&out);
    let trace = std::fs::read_to_string(&trace_path).expect("trace");

    let cached = lines(&trace, |l| {
        l.contains("rename") && l.contains("cost-b:eth0.json\"")
    });
    assert_eq!(cached.len(), 1, "the cache is written once: {trace}");
    // The round-robin cursor is rewritten in place: a rename over it made
    // ext4 flush and evict a file on every ADD.
    let cursor_renames = lines(&trace, |l| {
        l.contains("rename") && l.contains("last_reserved_ip")
    });
    assert!(
        cursor_renames.is_empty(),
        "the cursor is not renamed into place: {cursor_renames:#?}"
    );
    let cache_at = trace.find(cached[0]).expect("in the trace");
    let created = lines(&trace, |l| {
        l.contains("sendto(") && l.contains("RTM_NEWLINK") && l.contains("NLM_F_CREATE")
    });
    assert_eq!(created.len(), 1, "one link is created (the veth): {trace}");
    assert!(
        cache_at < trace.find(created[0]).expect("in the trace"),
        "the cache is written before the veth exists: {trace}"
    );
    let path = data
        .path()
        .join(".cnilab-bridge")
        .join(NET)
        .join("cost-b:eth0.json");
    let text = std::fs::read_to_string(&path).expect("the cache stays after ADD");
    let cache: Value = serde_json::from_str(&text).expect("cache JSON");
    let ips: Vec<String> = res
        .ips
        .iter()
        .map(|i| i.address.addr().to_string())
        .collect();
    assert_eq!(cache["ips"], json!(ips), "the cache holds what ADD gave");

    // The bridge's address dump (is the gateway there?) carries the
    // bridge's addresses only, not lo's or the other pods' veths'.
    let dumped = lines(&trace, |l| {
        l.contains("recvfrom(") && l.contains("RTM_NEWADDR")
    });
    assert!(
        !dumped.is_empty(),
        "the bridge's addresses are read: {trace}"
    );
    let bridge = "ifa_index=if_nametoindex(\"cnicost0\")";
    for reply in dumped {
        assert_eq!(
            reply.matches("ifa_index=").count(),
            reply.matches(bridge).count(),
            "only the bridge's addresses come back: {reply}"
        );
    }

    // Forwarding, on already, is asked over netlink, not read in /proc/sys
    // (a lookup whose cost grows with the namespaces on the machine).
    let proc_reads = lines(&trace, |l| l.contains("openat(") && l.contains("forward"));
    assert!(
        proc_reads.is_empty(),
        "no /proc/sys read of forwarding: {proc_reads:#?}"
    );

    // The host veth is made down, marked, then brought up.
    let create = created[0];
    assert!(
        !create.contains("ifi_flags=IFF_UP"),
        "the host veth is created down: {create}"
    );
    let veth = &res.interfaces[1].name;
    let link = host
        .links()
        .expect("host links")
        .into_iter()
        .find(|l| &l.name == veth)
        .expect("host veth");
    assert!(link.up, "the host veth is up after ADD");
    assert!(
        link.alias
            .as_deref()
            .is_some_and(|a| a.starts_with("cnilab/")),
        "and marked: {:?}",
        link.alias
    );

    let spawned = lines(&trace, |l| {
        (l.contains("clone(") || l.contains("clone3(")) && l.contains("CLONE_THREAD")
    });
    assert_eq!(spawned.len(), 1, "threads started: {trace}");
    assert_eq!(
        sysctl(&pod, "net.ipv6.conf.eth0.accept_ra"),
        "0",
        "router advertisements are off on eth0"
    );
    // Looked up in a procfs instance of the plugin's own: the machine's
    // /proc/sys/net has one entry per namespace to walk.
    let instances = lines(&trace, |l| l.contains("fsopen(\"proc\""));
    assert_eq!(instances.len(), 1, "one private procfs: {trace}");
    let shared = lines(&trace, |l| l.contains("\"/proc/sys/net"));
    assert!(
        shared.is_empty(),
        "no lookup under /proc/sys/net: {shared:#?}"
    );
    let private = lines(&trace, |l| {
        l.contains("\"sys/net/ipv6/conf/eth0/accept_ra\"") && !l.contains("= -1")
    });
    assert_eq!(private.len(), 1, "accept_ra opened in it: {trace}");
    if dual {
        let dad = sysctl(&pod, "net.ipv6.conf.eth0.accept_dad");
        assert_eq!(dad, "0", "DAD is off on eth0");
    }
    let processes = lines(&trace, |l| l.contains("execve(") || l.contains("vfork("));
    assert_eq!(
        processes.len(),
        1,
        "the plugin's own execve only, no process per ADD: {trace}"
    );
}

/// The floor with `"bridge"`: the cheapest ADD of a bridge plugin, whose
/// host veth is a port of that bridge from its creation (the bridge made,
/// up, by the first ADD), so `ADD − bridged floor` is a bridge plugin's
/// own cost and `bridged floor − floor` the kernel's cost of a bridge
/// port. A bridge that is no interface name is refused (code 7) before
/// anything is made.
#[test]
fn the_floor_with_a_bridge_makes_its_host_veth_a_port_of_it() {
    let _host = host_untouched();
    require_root();
    let host = Netns::with_label("floorbr").expect("host netns");
    let floor = workspace_bin("cnilab-floor");
    let conf = json!({"cniVersion": "1.1.0", "name": "floornet", "type": "cnilab-floor", "bridge": "flr0"});
    let pods: Vec<Netns> = (0..2)
        .map(|_| Netns::with_label("floorbr-pod").expect("pod"))
        .collect();
    for (i, pod) in pods.iter().enumerate() {
        let id = format!("floor-{i}");
        result_of(&invoke(&host, &floor, &add_call(&id, pod), &conf));
    }
    let links = host.links().expect("host links");
    let bridge = links
        .iter()
        .find(|l| l.name == "flr0")
        .expect("the first ADD made the bridge");
    assert!(bridge.up, "the bridge is up");
    let ports: Vec<&str> = links
        .iter()
        .filter(|l| l.kind.as_deref() == Some("veth"))
        .inspect(|l| assert_eq!(l.controller, Some(bridge.index), "{} on flr0", l.name))
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(ports.len(), 2, "one port per ADD: {ports:?}");
    for pod in &pods {
        let eth0 = pod
            .links()
            .expect("pod links")
            .into_iter()
            .find(|l| l.name == "eth0")
            .expect("eth0 in the pod");
        assert!(eth0.up, "eth0 is up");
    }

    let bad =
        json!({"cniVersion": "1.1.0", "name": "floornet", "type": "cnilab-floor", "bridge": "a/b"});
    let pod = Netns::with_label("floorbr-bad").expect("pod");
    let err = cnilab_tests::error_of(&invoke(&host, &floor, &add_call("floor-bad", &pod), &bad));
    assert_eq!(err.code, 7, "{}", err.msg);
    assert_eq!(
        host.links().expect("host links").len(),
        links.len(),
        "nothing made for a refused bridge"
    );
}
