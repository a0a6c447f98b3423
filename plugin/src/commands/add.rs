//! ADD: bridge, veth into the pod, addresses, routes, forwarding, masquerade.
//! Any failure after the first change undoes what was done.

use super::addresses::{self, Allocation};
use super::{host_veth_name, prev_result, runtime, subnets};
use crate::config::Plan;
use crate::env::CniEnv;
use crate::error::{CniError, Result};
use crate::masq;
use crate::netns;
use crate::nl::{self, is_exists, Link};
use crate::spec::{code, CniResult, Interface, IpConfig, Route};
use ipnet::IpNet;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::packet_route::link::{InfoData, InfoVeth};
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkUnspec, LinkVeth};
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

pub fn run(env: &CniEnv, plan: &Plan) -> Result<CniResult> {
    let prev = prev_result(plan)?;
    let ns = netns::open(&env.netns)
        .map_err(|e| CniError::env(format!("CNI_NETNS {}: {e}", env.netns)))?;
    let rt = runtime()?;
    rt.block_on(async {
        let host =
            netns::connect(None).map_err(|e| CniError::kernel("netlink in host namespace", e))?;
        let cont = netns::connect(Some(&ns))
            .map_err(|e| CniError::kernel(format!("netlink in {}", env.netns), e))?;
        if nl::link_by_name(&cont, &env.ifname)
            .await
            .map_err(|e| CniError::kernel(format!("look up {} in {}", env.ifname, env.netns), e))?
            .is_some()
        {
            return Err(CniError::new(
                code::INTERFACE_EXISTS,
                format!(
                    "interface {} already exists in netns {}",
                    env.ifname, env.netns
                ),
            ));
        }
        let alloc = addresses::allocate(env, plan)?;
        let host_veth = host_veth_name(&env.container_id, &env.ifname);
        match setup(env, plan, &ns, &host, &cont, &host_veth, &alloc).await {
            Ok(mut result) => {
                if let Some(prev) = prev {
                    result = merge(prev, result);
                }
                Ok(result)
            }
            Err(e) => {
                // Undo in reverse: masquerade, veth (its peer goes with it), addresses.
                let ips: Vec<IpAddr> = alloc.ips.iter().map(|i| i.address.addr()).collect();
                if plan.ip_masq {
                    let _ = masq::del(&plan.name, &subnets(plan, &alloc.addresses()), &ips);
                }
                let _ = nl::delete_link_by_name(&host, &host_veth).await;
                let _ = addresses::release(env, plan);
                Err(e)
            }
        }
    })
}

/// Appends this plugin's interfaces, IPs and routes to `prev` (chaining).
fn merge(mut prev: CniResult, ours: CniResult) -> CniResult {
    let offset = prev.interfaces.len();
    prev.interfaces.extend(ours.interfaces);
    prev.ips.extend(ours.ips.into_iter().map(|mut ip| {
        ip.interface = ip.interface.map(|i| i + offset);
        ip
    }));
    prev.routes.extend(ours.routes);
    if ours.dns.is_some() {
        prev.dns = ours.dns;
    }
    prev
}

async fn setup(
    env: &CniEnv,
    plan: &Plan,
    ns: &File,
    host: &Handle,
    cont: &Handle,
    host_veth: &str,
    alloc: &Allocation,
) -> Result<CniResult> {
    let bridge = ensure_bridge(host, plan).await?;
    if plan.is_gateway {
        for ip in &alloc.ips {
            if let Some(gw) = ip.gateway {
                let net = IpNet::new(gw, ip.address.prefix_len())
                    .map_err(|e| CniError::config(format!("gateway {gw}: {e}")))?;
                add_address(host, bridge.index, net, &plan.bridge).await?;
            }
        }
    }
    create_veth(plan, ns, host, host_veth, &env.ifname, bridge.index).await?;
    let host_link = nl::link_by_name(host, host_veth)
        .await
        .map_err(|e| CniError::kernel(format!("look up {host_veth}"), e))?
        .ok_or_else(|| CniError::kernel(host_veth, "veth vanished after creation"))?;
    if plan.hairpin {
        host.link()
            .set_port(LinkBridgePort::new(host_link.index).hairpin(true).build())
            .execute()
            .await
            .map_err(|e| CniError::kernel(format!("hairpin mode on {host_veth}"), e))?;
    }
    let pod_link = configure_pod(env, plan, ns, cont, alloc).await?;
    let routes = pod_routes(plan, alloc);
    for route in &routes {
        let msg = nl::route_message(route.dst, route.gw, Some(pod_link.index), None)
            .map_err(CniError::config)?;
        match nl::add_route(cont, msg, false).await {
            Ok(()) => {}
            Err(e) if is_exists(&e) => {}
            Err(e) => {
                return Err(CniError::kernel(
                    format!("route {} via {:?} in {}", route.dst, route.gw, env.netns),
                    e,
                ))
            }
        }
    }
    if plan.is_gateway {
        enable_forwarding(alloc)?;
    }
    if plan.ip_masq && !alloc.ips.is_empty() {
        let ips: Vec<IpAddr> = alloc.ips.iter().map(|i| i.address.addr()).collect();
        masq::add(&plan.name, &subnets(plan, &alloc.addresses()), &ips)?;
    }
    Ok(CniResult {
        cni_version: plan.version.to_string(),
        interfaces: vec![
            Interface {
                name: plan.bridge.clone(),
                mac: bridge.mac.clone(),
                ..Interface::default()
            },
            Interface {
                name: host_veth.to_string(),
                mac: host_link.mac.clone(),
                ..Interface::default()
            },
            Interface {
                name: env.ifname.clone(),
                mac: pod_link.mac.clone(),
                mtu: Some(pod_link.mtu),
                sandbox: Some(env.netns.clone()),
                ..Interface::default()
            },
        ],
        ips: alloc
            .ips
            .iter()
            .map(|ip| IpConfig {
                version: None,
                interface: Some(2),
                address: ip.address,
                gateway: ip.gateway,
            })
            .collect(),
        routes,
        dns: plan.dns.clone().or(alloc.dns.clone()),
    })
}

