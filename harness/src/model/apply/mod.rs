//! `apply`: a [`LabModel`] made into namespaces and kernel objects,
//! whatever produced the model (a compiled topology, a capture), and
//! [`Applied::down`] to remove them again; [`apply_diff`] turns namespaces
//! standing as one model into another (a node that joins or leaves a
//! running lab). The lab's one builder: `Lab::up` (`lab run`, `lab up`,
//! scenarios) applies a compiled topology's infrastructure here, `lab up
//! --capture` a replayed capture, `Lab::add_node`/`remove_node` the
//! difference between the topology compiled with and without the node.
//!
//! Where things happen: this file checks the model's structure (names,
//! devices, controllers: before anything is made), makes the namespaces and
//! walks the phases below, for a whole model and for a diff; `diff.rs`
//! computes the difference of two models (pure); `links.rs` makes links
//! and sets their attributes, addresses and admin state; `objects.rs` adds
//! (and, for a diff, removes) routes, policy rules, permanent neighbours,
//! FDB entries, and adds qdiscs; `remove.rs` removes what a diff takes out
//! of a standing namespace (those objects, nftables tables, links);
//! `tables.rs` writes
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
//!
//! # A diff
//! [`apply_diff`] checks the new model whole, removes from the standing
//! namespaces what only the old model holds (objects, then nftables tables,
//! then links), makes the namespaces only the new one has (step 1), and
//! runs steps 2 to 4 on them and on what the standing namespaces gain, with
//! the standing links counted as made; a route a standing namespace already
//! has is left as it is (the plugin's routes stand there too).

pub(crate) mod diff;
mod links;
mod objects;
mod remove;
mod tables;
pub(crate) use tables::sysctl_allowed;

pub use diff::{diff, ModelDiff, Place};

use super::read::{Layout, NodeLayout};
use super::{LabModel, Namespace};
use crate::netns::{Netns, NetnsError};
use ipnet::IpNet;
use links::Made;
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
    /// What to make (of a model diff: what to add or remove).
    pub model: &'a Namespace,
    /// The whole namespace of the model (its links, for lookups).
    pub whole: &'a Namespace,
    pub netns: &'a Netns,
}

/// Makes `model` (see the module's header for the order and for what is
/// an error). On error, every namespace made so far is removed.
pub fn apply(model: &LabModel, opts: &Options) -> Result<Applied, ApplyError> {
    check(model)?;
    let default_make = default_maker();
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
            by_role.get(m.name.as_str()).map(|netns| Target {
                model: m,
                whole: m,
                netns,
            })
        })
        .collect();
    let steps = Steps {
        targets: &targets,
        by_role: &by_role,
        standing: Made::new(),
        lookups: &[],
        replace: true,
    };
    not_made.extend(steps.run()?);
    applied.not_made = not_made;
    Ok(applied)
}

/// Steps 2 to 4 of apply (links, their attributes, the objects on them),
/// for a whole model or a model diff's additions.
struct Steps<'a> {
    targets: &'a [Target<'a>],
    /// Every namespace a link may be made in or point to.
    by_role: &'a BTreeMap<&'a str, &'a Netns>,
    /// Links that stand already, as `(namespace, link)`.
    standing: Made,
    /// Namespaces read only for their links' MACs (`@ns/link`).
    lookups: &'a [Target<'a>],
    /// Whether a route that exists is replaced.
    replace: bool,
}

impl Steps<'_> {
    fn run(self) -> Result<Vec<NotMade>, ApplyError> {
        let mut not_made = Vec::new();
        let mut made_links = links::make(self.targets, self.by_role, &mut not_made)?;
        made_links.extend(self.standing);
        let all: Vec<&Target> = self.targets.iter().chain(self.lookups).collect();
        let macs = macs_of(&all, &made_links)?;
        let replace = self.replace;
        let rest = in_parallel(self.targets, |t| {
            let mut out = tables::sysctls(t, tables::Stage::Links);
            out.extend(objects::add(t, &made_links, &macs, replace)?);
            out.extend(tables::firewall(t)?);
            out.extend(objects::qdiscs(t, &made_links)?);
            out.extend(t.model.hooks.iter().map(|h| {
                let (object, reason) = super::bpf::not_replayed(h);
                NotMade {
                    namespace: t.model.name.clone(),
                    object,
                    reason,
                }
            }));
            Ok(out)
        })?;
        not_made.extend(rest.into_iter().flatten());
        Ok(not_made)
    }
}

