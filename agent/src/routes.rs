//! Reading and changing the main routing table over netlink. Which changes to
//! make is decided in [`crate::plan`]; this module only talks to the kernel.

use crate::error::{AgentError, Result};
use crate::plan::{InstalledRoute, NodeRoute, RouteAction, ROUTE_PROTOCOL};
use cnilab_net::nl::{self, Route, MAIN_TABLE};
use ipnet::IpNet;
use rtnetlink::packet_route::route::{RouteMessage, RouteProtocol};
use rtnetlink::{Handle, RouteMessageBuilder};
use std::net::IpAddr;

/// Unicast routes of the main table, both families (read through `nl`).
pub async fn list_main_table(handle: &Handle) -> Result<Vec<InstalledRoute>> {
    let mut routes: Vec<InstalledRoute> = nl::all_routes(handle)
        .await
        .map_err(|e| AgentError::netlink("dump routes", e))?
        .iter()
        .filter_map(installed_route)
        .collect();
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

/// The planner's view of a unicast main-table route.
fn installed_route(route: &Route) -> Option<InstalledRoute> {
    (route.unicast && route.table == MAIN_TABLE).then_some(InstalledRoute {
        dst: route.dst,
        gateway: route.gateway,
        priority: route.priority,
        ours: route.protocol == ROUTE_PROTOCOL,
    })
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
