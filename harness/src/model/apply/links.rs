//! Links: made namespace by namespace (step 2 of `apply`), then their
//! attributes, addresses and admin state in each namespace (step 3).

use super::{object_error, ApplyError, NotMade, Target};
use crate::model::{Link, LinkFlag, LinkKind};
use crate::netns::Netns;
use cnilab_net::nl;
use rtnetlink::packet_route::link::{BridgeStpState, IpVlanMode, LinkMessage, MacVlanMode};
use rtnetlink::{
    LinkBridge, LinkBridgePort, LinkDummy, LinkIpVlan, LinkMacVlan, LinkUnspec, LinkVeth, LinkVxlan,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::fd::AsRawFd;

/// The links made, as `(namespace, link)`; `lo` counts as made.
pub(super) type Made = BTreeSet<(String, String)>;

const EOPNOTSUPP: i32 = 95;

/// What making a link takes: a request in some namespace.
struct Request {
    /// The namespace the request is sent in (a macvlan's lower's).
    from: String,
    /// Both ends of a veth, or the one link.
    names: Vec<(String, String)>,
    msg: LinkMessage,
    /// The link whose index `msg` still needs (VXLAN `dev`, the lower).
    needs: Option<(String, Kind)>,
    what: String,
}

#[derive(Clone, Copy)]
enum Kind {
    VxlanDev,
    Lower,
}

/// Step 2: every link of every target, in the targets' order.
pub(super) fn make(
    targets: &[Target],
    by_role: &BTreeMap<&str, &Netns>,
    not_made: &mut Vec<NotMade>,
) -> Result<Made, ApplyError> {
    let mut made = Made::new();
    for t in targets {
        let ns = &t.model.name;
        let mut links: Vec<&Link> = t.model.links.iter().collect();
        links.sort_by_key(|l| order(&l.kind));
        let mut requests = Vec::new();
        let mut planned = Made::new();
        for l in links {
            let key = (ns.clone(), l.name.clone());
            if made.contains(&key) || planned.contains(&key) {
                continue;
            }
            if l.kind == LinkKind::Loopback {
                made.insert((ns.clone(), l.name.clone()));
                continue;
            }
            match request(t, l, by_role) {
                Ok(r) => {
                    // A veth's other end here is made with it.
                    planned.extend(r.names.iter().cloned());
                    requests.push(r)
                }
                Err(reason) => not_made.push(NotMade {
                    namespace: ns.clone(),
                    object: format!("link {}", l.name),
                    reason,
                }),
            }
        }
        for r in requests {
            let netns = by_role
                .get(r.from.as_str())
                .ok_or_else(|| object_error(ns, &r.what, "no namespace to make it from"))?;
            let Request {
                msg,
                needs,
                what,
                names,
                ..
            } = r;
            let sent = netns.netlink(|h| async move { send(&h, msg, needs).await });
            match sent {
                Ok(Ok(())) => made.extend(names),
                Ok(Err(reason)) => not_made.push(NotMade {
                    namespace: ns.clone(),
                    object: what,
                    reason,
                }),
                Err(e) => return Err(object_error(ns, what, e)),
            }
        }
    }
    Ok(made)
}

/// Sends a link request; `Ok(Err)` is a kind the kernel does not have.
async fn send(
    h: &rtnetlink::Handle,
    mut msg: LinkMessage,
    needs: Option<(String, Kind)>,
) -> Result<Result<(), String>, rtnetlink::Error> {
    use rtnetlink::packet_route::link::{InfoData, InfoVxlan, LinkAttribute, LinkInfo};
    if let Some((name, kind)) = needs {
        let Some(dev) = nl::link_by_name(h, &name).await? else {
            return Ok(Err(format!("its device {name} was not made")));
        };
        match kind {
            Kind::Lower => msg.attributes.push(LinkAttribute::Link(dev.index)),
            Kind::VxlanDev => {
                for a in &mut msg.attributes {
                    if let LinkAttribute::LinkInfo(infos) = a {
                        for i in infos {
                            if let LinkInfo::Data(InfoData::Vxlan(v)) = i {
                                v.push(InfoVxlan::Link(dev.index));
                            }
                        }
                    }
                }
            }
        }
    }
    match h.link().add(msg).execute().await {
        Err(e) if nl::errno(&e) == Some(EOPNOTSUPP) => Ok(Err(
            "this kernel does not have the link kind (EOPNOTSUPP)".into(),
        )),
        other => other.map(Ok),
    }
}

/// The order links are made in (a link's controller, `dev` and lower first).
pub(super) fn order(kind: &LinkKind) -> u8 {
    match kind {
        LinkKind::Loopback => 0,
        LinkKind::Bridge => 1,
        LinkKind::Dummy => 2,
        LinkKind::Veth => 3,
        LinkKind::Vxlan => 4,
        LinkKind::Macvlan | LinkKind::Ipvlan => 5,
        LinkKind::Device | LinkKind::Other(_) => 6,
    }
}

/// The request that makes `l` in `t`, or why it cannot be made here.
fn request(t: &Target, l: &Link, by_role: &BTreeMap<&str, &Netns>) -> Result<Request, String> {
    let ns = t.model.name.clone();
    let one = |msg: LinkMessage, needs: Option<(String, Kind)>| Request {
        from: ns.clone(),
        names: vec![(ns.clone(), l.name.clone())],
        msg,
        needs,
        what: format!("link {}", l.name),
    };
    match &l.kind {
        LinkKind::Bridge => {
            // Made down, like every link: `up` comes last, and only for a
            // link the model holds up (rtnetlink's `LinkBridge::new` sets
            // the bridge up as it makes it, so a bridge captured down came
            // back up, and a fault with it).
            let mut b = rtnetlink::LinkMessageBuilder::<LinkBridge>::new(&l.name);
            let opts = l.bridge.clone().unwrap_or_default();
            if opts.stp {
                b = b.stp_state(BridgeStpState::KernelStp);
            }
            if opts.vlan_filtering {
                b = b.vlan_filtering(true);
            }
            Ok(one(b.build(), None))
        }
        LinkKind::Dummy => Ok(one(LinkDummy::new(&l.name).build(), None)),
        LinkKind::Veth => {
            let peer = l.veth.as_ref().ok_or("a veth without its peer")?;
            let peer_ns = peer.namespace.clone().unwrap_or_else(|| ns.clone());
            let file: &File = by_role
                .get(peer_ns.as_str())
                .map(|n| n.file())
                .ok_or_else(|| format!("its peer's namespace {peer_ns} is not in the model"))?;
            let peer_msg = LinkUnspec::new_with_name(&peer.name)
                .setns_by_fd(file.as_raw_fd())
                .build();
            use rtnetlink::packet_route::link::{InfoData, InfoVeth};
            let msg = LinkVeth::new(&l.name, &peer.name)
                .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
                .build();
            Ok(Request {
                from: ns.clone(),
                names: vec![(ns.clone(), l.name.clone()), (peer_ns, peer.name.clone())],
                msg,
                needs: None,
                what: format!("veth {} (peer {})", l.name, peer.name),
            })
        }
        LinkKind::Vxlan => {
            let v = l
                .vxlan
                .as_ref()
                .ok_or("a VXLAN link without its attributes")?;
            let mut b = LinkVxlan::new(&l.name, v.vni)
                .port(v.port)
                .learning(v.learning);
            match v.local {
                Some(std::net::IpAddr::V4(a)) => b = b.local(a),
                Some(std::net::IpAddr::V6(a)) => b = b.local6(a),
                None => {}
            }
            let needs = v.dev.clone().map(|d| (d, Kind::VxlanDev));
            Ok(one(b.build(), needs))
        }
        LinkKind::Macvlan | LinkKind::Ipvlan => {
            let lower = l.lower.as_ref().ok_or("no lower device")?;
            let lower_ns = lower.link.namespace.clone().unwrap_or_else(|| ns.clone());
            if !by_role.contains_key(lower_ns.as_str()) {
                return Err(format!(
                    "its lower device's namespace {lower_ns} is not in the model"
                ));
            }
            let mode = lower.mode.clone().unwrap_or_default();
            let mut msg = if l.kind == LinkKind::Macvlan {
                let m = [
                    MacVlanMode::Bridge,
                    MacVlanMode::Private,
                    MacVlanMode::Vepa,
                    MacVlanMode::Passthrough,
                    MacVlanMode::Source,
                ]
                .into_iter()
                .find(|m| m.to_string() == mode)
                .unwrap_or(MacVlanMode::Bridge);
                LinkMacVlan::new(&l.name, 0, m).build()
            } else {
                let m = [IpVlanMode::L2, IpVlanMode::L3, IpVlanMode::L3S]
                    .into_iter()
                    .find(|m| m.to_string() == mode)
                    .unwrap_or(IpVlanMode::L2);
                LinkIpVlan::new(&l.name, 0, m).build()
            };
            // The builders set the lower by index; `send` sets it by name.
            msg.attributes
                .retain(|a| !matches!(a, rtnetlink::packet_route::link::LinkAttribute::Link(_)));
            if lower_ns != ns {
                let own = by_role.get(ns.as_str()).map(|n| n.file().as_raw_fd());
                if let Some(fd) = own {
                    msg.attributes
                        .push(rtnetlink::packet_route::link::LinkAttribute::NetNsFd(fd));
                }
            }
            Ok(Request {
                from: lower_ns,
                names: vec![(ns.clone(), l.name.clone())],
                msg,
                needs: Some((lower.link.name.clone(), Kind::Lower)),
                what: format!("link {}", l.name),
            })
        }
        LinkKind::Device => Err("a physical device: apply makes no hardware".into()),
        LinkKind::Other(kind) => Err(format!("link kind {kind} is not one apply makes")),
        LinkKind::Loopback => Err("loopback exists in every namespace".into()),
    }
}

/// Step 3 in one namespace: attributes, controller, bridge-port options,
/// addresses, `up`. Returns every link's MAC by name (for `@ns/link`).
pub(super) fn configure(t: &Target, made: &Made) -> Result<BTreeMap<String, String>, ApplyError> {
    let ns = t.model.name.clone();
    let links: Vec<Link> = t
        .model
        .links
        .iter()
        .filter(|l| made.contains(&(ns.clone(), l.name.clone())))
        .cloned()
        .collect();
    let result = t
        .netns
        .netlink(|h| async move { Ok::<_, rtnetlink::Error>(configure_in(&h, &links).await) });
    match result {
        Ok(Ok(macs)) => Ok(macs),
        Ok(Err(reason)) => Err(object_error(&ns, "links", reason)),
        Err(e) => Err(object_error(&ns, "links", e)),
    }
}

async fn configure_in(
    h: &rtnetlink::Handle,
    links: &[Link],
) -> Result<BTreeMap<String, String>, String> {
    let index = indexes(h).await?;
    let idx = |name: &str| {
        index
            .get(name)
            .copied()
            .ok_or_else(|| format!("link {name} is not there"))
    };
    for l in links {
        let i = idx(&l.name)?;
        let mut b = LinkUnspec::new_with_index(i);
        if let Some(mtu) = l.mtu {
            if l.kind != LinkKind::Loopback {
                b = b.mtu(mtu);
            }
        }
        if let Some(mac) = &l.mac {
            if l.kind != LinkKind::Loopback {
                b = b.address(mac_bytes(mac).ok_or_else(|| format!("link {}: MAC {mac}", l.name))?);
            }
        }
        for f in &l.flags {
            b = match f {
                LinkFlag::Noarp => b.arp(false),
                LinkFlag::Promisc => b.promiscuous(true),
                LinkFlag::Allmulti => b.allmulticast(true),
            };
        }
        if let Some(c) = &l.controller {
            b = b.controller(idx(c)?);
        }
        set(h, b.build(), &l.name).await?;
        if let Some(p) = &l.port {
            if l.controller.is_some() && (p.hairpin || p.isolated || !p.learning) {
                let msg = LinkBridgePort::new(i)
                    .hairpin(p.hairpin)
                    .isolated(p.isolated)
                    .learning(p.learning)
                    .build();
                // Port options go in RTM_NEWLINK (RTM_SETLINK ignores them).
                h.link()
                    .set_port(msg)
                    .execute()
                    .await
                    .map_err(|e| format!("link {} bridge-port options: {e}", l.name))?;
            }
        }
        for a in &l.addresses {
            nl::add_address(h, i, *a)
                .await
                .map_err(|e| format!("link {}: address {a}: {e}", l.name))?;
        }
    }
    for l in links.iter().filter(|l| l.up) {
        nl::set_up(h, idx(&l.name)?)
            .await
            .map_err(|e| format!("link {}: up: {e}", l.name))?;
    }
    Ok(nl::links(h)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter_map(|l| Some((l.name, l.mac?)))
        .collect())
}

async fn set(h: &rtnetlink::Handle, msg: LinkMessage, what: &str) -> Result<(), String> {
    h.link()
        .set(msg)
        .execute()
        .await
        .map_err(|e| format!("link {what}: {e}"))
}

/// Every link's index by name.
pub(super) async fn indexes(h: &rtnetlink::Handle) -> Result<BTreeMap<String, u32>, String> {
    Ok(nl::links(h)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|l| (l.name, l.index))
        .collect())
}

/// `02:00:0a:…` as bytes.
pub(super) fn mac_bytes(mac: &str) -> Option<Vec<u8>> {
    let bytes: Option<Vec<u8>> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).ok())
        .collect();
    bytes.filter(|b| !b.is_empty())
}
