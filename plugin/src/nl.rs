//! Netlink readers and small writers shared by the plugin, the harness and
//! the agent. Every function takes a handle that is already bound to the
//! namespace it should act in (see `netns::connect`).

use futures_util::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Error, Handle, RouteMessageBuilder};
use std::net::IpAddr;

/// What cnilab needs to know about a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: String,
    pub mtu: u32,
    pub up: bool,
    /// Index of the bridge (or other controller) the link is enslaved to.
    pub controller: Option<u32>,
    /// `veth`, `bridge`, ... (`None` for plain devices such as `lo`).
    pub kind: Option<String>,
    /// `IFLA_IFALIAS` (cnilab-bridge keeps its ownership mark there).
    pub alias: Option<String>,
}

impl Link {
    fn from_message(msg: &LinkMessage) -> Link {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            mac: String::new(),
            mtu: 0,
            up: msg.header.flags.contains(LinkFlags::Up),
            controller: None,
            kind: None,
            alias: None,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::Address(a) => link.mac = mac_string(a),
                LinkAttribute::Mtu(m) => link.mtu = *m,
                LinkAttribute::Controller(c) => link.controller = Some(*c),
                LinkAttribute::IfAlias(a) if !a.is_empty() => link.alias = Some(a.clone()),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        if let LinkInfo::Kind(kind) = info {
                            link.kind = Some(kind_name(kind));
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }
}

fn kind_name(kind: &InfoKind) -> String {
    match kind {
        InfoKind::Veth => "veth".into(),
        InfoKind::Bridge => "bridge".into(),
        InfoKind::Dummy => "dummy".into(),
        other => format!("{other:?}").to_lowercase(),
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

/// Every link in the namespace.
pub async fn links(handle: &Handle) -> Result<Vec<Link>, Error> {
    let msgs: Vec<LinkMessage> = handle.link().get().execute().try_collect().await?;
    Ok(msgs.iter().map(Link::from_message).collect())
}

/// An address configured on a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    pub index: u32,
    pub addr: IpNet,
    pub message: AddressMessage,
}

/// Addresses of one link (or of all links when `index` is `None`).
pub async fn addresses(handle: &Handle, index: Option<u32>) -> Result<Vec<Address>, Error> {
    let mut req = handle.address().get();
    if let Some(i) = index {
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

/// A route as cnilab sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteEntry {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: u32,
    pub protocol: u8,
    pub message: RouteMessage,
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn protocol_number(p: RouteProtocol) -> u8 {
    u8::from(p)
}

/// Routes of the main table (and others) for one family.
pub async fn routes(handle: &Handle, v6: bool) -> Result<Vec<RouteEntry>, Error> {
    let query = if v6 {
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()
    } else {
        RouteMessageBuilder::<std::net::Ipv4Addr>::new().build()
    };
    let msgs: Vec<RouteMessage> = handle.route().get(query).execute().try_collect().await?;
    let mut out = Vec::new();
    for msg in msgs {
        let family_v6 = msg.header.address_family == AddressFamily::Inet6;
        let mut dst = None;
        let mut gw = None;
        let mut oif = None;
        let mut table = u32::from(msg.header.table);
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Destination(a) => dst = route_addr(a),
                RouteAttribute::Gateway(a) => gw = route_addr(a),
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Table(t) => table = *t,
                _ => {}
            }
        }
        let dst_ip = dst.unwrap_or(if family_v6 {
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        });
        if let Ok(net) = IpNet::new(dst_ip, msg.header.destination_prefix_length) {
            out.push(RouteEntry {
                dst: net,
                gw,
                oif,
                table,
                protocol: protocol_number(msg.header.protocol),
                message: msg.clone(),
            });
        }
    }
    Ok(out)
}

/// Routes of both families in the main table.
pub async fn all_routes(handle: &Handle) -> Result<Vec<RouteEntry>, Error> {
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
