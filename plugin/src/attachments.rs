//! Per-attachment state, beside the IPAM store: a lock that makes ADD and
//! DEL of one (container ID, ifname) mutually exclusive, and the cache of
//! the addresses ADD gave the attachment. DEL unmasquerades exactly the
//! cached addresses; GC reads the caches of listed attachments for
//! liveness; a cache (or a store record) is the proof that an unmarked
//! link was this network's.
//!
//! Layout: `<dataDir>/.cnilab-bridge/<network>/<containerID>:<ifname>.lock`
//! and `….json` (an ifname never contains `:` or `/`, a container ID
//! neither). Files are 0600, directories 0700, opened like store files
//! (never through a symlink, regular files only, bounded reads). A lock
//! file exists only while an operation holds it: the holder unlinks it
//! before letting go, and a waiter that gets a lock on an unlinked file
//! tries again. Empty directories are removed, so a node where every
//! attachment was deleted keeps nothing.

use crate::config::Plan;
use crate::error::{CniError, Result};
use crate::ipam::{self, LOCK_TIMEOUT};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What ADD gave one attachment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cached {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    pub ips: Vec<IpAddr>,
}

/// The attachment directory of one network.
pub struct Attachments {
    dir: PathBuf,
}

/// Held for as long as it lives: no other ADD or DEL of the attachment runs.
pub struct AttachmentLock {
    path: PathBuf,
    dir: PathBuf,
    _lock: Flock<File>,
}

impl Drop for AttachmentLock {
    fn drop(&mut self) {
        // Unlinked while still held; a waiter on this file sees that and
        // retries on a new one.
        let _ = fs::remove_file(&self.path);
        remove_empty_dirs(&self.dir);
    }
}

fn remove_empty_dirs(dir: &Path) {
    if fs::remove_dir(dir).is_ok() {
        if let Some(parent) = dir.parent() {
            let _ = fs::remove_dir(parent);
        }
    }
}

impl Attachments {
    /// The network's attachment directory, when it has one (any IPAM but none).
    pub fn of(plan: &Plan) -> Option<Attachments> {
        plan.attachments_dir
            .as_ref()
            .map(|dir| Attachments { dir: dir.clone() })
    }

    fn path(&self, container_id: &str, ifname: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{container_id}:{ifname}.{ext}"))
    }

    fn create_dir(&self) -> Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| CniError::io(format!("create {}: {e}", self.dir.display())))
    }

    /// Takes the attachment's lock, waiting up to the store's lock timeout
    /// (code 11 after it).
    pub fn lock(&self, container_id: &str, ifname: &str) -> Result<AttachmentLock> {
        let base = format!("{container_id}:{ifname}");
        let what = format!("attachment {container_id}/{ifname}");
        self.acquire(&base, &what, Some(Instant::now() + LOCK_TIMEOUT))?
            .ok_or_else(|| CniError::io(format!("lock {what}: not acquired")))
    }

    /// Takes the lock of `<base>.lock`: waiting until `deadline`, or, without
    /// one, only if it is free (`Ok(None)` if it is held).
    fn acquire(
        &self,
        base: &str,
        what: &str,
        deadline: Option<Instant>,
    ) -> Result<Option<AttachmentLock>> {
        let path = self.dir.join(format!("{base}.lock"));
        let what = format!("{what} ({})", path.display());
        loop {
            self.create_dir()?;
            let file = match OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .custom_flags(ipam::STORE_FLAGS)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => f,
                // The directory went with the last lock of another
                // attachment: make it again.
                Err(e)
                    if e.kind() == ErrorKind::NotFound
                        && deadline.is_some_and(|d| Instant::now() < d) =>
                {
                    continue
                }
                Err(e) => return Err(CniError::io(format!("open {}: {e}", path.display()))),
            };
            let file = ipam::regular(file, &path)
                .map_err(|e| CniError::io(format!("open {}: {e}", path.display())))?;
            let lock = match deadline {
                Some(d) => ipam::flock_until(file, (d, LOCK_TIMEOUT), &what, &path)?,
                None => match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                    Ok(lock) => lock,
                    Err(_) => return Ok(None),
                },
            };
            let held = lock
                .metadata()
                .map_err(|e| CniError::io(format!("stat {}: {e}", path.display())))?;
            match fs::symlink_metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    return Ok(Some(AttachmentLock {
                        path,
                        dir: self.dir.clone(),
                        _lock: lock,
                    }))
                }
                // The previous holder unlinked it as it finished: again.
                _ => continue,
            }
        }
    }

    /// Removes what killed operations left: lock files nobody holds and
    /// half-written caches of attachments nobody is working on (GC).
    pub fn sweep(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let (base, tmp) = match (name.strip_suffix(".lock"), name.strip_suffix(".json.tmp")) {
                (Some(base), _) => (base, false),
                (_, Some(base)) => (base, true),
                _ => continue,
            };
            // Dropping the lock unlinks its file.
            if let Ok(Some(_free)) = self.acquire(base, base, None) {
                if tmp {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        remove_empty_dirs(&self.dir);
    }

    /// The attachment's cache; `Ok(None)` when there is none.
    pub fn read(&self, container_id: &str, ifname: &str) -> Result<Option<Cached>> {
        read_cache(&self.path(container_id, ifname, "json"))
    }

    /// Records what ADD gave the attachment (before it is masqueraded).
    pub fn write(&self, container_id: &str, ifname: &str, ips: &[IpAddr]) -> Result<()> {
        self.create_dir()?;
        let cached = Cached {
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
            ips: ips.to_vec(),
        };
        let text = serde_json::to_vec(&cached)
            .map_err(|e| CniError::io(format!("encode the attachment cache: {e}")))?;
        ipam::write_atomic(&self.path(container_id, ifname, "json"), &text)
    }

    /// Forgets the attachment (DEL, GC, a failed ADD). Idempotent.
    pub fn remove(&self, container_id: &str, ifname: &str) -> Result<()> {
        ipam::remove(&self.path(container_id, ifname, "json"))?;
        remove_empty_dirs(&self.dir);
        Ok(())
    }

    /// Every cache of the network. An unreadable directory or cache is an
    /// error (GC must not act on half a picture).
    pub fn all(&self) -> Result<Vec<Cached>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CniError::io(format!("read {}: {e}", self.dir.display()))),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| CniError::io(format!("read {}: {e}", self.dir.display())))?;
            let name = entry.file_name();
            if name.to_str().is_some_and(|n| n.ends_with(".json")) {
                if let Some(cached) = read_cache(&entry.path())? {
                    out.push(cached);
                }
            }
        }
        Ok(out)
    }
}

