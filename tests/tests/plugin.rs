//! Root integration tests of `cnilab-bridge`: the built binary, executed the
//! way a runtime executes it, inside throwaway namespaces. One namespace
//! stands for the host, so the machine's own network is never touched.

use cnilab_harness::netns::Netns;
use cnilab_net::naming::host_veth_name;
use cnilab_net::spec::{code, CniResult};
use cnilab_tests::{
    error_of, host_untouched, invoke, plugin_command, require_root, result_of, store_records,
    traced_plugin_command, with_prev, workspace_bin, Call,
};
use rstest::rstest;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const NET: &str = "itest";

fn plugin() -> PathBuf {
    workspace_bin("cnilab-bridge")
}

fn config(family: &str, data_dir: &Path) -> Value {
    let ranges = match family {
        "v4" => json!([[{"subnet": "10.88.0.0/24"}]]),
        "v6" => json!([[{"subnet": "fd00:88::/64"}]]),
        _ => json!([[{"subnet": "10.88.0.0/24"}], [{"subnet": "fd00:88::/64"}]]),
    };
    json!({
        "cniVersion": "1.1.0",
        "name": NET,
        "type": "cnilab-bridge",
        "bridge": "cnitest0",
        "isDefaultGateway": true,
        "hairpinMode": true,
        "ipMasq": true,
        "ipam": {"ranges": ranges, "dataDir": data_dir},
    })
}

struct Lab {
    host: Netns,
    data: tempfile::TempDir,
    plugin: PathBuf,
}

impl Lab {
    fn new() -> Lab {
        require_root();
        Lab {
            host: Netns::with_label("host").expect("host netns"),
            data: tempfile::tempdir().expect("data dir"),
            plugin: plugin(),
        }
    }

    fn store(&self) -> PathBuf {
        self.data.path().join(NET)
    }

    fn call(
        &self,
        command: &str,
        id: &str,
        netns: Option<&Path>,
        ifname: &str,
        conf: &Value,
    ) -> std::process::Output {
        invoke(
            &self.host,
            &self.plugin,
            &Call {
                command,
                container_id: id,
                netns,
                ifname,
            },
            conf,
        )
    }

    fn add(&self, id: &str, pod: &Netns, conf: &Value) -> CniResult {
        result_of(&self.call("ADD", id, Some(pod.path()), "eth0", conf))
    }

