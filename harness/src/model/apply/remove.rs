//! What a model diff removes from a standing namespace (the reverse of
//! apply's steps): routes, rules, neighbours and FDB entries with the
//! requests that add them (`objects.rs`), nftables tables by name, then the
//! links (a veth's peer goes with it). Something already gone is not an
//! error. Qdiscs and iptables-save text are not removed (listed as not
//! made); a sysctl keeps its value.

use super::links::Made;
use super::{object_error, objects, ApplyError, NotMade, Target};
use crate::model::LinkKind;
use cnilab_net::nft::NftError;
use std::collections::BTreeMap;
use std::path::Path;

/// Removes what `t.model` holds from `t.netns`; `made` holds the links
/// standing before (for the objects on them), `macs` the `@ns/link` MACs.
pub(super) fn remove(
    t: &Target,
    made: &Made,
    macs: &BTreeMap<String, String>,
) -> Result<Vec<NotMade>, ApplyError> {
    let ns = &t.model.name;
    let mut not_made = objects::remove(t, made, macs)?;
    for table in &t.model.nftables {
        let what = format!("nftables table {} {}", table.family, table.name);
        let args = ["delete", "table", &table.family, &table.name];
        match cnilab_net::nft::run(Path::new("nft"), Some(t.netns.file()), &args, None) {
            Ok(_) => {}
            Err(NftError::Failed { stderr, .. }) if stderr.contains("No such file") => {}
            Err(e) => return Err(object_error(ns, what, e)),
        }
    }
    let mut links: Vec<(u8, String)> = t
        .model
        .links
        .iter()
        .filter(|l| l.kind != LinkKind::Loopback)
        .map(|l| (super::links::order(&l.kind), l.name.clone()))
        .collect();
    // Made last, removed first: a VXLAN device before its `dev`, ports
    // before their bridge.
    links.sort_by(|a, b| b.cmp(a));
    let names: Vec<String> = links.into_iter().map(|(_, n)| n).collect();
    let done = t.netns.netlink(|h| async move {
        for name in &names {
            if let Err(e) = cnilab_net::nl::delete_link_by_name(&h, name).await {
                return Ok(Err((format!("link {name}"), e.to_string())));
            }
        }
        Ok::<_, rtnetlink::Error>(Ok(()))
    });
    match done {
        Ok(Ok(())) => {}
        Ok(Err((object, reason))) => return Err(object_error(ns, object, reason)),
        Err(e) => return Err(object_error(ns, "links", e)),
    }
    let kept = t
        .model
        .qdiscs
        .iter()
        .map(|q| format!("qdisc {} {} dev {}", q.kind, q.handle, q.dev))
        .chain(
            t.model
                .iptables
                .iter()
                .map(|i| format!("{} {} iptables", i.backend, i.family)),
        );
    not_made.extend(kept.map(|object| NotMade {
        namespace: ns.clone(),
        object,
        reason: "a model diff does not remove it".into(),
    }));
    Ok(not_made)
}
