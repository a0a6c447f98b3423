//! The identity of the lab model (root): for every topology in
//! `lab/topologies/`, the lab today's builder makes, read back, equals the
//! topology compiled into the model, after the normalising and the
//! structural check of plugin-made state that `harness/src/model/mod.rs`
//! documents. A failure lists every difference by namespace, object and
//! field. Both runtimes: pods made by executing the plugin (`direct`) and
//! through the CRI of a containerd per node (`containerd`, which needs
//! containerd and runc: `lab/install-deps.sh`).

use cnilab_harness::lab::base::RuntimeKind;
use cnilab_harness::lab::built::Lab;
use cnilab_harness::lab::topology::shapes::{apply_flags, Shape};
use cnilab_harness::lab::{compile, layout};
use cnilab_harness::lab::{Topology, UpOptions};
use cnilab_harness::model::{identity, read};
use cnilab_tests::{
    cnilab, host_untouched, output_text, require_root, run_in, workspace_bin, StandingLab,
};
use rstest::rstest;
use std::path::PathBuf;
use std::time::Instant;

/// Builds `topo` with the direct runtime (the plugin of its `[plugin]`, else
/// the bundled cnilab-bridge; the agent binary next to it).
fn build(mut topo: Topology, run: &std::path::Path, runtime: RuntimeKind) -> Lab {
    let bin_dir = workspace_bin("cnilab-bridge")
        .parent()
        .map(|d| d.display().to_string());
    if let Some(agent) = topo.agent.as_mut() {
        if agent.command.first().map(String::as_str) == Some("cnilab-agent") {
            agent.command[0] = workspace_bin("cnilab-agent").display().to_string();
        }
    }
    let plugin_dir = topo.plugin.as_ref().and_then(|p| p.dir.clone()).or(bin_dir);
    let opts = UpOptions {
        plugin_dir,
        persistent: None,
        run_dir: run.to_path_buf(),
        runtime,
    };
    Lab::up(topo, opts).expect("lab up")
}

#[rstest]
fn a_built_lab_reads_back_as_its_compiled_model(
    #[files("../lab/topologies/*.toml")] path: PathBuf,
) {
    identity_of(&path, RuntimeKind::Direct);
}

#[rstest]
fn a_containerd_lab_reads_back_as_its_compiled_model(
    #[files("../lab/topologies/*.toml")] path: PathBuf,
) {
    identity_of(&path, RuntimeKind::Containerd);
}

/// `--nodes/--shape/--vxlan/--service` make the same `Topology` as a file,
/// and the same identity holds for it.
#[rstest]
#[case::routed_vxlan_service(3, Some(Shape::Routed), true, true)]
#[case::nat_static(2, Some(Shape::Nat), false, false)]
#[case::l2_service(2, None, false, true)]
fn a_lab_from_flags_reads_back_as_its_compiled_model(
    #[case] nodes: usize,
    #[case] shape: Option<Shape>,
    #[case] vxlan: bool,
    #[case] service: bool,
) {
    let mut topo = Topology::generated(nodes, 2).expect("topology");
    apply_flags(&mut topo, shape, vxlan, service).expect("flags");
    identity(topo, RuntimeKind::Direct);
}

/// Builds the lab of `path`, reads it and compares it with its compiled
/// model; prints how long building and reading took.
fn identity_of(path: &std::path::Path, runtime: RuntimeKind) {
    identity(Topology::load(path).expect("topology"), runtime);
}

/// What `lab`, read back, has that `compile(topo)` has not, and the other
/// way round (normalised as `identity::differences` documents), with the
/// read model.
fn differences_from(lab: &Lab, topo: &Topology) -> (Vec<String>, cnilab_harness::model::LabModel) {
    let compiled = compile::compile(topo).expect("compiles");
    let model = read::read(&layout::layout_of(lab)).expect("read");
    let expected = identity::expected(&compiled, &model).expect("expected model");
    (identity::differences(&expected, &model), model)
}

/// A node that joins a running lab and leaves it again: after `add_node`
/// the lab reads back as the topology with the node compiled, after
/// `remove_node` as the topology without it (one builder: both are the
/// difference of two compiled models applied to the standing namespaces).
/// The third node of a routed lab is in a subnet of its own (a new rack
/// bridge and router leg, removed with it), of a NAT lab it has its NAT
/// namespace, of a VXLAN lab every peer programs its VTEP.
#[rstest]
#[case::l2_static(None, false)]
#[case::routed_static(Some(Shape::Routed), false)]
#[case::l2_vxlan(None, true)]
#[case::nat_static(Some(Shape::Nat), false)]
fn a_node_added_and_removed_reads_back_as_the_compiled_model(
    #[case] shape: Option<Shape>,
    #[case] vxlan: bool,
) {
    let _host = host_untouched();
    require_root();
    let mut with = Topology::generated(3, 1).expect("topology");
    apply_flags(&mut with, shape, vxlan, false).expect("flags");
    let mut without = with.clone();
    let joining = without.nodes.pop().expect("a third node");
    let run = tempfile::tempdir().expect("run dir");
    let mut lab = build(without.clone(), run.path(), RuntimeKind::Direct);
    let added = lab.add_node(joining.clone(), with.pods_per_node);
    let (after_add, _) = differences_from(&lab, &with);
    let removed = added.and_then(|()| lab.remove_node(&joining.name));
    let (after_remove, _) = differences_from(&lab, &without);
    lab.down();
    removed.expect("add and remove node3");
    assert!(
        after_add.is_empty(),
        "{}: after add_node the lab differs from compile(topology with node3):\n{}",
        with.name,
        after_add.join("\n")
    );
    assert!(
        after_remove.is_empty(),
        "{}: after remove_node the lab differs from compile(topology without node3):\n{}",
        with.name,
        after_remove.join("\n")
    );
}

