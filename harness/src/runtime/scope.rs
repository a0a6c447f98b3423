//! What one plugin call may leave behind, and how it is ended: every call
//! runs in a cgroup v2 of its own where the machine allows one (the child
//! joins it before exec, so nothing it starts, `setsid` or not, can leave),
//! and `cgroup.kill` ends all of it. A process running as root can still
//! leave (it writes its pid to another cgroup's `cgroup.procs`), so the
//! call's process group is killed as well, and so is every process that
//! still holds one of the call's output pipes (found through
//! `/proc/<pid>/fd`); where no cgroup can be made, those two are all there
//! is. What escaped all three is reported, never hidden. Call cgroups left by a process that
//! exited mid-call are removed by the next one (empty cgroups only).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// How a call's processes are contained.
pub struct CallScope {
    cgroup: Option<Cgroup>,
}

struct Cgroup {
    dir: PathBuf,
    /// `cgroup.procs`, opened before the fork: the child writes "0" to it.
    procs: File,
}

/// Where this process sits in the cgroup v2 hierarchy, if it is mounted;
/// read once per process (`/proc/self/mountinfo` grows by one line per
/// namespace a lab mounts: read per call, a 1,000-pod lab read it 1,000
/// times at up to 1,000 lines each).
fn own_cgroup_dir() -> Option<PathBuf> {
    static OWN: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    OWN.get_or_init(read_own_cgroup_dir).clone()
}

fn read_own_cgroup_dir() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2"))
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(path.trim_start_matches('/')))
}

impl CallScope {
    /// A fresh cgroup for one call when possible, else the process-group
    /// fallback.
    pub fn new() -> CallScope {
        let cgroup = own_cgroup_dir().and_then(|parent| {
            static SWEPT: std::sync::Once = std::sync::Once::new();
            SWEPT.call_once(|| remove_stale(&parent));
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = parent.join(format!("cnilab-call-{}-{n}", std::process::id()));
            std::fs::create_dir(&dir).ok()?;
            let kill_file = dir.join("cgroup.kill");
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"));
            match procs {
                Ok(procs) if kill_file.exists() => Some(Cgroup { dir, procs }),
                _ => {
                    let _ = std::fs::remove_dir(&dir);
                    None
                }
            }
        });
        CallScope { cgroup }
    }

