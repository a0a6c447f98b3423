//! Networks as data: what a lab or a real node *is* (namespaces, links,
//! addresses, routes of every table, policy rules, permanent neighbours, FDB
//! entries, nftables tables, the sysctls that matter, qdiscs), as plain
//! serde types, with their reader and their maker. It sits below everything
//! that builds, captures, replays or traces a network, and imports none of
//! them.
//!
//! Where things happen: this file holds the types ([`LabModel`] and what it
//! is made of, `schemaVersion` [`SCHEMA_VERSION`]); `crate::lab::compile`
//! (a floor above) turns a topology into the model of what the lab's builder
//! makes; [`placeholder`] binds the pods' addresses that a compiled model
//! can only name; [`read`] turns live namespaces back into the same model (netlink
//! through `cnilab_net::nl` on a dedicated thread per namespace, sysctls from
//! `/proc/sys` inside it, `nft -s list ruleset` inside it); [`identity`]
//! normalises a read model against a compiled one and names every difference
//! (node, object, field); [`apply`] makes a model into namespaces and
//! kernel objects (and [`apply::Applied::down`] removes them);
//! `firewall.rs` reads nftables and iptables-save
//! text; `sysctl.rs` reads and writes `/proc/sys` through directory handles
//! (for [`read`] and [`apply`]); `text.rs` prints a model one object per line
//! (`cnilab lab show`).
//!
//! # What the model holds
//! A [`LabModel`] is the underlay namespaces (`switch`, `router`,
//! `<node>-nat`, `external`: whatever joins the nodes) and the nodes, each
//! with its pods. Every namespace is a [`Namespace`]. The types are meant to
//! hold a real node too (the next step captures one): flannel's `flannel.1`
//! is a [`Link`] of kind `vxlan` with [`Vxlan`] attributes, its peers'
//! entries are [`Neighbour`]s and [`FdbEntry`]s; Calico's `cali*` veths are
//! links whose [`VethPeer`] is a pod, its `/32 dev cali…` routes are
//! [`Route`]s of scope `link`, its blackhole aggregates routes of type
//! `blackhole`, its proxy ARP a sysctl `net/ipv4/conf/cali…/proxy_arp`;
//! kube-proxy's iptables-nft chains are [`NftTable`]s (`ip filter`, `ip nat`)
//! as `nft list ruleset` prints them, and again as [`IptablesSave`] text
//! (`iptables-nft-save`: nft does not print their comments), like legacy
//! x_tables rules; a macvlan or ipvlan names its [`Lower`] device and mode.
//! `cnilab capture` (`crate::capture`) writes a node and its pods as these
//! types.
//!
//! What the reader leaves out, because the kernel makes it from other
//! entries: routes of the `local` table and of types local/broadcast/
//! anycast/multicast, routes of protocol `kernel` (they follow addresses),
//! IPv6 link-local addresses, `lo`'s own 127.0.0.1/8 and ::1/128, the default policy rules (protocol `kernel`),
//! neighbours that are not PERMANENT, FDB entries that are learned,
//! multicast or a link's own address, qdiscs the kernel attaches by itself
//! (handle 0), counters and timers. MACs are read as they are; a compiled
//! model leaves a MAC the kernel chooses as `None`.
//!
//! # The identity (`read(build(t)) == compile(t)`)
//! [`identity::differences`] normalises a read model against the compiled
//! one and lists what differs. Normalising means: a MAC the compiled model
//! leaves to the kernel is forgotten, after every neighbour or FDB entry that
//! names it is rewritten to a reference `@<namespace>/<link>` (so "node2's
//! VTEP MAC on node1" is compared, not the random bytes); only the sysctls
//! the compiled model names are compared (the others are kernel defaults,
//! which vary with the kernel); a bridge port's STP `state` is left out (it
//! follows carrier asynchronously); `{{pod:<pod>:ipv4}}` in a compiled
//! nftables table is bound to the address the plugin's IPAM gave that pod
//! (kube-proxy-like Service backends).
//!
//! What the plugin makes (its IPAM addresses, its veths, bridge, routes and
//! firewall tables) is not the builder's and is compared by structure, not
//! value: each pod has, besides `lo`, exactly one link `eth0`, a veth whose
//! peer is in its own node; `eth0` has one address per pod CIDR family of its
//! node, inside that node's pod CIDR, and no two pods share an address; the
//! node has the peer link, and the peer is up. Then the plugin's part of the
//! node (the pods' host veths, their controller, the addresses, routes and
//! neighbours on them, routes to the pods' addresses, nftables tables the
//! compiled model does not name) is taken out and the rest must equal the
//! compiled node exactly. What an agent makes (`routing = "agent"`: routes
//! of protocol 199) is compiled like the builder's, since the agent is a
//! step of building; the agent's own table `inet cnilab_agent` is the
//! agent's (the root test checks only that every node has it).
//!
//! # How [`apply`] takes a model
//! Apply walks a [`LabModel`] in the order the kernel needs: every
//! namespace (underlay first, then nodes, then pods, each with its global
//! and `default` sysctls at once, so links made later inherit them); in
//! each, links whose controller, VXLAN `dev` and veth peer already exist
//! (bridges first, then veths, created with the peer directly in the
//! peer's namespace, then VXLAN, then macvlan/ipvlan in their lower's
//! namespace), then link attributes (MTU, MAC when given, flags, the
//! controller, bridge-port options), addresses, `up`, per-link sysctls,
//! routes (a gateway's connected route comes from an address, so routes
//! after addresses; `onlink` ones after their device), rules, neighbours
//! and FDB entries (a `@ns/link` MAC is resolved from the link once it
//! exists), nftables tables (`nft -f -` of each table's text), iptables-save
//! text (`ip[6]tables-<backend>-restore`) and qdiscs. What the kernel here
//! cannot make is listed as not made; a model that contradicts itself, or an
//! object the kernel refuses, is an error and removes what apply made. The
//! pods' plugin-made state is not in a compiled model: the lab runs the
//! runtime (direct or containerd) to ADD each pod after apply; a captured
//! pod (`lab up --capture`) holds its own state and apply makes it all.
//! `read(apply(compile(t))) == compile(t)` is a root test
//! (`tests/tests/lab_apply.rs`, through [`identity::differences_applied`]).
//! [`apply::apply_diff`] takes two models of one lab and changes the
//! standing namespaces of the first into the second with the same steps
//! (a node that joins or leaves: `tests/tests/lab_model.rs`).

