//! CHECK: the kernel and the store still match `prevResult`.

use super::addresses;
use super::{host_veth_name, open_pod_netns, prev_result, require_version, runtime};
use crate::config::Plan;
use crate::env::CniEnv;
use crate::error::{CniError, Result};
use cnilab_net::netns;
use cnilab_net::nl;
use cnilab_net::spec::{code, Version};
use std::net::IpAddr;

fn mismatch(msg: String) -> CniError {
    CniError::new(code::CHECK_MISMATCH, msg)
}

pub fn run(env: &CniEnv, plan: &Plan) -> Result<()> {
    require_version(plan, Version::V0_4_0, "CHECK")?;
    let prev = prev_result(plan)?.ok_or_else(|| {
        CniError::config("CHECK needs prevResult (the cached ADD result) in the config")
    })?;
    let idx = prev
        .interface_index(&env.ifname, Some(&env.netns))
        .ok_or_else(|| {
            mismatch(format!(
                "prevResult lists no interface {} with sandbox {}",
                env.ifname, env.netns
            ))
        })?;
    let expected = &prev.interfaces[idx];
    let ns = match open_pod_netns(env) {
        Ok(ns) => ns,
        // A namespace that is gone is a mismatch; a path that is not a
        // namespace at all (or the plugin's own) is a bad environment.
        Err(e) if !std::path::Path::new(&env.netns).exists() => {
            return Err(mismatch(format!("netns {}: {}", env.netns, e.msg)))
        }
        Err(e) => return Err(e),
    };
    let host_veth = host_veth_name(&env.container_id, &env.ifname);
    let rt = runtime()?;
    rt.block_on(async {
        let cont = netns::connect(Some(&ns))
            .map_err(|e| CniError::kernel(format!("netlink in {}", env.netns), e))?;
        let link = nl::link_by_name(&cont, &env.ifname)
            .await
            .map_err(|e| CniError::kernel(format!("look up {}", env.ifname), e))?
            .ok_or_else(|| {
                mismatch(format!(
                    "interface {} is missing from netns {}",
                    env.ifname, env.netns
                ))
            })?;
        let mac = link.mac.as_deref().unwrap_or("");
        if !expected.mac.is_empty() && !expected.mac.eq_ignore_ascii_case(mac) {
            return Err(mismatch(format!(
                "interface {} has MAC {mac}, prevResult says {}",
                env.ifname, expected.mac
            )));
        }
        if !link.up {
            return Err(mismatch(format!(
                "interface {} in {} is down",
                env.ifname, env.netns
            )));
        }
        let have = nl::addresses(&cont, Some(link.index))
            .await
            .map_err(|e| CniError::kernel(format!("addresses of {}", env.ifname), e))?;
        for ip in prev.ips.iter().filter(|ip| ip.interface == Some(idx)) {
            if !have.iter().any(|a| a.addr == ip.address) {
                return Err(mismatch(format!(
                    "address {} is missing from {} in {}",
                    ip.address, env.ifname, env.netns
                )));
            }
        }
        let routes = nl::all_routes(&cont)
            .await
            .map_err(|e| CniError::kernel(format!("routes in {}", env.netns), e))?;
        for r in &prev.routes {
            let found = routes
                .iter()
                .any(|k| k.dst == r.dst.trunc() && (r.gw.is_none() || k.gateway == r.gw));
            if !found {
                return Err(mismatch(format!(
                    "route {}{} is missing in {}",
                    r.dst,
                    r.gw.map(|g| format!(" via {g}")).unwrap_or_default(),
                    env.netns
                )));
            }
        }
        let host =
            netns::connect(None).map_err(|e| CniError::kernel("netlink in host namespace", e))?;
        let veth = nl::link_by_name(&host, &host_veth)
            .await
            .map_err(|e| CniError::kernel(format!("look up {host_veth}"), e))?
            .ok_or_else(|| mismatch(format!("host veth {host_veth} is missing")))?;
        let bridge = nl::link_by_name(&host, &plan.bridge)
            .await
            .map_err(|e| CniError::kernel(format!("look up {}", plan.bridge), e))?
            .ok_or_else(|| mismatch(format!("bridge {} is missing", plan.bridge)))?;
        if veth.controller != Some(bridge.index) {
            return Err(mismatch(format!(
                "host veth {host_veth} is not attached to bridge {}",
                plan.bridge
            )));
        }
        Ok(())
    })?;
    let ips: Vec<IpAddr> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface == Some(idx))
        .map(|ip| ip.address.addr())
        .collect();
    addresses::check(env, plan, &ips)
}
