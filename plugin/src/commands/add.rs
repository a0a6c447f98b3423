//! ADD: bridge, veth into the pod, addresses, routes, forwarding, masquerade.
//! Any failure after the first change undoes what was done. ADD and DEL of
//! one attachment never run at once (a per-attachment lock).

use super::addresses::{self, Allocation};
use super::delegate;
use super::{host_veth_name, open_pod_netns, ownership_mark, prev_result, runtime, subnets};
use crate::attachments::{Attachments, Cached};
use crate::config::{IpamPlan, Plan};
use crate::env::CniEnv;
use crate::error::{CniError, Result};
use crate::masq;
use cnilab_net::netns;
use cnilab_net::nl::{self, is_exists, Link};
use cnilab_net::spec::{code, CniResult, Interface, IpConfig, Route};
use ipnet::IpNet;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags};
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkUnspec};
use std::fs::File;
use std::net::IpAddr;

pub fn run(env: &CniEnv, plan: &Plan) -> Result<CniResult> {
    let prev = prev_result(plan)?;
    let ns = open_pod_netns(env)?;
    // An unsafe or missing delegate is refused before anything changes.
    if let IpamPlan::Delegate { plugin } = &plan.ipam {
        delegate::find(plugin, env)?;
    }
    // No DEL of this attachment runs until this ADD is done (or undone).
    let attachments = Attachments::of(plan);
    let _lock = attachments
        .as_ref()
        .map(|a| a.lock(&env.container_id, &env.ifname))
        .transpose()?;
    // The cache exists before any link does: a DEL after this ADD is
    // killed finds the proof that the unmarked links by its names are ours.
    // The built-in store allocates first, so the cache is written once,
    // already holding the address (one file and one rename fewer than an
    // empty cache rewritten later, and no IPAM thread); a delegated IPAM
    // plugin runs only once the links exist, behind an empty cache.
    let before = match &attachments {
        Some(a) => a.read(&env.container_id, &env.ifname)?,
        None => None,
    };
    let early = match &plan.ipam {
        IpamPlan::Builtin(_) => Some(addresses::allocate(env, plan)?),
        _ => None,
    };
    if let Some(a) = &attachments {
        let written = match &early {
            Some(alloc) => a.write(
                &env.container_id,
                &env.ifname,
                &given(before.as_ref(), alloc),
            ),
            None if before.is_none() => a.write(&env.container_id, &env.ifname, &[]),
            None => Ok(()),
        };
        if let Err(e) = written {
            if let Some(alloc) = &early {
                addresses::release_allocation(env, plan, alloc);
            }
            restore_cache(env, a, before.as_ref());
            return Err(e);
        }
    }
    let result = attach(
        env,
        plan,
        (prev, ns),
        attachments.as_ref(),
        before.as_ref(),
        early,
    );
    if let (Err(_), Some(a)) = (&result, &attachments) {
        restore_cache(env, a, before.as_ref());
    }
    result
}

/// Puts the attachment's cache back to what it was after a failed ADD:
/// none, or an earlier attachment's.
fn restore_cache(env: &CniEnv, a: &Attachments, before: Option<&Cached>) {
    let _ = match before {
        Some(cached) => a.write(&env.container_id, &env.ifname, &cached.ips),
        None => a.remove(&env.container_id, &env.ifname),
    };
}

/// What the attachment holds once `alloc` is given: an earlier ADD of it
/// that was killed may have been given addresses too.
fn given(before: Option<&Cached>, alloc: &Allocation) -> Vec<IpAddr> {
    let mut given: Vec<IpAddr> = before.map(|c| c.ips.clone()).unwrap_or_default();
    given.extend(alloc.ips.iter().map(|i| i.address.addr()));
    given.sort();
    given.dedup();
    given
}

