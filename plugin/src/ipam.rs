//! Built-in IPAM: a host-local-style on-disk store.
//!
//! Layout (the same as the reference host-local, so tools can read either):
//! `<dataDir>/<network>/<ip>` holds `containerID\r\nifname`;
//! `last_reserved_ip.<set>` remembers where round-robin continues;
//! every allocation and release happens under an flock on `lock`.

use crate::config::{Range, RangeSet};
use crate::error::{CniError, Result};
use cnilab_net::naming::{from_u128, to_u128};
use cnilab_net::spec::code;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long an operation waits for the store lock before answering code 11.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest record or cursor file read: an ID (200 bytes), an ifname and
/// room to spare. Anything bigger is malformed and skipped.
const MAX_STORE_FILE: u64 = 4096;

/// Flags for every file opened in the store: never through a symlink,
/// never blocking (a FIFO planted in the store answers at once), no
/// controlling terminal, not inherited.
pub(crate) const STORE_FLAGS: i32 =
    nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY | nix::libc::O_CLOEXEC;

/// Refuses an opened store file that is not a regular file.
pub(crate) fn regular(file: File, path: &Path) -> std::io::Result<File> {
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        Ok(file)
    } else {
        Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("{} is not a regular file ({kind:?})", path.display()),
        ))
    }
}

/// Reads a small store file: not through a symlink, only a regular file,
/// at most [`MAX_STORE_FILE`] bytes. `Ok(None)` when it does not exist.
pub(crate) fn read_store_file(path: &Path) -> std::io::Result<Option<String>> {
    use std::io::Read;
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(STORE_FLAGS)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut text = String::new();
    regular(file, path)?
        .take(MAX_STORE_FILE + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_STORE_FILE {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("{} is larger than {MAX_STORE_FILE} bytes", path.display()),
        ));
    }
    Ok(Some(text))
}

/// Creates `path` exclusively (`O_EXCL`, never through a symlink) with
/// `data`, mode 0600. A leftover of a dead writer (the lock is held, so no
/// live one) is unlinked first (unlinking a symlink removes the link, not
/// its target).
fn create_exclusive(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let open = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(STORE_FLAGS)
            .mode(0o600)
            .open(path)
    };
    let mut file = match open() {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            fs::remove_file(path)?;
            open()?
        }
        other => other?,
    };
    file.write_all(data)
}

/// True for the names of temporary files the store's writers use.
fn is_temp_name(name: &str) -> bool {
    name.starts_with(".record.")
        || (name.starts_with("last_reserved_ip.") && name.ends_with(".tmp"))
}

/// Takes an exclusive flock on `file` (the lock file `path`), waiting
/// until `deadline` (the end of a wait of `timeout`); then code 11 naming
/// `what` ("try again later"). A held lock is waited for in a blocking
/// `flock` on a helper thread, so the waiter wakes the moment the holder
/// lets go (polling with a growing pause made a hundred ADDs on one store
/// sleep up to 20 ms each after the lock was free). A helper that gets
/// the lock after the deadline drops it at once: nobody receives it.
pub(crate) fn flock_until(
    file: File,
    (deadline, timeout): (Instant, Duration),
    what: &str,
    path: &Path,
) -> Result<Flock<File>> {
    let failed = |e: Errno| CniError::io(format!("lock {}: {e}", path.display()));
    let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => return Ok(lock),
        Err((f, Errno::EWOULDBLOCK)) | Err((f, Errno::EINTR)) => f,
        Err((_, e)) => return Err(failed(e)),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut file = file;
        loop {
            match Flock::lock(file, FlockArg::LockExclusive) {
                Err((f, Errno::EINTR)) => file = f,
                other => {
                    let _ = tx.send(other.map_err(|(_, e)| e));
                    return;
                }
            }
        }
    });
    let wait = deadline.saturating_duration_since(Instant::now());
    match rx.recv_timeout(wait) {
        Ok(Ok(lock)) => Ok(lock),
        Ok(Err(e)) => Err(failed(e)),
        Err(_) => Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "{what} is locked by another operation for more than {timeout:?}; try again later"
            ),
        )),
    }
}

/// One reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub ip: IpAddr,
    pub container_id: String,
    pub ifname: String,
}

/// Parses a record file's content: `id\r\nifname` (also `id\nifname`, and
/// the id alone, which old host-local versions wrote).
pub fn parse_record(ip: IpAddr, content: &str) -> Option<Record> {
    let mut lines = content.split('\n').map(|l| l.trim_end_matches('\r'));
    let container_id = lines.next()?.trim().to_string();
    if container_id.is_empty() {
        return None;
    }
    let ifname = lines.next().unwrap_or("").trim().to_string();
    Some(Record {
        ip,
        container_id,
        ifname,
    })
}

