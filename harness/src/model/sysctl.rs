//! Sysctls of the calling thread's namespace read and written through
//! directory handles: each directory under `/proc/sys` is looked up once
//! (relative to its parent's handle) and each key as one name in it. A
//! path lookup under `/proc/sys` costs a walk of every namespace's entry
//! of that name (the sysctl dentries of all namespaces share one parent),
//! so on a machine with hundreds of namespaces the five lookups of
//! `net/ipv4/conf/eth0/forwarding` per key were most of a capture's and
//! a replay's kernel time. The `/proc/sys` handle comes from the
//! process's private procfs instance (`netns::sysctl_dir`), whose entries
//! are only this process's. Used by `read.rs` (capture) and `apply`.

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use std::collections::HashMap;
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
