//! Network-namespace discipline: the one place in cnilab that calls `setns`.
//!
//! A netlink socket stays bound to the namespace it was created in, so each
//! namespace gets its own connection, opened on a short-lived OS thread that
//! entered the namespace. No tokio worker thread ever changes namespace.
//!
//! This file: opening namespace files, [`run_in`], netlink connections and
//! processes inside a namespace. `sysctl.rs`: sysctls, through a private
//! procfs instance. `defaults.rs`: a new namespace set to the kernel's
//! values where it inherited the host's. `throwaway.rs`: [`Netns`], the
//! named namespaces tests and labs create and remove (also after a panic),
//! and [`sweep`] for what a killed run left behind.

pub mod defaults;
pub mod owner;
mod sysctl;
mod throwaway;
pub use sysctl::{read_sysctl, sysctl_dir, write_sysctl, LOOKUPS_PER_INSTANCE};
pub use throwaway::*;

use nix::sched::{setns, CloneFlags};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Opens a namespace file (`/var/run/netns/x`, `/proc/<pid>/ns/net`).
/// The open never blocks (a FIFO in its place would block a plain open
/// forever) and anything but a regular file (namespace files are regular
/// files of nsfs) is refused before it is used.
pub fn open(path: impl AsRef<Path>) -> io::Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let path = path.as_ref();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("open netns {}: {e}", path.display())))?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is {what}, not a network namespace", path.display()),
        ));
    }
    Ok(file)
}

/// True when `ns` is the calling process's own network namespace (the
/// same nsfs inode as `/proc/self/ns/net`).
pub fn is_own_namespace(ns: &File) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::metadata("/proc/self/ns/net")?;
    let other = ns.metadata()?;
    Ok(own.dev() == other.dev() && own.ino() == other.ino())
}

/// Opens `path` and makes sure it is a network namespace (not a regular
/// file, a directory or another kind of namespace), before anything is done
/// with it.
pub fn open_network_namespace(path: impl AsRef<Path>) -> io::Result<File> {
    let path = path.as_ref();
    let file = open(path)?;
    check_network_namespace(&file, path)?;
    Ok(file)
}

/// Makes sure an opened file is a network namespace.
pub fn check_network_namespace(file: &File, path: &Path) -> io::Result<()> {
    // NS_GET_NSTYPE: _IO(0xb7, 0x3). It answers only for namespace files.
    const NS_GET_NSTYPE: nix::libc::c_ulong = 0xb703;
    // SAFETY: an ioctl without an argument on a descriptor we own.
    let kind =
        unsafe { nix::libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(file), NS_GET_NSTYPE as _) };
    if kind == nix::libc::CLONE_NEWNET {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a network namespace", path.display()),
        ))
    }
}

/// Runs `f` on a fresh OS thread that first entered the network namespace
/// `ns`. The thread ends with `f`, so the namespace switch never leaks into a
/// thread that anything else uses.
pub fn run_in<F, R>(ns: &File, f: F) -> io::Result<R>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                Ok(f())
            })
            .join()
            .map_err(|_| io::Error::other("thread inside the netns panicked"))?
    })
}

/// A netlink route connection bound to one namespace. The connection task
/// runs on the current tokio runtime; the socket was made inside `ns`.
pub fn connect(ns: Option<&File>) -> io::Result<rtnetlink::Handle> {
    connect_on(&tokio::runtime::Handle::current(), ns)
}

/// [`connect`] in the calling thread's namespace, its socket set to
/// `NETLINK_GET_STRICT_CHK`: the kernel checks get requests strictly and
/// filters dumps by the link index and family of the request, so a dump of
/// one bridge's addresses carries those, not every veth's link-local
/// address on the node (which grows with the pods).
pub fn connect_strict() -> io::Result<rtnetlink::Handle> {
    connect_here(&tokio::runtime::Handle::current(), true)
}

/// [`connect`] for a given runtime, so it can be called from a thread that
/// is not in a runtime context (to open connections in parallel).
pub fn connect_on(
    runtime: &tokio::runtime::Handle,
    ns: Option<&File>,
) -> io::Result<rtnetlink::Handle> {
    match ns {
        None => connect_here(runtime, false),
        Some(ns) => run_in(ns, || connect_here(runtime, false))?,
    }
}

/// [`connect_on`] on a scoped thread of its own that enters `ns`; once
/// connected, `then` runs on the same thread, still inside `ns` (work that
/// must be done from the namespace, such as a sysctl of an interface made
/// meanwhile), and the thread ends: one thread for both, where
/// [`connect_on`] and [`write_sysctl`] start one each.
pub fn spawn_connect_then<'scope, 'env, R: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    runtime: &'env tokio::runtime::Handle,
    ns: &'env File,
    then: impl FnOnce() -> R + Send + 'scope,
) -> std::thread::ScopedJoinHandle<'scope, io::Result<(rtnetlink::Handle, R)>> {
    scope.spawn(move || {
        setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
        let handle = connect_here(runtime, false)?;
        Ok((handle, then()))
    })
}

/// A connection in the calling thread's namespace, its task on `runtime`;
/// `strict`: see [`connect_strict`].
fn connect_here(runtime: &tokio::runtime::Handle, strict: bool) -> io::Result<rtnetlink::Handle> {
    use rtnetlink::sys::AsyncSocket;
    let (mut connection, handle, _messages) = {
        let _entered = runtime.enter();
        rtnetlink::new_connection()?
    };
    if strict {
        connection
            .socket_mut()
            .socket_mut()
            .set_netlink_get_strict_chk(true)?;
    }
    runtime.spawn(connection);
    Ok(handle)
}