    fn del_ok(&self, id: &str, netns: Option<&Path>, conf: &Value) {
        let out = self.call("DEL", id, netns, "eth0", conf);
        assert!(
            out.status.success(),
            "DEL failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "DEL prints nothing on success");
    }

    fn host_veths(&self) -> Vec<String> {
        self.host
            .links()
            .expect("host links")
            .into_iter()
            .filter(|l| l.kind.as_deref() == Some("veth"))
            .map(|l| l.name)
            .collect()
    }

    /// A command without an attachment (STATUS, GC).
    fn call_network(&self, command: &str, conf: &Value) -> std::process::Output {
        invoke(
            &self.host,
            &self.plugin,
            &Call {
                command,
                container_id: "",
                netns: None,
                ifname: "",
            },
            conf,
        )
    }

    fn host_has_link(&self, name: &str) -> bool {
        self.host
            .links()
            .expect("host links")
            .iter()
            .any(|l| l.name == name)
    }
}

fn ping(from: &Netns, to: std::net::IpAddr) -> bool {
    from.command("ping")
        .args(["-c", "1", "-W", "2", &to.to_string()])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[rstest]
#[case::ipv4("v4", 1)]
#[case::ipv6("v6", 1)]
#[case::dual_stack("dual", 2)]
fn add_check_del_del(#[case] family: &str, #[case] n_ips: usize) {
    let _host = host_untouched();
    let lab = Lab::new();
    let pod = Netns::with_label("pod").expect("pod netns");
    let conf = config(family, lab.data.path());
    let res = lab.add("lifecycle", &pod, &conf);

    // The result: bridge, host veth, container interface with sandbox.
    assert_eq!(res.cni_version, "1.1.0");
    assert_eq!(res.interfaces.len(), 3);
    assert_eq!(res.interfaces[2].name, "eth0");
    assert_eq!(
        res.interfaces[2].sandbox.as_deref(),
        Some(pod.path().to_str().expect("utf8"))
    );
    assert!(res.interfaces[0].sandbox.is_none() && res.interfaces[1].sandbox.is_none());
    assert_eq!(res.ips.len(), n_ips);
    assert!(res.ips.iter().all(|ip| ip.interface == Some(2)));

    // The kernel agrees with the result.
    let state = pod.snapshot().expect("pod state");
    let eth0 = state.link("eth0").expect("eth0 in the pod");
    assert!(eth0.up);
    assert_eq!(eth0.mac.as_deref(), Some(res.interfaces[2].mac.as_str()));
    let addrs = state.addresses_of(eth0.index);
    for ip in &res.ips {
        assert!(
            addrs.contains(&ip.address),
            "{} on eth0: {addrs:?}",
            ip.address
        );
    }
    for r in &res.routes {
        assert!(
            state
                .routes
                .iter()
                .any(|k| k.dst == r.dst && k.gateway == r.gw),
            "route {} via {:?} installed",
            r.dst,
            r.gw
        );
    }
    let host_state = lab.host.snapshot().expect("host state");
    let veth = host_state.link(&res.interfaces[1].name).expect("host veth");
    let bridge = host_state.link("cnitest0").expect("bridge");
    assert_eq!(
        veth.controller,
        Some(bridge.index),
        "host veth is on the bridge"
    );
    assert_eq!(store_records(&lab.store()).len(), n_ips);

    // CHECK passes, then fails once an address is flushed.
    let with = with_prev(&conf, &res);
    let out = lab.call("CHECK", "lifecycle", Some(pod.path()), "eth0", &with);
    assert!(
        out.status.success(),
        "CHECK: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.is_empty());
    let flushed = pod
        .command("ip")
        .args(["addr", "flush", "dev", "eth0"])
        .status()
        .expect("ip addr flush");
    assert!(flushed.success());
    let err = error_of(&lab.call("CHECK", "lifecycle", Some(pod.path()), "eth0", &with));
    assert_eq!(err.code, code::CHECK_MISMATCH);
    assert!(err.msg.contains("missing"), "{}", err.msg);

    // DEL, DEL again: everything is gone.
    lab.del_ok("lifecycle", Some(pod.path()), &with);
    lab.del_ok("lifecycle", Some(pod.path()), &with);
    assert!(pod
        .links()
        .expect("pod links")
        .iter()
        .all(|l| l.name != "eth0"));
    assert!(!lab.host_has_link(&res.interfaces[1].name));
    assert!(store_records(&lab.store()).is_empty());
    assert!(lab.host_has_link("cnitest0"), "the bridge stays");
}

#[rstest]
#[case::ipv4("v4")]
#[case::ipv6("v6")]
fn two_pods_ping_through_the_bridge(#[case] family: &str) {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config(family, lab.data.path());
    let a = Netns::with_label("a").expect("pod a");
    let b = Netns::with_label("b").expect("pod b");
    let ra = lab.add("pinga", &a, &conf);
    let rb = lab.add("pingb", &b, &conf);
    let ip_a = ra.ips[0].address.addr();
    let ip_b = rb.ips[0].address.addr();
    assert_ne!(ip_a, ip_b);
    assert!(ping(&a, ip_b), "{ip_a} reaches {ip_b}");
    assert!(ping(&b, ip_a), "{ip_b} reaches {ip_a}");
    // The gateway on the bridge answers too.
    let gw = ra.ips[0].gateway.expect("gateway");
    assert!(ping(&a, gw), "pod reaches its gateway {gw}");
    lab.del_ok("pingb", Some(b.path()), &conf);
    assert!(
        !ping(&a, ip_b),
        "after DEL of b, a no longer reaches {ip_b}"
    );
}

/// An ADD asks the kernel only what it needs. The bridge's
/// gateway is added when it is missing (also after it was removed by hand)
/// and never sent again when it is there; the host veth's MAC comes from
/// its creation, not from a lookup.
#[test]
fn add_puts_back_a_removed_gateway_and_makes_no_needless_request() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config("v4", lab.data.path());
    let gateway_on_bridge = || {
        let state = lab.host.snapshot().expect("host state");
        let bridge = state.link("cnitest0").expect("bridge");
        state
            .addresses_of(bridge.index)
            .iter()
            .any(|a| a.to_string() == "10.88.0.1/24")
    };
    let a = Netns::with_label("gw-a").expect("pod");
    lab.add("gw-a", &a, &conf);
    assert!(gateway_on_bridge(), "the first ADD puts the gateway on");
    let out = lab
        .host
        .command("ip")
        .args(["addr", "del", "10.88.0.1/24", "dev", "cnitest0"])
        .output()
        .expect("ip runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!gateway_on_bridge(), "removed by hand");
    let b = Netns::with_label("gw-b").expect("pod");
    lab.add("gw-b", &b, &conf);
    assert!(gateway_on_bridge(), "the next ADD puts it back");
    assert!(ping(&b, "10.88.0.1".parse().expect("ip")), "and it answers");

    // A third ADD on the ready bridge, traced.
    let c = Netns::with_label("gw-c").expect("pod");
    let trace = lab.data.path().join("add.strace");
    let call = Call {
        command: "ADD",
        container_id: "gw-c",
        netns: Some(c.path()),
        ifname: "eth0",
    };
    let out =
        assert_cmd::Command::from_std(traced_plugin_command(&lab.host, &lab.plugin, &call, &trace))
            .write_stdin(conf.to_string())
            .output()
            .expect("strace runs");
    let res = result_of(&out);
    let text = std::fs::read_to_string(&trace).expect("trace");
    let refused: Vec<&str> = text.lines().filter(|l| l.contains("error=-E")).collect();
    assert!(
        refused.is_empty(),
        "no request the kernel refuses (the gateway is there): {refused:#?}"
    );
    let veth = &res.interfaces[1];
    let lookups: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("RTM_GETLINK") && l.contains(&format!("\"{}\"", veth.name)))
        .collect();
    assert!(
        lookups.is_empty(),
        "the host veth is not looked up: {lookups:#?}"
    );
    let state = lab.host.snapshot().expect("host state");
    let link = state.link(&veth.name).expect("host veth");
    assert_eq!(
        Some(&veth.mac),
        link.mac.as_ref(),
        "the result's MAC is the link's"
    );
    assert!(gateway_on_bridge());
}

#[test]
fn del_is_idempotent_in_every_case() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config("dual", lab.data.path());

    // Never added.
    lab.del_ok("never-added", None, &conf);

    // CNI_NETNS unset: the address is still released and the veth removed.
    let pod = Netns::with_label("nonetns").expect("pod");
    let res = lab.add("no-netns", &pod, &conf);
    lab.del_ok("no-netns", None, &conf);
    assert!(
        store_records(&lab.store()).is_empty(),
        "released without netns"
    );
    assert!(!lab.host_has_link(&res.interfaces[1].name));
    assert!(
        pod.links().expect("links").iter().all(|l| l.name != "eth0"),
        "peer went with the host veth"
    );

    // The netns was destroyed before DEL.
    let gone = Netns::with_label("gone").expect("pod");
    let gone_path = gone.path().to_path_buf();
    lab.add("ns-gone", &gone, &conf);
    gone.delete().expect("delete netns");
    lab.del_ok("ns-gone", Some(&gone_path), &conf);
    lab.del_ok("ns-gone", Some(&gone_path), &conf);
    assert!(
        store_records(&lab.store()).is_empty(),
        "released after netns deletion"
    );
    let leftovers = lab.host_veths();
    assert!(leftovers.is_empty(), "no host veth left: {leftovers:?}");
}

#[test]
fn add_of_an_existing_interface_fails_and_keeps_it() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config("v4", lab.data.path());
    let pod = Netns::with_label("dup").expect("pod");
    let first = lab.add("dup", &pod, &conf);
    let err = error_of(&lab.call("ADD", "dup", Some(pod.path()), "eth0", &conf));
    assert_eq!(err.code, code::INTERFACE_EXISTS);
    assert!(err.msg.contains("eth0"));
    let addrs = pod.snapshot().expect("state");
    let eth0 = addrs.link("eth0").expect("eth0 still there");
    assert!(addrs
        .addresses_of(eth0.index)
        .contains(&first.ips[0].address));
    assert_eq!(
        store_records(&lab.store()).len(),
        1,
        "no second reservation"
    );
    // Same container, another ifname: a second, distinct address.
    let second = result_of(&lab.call("ADD", "dup", Some(pod.path()), "net1", &conf));
    assert_ne!(second.ips[0].address, first.ips[0].address);
    // DEL of one interface releases only that one.
    let out = lab.call("DEL", "dup", Some(pod.path()), "net1", &conf);
    assert!(out.status.success());
    assert_eq!(
        store_records(&lab.store()),
        vec![first.ips[0].address.addr().to_string()]
    );
}

