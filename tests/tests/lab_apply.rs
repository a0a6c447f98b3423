//! `model::apply` (root): a model made into namespaces reads back as the
//! model. For every topology in `lab/topologies/`, `read(apply(compile(t)))`
//! equals `compile(t)` for the underlay and the nodes' own state (pods as
//! compiled: before any plugin ADD); a namespace holding what real nodes
//! have (Calico's /32 routes and blackhole, flannel's VXLAN FDB, a
//! multipath route, a policy rule, a permanent neighbour, NOARP, a qdisc,
//! an nftables chain), read, applied elsewhere and read again, is the same;
//! a model that contradicts itself is refused before anything is made, and
//! a ruleset nft refuses removes what apply made.

use cnilab_harness::lab::Topology;
use cnilab_harness::lab::{compile, layout};
use cnilab_harness::model::apply::{apply, ApplyError, Options};
use cnilab_harness::model::{identity, read, LabModel};
use cnilab_tests::{host_untouched, require_root, run_in};
use rstest::rstest;
use std::path::PathBuf;

/// Fills `{{pod:<pod>:ipv4}}` (a Service backend the plugin's IPAM would
/// choose) with the first host address of the pod's node's IPv4 pod CIDR
/// plus the pod's number, so the table loads and compares.
fn bind_placeholders(model: &mut LabModel) {
    let addresses: Vec<(String, String)> = model
        .nodes
        .iter()
        .flat_map(|n| {
            let cidr = n.pod_cidrs.iter().find(|c| c.addr().is_ipv4()).copied();
            n.pods.iter().enumerate().filter_map(move |(k, p)| {
                let ip = cidr?.hosts().nth(k + 1)?;
                Some((format!("{{{{pod:{}:ipv4}}}}", p.name), ip.to_string()))
            })
        })
        .collect();
    for node in &mut model.nodes {
        for t in &mut node.net.nftables {
            for (placeholder, ip) in &addresses {
                t.text = t.text.replace(placeholder, ip);
            }
            assert!(!t.text.contains("{{"), "unbound: {}", t.text);
        }
    }
}

#[rstest]
fn an_applied_topology_reads_back_as_its_compiled_model(
    #[files("../lab/topologies/*.toml")] path: PathBuf,
) {
    let _host = host_untouched();
    require_root();
    let topo = Topology::load(&path).expect("topology");
    let mut compiled = compile::compile(&topo).expect("compiles");
    bind_placeholders(&mut compiled);
    let applied = apply(&compiled, &Options::default()).expect("apply");
    let model = read::read(&applied.layout()).expect("read");
    let not_made: Vec<String> = applied.not_made.iter().map(|n| n.to_string()).collect();
    let expected = identity::expected(&compiled, &model).expect("expected model");
    let differences = identity::differences_applied(&expected, &model);
    applied.down();
    assert!(
        not_made.is_empty(),
        "{}: not made: {not_made:#?}",
        path.display()
    );
    assert!(
        differences.is_empty(),
        "{}: read(apply(compile(t))) differs from compile(t):\n{}",
        path.display(),
        differences.join("\n")
    );
}