/// A stable, locally administered MAC for the bridge, so the gateway's MAC
/// does not change as ports come and go.
fn bridge_mac(name: &str) -> Vec<u8> {
    let h = masq::fnv1a(name.as_bytes()).to_be_bytes();
    vec![0x02, h[0], h[1], h[2], h[3], h[4]]
}

async fn ensure_bridge(host: &Handle, plan: &Plan) -> Result<Link> {
    let lookup = || async {
        nl::link_by_name(host, &plan.bridge)
            .await
            .map_err(|e| CniError::kernel(format!("look up bridge {}", plan.bridge), e))
    };
    let link = match lookup().await? {
        Some(link) => link,
        None => {
            let mut builder = LinkBridge::new(&plan.bridge).address(bridge_mac(&plan.bridge));
            if let Some(mtu) = plan.mtu {
                builder = builder.mtu(mtu);
            }
            if plan.promisc {
                builder = builder.promiscuous(true);
            }
            match host.link().add(builder.build()).execute().await {
                Ok(()) => {}
                // Another ADD created it at the same moment.
                Err(e) if is_exists(&e) => {}
                Err(e) => {
                    return Err(CniError::kernel(
                        format!("create bridge {}", plan.bridge),
                        e,
                    ))
                }
            }
            lookup()
                .await?
                .ok_or_else(|| CniError::kernel(&plan.bridge, "bridge vanished after creation"))?
        }
    };
    if link.kind.as_deref() != Some("bridge") {
        return Err(CniError::config(format!(
            "{} exists in the host namespace but is not a bridge (kind {:?})",
            plan.bridge, link.kind
        )));
    }
    if !link.up {
        host.link()
            .set(LinkUnspec::new_with_index(link.index).up().build())
            .execute()
            .await
            .map_err(|e| CniError::kernel(format!("set bridge {} up", plan.bridge), e))?;
    }
    Ok(link)
}

async fn add_address(handle: &Handle, index: u32, net: IpNet, on: &str) -> Result<()> {
    let mut req = handle.address().add(index, net.addr(), net.prefix_len());
    if net.addr().is_ipv6() {
        // Pod and gateway addresses are unique by construction: skip DAD so
        // they are usable at once instead of after a second of "tentative".
        req.message_mut()
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    match req.execute().await {
        Ok(()) => Ok(()),
        Err(e) if is_exists(&e) => Ok(()),
        Err(e) => Err(CniError::kernel(format!("add address {net} to {on}"), e)),
    }
}

async fn create_veth(
    plan: &Plan,
    ns: &File,
    host: &Handle,
    host_veth: &str,
    ifname: &str,
    bridge_index: u32,
) -> Result<()> {
    let build = || {
        let mut peer = LinkUnspec::new_with_name(ifname).setns_by_fd(ns.as_raw_fd());
        let mut builder = LinkVeth::new(host_veth, ifname);
        if let Some(mtu) = plan.mtu {
            peer = peer.mtu(mtu);
            builder = builder.mtu(mtu);
        }
        builder
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer.build())))
            .controller(bridge_index)
            .up()
            .build()
    };
    match host.link().add(build()).execute().await {
        Ok(()) => Ok(()),
        Err(e) if is_exists(&e) => {
            // The container side was checked to be absent, so this is a host
            // veth left by an interrupted ADD of the same attachment.
            nl::delete_link_by_name(host, host_veth)
                .await
                .map_err(|e| CniError::kernel(format!("remove stale {host_veth}"), e))?;
            host.link()
                .add(build())
                .execute()
                .await
                .map_err(|e| CniError::kernel(format!("create veth {host_veth}/{ifname}"), e))
        }
        Err(e) => Err(CniError::kernel(
            format!("create veth {host_veth}/{ifname}"),
            e,
        )),
    }
}