fn identity(topo: Topology, runtime: RuntimeKind) {
    let _host = host_untouched();
    require_root();
    let run = tempfile::tempdir().expect("run dir");
    let started = Instant::now();
    let lab = build(topo.clone(), run.path(), runtime);
    let built = started.elapsed();
    let started = Instant::now();
    let (differences, model) = differences_from(&lab, &topo);
    let read_took = started.elapsed();
    // The agent is a step of building: its own table must be there.
    let missing_agent_table: Vec<&str> = match topo.agent {
        Some(_) => model
            .nodes
            .iter()
            .filter(|n| {
                !n.net
                    .nftables
                    .iter()
                    .any(|t| t.family == "inet" && t.name == "cnilab_agent")
            })
            .map(|n| n.net.name.as_str())
            .collect(),
        None => Vec::new(),
    };
    let name = topo.name.clone();
    eprintln!(
        "{name} ({runtime:?}): built in {built:?}, read {} namespaces in {read_took:?}",
        model.namespaces().count()
    );
    lab.down();
    assert!(
        differences.is_empty(),
        "{name}: read(build(t)) differs from compile(t):\n{}",
        differences.join("\n")
    );
    assert!(
        missing_agent_table.is_empty(),
        "no agent table on {missing_agent_table:?}"
    );
}

