//! Root tests of the second adversarial round (SECURITY.md), plugin side: the
//! built `cnilab-bridge` executed the way a runtime executes it, inside
//! throwaway namespaces, next to the reference plugins of /usr/lib/cni.
//! Each test reproduces one attack and asserts what the plugin must keep.

use cnilab_harness::netns::Netns;
use cnilab_net::naming::host_veth_name;
use cnilab_net::spec::{code, CniResult};
use cnilab_tests::{
    error_of, host_untouched, plugin_command, require_root, result_of, spawn_lock_holder,
    store_records, workspace_bin, Call,
};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

const NET: &str = "hardnet";
const BRIDGE: &str = "hard0";
const REFERENCE: &str = "/usr/lib/cni";

/// The plugin's own IPAM (`delegate == false`) or the reference host-local.
/// Debian's host-local speaks up to 1.0.0, so delegated configs say 1.0.0.
fn config(data_dir: &Path, delegate: bool) -> Value {
    let mut ipam = json!({"ranges": [[{"subnet": "10.89.0.0/24"}]], "dataDir": data_dir});
    if delegate {
        ipam["type"] = json!("host-local");
    }
    json!({
        "cniVersion": if delegate { "1.0.0" } else { "1.1.0" },
        "name": NET,
        "type": "cnilab-bridge",
        "bridge": BRIDGE,
        "isDefaultGateway": true,
        "ipMasq": true,
        "ipam": ipam,
    })
}

/// `conf` as a runtime sends it to GC, listing `valid` as live.
fn gc_config(conf: &Value, valid: &[&str]) -> Value {
    let mut gc = conf.clone();
    gc["cniVersion"] = json!("1.1.0");
    gc["cni.dev/valid-attachments"] = valid
        .iter()
        .map(|id| json!({"containerID": id, "ifname": "eth0"}))
        .collect();
    gc
}

struct Lab {
    host: Netns,
    data: tempfile::TempDir,
    plugin: PathBuf,
    /// `CNI_PATH`: the plugin's directory, then the reference plugins.
    cni_path: String,
}

impl Lab {
    fn new() -> Lab {
        require_root();
        let plugin = workspace_bin("cnilab-bridge");
        let dir = plugin.parent().unwrap_or(Path::new("/")).display();
        Lab {
            host: Netns::with_label("host").expect("host netns"),
            data: tempfile::tempdir().expect("data dir"),
            cni_path: format!("{dir}:{REFERENCE}"),
            plugin,
        }
    }

    fn store(&self) -> PathBuf {
        self.data.path().join(NET)
    }

    /// Runs `plugin` (ours unless given) for one attachment.
    fn run_with(&self, plugin: &Path, call: &Call<'_>, conf: &Value, path: &str) -> Output {
        let mut cmd = plugin_command(&self.host, plugin, call);
        cmd.env("CNI_PATH", path);
        assert_cmd::Command::from_std(cmd)
            .write_stdin(conf.to_string())
            .output()
            .expect("plugin runs")
    }

    fn run(&self, command: &str, id: &str, netns: Option<&Path>, conf: &Value) -> Output {
        let call = Call {
            command,
            container_id: id,
            netns,
            ifname: if command == "GC" { "" } else { "eth0" },
        };
        self.run_with(&self.plugin, &call, conf, &self.cni_path)
    }

    fn add(&self, id: &str, pod: &Netns, conf: &Value) -> CniResult {
        result_of(&self.run("ADD", id, Some(pod.path()), conf))
    }

    fn del_ok(&self, id: &str, pod: &Netns, conf: &Value) {
        let out = self.run("DEL", id, Some(pod.path()), conf);
        assert!(out.status.success(), "DEL {id}: {}", text(&out));
    }

    fn link_names(&self) -> Vec<String> {
        names(&self.host)
    }

    /// The addresses in any nft set or rule of the host namespace.
    fn masqueraded(&self) -> BTreeSet<IpAddr> {
        let out = self
            .host
            .command("nft")
            .args(["list", "ruleset"])
            .output()
            .expect("nft runs");
        String::from_utf8_lossy(&out.stdout)
            .split(|c: char| !(c.is_ascii_hexdigit() || c == '.' || c == ':'))
            .filter_map(|w| w.parse().ok())
            .collect()
    }

