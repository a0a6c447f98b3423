//! Live namespaces read back into the model: one netlink session per
//! namespace on a dedicated thread inside it (`cnilab_net::netns::
//! netlink_job`), links, addresses, routes and neighbours through
//! `cnilab_net::nl`, plus the attributes of the same messages that the
//! model keeps (veth peers, bridge ports, VXLAN), rules, FDB entries and
//! qdiscs; sysctls from `/proc/sys` on a thread inside the namespace;
//! `nft -s list ruleset` run inside it. Namespaces are read in parallel;
//! which namespaces make a lab is a [`Layout`] (`layout.rs`).

use super::{
    Bridge, BridgePort, FdbEntry, LabModel, Link, LinkFlag, LinkKind, Lower, Namespace, Neighbour,
    Nexthop, Node, Qdisc, Route, RouteType, Rule, VethPeer, Vxlan, SCHEMA_VERSION,
};
use cnilab_net::{netns as plugin_netns, nl};
use futures_util::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use rtnetlink::packet_route::link::{
    InfoBridge, InfoBridgePort, InfoData, InfoIpVlan, InfoMacVlan, InfoPortData, InfoVxlan,
    LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute};
use rtnetlink::packet_route::route::{RouteAttribute, RouteFlags};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleFlags};
use rtnetlink::packet_route::AddressFamily;
use std::collections::BTreeMap;
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

use super::firewall;
pub(crate) use super::firewall::canonical_nft;

/// Which namespaces make the lab, by role (files of `/run/netns/<name>` or
/// `/proc/<pid>/ns/net`, opened by the caller).
pub struct Layout<'a> {
    pub name: String,
    pub underlay: Vec<(String, &'a File)>,
    pub nodes: Vec<NodeLayout<'a>>,
}

pub struct NodeLayout<'a> {
    pub name: String,
    pub ns: &'a File,
    pub pod_cidrs: Vec<IpNet>,
    pub pods: Vec<(String, &'a File)>,
}

const NUD_NOARP: u16 = 0x40;
const NUD_PERMANENT: u16 = 0x80;

/// A link as read, before veth peers are resolved across namespaces
/// (netlink here; `ip -j` text in `crate::capture::script`).
pub(crate) struct RawLink {
    pub index: u32,
    pub link: Link,
    pub controller: Option<u32>,
    /// The peer's index, and the role of its namespace (`None`: this one).
    pub peer: Option<(u32, Option<String>)>,
    pub vxlan_dev: Option<u32>,
    /// A macvlan's or ipvlan's mode.
    pub mode: Option<String>,
}

pub(crate) struct RawNamespace {
    pub ns: Namespace,
    pub links: Vec<RawLink>,
    pub warnings: Vec<String>,
}

/// Reads every namespace of `layout` into a model (sorted); what a tool
/// could not read is an error.
pub fn read(layout: &Layout) -> Result<LabModel, String> {
    let (model, warnings) = read_with_warnings(layout)?;
    match warnings.is_empty() {
        true => Ok(model),
        false => Err(warnings.join("; ")),
    }
}

/// [`read`], with what a tool could not read (a missing `nft`, legacy
/// tables without `iptables-legacy-save`) as warnings beside the model.
pub fn read_with_warnings(layout: &Layout) -> Result<(LabModel, Vec<String>), String> {
    let mut all: Vec<(String, &File)> = layout.underlay.clone();
    for n in &layout.nodes {
        all.push((n.name.clone(), n.ns));
        all.extend(n.pods.iter().cloned());
    }
    let others: Vec<(String, i32)> = all
        .iter()
        .map(|(role, f)| (role.clone(), f.as_raw_fd()))
        .collect();
    let read: Vec<Result<RawNamespace, String>> = crate::util::parallel_map(
        all.iter(),
        crate::util::A_THREAD_EACH,
        |(role, file)| read_namespace(role, file, &others),
        || Err("reader thread panicked".to_string()),
    );
    let read = read.into_iter().collect::<Result<Vec<_>, String>>()?;
    let (done, warnings) = resolve_all(read);
    Ok((assemble(layout, done), warnings))
}