/// Step 3 in every target (in parallel); returns every link's MAC by
/// `@<namespace>/<link>`.
fn macs_of(targets: &[&Target], made: &Made) -> Result<BTreeMap<String, String>, ApplyError> {
    let macs = in_parallel(targets, |t| links::configure(t, made))?;
    Ok(targets
        .iter()
        .zip(macs)
        .flat_map(|(t, m)| {
            m.into_iter()
                .map(move |(link, mac)| (format!("@{}/{link}", t.model.name), mac))
        })
        .collect())
}

/// What [`apply_diff`] made and what it leaves to its caller.
pub struct Changed {
    /// The namespaces made: the underlay's and the nodes' (with their pods).
    pub made: Applied,
    /// Pods made in standing nodes: `(node, pod, namespace)`.
    pub pods: Vec<(String, String, Netns)>,
    /// The roles of the standing namespaces the new model no longer has;
    /// their owner drops them.
    pub gone: Vec<String>,
    /// The difference applied.
    pub diff: ModelDiff,
}

/// Turns the lab standing as `old` (its namespaces by role in `standing`)
/// into `new`: removes from the standing namespaces what only `old` holds,
/// makes the namespaces only `new` has, and adds to the standing ones what
/// only `new` holds, with apply's own steps (see [`diff`] for how objects
/// are compared). Routes that exist in a standing namespace are left as
/// they are. `new` is checked whole first; on error the namespaces made so
/// far are removed.
pub fn apply_diff(
    old: &LabModel,
    new: &LabModel,
    standing: &BTreeMap<&str, &Netns>,
    opts: &Options,
) -> Result<Changed, ApplyError> {
    check(new)?;
    let d = diff(old, new);
    let stand = |name: &str| {
        standing
            .get(name)
            .copied()
            .ok_or_else(|| object_error(name, "namespace", "not standing"))
    };
    let whole_old: BTreeMap<&str, &Namespace> =
        old.namespaces().map(|n| (n.name.as_str(), n)).collect();
    let whole_new: BTreeMap<&str, &Namespace> =
        new.namespaces().map(|n| (n.name.as_str(), n)).collect();
    // The links standing in a namespace, as `(namespace, link)`.
    let links_of = |model: &BTreeMap<&str, &Namespace>, names: &mut dyn Iterator<Item = &str>| {
        let mut out = Made::new();
        for name in names {
            for l in model
                .get(name)
                .map(|n| n.links.as_slice())
                .unwrap_or_default()
            {
                out.insert((name.to_string(), l.name.clone()));
            }
        }
        out
    };
    let mut not_made = Vec::new();
    // 1. What only `old` holds, out of the standing namespaces.
    let removing = d
        .removed
        .iter()
        .map(|m| {
            Ok(Target {
                model: m,
                whole: whole_old.get(m.name.as_str()).copied().unwrap_or(m),
                netns: stand(&m.name)?,
            })
        })
        .collect::<Result<Vec<_>, ApplyError>>()?;
    if !removing.is_empty() {
        let before = links_of(
            &whole_old,
            &mut removing.iter().map(|t| t.model.name.as_str()),
        );
        let empty = named_elsewhere(&removing);
        let looked = mac_only(&empty, standing);
        let refs: Vec<&Target> = removing.iter().chain(&looked).collect();
        let macs = macs_of(&refs, &Made::new())?;
        for t in &removing {
            not_made.extend(remove::remove(t, &before, &macs)?);
        }
    }
    // 2. The namespaces only `new` has.
    let default_make = default_maker();
    let make: &MakeNs = opts.make_ns.unwrap_or(&default_make);
    let mut changed = Changed {
        made: Applied {
            name: new.name.clone(),
            underlay: Vec::new(),
            nodes: Vec::new(),
            not_made: Vec::new(),
        },
        pods: Vec::new(),
        gone: d.gone.clone(),
        diff: ModelDiff::default(),
    };
    for (place, ns) in &d.made {
        let netns = made(make, ns, &mut not_made)?;
        let name = ns.name.clone();
        match place {
            Place::Underlay => changed.made.underlay.push((name, netns)),
            Place::Node(pod_cidrs) => changed.made.nodes.push(AppliedNode {
                name,
                ns: netns,
                pod_cidrs: pod_cidrs.clone(),
                pods: Vec::new(),
            }),
            Place::Pod(node) => match changed.made.nodes.iter_mut().find(|n| n.name == *node) {
                Some(n) => n.pods.push((name, netns)),
                None => changed.pods.push((node.clone(), name, netns)),
            },
        }
    }
    // 3. What only `new` holds, in the model's order.
    let mut by_role: BTreeMap<&str, &Netns> = standing
        .iter()
        .filter(|(r, _)| !d.gone.iter().any(|g| g == *r))
        .map(|(r, n)| (*r, *n))
        .collect();
    by_role.extend(changed.made.all());
    by_role.extend(changed.pods.iter().map(|(_, p, ns)| (p.as_str(), ns)));
    let parts: BTreeMap<&str, &Namespace> = d
        .made
        .iter()
        .map(|(_, ns)| ns)
        .chain(&d.added)
        .map(|ns| (ns.name.as_str(), ns))
        .collect();
    let targets: Vec<Target> = new
        .namespaces()
        .filter_map(|whole| {
            let model = parts.get(whole.name.as_str())?;
            let netns = by_role.get(whole.name.as_str())?;
            Some(Target {
                model,
                whole,
                netns,
            })
        })
        .collect();
    let fresh: Vec<&str> = d.made.iter().map(|(_, ns)| ns.name.as_str()).collect();
    let standing_links = links_of(
        &whole_new,
        &mut whole_new.keys().copied().filter(|n| !fresh.contains(n)),
    );
    let empty = named_elsewhere(&targets);
    let looked = mac_only(&empty, &by_role);
    let steps = Steps {
        targets: &targets,
        by_role: &by_role,
        standing: standing_links
            .into_iter()
            .filter(|(ns, l)| !d.added.iter().any(|a| a.name == *ns && a.link(l).is_some()))
            .collect(),
        lookups: &looked,
        replace: false,
    };
    not_made.extend(steps.run()?);
    changed.made.not_made = not_made;
    changed.diff = d;
    Ok(changed)
}

