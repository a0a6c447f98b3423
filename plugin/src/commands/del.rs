//! DEL: best effort and idempotent. Every step runs even when an earlier
//! one failed; the errors are reported together. It holds the
//! attachment's lock, so no ADD of the same attachment runs meanwhile.
//! Only what this attachment owns is removed: a link marked for another
//! attachment (see [`super::ownership_mark`]) is left alone and logged; a
//! link with no mark is removed only when the attachment's cache or this
//! network's store proves it ours (another plugin's pods are unmarked
//! too). Addresses come from the store's records and the attachment's
//! cache, never from `prevResult` nor from the pod's interface.

use super::addresses;
use super::Owner;
use super::{host_veth_name, note, owner_of, ownership_mark, refuse_own_netns, runtime, subnets};
use crate::attachments::Attachments;
use crate::config::Plan;
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
    // No ADD of this attachment runs while it is deleted.
    let attachments = Attachments::of(plan);
    let _lock = attachments
        .as_ref()
        .map(|a| a.lock(&env.container_id, &env.ifname))
        .transpose()?;
    // What ADD gave this attachment: the addresses to unmasquerade, and
    // the proof that unmarked links by its names are ours.
    let cached = match attachments
        .as_ref()
        .map(|a| a.read(&env.container_id, &env.ifname))
        .transpose()
    {
        Ok(cached) => cached.flatten(),
        Err(e) => {
            note(format!("{e}: ignored"));
            None
        }
    };
    let proven = cached.is_some();
    let cached_ips = cached.map(|c| c.ips).unwrap_or_default();
    let host_veth = host_veth_name(&env.container_id, &env.ifname);
    let mark = ownership_mark(&plan.name, &env.container_id, &env.ifname);
    let rt = runtime()?;
    // The kernel takes most of DEL's time tearing the veth down; the store
    // and the firewall are released on another thread meanwhile.
    let (mut errors, unproven, freed) = std::thread::scope(|s| {
        let addresses = s.spawn(|| release_addresses(env, plan, &cached_ips));
        let mut errors = Vec::new();
        let unproven = rt.block_on(remove_links(
            env,
            ns.as_ref(),
            &host_veth,
            &mark,
            proven,
            &mut errors,
        ));
        let (address_errors, freed) = addresses.join().unwrap_or_else(|_| {
            (
                vec![CniError::io("address release thread panicked")],
                Vec::new(),
            )
        });
        errors.extend(address_errors);
        (errors, unproven, freed)
    });
    // An unmarked link is deleted only when this network's store held
    // addresses for the attachment (a lost cache); else it may be another
    // plugin's, which names its veths the same way.
    if let Some(link) = unproven {
        if freed.is_empty() {
            note(format!(
                "left unmarked {}: nothing in this network's store or cache proves it ours",
                link.name
            ));
        } else if let Err(e) = rt.block_on(link.delete(ns.as_ref())) {
            errors.push(e);
        }
    }
    if let Some(a) = &attachments {
        if let Err(e) = a.remove(&env.container_id, &env.ifname) {
            errors.push(e);
        }
    }
    join(errors)
}

/// An unmarked link found by the attachment's names, not yet deleted.
struct Unproven {
    name: String,
    index: u32,
    in_pod: bool,
}

impl Unproven {
    async fn delete(&self, ns: Option<&std::fs::File>) -> Result<()> {
        let handle = match (self.in_pod, ns) {
            (true, Some(ns)) => netns::connect(Some(ns)),
            (true, None) => return Ok(()),
            (false, _) => netns::connect(None),
        }
        .map_err(|e| CniError::kernel("netlink", e))?;
        nl::delete_link(&handle, self.index)
            .await
            .map_err(|e| CniError::kernel(format!("delete {}", self.name), e))
    }
}