/// Namespaces read apart, their veth peers, controllers and VXLAN devices
/// named across them; and their warnings.
pub(crate) fn resolve_all(read: Vec<RawNamespace>) -> (BTreeMap<String, Namespace>, Vec<String>) {
    let mut raw: BTreeMap<String, RawNamespace> = BTreeMap::new();
    let mut warnings = Vec::new();
    for mut r in read {
        warnings.append(&mut r.warnings);
        raw.insert(r.ns.name.clone(), r);
    }
    let names: BTreeMap<(String, u32), String> = raw
        .values()
        .flat_map(|r| {
            r.links
                .iter()
                .map(|l| ((r.ns.name.clone(), l.index), l.link.name.clone()))
        })
        .collect();
    let done = raw
        .into_values()
        .map(|r| (r.ns.name.clone(), resolve(r, &names)))
        .collect();
    (done, warnings)
}

/// The model of `layout` from its namespaces read and resolved (sorted).
pub(crate) fn assemble(layout: &Layout, mut done: BTreeMap<String, Namespace>) -> LabModel {
    let mut take = |role: &str| done.remove(role).unwrap_or_else(|| Namespace::new(role));
    let mut model = LabModel {
        schema_version: SCHEMA_VERSION,
        name: layout.name.clone(),
        underlay: layout.underlay.iter().map(|(r, _)| take(r)).collect(),
        nodes: layout
            .nodes
            .iter()
            .map(|n| Node {
                net: take(&n.name),
                pod_cidrs: n.pod_cidrs.clone(),
                pods: n.pods.iter().map(|(p, _)| take(p)).collect(),
            })
            .collect(),
    };
    model.sort();
    model
}

/// One namespace read alone (a tracer reads only the namespaces it
/// crosses): a veth peer in another namespace keeps its role and is named
/// `#<index>` until that namespace is read too; beside it, this namespace's
/// link names by index. `others` as for [`read`]: the namespaces a peer may
/// be in, by role. What a tool could not read is an error.
pub fn read_one(
    role: &str,
    file: &File,
    others: &[(String, i32)],
) -> Result<(Namespace, BTreeMap<u32, String>), String> {
    let raw = read_namespace(role, file, others)?;
    if !raw.warnings.is_empty() {
        return Err(raw.warnings.join("; "));
    }
    let by_index: BTreeMap<u32, String> = raw
        .links
        .iter()
        .map(|l| (l.index, l.link.name.clone()))
        .collect();
    let names = by_index
        .iter()
        .map(|(i, n)| ((role.to_string(), *i), n.clone()))
        .collect();
    let mut ns = resolve(raw, &names);
    ns.sort();
    Ok((ns, by_index))
}

/// Names instead of indexes: controllers, veth peers, VXLAN devices.
pub(crate) fn resolve(raw: RawNamespace, names: &BTreeMap<(String, u32), String>) -> Namespace {
    let me = raw.ns.name.clone();
    let local = |i: u32| names.get(&(me.clone(), i)).cloned();
    let mut ns = raw.ns;
    for r in raw.links {
        let mut link = r.link;
        link.controller = r.controller.and_then(local);
        if let Some((index, role)) = r.peer {
            let peer_ns = role.unwrap_or_else(|| me.clone());
            let peer = VethPeer {
                name: names
                    .get(&(peer_ns.clone(), index))
                    .cloned()
                    .unwrap_or_else(|| format!("#{index}")),
                namespace: Some(peer_ns),
            };
            if link.kind == LinkKind::Veth {
                link.veth = Some(peer);
            } else {
                link.lower = Some(Lower {
                    link: peer,
                    mode: r.mode,
                });
            }
        } else if link.kind == LinkKind::Veth {
            link.veth = Some(VethPeer {
                namespace: None,
                name: String::new(),
            });
        }
        if let (Some(v), Some(dev)) = (link.vxlan.as_mut(), r.vxlan_dev) {
            v.dev = local(dev);
        }
        ns.links.push(link);
    }
    ns
}