/// What real nodes have, made by `ip`/`bridge`/`tc`/`nft`, read, applied
/// into a fresh namespace and read again: the same model.
#[test]
fn a_real_nodes_objects_apply_and_read_back_the_same() {
    let _host = host_untouched();
    require_root();
    let ns = cnilab_net::netns::Netns::with_label("apply-src").expect("netns");
    for line in [
        "link add br0 type bridge",
        "link add up0 type veth peer name up0p",
        "link set up0p master br0 up",
        "link set br0 up",
        "link set up0p type bridge_slave hairpin on learning off",
        "link set up0 arp off up",
        "addr add 192.0.2.1/24 dev up0",
        "addr add 2001:db8::1/64 dev up0 nodad",
        "link add cali1 type veth peer name cali1p",
        "link set cali1 up mtu 1400",
        "route add 10.0.0.5/32 dev cali1 scope link",
        "route add blackhole 10.0.0.0/26 proto bird",
        "route add unreachable 10.9.0.0/16",
        "route add prohibit 10.8.0.0/16 table 100",
        "route add 198.51.100.0/24 nexthop via 192.0.2.2 weight 1 nexthop via 192.0.2.3 weight 2",
        "route add 203.0.113.0/24 via 10.0.0.5 dev cali1 onlink",
        "route add 2001:db8:1::/64 via 2001:db8::9",
        "route add default via 192.0.2.254 table 100",
        "rule add fwmark 0x4000/0x4000 lookup 100 pref 1000",
        "rule add from 10.0.0.0/26 to 203.0.113.0/24 lookup 100 pref 1001",
        "neigh add 192.0.2.9 lladdr 02:00:00:00:00:09 dev up0 nud permanent",
        "link add flannel.1 type vxlan id 1 local 192.0.2.1 dev up0 dstport 8472 nolearning",
        "link set flannel.1 up",
    ] {
        let args: Vec<&str> = line.split(' ').collect();
        run_in(&ns, "ip", &args);
    }
    for args in [
        "fdb append 00:00:00:00:00:00 dev flannel.1 dst 192.0.2.7",
        "fdb add 0a:00:00:00:00:07 dev flannel.1 dst 192.0.2.7",
    ] {
        run_in(&ns, "bridge", &args.split(' ').collect::<Vec<_>>());
    }
    run_in(
        &ns,
        "tc",
        &[
            "qdisc", "add", "dev", "up0", "root", "handle", "1:", "pfifo",
        ],
    );
    run_in(&ns, "nft", &["add table ip filter; add chain ip filter FORWARD { type filter hook forward priority 0; policy drop; }; add rule ip filter FORWARD ct state established accept"]);
    cnilab_net::netns::write_sysctl(Some(ns.file()), "net/ipv4/conf/cali1/proxy_arp", "1")
        .expect("proxy_arp");
    let source = layout::namespace_at(ns.path(), "node").expect("read");
    let model = LabModel {
        schema_version: 1,
        name: "real".into(),
        underlay: vec![source],
        nodes: Vec::new(),
    };
    // The veth peers (up0p, cali1p) are in the model's own namespace.
    let applied = apply(&model, &Options::default()).expect("apply");
    let back = read::read(&applied.layout()).expect("read back");
    let not_made: Vec<String> = applied.not_made.iter().map(|n| n.to_string()).collect();
    applied.down();
    let differences = identity::differences_applied(&model, &back);
    assert!(not_made.is_empty(), "not made: {not_made:#?}");
    assert!(
        differences.is_empty(),
        "read(apply(read(node))) differs from read(node):\n{}",
        differences.join("\n")
    );
}

/// A route whose device is missing is refused before any namespace is
/// made; a ruleset nft refuses is an error naming the namespace and table,
/// and the namespaces made before it are gone.
#[test]
fn a_bad_model_is_an_error_naming_the_object_and_leaves_nothing() {
    let _host = host_untouched();
    require_root();
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/topologies/two-node.toml");
    let compiled = compile::compile(&Topology::load(&path).expect("topology")).expect("compiles");
    // This test's namespaces carry `-bm-` (other tests run beside it).
    let make = |role: &str| {
        let label: String = format!("bm-{role}").chars().take(12).collect();
        cnilab_net::netns::Netns::with_label(&label)
    };
    let opts = Options {
        make_ns: Some(&make),
    };
    let mine = || -> Vec<String> {
        let own = format!("cnilab-{}-", std::process::id());
        std::fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&own) && n.contains("-bm-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = mine();
    assert!(before.is_empty(), "{before:?}");

    let mut bad = compiled.clone();
    bad.nodes[0].net.routes[0].dev = Some("eth9".into());
    let e = apply(&bad, &opts).err().expect("refused");
    let text = e.to_string();
    assert!(
        matches!(e, ApplyError::Object { .. })
            && text.starts_with("node1: route ")
            && text.contains("eth9"),
        "{text}"
    );
    assert_eq!(mine(), before);

    let mut bad = compiled;
    bad.nodes[1]
        .net
        .nftables
        .push(cnilab_harness::model::NftTable {
            family: "inet".into(),
            name: "broken".into(),
            text: "table inet broken {\nchain c {\nnot a rule\n}\n}".into(),
        });
    let e = apply(&bad, &opts).err().expect("refused");
    let text = e.to_string();
    assert!(
        text.starts_with("node2: nftables table inet broken: nft refused it"),
        "{text}"
    );
    assert_eq!(mine(), before, "namespaces left behind");
}