/// The store for one network, locked for as long as this value lives.
pub struct Store {
    dir: PathBuf,
    _lock: Flock<File>,
}

impl Store {
    /// Creates the store directory (0700) if needed and takes the lock.
    pub fn open_locked(dir: &Path, timeout: Duration) -> Result<Store> {
        if dir.exists() && !dir.is_dir() {
            return Err(CniError::io(format!(
                "IPAM dataDir {} is not a directory",
                dir.display()
            )));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| CniError::io(format!("create IPAM store {}: {e}", dir.display())))?;
        let lock_path = dir.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(STORE_FLAGS)
            .mode(0o600)
            .open(&lock_path)
            .and_then(|f| regular(f, &lock_path))
            .map_err(|e| {
                CniError::io(format!(
                    "open the store lock {}: {e} (it must be a regular file, not a symlink or FIFO)",
                    lock_path.display()
                ))
            })?;
        let what = format!("IPAM store {}", dir.display());
        let lock = flock_until(file, (Instant::now() + timeout, timeout), &what, &lock_path)?;
        Ok(Store {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Addresses that have a record file (contents not read). Temporary
    /// files of writers that died (a killed ADD) are removed on the way:
    /// the lock is held, so no live writer owns one.
    fn reserved_ips(&self) -> Result<HashSet<IpAddr>> {
        let entries = fs::read_dir(&self.dir)
            .map_err(|e| CniError::io(format!("read IPAM store {}: {e}", self.dir.display())))?;
        let mut out = HashSet::new();
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Ok(ip) = name.parse() {
                out.insert(ip);
            } else if is_temp_name(name) {
                let _ = fs::remove_file(entry.path());
                crate::notes::note(format!("removed stale temporary file {name}"));
            }
        }
        Ok(out)
    }

    /// Reads one record. A record that is not a regular file, is a
    /// symlink, or is too large is skipped and logged (`Ok(None)`), never
    /// followed and never a reason for DEL or GC to fail. Records without
    /// an owner (left by a writer that died, possibly an older plugin
    /// version) are removed: the lock is held, so no live writer can be in
    /// the middle of one.
    fn read_record(&self, ip: IpAddr) -> Result<Option<Record>> {
        let path = self.dir.join(ip.to_string());
        match read_store_file(&path) {
            Ok(Some(content)) => match parse_record(ip, &content) {
                Some(record) => Ok(Some(record)),
                None => remove(&path).map(|()| None),
            },
            Ok(None) => Ok(None),
            Err(e) => {
                crate::notes::note(format!("skipped malformed record {}: {e}", path.display()));
                Ok(None)
            }
        }
    }

    /// Every record in the store (malformed ones skipped, see `read_record`).
    pub fn records(&self) -> Result<Vec<Record>> {
        let mut out = Vec::new();
        for ip in self.reserved_ips()? {
            if let Some(record) = self.read_record(ip)? {
                out.push(record);
            }
        }
        out.sort_by_key(|r| to_u128(r.ip));
        Ok(out)
    }

    /// Where round-robin continues in range set `set_index`.
    pub fn cursor(&self, set_index: usize) -> Option<IpAddr> {
        read_store_file(&self.cursor_path(set_index))
            .ok()
            .flatten()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Sets (or, with `None`, removes) the cursor of range set `set_index`.
    pub fn set_cursor(&self, set_index: usize, ip: Option<IpAddr>) -> Result<()> {
        let path = self.cursor_path(set_index);
        match ip {
            Some(ip) => write_cursor(&path, ip.to_string().as_bytes()),
            None => remove(&path),
        }
    }

    fn cursor_path(&self, set_index: usize) -> PathBuf {
        self.dir.join(format!("last_reserved_ip.{set_index}"))
    }

    /// The addresses held by (container, ifname).
    pub fn find(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>> {
        Ok(self
            .records()?
            .into_iter()
            .filter(|r| r.container_id == container_id && r.ifname == ifname)
            .map(|r| r.ip)
            .collect())
    }

    /// Reserves the next free address of range set `set_index` for
    /// (container, ifname), continuing round-robin after the last one handed out.
    pub fn reserve(
        &self,
        set_index: usize,
        set: &RangeSet,
        container_id: &str,
        ifname: &str,
    ) -> Result<(IpAddr, Range)> {
        let used = self.reserved_ips()?;
        let last_path = self.cursor_path(set_index);
        let last = self.cursor(set_index);
        for (ip, range) in candidates(set, last) {
            if used.contains(&ip) {
                continue;
            }
            let path = self.dir.join(ip.to_string());
            match self.create_record(&path, container_id, ifname) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => return Err(e),
            }
            write_cursor(&last_path, ip.to_string().as_bytes())?;
            return Ok((ip, range.clone()));
        }
        let described: Vec<String> = set
            .iter()
            .map(|r| format!("{} ({}-{})", r.subnet, r.start, r.end))
            .collect();
        Err(CniError::new(
            code::RANGE_EXHAUSTED,
            format!(
                "no free address in range {}: all addresses are reserved",
                described.join(", ")
            ),
        ))
    }

    /// Creates the record `path` with its owner, atomically: the content is
    /// written to a temporary file first and hard-linked into place, which
    /// fails if the address is taken. A writer killed half-way leaves at
    /// most a temporary file, never an empty record. Returns false when the
    /// address was taken.
    fn create_record(&self, path: &Path, container_id: &str, ifname: &str) -> Result<bool> {
        let tmp = self.dir.join(format!(".record.{}", std::process::id()));
        let written = create_exclusive(&tmp, format!("{container_id}\r\n{ifname}").as_bytes());
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(CniError::io(format!("write {}: {e}", tmp.display())));
        }
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(CniError::io(format!("reserve {}: {e}", path.display()))),
        }
    }

    /// Releases one address if it belongs to (container, ifname).
    pub fn release_ip(&self, ip: IpAddr, container_id: &str, ifname: &str) -> Result<bool> {
        match self.read_record(ip)? {
            Some(r) if r.container_id == container_id && r.ifname == ifname => {
                remove(&self.dir.join(ip.to_string()))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Releases everything held by (container, ifname); returns what was freed.
    pub fn release(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>> {
        let mut freed = Vec::new();
        for record in self.records()? {
            if record.container_id == container_id && record.ifname == ifname {
                remove(&self.dir.join(record.ip.to_string()))?;
                freed.push(record.ip);
            }
        }
        Ok(freed)
    }

    /// How many addresses of `set` are reserved, and how many exist.
    pub fn usage(&self, set: &RangeSet) -> Result<(u128, u128)> {
        let used = self.reserved_ips()?;
        let capacity: u128 = set.iter().map(Range::capacity).sum();
        let taken = used
            .iter()
            .filter(|ip| set.iter().any(|r| r.contains(**ip) && **ip != r.gateway))
            .count() as u128;
        Ok((taken, capacity))
    }

    /// Proves the store is writable (STATUS).
    pub fn probe_writable(&self) -> Result<()> {
        let path = self.dir.join(".status-probe");
        create_exclusive(&path, b"ok")
            .and_then(|()| fs::remove_file(&path))
            .map_err(|e| {
                CniError::io(format!(
                    "IPAM store {} is not writable: {e}",
                    self.dir.display()
                ))
            })
    }
}

pub(crate) fn remove(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CniError::io(format!("release {}: {e}", path.display()))),
    }
}

/// Writes `path` through an exclusive temporary file renamed over it (a
/// rename replaces a symlink at `path` itself, never its target).
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    create_exclusive(&tmp, data)
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = fs::remove_file(&tmp);
            CniError::io(format!("write {}: {e}", path.display()))
        })
}