/// Reads one namespace. What a tool could not read (nft missing or
/// failing, legacy tables without `iptables-legacy-save`) is a warning, not
/// an error: [`read`] turns warnings into an error, [`read_with_warnings`]
/// (capture) keeps them.
fn read_namespace(
    role: &str,
    file: &File,
    others: &[(String, i32)],
) -> Result<RawNamespace, String> {
    let what = |e: String| format!("read namespace {role}: {e}");
    let (mut ns, links) =
        plugin_netns::netlink_job(file, |h| read_netlink(h, role, others)).map_err(what)?;
    let link_names: Vec<String> = links.iter().map(|l| l.link.name.clone()).collect();
    let (sysctls, legacy_names, nft_tables) = plugin_netns::run_in(file, || {
        (
            super::sysctl::read_sysctls(&link_names),
            firewall::legacy_table_names(),
            cnilab_net::nftnl::any_table_here(),
        )
    })
    .map_err(|e| what(e.to_string()))?;
    ns.sysctls = sysctls;
    let mut warnings = Vec::new();
    // Most pods have no table: no `nft` process for them.
    if nft_tables {
        match firewall::read_nft(file) {
            Ok(tables) => ns.nftables = tables,
            Err(e) => warnings.push(what(e)),
        }
    }
    let (iptables, more) = firewall::read_iptables(file, &legacy_names, &ns.nftables);
    ns.iptables = iptables;
    warnings.extend(more.into_iter().map(what));
    Ok(RawNamespace {
        ns,
        links,
        warnings,
    })
}

async fn read_netlink(
    h: rtnetlink::Handle,
    role: &str,
    others: &[(String, i32)],
) -> Result<(Namespace, Vec<RawLink>), rtnetlink::Error> {
    let msgs: Vec<LinkMessage> = h.link().get().execute().try_collect().await?;
    let mut links: Vec<RawLink> = msgs.iter().map(raw_link).collect();
    let addresses = nl::addresses(&h, None).await?;
    for a in addresses {
        let link_local =
            matches!(a.addr.addr(), IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
        if let Some(l) = links.iter_mut().find(|l| l.index == a.index) {
            // What the kernel gives `lo` when it comes up.
            let loopback = l.link.kind == LinkKind::Loopback
                && ["127.0.0.1/8", "::1/128"].contains(&a.addr.to_string().as_str());
            if !link_local && !loopback {
                l.link.addresses.push(a.addr);
            }
        }
    }
    // A veth's peer namespace is a netnsid of this namespace: ask which
    // of the lab's namespaces has it.
    let mut ids: BTreeMap<i32, String> = BTreeMap::new();
    let wanted: Vec<i32> = msgs.iter().filter_map(peer_netnsid).collect();
    for (other, fd) in others {
        if wanted.iter().all(|w| ids.contains_key(w)) {
            break;
        }
        if let Some(id) = netnsid_of(&h, *fd).await? {
            ids.entry(id).or_insert_with(|| other.clone());
        }
    }
    for (l, msg) in links.iter_mut().zip(&msgs) {
        if let Some((_, role)) = l.peer.as_mut() {
            if let Some(id) = peer_netnsid(msg) {
                *role = Some(
                    ids.get(&id)
                        .cloned()
                        .unwrap_or_else(|| format!("netnsid {id}")),
                );
            }
        }
    }
    let name_of = |i: u32| {
        links
            .iter()
            .find(|l| l.index == i)
            .map(|l| l.link.name.clone())
    };
    let mut ns = Namespace::new(role);
    for r in nl::all_routes(&h).await? {
        if let Some(route) = model_route(&r, &name_of) {
            ns.routes.push(route);
        }
    }
    ns.rules = read_rules(&h, &name_of).await?;
    for n in nl::neighbours(&h).await? {
        if u16::from(n.message.header.state) & NUD_PERMANENT != 0 {
            ns.neighbours.push(Neighbour {
                dev: name_of(n.index).unwrap_or_default(),
                addr: n.addr,
                mac: n.mac,
                state: "permanent".into(),
            });
        }
    }
    // `lo`'s all-zeros address is no own address: a VXLAN device's
    // default-destination entry uses it.
    let own_macs = own_macs(&links);
    ns.fdb = read_fdb(&h, &name_of, &own_macs).await?;
    ns.qdiscs = read_qdiscs(&h, &name_of).await?;
    ns.hooks = super::bpf::read(&h, &msgs, &ns.qdiscs, &name_of).await?;
    Ok((ns, links))
}

pub(crate) fn peer_netnsid(msg: &LinkMessage) -> Option<i32> {
    msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkNetNsId(id) => Some(*id),
        _ => None,
    })
}