    /// How the call is contained, for reports.
    pub fn kind(&self) -> &'static str {
        if self.cgroup.is_some() {
            "a cgroup per call"
        } else {
            "the process group and the holders of its pipes (no cgroup v2 here)"
        }
    }

    /// The CPU time (user + system) every process of the call has used,
    /// from its cgroup's `cpu.stat` (`usage_usec`, kept by the scheduler
    /// whether or not the cpu controller is enabled); `None` without a
    /// cgroup. Read once the call ended: it counts what a plugin started
    /// (its IPAM plugin, an `nft`) and nothing else on the machine, so it
    /// holds still on a busy machine where wall-clock latency swings.
    pub fn cpu(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(self.cgroup.as_ref()?.dir.join("cpu.stat")).ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse().ok())
            .map(Duration::from_micros)
    }

    /// The call cgroup's `cgroup.procs`, open until the scope drops: for
    /// [`super::spawn::Launch::into_cgroup`].
    pub fn procs_fd(&self) -> Option<RawFd> {
        self.cgroup.as_ref().map(|c| c.procs.as_raw_fd())
    }

    /// The call cgroup's directory name, as `/proc/<pid>/cgroup` ends.
    #[cfg(test)]
    pub(crate) fn cgroup_name(&self) -> Option<String> {
        let dir = &self.cgroup.as_ref()?.dir;
        Some(dir.file_name()?.to_string_lossy().into_owned())
    }

    /// Makes the child of `cmd` join the call's cgroup before it execs
    /// (a `pre_exec` hook: the standard library then forks).
    /// Must be called before any other `pre_exec` hook that execs itself.
    pub fn attach(&self, cmd: &mut Command) {
        let Some(cgroup) = &self.cgroup else {
            return;
        };
        let fd: RawFd = cgroup.procs.as_raw_fd();
        // SAFETY: write(2) on an fd opened before the fork is
        // async-signal-safe; "0" moves the calling process.
        unsafe {
            cmd.pre_exec(move || {
                if nix::libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Kills everything of the call: the cgroup, the process group `pgid`,
    /// its leader (the plugin this process started, unless `leader_reaped`)
    /// and every process holding one of `pipes` (the read ends this process
    /// has of the call's stdout and stderr). All of them, whatever the
    /// scope: a plugin running as root can move itself, or what it started,
    /// out of its cgroup, and out of its process group with `setsid`.
    pub fn kill(&self, pgid: u32, leader_reaped: bool, pipes: &[RawFd]) {
        if let Some(cgroup) = &self.cgroup {
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .write(true)
                .open(cgroup.dir.join("cgroup.kill"))
            {
                let _ = f.write_all(b"1");
            }
        }
        if let Ok(pgid) = i32::try_from(pgid) {
            let pgid = nix::unistd::Pid::from_raw(pgid);
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            if !leader_reaped {
                let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        for pid in pipe_holders(pipes) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Default for CallScope {
    fn default() -> Self {
        CallScope::new()
    }
}

impl Drop for CallScope {
    fn drop(&mut self) {
        let Some(cgroup) = &self.cgroup else {
            return;
        };
        // Nothing of a finished call may stay: kill what is left, then the
        // (empty) cgroup goes. An rmdir of a cgroup that still has dying
        // members fails with EBUSY for a moment.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(cgroup.dir.join("cgroup.kill"))
            .and_then(|mut f| f.write_all(b"1"));
        let until = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&cgroup.dir).is_err() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Removes the call cgroups of processes that are gone (one that exited
/// with a call under way, e.g. on Ctrl-C). rmdir(2) removes only an empty
/// cgroup, so nothing that still runs loses its cgroup.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("cnilab-call-")
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        let numeric = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
        if numeric && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// Processes with an fd on the same pipe as one of `pipes`, leaving out
/// this process and its own children. A plugin's leftovers are never this
/// process's children (the plugin is; what the plugin starts is its child,
/// and goes to init or a subreaper when the plugin exits), and the plugin
/// itself is killed by pid. Every other child of this process is another
/// call (or a tool it runs) that may be between its fork and its exec: it
/// then holds every descriptor of this process, this call's pipes
/// included, until close-on-exec closes them at the exec. Its parent is the
/// one thing about it that does not change across that exec, so the rule
/// holds wherever the exec lands while `/proc` is read.
fn pipe_holders(pipes: &[RawFd]) -> Vec<i32> {
    let own = std::process::id();
    let inodes: Vec<u64> = pipes
        .iter()
        .filter_map(|fd| std::fs::metadata(format!("/proc/self/fd/{fd}")).ok())
        .map(|m| m.ino())
        .collect();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| u32::try_from(*pid).is_ok_and(|p| p != own))
        .filter(|pid| !child_of(*pid, own))
        .filter(|pid| holds_any(Path::new(&format!("/proc/{pid}/fd")), &inodes))
        .collect()
}

/// Whether `pid` is a child of process `parent` (read from its `stat`; a
/// process that is gone is no one's child).
fn child_of(pid: i32, parent: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| parent_of(&stat))
        == Some(parent)
}

/// The parent pid in a `/proc/<pid>/stat` line.
fn parent_of(stat: &str) -> Option<u32> {
    let field = cnilab_net::netns::owner::stat_field(stat.as_bytes(), 1)?;
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn holds_any(fd_dir: &Path, inodes: &[u64]) -> bool {
    let Ok(fds) = std::fs::read_dir(fd_dir) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let text = target.to_string_lossy();
            text.strip_prefix("pipe:[")
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| inodes.contains(&n))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::{parent_of, pipe_holders, remove_stale};
    use std::os::fd::AsRawFd;

    #[test]
    fn the_parent_is_read_past_a_command_name_with_parentheses() {
        assert_eq!(parent_of("42 (a) b) (c) S 7 42 42 0"), Some(7));
        assert_eq!(parent_of("42 (plain) R 1 42 42 0"), Some(1));
        assert_eq!(parent_of("garbage"), None);
    }

    /// A process the plugin left (reparented away from this process) that
    /// holds a call's pipe is a holder; a child of this process holding it
    /// is another call, caught between its fork and its exec, and is spared
    /// before and after that exec alike.
    #[test]
    fn only_processes_that_are_not_this_ones_children_are_pipe_holders() {
        let (read, write) = nix::unistd::pipe().expect("pipe");
        // A forked child that does not exec: it holds both ends, like a
        // sibling call caught in the window.
        // SAFETY: the child only sleeps and exits (async-signal-safe calls).
        let forked = match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => unsafe {
                nix::libc::sleep(30);
                nix::libc::_exit(0)
            },
            nix::unistd::ForkResult::Parent { child } => child,
        };
        // A child that exec'd a program with the pipe as its stdout: still
        // this process's child, so another call's plugin, not a leftover.
        let mut sibling = std::process::Command::new("sleep")
            .arg("30")
            .stdout(std::process::Stdio::from(write.try_clone().expect("dup")))
            .spawn()
            .expect("spawn sleep");
        // A leftover: a grandchild whose parent exits at once, so it is no
        // longer this process's child; the parent names it on a pipe.
        let (named, name) = nix::unistd::pipe().expect("pipe");
        // SAFETY: both children make only async-signal-safe calls.
        let middle = match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => unsafe {
                let grandchild = nix::libc::fork();
                if grandchild == 0 {
                    nix::libc::sleep(30);
                    nix::libc::_exit(0)
                }
                let bytes = grandchild.to_ne_bytes();
                nix::libc::write(name.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                nix::libc::_exit(0)
            },
            nix::unistd::ForkResult::Parent { child } => child,
        };
        drop(name);
        let _ = nix::sys::wait::waitpid(middle, None);
        let mut bytes = [0u8; 4];
        nix::unistd::read(&named, &mut bytes).expect("the grandchild's pid");
        let leftover = i32::from_ne_bytes(bytes);
        assert!(leftover > 0, "the middle child could not fork");
        let holders = pipe_holders(&[read.as_raw_fd()]);
        for pid in [forked.as_raw(), leftover] {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = nix::sys::wait::waitpid(forked, None);
        let _ = sibling.kill();
        let _ = sibling.wait();
        let sibling_pid = i32::try_from(sibling.id()).expect("pid");
        assert!(holders.contains(&leftover), "{holders:?}");
        assert!(!holders.contains(&forked.as_raw()), "{holders:?}");
        assert!(!holders.contains(&sibling_pid), "{holders:?}");
    }

    #[test]
    fn stale_call_cgroups_of_gone_processes_are_removed_only() {
        let parent = tempfile::tempdir().expect("tmp");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("wait");
        let stale = parent.path().join(format!("cnilab-call-{dead}-0"));
        let live = parent
            .path()
            .join(format!("cnilab-call-{}-0", std::process::id()));
        let other = parent.path().join("k8s.io");
        for d in [&stale, &live, &other] {
            std::fs::create_dir(d).expect("mkdir");
        }
        remove_stale(parent.path());
        assert!(!stale.exists());
        assert!(live.exists() && other.exists());
    }
}