/// Rewrites the round-robin cursor `path` in place, as host-local writes
/// it (the address's text alone, so either plugin reads the other's).
/// Overwriting an existing file's first bytes makes no inode and no
/// rename: a temporary file renamed over the cursor made ext4 flush the new
/// file at once (`auto_da_alloc`) and evict the old one's inode, the
/// largest file cost of an ADD. Only a longer old text is cut (a shrinking
/// truncate journals the inode). The cursor is a hint read under the
/// store's lock: a writer killed between the two steps leaves it pointing
/// elsewhere in the range, never an allocation wrong. A cursor that is not
/// a regular file of its own (a planted symlink, FIFO or hard link) is
/// replaced through [`write_atomic`], what it points to untouched.
fn write_cursor(path: &Path, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let in_place = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(STORE_FLAGS)
        .mode(0o600)
        .open(path)
        .and_then(|f| {
            use std::os::unix::fs::MetadataExt;
            let meta = f.metadata()?;
            if !meta.file_type().is_file() || meta.nlink() != 1 {
                return Err(std::io::Error::new(
                    ErrorKind::InvalidData,
                    "not a regular file of its own",
                ));
            }
            f.write_all_at(data, 0)?;
            if meta.len() > data.len() as u64 {
                f.set_len(data.len() as u64)?;
            }
            Ok(())
        });
    match in_place {
        Ok(()) => Ok(()),
        Err(_) => write_atomic(path, data),
    }
}