/// RTM_GETNSID for the namespace open as `fd`: its id in this namespace,
/// `None` when it has none.
pub(crate) async fn netnsid_of(
    h: &rtnetlink::Handle,
    fd: i32,
) -> Result<Option<i32>, rtnetlink::Error> {
    use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
    use rtnetlink::packet_route::nsid::{NsidAttribute, NsidMessage};
    use rtnetlink::packet_route::RouteNetlinkMessage;
    let mut msg = NsidMessage::default();
    msg.attributes.push(NsidAttribute::Fd(fd as u32));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetNsId(msg));
    req.header.flags = NLM_F_REQUEST;
    let mut answers = h.clone().request(req)?;
    while let Some(m) = answers.next().await {
        match m.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(m)) => {
                return Ok(m.attributes.iter().find_map(|a| match a {
                    NsidAttribute::Id(id) if *id >= 0 => Some(*id),
                    _ => None,
                }));
            }
            NetlinkPayload::Error(e) => return Err(rtnetlink::Error::NetlinkError(e)),
            _ => {}
        }
    }
    Ok(None)
}

fn raw_link(msg: &LinkMessage) -> RawLink {
    let base = nl::Link::from_message(msg);
    let kind = LinkKind::from_kind(base.kind.as_deref(), &base.name);
    let mut link = Link::new(&base.name, kind, base.up);
    link.mtu = base.mtu;
    link.mac = base.mac;
    for (flag, ours) in [
        (LinkFlags::Noarp, LinkFlag::Noarp),
        (LinkFlags::Promisc, LinkFlag::Promisc),
        (LinkFlags::Allmulti, LinkFlag::Allmulti),
    ] {
        if msg.header.flags.contains(flag) {
            link.flags.push(ours);
        }
    }
    let mut peer = None;
    let mut vxlan_dev = None;
    let mut mode = None;
    let linked = matches!(
        link.kind,
        LinkKind::Veth | LinkKind::Macvlan | LinkKind::Ipvlan
    );
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::Link(i) if linked => peer = Some((*i, None)),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Data(InfoData::Vxlan(v)) => {
                            let (vx, dev) = vxlan_of(v);
                            link.vxlan = Some(vx);
                            vxlan_dev = dev;
                        }
                        LinkInfo::Data(InfoData::Bridge(b)) => link.bridge = Some(bridge_of(b)),
                        LinkInfo::PortData(InfoPortData::BridgePort(p)) => {
                            link.port = Some(port_of(p))
                        }
                        LinkInfo::Data(InfoData::MacVlan(m)) => {
                            mode = m.iter().find_map(|a| match a {
                                InfoMacVlan::Mode(m) => Some(m.to_string()),
                                _ => None,
                            })
                        }
                        LinkInfo::Data(InfoData::IpVlan(m)) => {
                            mode = m.iter().find_map(|a| match a {
                                InfoIpVlan::Mode(m) => Some(m.to_string()),
                                _ => None,
                            })
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    RawLink {
        index: base.index,
        link,
        controller: base.controller,
        peer,
        vxlan_dev,
        mode,
    }
}

fn vxlan_of(attrs: &[InfoVxlan]) -> (Vxlan, Option<u32>) {
    let mut v = Vxlan {
        vni: 0,
        local: None,
        port: 0,
        dev: None,
        learning: false,
    };
    let mut dev = None;
    for a in attrs {
        match a {
            InfoVxlan::Id(id) => v.vni = *id,
            InfoVxlan::Local(ip) => v.local = Some(IpAddr::V4(*ip)),
            InfoVxlan::Local6(ip) => v.local = Some(IpAddr::V6(*ip)),
            InfoVxlan::Port(p) => v.port = *p,
            InfoVxlan::Learning(l) => v.learning = *l,
            InfoVxlan::Link(i) => dev = Some(*i),
            _ => {}
        }
    }
    (v, dev)
}

fn bridge_of(attrs: &[InfoBridge]) -> Bridge {
    use rtnetlink::packet_route::link::BridgeStpState;
    let mut b = Bridge::default();
    for a in attrs {
        match a {
            InfoBridge::StpState(s) => b.stp = *s != BridgeStpState::Disabled,
            InfoBridge::VlanFiltering(f) => b.vlan_filtering = *f,
            _ => {}
        }
    }
    b
}

fn port_of(attrs: &[InfoBridgePort]) -> BridgePort {
    let mut p = BridgePort {
        hairpin: false,
        isolated: false,
        learning: false,
        state: None,
    };
    for a in attrs {
        match a {
            InfoBridgePort::HairpinMode(v) => p.hairpin = *v,
            InfoBridgePort::Isolated(v) => p.isolated = *v,
            InfoBridgePort::Learning(v) => p.learning = *v,
            InfoBridgePort::State(s) => p.state = Some(format!("{s:?}").to_lowercase()),
            _ => {}
        }
    }
    p
}

/// `RTPROT_*` as `ip route` names them (others: the number).
pub(crate) const PROTOCOLS: &[(u8, &str)] = &[
    (2, "kernel"),
    (3, "boot"),
    (4, "static"),
    (9, "ra"),
    (11, "zebra"),
    (12, "bird"),
    (16, "dhcp"),
    (186, "bgp"),
    (188, "ospf"),
];

/// `RT_SCOPE_*` as `ip route` names them (others: the number).
pub(crate) const SCOPES: &[(u8, &str)] = &[
    (0, "universe"),
    (200, "site"),
    (253, "link"),
    (254, "host"),
    (255, "nowhere"),
];

fn named(table: &[(u8, &str)], n: u8) -> String {
    table
        .iter()
        .find(|(k, _)| *k == n)
        .map_or_else(|| n.to_string(), |(_, name)| name.to_string())
}

pub(crate) fn proto_name(p: u8) -> String {
    named(PROTOCOLS, p)
}

pub(crate) fn scope_name(s: u8) -> String {
    named(SCOPES, s)
}

/// The model's route, or `None` for what the kernel makes from addresses
/// (the local table, local/broadcast/multicast types, protocol kernel).
fn model_route(r: &nl::Route, name_of: &impl Fn(u32) -> Option<String>) -> Option<Route> {
    let h = &r.message.header;
    let kind = kept_route(u8::from(h.kind), r.table, r.protocol)?;
    let mut src = None;
    let mut nexthops = Vec::new();
    for a in &r.message.attributes {
        match a {
            RouteAttribute::PrefSource(a) => src = route_ip(a),
            RouteAttribute::MultiPath(hops) => {
                for hop in hops {
                    let gateway = hop.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Gateway(g) => route_ip(g),
                        _ => None,
                    });
                    nexthops.push(Nexthop {
                        gateway,
                        dev: name_of(hop.interface_index),
                        weight: u16::from(hop.hops) + 1,
                        onlink: hop
                            .flags
                            .contains(rtnetlink::packet_route::route::RouteNextHopFlags::Onlink),
                    });
                }
            }
            _ => {}
        }
    }
    Some(Route {
        table: r.table,
        kind,
        dst: r.dst,
        gateway: r.gateway,
        dev: r.oif.and_then(name_of),
        onlink: h.flags.contains(RouteFlags::Onlink),
        scope: scope_name(u8::from(h.scope)),
        proto: proto_name(r.protocol),
        metric: r.priority,
        src,
        nexthops,
    })
}