/// The namespaces whose links' MACs the targets name (`@ns/link`) and
/// that are no target: read for their MACs only.
fn named_elsewhere(targets: &[Target]) -> Vec<Namespace> {
    let named: BTreeSet<&str> = targets
        .iter()
        .flat_map(|t| {
            let m = t.model;
            m.fdb
                .iter()
                .map(|f| f.mac.as_str())
                .chain(m.neighbours.iter().filter_map(|n| n.mac.as_deref()))
        })
        .filter_map(|mac| mac.strip_prefix('@')?.split_once('/').map(|(ns, _)| ns))
        .filter(|ns| !targets.iter().any(|t| t.model.name == *ns))
        .collect();
    named.into_iter().map(Namespace::new).collect()
}

/// Targets that hold nothing to make: their MACs are read.
fn mac_only<'a>(empty: &'a [Namespace], by_role: &BTreeMap<&str, &'a Netns>) -> Vec<Target<'a>> {
    empty
        .iter()
        .filter_map(|ns| {
            by_role.get(ns.name.as_str()).map(|netns| Target {
                model: ns,
                whole: ns,
                netns,
            })
        })
        .collect()
}

/// A throwaway namespace labelled with the role's first 12 characters.
fn default_maker() -> impl Fn(&str) -> Result<Netns, NetnsError> + Sync {
    |role: &str| {
        let label: String = role
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(12)
            .collect();
        Netns::with_label(&label)
    }
}

/// Makes one namespace and writes its global and `default` sysctls.
fn made(make: &MakeNs, ns: &Namespace, not_made: &mut Vec<NotMade>) -> Result<Netns, ApplyError> {
    let netns = make(&ns.name)?;
    not_made.extend(tables::sysctls(
        &Target {
            model: ns,
            whole: ns,
            netns: &netns,
        },
        tables::Stage::Namespace,
    ));
    Ok(netns)
}

/// Runs `f` for every target on a few threads (each target's netlink
/// connection is opened on a thread of its own inside its namespace);
/// the first error wins.
fn in_parallel<T: Sync, R: Send>(
    targets: &[T],
    f: impl Fn(&T) -> Result<R, ApplyError> + Sync,
) -> Result<Vec<R>, ApplyError> {
    const THREADS: usize = 8;
    let per = targets.len().div_ceil(THREADS).max(1);
    let chunks: Vec<&[T]> = targets.chunks(per).collect();
    let done = crate::util::parallel_map(
        chunks,
        crate::util::A_THREAD_EACH,
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
