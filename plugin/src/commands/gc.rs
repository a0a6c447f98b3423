//! GC (1.1.0): everything not in the valid-attachments list goes: its
//! reservation, its host veth, its masquerade entry. Partial failures do not
//! stop the sweep; they are reported at the end.

use super::{delegate, host_veth_name, is_mark, marked_attachment, require_version, runtime};
use crate::config::{IpamPlan, Plan};
use crate::env::CniEnv;
use crate::error::{join, CniError, Result};
use crate::ipam::{Store, LOCK_TIMEOUT};
use crate::masq;
use cnilab_net::netns;
use cnilab_net::nl;
use cnilab_net::spec::Version;
use std::collections::HashSet;
use std::net::IpAddr;

pub fn run(env: &CniEnv, plan: &Plan) -> Result<()> {
    require_version(plan, Version::V1_1_0, "GC")?;
    // A missing list is not "nothing is valid": that reading would delete
    // every live pod. Only an explicit empty list means none.
    let listed = plan.valid_attachments.as_ref().ok_or_else(|| {
        CniError::config(
            "GC needs \"cni.dev/valid-attachments\" (or \"cni.dev/attachments\") in the config; give [] to collect everything",
        )
    })?;
    let valid: HashSet<(String, String)> = listed
        .iter()
        .map(|a| (a.container_id.clone(), a.ifname.clone()))
        .collect();
    let keep_veths: HashSet<String> = valid.iter().map(|(c, i)| host_veth_name(c, i)).collect();
    let mut errors = Vec::new();
    let mut stale_ips: Vec<IpAddr> = Vec::new();
    let mut live_ips: Vec<IpAddr> = Vec::new();
    match &plan.ipam {
        IpamPlan::None => {}
        IpamPlan::Delegate { plugin } => {
            if let Err(e) = delegate::exec(plugin, "GC", env, &plan.raw) {
                errors.push(e);
            }
        }
        IpamPlan::Builtin(ipam) if ipam.store_dir.exists() => {
            match Store::open_locked(&ipam.store_dir, LOCK_TIMEOUT)
                .and_then(|s| s.records().map(|r| (s, r)))
            {
                Ok((store, records)) => {
                    for r in records {
                        if valid.contains(&(r.container_id.clone(), r.ifname.clone())) {
                            live_ips.push(r.ip);
                            continue;
                        }
                        match store.release_ip(r.ip, &r.container_id, &r.ifname) {
                            Ok(_) => stale_ips.push(r.ip),
                            Err(e) => errors.push(e),
                        }
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        IpamPlan::Builtin(_) => {}
    }
    // Host veths on our bridge that belong to no valid attachment.
    if let Err(e) = remove_stale_veths(plan, &valid, &keep_veths) {
        errors.push(e);
    }
    if plan.ip_masq {
        // Masquerade entries whose pod is gone, including ones whose record
        // was lost (an ADD killed between the rule and the reply).
        match masq::listed(&plan.name) {
            Ok(listed) => stale_ips.extend(listed.into_iter().filter(|ip| !live_ips.contains(ip))),
            Err(e) => errors.push(e),
        }
        stale_ips.sort();
        stale_ips.dedup();
        let nets: Vec<ipnet::IpNet> = stale_ips.iter().map(|ip| ipnet::IpNet::from(*ip)).collect();
        if let Err(e) = masq::del(&plan.name, &super::subnets(plan, &nets), &stale_ips) {
            errors.push(e);
        }
    }
    join(errors)
}

/// Host veths on the bridge that belong to no valid attachment of this
/// network: marked for this network and not listed, or unmarked (a lost
/// mark), named the way this plugin names host veths and not listed. A
/// veth marked for another network sharing the bridge is never touched.
fn remove_stale_veths(
    plan: &Plan,
    valid: &HashSet<(String, String)>,
    keep: &HashSet<String>,
) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let host =
            netns::connect(None).map_err(|e| CniError::kernel("netlink in host namespace", e))?;
        let Some(bridge) = nl::link_by_name(&host, &plan.bridge)
            .await
            .map_err(|e| CniError::kernel(format!("look up {}", plan.bridge), e))?
        else {
            return Ok(());
        };
        let links = nl::links(&host)
            .await
            .map_err(|e| CniError::kernel("list links", e))?;
        let mut errors = Vec::new();
        for link in links {
            if link.controller != Some(bridge.index) || link.kind.as_deref() != Some("veth") {
                continue;
            }
            let stale = match link.alias.as_deref() {
                Some(alias) if is_mark(alias) => match marked_attachment(alias, &plan.name) {
                    Some(attachment) => !valid.contains(&attachment),
                    None => false,
                },
                _ => {
                    link.name.starts_with("veth")
                        && link.name.len() == 12
                        && !keep.contains(&link.name)
                }
            };
            if stale {
                if let Err(e) = nl::delete_link(&host, link.index).await {
                    errors.push(CniError::kernel(format!("delete stale {}", link.name), e));
                }
            }
        }
        join(errors)
    })
}