/// Removes the attachment's host veth, or (without one) a leftover pod
/// side, when marked for it, or unmarked and `proven` ours by the cache.
/// An unmarked link without proof is returned for the caller to decide.
async fn remove_links(
    env: &CniEnv,
    ns: Option<&std::fs::File>,
    host_veth: &str,
    mark: &str,
    proven: bool,
    errors: &mut Vec<CniError>,
) -> Option<Unproven> {
    let host = match netns::connect(None) {
        Ok(host) => host,
        Err(e) => {
            errors.push(CniError::kernel("netlink in host namespace", e));
            return None;
        }
    };
    match delete_host_veth(&host, host_veth, mark, proven).await {
        Ok(Found::Handled) => None,
        Ok(Found::Unproven(link)) => Some(link),
        // No host veth by our name: remove a leftover container side if
        // the namespace still exists.
        Ok(Found::Nothing) => match ns {
            Some(ns) => match delete_in_container(env, ns, mark, proven).await {
                Ok(link) => link,
                Err(e) => {
                    errors.push(e);
                    None
                }
            },
            None => None,
        },
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

enum Found {
    Nothing,
    Handled,
    Unproven(Unproven),
}

/// Deletes the host veth if it is this attachment's (marked, or unmarked
/// and proven).
async fn delete_host_veth(host: &Handle, name: &str, mark: &str, proven: bool) -> Result<Found> {
    let link = nl::link_by_name(host, name)
        .await
        .map_err(|e| CniError::kernel(format!("look up {name}"), e))?;
    let Some(link) = link else {
        return Ok(Found::Nothing);
    };
    match owner_of(link.alias.as_deref(), mark) {
        Owner::Other(owner) => {
            note(format!(
                "left host link {name}: it is marked {owner:?}, not {mark:?}"
            ));
            return Ok(Found::Handled);
        }
        Owner::Unmarked if !proven => {
            return Ok(Found::Unproven(Unproven {
                name: name.to_string(),
                index: link.index,
                in_pod: false,
            }))
        }
        _ => {}
    }
    nl::delete_link(host, link.index)
        .await
        .map_err(|e| CniError::kernel(format!("delete {name}"), e))?;
    Ok(Found::Handled)
}

/// Releases the attachment's addresses and their masquerade entries: the
/// addresses the store holds for this attachment and those its cache says
/// ADD gave it, nothing else (never what the pod's interface holds).
/// Returns the errors and what the store freed.
fn release_addresses(env: &CniEnv, plan: &Plan, cached: &[IpAddr]) -> (Vec<CniError>, Vec<IpAddr>) {
    let mut errors = Vec::new();
    let freed: Vec<IpAddr> = match addresses::release(env, plan) {
        Ok(freed) => freed,
        Err(e) => {
            errors.push(e);
            Vec::new()
        }
    };
    let mut ips = freed.clone();
    ips.extend(cached.iter().filter(|ip| !freed.contains(ip)));
    if plan.ip_masq && !ips.is_empty() {
        let nets: Vec<ipnet::IpNet> = ips.iter().map(|ip| ipnet::IpNet::from(*ip)).collect();
        if let Err(e) = masq::del(&plan.name, &subnets(plan, &nets), &ips) {
            errors.push(e);
        }
    }
    (errors, freed)
}

async fn delete_in_container(
    env: &CniEnv,
    ns: &std::fs::File,
    mark: &str,
    proven: bool,
) -> Result<Option<Unproven>> {
    let cont = netns::connect(Some(ns))
        .map_err(|e| CniError::kernel(format!("netlink in {}", env.netns), e))?;
    let Some(link) = nl::link_by_name(&cont, &env.ifname)
        .await
        .map_err(|e| CniError::kernel(format!("look up {} in {}", env.ifname, env.netns), e))?
    else {
        return Ok(None);
    };
    if link.kind.as_deref() != Some("veth") {
        return Ok(None);
    }
    match owner_of(link.alias.as_deref(), mark) {
        Owner::Other(owner) => {
            note(format!(
                "left {} in {}: it is marked {owner:?}, not {mark:?}",
                env.ifname, env.netns
            ));
            return Ok(None);
        }
        Owner::Unmarked if !proven => {
            return Ok(Some(Unproven {
                name: format!("{} in {}", env.ifname, env.netns),
                index: link.index,
                in_pod: true,
            }))
        }
        _ => {}
    }
    nl::delete_link(&cont, link.index)
        .await
        .map_err(|e| CniError::kernel(format!("delete {} in {}", env.ifname, env.netns), e))?;
    Ok(None)
}
