//! `apply`: a [`LabModel`] made into namespaces and kernel objects,
//! whatever produced the model (a compiled topology, a capture), and
//! [`Applied::down`] to remove them again. The lab's one builder: `Lab::up`
//! (`lab run`, `lab up`, scenarios) applies a compiled topology's
//! infrastructure here, `lab up --capture` a replayed capture.
//!
//! Where things happen: this file checks the model's structure (names,
//! devices, controllers: before anything is made), makes the namespaces and
//! walks the phases below; `links.rs` makes links and sets their
//! attributes, addresses and admin state; `objects.rs` adds routes, policy
//! rules, permanent neighbours, FDB entries and qdiscs; `tables.rs` writes
//! sysctls and loads nftables tables (`nft -f -`) and iptables-save text
//! (`ip[6]tables-{legacy,nft}-restore`) inside a namespace. Every netlink
//! request goes through one connection per namespace opened on a dedicated
//! thread inside it (`Netns::netlink`); nothing here calls `setns` on a
//! tokio worker.
//!
//! # Order
//! 1. Namespaces: underlay, then nodes, then pods (each through
//!    [`Options::make_ns`]: throwaway `cnilab-<pid>-<n>-<role>` by default,
//!    a standing lab's `cnilab-lab-<lab>-<role>` when the caller says so),
//!    and in each the global and `default` sysctls (so that links made next
//!    inherit them: `accept_dad`, `arp_notify`).
//! 2. Links, namespace by namespace in that order: bridges, dummies, veths
//!    (made from the first end met, the peer created directly in the peer's
//!    namespace), VXLAN (after its `dev`), macvlan/ipvlan (in the lower
//!    device's namespace, moved into their own at creation).
//! 3. In every namespace (in parallel): MTU, MAC when given, flags, the
//!    controller, bridge-port options, addresses, then `up`.
//! 4. In every namespace (in parallel): per-link sysctls, routes (without a
//!    gateway first; a route whose gateway is reached through another is
//!    retried once that one exists), rules, permanent neighbours, FDB
//!    entries (a `@<namespace>/<link>` MAC resolved from the link made in
//!    step 2), nftables tables, iptables-save text, qdiscs.
//!
//! # What is an error and what is "not made"
//! A model that contradicts itself (two namespaces or links of one name, a
//! route, neighbour, FDB entry or qdisc whose device is missing, an unknown
//! controller or VXLAN `dev`) is an [`ApplyError`] before anything is made.
//! A request the kernel refuses for a structural reason (a route, a rule,
//! a ruleset `nft` refuses) is an [`ApplyError`] naming namespace and
//! object; every namespace made so far is removed (they are RAII
//! [`Netns`]). What the kernel or the machine here cannot make (a link
//! kind it does not have, a physical device, a sysctl that does not exist,
//! a qdisc kind it lacks, a missing `iptables-legacy-restore`) is listed in
//! [`Applied::not_made`], and the rest is still made.

mod links;
mod objects;
mod tables;

use super::read::{Layout, NodeLayout};
use super::{LabModel, Namespace};
use crate::netns::{Netns, NetnsError};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Makes the namespace of a role (`switch`, `node1`, `node1-pod0`).
pub type MakeNs = dyn Fn(&str) -> Result<Netns, NetnsError> + Sync;

/// How to apply.
#[derive(Default)]
pub struct Options<'a> {
    /// Makes each namespace (default: a throwaway namespace labelled with
    /// the role's first 12 characters).
    pub make_ns: Option<&'a MakeNs>,
}

/// Something the kernel or machine here could not make; the rest was made.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NotMade {
    pub namespace: String,
    pub object: String,
    pub reason: String,
}