#[test]
fn failed_add_rolls_back_everything() {
    let _host = host_untouched();
    let lab = Lab::new();
    let pod = Netns::with_label("rollback").expect("pod");
    let mut conf = config("v4", lab.data.path());
    // A route whose gateway is not reachable fails after the veth and the
    // addresses exist: the ADD must undo both.
    conf["ipam"]["routes"] = json!([{"dst": "192.0.2.0/24", "gw": "198.51.100.1"}]);
    let before = lab.host.snapshot().expect("host before");
    let err = error_of(&lab.call("ADD", "rb", Some(pod.path()), "eth0", &conf));
    assert_eq!(err.code, code::KERNEL);
    assert!(
        err.msg.contains("192.0.2.0/24"),
        "names the route: {}",
        err.msg
    );
    assert!(store_records(&lab.store()).is_empty(), "address released");
    assert!(
        pod.links().expect("links").iter().all(|l| l.name != "eth0"),
        "pod side removed"
    );
    let after = lab.host.snapshot().expect("host after");
    let added = after.added_since(&before, &["cnitest0".to_string()]);
    assert!(added.is_empty(), "host left with {added:?}");

    // A bridge name taken by a non-bridge fails before any veth exists.
    let dummy = lab
        .host
        .command("ip")
        .args([
            "link",
            "add",
            "notabridge",
            "type",
            "veth",
            "peer",
            "name",
            "nabpeer",
        ])
        .status()
        .expect("ip link add");
    assert!(dummy.success());
    conf = config("v4", lab.data.path());
    conf["bridge"] = json!("notabridge");
    let err = error_of(&lab.call("ADD", "rb2", Some(pod.path()), "eth0", &conf));
    assert_eq!(err.code, code::INVALID_CONFIG);
    assert!(err.msg.contains("notabridge"));
    assert!(store_records(&lab.store()).is_empty(), "address released");
}