/// ADD once the attachment is locked and its cache exists; `early` is the
/// built-in store's allocation, already cached.
fn attach(
    env: &CniEnv,
    plan: &Plan,
    (prev, ns): (Option<CniResult>, File),
    attachments: Option<&Attachments>,
    before: Option<&Cached>,
    early: Option<Allocation>,
) -> Result<CniResult> {
    let rt = runtime()?;
    let _entered = rt.enter();
    // Strict: the bridge's address dump carries the bridge's addresses only.
    let host =
        netns::connect_strict().map_err(|e| CniError::kernel("netlink in host namespace", e))?;
    let host_veth = host_veth_name(&env.container_id, &env.ifname);
    let rt_handle = rt.handle().clone();
    // The thread that opens the pod-side connection, once the veth exists,
    // turns off router advertisements on the pod interface (always) and,
    // with IPv6 addresses known, its `accept_dad`: no thread of its own.
    let dad = early.as_ref().is_some_and(has_ipv6).then(|| dad_key(env));
    let dad_key_now = dad.clone();
    let ra_key = ra_key(env);
    let (links, cont) = std::thread::scope(|s| {
        let (made, veth_made) = std::sync::mpsc::channel::<bool>();
        // The pod-side connection is opened while the links are made.
        let cont = netns::spawn_connect_then(s, &rt_handle, &ns, move || {
            if veth_made.recv() != Ok(true) {
                return Ok(());
            }
            refuse_router_advertisements(&ra_key)?;
            match dad_key_now {
                Some(key) => netns::write_sysctl(None, &key, "0"),
                None => Ok(()),
            }
        });
        let links = rt.block_on(create_links(env, plan, &ns, &host, &host_veth));
        let _ = made.send(links.is_ok());
        let cont = match cont.join() {
            Ok(Ok((handle, Ok(())))) => Ok(handle),
            Ok(Ok((_, Err(e)))) => Err(CniError::kernel(
                format!("{}'s IPv6 settings in {}", env.ifname, env.netns),
                e,
            )),
            Ok(Err(e)) => Err(CniError::kernel(format!("netlink in {}", env.netns), e)),
            Err(_) => Err(CniError::kernel(
                format!("netlink in {}", env.netns),
                "netlink thread panicked",
            )),
        };
        (links, cont)
    });
    let cached_early = early.is_some();
    let alloc = match early {
        Some(alloc) => Ok(alloc),
        // A delegated IPAM plugin runs only once the links exist.
        None if links.is_ok() && cont.is_ok() => addresses::allocate(env, plan),
        None => Ok(Allocation::default()),
    };
    let (links, cont) = match cont {
        Ok(c) => (links, Some(c)),
        Err(e) => (links.and(Err(e)), None),
    };
    let (host_links, links_made) = match (links, alloc) {
        (Ok(links), Ok(alloc)) => (links, alloc),
        (Err(e), alloc) => {
            if let Ok(alloc) = alloc {
                addresses::release_allocation(env, plan, &alloc);
            }
            return Err(e);
        }
        (Ok(_), Err(e)) => {
            let _ = rt.block_on(nl::delete_link_by_name(&host, &host_veth));
            return Err(e);
        }
    };
    let alloc = links_made;
    let Some(cont) = cont else {
        // Unreachable: a failed connection turned `links` into an error above.
        return Err(CniError::kernel(
            format!("netlink in {}", env.netns),
            "no connection",
        ));
    };
    // What this attachment was given is cached before it is masqueraded:
    // DEL unmasquerades exactly that, GC reads it for liveness.
    let cached = match attachments {
        Some(a) if !cached_early => a.write(&env.container_id, &env.ifname, &given(before, &alloc)),
        _ => Ok(()),
    };
    let configured = cached.and_then(|()| {
        rt.block_on(configure(
            env,
            plan,
            (&ns, dad.is_some()),
            &host,
            &cont,
            &host_veth,
            &host_links,
            &alloc,
        ))
    });
    match configured {
        Ok(mut result) => {
            if let Some(prev) = prev {
                result = merge(prev, result);
            }
            Ok(result)
        }
        Err(e) => {
            // Undo in reverse: veth (its peer goes with it), addresses (the
            // cache is put back by the caller). The masquerade is
            // configure's last step, so a failed ADD never made one (and
            // the undo creates no table).
            let _ = rt.block_on(nl::delete_link_by_name(&host, &host_veth));
            addresses::release_allocation(env, plan, &alloc);
            Err(e)
        }
    }
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

/// What ADD made or found in the host namespace.
struct HostLinks {
    bridge: Link,
    /// The host veth as the kernel echoed its creation (`None`: no echo).
    veth: Option<Link>,
    /// The bridge's addresses of the plan's families: a gateway among them
    /// is not added again.
    on_bridge: Vec<IpNet>,
}

/// The bridge (created if needed) and the veth pair, the pod end placed
/// straight into the pod's namespace, up, with its final name; the bridge's
/// addresses are read meanwhile.
async fn create_links(
    env: &CniEnv,
    plan: &Plan,
    ns: &File,
    host: &Handle,
    host_veth: &str,
) -> Result<HostLinks> {
    let bridge = ensure_bridge(host, plan).await?;
    let on_bridge = async {
        if !plan.is_gateway {
            return Ok(Vec::new());
        }
        nl::addresses_of_family(host, Some(bridge.index), gateway_family(plan))
            .await
            .map(|found| found.into_iter().map(|a| a.addr).collect())
            .map_err(|e| CniError::kernel(format!("addresses of {}", plan.bridge), e))
    };
    let veth = create_veth(env, plan, ns, host, host_veth, bridge.index);
    let (veth, on_bridge) = futures_util::future::join(veth, on_bridge).await;
    let veth = veth?;
    if plan.hairpin {
        host.link()
            .set_port(
                LinkBridgePort::new(0)
                    .append_extra_attribute(LinkAttribute::IfName(host_veth.to_string()))
                    .hairpin(true)
                    .build(),
            )
            .execute()
            .await
            .map_err(|e| CniError::kernel(format!("hairpin mode on {host_veth}"), e))?;
    }
    Ok(HostLinks {
        bridge,
        veth,
        on_bridge: on_bridge?,
    })
}

/// The one family of the built-in IPAM's ranges (`Some(true)`: IPv6), or
/// `None` (both, or a delegate's: unknown before it answers).
fn gateway_family(plan: &Plan) -> Option<bool> {
    let IpamPlan::Builtin(b) = &plan.ipam else {
        return None;
    };
    let mut families = b
        .range_sets
        .iter()
        .flatten()
        .map(|r| r.subnet.addr().is_ipv6());
    let first = families.next()?;
    families.all(|v6| v6 == first).then_some(first)
}

#[allow(clippy::too_many_arguments)]
async fn configure(
    env: &CniEnv,
    plan: &Plan,
    (ns, dad_written): (&File, bool),
    host: &Handle,
    cont: &Handle,
    host_veth: &str,
    host_links: &HostLinks,
    alloc: &Allocation,
) -> Result<CniResult> {
    let bridge = &host_links.bridge;
    // The gateway addresses and the host veth's ownership mark (host
    // socket) and the pod's interface (pod socket) are configured at the
    // same time.
    let mark = ownership_mark(&plan.name, &env.container_id, &env.ifname);
    // Marked while it is still down, then up (see `create_veth`).
    let marked = async {
        nl::set_alias_by_name(host, host_veth, &mark)
            .await
            .map_err(|e| CniError::kernel(format!("mark {host_veth} as {mark}"), e))?;
        let up = LinkUnspec::new_with_name(host_veth).up().build();
        host.link()
            .set(up)
            .execute()
            .await
            .map_err(|e| CniError::kernel(format!("set {host_veth} up"), e))
    };
    let gateways = async {
        if plan.is_gateway {
            for ip in &alloc.ips {
                if let Some(gw) = ip.gateway {
                    let net = IpNet::new(gw, ip.address.prefix_len())
                        .map_err(|e| CniError::config(format!("gateway {gw}: {e}")))?;
                    if !host_links.on_bridge.contains(&net) {
                        add_address(host, bridge.index, net, &plan.bridge).await?;
                    }
                }
            }
        }
        Ok::<(), CniError>(())
    };
    let routes = pod_routes(plan, alloc);
    let pod = configure_pod(env, (ns, dad_written), cont, alloc, &routes, &mark);
    let (marked, gateways, pod_link) = futures_util::future::join3(marked, gateways, pod).await;
    marked?;
    gateways?;
    let pod_link = pod_link?;
    if plan.is_gateway {
        enable_forwarding(alloc)?;
    }
    let host_mac = match &host_links.veth {
        Some(veth) => veth.mac.clone(),
        None => nl::link_by_name(host, host_veth)
            .await
            .map_err(|e| CniError::kernel(format!("look up {host_veth}"), e))?
            .and_then(|l| l.mac),
    }
    .unwrap_or_default();
    // Last, so that nothing after it can fail: a failed ADD has no
    // masquerade entry to undo (one atomic nft batch).
    if plan.ip_masq && !alloc.ips.is_empty() {
        let ips: Vec<IpAddr> = alloc.ips.iter().map(|i| i.address.addr()).collect();
        masq::add(&plan.name, &subnets(plan, &alloc.addresses()), &ips)?;
    }
    Ok(CniResult {
        cni_version: plan.version.to_string(),
        interfaces: vec![
            Interface {
                name: plan.bridge.clone(),
                mac: bridge.mac.clone().unwrap_or_default(),
                ..Interface::default()
            },
            Interface {
                name: host_veth.to_string(),
                mac: host_mac,
                ..Interface::default()
            },
            Interface {
                name: env.ifname.clone(),
                mac: pod_link.mac.clone().unwrap_or_default(),
                mtu: pod_link.mtu,
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

async fn ensure_bridge(host: &Handle, plan: &Plan) -> Result<Link> {
    let lookup = || async {
        nl::link_by_name(host, &plan.bridge)
            .await
            .map_err(|e| CniError::kernel(format!("look up bridge {}", plan.bridge), e))
    };
    let link = match lookup().await? {
        Some(link) => link,
        None => {
            let mut builder =
                LinkBridge::new(&plan.bridge).address(cnilab_net::naming::bridge_mac(&plan.bridge));
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
    nl::add_address(handle, index, net)
        .await
        .map_err(|e| CniError::kernel(format!("add address {net} to {on}"), e))
}

async fn create_veth(
    env: &CniEnv,
    plan: &Plan,
    ns: &File,
    host: &Handle,
    host_veth: &str,
    bridge_index: u32,
) -> Result<Option<Link>> {
    let ifname = env.ifname.as_str();
    let mut msg = nl::veth_message(host_veth, ifname, ns, plan.mtu, Some(bridge_index));
    // The host end is made down and goes up once it carries its ownership
    // mark: the kernel announces an alias change of an up link as a state
    // change (NETDEV_CHANGE), for which IPv6 walks the host namespace's
    // whole routing table while the link has no carrier yet, a cost that
    // grows with the pods on the node. Down, the mark is set silently.
    msg.header.flags.remove(LinkFlags::Up);
    let e = match nl::add_link_echo(host, msg).await {
        Ok(made) => return Ok(made),
        Err(e) => e,
    };
    let failed = |e| {
        CniError::kernel(
            format!(
                "create veth {host_veth} with peer {ifname} in {}",
                env.netns
            ),
            e,
        )
    };
    if !is_exists(&e) {
        return Err(failed(e));
    }
    // One of the two names is taken. The pod's interface: ADD must fail and
    // leave it alone. Otherwise a host veth left by an interrupted ADD of the
    // same attachment: replace it.
    let cont = netns::connect(Some(ns))
        .map_err(|e| CniError::kernel(format!("netlink in {}", env.netns), e))?;
    if nl::link_by_name(&cont, ifname)
        .await
        .map_err(|e| CniError::kernel(format!("look up {ifname} in {}", env.netns), e))?
        .is_some()
    {
        return Err(CniError::new(
            code::INTERFACE_EXISTS,
            format!("interface {ifname} already exists in netns {}", env.netns),
        ));
    }
    // The host veth exists: the same container ID and ifname are attached
    // in another namespace (a veth never outlives its peer's namespace).
    // Replacing it would cut that pod off: refuse, change nothing.
    Err(CniError::new(
        code::INTERFACE_EXISTS,
        format!(
            "attachment container {} ifname {ifname} already exists (host veth {host_veth}, in another namespace than {}); DEL it first",
            env.container_id, env.netns
        ),
    ))
}

async fn configure_pod(
    env: &CniEnv,
    (ns, dad_written): (&File, bool),
    cont: &Handle,
    alloc: &Allocation,
    routes: &[Route],
    mark: &str,
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
    if has_ipv6(alloc) && !dad_written {
        let key = dad_key(env);
        netns::write_sysctl(Some(ns), &key, "0")
            .map_err(|e| CniError::kernel(format!("{key} in {}", env.netns), e))?;
    }
    let on = format!("{} in {}", env.ifname, env.netns);
    let adds = alloc
        .ips
        .iter()
        .map(|ip| add_address(cont, link.index, ip.address, &on));
    // Up and marked as ours in one request.
    let up = async {
        nl::set_alias(cont, link.index, mark, true)
            .await
            .map_err(|e| CniError::kernel(format!("set {on} up"), e))
    };
    let mut pending = Vec::new();
    for route in routes {
        let msg = nl::route_message(route.dst, route.gw, Some(link.index), None)
            .map_err(CniError::config)?;
        pending.push(async move { (route, nl::add_route(cont, msg, false).await) });
    }
    // Sent back to back on one socket, without waiting for the answers: the
    // kernel handles each request as it is sent, in this order (the link is
    // up and has its addresses before a route via their gateway comes).
    let (up, added, routed) = futures_util::future::join3(
        up,
        futures_util::future::join_all(adds),
        futures_util::future::join_all(pending),
    )
    .await;
    up?;
    for outcome in added {
        outcome?;
    }
    for (route, outcome) in routed {
        match outcome {
            Ok(()) => {}
            Err(e) if is_exists(&e) => {}
            Err(e) => {
                return Err(CniError::kernel(
                    format!(
                        "route {}{} in {}",
                        route.dst,
                        route.gw.map(|g| format!(" via {g}")).unwrap_or_default(),
                        env.netns
                    ),
                    e,
                ))
            }
        }
    }
    Ok(link)
}

fn has_ipv6(alloc: &Allocation) -> bool {
    alloc.ips.iter().any(|i| i.address.addr().is_ipv6())
}

/// The pod interface's DAD switch, off: its addresses are usable at once.
fn dad_key(env: &CniEnv) -> String {
    format!("net/ipv6/conf/{}/accept_dad", env.ifname)
}

/// The pod interface's router-advertisement switch.
fn ra_key(env: &CniEnv) -> String {
    format!("net/ipv6/conf/{}/accept_ra", env.ifname)
}

/// `accept_ra = 0` on the pod interface, in the calling thread's namespace:
/// the plugin alone sets the pod's addresses and routes, so another pod on
/// the bridge cannot install an IPv6 default route or address in it with a
/// forged router advertisement (the class of CVE-2020-10749), and the pod
/// sends no router solicitations, which the bridge floods to every port (in
/// a node of 100 pods, a pod received up to 732 packets after coming up
/// with them, 500 without). A kernel without IPv6 has no such key: nothing
/// to refuse.
fn refuse_router_advertisements(key: &str) -> std::io::Result<()> {
    match netns::write_sysctl(None, key, "0") {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
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
        keys.push((false, "net/ipv4/ip_forward"));
    }
    if has_ipv6(alloc) {
        keys.push((true, "net/ipv6/conf/all/forwarding"));
    }
    for (v6, key) in keys {
        // Asked over netlink: no /proc/sys lookup when it is on already.
        let on = match netns::forwarding(v6) {
            Ok(on) => on,
            Err(_) => netns::read_sysctl(None, key).unwrap_or_default() == "1",
        };
        if !on {
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