/// Upper bound on candidates tried in one ADD (matters only for huge IPv6
/// ranges, which are never full in practice).
const MAX_CANDIDATES: u128 = 1 << 20;

/// Addresses of `set` in round-robin order, starting after `last`, never the gateway.
fn candidates(set: &RangeSet, last: Option<IpAddr>) -> impl Iterator<Item = (IpAddr, &Range)> {
    let start_range = last
        .and_then(|ip| set.iter().position(|r| r.contains(ip)))
        .unwrap_or(0);
    let after = last.filter(|ip| set.get(start_range).is_some_and(|r| r.contains(*ip)));
    let n = set.len();
    // Walk: the rest of the current range, the other ranges, then the
    // beginning of the current range up to `last`.
    let order: Vec<(usize, Option<u128>, Option<u128>)> = {
        let mut v = Vec::new();
        let first_from = after.map(|ip| to_u128(ip) + 1);
        v.push((start_range, first_from, None));
        for k in 1..n {
            v.push(((start_range + k) % n, None, None));
        }
        if let Some(ip) = after {
            v.push((start_range, None, Some(to_u128(ip))));
        }
        v
    };
    order
        .into_iter()
        .flat_map(move |(idx, from, to)| {
            let range = &set[idx];
            let v4 = range.start.is_ipv4();
            let lo = from
                .unwrap_or(to_u128(range.start))
                .max(to_u128(range.start));
            let hi = to.unwrap_or(to_u128(range.end)).min(to_u128(range.end));
            let count = if lo > hi {
                0
            } else {
                (hi - lo + 1).min(MAX_CANDIDATES)
            };
            (0..count).map(move |i| (from_u128(v4, lo + i), range))
        })
        .filter(|(ip, range)| *ip != range.gateway)
        .take(MAX_CANDIDATES as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse, IpamPlan};
    use rstest::rstest;

    fn set_of(body: &str) -> RangeSet {
        let conf = format!(r#"{{"cniVersion":"1.1.0","name":"t","ipam":{body}}}"#);
        match parse(conf.as_bytes()).expect("valid config").ipam {
            IpamPlan::Builtin(b) => b.range_sets[0].clone(),
            _ => panic!("builtin expected"),
        }
    }

    fn store(dir: &Path) -> Store {
        Store::open_locked(dir, Duration::from_secs(1)).expect("lock")
    }

    #[test]
    fn allocates_round_robin_skipping_gateway_and_network() {
        let tmp = tempfile::tempdir().expect("tmp");
        let set = set_of(r#"{"subnet":"10.9.0.0/29"}"#);
        let s = store(tmp.path());
        let mut got = Vec::new();
        for i in 0..5 {
            let (ip, _) = s
                .reserve(0, &set, &format!("c{i}"), "eth0")
                .expect("free address");
            got.push(ip.to_string());
        }
        assert_eq!(
            got,
            ["10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.5", "10.9.0.6"]
        );
        let err = s.reserve(0, &set, "c9", "eth0").expect_err("exhausted");
        assert_eq!(err.code, code::RANGE_EXHAUSTED);
        assert!(
            err.msg.contains("10.9.0.0/29"),
            "names the range: {}",
            err.msg
        );
        // Release one; round-robin continues after the last one, wrapping.
        assert_eq!(
            s.release("c1", "eth0").expect("release"),
            vec!["10.9.0.3".parse::<IpAddr>().expect("ip")]
        );
        let (ip, _) = s.reserve(0, &set, "c10", "eth0").expect("reuse");
        assert_eq!(ip.to_string(), "10.9.0.3");
    }

    #[test]
    fn the_cursor_is_rewritten_in_place_and_a_planted_one_replaced() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(tmp.path());
        let path = tmp.path().join("last_reserved_ip.0");
        s.set_cursor(0, Some("10.9.0.10".parse().expect("ip")))
            .expect("set");
        let inode = fs::metadata(&path).expect("cursor").ino();
        // Shorter text: the old tail is cut, host-local's reader parses
        // the whole file.
        s.set_cursor(0, Some("10.9.0.9".parse().expect("ip")))
            .expect("set");
        assert_eq!(fs::read_to_string(&path).expect("read"), "10.9.0.9");
        s.set_cursor(0, Some("fd00::1:2".parse().expect("ip")))
            .expect("set");
        assert_eq!(fs::read_to_string(&path).expect("read"), "fd00::1:2");
        assert_eq!(
            fs::metadata(&path).expect("cursor").ino(),
            inode,
            "the same file, no rename"
        );
        // A symlink or a second hard link at the cursor is replaced; what
        // it points to keeps its content.
        let target = tmp.path().join("elsewhere");
        fs::write(&target, "keep").expect("target");
        for plant in ["symlink", "hard link"] {
            fs::remove_file(&path).expect("remove");
            if plant == "symlink" {
                std::os::unix::fs::symlink(&target, &path).expect("symlink");
            } else {
                fs::hard_link(&target, &path).expect("hard link");
            }
            s.set_cursor(0, Some("10.9.0.3".parse().expect("ip")))
                .expect("set");
            assert_eq!(
                fs::read_to_string(&target).expect("read"),
                "keep",
                "{plant}"
            );
            assert_eq!(
                fs::read_to_string(&path).expect("read"),
                "10.9.0.3",
                "{plant}"
            );
            assert!(
                fs::symlink_metadata(&path).expect("meta").is_file(),
                "{plant}"
            );
        }
        assert_eq!(s.cursor(0), Some("10.9.0.3".parse().expect("ip")));
    }

    #[test]
    fn records_use_the_host_local_layout() {
        let tmp = tempfile::tempdir().expect("tmp");
        let set = set_of(r#"{"subnet":"fd00:9::/120"}"#);
        let s = store(tmp.path());
        let (ip, _) = s.reserve(0, &set, "abc", "net1").expect("reserve");
        let content = fs::read_to_string(tmp.path().join(ip.to_string())).expect("record file");
        assert_eq!(content, "abc\r\nnet1");
        assert_eq!(s.find("abc", "net1").expect("find"), vec![ip]);
        assert!(s.find("abc", "eth0").expect("find").is_empty());
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(tmp.path().join(ip.to_string()))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn release_only_touches_the_given_attachment() {
        let tmp = tempfile::tempdir().expect("tmp");
        let set = set_of(r#"{"subnet":"10.9.0.0/24"}"#);
        let s = store(tmp.path());
        s.reserve(0, &set, "a", "eth0").expect("a/eth0");
        s.reserve(0, &set, "a", "net1").expect("a/net1");
        assert_eq!(s.release("a", "eth0").expect("release").len(), 1);
        assert_eq!(s.release("a", "eth0").expect("release twice").len(), 0);
        assert_eq!(s.records().expect("records").len(), 1);
        assert_eq!(s.usage(&set).expect("usage"), (1, 253));
    }

    #[test]
    fn records_without_owner_are_removed_and_no_temp_file_stays() {
        let tmp = tempfile::tempdir().expect("tmp");
        let set = set_of(r#"{"subnet":"10.9.0.0/24"}"#);
        let s = store(tmp.path());
        fs::write(tmp.path().join("10.9.0.7"), "").expect("plant an empty record");
        s.reserve(0, &set, "a", "eth0").expect("reserve");
        assert_eq!(s.records().expect("records").len(), 1);
        assert!(
            !tmp.path().join("10.9.0.7").exists(),
            "ownerless record removed"
        );
        let leftovers: Vec<_> = fs::read_dir(tmp.path())
            .expect("dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".record"))
            .collect();
        assert!(leftovers.is_empty(), "no temporary record file stays");
    }

    #[test]
    fn lock_times_out_with_code_11() {
        let tmp = tempfile::tempdir().expect("tmp");
        let _held = store(tmp.path());
        let err = Store::open_locked(tmp.path(), Duration::from_millis(50))
            .err()
            .expect("second lock must time out");
        assert_eq!(err.code, code::TRY_AGAIN_LATER);
    }

    #[rstest]
    #[case("abc\r\neth0", Some(("abc", "eth0")))]
    #[case("abc\neth0\n", Some(("abc", "eth0")))]
    #[case("abc", Some(("abc", "")))]
    #[case("", None)]
    #[case("\r\n", None)]
    fn parses_record_files(#[case] content: &str, #[case] want: Option<(&str, &str)>) {
        let ip: IpAddr = "10.0.0.1".parse().expect("ip");
        let got = parse_record(ip, content);
        assert_eq!(
            got.as_ref()
                .map(|r| (r.container_id.as_str(), r.ifname.as_str())),
            want
        );
    }

    #[test]
    fn data_dir_that_is_a_file_is_an_io_error() {
        let tmp = tempfile::NamedTempFile::new().expect("tmp");
        let err = Store::open_locked(tmp.path(), Duration::from_millis(10))
            .err()
            .expect("refused");
        assert_eq!(err.code, code::IO_FAILURE);
    }
}