#[test]
fn hundred_parallel_adds_get_unique_addresses_and_dels_leave_nothing() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config("dual", lab.data.path());
    let pods: Vec<Netns> = (0..100).map(|_| Netns::new().expect("pod")).collect();
    let results: Vec<CniResult> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let lab = &lab;
                let conf = &conf;
                s.spawn(move || {
                    result_of(&lab.call("ADD", &format!("par{i}"), Some(pod.path()), "eth0", conf))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    let mut addrs: Vec<String> = results
        .iter()
        .flat_map(|r| r.ips.iter().map(|i| i.address.addr().to_string()))
        .collect();
    assert_eq!(addrs.len(), 200);
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 200, "every address is unique");
    assert_eq!(store_records(&lab.store()).len(), 200);

    std::thread::scope(|s| {
        for (i, pod) in pods.iter().enumerate() {
            let lab = &lab;
            let conf = &conf;
            s.spawn(move || lab.del_ok(&format!("par{i}"), Some(pod.path()), conf));
        }
    });
    assert!(store_records(&lab.store()).is_empty(), "no record left");
    let veths = lab.host_veths();
    assert!(veths.is_empty(), "no veth left: {veths:?}");
}

#[test]
fn gc_removes_what_is_not_listed() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config("v4", lab.data.path());
    let pods: Vec<Netns> = (0..3).map(|_| Netns::new().expect("pod")).collect();
    let res: Vec<CniResult> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| lab.add(&format!("gc{i}"), p, &conf))
        .collect();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "gc0", "ifname": "eth0"}]);
    let out = lab.call_network("GC", &gc);
    assert!(
        out.status.success(),
        "GC: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.is_empty());
    assert_eq!(
        store_records(&lab.store()),
        vec![res[0].ips[0].address.addr().to_string()]
    );
    assert!(
        lab.host_has_link(&host_veth_name("gc0", "eth0")),
        "listed attachment kept"
    );
    assert!(!lab.host_has_link(&host_veth_name("gc1", "eth0")));
    assert!(!lab.host_has_link(&host_veth_name("gc2", "eth0")));
    // The older key name works as well.
    let mut gc_old = conf.clone();
    gc_old["cni.dev/attachments"] = json!([]);
    let out = lab.call_network("GC", &gc_old);
    assert!(out.status.success());
    assert!(store_records(&lab.store()).is_empty());
}

#[test]
fn status_reports_exhaustion_and_unwritable_store() {
    let _host = host_untouched();
    let lab = Lab::new();
    let mut conf = config("v4", lab.data.path());
    conf["ipam"]["ranges"] = json!([[{"subnet": "10.89.0.0/30"}]]);
    let out = lab.call_network("STATUS", &conf);
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "ready: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let pod = Netns::new().expect("pod");
    lab.add("only", &pod, &conf);
    let err = error_of(&lab.call_network("STATUS", &conf));
    assert_eq!(err.code, code::NOT_AVAILABLE);
    assert!(
        err.msg.contains("10.89.0.0/30"),
        "names the range: {}",
        err.msg
    );
    // ADD in the full range fails with a message naming the range.
    let pod2 = Netns::new().expect("pod");
    let err = error_of(&lab.call("ADD", "second", Some(pod2.path()), "eth0", &conf));
    assert_eq!(err.code, code::RANGE_EXHAUSTED);
    assert!(err.msg.contains("10.89.0.0/30"));

    let file = tempfile::NamedTempFile::new().expect("file");
    conf["ipam"]["dataDir"] = json!(file.path());
    let err = error_of(&lab.call_network("STATUS", &conf));
    assert_eq!(err.code, code::NOT_AVAILABLE);
}

