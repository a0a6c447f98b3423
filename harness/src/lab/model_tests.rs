//! The model's own rules, held against compiled labs: the identity's
//! normalisation, `lab show`'s text and the diff between two models of one
//! lab. They live here, not beside the model, because the model sits on a
//! floor below the compiler.

mod identity {
    use crate::lab::compile::compile;
    use crate::lab::Topology;
    use crate::model::identity::*;
    use crate::model::{LabModel, Link, LinkKind, VethPeer};

    /// A compiled two-node model, with what a plugin and the kernel add
    /// to it: the read model of a healthy lab.
    fn as_read(model: &LabModel) -> LabModel {
        let mut read = model.clone();
        for node in &mut read.nodes {
            let cidr = node.pod_cidrs[0];
            let mut bridge = Link::new("cnilab0", LinkKind::Bridge, true);
            bridge.mac = Some("02:00:00:00:00:01".into());
            node.net.links.push(bridge);
            for (k, pod) in node.pods.iter_mut().enumerate() {
                let host = format!("veth{k}");
                let mut h = Link::new(&host, LinkKind::Veth, true);
                h.controller = Some("cnilab0".into());
                h.veth = Some(VethPeer {
                    namespace: Some(pod.name.clone()),
                    name: "eth0".into(),
                });
                node.net.links.push(h);
                let mut eth0 = Link::new("eth0", LinkKind::Veth, true);
                eth0.veth = Some(VethPeer {
                    namespace: Some(node.net.name.clone()),
                    name: host,
                });
                let ip = cidr.hosts().nth(k + 1).expect("room");
                eth0.addresses.push(ipnet::IpNet::new(ip, 24).expect("net"));
                pod.links.push(eth0);
            }
            for l in &mut node.net.links {
                if l.mac.is_none() && l.kind != LinkKind::Loopback {
                    l.mac = Some(format!("0a:00:00:00:00:{:02x}", l.name.len()));
                }
            }
            node.net
                .sysctls
                .insert("net/ipv4/conf/all/rp_filter".into(), "2".into());
        }
        read
    }

    fn two_node() -> LabModel {
        compile(&Topology::generated(2, 2).expect("topology")).expect("compiles")
    }

    #[test]
    fn a_healthy_read_is_identical_after_normalising() {
        let model = two_node();
        assert_eq!(differences(&model, &as_read(&model)), Vec::<String>::new());
    }

    #[test]
    fn a_difference_names_the_namespace_object_and_field() {
        let model = two_node();
        let mut read = as_read(&model);
        read.nodes[1].net.link_mut("eth0").expect("eth0").mtu = Some(1400);
        read.nodes[0].net.routes.clear();
        read.nodes[0]
            .net
            .sysctls
            .insert("net/ipv4/ip_forward".into(), "0".into());
        let d = differences(&model, &read);
        assert!(
            d.contains(&"node2: link eth0: mtu: compiled 1500, read 1400".to_string()),
            "{d:#?}"
        );
        assert!(
            d.iter()
                .any(|l| l.starts_with("node1: route missing: ") && l.contains("10.244.2.0/24")),
            "{d:#?}"
        );
        assert!(
            d.contains(
                &"node1: sysctl net/ipv4/ip_forward: compiled \"1\", read Some(\"0\")".to_string()
            ),
            "{d:#?}"
        );
    }

    #[test]
    fn pods_are_checked_by_structure() {
        let model = two_node();
        let mut read = as_read(&model);
        // node2's second pod got an address of node1's pod CIDR, and the
        // same as node1's first pod.
        let eth0 = read.nodes[1].pods[1].link_mut("eth0").expect("eth0");
        eth0.addresses = vec!["10.244.1.2/24".parse().expect("net")];
        // node1's first pod has a second interface.
        read.nodes[0].pods[0]
            .links
            .push(Link::new("net1", LinkKind::Dummy, true));
        let d = differences(&model, &read);
        assert!(
            d.iter()
                .any(|l| l.starts_with("node2-pod1: 0 addresses in pod CIDR 10.244.2.0/24")),
            "{d:#?}"
        );
        assert!(
            d.iter()
                .any(|l| l.starts_with("node2-pod1: address 10.244.1.2/24 is outside")),
            "{d:#?}"
        );
        assert!(
            d.iter()
                .any(|l| l.starts_with("node1-pod0: pod links besides lo")),
            "{d:#?}"
        );
    }

    #[test]
    fn placeholders_bind_to_the_pods_addresses() {
        let mut model = crate::lab::compile::tests::shipped("vxlan.toml");
        let read = as_read(&model);
        bind_pod_addresses(&mut model, &read).expect("bound");
        let text = &model.nodes[0].net.nftables[0].text;
        assert!(text.contains("dnat to 10.244.3.2:7777"), "{text}");
        assert!(!text.contains("{{"), "{text}");
    }
}

mod text {
    #[test]
    fn text_names_links_routes_and_peers_like_ip() {
        let model = crate::lab::compile::tests::shipped("vxlan.toml");
        let text = model.to_text();
        for line in [
            "lab vxlan (schemaVersion 1)",
            "link p-node1 veth up mtu 1500 master underlay peer node1/eth0",
            "link vxlan0 vxlan up mtu 1450 vxlan id 1 dstport 8472 local 10.250.0.1 dev eth0 nolearning 10.244.1.0/32",
            "route 10.244.2.0/24 via 10.244.2.0 dev vxlan0 proto boot scope universe onlink",
            "fdb @node2/vxlan0 dev vxlan0 dst 10.250.0.2 permanent",
            "nft table ip kube-proxy",
        ] {
            assert!(text.lines().any(|l| l.trim() == line), "no {line:?} in:\n{text}");
        }
    }
}

