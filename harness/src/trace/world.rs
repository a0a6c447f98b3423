//! The [`World`] the tracer reads: each namespace by role at its path,
//! read into the model's [`Namespace`] only when the trace crosses it (or
//! must ask who owns an address), once, then kept. Nothing lab-specific:
//! a real node's `/proc/<pid>/ns/net` paths do as well.
//!
//! Who owns an address is answered from the addresses the caller already
//! knows ([`Addresses`]), each checked in the namespace it names, before
//! any namespace is read to look for it; namespaces the caller calls ends
//! (their addresses all known, nothing behind them: pods) are never read
//! to look for an address.

use super::Death;
use crate::model::{Link, Namespace};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::OnceLock;

/// A link-local address (169.254/16, fe80::/10): each link's own, never
/// one to find an owner or a twin by.
pub(crate) fn link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    }
}

/// What the caller knows of addresses before anything is read.
#[derive(Clone, Debug, Default)]
pub struct Addresses {
    /// Address → the role that holds it (checked when asked).
    pub known: BTreeMap<IpAddr, String>,
    /// Roles whose addresses are all in `known` and behind which nothing
    /// else is (a pod): never read to find an address's owner.
    pub ends: BTreeSet<String>,
}

/// A namespace as read, with its link names by index (to name the far end
/// of a veth that comes from another namespace).
struct Loaded {
    ns: Namespace,
    names: BTreeMap<u32, String>,
}

/// What the tracer reads: each namespace, by role, at its path, read when
/// first asked for.
pub struct World {
    files: BTreeMap<String, (PathBuf, File)>,
    /// Role → the node it belongs to (`None`: underlay).
    nodes: BTreeMap<String, Option<String>>,
    addresses: Addresses,
    /// Roles in the order an owner is looked for: the underlay, then each
    /// node followed by its own namespaces.
    order: Vec<String>,
    read: BTreeMap<String, OnceLock<Result<Loaded, String>>>,
    /// A world of one node: what leaves it is followed no further.
    one_node: bool,
}

impl World {
    /// `paths`: role → namespace path; `nodes`: role → its node.
    pub fn new(
        paths: BTreeMap<String, PathBuf>,
        nodes: BTreeMap<String, Option<String>>,
        addresses: Addresses,
    ) -> Result<World, String> {
        let mut files = BTreeMap::new();
        for (role, path) in paths {
            let f = cnilab_net::netns::open_network_namespace(&path)
                .map_err(|e| format!("{role}: {e}"))?;
            files.insert(role, (path, f));
        }
        let node_of = |r: &String| nodes.get(r).cloned().flatten();
        let mut order: Vec<String> = files
            .keys()
            .filter(|r| node_of(r).is_none())
            .cloned()
            .collect();
        let node_roles: BTreeSet<String> = files.keys().filter_map(node_of).collect();
        for n in node_roles {
            order.push(n.clone());
            order.extend(
                files
                    .keys()
                    .filter(|r| **r != n && node_of(r).as_deref() == Some(n.as_str()))
                    .cloned(),
            );
        }
        let read = files.keys().map(|r| (r.clone(), OnceLock::new())).collect();
        Ok(World {
            files,
            nodes,
            addresses,
            order,
            read,
            one_node: false,
        })
    }

    /// The world as one node of a cluster seen from inside it (a live
    /// node and its pods): a packet sent by a link whose far end is in no
    /// namespace of the world has left the node ([`super::End::Left`]),
    /// rather than gone where the trace cannot follow.
    pub fn one_node(mut self) -> World {
        self.one_node = true;
        self
    }

    pub(super) fn is_one_node(&self) -> bool {
        self.one_node
    }

    pub(crate) fn file(&self, ns: &str) -> Option<&File> {
        self.files.get(ns).map(|(_, f)| f)
    }

    pub(super) fn path(&self, ns: &str) -> String {
        self.files
            .get(ns)
            .map(|(p, _)| p.display().to_string())
            .unwrap_or_else(|| ns.to_string())
    }

