//! Netlink readers and small writers shared by the plugin, the harness and
//! the agent: one [`Link`], one [`Address`] and one [`Route`] type. Every
//! function takes a handle that is already bound to the namespace it should
//! act in (see `netns::connect`, or `Netns::netlink`).

use futures_util::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteType,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Error, Handle, RouteMessageBuilder};
use std::fmt;
use std::net::IpAddr;

/// A network interface as netlink reports it: the one link type of cnilab
/// (the plugin, the agent, the harness and their reports all use it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `aa:bb:cc:dd:ee:ff`, lower case; `None` when the link has no
    /// hardware address.
    pub mac: Option<String>,
    pub mtu: Option<u32>,
    pub up: bool,
    /// Index of the bridge (or other controller) the link is enslaved to.
    /// Serialized as `master`, the name reports have always used.
    #[serde(rename = "master")]
    pub controller: Option<u32>,
    /// `veth`, `bridge`, ... (`None` for plain devices such as `lo`).
    pub kind: Option<String>,
    /// `IFLA_IFALIAS` (cnilab-bridge keeps its ownership mark there).
    #[serde(skip)]
    pub alias: Option<String>,
}

impl Link {
    /// The fields of a link message (`RTM_NEWLINK`).
    pub fn from_message(msg: &LinkMessage) -> Link {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            mac: None,
            mtu: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            controller: None,
            kind: None,
            alias: None,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::Address(a) => link.mac = Some(mac_string(a)),
                LinkAttribute::Mtu(m) => link.mtu = Some(*m),
                LinkAttribute::Controller(c) => link.controller = Some(*c),
                LinkAttribute::IfAlias(a) if !a.is_empty() => link.alias = Some(a.clone()),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        if let LinkInfo::Kind(kind) = info {
                            link.kind = Some(kind.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }
}

/// `aa:bb:cc:dd:ee:ff`, lower case, like the kernel and CNI results print it.
pub fn mac_string(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The errno carried by a netlink error, if any (positive, e.g. `libc ENODEV`).
pub fn errno(err: &Error) -> Option<i32> {
    match err {
        Error::NetlinkError(msg) => Some(msg.raw_code().abs()),
        _ => None,
    }
}

/// True when the error means "no such object" (link, address or route).
pub fn is_not_found(err: &Error) -> bool {
    matches!(errno(err), Some(e) if e == nix::libc::ENODEV || e == nix::libc::ENOENT || e == nix::libc::ESRCH || e == nix::libc::EADDRNOTAVAIL)
}

/// True when the error means "already exists".
pub fn is_exists(err: &Error) -> bool {
    errno(err) == Some(nix::libc::EEXIST)
}

/// The link called `name`, or `None`.
pub async fn link_by_name(handle: &Handle, name: &str) -> Result<Option<Link>, Error> {
    let mut stream = handle.link().get().match_name(name.to_string()).execute();
    match stream.try_next().await {
        Ok(Some(msg)) => Ok(Some(Link::from_message(&msg))),
        Ok(None) => Ok(None),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Creates a link (`RTM_NEWLINK`, create-exclusive) and returns the link as
/// the kernel made it, from its echo (`NLM_F_ECHO`): the MAC of a new veth
/// without a lookup. `None` when the kernel sends no echo (before 6.2).
pub async fn add_link_echo(handle: &Handle, msg: LinkMessage) -> Result<Option<Link>, Error> {
    use futures_util::StreamExt;
    use rtnetlink::packet_core::{
        NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL,
        NLM_F_REQUEST,
    };
    use rtnetlink::packet_route::RouteNetlinkMessage;
    let name = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    });
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewLink(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO;
    let mut response = handle.clone().request(req)?;
    let mut made = None;
    while let Some(reply) = response.next().await {
        match reply.payload {
            NetlinkPayload::Error(err) => return Err(Error::NetlinkError(err)),
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
                let link = Link::from_message(&link);
                if name.as_ref().is_none_or(|n| *n == link.name) {
                    made = Some(link);
                }
            }
            _ => {}
        }
    }
    Ok(made)
}

/// Every link in the namespace.
pub async fn links(handle: &Handle) -> Result<Vec<Link>, Error> {
    let msgs: Vec<LinkMessage> = handle.link().get().execute().try_collect().await?;
    Ok(msgs.iter().map(Link::from_message).collect())
}

/// An address configured on a link.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Address {
    pub index: u32,
    pub addr: IpNet,
    /// The kernel's message (what deletes the address).
    #[serde(skip)]
    pub message: AddressMessage,
}

/// Addresses of one link (or of all links when `index` is `None`).
pub async fn addresses(handle: &Handle, index: Option<u32>) -> Result<Vec<Address>, Error> {
    addresses_of_family(handle, index, None).await
}

/// [`addresses`] of one family only (`Some(true)`: IPv6, `Some(false)`:
/// IPv4), asked of the kernel: a link's IPv4 addresses without every veth's
/// IPv6 link-local address in the dump.
pub async fn addresses_of_family(
    handle: &Handle,
    index: Option<u32>,
    v6: Option<bool>,
) -> Result<Vec<Address>, Error> {
    let mut req = handle.address().get();
    if let Some(v6) = v6 {
        req.message_mut().header.family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
    }
    if let Some(i) = index {
        // In the header too: a socket with strict checking (see
        // `netns::connect_strict`) has the kernel filter by it.
        req.message_mut().header.index = i;
        req = req.set_link_index_filter(i);
    }
    let msgs: Vec<AddressMessage> = req.execute().try_collect().await?;
    let mut out = Vec::new();
    for msg in msgs {
        if index.is_some_and(|i| i != msg.header.index) {
            continue;
        }
        let mut local = None;
        let mut address = None;
        for attr in &msg.attributes {
            match attr {
                AddressAttribute::Local(a) => local = Some(*a),
                AddressAttribute::Address(a) => address = Some(*a),
                _ => {}
            }
        }
        // IFA_LOCAL is the interface's own address on point-to-point links.
        if let Some(ip) = local.or(address) {
            if let Ok(net) = IpNet::new(ip, msg.header.prefix_len) {
                out.push(Address {
                    index: msg.header.index,
                    addr: net,
                    message: msg.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// A route from any table: the one route type of cnilab.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Route {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: u32,
    /// `RTPROT_*` (the agent marks its routes with its own number).
    #[serde(skip)]
    pub protocol: u8,
    /// `RTA_PRIORITY` (the metric), 0 when absent.
    #[serde(skip)]
    pub priority: u32,
    /// A unicast route (not local, broadcast, blackhole, ...).
    #[serde(skip)]
    pub unicast: bool,
    /// The kernel's message (what deletes or restores the route).
    #[serde(skip)]
    pub message: RouteMessage,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dst)?;
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " oif {oif}")?;
        }
        write!(f, " table {}", self.table)
    }
}

/// The main routing table's number (`RT_TABLE_MAIN`).
pub const MAIN_TABLE: u32 = RouteHeader::RT_TABLE_MAIN as u32;

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

impl Route {
    /// A unicast main-table route `dst [via gateway]` as a plain value (for
    /// plans and tests: it has no kernel message).
    pub fn new(dst: IpNet, gateway: Option<IpAddr>) -> Route {
        Route {
            dst,
            gateway,
            oif: None,
            table: MAIN_TABLE,
            protocol: 0,
            priority: 0,
            unicast: true,
            message: RouteMessage::default(),
        }
    }

    /// The fields of a route message (`RTM_NEWROUTE`); `None` for families
    /// other than IPv4 and IPv6 or an impossible prefix.
    pub fn from_message(msg: &RouteMessage) -> Option<Route> {
        let mut dst = None;
        let mut gateway = None;
        let mut oif = None;
        let mut priority = 0;
        let mut table = u32::from(msg.header.table);
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Destination(a) => dst = route_addr(a),
                RouteAttribute::Gateway(a) => gateway = route_addr(a),
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Priority(p) => priority = *p,
                _ => {}
            }
        }
        let dst = match (dst, msg.header.address_family) {
            (Some(addr), _) => addr,
            (None, AddressFamily::Inet) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            (None, AddressFamily::Inet6) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            (None, _) => return None,
        };
        let dst = IpNet::new(dst, msg.header.destination_prefix_length).ok()?;
        Some(Route {
            dst,
            gateway,
            oif,
            table,
            protocol: u8::from(msg.header.protocol),
            priority,
            unicast: msg.header.kind == RouteType::Unicast,
            message: msg.clone(),
        })
    }
}

/// Routes of every table for one family.
pub async fn routes(handle: &Handle, v6: bool) -> Result<Vec<Route>, Error> {
    let query = if v6 {
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()
    } else {
        RouteMessageBuilder::<std::net::Ipv4Addr>::new().build()
    };
    let msgs: Vec<RouteMessage> = handle.route().get(query).execute().try_collect().await?;
    Ok(msgs.iter().filter_map(Route::from_message).collect())
}

/// Routes of both families, every table (IPv4 first).
pub async fn all_routes(handle: &Handle) -> Result<Vec<Route>, Error> {
    let mut out = routes(handle, false).await?;
    out.extend(routes(handle, true).await?);
    Ok(out)
}

/// Builds a unicast route message `dst [via gw] [dev oif]` in the main table.
pub fn route_message(
    dst: IpNet,
    gw: Option<IpAddr>,
    oif: Option<u32>,
    protocol: Option<u8>,
) -> Result<RouteMessage, String> {
    let mut builder = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dst.network(), dst.prefix_len())
        .map_err(|e| format!("route to {dst}: {e:?}"))?;
    if let Some(gw) = gw {
        builder = builder
            .gateway(gw)
            .map_err(|e| format!("route to {dst} via {gw}: {e:?}"))?;
    }
    if let Some(oif) = oif {
        builder = builder.output_interface(oif);
    }
    if let Some(p) = protocol {
        builder = builder.protocol(RouteProtocol::from(p));
    }
    Ok(builder.build())
}