/// The model's type of a route of kernel type `kind` (`RTN_*`) in `table`
/// made by `protocol`, or `None` for what the kernel makes from addresses
/// (the local table, local/broadcast/multicast types, protocol kernel).
pub(crate) fn kept_route(kind: u8, table: u32, protocol: u8) -> Option<RouteType> {
    let kind = match kind {
        1 => RouteType::Unicast,
        6 => RouteType::Blackhole,
        7 => RouteType::Unreachable,
        8 => RouteType::Prohibit,
        9 => RouteType::Throw,
        _ => return None,
    };
    (table != 255 && protocol != 2).then_some(kind)
}

fn route_ip(a: &rtnetlink::packet_route::route::RouteAddress) -> Option<IpAddr> {
    use rtnetlink::packet_route::route::RouteAddress;
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// Policy rules of both families, without the kernel's default ones.
async fn read_rules(
    h: &rtnetlink::Handle,
    name_of: &impl Fn(u32) -> Option<String>,
) -> Result<Vec<Rule>, rtnetlink::Error> {
    let _ = name_of;
    let mut out = Vec::new();
    for version in [rtnetlink::IpVersion::V4, rtnetlink::IpVersion::V6] {
        let msgs: Vec<_> = h.rule().get(version).execute().try_collect().await?;
        for m in msgs {
            let v6 = m.header.family == AddressFamily::Inet6;
            let mut rule = Rule {
                priority: 0,
                v6,
                src: None,
                dst: None,
                iif: None,
                oif: None,
                fwmark: None,
                fwmask: None,
                invert: m.header.flags.contains(RuleFlags::Invert),
                action: match m.header.action {
                    RuleAction::ToTable => "lookup".into(),
                    RuleAction::Goto => "goto".into(),
                    RuleAction::Nop => "nop".into(),
                    RuleAction::Blackhole => "blackhole".into(),
                    RuleAction::Unreachable => "unreachable".into(),
                    RuleAction::Prohibit => "prohibit".into(),
                    other => format!("{other:?}").to_lowercase(),
                },
                table: u32::from(m.header.table),
            };
            let mut kernel = false;
            for a in &m.attributes {
                match a {
                    RuleAttribute::Priority(p) => rule.priority = *p,
                    RuleAttribute::Source(ip) => rule.src = IpNet::new(*ip, m.header.src_len).ok(),
                    RuleAttribute::Destination(ip) => {
                        rule.dst = IpNet::new(*ip, m.header.dst_len).ok()
                    }
                    RuleAttribute::Iifname(n) => rule.iif = Some(n.clone()),
                    RuleAttribute::Oifname(n) => rule.oif = Some(n.clone()),
                    RuleAttribute::FwMark(v) => rule.fwmark = Some(*v),
                    RuleAttribute::FwMask(v) => rule.fwmask = Some(*v),
                    RuleAttribute::Table(t) => rule.table = *t,
                    RuleAttribute::Protocol(p) => kernel = u8::from(*p) == 2,
                    _ => {}
                }
            }
            if !kernel {
                out.push(rule);
            }
        }
    }
    Ok(out)
}

/// Every FDB entry of the namespace (AF_BRIDGE neighbours), as the kernel
/// gives them: learned ones too.
pub(crate) async fn fdb_messages(
    h: &rtnetlink::Handle,
) -> Result<Vec<rtnetlink::packet_route::neighbour::NeighbourMessage>, rtnetlink::Error> {
    h.neighbours()
        .get()
        .set_address_family(AddressFamily::Bridge)
        .execute()
        .try_collect()
        .await
}

/// Bridge and VXLAN forwarding entries that configuration made: permanent
/// or static, not multicast, not a link's own address of this namespace.
async fn read_fdb(
    h: &rtnetlink::Handle,
    name_of: &impl Fn(u32) -> Option<String>,
    own_macs: &[String],
) -> Result<Vec<FdbEntry>, rtnetlink::Error> {
    let msgs = fdb_messages(h).await?;
    let mut out = Vec::new();
    for m in msgs {
        // A VXLAN entry may carry several NUD bits at once.
        let bits = u16::from(m.header.state);
        let state = if bits & NUD_PERMANENT != 0 {
            "permanent"
        } else if bits & NUD_NOARP != 0 {
            "static"
        } else {
            continue;
        };
        let mut mac = None;
        let mut dst = None;
        for a in &m.attributes {
            match a {
                NeighbourAttribute::LinkLayerAddress(b) => mac = Some(nl::mac_string(b)),
                NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                    dst = Some(IpAddr::V4(*v4))
                }
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                    dst = Some(IpAddr::V6(*v6))
                }
                // In an AF_BRIDGE message the VTEP comes as raw bytes.
                NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                    dst = match b.len() {
                        4 => <[u8; 4]>::try_from(b.as_slice()).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(b.as_slice()).ok().map(IpAddr::from),
                        _ => None,
                    }
                }
                _ => {}
            }
        }
        let Some(mac) = mac else { continue };
        if !fdb_kept(&mac, own_macs) {
            continue;
        }
        out.push(FdbEntry {
            dev: name_of(m.header.ifindex).unwrap_or_default(),
            mac,
            dst,
            state: state.into(),
        });
    }
    Ok(out)
}

