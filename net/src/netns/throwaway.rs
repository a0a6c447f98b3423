//! Throwaway network namespaces, named and bind-mounted like `ip netns add`
//! so that `ip netns exec cnilab-… sh` works on them while debugging.
//!
//! Every namespace is `cnilab-<pid>-<n>[-label]` under `/run/netns`. It is
//! deleted when its [`Netns`] is dropped (also while unwinding from a panic);
//! [`sweep`] removes what a killed run left behind, using the pid in the name.
//! `setns` happens only through the functions of the parent module, on
//! dedicated threads.

use super as plugin_netns;
use crate::nl::{self, Address, Link, Neighbour, Route};
use crate::snapshot::NetState;
use futures_util::TryStreamExt;
use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use rtnetlink::packet_route::link::LinkAttribute;
use rtnetlink::LinkUnspec;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where named namespaces live (what `ip netns` uses).
pub const NETNS_DIR: &str = "/run/netns";
/// Prefix of every namespace the harness creates.
pub const PREFIX: &str = "cnilab-";

static COUNTER: AtomicU32 = AtomicU32::new(0);
/// Set once the process is shutting down (Ctrl-C): no new namespace may
/// appear after the final sweep.
/// Creations hold it shared; [`stop_creating`] takes it exclusively.
static STOPPED: std::sync::RwLock<bool> = std::sync::RwLock::new(false);

/// Waits for creations under way, then refuses every later one in this
/// process.
pub fn stop_creating() {
    let mut stopped = STOPPED.write().unwrap_or_else(|e| e.into_inner());
    *stopped = true;
}

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("creating network namespaces needs root (CAP_SYS_ADMIN): run cnilab, or the tests, as root (for example with sudo)")]
    NotRoot,
    #[error("cannot prepare {NETNS_DIR} as a shared mount point: {0}")]
    Prepare(String),
    #[error("cannot create network namespace {name}: {reason}")]
    Create { name: String, reason: String },
    #[error("cannot delete network namespace {name}: {reason}")]
    Delete { name: String, reason: String },
    #[error("label {0:?} is not usable in a namespace name (use [A-Za-z0-9_-], at most 12 chars)")]
    BadLabel(String),
    #[error("inside namespace {name}: {source}")]
    Enter { name: String, source: io::Error },
    #[error("netlink in namespace {name}: {reason}")]
    Netlink { name: String, reason: String },
}

/// What runs inside a namespace on the thread that made it (see
/// [`Netns::with_label_setup`]).
pub type Setup<'a> = &'a (dyn Fn() -> io::Result<()> + Sync);

/// Where a named namespace comes from: a fresh one (with what runs inside
/// it first), or an existing namespace file to name.
enum Made<'a> {
    Fresh(Option<Setup<'a>>),
    From(&'a Path),
}

impl<'a> Made<'a> {
    fn of(from: Option<&'a Path>) -> Made<'a> {
        from.map_or(Made::Fresh(None), Made::From)
    }
}

/// A throwaway network namespace. Dropping it unmounts and removes it.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
    file: File,
    deleted: bool,
}

/// Fails with a clear message when the process is not root.
pub fn require_root() -> Result<(), NetnsError> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(NetnsError::NotRoot)
    }
}

impl Netns {
    /// Creates `cnilab-<pid>-<n>`.
    pub fn new() -> Result<Netns, NetnsError> {
        Self::create(None, Made::Fresh(None))
    }

    /// Creates `cnilab-<pid>-<n>-<label>`; the label shows in `ip netns list`.
    pub fn with_label(label: &str) -> Result<Netns, NetnsError> {
        Self::with_label_from(label, None)
    }

    /// Like [`Netns::with_label`]; with `from` (a namespace file such as a
    /// container's `/proc/<pid>/ns/net`), names that existing namespace
    /// instead of creating one (what `ip netns attach` does).
    pub fn with_label_from(label: &str, from: Option<&Path>) -> Result<Netns, NetnsError> {
        Self::create(Some(label), Made::of(from))
    }

    fn create(label: Option<&str>, made: Made<'_>) -> Result<Netns, NetnsError> {
        if let Some(label) = label.filter(|l| !name_chars_ok(l, 12)) {
            return Err(NetnsError::BadLabel(label.to_string()));
        }
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut name = format!("{PREFIX}{}-{n}", std::process::id());
        // The record comes first: a process killed right after the mount
        // leaves a namespace that [`sweep`] can prove was its own. Without
        // root, the clear error is that one, not the record's.
        require_root()?;
        super::owner::record_self().map_err(|reason| NetnsError::Create {
            name: name.clone(),
            reason,
        })?;
        if let Some(label) = label {
            name.push('-');
            name.push_str(label);
        }
        Self::create_named(name, made)
    }