/// `cnilab lab show` prints a standing lab read back into the model: as
/// JSON (the model itself, with its own `schemaVersion`) and as text, one object a
/// line; a lab that is not up is an error that says how to start one.
#[test]
fn lab_show_prints_the_model_of_a_standing_lab() {
    let _host = host_untouched();
    let lab = StandingLab::up("show", &[]);
    let name = lab.0.clone();
    let all = output_text;
    let json = cnilab(&["lab", "show", "--name", &name, "-o", "json"]);
    assert!(json.status.success(), "{}", all(&json));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let model = &v;
    assert_eq!(model["schemaVersion"], 1);
    assert_eq!(model["name"], name.as_str());
    let node1 = &model["nodes"][0];
    assert_eq!(node1["name"], "node1");
    let eth0 = node1["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "eth0"))
        .expect("node1 has eth0");
    assert_eq!(eth0["addresses"], serde_json::json!(["10.250.0.1/24"]));
    assert_eq!(eth0["veth"]["namespace"], "switch");
    let pod = &node1["pods"][0];
    assert_eq!(pod["name"], "node1-pod0");
    let pod_ip = pod["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "eth0"))
        .and_then(|l| l["addresses"][0].as_str().map(str::to_string))
        .expect("the pod has an address on eth0");
    assert!(pod_ip.starts_with("10.244.1."), "{pod_ip}");
    let routes = node1["routes"].to_string();
    assert!(routes.contains("10.244.2.0/24"), "{routes}");

    let text = cnilab(&["lab", "show", "--name", &name]);
    assert!(text.status.success(), "{}", all(&text));
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    for line in [
        "node node1 (pod CIDRs 10.244.1.0/24)",
        "link eth0 veth up mtu 1500 peer switch/p-node1 10.250.0.1/24",
        "route 10.244.2.0/24 via 10.250.0.2 dev eth0 proto static scope universe",
    ] {
        assert!(
            text.lines().any(|l| l.trim() == line),
            "no {line:?} in:\n{text}"
        );
    }

    let missing = cnilab(&["lab", "show", "--name", "nosuchlab"]);
    assert_eq!(missing.status.code(), Some(2), "{}", all(&missing));
    assert!(
        all(&missing).contains("cnilab lab up --name nosuchlab"),
        "{}",
        all(&missing)
    );
}

/// The reader holds what real nodes have, beyond what the lab builds:
/// Calico's /32 routes to a veth with proxy ARP and a blackhole aggregate,
/// flannel's VXLAN device with an all-zeros FDB entry, a multipath route, a
/// policy rule with its table, a permanent neighbour, NOARP, a qdisc and a
/// kube-proxy-style iptables-nft chain. (`dummy0` is a veth: the dummy
/// driver is not in every kernel.)
#[test]
fn the_reader_holds_what_calico_and_flannel_nodes_have() {
    let _host = host_untouched();
    require_root();
    let ns = cnilab_net::netns::Netns::with_label("model-read").expect("netns");
    for line in [
        "link add dummy0 type veth peer name dummy0p",
        "link set dummy0p up",
        "link set dummy0 arp off up",
        "addr add 192.0.2.1/24 dev dummy0",
        "link add cali1 type veth peer name cali1p",
        "link set cali1 up",
        "route add 10.0.0.5/32 dev cali1 scope link",
        "route add blackhole 10.0.0.0/26 proto bird",
        "route add 198.51.100.0/24 nexthop via 192.0.2.2 weight 1 nexthop via 192.0.2.3 weight 2",
        "route add default via 192.0.2.254 table 100",
        "rule add fwmark 0x4000/0x4000 lookup 100 pref 1000",
        "neigh add 192.0.2.9 lladdr 02:00:00:00:00:09 dev dummy0 nud permanent",
        "link add flannel.1 type vxlan id 1 local 192.0.2.1 dev dummy0 dstport 8472 nolearning",
        "link set flannel.1 up",
    ] {
        let args: Vec<&str> = line.split(' ').collect();
        run_in(&ns, "ip", &args);
    }
    run_in(
        &ns,
        "bridge",
        &[
            "fdb",
            "append",
            "00:00:00:00:00:00",
            "dev",
            "flannel.1",
            "dst",
            "192.0.2.7",
        ],
    );
    run_in(
        &ns,
        "tc",
        &[
            "qdisc", "add", "dev", "dummy0", "root", "handle", "1:", "pfifo",
        ],
    );
    run_in(&ns, "nft", &["add table ip filter; add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }; add rule ip filter FORWARD ct state established accept"]);
    cnilab_net::netns::write_sysctl(Some(ns.file()), "net/ipv4/conf/cali1/proxy_arp", "1")
        .expect("proxy_arp");

    let node = layout::namespace_at(ns.path(), "node").expect("read");
    let shown = serde_json::to_string(&node).expect("json");
    let link = |name: &str| {
        node.links
            .iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("no link {name} in {shown}"))
    };
    let dummy0 = serde_json::to_value(link("dummy0")).expect("json");
    assert_eq!(dummy0["kind"], "veth");
    assert_eq!(dummy0["flags"], serde_json::json!(["noarp"]));
    assert_eq!(dummy0["addresses"], serde_json::json!(["192.0.2.1/24"]));
    let cali1 = link("cali1").veth.clone().expect("veth peer");
    assert_eq!(
        (cali1.namespace.as_deref(), cali1.name.as_str()),
        (Some("node"), "cali1p")
    );
    let vx = link("flannel.1").vxlan.clone().expect("vxlan");
    assert_eq!(
        (vx.vni, vx.port, vx.learning, vx.dev.as_deref(), vx.local),
        (
            1,
            8472,
            false,
            Some("dummy0"),
            Some("192.0.2.1".parse().expect("ip"))
        )
    );
    let routes = serde_json::to_value(&node.routes)
        .expect("json")
        .to_string();
    for needle in [
        r#""dev":"cali1","dst":"10.0.0.5/32""#,
        r#""proto":"bird","scope":"universe","table":254,"type":"blackhole""#,
        r#""nexthops":[{"dev":"dummy0","gateway":"192.0.2.2","weight":1},{"dev":"dummy0","gateway":"192.0.2.3","weight":2}]"#,
        r#""dst":"0.0.0.0/0","gateway":"192.0.2.254""#,
    ] {
        assert!(routes.contains(needle), "{needle} not in {routes}");
    }
    assert!(
        node.routes.iter().any(|r| r.table == 100),
        "table 100: {routes}"
    );
    assert!(
        node.routes.iter().all(|r| r.proto != "kernel"),
        "kernel routes are left out: {routes}"
    );
    let rule = node
        .rules
        .iter()
        .find(|r| r.priority == 1000)
        .expect("rule 1000");
    assert_eq!(
        (rule.fwmark, rule.fwmask, rule.table, rule.action.as_str()),
        (Some(0x4000), Some(0x4000), 100, "lookup")
    );
    assert_eq!(
        node.rules.len(),
        1,
        "the kernel's default rules are left out: {shown}"
    );
    assert!(
        node.neighbours
            .iter()
            .any(|n| n.addr.to_string() == "192.0.2.9"
                && n.mac.as_deref() == Some("02:00:00:00:00:09")
                && n.state == "permanent"),
        "{shown}"
    );
    assert!(
        node.fdb.iter().any(|f| f.dev == "flannel.1"
            && f.mac == "00:00:00:00:00:00"
            && f.dst.map(|d| d.to_string()).as_deref() == Some("192.0.2.7")),
        "{shown}"
    );
    assert!(
        node.qdiscs.iter().any(|q| q.dev == "dummy0"
            && q.kind == "pfifo"
            && q.handle == "1:"
            && q.parent == "root"),
        "{shown}"
    );
    let filter = node
        .nftables
        .iter()
        .find(|t| t.family == "ip" && t.name == "filter")
        .expect("ip filter");
    assert!(
        filter.text.contains("ct state established accept"),
        "{}",
        filter.text
    );
    assert_eq!(
        node.sysctls
            .get("net/ipv4/conf/cali1/proxy_arp")
            .map(String::as_str),
        Some("1")
    );
}
