//! GC (1.1.0): every attachment not in the valid-attachments list goes:
//! its reservation, its host veth, its cache, its masquerade entry.
//!
//! Everything GC needs is read first: the store's records (under its lock),
//! the attachments' caches, the masquerade set and the bridge's links. When
//! any of that cannot be read (a lock timeout, a store error), GC changes
//! nothing and answers the error. What is live comes from the runtime's
//! list: a listed attachment's records and cached addresses, and the links
//! marked for it. An unmarked link is removed only when it carries the name
//! of an unlisted attachment that this network's store or cache knows.
//! Partial failures while removing do not stop the sweep; they are
//! reported at the end.

use super::{delegate, host_veth_name, is_mark, marked_attachment, note, require_version, runtime};
use crate::attachments::Attachments;
use crate::config::{IpamPlan, Plan};
use crate::env::CniEnv;
use crate::error::{join, CniError, Result};
use crate::ipam::{Record, Store, LOCK_TIMEOUT};
use crate::masq;
use cnilab_net::netns;
use cnilab_net::nl::{self, Link};
use cnilab_net::spec::Version;
use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;

type AttachmentId = (String, String);

pub fn run(env: &CniEnv, plan: &Plan) -> Result<()> {
    require_version(plan, Version::V1_1_0, "GC")?;
    // A missing list is not "nothing is valid": that reading would delete
    // every live pod. Only an explicit empty list means none.
    let listed = plan.valid_attachments.as_ref().ok_or_else(|| {
        CniError::config(
            "GC needs \"cni.dev/valid-attachments\" (or \"cni.dev/attachments\") in the config; give [] to collect everything",
        )
    })?;
    let valid: HashSet<AttachmentId> = listed
        .iter()
        .map(|a| (a.container_id.clone(), a.ifname.clone()))
        .collect();

    // Read everything first; any failure here changes nothing.
    let store = match &plan.ipam {
        IpamPlan::Builtin(ipam) if ipam.store_dir.exists() => {
            let store = Store::open_locked(&ipam.store_dir, LOCK_TIMEOUT)?;
            let records = store.records()?;
            Some((store, records))
        }
        _ => None,
    };
    let records: &[Record] = store.as_ref().map(|(_, r)| r.as_slice()).unwrap_or(&[]);
    let attachments = Attachments::of(plan);
    let cached = match &attachments {
        Some(a) => a.all()?,
        None => Vec::new(),
    };
    let masqueraded = if plan.ip_masq {
        masq::listed(&plan.name)?
    } else {
        Vec::new()
    };
    let links = bridge_links(plan)?;

    // Liveness: what the listed attachments hold, by record or cache.
    let mut live_ips: BTreeSet<IpAddr> = BTreeSet::new();
    let mut known: HashSet<AttachmentId> = HashSet::new();
    for r in records {
        let id = (r.container_id.clone(), r.ifname.clone());
        if valid.contains(&id) {
            live_ips.insert(r.ip);
        }
        known.insert(id);
    }
    for c in &cached {
        let id = (c.container_id.clone(), c.ifname.clone());
        if valid.contains(&id) {
            live_ips.extend(c.ips.iter().copied());
        }
        known.insert(id);
    }
    // A listed attachment with neither a record nor a cache (made by an
    // older version) has addresses GC cannot know: then only the entries
    // of unlisted attachments' records and caches are stale.
    let unknown_live = matches!(plan.ipam, IpamPlan::Delegate { .. })
        && valid.iter().any(|id| !known.contains(id));
    let stale: Vec<&AttachmentId> = known.iter().filter(|id| !valid.contains(*id)).collect();

    let mut errors = Vec::new();
    if let IpamPlan::Delegate { plugin } = &plan.ipam {
        if let Err(e) = delegate::exec(plugin, "GC", env, &plan.raw) {
            errors.push(e);
        }
    }
    let mut stale_ips: BTreeSet<IpAddr> = BTreeSet::new();
    if let Some((store, records)) = &store {
        for r in records
            .iter()
            .filter(|r| !valid.contains(&(r.container_id.clone(), r.ifname.clone())))
        {
            match store.release_ip(r.ip, &r.container_id, &r.ifname) {
                Ok(_) => {
                    stale_ips.insert(r.ip);
                }
                Err(e) => errors.push(e),
            }
        }
    }
    if let Some(a) = &attachments {
        a.sweep();
        for c in cached
            .iter()
            .filter(|c| !valid.contains(&(c.container_id.clone(), c.ifname.clone())))
        {
            stale_ips.extend(c.ips.iter().copied());
            if let Err(e) = a.remove(&c.container_id, &c.ifname) {
                errors.push(e);
            }
        }
    }
    let stale_names: HashSet<String> = stale.iter().map(|(c, i)| host_veth_name(c, i)).collect();
    if let Err(e) = remove_stale_veths(plan, &links, &valid, &stale_names) {
        errors.push(e);
    }
    if plan.ip_masq {
        // Masquerade entries whose pod is gone, including ones whose record
        // was lost (an ADD killed between the rule and the reply), unless a
        // listed attachment's addresses are unknown.
        if unknown_live {
            note("kept masquerade entries without a record or cache: a listed attachment has neither");
        } else {
            stale_ips.extend(masqueraded.iter().copied());
        }
        let stale_ips: Vec<IpAddr> = stale_ips.difference(&live_ips).copied().collect();
        let nets: Vec<ipnet::IpNet> = stale_ips.iter().map(|ip| ipnet::IpNet::from(*ip)).collect();
        // With nft, only entries that are there: an absent table is not
        // created. (iptables deletes rules, which creates nothing.)
        let present: Vec<IpAddr> = stale_ips
            .iter()
            .filter(|ip| masq::backend() != "nft" || masqueraded.contains(ip))
            .copied()
            .collect();
        if let Err(e) = masq::del(&plan.name, &super::subnets(plan, &nets), &present) {
            errors.push(e);
        }
    }
    join(errors)
}