#[rstest]
#[case::malformed_json("ADD", "c1", "eth0", "{\"cniVersion\":", code::DECODE_FAILURE)]
#[case::missing_name(
    "ADD",
    "c1",
    "eth0",
    r#"{"cniVersion":"1.1.0","ipam":{"subnet":"10.90.0.0/24"}}"#,
    code::INVALID_CONFIG
)]
#[case::unknown_version(
    "ADD",
    "c1",
    "eth0",
    r#"{"cniVersion":"7.0.0","name":"x"}"#,
    code::INCOMPATIBLE_VERSION
)]
#[case::traversal_id("ADD", "../../etc", "eth0", "", code::INVALID_ENV)]
#[case::slash_ifname("ADD", "c1", "a/b", "", code::INVALID_ENV)]
#[case::long_ifname("ADD", "c1", "abcdefghijklmnop", "", code::INVALID_ENV)]
#[case::unknown_command("FROB", "c1", "eth0", "", code::INVALID_ENV)]
#[case::missing_container("ADD", "", "eth0", "", code::INVALID_ENV)]
#[case::check_too_old(
    "CHECK",
    "c1",
    "eth0",
    r#"{"cniVersion":"0.3.1","name":"x"}"#,
    code::INCOMPATIBLE_VERSION
)]
#[case::status_too_old(
    "STATUS",
    "c1",
    "eth0",
    r#"{"cniVersion":"1.0.0","name":"x"}"#,
    code::INCOMPATIBLE_VERSION
)]
fn bad_input_gets_its_code_and_changes_nothing(
    #[case] command: &str,
    #[case] id: &str,
    #[case] ifname: &str,
    #[case] stdin: &str,
    #[case] want: u32,
) {
    let _host = host_untouched();
    let lab = Lab::new();
    let pod = Netns::new().expect("pod");
    let good = config("v4", lab.data.path());
    let body: Value = if stdin.is_empty() {
        good
    } else {
        match serde_json::from_str::<Value>(stdin) {
            Ok(mut v) => {
                if v.get("ipam").is_some() {
                    v["ipam"]["dataDir"] = json!(lab.data.path());
                }
                v
            }
            Err(_) => Value::String(stdin.to_string()),
        }
    };
    let before_host = lab.host.snapshot().expect("host");
    let before_pod = pod.snapshot().expect("pod");
    let out = if let Value::String(raw) = &body {
        // Malformed JSON: send the raw bytes.
        let mut cmd = lab.host.command(&lab.plugin);
        cmd.env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", pod.path())
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", "/nonexistent");
        assert_cmd::Command::from_std(cmd)
            .write_stdin(raw.clone())
            .output()
            .expect("runs")
    } else {
        lab.call(command, id, Some(pod.path()), ifname, &body)
    };
    let err = error_of(&out);
    assert_eq!(err.code, want, "{}", err.msg);
    assert!(!err.msg.is_empty());
    let after_host = lab.host.snapshot().expect("host");
    let after_pod = pod.snapshot().expect("pod");
    assert!(
        after_host.added_since(&before_host, &[]).is_empty(),
        "host namespace unchanged"
    );
    assert!(
        after_pod.added_since(&before_pod, &[]).is_empty(),
        "pod namespace unchanged"
    );
    assert!(!lab.store().exists(), "the store was not created");
    assert!(!Path::new("/etc/cnilab-should-not-exist").exists());
}