fn read_cache(path: &Path) -> Result<Option<Cached>> {
    let text = ipam::read_store_file(path)
        .map_err(|e| CniError::io(format!("read {}: {e}", path.display())))?;
    let Some(text) = text else {
        return Ok(None);
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        CniError::io(format!(
            "{} is not an attachment cache: {e}",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_round_trip_and_locks_leave_nothing_behind() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join(".cnilab-bridge").join("net");
        let att = Attachments { dir: dir.clone() };
        let ips: Vec<IpAddr> = vec!["10.1.0.2".parse().expect("ip")];
        {
            let _lock = att.lock("c1", "eth0").expect("lock");
            assert!(dir.join("c1:eth0.lock").exists());
            att.write("c1", "eth0", &ips).expect("write");
        }
        assert!(!dir.join("c1:eth0.lock").exists(), "lock file unlinked");
        let cached = att.read("c1", "eth0").expect("read").expect("cached");
        assert_eq!(cached.ips, ips);
        assert_eq!(att.all().expect("all"), vec![cached]);
        assert_eq!(att.read("c2", "eth0").expect("read"), None);
        att.remove("c1", "eth0").expect("remove");
        assert!(!tmp.path().join(".cnilab-bridge").exists(), "empty dirs go");
        assert!(att.all().expect("all").is_empty());
    }

    #[test]
    fn sweep_removes_leftovers_of_killed_operations_only() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("net");
        let att = Attachments { dir: dir.clone() };
        att.write("c1", "eth0", &[]).expect("write");
        // A killed ADD: its lock file and a half-written cache.
        std::fs::write(dir.join("c2:eth0.lock"), "").expect("plant");
        std::fs::write(dir.join("c2:eth0.json.tmp"), "{").expect("plant");
        // A live operation holds c3's lock.
        let held = att.lock("c3", "eth0").expect("lock");
        std::fs::write(dir.join("c3:eth0.json.tmp"), "{").expect("plant");
        att.sweep();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["c1:eth0.json", "c3:eth0.json.tmp", "c3:eth0.lock"]);
        drop(held);
        assert!(!dir.join("c3:eth0.lock").exists());
    }

    #[test]
    fn a_malformed_cache_is_an_error() {
        let tmp = tempfile::tempdir().expect("tmp");
        let att = Attachments {
            dir: tmp.path().to_path_buf(),
        };
        std::fs::write(tmp.path().join("c1:eth0.json"), "{").expect("write");
        assert!(att.read("c1", "eth0").is_err());
        assert!(att.all().is_err());
    }
}