/// The veths enslaved to the network's bridge (none without a bridge).
fn bridge_links(plan: &Plan) -> Result<Vec<Link>> {
    let rt = runtime()?;
    rt.block_on(async {
        let host =
            netns::connect(None).map_err(|e| CniError::kernel("netlink in host namespace", e))?;
        let Some(bridge) = nl::link_by_name(&host, &plan.bridge)
            .await
            .map_err(|e| CniError::kernel(format!("look up {}", plan.bridge), e))?
        else {
            return Ok(Vec::new());
        };
        let links = nl::links(&host)
            .await
            .map_err(|e| CniError::kernel("list links", e))?;
        Ok(links
            .into_iter()
            .filter(|l| l.controller == Some(bridge.index) && l.kind.as_deref() == Some("veth"))
            .collect())
    })
}

/// Host veths on the bridge that belong to no valid attachment of this
/// network: marked for this network and not listed, or unmarked and named
/// for an unlisted attachment this network's store or cache knows. A veth
/// marked for another network, or unmarked and unknown (another plugin's
/// pod), is never touched.
fn remove_stale_veths(
    plan: &Plan,
    links: &[Link],
    valid: &HashSet<AttachmentId>,
    stale_names: &HashSet<String>,
) -> Result<()> {
    let doomed: Vec<&Link> = links
        .iter()
        .filter(|link| match link.alias.as_deref() {
            Some(alias) if is_mark(alias) => match marked_attachment(alias, &plan.name) {
                Some(attachment) => !valid.contains(&attachment),
                None => false,
            },
            _ => stale_names.contains(&link.name),
        })
        .collect();
    if doomed.is_empty() {
        return Ok(());
    }
    let rt = runtime()?;
    rt.block_on(async {
        let host =
            netns::connect(None).map_err(|e| CniError::kernel("netlink in host namespace", e))?;
        let mut errors = Vec::new();
        for link in doomed {
            if let Err(e) = nl::delete_link(&host, link.index).await {
                errors.push(CniError::kernel(format!("delete stale {}", link.name), e));
            }
        }
        join(errors)
    })
}