    /// `ns` read (once): `None` when it is no namespace of the world or
    /// could not be read (see [`World::read_errors`]).
    fn loaded(&self, ns: &str) -> Option<&Loaded> {
        let cell = self.read.get(ns)?;
        cell.get_or_init(|| {
            let file = self.file(ns).ok_or_else(|| format!("{ns}: not open"))?;
            let others: Vec<(String, i32)> = self
                .files
                .iter()
                .map(|(r, (_, f))| (r.clone(), f.as_raw_fd()))
                .collect();
            let (ns, names) = crate::model::read::read_one(ns, file, &others)?;
            Ok(Loaded { ns, names })
        })
        .as_ref()
        .ok()
    }

    /// What could not be read of the namespaces the trace asked for.
    pub(super) fn read_errors(&self) -> Vec<String> {
        self.read
            .values()
            .filter_map(|c| c.get()?.as_ref().err().cloned())
            .collect()
    }

    pub(crate) fn namespace(&self, ns: &str) -> Option<&Namespace> {
        self.loaded(ns).map(|l| &l.ns)
    }

    pub(crate) fn link(&self, ns: &str, link: &str) -> Option<&Link> {
        self.namespace(ns)?.links.iter().find(|l| l.name == link)
    }

    /// A sysctl read now, inside the namespace (`?` when unreadable).
    pub(crate) fn sysctl(&self, ns: &str, key: &str) -> String {
        self.file(ns)
            .and_then(|f| cnilab_net::netns::read_sysctl(Some(f), key).ok())
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "?".into())
    }

    /// The namespace (by role) of the veth peer of `ns`/`link`, without
    /// reading it.
    pub(crate) fn peer_namespace(&self, ns: &str, link: &str) -> Option<String> {
        let peer = self.link(ns, link)?.veth.as_ref()?;
        Some(peer.namespace.clone().unwrap_or_else(|| ns.to_string()))
    }

    /// The veth peer of `ns`/`link`, by role (its namespace read to name it).
    pub(crate) fn peer(&self, ns: &str, link: &str) -> Option<(String, String)> {
        let peer = self.link(ns, link)?.veth.as_ref()?;
        let peer_ns = peer.namespace.clone().unwrap_or_else(|| ns.to_string());
        let name = match peer.name.strip_prefix('#').map(str::parse::<u32>) {
            Some(Ok(index)) => self
                .loaded(&peer_ns)
                .and_then(|l| l.names.get(&index).cloned())
                .unwrap_or_else(|| peer.name.clone()),
            _ => peer.name.clone(),
        };
        Some((peer_ns, name))
    }

    pub(crate) fn ports(&self, ns: &str, bridge: &str) -> Vec<&Link> {
        self.namespace(ns)
            .map(|n| {
                n.links
                    .iter()
                    .filter(|l| l.controller.as_deref() == Some(bridge))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether a link of `ns` holds `ip`. An end that is not known to hold
    /// it is not read.
    pub(crate) fn owns(&self, ns: &str, ip: IpAddr) -> bool {
        if self.addresses.ends.contains(ns)
            && self.addresses.known.get(&ip).map(String::as_str) != Some(ns)
        {
            return false;
        }
        self.holder(ns, ip).is_some()
    }

    /// The link of `ns` that holds `ip` (`ns` read to find it).
    pub(crate) fn holder(&self, ns: &str, ip: IpAddr) -> Option<&Link> {
        self.namespace(ns)?
            .links
            .iter()
            .find(|l| l.addresses.iter().any(|a| a.addr() == ip))
    }

    /// The namespace whose link holds `ip`: the one known to, when it does;
    /// otherwise the first, in the underlay then node by node, that is no
    /// end (these are read, all at once, to look).
    pub fn owner(&self, ip: IpAddr) -> Option<String> {
        if let Some(ns) = self.addresses.known.get(&ip) {
            if self.owns(ns, ip) {
                return Some(ns.clone());
            }
        }
        let candidates: Vec<&String> = self
            .order
            .iter()
            .filter(|r| !self.addresses.ends.contains(*r))
            .collect();
        self.read_all(candidates.iter().copied());
        candidates.into_iter().find(|r| self.owns(r, ip)).cloned()
    }

    /// Reads each namespace of `roles` not read yet, all at once.
    pub(crate) fn read_all<'a>(&self, roles: impl IntoIterator<Item = &'a String>) {
        crate::util::parallel_map(
            roles,
            crate::util::A_THREAD_EACH,
            |r| {
                self.loaded(r);
            },
            || (),
        );
    }

    /// The role the caller knows to hold `ip` (not checked).
    pub(crate) fn expected(&self, ip: IpAddr) -> Option<&str> {
        self.addresses.known.get(&ip).map(String::as_str)
    }

    /// Where a packet from `ip` is sent: its owner, or else the role known
    /// by it (a pod that lost its address still sends from its namespace,
    /// and the trace says what it holds instead).
    pub fn sender(&self, ip: IpAddr) -> Option<String> {
        self.owner(ip)
            .or_else(|| self.expected(ip).map(str::to_string))
    }

    /// Whether entering `ns` by `link` reaches `ip`'s owner (itself, or
    /// behind the bridge `link` is a port of). An end leads only to itself.
    pub(crate) fn leads_to(&self, ns: &str, link: &str, ip: IpAddr, depth: usize) -> bool {
        if self.owns(ns, ip) {
            return true;
        }
        if self.addresses.ends.contains(ns) {
            return false;
        }
        let Some(bridge) = self.link(ns, link).and_then(|l| l.controller.clone()) else {
            return false;
        };
        depth < 8
            && self.ports(ns, &bridge).iter().any(|p| {
                p.name != link
                    && self
                        .peer(ns, &p.name)
                        .is_some_and(|(pn, pl)| self.leads_to(&pn, &pl, ip, depth + 1))
            })
    }

    /// Whether the veth `link` of `ns` may lead to `ip` (false only for an
    /// end that does not hold it: decided without reading the end).
    pub(crate) fn may_lead_to(&self, ns: &str, link: &str, ip: IpAddr) -> bool {
        match self.peer_namespace(ns, link) {
            Some(peer_ns) if self.addresses.ends.contains(&peer_ns) => self.owns(&peer_ns, ip),
            Some(_) => true,
            None => false,
        }
    }

    /// A permanent neighbour for `ip` on `dev` whose MAC is not the MAC of
    /// the link that owns `ip`.
    pub(crate) fn wrong_permanent_neighbour(
        &self,
        ns: &str,
        dev: &str,
        ip: IpAddr,
    ) -> Option<Death> {
        let n = self
            .namespace(ns)?
            .neighbours
            .iter()
            .find(|n| n.dev == dev && n.addr == ip && n.state == "permanent")?;
        let mac = n.mac.as_deref()?;
        let (owner, owner_mac) = self.mac_of(ip)?;
        (!mac.eq_ignore_ascii_case(&owner_mac)).then(|| {
            Death::new(
                ns,
                "neighbour-wrong-mac",
                &format!("neighbour {ip} dev {dev}"),
                &format!(
                    "permanent entry lladdr {mac}, but {ip} is on {owner} with MAC {owner_mac}"
                ),
            )
        })
    }

    /// The owner of `ip` and the MAC of its link that holds it.
    pub(crate) fn mac_of(&self, ip: IpAddr) -> Option<(String, String)> {
        let owner = self.owner(ip)?;
        let mac = self.holder(&owner, ip)?.mac.clone()?;
        Some((owner, mac))
    }

    /// The node a namespace belongs to.
    pub(super) fn node_of(&self, ns: &str) -> Option<String> {
        self.nodes.get(ns).cloned().flatten()
    }
}
