//! The node's pods: every network namespace on the machine (`/run/netns`
//! names and `/proc/<pid>/ns/net`, one per inode), asked on a thread inside
//! it whether a veth, macvlan or ipvlan of it has its other end in the
//! node's namespace (the namespace's id for the node, RTM_GETNSID, equals
//! the link's `IFLA_LINK_NETNSID`); CRI sandbox names by the inode of their
//! pause process's namespace.

use super::PodSource;
use crate::model::read::{netnsid_of, peer_netnsid};
use cnilab_net::netns as plugin_netns;
use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::{InfoKind, InfoPortData, LinkAttribute, LinkInfo};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A namespace file's identity.
pub(super) type Inode = (u64, u64);

pub(super) struct Found {
    pub source: PodSource,
    pub inode: Inode,
    pub file: File,
    /// Where it was opened (`/run/netns/…`, a mount, `/proc/<pid>/ns/net`).
    pub path: PathBuf,
}

#[derive(Default)]
pub(super) struct Linked {
    pub pods: Vec<Found>,
    pub peers: Vec<PodSource>,
}

/// A namespace's name for a path: `/run/netns/x` → `x`,
/// `/proc/<pid>/ns/net` → `pid:<pid>`.
pub(super) fn name_of_path(path: &Path) -> String {
    let parts: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [.., proc, pid, ns, net] if proc == "proc" && ns == "ns" && net == "net" => {
            format!("pid:{pid}")
        }
        _ => path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
    }
}

fn inode_of(path: &Path) -> std::io::Result<Inode> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// Every namespace but `skip`, by inode: its `/run/netns` name, the lowest
/// pid holding it, and a path to open it by.
fn candidates(skip: &[Inode], warnings: &mut Vec<String>) -> BTreeMap<Inode, (PodSource, PathBuf)> {
    let mut out: BTreeMap<Inode, (PodSource, PathBuf)> = BTreeMap::new();
    let named = std::fs::read_dir(plugin_netns::NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten();
    for entry in named {
        let path = entry.path();
        // A file that is no namespace (left by a crash) has its own inode
        // and fails to open below: it is no pod.
        if let Ok(inode) = inode_of(&path) {
            let name = entry.file_name().to_string_lossy().into_owned();
            out.entry(inode).or_insert_with(|| {
                let source = PodSource {
                    name: name.clone(),
                    netns: Some(name),
                    pid: None,
                    cri: None,
                    ..Default::default()
                };
                (source, path)
            });
        }
    }
    // A namespace a runtime mounted elsewhere (Docker's
    // `/run/docker/netns/<id>`) keeps a name from that mount.
    for path in nsfs_mounts() {
        if let Ok(inode) = inode_of(&path) {
            out.entry(inode).or_insert_with(|| {
                let source = PodSource {
                    name: name_of_path(&path),
                    netns: Some(path.display().to_string()),
                    ..Default::default()
                };
                (source, path)
            });
        }
    }
    let mut denied = 0;
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    for entry in pids {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let path = entry.path().join("ns/net");
        let inode = match inode_of(&path) {
            Ok(i) => i,
            // pid 1 holds the machine's own namespace, never a pod (a
            // container's init may be unreadable even to root).
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && pid != 1 => {
                denied += 1;
                continue;
            }
            // The process ended meanwhile.
            Err(_) => continue,
        };
        let (source, at) = out.entry(inode).or_insert_with(|| {
            let source = PodSource {
                name: format!("pid:{pid}"),
                netns: None,
                pid: None,
                cri: None,
                ..Default::default()
            };
            (source, path.clone())
        });
        if source.pid.is_none_or(|p| pid < p) {
            source.pid = Some(pid);
            if source.netns.is_none() {
                source.name = format!("pid:{pid}");
                *at = path;
            }
        }
    }
    if denied > 0 {
        let fix = match nix::unistd::geteuid().is_root() {
            true => "they belong to another user namespace or are not dumpable",
            false => "run as root",
        };
        warnings.push(format!(
            "the network namespace of {denied} processes was not readable (permission): pods held only by them are missing; {fix}"
        ));
    }
    for s in skip {
        out.remove(s);
    }
    out
}

/// Network namespace files mounted outside `/run/netns` (`nsfs` mounts of
/// a `net:[…]` namespace in `/proc/self/mountinfo`).
fn nsfs_mounts() -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines().filter_map(nsfs_mount_of).collect()
}