async fn configure_pod(
    env: &CniEnv,
    plan: &Plan,
    ns: &File,
    cont: &Handle,
    alloc: &Allocation,
) -> Result<Link> {
    let link = nl::link_by_name(cont, &env.ifname)
        .await
        .map_err(|e| CniError::kernel(format!("look up {} in {}", env.ifname, env.netns), e))?
        .ok_or_else(|| {
            CniError::kernel(
                format!("{} in {}", env.ifname, env.netns),
                "veth peer did not arrive in the namespace",
            )
        })?;
    if alloc.ips.iter().any(|i| i.address.addr().is_ipv6()) {
        let key = format!("net/ipv6/conf/{}/accept_dad", env.ifname);
        netns::write_sysctl(Some(ns), &key, "0")
            .map_err(|e| CniError::kernel(format!("{key} in {}", env.netns), e))?;
    }
    for ip in &alloc.ips {
        add_address(
            cont,
            link.index,
            ip.address,
            &format!("{} in {}", env.ifname, env.netns),
        )
        .await?;
    }
    cont.link()
        .set(LinkUnspec::new_with_index(link.index).up().build())
        .execute()
        .await
        .map_err(|e| CniError::kernel(format!("set {} up in {}", env.ifname, env.netns), e))?;
    let _ = plan;
    nl::link_by_name(cont, &env.ifname)
        .await
        .map_err(|e| CniError::kernel(format!("look up {}", env.ifname), e))?
        .ok_or_else(|| CniError::kernel(&env.ifname, "vanished"))
}

/// The default route via each family's gateway (isDefaultGateway) plus the
/// IPAM routes, whose missing `gw` is the family's gateway.
fn pod_routes(plan: &Plan, alloc: &Allocation) -> Vec<Route> {
    let gateway_of = |v4: bool| {
        alloc
            .ips
            .iter()
            .find(|i| i.address.addr().is_ipv4() == v4)
            .and_then(|i| i.gateway)
    };
    let mut routes = Vec::new();
    if plan.is_default_gateway {
        for ip in &alloc.ips {
            let v4 = ip.address.addr().is_ipv4();
            let dst: IpNet = if v4 {
                IpNet::V4(Default::default())
            } else {
                IpNet::V6(Default::default())
            };
            if let Some(gw) = ip.gateway {
                if !routes.iter().any(|r: &Route| r.dst == dst) {
                    routes.push(Route::new(dst, Some(gw)));
                }
            }
        }
    }
    for r in &alloc.routes {
        if routes.iter().any(|x| x.dst == r.dst) {
            continue;
        }
        let mut route = r.clone();
        if route.gw.is_none() {
            route.gw = gateway_of(r.dst.addr().is_ipv4());
        }
        routes.push(route);
    }
    routes
}

fn enable_forwarding(alloc: &Allocation) -> Result<()> {
    let mut keys = Vec::new();
    if alloc.ips.iter().any(|i| i.address.addr().is_ipv4()) {
        keys.push("net/ipv4/ip_forward");
    }
    if alloc.ips.iter().any(|i| i.address.addr().is_ipv6()) {
        keys.push("net/ipv6/conf/all/forwarding");
    }
    for key in keys {
        let current = netns::read_sysctl(None, key).unwrap_or_default();
        if current != "1" {
            netns::write_sysctl(None, key, "1").map_err(|e| CniError::kernel(key, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_reindexes_interfaces() {
        let prev: CniResult = serde_json::from_str(
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"lo"}],"ips":[{"interface":0,"address":"127.0.0.1/8"}]}"#,
        )
        .expect("prev");
        let ours: CniResult = serde_json::from_str(
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"br"},{"name":"v"},{"name":"eth0","sandbox":"/x"}],"ips":[{"interface":2,"address":"10.0.0.2/24"}]}"#,
        )
        .expect("ours");
        let merged = merge(prev, ours);
        assert_eq!(merged.interfaces.len(), 4);
        assert_eq!(merged.ips[0].interface, Some(0));
        assert_eq!(merged.ips[1].interface, Some(3));
    }
}
