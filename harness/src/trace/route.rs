//! The kernel's own routing answer for one packet in one namespace:
//! RTM_GETROUTE with destination, source, the interface it arrived on and
//! a mark (so policy rules and reverse-path filtering count), asked through
//! a netlink connection made on a dedicated thread inside the namespace
//! (`cnilab_net::netns::netlink_job`).

use cnilab_net::{netns, nl};
use futures_util::TryStreamExt;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteMetric, RouteType,
};
use rtnetlink::packet_route::AddressFamily;
use std::fs::File;
use std::net::IpAddr;

/// What the kernel answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A route: its type (`unicast`, `local`, …), the device out, the
    /// gateway and the source the kernel would choose.
    Route {
        kind: String,
        oif: Option<String>,
        gateway: Option<IpAddr>,
        prefsrc: Option<IpAddr>,
        table: u32,
        /// The MTU the kernel answered (RTAX_MTU): the route's own, or a
        /// path MTU it learned from an ICMP "fragmentation needed".
        mtu: Option<u32>,
    },
    /// The lookup failed with this errno (EINVAL for a blackhole route,
    /// EHOSTUNREACH for unreachable or forwarding off, EACCES for
    /// prohibit, ENETUNREACH for no route, EXDEV for reverse-path failure).
    Error(i32),
}

/// The question: the packet as it is at this hop.
#[derive(Clone, Debug)]
pub struct Question<'a> {
    pub dst: IpAddr,
    pub src: Option<IpAddr>,
    /// The interface the packet arrived on (`None`: sent from here).
    pub iif: Option<&'a str>,
    pub mark: u32,
}

/// Asks the kernel of `ns`. `Err` only when netlink itself failed (no
/// answer at all); a failed lookup is [`Answer::Error`].
pub fn get(ns: &File, q: &Question) -> Result<Answer, String> {
    let q = q.clone();
    netns::netlink_job(ns, move |handle| async move {
        let msg = message(&handle, &q).await?;
        let answer = handle.route().get(msg).execute().try_next().await;
        let answer = match answer {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(Answer::Error(nix::libc::ENOENT)),
            Err(e) => match nl::errno(&e) {
                Some(code) => return Ok(Answer::Error(code)),
                None => return Err(e),
            },
        };
        let mut oif = None;
        let mut gateway = None;
        let mut prefsrc = None;
        let mut table = u32::from(answer.header.table);
        for a in &answer.attributes {
            match a {
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Gateway(g) => gateway = ip_of(g),
                RouteAttribute::PrefSource(s) => prefsrc = ip_of(s),
                RouteAttribute::Table(t) => table = *t,
                _ => {}
            }
        }
        let oif = match oif {
            Some(i) => Some(name_of(&handle, i).await?),
            None => None,
        };
        Ok(Answer::Route {
            kind: kind_name(answer.header.kind),
            oif,
            gateway,
            prefsrc,
            table,
            mtu: mtu_of(&answer),
        })
    })
}

/// The route itself that the kernel's lookup for `q` matched (`ip route
/// get fibmatch`): its destination prefix and its own MTU, never a learned
/// one. `Ok(None)` when the lookup failed.
pub fn matched(ns: &File, q: &Question) -> Result<Option<(String, Option<u32>)>, String> {
    let q = q.clone();
    netns::netlink_job(ns, move |handle| async move {
        let mut msg = message(&handle, &q).await?;
        msg.header.flags |= RouteFlags::FibMatch;
        let Ok(Some(answer)) = handle.route().get(msg).execute().try_next().await else {
            return Ok(None);
        };
        let dst = answer.attributes.iter().find_map(|a| match a {
            RouteAttribute::Destination(d) => ip_of(d),
            _ => None,
        });
        let dst = match dst {
            Some(ip) => format!("{ip}/{}", answer.header.destination_prefix_length),
            None => "default".to_string(),
        };
        Ok(Some((dst, mtu_of(&answer))))
    })
}

/// The RTM_GETROUTE request for `q`.
async fn message(
    handle: &rtnetlink::Handle,
    q: &Question<'_>,
) -> Result<RouteMessage, rtnetlink::Error> {
    let mut msg = RouteMessage::default();
    msg.header.address_family = family(q.dst);
    // Without it the kernel answers table main whichever table (a policy
    // rule's) the route came from.
    msg.header.flags |= RouteFlags::LookupTable;
    msg.header.destination_prefix_length = if q.dst.is_ipv4() { 32 } else { 128 };
    msg.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(q.dst)));
    if let Some(src) = q.src {
        msg.header.source_prefix_length = if src.is_ipv4() { 32 } else { 128 };
        msg.attributes
            .push(RouteAttribute::Source(RouteAddress::from(src)));
    }
    if let Some(name) = q.iif {
        msg.attributes
            .push(RouteAttribute::Iif(index_of(handle, name).await?));
    }
    if q.mark != 0 {
        msg.attributes.push(RouteAttribute::Mark(q.mark));
    }
    Ok(msg)
}

/// RTAX_MTU of an answer (0: none).
fn mtu_of(answer: &RouteMessage) -> Option<u32> {
    answer.attributes.iter().find_map(|a| match a {
        RouteAttribute::Metrics(m) => m.iter().find_map(|m| match m {
            RouteMetric::Mtu(v) if *v > 0 => Some(*v),
            _ => None,
        }),
        _ => None,
    })
}

fn family(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// The route type as `ip route` names it.
pub(crate) fn kind_name(kind: RouteType) -> String {
    match kind {
        RouteType::Unicast => "unicast".into(),
        RouteType::Local => "local".into(),
        RouteType::Broadcast => "broadcast".into(),
        RouteType::Multicast => "multicast".into(),
        RouteType::BlackHole => "blackhole".into(),
        RouteType::Unreachable => "unreachable".into(),
        RouteType::Prohibit => "prohibit".into(),
        RouteType::Throw => "throw".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

async fn index_of(handle: &rtnetlink::Handle, name: &str) -> Result<u32, rtnetlink::Error> {
    let link = handle
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_next()
        .await?;
    link.map(|l| l.header.index)
        .ok_or(rtnetlink::Error::RequestFailed)
}

async fn name_of(handle: &rtnetlink::Handle, index: u32) -> Result<String, rtnetlink::Error> {
    let link = handle
        .link()
        .get()
        .match_index(index)
        .execute()
        .try_next()
        .await?;
    Ok(link
        .map(|l| nl::Link::from_message(&l).name)
        .unwrap_or_else(|| format!("if{index}")))
}

/// The errno's name and text (`EINVAL (Invalid argument)`).
pub fn errno_text(code: i32) -> String {
    let errno = nix::errno::Errno::from_raw(code);
    format!("{errno:?} ({})", errno.desc())
}