pub mod apply;
mod bpf;
pub(crate) mod firewall;
pub mod identity;
pub mod placeholder;
pub mod read;
pub(crate) mod sysctl;
mod text;
mod wire;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The version of the model's JSON form; bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// A whole lab (or a captured node with its neighbours).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabModel {
    pub schema_version: u32,
    pub name: String,
    /// The namespaces that join the nodes: switch, router, NAT boxes, the
    /// external host.
    #[serde(default)]
    pub underlay: Vec<Namespace>,
    #[serde(default)]
    pub nodes: Vec<Node>,
}

/// A node: its namespace, its pod CIDRs and its pods.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "wire::NodeWire")]
pub struct Node {
    #[serde(flatten)]
    pub net: Namespace,
    #[serde(default)]
    pub pod_cidrs: Vec<IpNet>,
    #[serde(default)]
    pub pods: Vec<Namespace>,
}

/// One network namespace, by its role in the lab (`switch`, `node1`,
/// `node1-pod0`), not by the kernel's name for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Namespace {
    pub name: String,
    #[serde(default)]
    pub links: Vec<Link>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbours: Vec<Neighbour>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fdb: Vec<FdbEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nftables: Vec<NftTable>,
    /// `net/ipv4/ip_forward = "1"` (slashes, as under `/proc/sys`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub qdiscs: Vec<Qdisc>,
    /// iptables as `iptables-save` prints it, where the namespace has any:
    /// legacy (x_tables) tables, and the iptables-nft ones again (the
    /// nftables text above leaves out their comments and any match nft
    /// cannot translate; `iptables-nft-restore` takes this text whole).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iptables: Vec<IptablesSave>,
    /// Programs and filters on links' hooks (XDP, tc) that a replay cannot
    /// make: read so a capture says they were there (`bpf.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

/// A program or filter on a link's hook: `hook` `xdp` with `kind` its
/// mode (`generic`, `driver`, `offload`, `multi`) and `program` its id, or
/// `tc ingress` / `tc egress` with `kind` the filter's (`bpf`, `u32`, …).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    pub dev: String,
    pub hook: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<u32>,
}

/// One family's iptables of one backend, as `ip[6]tables-{legacy,nft}-save`
/// prints it, normalised like the nft text (no `#` lines, no counters).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IptablesSave {
    pub backend: Backend,
    /// `ipv4` or `ipv6`.
    pub family: String,
    pub text: String,
}