/// Whether an FDB entry for `mac` is configuration's: not multicast, not
/// one of the namespace's own link addresses (`lo`'s left out of them).
pub(crate) fn fdb_kept(mac: &str, own_macs: &[String]) -> bool {
    let multicast = u8::from_str_radix(mac.get(..2).unwrap_or("00"), 16).unwrap_or(0) & 1 == 1;
    !multicast && !own_macs.iter().any(|m| m == mac)
}

/// The addresses an FDB entry may not be (see [`fdb_kept`]).
pub(crate) fn own_macs(links: &[RawLink]) -> Vec<String> {
    links
        .iter()
        .filter(|l| l.link.kind != LinkKind::Loopback)
        .filter_map(|l| l.link.mac.clone())
        .collect()
}

/// Qdiscs with a handle (the ones the kernel attaches by itself have none).
async fn read_qdiscs(
    h: &rtnetlink::Handle,
    name_of: &impl Fn(u32) -> Option<String>,
) -> Result<Vec<Qdisc>, rtnetlink::Error> {
    use rtnetlink::packet_route::tc::{TcAttribute, TcHandle};
    let msgs: Vec<_> = h.qdisc().get().execute().try_collect().await?;
    let mut out = Vec::new();
    for m in msgs {
        if m.header.handle == TcHandle::UNSPEC {
            continue;
        }
        let kind = m
            .attributes
            .iter()
            .find_map(|a| match a {
                TcAttribute::Kind(k) => Some(k.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let parent = if m.header.parent == TcHandle::ROOT {
            "root".to_string()
        } else {
            format!("{:x}:{:x}", m.header.parent.major, m.header.parent.minor)
        };
        out.push(Qdisc {
            dev: u32::try_from(m.header.index)
                .ok()
                .and_then(name_of)
                .unwrap_or_default(),
            kind,
            handle: format!("{:x}:", m.header.handle.major),
            parent,
        });
    }
    Ok(out)
}