    fn nft_tables(&self) -> String {
        let out = self
            .host
            .command("nft")
            .args(["list", "tables"])
            .output()
            .expect("nft runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn text(out: &Output) -> String {
    format!(
        "stdout={} stderr={}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn names(ns: &Netns) -> Vec<String> {
    ns.links()
        .expect("links")
        .into_iter()
        .map(|l| l.name)
        .collect()
}

fn first_ip(res: &CniResult) -> IpAddr {
    res.ips[0].address.addr()
}

/// The IPv4 addresses on `eth0` in `pod` (none when it has no `eth0`).
fn pod_addresses(pod: &Netns) -> BTreeSet<IpAddr> {
    let state = pod.snapshot().expect("pod state");
    let Some(eth0) = state.link("eth0") else {
        return BTreeSet::new();
    };
    state
        .addresses_of(eth0.index)
        .into_iter()
        .map(|a| a.addr())
        .filter(IpAddr::is_ipv4)
        .collect()
}

/// Point 1: with a delegated IPAM, GC listing pod A keeps A's masquerade
/// entry (before: GC knew no live address and emptied the set).
#[test]
fn gc_with_a_delegated_ipam_keeps_the_masquerade_of_listed_pods() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config(lab.data.path(), true);
    let (pod_a, pod_b) = (Netns::new().expect("pod"), Netns::new().expect("pod"));
    let ip_a = first_ip(&lab.add("gc-a", &pod_a, &conf));
    let ip_b = first_ip(&lab.add("gc-b", &pod_b, &conf));
    assert!(lab.masqueraded().contains(&ip_a) && lab.masqueraded().contains(&ip_b));

    // host-local has no GC: the delegate's answer may be an error; what
    // GC did to the masquerade and the links is asserted either way.
    let out = lab.run("GC", "", None, &gc_config(&conf, &["gc-a"]));
    let masq = lab.masqueraded();
    assert!(
        masq.contains(&ip_a),
        "listed pod lost its masquerade: {masq:?} {}",
        text(&out)
    );
    assert!(
        !masq.contains(&ip_b),
        "the unlisted pod's entry stays: {masq:?}"
    );
    assert!(lab.link_names().contains(&host_veth_name("gc-a", "eth0")));
    assert!(!lab.link_names().contains(&host_veth_name("gc-b", "eth0")));
    assert!(pod_addresses(&pod_a).contains(&ip_a));
    lab.del_ok("gc-a", &pod_a, &conf);
    lab.del_ok("gc-b", &pod_b, &conf);
}

/// Point 1: GC that cannot take the store lock answers code 11 and
/// changes nothing: records, veths and masquerade entries all stay.
#[test]
fn gc_with_the_store_lock_held_fails_with_code_11_and_changes_nothing() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config(lab.data.path(), false);
    let (pod_a, pod_b) = (Netns::new().expect("pod"), Netns::new().expect("pod"));
    let ip_a = first_ip(&lab.add("lk-a", &pod_a, &conf));
    let ip_b = first_ip(&lab.add("lk-b", &pod_b, &conf));
    let records = store_records(&lab.store());
    let links = lab.link_names();
    let mut holder = spawn_lock_holder(&lab.store());
    let out = lab.run("GC", "", None, &gc_config(&conf, &["lk-a"]));
    holder.kill().expect("kill the holder");
    holder.wait().expect("reap the holder");
    let err = error_of(&out);
    assert_eq!(err.code, code::TRY_AGAIN_LATER, "{}", err.msg);
    let masq = lab.masqueraded();
    assert!(
        masq.contains(&ip_a) && masq.contains(&ip_b),
        "masquerade stripped: {masq:?}"
    );
    assert_eq!(store_records(&lab.store()), records, "records changed");
    assert_eq!(lab.link_names(), links, "links changed");

    // With the lock free, the same GC collects the unlisted pod only.
    let out = lab.run("GC", "", None, &gc_config(&conf, &["lk-a"]));
    assert!(out.status.success(), "{}", text(&out));
    let masq = lab.masqueraded();
    assert!(masq.contains(&ip_a) && !masq.contains(&ip_b), "{masq:?}");
    assert_eq!(store_records(&lab.store()), vec![ip_a.to_string()]);
    lab.del_ok("lk-a", &pod_a, &conf);
}

/// Point 2: ADD and DEL of one attachment started together, many times.
/// Whatever the interleaving, afterwards every address on the pod's
/// interface has its record, and every record has its pod interface.
#[test]
fn add_and_del_of_one_attachment_at_once_never_leave_an_address_without_record() {
    let _host = host_untouched();
    let lab = Lab::new();
    let mut conf = config(lab.data.path(), false);
    conf["ipMasq"] = json!(false);
    let pod = Netns::with_label("race").expect("pod");
    for round in 0..60u64 {
        std::thread::scope(|s| {
            let add = s.spawn(|| lab.run("ADD", "race", Some(pod.path()), &conf));
            // Varied starts give varied interleavings; the verdict below
            // holds for every one of them.
            std::thread::sleep(std::time::Duration::from_micros(round % 6 * 700));
            let del = lab.run("DEL", "race", Some(pod.path()), &conf);
            assert!(del.status.success(), "round {round} DEL: {}", text(&del));
            let add = add.join().expect("ADD thread");
            if !add.status.success() {
                let err = error_of(&add);
                assert_ne!(err.code, 999, "round {round}: {}", err.msg);
            }
        });
        let on_pod = pod_addresses(&pod);
        let recorded: BTreeSet<IpAddr> = store_records(&lab.store())
            .iter()
            .map(|r| r.parse().expect("record name"))
            .collect();
        assert_eq!(
            on_pod, recorded,
            "round {round}: addresses on the pod {on_pod:?} vs records {recorded:?}"
        );
        for ip in &recorded {
            let owner = std::fs::read_to_string(lab.store().join(ip.to_string())).expect("record");
            assert_eq!(owner, "race\r\neth0", "round {round}");
        }
        lab.del_ok("race", &pod, &conf);
        assert!(store_records(&lab.store()).is_empty(), "round {round}");
    }
}

/// Point 3: with a delegated IPAM, a pod that adds its neighbour's address
/// to its own eth0 before its DEL does not take the neighbour's masquerade
/// entry with it: DEL unmasquerades what the attachment was given.
#[test]
fn del_with_a_delegated_ipam_unmasquerades_only_what_the_attachment_was_given() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config(lab.data.path(), true);
    let (victim, attacker) = (Netns::new().expect("pod"), Netns::new().expect("pod"));
    let ip_v = first_ip(&lab.add("victim", &victim, &conf));
    let ip_x = first_ip(&lab.add("attacker", &attacker, &conf));
    let planted = attacker
        .command("ip")
        .args(["addr", "add", &format!("{ip_v}/32"), "dev", "eth0"])
        .status()
        .expect("ip addr add");
    assert!(planted.success());
    lab.del_ok("attacker", &attacker, &conf);
    let masq = lab.masqueraded();
    assert!(
        masq.contains(&ip_v),
        "the neighbour lost its masquerade: {masq:?}"
    );
    assert!(
        !masq.contains(&ip_x),
        "the attacker's own entry stays: {masq:?}"
    );
    lab.del_ok("victim", &victim, &conf);
    assert!(!lab.masqueraded().contains(&ip_v));
}

