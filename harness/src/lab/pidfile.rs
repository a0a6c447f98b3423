//! Proving a process is ours before signalling it. A pidfile holds the pid
//! and the process's start time (field 22 of `/proc/<pid>/stat`, clock ticks
//! since boot); a pid that was reused by another process has another start
//! time. The signal goes through a pidfd opened before the check, so the
//! process checked is the process signalled.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

/// Start time of process `pid` (field 22 of `/proc/<pid>/stat`): the one
/// reading the namespaces' owner records use too.
pub use cnilab_net::netns::owner::start_time;
use cnilab_net::netns::owner::start_time_of_stat;

/// Opens (creates, empties) the pidfile a child will fill in itself with
/// [`write_own_identity`] between fork and exec: the file names the process
/// from the moment it exists, whenever the parent dies.
pub fn prepare(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
}

/// In a child between fork and exec: writes `<pid> <start>` of the calling
/// process to `fd` (from [`prepare`]). Only open(2), read(2), write(2),
/// close(2) and getpid(2), all async-signal-safe; nothing is allocated.
pub fn write_own_identity(fd: std::os::fd::RawFd) -> io::Result<()> {
    let mut stat = [0u8; 2048];
    // SAFETY: a NUL-terminated literal path; the descriptor is closed below.
    let sfd = unsafe {
        nix::libc::open(
            c"/proc/self/stat".as_ptr(),
            nix::libc::O_RDONLY | nix::libc::O_CLOEXEC,
        )
    };
    if sfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: reads into a stack buffer of the given length.
    let n = unsafe { nix::libc::read(sfd, stat.as_mut_ptr().cast(), stat.len()) };
    // SAFETY: closes the descriptor opened above.
    unsafe { nix::libc::close(sfd) };
    let Some(read) = usize::try_from(n).ok().filter(|&n| n > 0) else {
        return Err(io::Error::last_os_error());
    };
    let start = start_time_of_stat(&stat[..read])
        .ok_or_else(|| io::Error::from_raw_os_error(nix::libc::EINVAL))?;
    // SAFETY: getpid(2) cannot fail.
    let pid = u64::try_from(unsafe { nix::libc::getpid() }).unwrap_or(0);
    let mut line = [0u8; 48];
    let mut len = put_decimal(&mut line, 0, pid);
    line[len] = b' ';
    len = put_decimal(&mut line, len + 1, start);
    line[len] = b'\n';
    len += 1;
    // SAFETY: writes `len` bytes of a stack buffer to the caller's descriptor.
    let written = unsafe { nix::libc::write(fd, line.as_ptr().cast(), len) };
    if usize::try_from(written).ok() == Some(len) {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes `n` in decimal at `buf[at..]`; returns the index after it.
fn put_decimal(buf: &mut [u8], at: usize, mut n: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut count = 0;
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..count {
        buf[at + i] = digits[count - 1 - i];
    }
    at + count
}

/// A process identity: pid plus start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub pid: u32,
    pub start: u64,
}

impl Identity {
    /// The identity of a running process (`None` when it is gone).
    pub fn of(pid: u32) -> Option<Identity> {
        start_time(pid).map(|start| Identity { pid, start })
    }

    /// This process.
    pub fn current() -> Option<Identity> {
        Identity::of(std::process::id())
    }

    /// Whether that very process still runs (a zombie counts as gone).
    pub fn alive(&self) -> bool {
        cnilab_net::netns::owner::running(self.pid, self.start)
    }

    /// Sends SIGKILL to this process if, and only if, it is still the
    /// process this identity names. Returns whether it was signalled. Only
    /// for identities read from the live process table (a shim's children);
    /// an identity from a pidfile goes through [`Identity::kill_if_ours`].
    pub fn kill_if_same(&self) -> io::Result<bool> {
        self.kill_if(|| true)
    }

    /// Stops (SIGSTOP) this process if it is still the one this identity
    /// names, and waits (up to a second) until the kernel shows it stopped:
    /// from then on it forks nothing. Returns whether it was signalled.
    pub fn stop_if_same(&self) -> io::Result<bool> {
        self.stop_if(|| true)
    }

    /// [`Identity::stop_if_same`] for an identity read from a pidfile in
    /// `dir`, proved as [`Identity::kill_if_ours`] proves it.
    pub fn stop_if_ours(&self, dir: &Path) -> io::Result<bool> {
        if self.pid <= 1 || self.pid == std::process::id() {
            return Ok(false);
        }
        self.stop_if(|| names_dir(self.pid, dir))
    }

    fn stop_if(&self, proof: impl FnOnce() -> bool) -> io::Result<bool> {
        if !self.signal_if(nix::libc::SIGSTOP, proof)? {
            return Ok(false);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while std::time::Instant::now() < deadline {
            let stat = std::fs::read(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
            match cnilab_net::netns::owner::stat_field(&stat, 0) {
                Some(b"T" | b"t" | b"Z" | b"X") | None => break,
                _ => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
        Ok(true)
    }

    /// Like [`Identity::kill_if_same`], for an identity read from a pidfile
    /// in `dir`: a pid and a start time prove nothing on their own (a
    /// pidfile can name PID 1). The process must also be one this lab
    /// started: not PID 0/1 nor this process, and its command line or its
    /// environment (`CNILAB_RUN_DIR`, set for every agent and containerd)
    /// names `dir` or a path under it.
    pub fn kill_if_ours(&self, dir: &Path) -> io::Result<bool> {
        if self.pid <= 1 || self.pid == std::process::id() {
            return Ok(false);
        }
        self.kill_if(|| names_dir(self.pid, dir))
    }

    fn kill_if(&self, proof: impl FnOnce() -> bool) -> io::Result<bool> {
        self.signal_if(nix::libc::SIGKILL, proof)
    }

    /// The signal goes through a pidfd opened before `proof` and the start
    /// time are checked, so the process checked is the process signalled.
    fn signal_if(&self, signal: i32, proof: impl FnOnce() -> bool) -> io::Result<bool> {
        let Ok(pid) = i32::try_from(self.pid) else {
            return Ok(false);
        };
        // SAFETY: pidfd_open(2) with a pid and no flags; returns a new fd or -1.
        let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(nix::libc::ESRCH) {
                Ok(false)
            } else {
                Err(e)
            };
        }
        // SAFETY: the fd was just returned to us and is owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // The pidfd was opened before this check: if the start time still
        // matches, the pidfd names the recorded process (a process that
        // replaced it would have started after the pidfd was opened).
        if start_time(self.pid) != Some(self.start) || !proof() {
            return Ok(false);
        }
        // SAFETY: pidfd_send_signal(2) on our pidfd, no siginfo, no flags.
        let rc = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_pidfd_send_signal,
                std::os::fd::AsRawFd::as_raw_fd(&pidfd),
                signal,
                std::ptr::null::<nix::libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            Ok(true)
        } else {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(nix::libc::ESRCH) {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// The environment variable naming the run dir of every process a lab
/// starts (agents, containerd): what [`Identity::kill_if_ours`] looks for.
pub const RUN_DIR_ENV: &str = "CNILAB_RUN_DIR";

/// Whether process `pid`'s command line or environment names `dir` or a
/// path under it (`/run/x` does not name `/run/x-y`).
fn names_dir(pid: u32, dir: &Path) -> bool {
    let exact = dir.as_os_str().as_encoded_bytes();
    if exact.is_empty() {
        return false;
    }
    let mut under = exact.to_vec();
    under.push(b'/');
    let prefix = format!("{RUN_DIR_ENV}=");
    ["cmdline", "environ"].iter().any(|what| {
        std::fs::read(format!("/proc/{pid}/{what}")).is_ok_and(|text| {
            text.split(|b| *b == 0).any(|word| {
                let value = word.strip_prefix(prefix.as_bytes()).unwrap_or(word);
                value.ends_with(exact) || value.windows(under.len()).any(|w| w == under)
            })
        })
    })
}

/// Writes `id` to `path` (`<pid> <start>`), staged aside and renamed into
/// place (`util::write_replacing`, the one way cnilab writes as root).
pub fn write(path: &Path, id: Identity) -> io::Result<()> {
    crate::util::write_replacing(path, format!("{} {}\n", id.pid, id.start).as_bytes())
}

/// Reads a pidfile written by [`write`] (the owner records' format);
/// `None` when absent or malformed.
pub fn read(path: &Path) -> Option<Identity> {
    cnilab_net::netns::owner::read_record(path).map(|(pid, start)| Identity { pid, start })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_recorded_process_is_killed() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let id = Identity::of(child.id()).expect("running");
        assert!(id.alive());
        let wrong = Identity {
            pid: id.pid,
            start: id.start + 1,
        };
        assert!(!wrong.alive());
        assert!(!wrong.kill_if_same().expect("check"), "another start time");
        assert!(child.try_wait().expect("wait").is_none(), "still running");
        assert!(id.kill_if_same().expect("kill"), "the recorded process");
        let status = child.wait().expect("wait");
        assert!(!status.success());
        assert!(!id.alive());
        assert!(
            !id.kill_if_same().expect("gone"),
            "a dead process is not signalled"
        );
    }

    #[test]
    fn a_child_writes_its_own_identity_before_exec() {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("agent.pid");
        let file = prepare(&path).expect("prepare");
        let fd = file.as_raw_fd();
        let mut command = std::process::Command::new("sleep");
        command.arg("30");
        // SAFETY: write_own_identity is async-signal-safe.
        unsafe {
            command.pre_exec(move || write_own_identity(fd));
        }
        let mut child = command.spawn().expect("sleep");
        drop(file);
        let recorded = read(&path);
        let actual = Identity::of(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(recorded, actual);
        assert!(recorded.is_some());
    }

    #[test]
    fn pidfiles_round_trip_and_junk_is_ignored() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("agent.pid");
        let id = Identity { pid: 42, start: 7 };
        write(&path, id).expect("write");
        assert_eq!(read(&path), Some(id));
        std::fs::write(&path, "nonsense").expect("write");
        assert_eq!(read(&path), None);
        assert_eq!(read(dir.path()), None, "a directory is not a pidfile");
    }
}