#[test]
fn iptables_fallback_masquerades_and_cleans_up() {
    let _host = host_untouched();
    let lab = Lab::new();
    let pod = Netns::with_label("ipt").expect("pod");
    let mut conf = config("v4", lab.data.path());
    conf["ipMasqExclude"] = json!(["10.0.0.0/8"]);
    let run = |command: &str| {
        let mut cmd = lab.host.command(&lab.plugin);
        cmd.env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", "ipt")
            .env("CNI_NETNS", pod.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/nonexistent")
            .env("CNILAB_FIREWALL", "iptables")
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        assert_cmd::Command::from_std(cmd)
            .write_stdin(conf.to_string())
            .output()
            .expect("runs")
    };
    let nat = || {
        let out = lab
            .host
            .command("iptables")
            .args(["-w", "5", "-t", "nat", "-S"])
            .output()
            .expect("iptables -S");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let res = result_of(&run("ADD"));
    let ip = res.ips[0].address.addr();
    let rules = nat();
    let chain = cnilab_plugin::masq::chain_name(NET);
    assert!(
        rules.contains(&format!("-A {chain} -d 10.88.0.0/24 -j RETURN")),
        "{rules}"
    );
    assert!(
        rules.contains(&format!("-A {chain} -d 10.0.0.0/8 -j RETURN")),
        "{rules}"
    );
    assert!(
        rules.contains(&format!("-A {chain} -j MASQUERADE")),
        "{rules}"
    );
    assert!(
        rules.contains(&format!("-A POSTROUTING -s {ip}/32")),
        "{rules}"
    );
    let nft_tables = lab
        .host
        .command("nft")
        .args(["list", "tables"])
        .output()
        .expect("nft");
    assert!(
        !String::from_utf8_lossy(&nft_tables.stdout).contains("cnilab_"),
        "no nft table when iptables is chosen"
    );
    let out = run("DEL");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        !nat().contains(&format!("-s {ip}/32")),
        "jump removed: {}",
        nat()
    );
}

fn ruleset(host: &Netns) -> String {
    let out = host
        .command("nft")
        .args(["list", "ruleset"])
        .output()
        .expect("nft runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Once a node's masquerade table holds the config's rules, a
/// pod's ADD and DEL change its set over netlink and start no `nft`
/// process (an `nft` first on PATH that refuses to run proves it); a
/// config whose rules differ still gets them rebuilt.
#[test]
fn masquerade_after_the_first_add_starts_no_nft_process() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config("v4", lab.data.path());
    let fake = tempfile::tempdir().expect("fake bin dir");
    let nft = fake.path().join("nft");
    std::fs::write(&nft, "#!/bin/sh\necho \"nft was run: $*\" >&2\nexit 1\n").expect("fake nft");
    std::fs::set_permissions(&nft, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", fake.path().display());
    let run = |command: &str, id: &str, pod: &Netns, conf: &Value| {
        let mut cmd = lab.host.command(&lab.plugin);
        cmd.env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", pod.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/nonexistent")
            .env("PATH", &path);
        assert_cmd::Command::from_std(cmd)
            .write_stdin(conf.to_string())
            .output()
            .expect("runs")
    };
    let first = Netns::with_label("masq-a").expect("pod");
    let a = lab.add("masq-a", &first, &conf).ips[0].address.addr();
    let second = Netns::with_label("masq-b").expect("pod");
    let b = result_of(&run("ADD", "masq-b", &second, &conf)).ips[0]
        .address
        .addr();
    let rules = ruleset(&lab.host);
    assert!(
        rules.contains(&a.to_string()) && rules.contains(&b.to_string()),
        "{rules}"
    );
    let out = run("DEL", "masq-b", &second, &conf);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = ruleset(&lab.host);
    assert!(!rules.contains(&b.to_string()), "unmasqueraded: {rules}");
    assert!(
        rules.contains(&a.to_string()),
        "the other pod kept: {rules}"
    );
    // Other rules: rebuilt (by nft, once), the pods' entries kept.
    let mut changed = conf.clone();
    changed["ipMasqExclude"] = json!(["10.0.0.0/8"]);
    let third = Netns::with_label("masq-c").expect("pod");
    let c = lab.add("masq-c", &third, &changed).ips[0].address.addr();
    let rules = ruleset(&lab.host);
    assert!(rules.contains("10.0.0.0/8"), "rules rebuilt: {rules}");
    assert!(
        rules.contains(&a.to_string()) && rules.contains(&c.to_string()),
        "{rules}"
    );
    lab.del_ok("masq-a", Some(first.path()), &conf);
    lab.del_ok("masq-c", Some(third.path()), &changed);
}

/// A DEL for a container that was never added, with a
/// `prevResult` forged to list another pod's address, leaves that pod's
/// masquerade entry: DEL takes addresses from its own records only.
#[test]
fn del_with_a_forged_prev_result_keeps_the_other_pods_masquerade() {
    let lab = Lab::new();
    let conf = config("v4", lab.data.path());
    let pod = Netns::with_label("victim").expect("pod");
    let victim = lab.add("victim", &pod, &conf);
    let ip = victim.ips[0].address.addr();
    assert!(ruleset(&lab.host).contains(&ip.to_string()), "masqueraded");
    lab.del_ok("intruder", None, &with_prev(&conf, &victim));
    assert!(
        ruleset(&lab.host).contains(&ip.to_string()),
        "masquerade entry kept: {}",
        ruleset(&lab.host)
    );
    assert_eq!(store_records(&lab.store()), vec![ip.to_string()]);
    lab.del_ok("victim", Some(pod.path()), &conf);
    assert!(!ruleset(&lab.host).contains(&ip.to_string()));
}

/// A DEL for a container that was never added, pointed
/// at another pod's namespace, leaves the pod's interface, host veth,
/// record and masquerade entry alone, and says why in its log.
#[test]
fn del_of_another_attachment_leaves_the_pod_its_record_and_masquerade() {
    let lab = Lab::new();
    let conf = config("v4", lab.data.path());
    let pod = Netns::with_label("victim").expect("pod");
    let victim = lab.add("victim", &pod, &conf);
    let ip = victim.ips[0].address.addr();
    let out = lab.call("DEL", "intruder", Some(pod.path()), "eth0", &conf);
    assert!(
        out.status.success(),
        "DEL of a never-added container succeeds: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("left eth0"), "says why: {log}");
    let state = pod.snapshot().expect("pod");
    let eth0 = state.link("eth0").expect("the victim keeps eth0");
    assert!(state
        .addresses_of(eth0.index)
        .contains(&victim.ips[0].address));
    assert!(
        lab.host_has_link(&victim.interfaces[1].name),
        "host veth kept"
    );
    assert_eq!(store_records(&lab.store()), vec![ip.to_string()]);
    assert!(
        ruleset(&lab.host).contains(&ip.to_string()),
        "masquerade entry kept: {}",
        ruleset(&lab.host)
    );

    // The owner's DEL still removes everything.
    lab.del_ok("victim", Some(pod.path()), &conf);
    assert!(pod.links().expect("links").iter().all(|l| l.name != "eth0"));
    assert!(!ruleset(&lab.host).contains(&ip.to_string()));
}

/// A second ADD with the same container ID and ifname
/// in another namespace is refused with code 104 and changes nothing: the
/// first pod keeps its interface, the store keeps one record and its cursor.
#[test]
fn second_add_of_an_attachment_in_another_netns_is_refused() {
    let lab = Lab::new();
    let conf = config("v4", lab.data.path());
    let first_pod = Netns::with_label("twin1").expect("pod");
    let second_pod = Netns::with_label("twin2").expect("pod");
    let first = lab.add("twin", &first_pod, &conf);
    let cursor = lab.store().join("last_reserved_ip.0");
    let cursor_before = std::fs::read_to_string(&cursor).expect("cursor");
    let host_before = lab.host.snapshot().expect("host");

    let err = error_of(&lab.call("ADD", "twin", Some(second_pod.path()), "eth0", &conf));
    assert_eq!(err.code, code::INTERFACE_EXISTS, "{}", err.msg);
    assert!(
        err.msg.contains("twin"),
        "names the attachment: {}",
        err.msg
    );

    let state = first_pod.snapshot().expect("first pod");
    let eth0 = state.link("eth0").expect("first pod keeps eth0");
    assert!(state
        .addresses_of(eth0.index)
        .contains(&first.ips[0].address));
    assert!(second_pod
        .links()
        .expect("links")
        .iter()
        .all(|l| l.name != "eth0"));
    assert_eq!(
        store_records(&lab.store()),
        vec![first.ips[0].address.addr().to_string()],
        "one record for one attachment"
    );
    assert_eq!(
        std::fs::read_to_string(&cursor).expect("cursor"),
        cursor_before
    );
    let host_after = lab.host.snapshot().expect("host");
    assert!(host_after.added_since(&host_before, &[]).is_empty());
    assert!(host_before.added_since(&host_after, &[]).is_empty());
    lab.del_ok("twin", Some(first_pod.path()), &conf);
}

/// Two networks on one bridge. GC and DEL of network A
/// never remove network B's host veth.
#[test]
fn gc_and_del_of_one_network_leave_another_networks_pods_on_a_shared_bridge() {
    let lab = Lab::new();
    let mut a = config("v4", lab.data.path());
    a["name"] = json!("net-a");
    a["ipMasq"] = json!(false);
    let mut b = a.clone();
    b["name"] = json!("net-b");
    b["isDefaultGateway"] = json!(false);
    b["ipam"]["ranges"] = json!([[{"subnet": "10.87.0.0/24"}]]);
    let pod_a = Netns::with_label("neta").expect("pod");
    let pod_b = Netns::with_label("netb").expect("pod");
    let res_a = lab.add("pod-a", &pod_a, &a);
    let res_b = lab.add("pod-b", &pod_b, &b);
    let veth_a = res_a.interfaces[1].name.clone();
    let veth_b = res_b.interfaces[1].name.clone();

    // DEL on network A naming B's attachment: B's veth is marked for B.
    let out = lab.call("DEL", "pod-b", Some(pod_b.path()), "eth0", &a);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(lab.host_has_link(&veth_b), "DEL of net-a kept net-b's veth");
    assert!(pod_b
        .links()
        .expect("links")
        .iter()
        .any(|l| l.name == "eth0"));

    // GC of A with nothing valid: A's pod goes, B's stays.
    let mut gc = a.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    let out = lab.call_network("GC", &gc);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!lab.host_has_link(&veth_a), "net-a's own pod collected");
    assert!(lab.host_has_link(&veth_b), "GC of net-a kept net-b's veth");
    assert!(pod_b
        .links()
        .expect("links")
        .iter()
        .any(|l| l.name == "eth0"));
    lab.del_ok("pod-b", Some(pod_b.path()), &b);
    assert!(!lab.host_has_link(&veth_b));
}

/// Temporary files a killed ADD left behind are
/// removed by the next ADD and by GC.
#[test]
fn stale_temporary_files_are_removed_by_add_and_gc() {
    let lab = Lab::new();
    let conf = config("v4", lab.data.path());
    let store = lab.store();
    std::fs::create_dir_all(&store).expect("store");
    let plant = || {
        for name in [
            ".record.4194301",
            "last_reserved_ip.0.tmp",
            "last_reserved_ip.tmp",
        ] {
            std::fs::write(store.join(name), "").expect("plant");
        }
    };
    let temps = || -> Vec<String> {
        std::fs::read_dir(&store)
            .expect("store")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".record") || n.ends_with(".tmp"))
            .collect()
    };
    plant();
    let pod = Netns::with_label("temps").expect("pod");
    lab.add("temps", &pod, &conf);
    assert!(temps().is_empty(), "ADD left {:?}", temps());
    plant();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "temps", "ifname": "eth0"}]);
    let out = lab.call_network("GC", &gc);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(temps().is_empty(), "GC left {:?}", temps());
    assert_eq!(store_records(&store).len(), 1, "the live record stays");
    lab.del_ok("temps", Some(pod.path()), &conf);
}

