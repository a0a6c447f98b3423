//! DEL: best effort and idempotent. Every step runs even when an earlier
//! one failed; the errors are reported together. Only what this attachment
//! owns is removed: a link marked for another attachment (see
//! [`super::ownership_mark`]) is left alone and logged; a link with no mark
//! at all is removed (DEL must clean up after a lost store). Addresses come
//! from the store's own records, never from `prevResult`.

use super::addresses;
use super::Owner;
use super::{host_veth_name, note, owner_of, ownership_mark, refuse_own_netns, runtime, subnets};
use crate::config::{IpamPlan, Plan};
use crate::env::CniEnv;
use crate::error::{join, CniError, Result};
use crate::masq;
use cnilab_net::netns;
use cnilab_net::nl;
use rtnetlink::Handle;
use std::io::ErrorKind;
use std::net::IpAddr;

pub fn run(env: &CniEnv, plan: &Plan) -> Result<()> {
    // A CNI_NETNS that still exists must be a network namespace other than
    // the plugin's own; one that is gone is fine (the pod is gone).
    let ns = if env.netns.is_empty() {
        None
    } else {
        match netns::open(&env.netns) {
            Ok(ns) => match netns::check_network_namespace(&ns, env.netns.as_ref()) {
                Ok(()) => {
                    refuse_own_netns(env, &ns)?;
                    Some(ns)
                }
                // A runtime unmounts a namespace before it unlinks the
                // file: the pod is gone, the rest of DEL still runs.
                Err(e) => {
                    note(format!("{e}: treated as gone"));
                    None
                }
            },
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            // A FIFO, a directory, a device: not a namespace path at all.
            Err(e) => return Err(CniError::env(format!("CNI_NETNS {}: {e}", env.netns))),
        }
    };
    let host_veth = host_veth_name(&env.container_id, &env.ifname);
    let mark = ownership_mark(&plan.name, &env.container_id, &env.ifname);
    let rt = runtime()?;
    // A delegated IPAM keeps no records here: the addresses to unmasquerade
    // are read from the pod interface, if it is this attachment's.
    let kernel_ips = match (&plan.ipam, &ns) {
        (IpamPlan::Delegate { .. }, Some(ns)) if plan.ip_masq => {
            rt.block_on(owned_addresses(env, ns, &mark))
        }
        _ => Vec::new(),
    };
    // The kernel takes most of DEL's time tearing the veth down; the store
    // and the firewall are released on another thread meanwhile.
    let (mut errors, address_errors) = std::thread::scope(|s| {
        let addresses = s.spawn(|| release_addresses(env, plan, kernel_ips));
        let mut errors = Vec::new();
        rt.block_on(async {
            match netns::connect(None) {
                Ok(host) => match delete_host_veth(&host, &host_veth, &mark).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // No host veth by our name: remove a leftover container
                        // side if the namespace still exists.
                        if let Some(ns) = &ns {
                            if let Err(e) = delete_in_container(env, ns, &mark).await {
                                errors.push(e);
                            }
                        }
                    }
                    Err(e) => errors.push(e),
                },
                Err(e) => errors.push(CniError::kernel("netlink in host namespace", e)),
            }
        });
        let address_errors = addresses
            .join()
            .unwrap_or_else(|_| vec![CniError::io("address release thread panicked")]);
        (errors, address_errors)
    });
    errors.extend(address_errors);
    join(errors)
}

/// Deletes the host veth if it is this attachment's or unmarked. Returns
/// whether a link by that name existed.
async fn delete_host_veth(host: &Handle, name: &str, mark: &str) -> Result<bool> {
    let link = nl::link_by_name(host, name)
        .await
        .map_err(|e| CniError::kernel(format!("look up {name}"), e))?;
    let Some(link) = link else {
        return Ok(false);
    };
    if let Owner::Other(owner) = owner_of(link.alias.as_deref(), mark) {
        note(format!(
            "left host link {name}: it is marked {owner:?}, not {mark:?}"
        ));
        return Ok(true);
    }
    nl::delete_link(host, link.index)
        .await
        .map_err(|e| CniError::kernel(format!("delete {name}"), e))?;
    Ok(true)
}

/// The addresses on the pod interface, when it carries this attachment's
/// mark (nothing otherwise: an unmarked interface proves no ownership).
async fn owned_addresses(env: &CniEnv, ns: &std::fs::File, mark: &str) -> Vec<IpAddr> {
    let Ok(cont) = netns::connect(Some(ns)) else {
        return Vec::new();
    };
    match nl::link_by_name(&cont, &env.ifname).await {
        Ok(Some(link)) if owner_of(link.alias.as_deref(), mark) == Owner::This => {
            nl::addresses(&cont, Some(link.index))
                .await
                .unwrap_or_default()
                .into_iter()
                .map(|a| a.addr.addr())
                .filter(|ip| !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// Releases the attachment's addresses and their masquerade entries: the
/// addresses the store holds for this attachment (or, with a delegated
/// IPAM, those on its own pod interface), nothing else.
fn release_addresses(env: &CniEnv, plan: &Plan, kernel_ips: Vec<IpAddr>) -> Vec<CniError> {
    let mut errors = Vec::new();
    let mut ips: Vec<IpAddr> = match addresses::release(env, plan) {
        Ok(freed) => freed,
        Err(e) => {
            errors.push(e);
            Vec::new()
        }
    };
    ips.extend(kernel_ips);
    if plan.ip_masq && !ips.is_empty() {
        let nets: Vec<ipnet::IpNet> = ips.iter().map(|ip| ipnet::IpNet::from(*ip)).collect();
        if let Err(e) = masq::del(&plan.name, &subnets(plan, &nets), &ips) {
            errors.push(e);
        }
    }
    errors
}

async fn delete_in_container(env: &CniEnv, ns: &std::fs::File, mark: &str) -> Result<()> {
    let cont = netns::connect(Some(ns))
        .map_err(|e| CniError::kernel(format!("netlink in {}", env.netns), e))?;
    let Some(link) = nl::link_by_name(&cont, &env.ifname)
        .await
        .map_err(|e| CniError::kernel(format!("look up {} in {}", env.ifname, env.netns), e))?
    else {
        return Ok(());
    };
    if link.kind.as_deref() != Some("veth") {
        return Ok(());
    }
    if let Owner::Other(owner) = owner_of(link.alias.as_deref(), mark) {
        note(format!(
            "left {} in {}: it is marked {owner:?}, not {mark:?}",
            env.ifname, env.netns
        ));
        return Ok(());
    }
    nl::delete_link(&cont, link.index)
        .await
        .map_err(|e| CniError::kernel(format!("delete {} in {}", env.ifname, env.netns), e))
}
