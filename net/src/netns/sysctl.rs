//! Sysctls, looked up through a private instance of procfs.
//!
//! Every network namespace's `/proc/sys/net/<x>` directory entry hangs off
//! the one `/proc/sys/net` entry of the machine's procfs, under the same
//! name, so the first lookup of `net/ipv6` (or `net/ipv4`) in a namespace
//! walks one entry per namespace that ever looked it up, each compared
//! under the kernel's sysctl lock. Measured here (a C program writing
//! `net/ipv6/conf/lo/accept_ra` once in each of N new namespaces): 71 µs CPU
//! a write at N = 0, 373 µs at 500, 743 µs at 1,000, 3.4 ms at 3,000; a lab
//! of 5,000 pods paid about 8 ms a pod for the plugin's one `accept_ra`.
//! A procfs instance of our own (`fsopen("proc")`, detached, attached
//! nowhere, so no mount table changes) has its own entries, so the walk
//! is as long as this process made it: 128–142 µs CPU a write at any N,
//! with the instance's creation and teardown.
//!
//! One instance serves the process for [`LOOKUPS_PER_INSTANCE`] lookups and
//! is then replaced (a long-lived process such as the lab's harness would
//! otherwise grow the same walk inside its own instance). Where procfs
//! cannot be instantiated (no new mount API, seccomp, no `CAP_SYS_ADMIN`)
//! the process uses `/proc/sys` as before: only slower, never different.

use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::libc;
use nix::sys::stat::Mode;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use super::run_in;

/// Lookups one private instance serves before it is replaced: its own
/// walk stays under this many entries; creating and tearing one down
/// (about 200 µs) spreads over them.
pub const LOOKUPS_PER_INSTANCE: u32 = 64;

/// Reads a sysctl under `/proc/sys` as seen from namespace `ns` (or from the
/// caller's namespace when `None`). `key` uses slashes: `net/ipv4/ip_forward`.
pub fn read_sysctl(ns: Option<&File>, key: &str) -> io::Result<String> {
    let read = || {
        let mut text = String::new();
        open_key(key, OFlag::O_RDONLY)?.read_to_string(&mut text)?;
        Ok(text.trim().to_string())
    };
    match ns {
        None => read(),
        Some(ns) => run_in(ns, read)?,
    }
}

/// Writes a sysctl as seen from namespace `ns` (or the caller's).
pub fn write_sysctl(ns: Option<&File>, key: &str, value: &str) -> io::Result<()> {
    let write = || {
        open_key(key, OFlag::O_WRONLY)?
            .write_all(value.as_bytes())
            .map_err(|e| io::Error::new(e.kind(), format!("write {value} to /proc/sys/{key}: {e}")))
    };
    match ns {
        None => write(),
        Some(ns) => run_in(ns, write)?,
    }
}

/// A handle on the `/proc/sys` directory, for a caller that looks up many
/// keys relative to it (`openat`), in the calling thread's namespace.
pub fn sysctl_dir() -> io::Result<OwnedFd> {
    open_in_proc("/proc/sys", OFlag::O_RDONLY | OFlag::O_DIRECTORY)
}

fn open_key(key: &str, flags: OFlag) -> io::Result<File> {
    open_in_proc(&sysctl_path(key)?, flags).map(File::from)
}

/// Opens `path` (under `/proc/`) in the private instance, else in `/proc`.
fn open_in_proc(path: &str, flags: OFlag) -> io::Result<OwnedFd> {
    let flags = flags | OFlag::O_CLOEXEC;
    let opened = match (instance(), path.strip_prefix("/proc/")) {
        (Some(root), Some(inside)) => openat(root.as_fd(), inside, flags, Mode::empty()),
        _ => openat(AT_FDCWD, path, flags, Mode::empty()),
    };
    opened.map_err(|errno| {
        let e = io::Error::from(errno);
        io::Error::new(e.kind(), format!("open {path}: {e}"))
    })
}

/// What this process looks sysctls up through.
enum Source {
    /// Not tried yet.
    Unknown,
    /// A private procfs instance (its root) and the lookups it has served.
    Private { root: Arc<OwnedFd>, lookups: u32 },
    /// The machine's `/proc`: procfs cannot be instantiated here.
    Shared,
}

static INSTANCE: Mutex<Source> = Mutex::new(Source::Unknown);