/// A `CNI_*` value that is not UTF-8 is refused with
/// code 4 (never turned into another name), and a newline in `CNI_NETNS`
/// cannot forge a log line, on stderr or in `logFile`.
#[test]
fn non_utf8_env_is_refused_and_input_never_forges_a_log_line() {
    use std::os::unix::ffi::OsStrExt;
    let lab = Lab::new();
    let pod = Netns::with_label("utf8").expect("pod");
    let log_file = lab.data.path().join("plugin.log");
    let mut conf = config("v4", lab.data.path());
    conf["logFile"] = json!(log_file);
    let call = Call {
        command: "ADD",
        container_id: "utf8",
        netns: Some(pod.path()),
        ifname: "eth0",
    };
    let mut cmd = plugin_command(&lab.host, &lab.plugin, &call);
    cmd.env("CNI_IFNAME", std::ffi::OsStr::from_bytes(b"eth\xff"));
    let out = assert_cmd::Command::from_std(cmd)
        .write_stdin(conf.to_string())
        .output()
        .expect("plugin runs");
    let err = error_of(&out);
    assert_eq!(err.code, code::INVALID_ENV, "{}", err.msg);
    assert!(err.msg.contains("CNI_IFNAME"), "{}", err.msg);
    assert!(pod
        .links()
        .expect("links")
        .iter()
        .all(|l| l.kind.as_deref() != Some("veth")));
    assert!(store_records(&lab.store()).is_empty());

    let forged = format!(
        "{}\ncnilab-bridge: ADD container=victim ok",
        pod.path().display()
    );
    let out = lab.call("ADD", "forge", Some(Path::new(&forged)), "eth0", &conf);
    assert_eq!(error_of(&out).code, code::INVALID_ENV);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one log line: {stderr:?}");
    assert!(stderr.contains("\\n"), "the newline is escaped: {stderr:?}");
    let logged = std::fs::read_to_string(&log_file).unwrap_or_default();
    assert!(logged.lines().count() <= 1, "no forged line: {logged:?}");
}