/// The mount point of one mountinfo line when it mounts a network
/// namespace outside `/run/netns` (and `/var/run/netns`, the same place).
fn nsfs_mount_of(line: &str) -> Option<PathBuf> {
    let (left, right) = line.split_once(" - ")?;
    if right.split_whitespace().next() != Some("nsfs") {
        return None;
    }
    let mut fields = left.split_whitespace();
    let root = fields.nth(3)?;
    if !root.starts_with("net:[") {
        return None;
    }
    let point = unescape_mountinfo(fields.next()?);
    let named = [plugin_netns::NETNS_DIR, "/var/run/netns"]
        .iter()
        .any(|d| Path::new(&point).parent() == Some(Path::new(d)));
    (!named).then(|| PathBuf::from(point))
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The namespaces linked to `node`: pods and peers (see the module header
/// of `capture`).
pub(super) fn linked(node: &File, warnings: &mut Vec<String>) -> Linked {
    let mut skip = Vec::new();
    if let Ok(m) = node.metadata() {
        skip.push((m.dev(), m.ino()));
    }
    // The machine's own namespace (pid 1's, and the one capture runs in:
    // pid 1 may be unreadable inside a container) is never a pod.
    for own in ["/proc/1/ns/net", "/proc/self/ns/net"] {
        if let Ok(i) = inode_of(Path::new(own)) {
            skip.push(i);
        }
    }
    let all: Vec<(Inode, (PodSource, PathBuf))> = candidates(&skip, warnings).into_iter().collect();
    let node_fd = node.as_raw_fd();
    let asked: Vec<Result<Option<(Relation, File)>, String>> = crate::util::parallel_map(
        all.iter(),
        crate::util::A_THREAD_EACH,
        |(_, (source, path))| {
            // Gone meanwhile, or not a namespace: no pod.
            let Ok(file) = plugin_netns::open_network_namespace(path) else {
                return Ok(None);
            };
            let relation = plugin_netns::netlink_job(&file, |h| relation(h, node_fd))
                .map_err(|e| format!("namespace {}: {e}", source.name))?;
            Ok(Some((relation, file)))
        },
        || Err("discovery thread panicked".to_string()),
    );
    let mut out = Linked::default();
    for ((inode, (source, path)), answer) in all.into_iter().zip(asked) {
        match answer {
            Ok(Some((Relation::Pod, file))) => out.pods.push(Found {
                source,
                inode,
                file,
                path,
            }),
            Ok(Some((Relation::Peer, _))) => out.peers.push(source),
            Ok(_) => {}
            Err(e) => warnings.push(e),
        }
    }
    out
}

/// Asked inside a namespace: its links with an end in the node.
async fn relation(h: rtnetlink::Handle, node_fd: i32) -> Result<Relation, rtnetlink::Error> {
    let msgs: Vec<_> = h.link().get().execute().try_collect().await?;
    let linked: Vec<(i32, bool)> = msgs
        .iter()
        .filter_map(|m| {
            let mut kind_ok = false;
            let mut port = false;
            for a in &m.attributes {
                if let LinkAttribute::LinkInfo(infos) = a {
                    for i in infos {
                        match i {
                            LinkInfo::Kind(
                                InfoKind::Veth | InfoKind::MacVlan | InfoKind::IpVlan,
                            ) => kind_ok = true,
                            LinkInfo::PortData(InfoPortData::BridgePort(_)) => port = true,
                            _ => {}
                        }
                    }
                }
            }
            kind_ok.then_some(())?;
            Some((peer_netnsid(m)?, port))
        })
        .collect();
    if linked.is_empty() {
        return Ok(Relation::None);
    }
    let node_id = netnsid_of(&h, node_fd).await?;
    Ok(relation_of(&linked, node_id))
}

/// What one namespace is to the node.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Relation {
    None,
    Pod,
    Peer,
}

/// What a namespace is to the node, from its `linked` links (veths,
/// macvlans, ipvlans: the namespace id of their other end, and whether
/// that end is a bridge port) and the node's id in it: a pod has ends only
/// in the node and none of them a bridge port; a namespace that also links
/// elsewhere, or whose end is a port (a switch), is a peer.
pub(crate) fn relation_of(linked: &[(i32, bool)], node_id: Option<i32>) -> Relation {
    let Some(node_id) = node_id.filter(|_| !linked.is_empty()) else {
        return Relation::None;
    };
    let ends: Vec<bool> = linked
        .iter()
        .filter(|(id, _)| *id == node_id)
        .map(|(_, port)| *port)
        .collect();
    if ends.is_empty() {
        Relation::None
    } else if ends.iter().any(|p| *p) || linked.iter().any(|(id, _)| *id != node_id) {
        Relation::Peer
    } else {
        Relation::Pod
    }
}

/// Sandbox names by namespace inode, from every CRI socket that answers
/// (`sockets`, else the usual ones that exist).
pub(super) fn cri_names(
    sockets: &[PathBuf],
    warnings: &mut Vec<String>,
) -> BTreeMap<Inode, String> {
    use crate::cri::Cri;
    let usual: Vec<PathBuf> = super::CRI_SOCKETS
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect();
    let sockets = if sockets.is_empty() { &usual } else { sockets };
    let mut out = BTreeMap::new();
    for socket in sockets {
        let listed = Cri::new(socket).and_then(|c| Ok((c.sandboxes()?, c)));
        let (sandboxes, cri) = match listed {
            Ok(x) => x,
            Err(e) => {
                warnings.push(format!(
                    "CRI {}: {e}; pods are named by namespace",
                    socket.display()
                ));
                continue;
            }
        };
        for s in sandboxes.into_iter().filter(|s| s.ready) {
            let inode = cri.sandbox_pid(&s.id).and_then(|pid| {
                inode_of(Path::new(&format!("/proc/{pid}/ns/net"))).map_err(|e| e.to_string())
            });
            match inode {
                Ok(i) => {
                    out.insert(i, s.pod_name());
                }
                Err(e) => warnings.push(format!(
                    "CRI {} sandbox {}: {e}",
                    socket.display(),
                    s.pod_name()
                )),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_mounted_outside_run_netns_are_found_in_mountinfo() {
        let docker =
            "812 29 0:4 net:[4026532817] /run/docker/netns/1a2b3c4d5e6f rw shared:5 - nsfs nsfs rw";
        assert_eq!(
            nsfs_mount_of(docker),
            Some(PathBuf::from("/run/docker/netns/1a2b3c4d5e6f"))
        );
        let spaced = r"813 29 0:4 net:[4026532818] /tmp/a\040b/ns rw - nsfs nsfs rw";
        assert_eq!(nsfs_mount_of(spaced), Some(PathBuf::from("/tmp/a b/ns")));
        for other in [
            "814 29 0:4 net:[4026532819] /run/netns/cni-1f0e rw shared:5 - nsfs nsfs rw",
            "815 29 0:4 net:[4026532820] /var/run/netns/x rw - nsfs nsfs rw",
            "816 29 0:4 mnt:[4026532821] /run/m rw - nsfs nsfs rw",
            "817 29 0:21 / /run rw shared:5 - tmpfs tmpfs rw",
            "garbage",
        ] {
            assert_eq!(nsfs_mount_of(other), None, "{other}");
        }
        assert_eq!(
            name_of_path(Path::new("/run/docker/netns/1a2b3c4d5e6f")),
            "1a2b3c4d5e6f"
        );
    }

    #[test]
    fn a_path_names_its_namespace() {
        assert_eq!(name_of_path(Path::new("/run/netns/node1")), "node1");
        assert_eq!(name_of_path(Path::new("/proc/42/ns/net")), "pid:42");
        assert_eq!(name_of_path(Path::new("/var/run/netns/a-b")), "a-b");
    }
}
