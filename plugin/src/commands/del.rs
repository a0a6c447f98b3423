//! DEL: best effort and idempotent. Every step runs even when an earlier
//! one failed; the errors are reported together.

use super::addresses;
use super::{host_veth_name, prev_result, runtime, subnets};
use crate::config::Plan;
use crate::env::CniEnv;
use crate::error::{join, CniError, Result};
use crate::masq;
use crate::netns;
use crate::nl;
use std::net::IpAddr;
use std::path::Path;

pub fn run(env: &CniEnv, plan: &Plan) -> Result<()> {
    let host_veth = host_veth_name(&env.container_id, &env.ifname);
    let rt = runtime()?;
    // The kernel takes most of DEL's time tearing the veth down; the store
    // and the firewall are released on another thread meanwhile.
    let (mut errors, address_errors) = std::thread::scope(|s| {
        let addresses = s.spawn(|| release_addresses(env, plan));
        let mut errors = Vec::new();
        rt.block_on(async {
            match netns::connect(None) {
                Ok(host) => match nl::delete_link_by_name(&host, &host_veth).await {
                    Ok(true) => {}
                    Ok(false) => {
                        // No host veth by our name: remove a leftover container
                        // side if the namespace still exists.
                        if let Err(e) = delete_in_container(env).await {
                            errors.push(e);
                        }
                    }
                    Err(e) => errors.push(CniError::kernel(format!("delete {host_veth}"), e)),
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

/// Releases the attachment's addresses and their masquerade entries.
fn release_addresses(env: &CniEnv, plan: &Plan) -> Vec<CniError> {
    let mut errors = Vec::new();
    let mut ips: Vec<IpAddr> = match addresses::release(env, plan) {
        Ok(freed) => freed,
        Err(e) => {
            errors.push(e);
            Vec::new()
        }
    };
    if plan.ip_masq {
        if let Ok(Some(prev)) = prev_result(plan) {
            ips.extend(prev.ips.iter().map(|i| i.address.addr()));
        }
        ips.sort();
        ips.dedup();
        let nets: Vec<ipnet::IpNet> = ips.iter().map(|ip| ipnet::IpNet::from(*ip)).collect();
        if let Err(e) = masq::del(&plan.name, &subnets(plan, &nets), &ips) {
            errors.push(e);
        }
    }
    errors
}

async fn delete_in_container(env: &CniEnv) -> Result<()> {
    if env.netns.is_empty() || !Path::new(&env.netns).exists() {
        return Ok(());
    }
    let Ok(ns) = netns::open(&env.netns) else {
        return Ok(());
    };
    let cont = netns::connect(Some(&ns))
        .map_err(|e| CniError::kernel(format!("netlink in {}", env.netns), e))?;
    if let Some(link) = nl::link_by_name(&cont, &env.ifname)
        .await
        .map_err(|e| CniError::kernel(format!("look up {} in {}", env.ifname, env.netns), e))?
    {
        if link.kind.as_deref() == Some("veth") {
            nl::delete_link(&cont, link.index).await.map_err(|e| {
                CniError::kernel(format!("delete {} in {}", env.ifname, env.netns), e)
            })?;
        }
    }
    Ok(())
}