    /// [`Netns::with_label`], with `setup` run inside the new namespace on
    /// the thread that made it, before it is named (`lo` up, sysctls): one
    /// thread and no `setns` for what otherwise takes a thread each. A
    /// failed setup leaves nothing behind and says what failed.
    pub fn with_label_setup(label: &str, setup: Setup<'_>) -> Result<Netns, NetnsError> {
        Self::create(Some(label), Made::Fresh(Some(setup)))
    }

    /// Creates a namespace with a name chosen by the caller, for labs that
    /// outlive the process (`cnilab lab up`); the name must start with
    /// [`PREFIX`] and not with a pid, so [`sweep`] leaves it alone.
    pub fn persistent(name: &str) -> Result<Netns, NetnsError> {
        Self::persistent_from(name, None)
    }

    /// Like [`Netns::persistent`]; `from` as in [`Netns::with_label_from`].
    pub fn persistent_from(name: &str, from: Option<&Path>) -> Result<Netns, NetnsError> {
        Self::create_persistent(name, Made::of(from))
    }

    /// [`Netns::persistent`] with `setup` as in [`Netns::with_label_setup`].
    pub fn persistent_setup(name: &str, setup: Setup<'_>) -> Result<Netns, NetnsError> {
        Self::create_persistent(name, Made::Fresh(Some(setup)))
    }

    fn create_persistent(name: &str, made: Made<'_>) -> Result<Netns, NetnsError> {
        let ok = name.starts_with(PREFIX) && name_chars_ok(name, 60);
        if !ok {
            return Err(NetnsError::BadLabel(name.to_string()));
        }
        Self::create_named(name.to_string(), made)
    }

    /// Opens an existing named namespace (`/run/netns/<name>`) that
    /// dropping the value leaves in place (a standing lab's, reopened);
    /// [`Netns::delete_on_drop`] makes it one that dropping deletes.
    pub fn open_kept(name: &str) -> Result<Netns, NetnsError> {
        let mut ns = Self::open_existing(name)?;
        ns.deleted = true;
        Ok(ns)
    }

    /// Dropping the value deletes the namespace from now on (one opened by
    /// [`Netns::open_kept`]).
    pub fn delete_on_drop(&mut self) {
        self.deleted = false;
    }

    /// Opens an existing named namespace (`/run/netns/<name>`); dropping the
    /// value deletes it unless [`Netns::keep`] is called.
    pub fn open_existing(name: &str) -> Result<Netns, NetnsError> {
        if name.contains('/') || name.starts_with('.') {
            return Err(NetnsError::BadLabel(name.to_string()));
        }
        let path = Path::new(NETNS_DIR).join(name);
        let file = plugin_netns::open(&path).map_err(|source| NetnsError::Enter {
            name: name.to_string(),
            source,
        })?;
        Ok(Netns {
            name: name.to_string(),
            path,
            file,
            deleted: false,
        })
    }

    /// The network namespace this process started in (its main thread's,
    /// which never changes namespace): the machine's own network, opened for
    /// reading only (tests check that nothing touched it). Dropping or
    /// deleting the value leaves the namespace alone.
    pub fn machine() -> Result<Netns, NetnsError> {
        let path = PathBuf::from("/proc/self/ns/net");
        let name = "the machine's own network".to_string();
        let file =
            plugin_netns::open_network_namespace(&path).map_err(|source| NetnsError::Enter {
                name: name.clone(),
                source,
            })?;
        Ok(Netns {
            name,
            path,
            file,
            deleted: true,
        })
    }

    /// Leaves the namespace in place when this value is dropped.
    pub fn keep(mut self) -> String {
        self.deleted = true;
        self.name.clone()
    }

