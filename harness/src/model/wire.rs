//! How the model's types are read from JSON where serde's `flatten` and
//! `untagged` would buffer a whole value first (serde's `Content`: every
//! number, string and map copied into a tree at many times the bytes it
//! came from): a capture is a stranger's file, and 50 MB of small objects
//! under `node` peaked at 2 GiB that way. Each type here names its fields
//! itself, so an unknown field is skipped without being kept and a wrong
//! type is refused at its first byte. Writing is unchanged (the derived
//! `Serialize`, flattened).

use super::{
    FdbEntry, Hook, IptablesSave, Link, LinkKind, Lower, Namespace, Neighbour, NftTable, Node,
    Qdisc, Route, RouteType, Rule, VethPeer,
};
use ipnet::IpNet;
use serde::Deserialize;
use std::collections::BTreeMap;

/// [`Node`] with its namespace's fields beside its own (the JSON is one
/// object).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NodeWire {
    name: String,
    #[serde(default)]
    links: Vec<Link>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    neighbours: Vec<Neighbour>,
    #[serde(default)]
    fdb: Vec<FdbEntry>,
    #[serde(default)]
    nftables: Vec<NftTable>,
    #[serde(default)]
    sysctls: BTreeMap<String, String>,
    #[serde(default)]
    qdiscs: Vec<Qdisc>,
    #[serde(default)]
    iptables: Vec<IptablesSave>,
    #[serde(default)]
    hooks: Vec<Hook>,
    #[serde(default)]
    pod_cidrs: Vec<IpNet>,
    #[serde(default)]
    pods: Vec<Namespace>,
}

impl From<NodeWire> for Node {
    fn from(w: NodeWire) -> Node {
        Node {
            net: Namespace {
                name: w.name,
                links: w.links,
                routes: w.routes,
                rules: w.rules,
                neighbours: w.neighbours,
                fdb: w.fdb,
                nftables: w.nftables,
                sysctls: w.sysctls,
                qdiscs: w.qdiscs,
                iptables: w.iptables,
                hooks: w.hooks,
            },
            pod_cidrs: w.pod_cidrs,
            pods: w.pods,
        }
    }
}

/// [`Lower`] with its device's fields beside its mode.
#[derive(Deserialize)]
pub(super) struct LowerWire {
    #[serde(default)]
    namespace: Option<String>,
    name: String,
    #[serde(default)]
    mode: Option<String>,
}

impl From<LowerWire> for Lower {
    fn from(w: LowerWire) -> Lower {
        Lower {
            link: VethPeer {
                namespace: w.namespace,
                name: w.name,
            },
            mode: w.mode,
        }
    }
}

impl From<String> for LinkKind {
    fn from(s: String) -> LinkKind {
        match s.as_str() {
            "loopback" => LinkKind::Loopback,
            "veth" => LinkKind::Veth,
            "bridge" => LinkKind::Bridge,
            "vxlan" => LinkKind::Vxlan,
            "dummy" => LinkKind::Dummy,
            "macvlan" => LinkKind::Macvlan,
            "ipvlan" => LinkKind::Ipvlan,
            "device" => LinkKind::Device,
            _ => LinkKind::Other(s),
        }
    }
}

impl From<String> for RouteType {
    fn from(s: String) -> RouteType {
        match s.as_str() {
            "unicast" => RouteType::Unicast,
            "blackhole" => RouteType::Blackhole,
            "unreachable" => RouteType::Unreachable,
            "prohibit" => RouteType::Prohibit,
            "throw" => RouteType::Throw,
            _ => RouteType::Other(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LabModel, Link, LinkKind, Lower, Node, RouteType, VethPeer};

    /// What the derived `Serialize` writes, these read back the same.
    #[test]
    fn every_wire_type_reads_what_serialize_writes() {
        let mut node = Node::default();
        node.net.name = "node1".into();
        node.pod_cidrs = vec!["10.244.1.0/24".parse().expect("cidr")];
        let mut l = Link::new("mv0", LinkKind::Macvlan, true);
        l.lower = Some(Lower {
            link: VethPeer {
                namespace: Some("node1".into()),
                name: "eth0".into(),
            },
            mode: Some("bridge".into()),
        });
        node.net.links = vec![
            l,
            Link::new("x0", LinkKind::Other("wireguard".into()), false),
        ];
        node.net
            .sysctls
            .insert("net/ipv4/ip_forward".into(), "1".into());
        node.pods = vec![super::super::Namespace::new("node1-pod0")];
        let model = LabModel {
            schema_version: 1,
            name: "lab".into(),
            underlay: Vec::new(),
            nodes: vec![node],
        };
        let text = serde_json::to_string(&model).expect("json");
        assert_eq!(
            serde_json::from_str::<LabModel>(&text).expect("read"),
            model
        );
        for (kind, want) in [
            ("\"blackhole\"", RouteType::Blackhole),
            ("\"42\"", RouteType::Other("42".into())),
        ] {
            assert_eq!(serde_json::from_str::<RouteType>(kind).expect("type"), want);
            assert_eq!(serde_json::to_string(&want).expect("json"), kind);
        }
        assert!(serde_json::from_str::<LinkKind>("[1]").is_err());
    }
}