/// A veth pair `name` (here) and `peer` (created directly inside the
/// namespace `peer_ns`, so a half-made pair never shows up in the wrong
/// namespace), with `name` enslaved to `controller` and up.
pub fn veth_message(
    name: &str,
    peer: &str,
    peer_ns: &std::fs::File,
    mtu: Option<u32>,
    controller: Option<u32>,
) -> LinkMessage {
    use rtnetlink::packet_route::link::{InfoData, InfoVeth};
    use std::os::fd::AsRawFd;
    let mut peer_msg = rtnetlink::LinkUnspec::new_with_name(peer).setns_by_fd(peer_ns.as_raw_fd());
    let mut builder = rtnetlink::LinkVeth::new(name, peer);
    if let Some(mtu) = mtu {
        peer_msg = peer_msg.mtu(mtu);
        builder = builder.mtu(mtu);
    }
    builder = builder.set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg.build())));
    if let Some(c) = controller {
        builder = builder.controller(c);
    }
    builder.up().build()
}

/// Brings a link up.
pub async fn set_up(handle: &Handle, index: u32) -> Result<(), Error> {
    handle
        .link()
        .set(rtnetlink::LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
}

/// Sets the alias (`IFLA_IFALIAS`) of the link called `name`, in one
/// request (no lookup of its index first).
pub async fn set_alias_by_name(handle: &Handle, name: &str, alias: &str) -> Result<(), Error> {
    let msg = rtnetlink::LinkUnspec::new_with_name(name)
        .append_extra_attribute(LinkAttribute::IfAlias(alias.to_string()))
        .build();
    handle.link().set(msg).execute().await
}

/// Sets a link's alias (`IFLA_IFALIAS`) and, with `up`, brings it up in
/// the same request.
pub async fn set_alias(handle: &Handle, index: u32, alias: &str, up: bool) -> Result<(), Error> {
    let mut builder = rtnetlink::LinkUnspec::new_with_index(index)
        .append_extra_attribute(LinkAttribute::IfAlias(alias.to_string()));
    if up {
        builder = builder.up();
    }
    handle.link().set(builder.build()).execute().await
}

/// Adds an address (IPv6 without duplicate address detection: addresses
/// cnilab hands out are unique by construction, and DAD would keep them
/// unusable for a second). An address that is already there is not an error.
pub async fn add_address(handle: &Handle, index: u32, net: IpNet) -> Result<(), Error> {
    let mut req = handle.address().add(index, net.addr(), net.prefix_len());
    if net.addr().is_ipv6() {
        req.message_mut().attributes.push(AddressAttribute::Flags(
            rtnetlink::packet_route::address::AddressFlags::Nodad,
        ));
    }
    match req.execute().await {
        Err(e) if is_exists(&e) => Ok(()),
        other => other,
    }
}

/// Adds (or, with `replace`, replaces) a route.
pub async fn add_route(handle: &Handle, msg: RouteMessage, replace: bool) -> Result<(), Error> {
    let req = handle.route().add(msg);
    if replace {
        req.replace().execute().await
    } else {
        req.execute().await
    }
}

/// Deletes a link by index; a link that is already gone is not an error.
pub async fn delete_link(handle: &Handle, index: u32) -> Result<(), Error> {
    match handle.link().del(index).execute().await {
        Err(e) if is_not_found(&e) => Ok(()),
        other => other,
    }
}

/// Deletes a link by name in one request (RTM_DELLINK with IFLA_IFNAME);
/// absent is not an error. Returns whether it existed.
pub async fn delete_link_by_name(handle: &Handle, name: &str) -> Result<bool, Error> {
    let msg = rtnetlink::LinkUnspec::new_with_name(name).build();
    match handle.link().del_with_message(msg).execute().await {
        Ok(()) => Ok(true),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes the address `addr` from link `index`. Returns whether it was there.
pub async fn delete_address(handle: &Handle, index: u32, addr: IpNet) -> Result<bool, Error> {
    let found: Vec<Address> = addresses(handle, Some(index))
        .await?
        .into_iter()
        .filter(|a| a.addr == addr)
        .collect();
    for a in &found {
        handle.address().del(a.message.clone()).execute().await?;
    }
    Ok(!found.is_empty())
}

/// Main-table routes of both families, with their messages, so that they
/// can be put back with [`restore_routes`].
pub async fn main_routes(handle: &Handle) -> Result<Vec<Route>, Error> {
    let mut all = all_routes(handle).await?;
    all.retain(|r| r.table == MAIN_TABLE);
    Ok(all)
}

/// Deletes main-table routes to `dst`. Returns how many.
pub async fn delete_routes(handle: &Handle, dst: IpNet) -> Result<usize, Error> {
    let found: Vec<Route> = main_routes(handle)
        .await?
        .into_iter()
        .filter(|r| r.dst == dst)
        .collect();
    for r in &found {
        handle.route().del(r.message.clone()).execute().await?;
    }
    Ok(found.len())
}

/// Re-adds routes (from [`main_routes`]); routes that already exist are
/// left alone.
pub async fn restore_routes(handle: &Handle, routes: Vec<Route>) -> Result<(), Error> {
    for route in routes {
        let mut msg = route.message;
        // Kernel-generated (proto kernel) routes come back with their
        // address; re-adding them would only fail.
        msg.attributes
            .retain(|a| !matches!(a, RouteAttribute::CacheInfo(_) | RouteAttribute::Table(_)));
        match handle.route().add(msg).execute().await {
            Err(e) if is_exists(&e) => {}
            other => other?,
        }
    }
    Ok(())
}

/// A neighbour (ARP/NDP) entry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Neighbour {
    pub addr: IpAddr,
    /// `aa:bb:cc:dd:ee:ff`; `None` while unresolved.
    pub mac: Option<String>,
    /// The link it is on.
    pub index: u32,
    /// The kernel's message (what deletes the entry).
    #[serde(skip)]
    pub message: NeighbourMessage,
}

/// Every neighbour entry with an IP address.
pub async fn neighbours(handle: &Handle) -> Result<Vec<Neighbour>, Error> {
    let msgs: Vec<NeighbourMessage> = handle.neighbours().get().execute().try_collect().await?;
    let mut out = Vec::new();
    for msg in msgs {
        let mut addr = None;
        let mut mac = None;
        for a in &msg.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                    addr = Some(IpAddr::V4(*v4))
                }
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                    addr = Some(IpAddr::V6(*v6))
                }
                NeighbourAttribute::LinkLayerAddress(bytes) => mac = Some(mac_string(bytes)),
                _ => {}
            }
        }
        if let Some(addr) = addr {
            out.push(Neighbour {
                addr,
                mac,
                index: msg.header.ifindex,
                message: msg,
            });
        }
    }
    Ok(out)
}