    fn create_named(name: String, made: Made<'_>) -> Result<Netns, NetnsError> {
        require_root()?;
        let stopped = STOPPED.read().unwrap_or_else(|e| e.into_inner());
        if *stopped {
            return Err(NetnsError::Create {
                name,
                reason: "the process is shutting down".into(),
            });
        }
        prepare_netns_dir_once()?;
        let path = Path::new(NETNS_DIR).join(&name);
        let fail = |reason: String| NetnsError::Create {
            name: name.clone(),
            reason,
        };
        mount_point(&path).map_err(fail)?;
        let target = path.as_path();
        let alike = super::defaults::inherits_alike();
        // unshare(CLONE_NEWNET) on a thread of its own: only that thread moves
        // into the new namespace (and runs the setup there), and it ends
        // right after the bind mount.
        let made = std::thread::scope(|scope| {
            scope
                .spawn(move || -> Result<(), String> {
                    let source = match made {
                        Made::From(source) => source.to_path_buf(),
                        Made::Fresh(setup) => {
                            unshare(CloneFlags::CLONE_NEWNET)
                                .map_err(|e| format!("unshare: {e}"))?;
                            super::defaults::reset_inherited(alike).map_err(|e| {
                                format!("setting the kernel's values over the host's: {e}")
                            })?;
                            if let Some(setup) = setup {
                                setup().map_err(|e| format!("inside it: {e}"))?;
                            }
                            PathBuf::from("/proc/thread-self/ns/net")
                        }
                    };
                    mount(
                        Some(&source),
                        target,
                        None::<&str>,
                        MsFlags::MS_BIND,
                        None::<&str>,
                    )
                    .map_err(|e| {
                        format!(
                            "bind mount {} onto {}: {e}",
                            source.display(),
                            target.display()
                        )
                    })
                })
                .join()
        })
        .map_err(|_| fail("namespace thread panicked".into()))
        .and_then(|r| r.map_err(fail));
        if let Err(e) = made {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let file = match plugin_netns::open(&path) {
            Ok(f) => f,
            Err(e) => {
                let _ = remove_mount(&path);
                return Err(fail(e.to_string()));
            }
        };
        Ok(Netns {
            name,
            path,
            file,
            deleted: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes the namespace's name away (it is no longer under
    /// `/run/netns`): it lives on while this value, or a process in it,
    /// holds it, and goes with the last of them, as a namespace held only by
    /// its processes does (a pod whose runtime never named it). Commands
    /// still run in it through this value.
    pub fn unname(&mut self) -> Result<(), NetnsError> {
        if self.deleted {
            return Err(NetnsError::BadLabel(self.name.clone()));
        }
        remove_mount(&self.path).map_err(|reason| NetnsError::Delete {
            name: self.name.clone(),
            reason,
        })?;
        self.deleted = true;
        self.path = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        Ok(())
    }

    /// Names the namespace `name` under `/run/netns` instead, the name
    /// another tool would give it (a runtime's `cni-<uuid>`): for fixtures
    /// that must look like what real tools make. The new name is recorded
    /// with this process's owner record first, so [`sweep`] removes it
    /// after a killed run like a `cnilab-<pid>-<n>` name; dropping the value
    /// removes it as before.
    pub fn rename(&mut self, name: &str) -> Result<(), NetnsError> {
        let fail = |reason: String| NetnsError::Create {
            name: name.to_string(),
            reason,
        };
        if !name_chars_ok(name, 64) || self.deleted {
            return Err(NetnsError::BadLabel(name.to_string()));
        }
        super::owner::record_self().map_err(fail)?;
        super::owner::record_name(name).map_err(fail)?;
        let path = Path::new(NETNS_DIR).join(name);
        mount_point(&path).map_err(fail)?;
        let source = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        if let Err(e) = mount(
            Some(&source),
            &path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ) {
            let _ = std::fs::remove_file(&path);
            return Err(fail(format!("bind mount onto {}: {e}", path.display())));
        }
        let old = std::mem::replace(&mut self.path, path);
        self.name = name.to_string();
        remove_mount(&old).map_err(fail)
    }

    /// `/run/netns/<name>`: what a runtime passes as `CNI_NETNS`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An open handle on the namespace (kept alive as long as `self`).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Runs `f` on a fresh OS thread inside the namespace.
    pub fn run<F, R>(&self, f: F) -> Result<R, NetnsError>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        plugin_netns::run_in(&self.file, f).map_err(|source| NetnsError::Enter {
            name: self.name.clone(),
            source,
        })
    }

    /// A `Command` whose process runs inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        plugin_netns::command_in(&self.file, &mut cmd);
        cmd
    }

    /// Whether link `name` is operationally up (carrier on both ends of a
    /// veth, and the kernel's link watcher has told its upper devices, such
    /// as a bridge enabling the port).
    pub fn oper_up(&self, name: &str) -> Result<bool, NetnsError> {
        use rtnetlink::packet_route::link::State;
        let name = name.to_string();
        self.netlink(|h| async move {
            let mut stream = h.link().get().match_name(name).execute();
            Ok(match stream.try_next().await {
                Ok(Some(msg)) => msg
                    .attributes
                    .iter()
                    .any(|a| matches!(a, LinkAttribute::OperState(State::Up))),
                Ok(None) | Err(_) => false,
            })
        })
    }

    /// The neighbour (ARP/NDP) entries that map an address to a MAC.
    pub fn neighbours(&self) -> Result<Vec<Neighbour>, NetnsError> {
        self.netlink(|h| async move { nl::neighbours(&h).await })
    }

    /// Deletes the neighbour (ARP/NDP) entries for `addr` on every link, so
    /// that the next packet to it resolves its link-layer address afresh.
    /// Returns how many entries were deleted.
    pub fn forget_neighbour(&self, addr: IpAddr) -> Result<usize, NetnsError> {
        self.netlink(|h| async move {
            let mut deleted = 0;
            for n in nl::neighbours(&h).await? {
                if n.addr != addr {
                    continue;
                }
                match h.neighbours().del(n.message).execute().await {
                    Ok(()) => deleted += 1,
                    // Gone meanwhile (garbage-collected): nothing to forget.
                    Err(rtnetlink::Error::NetlinkError(e))
                        if e.raw_code() == -nix::libc::ENOENT => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(deleted)
        })
    }

    /// Runs an async netlink job against this namespace on a dedicated thread
    /// with its own current-thread tokio runtime, so it is safe to call from
    /// anywhere, including from inside another tokio runtime.
    pub fn netlink<F, Fut, R>(&self, job: F) -> Result<R, NetnsError>
    where
        F: FnOnce(rtnetlink::Handle) -> Fut + Send,
        Fut: Future<Output = Result<R, rtnetlink::Error>>,
        R: Send,
    {
        plugin_netns::netlink_job(&self.file, job).map_err(|reason| NetnsError::Netlink {
            name: self.name.clone(),
            reason,
        })
    }

    /// Brings `lo` up (new namespaces start with it down).
    pub fn set_lo_up(&self) -> Result<(), NetnsError> {
        self.netlink(|h| async move {
            h.link()
                .set(LinkUnspec::new_with_name("lo").up().build())
                .execute()
                .await
        })
    }

    pub fn links(&self) -> Result<Vec<Link>, NetnsError> {
        self.netlink(|h| async move { nl::links(&h).await })
    }

    pub fn addresses(&self) -> Result<Vec<Address>, NetnsError> {
        self.netlink(|h| async move { nl::addresses(&h, None).await })
    }

    /// Routes of every table, both families.
    pub fn routes(&self) -> Result<Vec<Route>, NetnsError> {
        self.netlink(|h| async move { nl::all_routes(&h).await })
    }

    /// Links, addresses and routes in one netlink session.
    pub fn snapshot(&self) -> Result<NetState, NetnsError> {
        self.netlink(|h| async move { NetState::read(&h).await })
    }

    /// Deletes the namespace now (the plugin then sees a stale `CNI_NETNS`).
    pub fn delete(mut self) -> Result<(), NetnsError> {
        // Already deleted, or never ours to delete (`machine`).
        if std::mem::replace(&mut self.deleted, true) {
            return Ok(());
        }
        remove_mount(&self.path).map_err(|reason| NetnsError::Delete {
            name: self.name.clone(),
            reason,
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.deleted {
            if let Err(e) = remove_mount(&self.path) {
                eprintln!("cnilab: cannot delete netns {}: {e}", self.name);
            }
        }
    }
}

/// The mount point of a named namespace: an empty file, created
/// exclusively so two runs can never share a name.
fn mount_point(path: &Path) -> Result<(), String> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o000)
        .open(path)
        .map(drop)
        .map_err(|e| format!("create {}: {e}", path.display()))
}

/// A non-empty name of at most `max` bytes from `[A-Za-z0-9_-]`.
fn name_chars_ok(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// [`prepare_netns_dir`] until it has succeeded once in this process: the
/// `MS_SHARED | MS_REC` remount walks every mount under `/run/netns`, so
/// per namespace it cost a lab of N namespaces N² mount visits.
fn prepare_netns_dir_once() -> Result<(), NetnsError> {
    static PREPARED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if PREPARED.load(Ordering::Acquire) {
        return Ok(());
    }
    prepare_netns_dir()?;
    PREPARED.store(true, Ordering::Release);
    Ok(())
}

/// Makes `/run/netns` exist and be a shared mount, as iproute2 does, so that
/// namespace mounts made here propagate to other mount namespaces.
fn prepare_netns_dir() -> Result<(), NetnsError> {
    let dir = Path::new(NETNS_DIR);
    std::fs::create_dir_all(dir).map_err(|e| NetnsError::Prepare(e.to_string()))?;
    let shared = MsFlags::MS_SHARED | MsFlags::MS_REC;
    loop {
        match mount(None::<&str>, dir, None::<&str>, shared, None::<&str>) {
            Ok(()) => return Ok(()),
            // Not a mount point yet: bind it onto itself, then retry.
            Err(Errno::EINVAL) => {
                mount(
                    Some(dir),
                    dir,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )
                .map_err(|e| NetnsError::Prepare(format!("bind {NETNS_DIR} onto itself: {e}")))?;
            }
            Err(e) => return Err(NetnsError::Prepare(e.to_string())),
        }
    }
}

fn remove_mount(path: &Path) -> Result<(), String> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(format!("umount {}: {e}", path.display())),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("remove {}: {e}", path.display())),
    }
}

/// Removes every named namespace for which `doomed(name)` holds; returns
/// the names removed, sorted.
pub fn remove_matching(doomed: impl Fn(&str) -> bool) -> Result<Vec<String>, NetnsError> {
    let mut removed = Vec::new();
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(NetnsError::Prepare(format!("read {NETNS_DIR}: {e}"))),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !doomed(&name) {
            continue;
        }
        remove_mount(&entry.path()).map_err(|reason| NetnsError::Delete {
            name: name.clone(),
            reason,
        })?;
        removed.push(name);
    }
    removed.sort();
    Ok(removed)
}

/// Removes every namespace whose name starts with `prefix`, whoever made
/// it (a lab's own namespaces on Ctrl-C, or a persistent lab on `lab down`).
pub fn remove_prefixed(prefix: &str) -> Result<Vec<String>, NetnsError> {
    remove_matching(|name| !prefix.is_empty() && name.starts_with(prefix))
}

/// Removes the namespaces a killed process left: named exactly as
/// [`Netns::with_label`] names them (`<prefix><pid>-<n>[-<label>]`), and
/// proved its own by the owner record that process wrote before making
/// them, naming a process that is gone ([`super::owner`]). A name alone
/// proves nothing: a namespace of that shape without the record stays.
/// Returns the names it removed. `prefix` is normally [`PREFIX`].
pub fn sweep(prefix: &str) -> Result<Vec<String>, NetnsError> {
    let renamed = super::owner::names_of_gone();
    let removed = remove_matching(|name| {
        throwaway_pid(prefix, name).is_some_and(super::owner::owner_gone)
            || renamed.iter().any(|(_, n)| n == name)
    })?;
    super::owner::forget_names(&renamed);
    let left: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    super::owner::forget_gone(prefix, &left);
    Ok(removed)
}

/// The pid in `name` when it has the shape of a throwaway namespace's:
/// `<prefix><pid>-<n>` or `<prefix><pid>-<n>-<label>`.
fn throwaway_pid(prefix: &str, name: &str) -> Option<u32> {
    let digits = |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
    let mut parts = name.strip_prefix(prefix)?.splitn(3, '-');
    let pid = parts.next().filter(|p| digits(p))?;
    parts.next().filter(|n| digits(n))?;
    if let Some(label) = parts.next() {
        if !name_chars_ok(label, 12) {
            return None;
        }
    }
    pid.parse().ok()
}

#[cfg(test)]
mod shape_tests {
    use super::throwaway_pid;

    #[test]
    fn only_the_throwaway_shape_yields_a_pid() {
        assert_eq!(throwaway_pid("cnilab-", "cnilab-42-0"), Some(42));
        assert_eq!(throwaway_pid("cnilab-", "cnilab-42-7-node1"), Some(42));
        for other in [
            "cnilab-42-vg",
            "cnilab-42",
            "cnilab-lab-x-node1",
            "cnilab-99999999999-0",
            "cnilab-42-0-label-far-too-long",
            "other-42-0",
        ] {
            assert_eq!(throwaway_pid("cnilab-", other), None, "{other}");
        }
    }
}
