//! Reading and changing the main routing table over netlink. Which changes to
//! make is decided in [`crate::plan`]; this module only talks to the kernel.

use crate::error::{AgentError, Result};
use crate::plan::{InstalledRoute, NodeRoute, RouteAction, ROUTE_PROTOCOL};
use futures_util::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteType,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const MAIN_TABLE: u32 = RouteHeader::RT_TABLE_MAIN as u32;

/// Unicast routes of the main table, both families.
pub async fn list_main_table(handle: &Handle) -> Result<Vec<InstalledRoute>> {
    let mut routes = Vec::new();
    for request in [
        RouteMessageBuilder::<Ipv4Addr>::new().build(),
        RouteMessageBuilder::<Ipv6Addr>::new().build(),
    ] {
        let mut stream = handle.route().get(request).execute();
        while let Some(message) = stream
            .try_next()
            .await
            .map_err(|e| AgentError::netlink("dump routes", e))?
        {
            routes.extend(installed_route(&message));
        }
    }
    routes.sort();
    Ok(routes)
}

/// Only the routes this agent made.
pub async fn list_own(handle: &Handle) -> Result<Vec<InstalledRoute>> {
    Ok(list_main_table(handle)
        .await?
        .into_iter()
        .filter(|r| r.ours)
        .collect())
}

fn installed_route(message: &RouteMessage) -> Option<InstalledRoute> {
    let header = &message.header;
    if header.kind != RouteType::Unicast {
        return None;
    }
    let mut table = u32::from(header.table);
    let mut dst = None;
    let mut gateway = None;
    let mut priority = 0;
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(a) => dst = route_address(a),
            RouteAttribute::Gateway(a) => gateway = route_address(a),
            RouteAttribute::Priority(p) => priority = *p,
            _ => {}
        }
    }
    if table != MAIN_TABLE {
        return None;
    }
    let dst = match (dst, header.address_family) {
        (Some(addr), _) => addr,
        (None, AddressFamily::Inet) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        (None, AddressFamily::Inet6) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        (None, _) => return None,
    };
    let dst = IpNet::new(dst, header.destination_prefix_length).ok()?;
    Some(InstalledRoute {
        dst,
        gateway,
        priority,
        ours: u8::from(header.protocol) == ROUTE_PROTOCOL,
    })
}

fn route_address(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

fn message(dst: IpNet, gateway: Option<IpAddr>, priority: Option<u32>) -> Result<RouteMessage> {
    fn invalid(dst: IpNet, e: impl std::fmt::Debug) -> AgentError {
        AgentError::Config(format!("route to {dst}: {e:?}"))
    }
    let mut builder = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dst.addr(), dst.prefix_len())
        .map_err(|e| invalid(dst, e))?
        .protocol(RouteProtocol::from(ROUTE_PROTOCOL));
    if let Some(gateway) = gateway {
        builder = builder.gateway(gateway).map_err(|e| invalid(dst, e))?;
    }
    if let Some(priority) = priority {
        builder = builder.priority(priority);
    }
    Ok(builder.build())
}

fn route_message(route: &NodeRoute, priority: Option<u32>) -> Result<RouteMessage> {
    message(route.dst, Some(route.gateway), priority)
}

/// Applies one planned change. Adding never overwrites (a route that
/// appeared since the dump makes it fail); replacing only targets our route.
pub async fn apply(handle: &Handle, action: &RouteAction) -> Result<()> {
    let what = format!("{action}");
    let result = match action {
        RouteAction::Add(route) => {
            handle
                .route()
                .add(route_message(route, None)?)
                .execute()
                .await
        }
        RouteAction::Replace { old, new } => {
            handle
                .route()
                .add(route_message(new, Some(old.priority))?)
                .replace()
                .execute()
                .await
        }
        RouteAction::Delete(route) => {
            let message = message(route.dst, route.gateway, Some(route.priority))?;
            handle.route().del(message).execute().await
        }
    };
    result.map_err(|e| AgentError::netlink(what, e))
}

/// Deletes every route marked ours (for `uninstall`). Returns how many.
pub async fn delete_all_own(handle: &Handle) -> Result<usize> {
    let own = list_own(handle).await?;
    for route in &own {
        apply(handle, &RouteAction::Delete(*route)).await?;
    }
    Ok(own.len())
}