impl fmt::Display for NotMade {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.namespace, self.object, self.reason)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The model, or the kernel's answer to one of its objects.
    #[error("{namespace}: {object}: {reason}")]
    Object {
        namespace: String,
        object: String,
        reason: String,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

pub(super) fn object_error(
    ns: &str,
    object: impl Into<String>,
    reason: impl fmt::Display,
) -> ApplyError {
    ApplyError::Object {
        namespace: ns.to_string(),
        object: object.into(),
        reason: reason.to_string(),
    }
}

/// A node as applied: its namespace and its pods'.
pub struct AppliedNode {
    pub name: String,
    pub ns: Netns,
    pub pod_cidrs: Vec<IpNet>,
    pub pods: Vec<(String, Netns)>,
}

/// The namespaces [`apply`] made; dropped (or [`Applied::down`]), they are
/// removed, unless [`Applied::keep`] let go of them.
pub struct Applied {
    pub name: String,
    pub underlay: Vec<(String, Netns)>,
    pub nodes: Vec<AppliedNode>,
    /// What could not be made here (see the module's header).
    pub not_made: Vec<NotMade>,
}

impl Applied {
    /// The namespaces by role, for [`super::read::read`].
    pub fn layout(&self) -> Layout<'_> {
        Layout {
            name: self.name.clone(),
            underlay: self
                .underlay
                .iter()
                .map(|(r, ns)| (r.clone(), ns.file()))
                .collect(),
            nodes: self
                .nodes
                .iter()
                .map(|n| NodeLayout {
                    name: n.name.clone(),
                    ns: n.ns.file(),
                    pod_cidrs: n.pod_cidrs.clone(),
                    pods: n
                        .pods
                        .iter()
                        .map(|(p, ns)| (p.clone(), ns.file()))
                        .collect(),
                })
                .collect(),
        }
    }

    /// The namespace of a role.
    pub fn namespace(&self, role: &str) -> Option<&Netns> {
        self.all().find(|(r, _)| *r == role).map(|(_, ns)| ns)
    }

    fn all(&self) -> impl Iterator<Item = (&str, &Netns)> {
        self.underlay
            .iter()
            .map(|(r, ns)| (r.as_str(), ns))
            .chain(self.nodes.iter().flat_map(|n| {
                std::iter::once((n.name.as_str(), &n.ns))
                    .chain(n.pods.iter().map(|(p, ns)| (p.as_str(), ns)))
            }))
    }

    /// Removes every namespace (pods first, then nodes, then the underlay).
    pub fn down(self) {
        for node in self.nodes {
            drop(node.pods);
            drop(node.ns);
        }
        drop(self.underlay);
    }

    /// Lets go of every namespace without removing it; returns their
    /// names by role.
    pub fn keep(self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (role, ns) in self.underlay {
            out.push((role, ns.keep()));
        }
        for node in self.nodes {
            out.push((node.name, node.ns.keep()));
            for (role, ns) in node.pods {
                out.push((role, ns.keep()));
            }
        }
        out
    }
}

/// One namespace of the model with the namespace made for it.
pub(super) struct Target<'a> {
    pub model: &'a Namespace,
    pub netns: &'a Netns,
}

/// Makes `model` (see the module's header for the order and for what is
/// an error). On error, every namespace made so far is removed.
pub fn apply(model: &LabModel, opts: &Options) -> Result<Applied, ApplyError> {
    check(model)?;
    let default_make = |role: &str| {
        let label: String = role
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(12)
            .collect();
        Netns::with_label(&label)
    };
    let make: &MakeNs = opts.make_ns.unwrap_or(&default_make);
    let mut not_made = Vec::new();
    let mut applied = Applied {
        name: model.name.clone(),
        underlay: Vec::new(),
        nodes: Vec::new(),
        not_made: Vec::new(),
    };
    for ns in &model.underlay {
        applied
            .underlay
            .push((ns.name.clone(), made(make, ns, &mut not_made)?));
    }
    for node in &model.nodes {
        let ns = made(make, &node.net, &mut not_made)?;
        let mut pods = Vec::new();
        for pod in &node.pods {
            pods.push((pod.name.clone(), made(make, pod, &mut not_made)?));
        }
        applied.nodes.push(AppliedNode {
            name: node.net.name.clone(),
            ns,
            pod_cidrs: node.pod_cidrs.clone(),
            pods,
        });
    }
    let by_role: BTreeMap<&str, &Netns> = applied.all().collect();
    let targets: Vec<Target> = model
        .namespaces()
        .filter_map(|m| {
            by_role
                .get(m.name.as_str())
                .map(|netns| Target { model: m, netns })
        })
        .collect();
    let made_links = links::make(&targets, &by_role, &mut not_made)?;
    let macs = in_parallel(&targets, |t| links::configure(t, &made_links))?;
    let macs: BTreeMap<String, String> = targets
        .iter()
        .zip(macs)
        .flat_map(|(t, m)| {
            m.into_iter()
                .map(move |(link, mac)| (format!("@{}/{link}", t.model.name), mac))
        })
        .collect();
    let rest = in_parallel(&targets, |t| {
        let mut out = tables::sysctls(t, tables::Stage::Links);
        out.extend(objects::add(t, &made_links, &macs)?);
        out.extend(tables::firewall(t)?);
        out.extend(objects::qdiscs(t, &made_links)?);
        Ok(out)
    })?;
    not_made.extend(rest.into_iter().flatten());
    applied.not_made = not_made;
    Ok(applied)
}