/// With a delegated IPAM (the reference host-local) DEL still removes the
/// pod's masquerade entry, taking the address from the attachment's cache
/// (not from `prevResult`, which it does not get here, nor from the pod's
/// interface: `tests/hardening.rs`).
#[test]
fn del_with_a_delegated_ipam_unmasquerades_the_pod() {
    let lab = Lab::new();
    let mut conf = config("v4", lab.data.path());
    conf["ipam"]["type"] = json!("host-local");
    // Debian's host-local speaks up to 1.0.0.
    conf["cniVersion"] = json!("1.0.0");
    let pod = Netns::with_label("deleg").expect("pod");
    let cni_path = format!(
        "{}:/usr/lib/cni",
        lab.plugin.parent().unwrap_or(Path::new("/")).display()
    );
    let run = |command: &str| {
        let mut cmd = plugin_command(
            &lab.host,
            &lab.plugin,
            &Call {
                command,
                container_id: "deleg",
                netns: Some(pod.path()),
                ifname: "eth0",
            },
        );
        cmd.env("CNI_PATH", &cni_path);
        assert_cmd::Command::from_std(cmd)
            .write_stdin(conf.to_string())
            .output()
            .expect("plugin runs")
    };
    let res = result_of(&run("ADD"));
    let ip = res.ips[0].address.addr().to_string();
    assert!(ruleset(&lab.host).contains(&ip), "masqueraded");
    let out = run("DEL");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!ruleset(&lab.host).contains(&ip), "{}", ruleset(&lab.host));
    assert!(pod.links().expect("links").iter().all(|l| l.name != "eth0"));
}