/// Which iptables an [`IptablesSave`] is: it names the program that
/// restores it (`ip[6]tables-<backend>-restore`), so a capture may say
/// nothing but these two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Legacy,
    Nft,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Legacy => "legacy",
            Backend::Nft => "nft",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Backend, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "legacy" => Ok(Backend::Legacy),
            "nft" => Ok(Backend::Nft),
            _ => Err(serde::de::Error::custom(format!(
                "iptables backend {:?}: must be \"legacy\" or \"nft\"",
                s
            ))),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", from = "String")]
pub enum LinkKind {
    Loopback,
    Veth,
    Bridge,
    Vxlan,
    Dummy,
    Macvlan,
    Ipvlan,
    /// A device without a `kind` (a physical NIC).
    Device,
    #[serde(untagged)]
    Other(String),
}

impl LinkKind {
    /// From netlink's `IFLA_INFO_KIND` (`None`: a plain device).
    pub(crate) fn from_kind(kind: Option<&str>, name: &str) -> LinkKind {
        match kind {
            None if name == "lo" => LinkKind::Loopback,
            None => LinkKind::Device,
            Some("veth") => LinkKind::Veth,
            Some("bridge") => LinkKind::Bridge,
            Some("vxlan") => LinkKind::Vxlan,
            Some("dummy") => LinkKind::Dummy,
            Some("macvlan") => LinkKind::Macvlan,
            Some("ipvlan") => LinkKind::Ipvlan,
            Some(other) => LinkKind::Other(other.to_string()),
        }
    }
}

/// Link flags a configuration sets (the kernel's own, such as LOWER_UP or
/// MULTICAST, are left out).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkFlag {
    Noarp,
    Promisc,
    Allmulti,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    pub name: String,
    pub kind: LinkKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// `None`: the kernel chooses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<LinkFlag>,
    /// The bridge (or other controller) it is a port of, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub veth: Option<VethPeer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<Bridge>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<BridgePort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan: Option<Vxlan>,
    /// A macvlan's or ipvlan's lower device (its namespace by role, as a
    /// veth peer's) and mode (`bridge`, `l2`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower: Option<Lower>,
}

impl Link {
    /// A link with only its name, kind and admin state.
    pub(crate) fn new(name: &str, kind: LinkKind, up: bool) -> Link {
        Link {
            name: name.to_string(),
            kind,
            mtu: None,
            mac: None,
            up,
            flags: Vec::new(),
            controller: None,
            addresses: Vec::new(),
            veth: None,
            bridge: None,
            port: None,
            vxlan: None,
            lower: None,
        }
    }
}

/// The device a macvlan or ipvlan sits on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "wire::LowerWire")]
pub struct Lower {
    #[serde(flatten)]
    pub link: VethPeer,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// The other end of a veth: its namespace (by role; `None` when it is not
/// one the reader was given) and its name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VethPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bridge {
    pub stp: bool,
    pub vlan_filtering: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgePort {
    pub hairpin: bool,
    pub isolated: bool,
    pub learning: bool,
    /// STP state (`forwarding`, `disabled`, …); operational, so the
    /// identity leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vxlan {
    pub vni: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<IpAddr>,
    /// UDP destination port.
    pub port: u16,
    /// The underlay device it sends through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    pub learning: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", from = "String")]
pub enum RouteType {
    Unicast,
    Blackhole,
    Unreachable,
    Prohibit,
    Throw,
    #[serde(untagged)]
    Other(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// 254 is `main`.
    pub table: u32,
    #[serde(rename = "type")]
    pub kind: RouteType,
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub onlink: bool,
    /// `universe`, `link`, `host`, … (number when unnamed).
    pub scope: String,
    /// `boot`, `static`, `kernel`, … (number when unnamed: the agent's 199).
    pub proto: String,
    pub metric: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nexthops: Vec<Nexthop>,
}

/// One path of a multipath route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nexthop {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    pub weight: u16,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub onlink: bool,
}

/// A policy routing rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub priority: u32,
    pub v6: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oif: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmark: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwmask: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub invert: bool,
    /// `lookup` (with `table`), `blackhole`, `unreachable`, `prohibit`, `goto`.
    pub action: String,
    pub table: u32,
}

/// A neighbour entry that configuration made (PERMANENT or NOARP).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Neighbour {
    pub dev: String,
    pub addr: IpAddr,
    /// A MAC, or `@<namespace>/<link>` for a link's kernel-chosen MAC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// `permanent` or `noarp`.
    pub state: String,
}