mod diff {
    use crate::lab::compile::{compile, infrastructure};
    use crate::lab::topology::shapes::{apply_flags, Shape};
    use crate::lab::topology::Topology;
    use crate::model::apply::diff::*;
    use crate::model::{LabModel, Namespace};

    /// The infrastructure of a generated topology of `n` nodes, and of the
    /// same topology without its last node.
    fn with_and_without(n: usize, shape: Option<Shape>, vxlan: bool) -> (LabModel, LabModel) {
        let mut topo = Topology::generated(n, 1).expect("topology");
        apply_flags(&mut topo, shape, vxlan, false).expect("flags");
        let with = infrastructure(compile(&topo).expect("compiles"));
        topo.nodes.pop();
        let without = infrastructure(compile(&topo).expect("compiles"));
        (with, without)
    }

    fn named<'a>(d: &'a [Namespace], name: &str) -> &'a Namespace {
        d.iter()
            .find(|ns| ns.name == name)
            .unwrap_or_else(|| panic!("{name} in {d:?}"))
    }

    #[test]
    fn a_model_and_itself_differ_in_nothing() {
        let (with, _) = with_and_without(3, Some(Shape::Routed), true);
        assert!(diff(&with, &with).is_empty());
    }

    #[test]
    fn a_joining_node_is_made_whole_with_its_port_and_its_peers_routes() {
        let (with, without) = with_and_without(3, None, false);
        let d = diff(&without, &with);
        let made: Vec<&str> = d.made.iter().map(|(_, ns)| ns.name.as_str()).collect();
        assert_eq!(made, ["node3"]);
        assert_eq!(
            d.made[0].0,
            Place::Node(vec!["10.244.3.0/24".parse().unwrap()])
        );
        assert!(d.removed.is_empty(), "{:?}", d.removed);
        assert!(d.gone.is_empty());
        let switch = named(&d.added, "switch");
        let links: Vec<&str> = switch.links.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(links, ["p-node3"]);
        // Static routing: node1 and node2 route node3's pods, and nothing else
        // of theirs changes.
        for peer in ["node1", "node2"] {
            let ns = named(&d.added, peer);
            let dsts: Vec<String> = ns.routes.iter().map(|r| r.dst.to_string()).collect();
            assert_eq!(dsts, ["10.244.3.0/24"], "{peer}");
            assert!(
                ns.links.is_empty() && ns.sysctls.is_empty(),
                "{peer}: {ns:?}"
            );
        }
    }

    #[test]
    fn a_leaving_node_is_the_reverse_of_a_joining_one() {
        let (with, without) = with_and_without(3, None, true);
        let join = diff(&without, &with);
        let leave = diff(&with, &without);
        assert_eq!(leave.gone, ["node3"]);
        assert!(leave.made.is_empty() && leave.added.is_empty());
        assert_eq!(leave.removed, join.added);
        // VXLAN: every peer forgets node3's VTEP (neighbour, FDB, route).
        let node1 = named(&leave.removed, "node1");
        assert_eq!(node1.neighbours.len(), 1);
        assert_eq!(node1.fdb.len(), 1);
        assert_eq!(node1.fdb[0].mac, "@node3/vxlan0");
        assert_eq!(node1.routes.len(), 1);
    }

    #[test]
    fn a_node_in_a_subnet_of_its_own_brings_its_rack_and_router_leg() {
        let (with, without) = with_and_without(3, Some(Shape::Routed), false);
        let d = diff(&without, &with);
        let switch = named(&d.added, "switch");
        let mut links: Vec<&str> = switch.links.iter().map(|l| l.name.as_str()).collect();
        links.sort();
        assert_eq!(links, ["p-node3", "p-r-rack3", "rack3"]);
        let router = named(&d.added, "router");
        assert_eq!(router.links.len(), 1);
        assert_eq!(router.links[0].name, "rack3");
        let dsts: Vec<String> = router.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["10.244.3.0/24"]);
    }

    #[test]
    fn a_nat_node_brings_its_nat_box_and_a_changed_table_is_replaced() {
        let (with, without) = with_and_without(2, Some(Shape::Nat), false);
        let d = diff(&without, &with);
        let made: Vec<&str> = d.made.iter().map(|(_, ns)| ns.name.as_str()).collect();
        assert_eq!(made, ["node2-nat", "node2"]);
        assert_eq!(d.made[0].0, Place::Underlay);
        let mut changed = with.clone();
        let table = &mut changed.nodes[0].net.nftables;
        table.push(crate::model::NftTable {
            family: "inet".into(),
            name: "t".into(),
            text: "table inet t {\n}\n".into(),
        });
        let mut edited = changed.clone();
        edited.nodes[0].net.nftables.last_mut().unwrap().text =
            "table inet t {\n  chain c {\n  }\n}\n".into();
        let d = diff(&changed, &edited);
        assert_eq!(d.added.len(), 1);
        assert_eq!(d.removed.len(), 1);
        assert_eq!(d.removed[0].nftables[0].text, "table inet t {\n}\n");
        assert!(d.added[0].nftables[0].text.contains("chain c"));
    }
}
