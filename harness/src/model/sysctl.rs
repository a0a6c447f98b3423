//! Sysctls of the calling thread's namespace read and written through
//! directory handles: each directory under `/proc/sys` is looked up once
//! (relative to its parent's handle) and each key as one name in it. A
//! path lookup under `/proc/sys` costs a walk of every namespace's entry
//! of that name (the sysctl dentries of all namespaces share one parent),
//! so on a machine with hundreds of namespaces the five lookups of
//! `net/ipv4/conf/eth0/forwarding` per key were most of a capture's and
//! a replay's kernel time. The `/proc/sys` handle comes from the
//! process's private procfs instance (`netns::sysctl_dir`), whose entries
//! are only this process's. Used by `read.rs` (capture) and `apply`;
//! the keys the model holds are listed here ([`GLOBAL_SYSCTLS`] and the
//! per-`conf` lists), for the reader and for the capture script
//! (`crate::capture::script`).

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;

/// Open directories under `/proc/sys`, by path (`""` is `/proc/sys`).
/// Open it on the thread inside the namespace and use it there only.
pub(crate) struct Tree {
    dirs: HashMap<String, OwnedFd>,
}

impl Tree {
    pub(crate) fn new() -> Tree {
        Tree {
            dirs: HashMap::new(),
        }
    }

    /// The handle of directory `dir` (`net/ipv4/conf`), opened from its
    /// parent's.
    fn dir(&mut self, dir: &str) -> io::Result<&OwnedFd> {
        if !self.dirs.contains_key(dir) {
            let fd = match dir.rsplit_once('/') {
                _ if dir.is_empty() => cnilab_net::netns::sysctl_dir()?,
                Some((parent, name)) => self.open_in(parent, name, OFlag::O_DIRECTORY)?,
                None => self.open_in("", dir, OFlag::O_DIRECTORY)?,
            };
            self.dirs.insert(dir.to_string(), fd);
        }
        self.dirs
            .get(dir)
            .ok_or_else(|| io::Error::other("sysctl directory not kept"))
    }

    /// Opens `name` in directory `dir`.
    fn open_in(&mut self, dir: &str, name: &str, flags: OFlag) -> io::Result<OwnedFd> {
        let parent = self.dir(dir)?;
        Ok(openat(
            parent,
            name,
            flags | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?)
    }

    fn file(&mut self, key: &str, flags: OFlag) -> io::Result<File> {
        let (dir, name) = key.rsplit_once('/').unwrap_or(("", key));
        self.open_in(dir, name, flags).map(File::from)
    }

    /// The value of `key` (`net/ipv4/ip_forward`), whitespace runs as
    /// single spaces.
    pub(crate) fn read(&mut self, key: &str) -> io::Result<String> {
        let mut text = String::new();
        self.file(key, OFlag::O_RDONLY)?.read_to_string(&mut text)?;
        Ok(text.split_whitespace().collect::<Vec<_>>().join(" "))
    }

    /// Writes `value` to `key`.
    pub(crate) fn write(&mut self, key: &str, value: &str) -> io::Result<()> {
        self.file(key, OFlag::O_WRONLY)?.write_all(value.as_bytes())
    }
}

/// The sysctls that decide forwarding and filtering, global and per link;
/// a key the kernel does not have here (no `br_netfilter`) is left out.
/// Values with whitespace are read with single spaces.
pub(crate) fn read_sysctls(links: &[String]) -> BTreeMap<String, String> {
    let mut tree = Tree::new();
    sysctl_keys(links)
        .into_iter()
        .filter_map(|k| Some((tree.read(&k).ok()?, k)))
        .map(|(v, k)| (k, v))
        .collect()
}

/// The sysctls the model holds, beside the per-link ones.
pub(crate) const GLOBAL_SYSCTLS: &[&str] = &[
    "net/ipv4/ip_forward",
    "net/ipv4/ping_group_range",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/bridge/bridge-nf-call-arptables",
];
/// `net/ipv4/conf/{all,default}/…`.
pub(crate) const CONF_V4: &[&str] = &[
    "forwarding",
    "rp_filter",
    "proxy_arp",
    "arp_ignore",
    "arp_announce",
    "arp_notify",
    "accept_local",
    "route_localnet",
];
/// `net/ipv6/conf/{all,default}/…`.
pub(crate) const CONF_V6: &[&str] = &["forwarding", "disable_ipv6", "accept_dad"];
/// Per link, the ones that differ between links on real nodes (Calico:
/// proxy_arp and forwarding on each cali* veth).
pub(crate) const LINK_V4: &[&str] = &["forwarding", "rp_filter", "proxy_arp", "route_localnet"];
pub(crate) const LINK_V6: &[&str] = &["forwarding", "disable_ipv6"];

/// Every sysctl key the model reads in a namespace with these links.
fn sysctl_keys(links: &[String]) -> Vec<String> {
    let mut keys: Vec<String> = GLOBAL_SYSCTLS.iter().map(|k| k.to_string()).collect();
    let confs = ["all", "default"]
        .into_iter()
        .map(|c| (c, CONF_V4, CONF_V6))
        .chain(links.iter().map(|l| (l.as_str(), LINK_V4, LINK_V6)));
    for (conf, v4, v6) in confs {
        keys.extend(v4.iter().map(|k| format!("net/ipv4/conf/{conf}/{k}")));
        keys.extend(v6.iter().map(|k| format!("net/ipv6/conf/{conf}/{k}")));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_path_holds_and_refuses_a_missing_key() {
        let mut t = Tree::new();
        let want = std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/forwarding")
            .expect("this kernel has net/ipv4/conf/all/forwarding");
        assert_eq!(
            t.read("net/ipv4/conf/all/forwarding").expect("read"),
            want.trim()
        );
        assert_eq!(
            t.read("kernel/ostype").expect("read"),
            std::fs::read_to_string("/proc/sys/kernel/ostype")
                .expect("ostype")
                .trim()
        );
        assert!(t.read("net/ipv4/conf/no-such-link/forwarding").is_err());
    }
}