/// A bridge or VXLAN forwarding entry that configuration made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdbEntry {
    pub dev: String,
    /// A MAC, or `@<namespace>/<link>` for a link's kernel-chosen MAC.
    pub mac: String,
    /// The remote VTEP of a VXLAN entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<IpAddr>,
    /// `permanent` or `static`.
    pub state: String,
}

/// One nftables table as `nft -s list table` prints it, one normalised
/// line per rule (no counters, handles or expiry times).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NftTable {
    pub family: String,
    pub name: String,
    pub text: String,
}

/// A qdisc configuration added (not one the kernel attached by itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qdisc {
    pub dev: String,
    pub kind: String,
    /// `8001:`.
    pub handle: String,
    /// `root` or `1:2`.
    pub parent: String,
}

impl Namespace {
    pub(crate) fn new(name: &str) -> Namespace {
        Namespace {
            name: name.to_string(),
            ..Namespace::default()
        }
    }

    pub(crate) fn link(&self, name: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.name == name)
    }

    pub(crate) fn link_mut(&mut self, name: &str) -> Option<&mut Link> {
        self.links.iter_mut().find(|l| l.name == name)
    }
}

impl Node {
    /// Renames pods (`names`: old name → new), and every reference to them:
    /// a veth's or a lower device's namespace, and a neighbour's or an FDB
    /// entry's MAC written as `@<namespace>/<link>`.
    pub fn rename_pods(&mut self, names: &std::collections::BTreeMap<String, String>) {
        let rename = |ns: &mut Namespace| {
            if let Some(new) = names.get(&ns.name) {
                ns.name = new.clone();
            }
            for l in &mut ns.links {
                let peers = l
                    .veth
                    .iter_mut()
                    .chain(l.lower.iter_mut().map(|x| &mut x.link));
                for p in peers {
                    if let Some(new) = p.namespace.as_ref().and_then(|n| names.get(n)) {
                        p.namespace = Some(new.clone());
                    }
                }
            }
            let refs = ns
                .neighbours
                .iter_mut()
                .filter_map(|n| n.mac.as_mut())
                .chain(ns.fdb.iter_mut().map(|f| &mut f.mac));
            for mac in refs {
                if let Some((old, link)) = mac.strip_prefix('@').and_then(|m| m.split_once('/')) {
                    if let Some(new) = names.get(old) {
                        *mac = format!("@{new}/{link}");
                    }
                }
            }
        };
        rename(&mut self.net);
        for p in &mut self.pods {
            rename(p);
        }
    }
}

impl LabModel {
    /// Every namespace: underlay, nodes, pods.
    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.underlay.iter().chain(
            self.nodes
                .iter()
                .flat_map(|n| std::iter::once(&n.net).chain(n.pods.iter())),
        )
    }

    pub(crate) fn namespaces_mut(&mut self) -> impl Iterator<Item = &mut Namespace> {
        self.underlay.iter_mut().chain(
            self.nodes
                .iter_mut()
                .flat_map(|n| std::iter::once(&mut n.net).chain(n.pods.iter_mut())),
        )
    }

    /// Orders every list the same way, so that two models compare by
    /// content, not by the order the kernel or the compiler listed things.
    pub(crate) fn sort(&mut self) {
        self.underlay.sort_by(|a, b| a.name.cmp(&b.name));
        self.nodes.sort_by(|a, b| a.net.name.cmp(&b.net.name));
        for node in &mut self.nodes {
            node.pods.sort_by(|a, b| a.name.cmp(&b.name));
        }
        for ns in self.namespaces_mut() {
            ns.sort();
        }
    }
}

impl Namespace {
    fn sort(&mut self) {
        self.links.sort_by(|a, b| a.name.cmp(&b.name));
        for l in &mut self.links {
            l.addresses.sort();
            l.flags.sort();
        }
        let key = |r: &Route| (r.table, r.dst.to_string(), r.metric, format!("{r:?}"));
        self.routes.sort_by_key(key);
        self.rules
            .sort_by_key(|r| (r.v6, r.priority, format!("{r:?}")));
        self.neighbours.sort_by_key(|n| (n.dev.clone(), n.addr));
        self.fdb
            .sort_by_key(|f| (f.dev.clone(), f.mac.clone(), f.dst));
        self.nftables
            .sort_by_key(|t| (t.family.clone(), t.name.clone()));
        self.qdiscs
            .sort_by_key(|q| (q.dev.clone(), q.parent.clone()));
        self.iptables.sort_by_key(|t| (t.backend, t.family.clone()));
    }
}