/// Point 4: a pod of the reference bridge plugin on the same bridge has an
/// unmarked `veth` + 8-hex host link and an unmarked eth0. Neither GC nor
/// a DEL of a never-added container pointed at its namespace removes them.
#[test]
fn unmarked_links_of_the_reference_bridge_plugin_survive_gc_and_del() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config(lab.data.path(), false);
    let ours = Netns::new().expect("pod");
    lab.add("ours", &ours, &conf);
    let reference_conf = json!({
        "cniVersion": "1.0.0",
        "name": "refnet",
        "type": "bridge",
        "bridge": BRIDGE,
        "ipam": {"type": "host-local", "subnet": "10.77.0.0/24",
                 "dataDir": lab.data.path().join("reference")},
    });
    let theirs = Netns::new().expect("pod");
    let bridge = Path::new(REFERENCE).join("bridge");
    let call = |command| Call {
        command,
        container_id: "theirs",
        netns: Some(theirs.path()),
        ifname: "eth0",
    };
    let res = result_of(&lab.run_with(&bridge, &call("ADD"), &reference_conf, REFERENCE));
    let their_veth = res
        .interfaces
        .iter()
        .find(|i| i.sandbox.is_none() && i.name != BRIDGE)
        .map(|i| i.name.clone())
        .expect("the reference result names its host veth");
    assert!(
        their_veth.starts_with("veth") && their_veth.len() == 12,
        "{their_veth}"
    );

    let out = lab.run("GC", "", None, &gc_config(&conf, &["ours"]));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        lab.link_names().contains(&their_veth),
        "GC removed the reference pod's veth"
    );

    let out = lab.run("DEL", "intruder", Some(theirs.path()), &conf);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        names(&theirs).contains(&"eth0".to_string()),
        "DEL removed their eth0"
    );
    assert!(lab.link_names().contains(&their_veth));

    let out = lab.run_with(&bridge, &call("DEL"), &reference_conf, REFERENCE);
    assert!(out.status.success(), "{}", text(&out));
    lab.del_ok("ours", &ours, &conf);
}