/// Makes one namespace and writes its global and `default` sysctls.
fn made(make: &MakeNs, ns: &Namespace, not_made: &mut Vec<NotMade>) -> Result<Netns, ApplyError> {
    let netns = make(&ns.name)?;
    not_made.extend(tables::sysctls(
        &Target {
            model: ns,
            netns: &netns,
        },
        tables::Stage::Namespace,
    ));
    Ok(netns)
}

/// Runs `f` for every target on a few threads (each target's netlink
/// connection is opened on a thread of its own inside its namespace);
/// the first error wins.
fn in_parallel<R: Send>(
    targets: &[Target],
    f: impl Fn(&Target) -> Result<R, ApplyError> + Sync,
) -> Result<Vec<R>, ApplyError> {
    const THREADS: usize = 8;
    let per = targets.len().div_ceil(THREADS).max(1);
    let chunks: Vec<&[Target]> = targets.chunks(per).collect();
    let done = crate::util::parallel_map(
        chunks,
        |chunk| chunk.iter().map(&f).collect::<Result<Vec<R>, ApplyError>>(),
        || Err(object_error("apply", "thread", "panicked")),
    );
    let mut out = Vec::with_capacity(targets.len());
    for chunk in done {
        out.extend(chunk?);
    }
    Ok(out)
}

/// The model's structure: unique names, and every device, controller and
/// VXLAN `dev` a namespace's objects name is one of its links.
pub fn check(model: &LabModel) -> Result<(), ApplyError> {
    let mut roles = BTreeSet::new();
    for ns in model.namespaces() {
        if !roles.insert(ns.name.as_str()) {
            return Err(object_error(
                &ns.name,
                "namespace",
                "named twice in the model",
            ));
        }
        let mut names = BTreeSet::new();
        for l in &ns.links {
            if !names.insert(l.name.as_str()) {
                return Err(object_error(
                    &ns.name,
                    format!("link {}", l.name),
                    "named twice",
                ));
            }
        }
        let missing = |what: String, dev: &str| {
            object_error(
                &ns.name,
                what,
                format!("its device {dev} is not one of the namespace's links"),
            )
        };
        for l in &ns.links {
            let named = [
                l.controller.as_deref(),
                l.vxlan.as_ref().and_then(|v| v.dev.as_deref()),
            ];
            for dev in named.into_iter().flatten() {
                if !names.contains(dev) {
                    return Err(missing(format!("link {}", l.name), dev));
                }
            }
        }
        for r in &ns.routes {
            let devs = r
                .dev
                .iter()
                .chain(r.nexthops.iter().filter_map(|h| h.dev.as_ref()));
            for dev in devs {
                if !names.contains(dev.as_str()) {
                    return Err(missing(format!("route {}", objects::route_text(r)), dev));
                }
            }
        }
        let others = ns
            .neighbours
            .iter()
            .map(|n| (format!("neighbour {} dev {}", n.addr, n.dev), &n.dev))
            .chain(
                ns.fdb
                    .iter()
                    .map(|f| (format!("fdb entry {} dev {}", f.mac, f.dev), &f.dev)),
            )
            .chain(
                ns.qdiscs
                    .iter()
                    .map(|q| (format!("qdisc {} dev {}", q.kind, q.dev), &q.dev)),
            );
        for (what, dev) in others {
            if !names.contains(dev.as_str()) {
                return Err(missing(what, dev));
            }
        }
    }
    Ok(())
}