/// Runs an async netlink job against the namespace `ns` on a dedicated
/// thread with its own current-thread tokio runtime (the connection is made
/// inside `ns`), so it is safe to call from anywhere, including from inside
/// another tokio runtime. The error says what failed.
pub fn netlink_job<F, Fut, R>(ns: &File, job: F) -> Result<R, String>
where
    F: FnOnce(rtnetlink::Handle) -> Fut + Send,
    Fut: std::future::Future<Output = Result<R, rtnetlink::Error>>,
    R: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("tokio runtime: {e}"))?;
                rt.block_on(async {
                    let handle = connect(Some(ns)).map_err(|e| format!("connect: {e}"))?;
                    job(handle).await.map_err(|e| e.to_string())
                })
            })
            .join()
            .map_err(|_| "netlink thread panicked".to_string())?
    })
}

/// Starts `cmd` inside the namespace `ns`: the process is spawned from a
/// short-lived thread that entered `ns`, and a child starts in its parent
/// thread's namespace. Unlike [`command_in`] this needs no `pre_exec` hook,
/// so the standard library can use `posix_spawn` (a vfork) instead of a
/// full `fork` of a large multi-threaded process: much cheaper per call.
pub fn spawn_in(ns: &File, cmd: &mut Command) -> io::Result<std::process::Child> {
    run_in(ns, || cmd.spawn())?
}

/// Makes `cmd` run inside the namespace `ns` (the child enters it before exec).
/// Input strings are never passed through a shell.
pub fn command_in(ns: &File, cmd: &mut Command) {
    let fd = ns.try_clone();
    // SAFETY: the closure only calls setns(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let fd = fd
                .as_ref()
                .map_err(|e| io::Error::new(e.kind(), e.to_string()))?;
            setns(fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
        });
    }
}

/// Brings `lo` up in the calling thread's own namespace (`SIOCSIFFLAGS` on
/// a datagram socket: one flag needs no netlink connection). For a thread
/// that made or entered a namespace (see `Netns::with_label_setup`).
pub fn lo_up_here() -> io::Result<()> {
    use nix::libc;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `ifreq` is plain data, for which all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo") {
        *slot = *byte as libc::c_char;
    }
    let fail = |what: &str| {
        let e = io::Error::last_os_error();
        io::Error::new(e.kind(), format!("{what} of lo: {e}"))
    };
    // SAFETY: SIOCGIFFLAGS fills the `ifreq` it is given.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut request) } < 0 {
        return Err(fail("SIOCGIFFLAGS"));
    }
    // SAFETY: SIOCGIFFLAGS set the flags member of the union.
    unsafe { request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the `ifreq` it is given.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS as _, &request) } < 0 {
        return Err(fail("SIOCSIFFLAGS"));
    }
    Ok(())
}

/// Whether IP forwarding is on in the caller's namespace
/// (`net.ipv4.ip_forward`; with `v6`, `net.ipv6.conf.all.forwarding`), asked
/// over netlink (`RTM_GETNETCONF`). A `/proc/sys` path lookup walks one
/// dentry of that name per network namespace on the machine that ever
/// looked it up (thousands in a big lab); netlink reads the value directly.
pub fn forwarding(v6: bool) -> io::Result<bool> {
    use crate::nftnl::{align4, errno_of, frame, put_attr, split};
    use nix::libc;
    use nix::sys::socket::{
        recv, send, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType,
    };
    use std::os::fd::AsRawFd;
    const RTM_NEWNETCONF: u16 = 80;
    const RTM_GETNETCONF: u16 = 82;
    const NETCONFA_IFINDEX: u16 = 1;
    const NETCONFA_FORWARDING: u16 = 2;
    const NETCONFA_IFINDEX_ALL: i32 = -1;
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )?;
    // struct netconfmsg (the family, padded), then the "all" index.
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET } as u8;
    let mut body = vec![family, 0, 0, 0];
    put_attr(
        &mut body,
        NETCONFA_IFINDEX,
        &NETCONFA_IFINDEX_ALL.to_ne_bytes(),
    );
    let msg = frame(RTM_GETNETCONF, libc::NLM_F_REQUEST as u16, 1, &body);
    send(fd.as_raw_fd(), &msg, MsgFlags::empty())?;
    let mut buf = vec![0u8; 4096];
    let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
    for (kind, body) in split(&buf[..n]) {
        if kind == libc::NLMSG_ERROR as u16 {
            let e = errno_of(&body).unwrap_or(libc::EPROTO);
            return Err(io::Error::from_raw_os_error(if e == 0 {
                libc::EPROTO
            } else {
                e
            }));
        }
        if kind != RTM_NEWNETCONF {
            continue;
        }
        // Attributes after the padded netconfmsg.
        let mut attrs = body.get(4..).unwrap_or_default();
        while attrs.len() >= 4 {
            let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
            let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
            if len < 4 || len > attrs.len() {
                break;
            }
            if kind == NETCONFA_FORWARDING && len >= 8 {
                let value = i32::from_ne_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]);
                return Ok(value != 0);
            }
            attrs = &attrs[align4(len).min(attrs.len())..];
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "RTM_GETNETCONF answered without NETCONFA_FORWARDING",
    ))
}