/// Point 11: an ADD with ipMasq that fails (a route via an unreachable
/// gateway) leaves no nftables table: the rollback creates nothing.
#[test]
fn a_failed_add_with_ip_masq_creates_no_nft_table() {
    let _host = host_untouched();
    let lab = Lab::new();
    let mut conf = config(lab.data.path(), false);
    conf["ipam"]["routes"] = json!([{"dst": "192.0.2.0/24", "gw": "198.51.100.1"}]);
    let pod = Netns::new().expect("pod");
    let err = error_of(&lab.run("ADD", "nomasq", Some(pod.path()), &conf));
    assert_eq!(err.code, code::KERNEL, "{}", err.msg);
    let tables = lab.nft_tables();
    assert!(!tables.contains("cnilab_"), "rollback left {tables}");
    assert!(store_records(&lab.store()).is_empty());
}

/// Point 12: a `%` in the bridge name (code 7) or in `CNI_IFNAME` (code 4)
/// is refused before the kernel sees it: nothing is created.
#[test]
fn names_the_kernel_would_expand_are_refused_before_anything_is_created() {
    let _host = host_untouched();
    let lab = Lab::new();
    let pod = Netns::new().expect("pod");
    let host_before = lab.link_names();
    let pod_before = names(&pod);
    let mut conf = config(lab.data.path(), false);
    conf["bridge"] = json!("rtb%d");
    let err = error_of(&lab.run("ADD", "pct", Some(pod.path()), &conf));
    assert_eq!(err.code, code::INVALID_CONFIG, "{}", err.msg);
    assert!(
        err.msg.contains("rtb%d") && err.msg.contains('%'),
        "{}",
        err.msg
    );

    let conf = config(lab.data.path(), false);
    let call = Call {
        command: "ADD",
        container_id: "pct",
        netns: Some(pod.path()),
        ifname: "eth%d",
    };
    let err = error_of(&lab.run_with(&lab.plugin, &call, &conf, &lab.cni_path));
    assert_eq!(err.code, code::INVALID_ENV, "{}", err.msg);
    assert!(err.msg.contains("eth%d"), "{}", err.msg);
    assert_eq!(lab.link_names(), host_before, "host links changed");
    assert_eq!(names(&pod), pod_before, "pod links changed");
    assert!(store_records(&lab.store()).is_empty());
}

/// Point 13: a delegated IPAM binary in a directory others can write, a
/// binary others can write, or one in a directory not owned by root is
/// refused, naming the path; nothing is created. Root-owned paths work.
#[test]
fn delegates_on_paths_writable_by_others_are_refused() {
    let _host = host_untouched();
    let lab = Lab::new();
    let conf = config(lab.data.path(), true);
    let pod = Netns::new().expect("pod");
    let host_before = lab.link_names();
    let scratch = tempfile::tempdir().expect("scratch");
    let plant = |name: &str, dir_mode: u32, bin_mode: u32, owner: Option<u32>| {
        let dir = scratch.path().join(name);
        std::fs::create_dir(&dir).expect("dir");
        let bin = dir.join("host-local");
        std::fs::copy(Path::new(REFERENCE).join("host-local"), &bin).expect("copy");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(bin_mode)).expect("chmod");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(dir_mode)).expect("chmod");
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), None).expect("chown");
        }
        dir
    };
    let call = Call {
        command: "ADD",
        container_id: "planted",
        netns: Some(pod.path()),
        ifname: "eth0",
    };
    for (dir, named) in [
        (plant("world-dir", 0o777, 0o755, None), None),
        (plant("group-bin", 0o755, 0o775, None), Some("host-local")),
        (plant("user-dir", 0o755, 0o755, Some(65534)), None),
    ] {
        let out = lab.run_with(&lab.plugin, &call, &conf, &dir.display().to_string());
        let err = error_of(&out);
        assert_eq!(err.code, code::IPAM_DELEGATE, "{}", err.msg);
        let path = match named {
            Some(bin) => dir.join(bin),
            None => dir.clone(),
        };
        assert!(err.msg.contains(&path.display().to_string()), "{}", err.msg);
        assert!(err.msg.contains("root"), "says how to fix it: {}", err.msg);
        assert_eq!(lab.link_names(), host_before, "{}", dir.display());
        assert!(!names(&pod).contains(&"eth0".to_string()));
    }
    let safe = plant("safe", 0o755, 0o755, None);
    let out = lab.run_with(&lab.plugin, &call, &conf, &safe.display().to_string());
    assert!(out.status.success(), "{}", text(&out));
    let del = Call {
        command: "DEL",
        ..call
    };
    let out = lab.run_with(&lab.plugin, &del, &conf, &safe.display().to_string());
    assert!(out.status.success(), "{}", text(&out));
}