/// The root of the private instance to look the next key up in, or `None`
/// for `/proc`. A used-up instance is replaced; the old one goes when its
/// last user drops it, outside the lock.
fn instance() -> Option<Arc<OwnedFd>> {
    let mut retired = None;
    let root = {
        let mut source = INSTANCE.lock().ok()?;
        match &mut *source {
            Source::Shared => None,
            Source::Private { root, lookups } if *lookups < LOOKUPS_PER_INSTANCE => {
                *lookups += 1;
                Some(Arc::clone(root))
            }
            _ => match private_proc() {
                Ok(fd) => {
                    let root = Arc::new(fd);
                    let fresh = Source::Private {
                        root: Arc::clone(&root),
                        lookups: 1,
                    };
                    retired = Some(std::mem::replace(&mut *source, fresh));
                    Some(root)
                }
                Err(e) if unsupported(&e) => {
                    *source = Source::Shared;
                    None
                }
                // Out of descriptors or memory: this lookup only.
                Err(_) => None,
            },
        }
    };
    drop(retired);
    root
}

/// Errors that mean procfs cannot be instantiated by this process at all.
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENOSYS
                | libc::EPERM
                | libc::EACCES
                | libc::ENODEV
                | libc::EINVAL
                | libc::EOPNOTSUPP
        )
    )
}

/// A new, detached procfs instance: `fsopen`, create, `fsmount`. Its
/// descriptor is the instance's root; nothing is mounted anywhere.
fn private_proc() -> io::Result<OwnedFd> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
    const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
    const MOUNT_ATTR_NOEXEC: libc::c_uint = 0x8;
    let owned = |ret: libc::c_long| -> io::Result<OwnedFd> {
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = RawFd::try_from(ret).map_err(|_| io::Error::other("descriptor out of range"))?;
        // SAFETY: the kernel just returned this descriptor to us alone.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    // SAFETY: fsopen reads a NUL-terminated name.
    let context =
        owned(unsafe { libc::syscall(libc::SYS_fsopen, c"proc".as_ptr(), FSOPEN_CLOEXEC) })?;
    // SAFETY: FSCONFIG_CMD_CREATE takes no key, value or aux.
    let created = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if created < 0 {
        return Err(io::Error::last_os_error());
    }
    let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    // SAFETY: fsmount takes the context descriptor and two flag words.
    owned(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            context.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            attrs,
        )
    })
}

fn sysctl_path(key: &str) -> io::Result<String> {
    let ok = !key.is_empty()
        && key.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        });
    if !ok {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad sysctl key {key:?}"),
        ));
    }
    Ok(format!("/proc/sys/{key}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn sysctl_keys_cannot_escape_proc_sys() {
        assert!(sysctl_path("net/ipv4/ip_forward").is_ok());
        assert!(sysctl_path("net/ipv4/conf/veth-a.1/rp_filter").is_ok());
        assert!(sysctl_path("../../etc/passwd").is_err());
        assert!(sysctl_path("net//x").is_err());
        assert!(sysctl_path("").is_err());
    }

    fn device_of(fd: &OwnedFd) -> u64 {
        File::from(fd.try_clone().expect("dup"))
            .metadata()
            .expect("fstat")
            .dev()
    }

    /// Drops the process's instance, as if none had been made yet.
    fn release_instance() {
        let old = INSTANCE.lock().ok().and_then(|mut source| {
            matches!(*source, Source::Private { .. })
                .then(|| std::mem::replace(&mut *source, Source::Unknown))
        });
        drop(old);
    }

    /// Root: the instance is procfs of its own (another device than
    /// `/proc`), reads what `/proc/sys` reads, is replaced after its
    /// lookups, and a handle from the old one keeps working.
    #[test]
    fn lookups_go_through_a_private_procfs_that_is_renewed() {
        if let Err(e) = super::super::require_root() {
            panic!("this test instantiates procfs and must run as root: {e}");
        }
        release_instance();
        let first = instance().expect("a private procfs instance (fsopen) as root");
        let proc_dev = std::fs::metadata("/proc").expect("stat /proc").dev();
        assert_ne!(device_of(&first), proc_dev, "the instance is /proc itself");
        let via_proc = std::fs::read_to_string("/proc/sys/kernel/ostype").expect("read");
        assert_eq!(
            read_sysctl(None, "kernel/ostype").expect("read"),
            via_proc.trim()
        );
        let dir = sysctl_dir().expect("sys dir");
        assert_eq!(device_of(&dir), device_of(&first));
        // Other tests in this process may take lookups meanwhile: at most
        // LOOKUPS_PER_INSTANCE more calls must bring a new instance.
        let renewed = (0..=LOOKUPS_PER_INSTANCE)
            .filter_map(|_| instance())
            .find(|root| !Arc::ptr_eq(root, &first))
            .expect("a new instance after its lookups");
        assert_ne!(device_of(&renewed), device_of(&first));
        drop(first);
        release_instance();
        drop(renewed);
        let mut text = String::new();
        File::from(
            openat(&dir, "kernel/ostype", OFlag::O_RDONLY, Mode::empty())
                .expect("the released instance's directory still opens files"),
        )
        .read_to_string(&mut text)
        .expect("read");
        assert_eq!(text, via_proc);
    }
}
