//! Starting a plugin into its call's cgroup without copying the harness.
//!
//! A runtime executes a plugin per call, and the harness does it thousands
//! of times in a lab or a conformance run. The standard library's `spawn`
//! uses `posix_spawn` (a vfork: the child borrows the parent's memory until
//! it execs) only when the command has no `pre_exec` hook; joining the
//! call's cgroup before exec needs one, so every call was a full `fork` of
//! a large multi-threaded process: its page tables copied, its memory
//! write-protected and faulted back, the copy torn down at exec. With 100
//! MB resident that cost 8 ms of CPU a call against 0.9 ms for a vfork.
//!
//! [`Launch::spawn`] does what `posix_spawn` does, plus the cgroup: a
//! `clone(CLONE_VM | CLONE_VFORK)` child on a stack of its own that makes
//! only raw system calls (no allocation, no lock, no panic) — default
//! signal handlers, its own process group, "0" into the call's
//! `cgroup.procs`, its stdio, its directory, an empty signal mask — and
//! execs. The parent's thread waits until that exec (or the child's exit);
//! a step that failed is reported with its errno through memory both share.

use nix::libc;
use std::ffi::{c_void, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

/// What the child's fd 0 is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// A pipe whose write end [`Spawned::stdin`] holds.
    Piped,
    /// `/dev/null`.
    Null,
    /// No fd 0 at all.
    Closed,
}

/// One program to start: its path (also `argv[0]`), its arguments, its
/// exact environment block and its stdin; stdout and stderr are always
/// pipes.
#[derive(Debug)]
pub struct Launch {
    program: CString,
    args: Vec<CString>,
    env: Vec<CString>,
    input: Input,
    cwd: Option<CString>,
    cgroup_procs: Option<RawFd>,
}

/// A started child: its pid and this side of its pipes.
#[derive(Debug)]
pub struct Spawned {
    pid: libc::pid_t,
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    status: Option<ExitStatus>,
}

fn c_string(bytes: &[u8], what: &str) -> io::Result<CString> {
    CString::new(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} holds a NUL byte at {}", e.nul_position()),
        )
    })
}

fn c_strings<I, B>(items: I, what: &str) -> io::Result<Vec<CString>>
where
    I: IntoIterator<Item = B>,
    B: AsRef<[u8]>,
{
    items
        .into_iter()
        .map(|i| c_string(i.as_ref(), what))
        .collect()
}

impl Launch {
    pub fn new(program: &Path) -> io::Result<Launch> {
        Ok(Launch {
            program: c_string(program.as_os_str().as_bytes(), "the program's path")?,
            args: Vec::new(),
            env: Vec::new(),
            input: Input::Piped,
            cwd: None,
            cgroup_procs: None,
        })
    }

    /// The arguments after `argv[0]`.
    pub fn args<I, B>(mut self, args: I) -> io::Result<Launch>
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        self.args = c_strings(args, "an argument")?;
        Ok(self)
    }

    /// The environment block, entry by entry (`KEY=value`), duplicates and
    /// all: exactly what the child's `envp` holds.
    pub fn env_block<I, B>(mut self, entries: I) -> io::Result<Launch>
    where
        I: IntoIterator<Item = B>,
        B: AsRef<[u8]>,
    {
        self.env = c_strings(entries, "an environment entry")?;
        Ok(self)
    }

    pub fn input(mut self, input: Input) -> Launch {
        self.input = input;
        self
    }

    pub fn current_dir(mut self, dir: &Path) -> io::Result<Launch> {
        self.cwd = Some(c_string(dir.as_os_str().as_bytes(), "the directory")?);
        Ok(self)
    }

    /// The child writes "0" to this `cgroup.procs` before it execs (see
    /// [`super::scope::CallScope::procs_fd`]); the fd must stay open until
    /// [`Launch::spawn`] returns.
    pub fn into_cgroup(mut self, procs: Option<RawFd>) -> Launch {
        self.cgroup_procs = procs;
        self
    }

    /// [`Launch::spawn`] inside the network namespace `ns` (or the calling
    /// thread's, with `None`), from a short-lived thread that entered it.
    pub fn spawn_in(&self, ns: Option<&File>) -> io::Result<Spawned> {
        match ns {
            Some(ns) => cnilab_net::netns::run_in(ns, || self.spawn())?,
            None => self.spawn(),
        }
    }

    /// Starts the child in the calling thread's network namespace and
    /// returns once it exec'd; an error names the step that failed.
    pub fn spawn(&self) -> io::Result<Spawned> {
        let (out_read, out_write) = pipe()?;
        let (err_read, err_write) = pipe()?;
        let (stdin_child, stdin_ours) = match self.input {
            Input::Piped => {
                let (read, write) = pipe()?;
                (Some(read), Some(write))
            }
            Input::Null => (Some(above_stdio(File::open("/dev/null")?.into())?), None),
            Input::Closed => (None, None),
        };
        let argv: Vec<*const libc::c_char> = std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let mut envp: Vec<*const libc::c_char> = self.env.iter().map(|e| e.as_ptr()).collect();
        envp.push(std::ptr::null());
        let step = AtomicI32::new(0);
        let errno = AtomicI32::new(0);
        // SAFETY: sigset_t is plain data; sigfillset/sigemptyset fill it.
        let (all, none, mut before) = unsafe {
            let mut sets: [libc::sigset_t; 3] = std::mem::zeroed();
            libc::sigfillset(&mut sets[0]);
            libc::sigemptyset(&mut sets[1]);
            (sets[0], sets[1], sets[2])
        };
        let plan = Plan {
            program: self.program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            stdin: stdin_child.as_ref().map_or(-1, AsRawFd::as_raw_fd),
            stdout: out_write.as_raw_fd(),
            stderr: err_write.as_raw_fd(),
            cwd: self.cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            cgroup_procs: self.cgroup_procs.unwrap_or(-1),
            empty_mask: &none,
            step: &step,
            errno: &errno,
        };
        let mut stack = vec![0u8; CHILD_STACK];
        // The stack grows down: clone takes its top, 16-byte aligned.
        let top = {
            let end = stack.as_mut_ptr_range().end as usize;
            (end & !15) as *mut c_void
        };
        // SAFETY: every signal is blocked around the clone, so no handler of
        // this process runs on the child's borrowed memory before the child
        // defaulted them; `plan`, `argv`, `envp`, the CStrings and `stack`
        // outlive the child's use of them, which ends at its exec or exit
        // (CLONE_VFORK: clone returns only then).
        let pid = unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
            let pid = libc::clone(
                child_main,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                &plan as *const Plan as *mut c_void,
            );
            let clone_error = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
            if pid < 0 {
                return Err(io::Error::new(
                    clone_error.kind(),
                    format!("clone: {clone_error}"),
                ));
            }
            pid
        };
        drop((stdin_child, out_write, err_write, stack));
        let failed = step.load(Ordering::SeqCst);
        if failed != 0 {
            let mut child = Spawned::bare(pid);
            let _ = child.wait();
            let cause = io::Error::from_raw_os_error(errno.load(Ordering::SeqCst));
            return Err(io::Error::new(
                cause.kind(),
                format!("{}: {cause}", step_name(failed)),
            ));
        }
        Ok(Spawned {
            pid,
            stdin: stdin_ours.map(File::from),
            stdout: Some(File::from(out_read)),
            stderr: Some(File::from(err_read)),
            status: None,
        })
    }
}

/// The child's stack: its steps are a few system calls deep.
const CHILD_STACK: usize = 64 * 1024;

const STEP_PGID: i32 = 1;
const STEP_CGROUP: i32 = 2;
const STEP_STDIO: i32 = 3;
const STEP_CWD: i32 = 4;
const STEP_EXEC: i32 = 5;

fn step_name(step: i32) -> &'static str {
    match step {
        STEP_PGID => "setpgid",
        STEP_CGROUP => "joining the call's cgroup",
        STEP_STDIO => "setting up stdio",
        STEP_CWD => "chdir",
        _ => "exec",
    }
}

/// What the child reads: raw pointers into the parent's memory, valid
/// until the child execs or exits.
struct Plan {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    cwd: *const libc::c_char,
    cgroup_procs: RawFd,
    empty_mask: *const libc::sigset_t,
    step: *const AtomicI32,
    errno: *const AtomicI32,
}

/// The child: only async-signal-safe system calls, no allocation, nothing
/// that can panic. It runs on the parent's memory and thread-local storage,
/// so the calls that glibc makes cancellation points (`write`, `close`)
/// go through `syscall(2)`, which touches only `errno`.
extern "C" fn child_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Plan`, alive until this child execs or
    // exits (CLONE_VFORK holds the parent's thread until then); every
    // pointer in it is valid for the same span.
    unsafe {
        let plan = &*(arg as *const Plan);
        let fail = |step: i32| -> libc::c_int {
            (*plan.errno).store(*libc::__errno_location(), Ordering::SeqCst);
            (*plan.step).store(step, Ordering::SeqCst);
            libc::_exit(127)
        };
        // A handler of the parent's would run on the parent's memory:
        // default them. The Rust runtime ignores SIGPIPE, which exec would
        // keep: default it too, as the standard library's spawn does; other
        // ignored signals stay ignored, as there.
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..NSIG {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || signal == libc::SIGPIPE)
            {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        if libc::syscall(libc::SYS_setpgid, 0, 0) != 0 {
            return fail(STEP_PGID);
        }
        if plan.cgroup_procs >= 0
            && libc::syscall(libc::SYS_write, plan.cgroup_procs, b"0".as_ptr(), 1) != 1
        {
            return fail(STEP_CGROUP);
        }
        let stdin_ok = if plan.stdin >= 0 {
            move_to(plan.stdin, 0)
        } else {
            libc::syscall(libc::SYS_close, 0);
            true
        };
        if !(stdin_ok && move_to(plan.stdout, 1) && move_to(plan.stderr, 2)) {
            return fail(STEP_STDIO);
        }
        if !plan.cwd.is_null() && libc::syscall(libc::SYS_chdir, plan.cwd) != 0 {
            return fail(STEP_CWD);
        }
        libc::sigprocmask(libc::SIG_SETMASK, plan.empty_mask, std::ptr::null_mut());
        libc::execve(plan.program, plan.argv, plan.envp);
        fail(STEP_EXEC)
    }
}

/// Signals 1 to 64 (the kernel's `_NSIG` is 65).
const NSIG: libc::c_int = 65;

/// Makes `fd` the child's `target` (without close-on-exec). `fd` is never
/// below 3 (see [`above_stdio`]), so no earlier move overwrote it.
///
/// # Safety
/// For the child only: dup2 on fds it inherited.
unsafe fn move_to(fd: RawFd, target: RawFd) -> bool {
    libc::dup2(fd, target) == target
}

/// A pipe, both ends close-on-exec and above the stdio fds.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((above_stdio(read)?, above_stdio(write)?))
}

/// `fd`, or a close-on-exec copy of it at 3 or above when it is one of 0-2
/// (a harness started with a closed stdio): the child's dup2 onto 0-2 must
/// not overwrite a fd it has yet to move.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an open fd; the new fd is ours.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `copy` was just returned by fcntl and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

impl Spawned {
    fn bare(pid: libc::pid_t) -> Spawned {
        Spawned {
            pid,
            stdin: None,
            stdout: None,
            stderr: None,
            status: None,
        }
    }

    pub fn id(&self) -> u32 {
        self.pid.unsigned_abs()
    }

    /// The exit status, if the child exited (collected once).
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    /// Waits for the child's exit.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.reap(0)? {
                return Ok(status);
            }
        }
    }

    fn reap(&mut self, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let mut raw = 0;
        loop {
            // SAFETY: waitpid on our own child, with a valid status pointer.
            let got = unsafe { libc::waitpid(self.pid, &mut raw, flags) };
            if got == self.pid {
                let status = ExitStatus::from_raw(raw);
                self.status = Some(status);
                return Ok(Some(status));
            }
            if got == 0 {
                return Ok(None);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// A child the standard library started (e.g. with a `pre_exec` hook):
/// its pipes, and its pid to wait on (dropping a `Child` neither waits nor
/// kills).
impl From<std::process::Child> for Spawned {
    fn from(mut child: std::process::Child) -> Spawned {
        Spawned {
            // The kernel's pid_t, which std hands out as u32: never -1,
            // which waitpid would take for "any child".
            pid: child.id().cast_signed(),
            stdin: child.stdin.take().map(|p| File::from(OwnedFd::from(p))),
            stdout: child.stdout.take().map(|p| File::from(OwnedFd::from(p))),
            stderr: child.stderr.take().map(|p| File::from(OwnedFd::from(p))),
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// `/bin/sh` with `args`, each call site's `-c` script a literal (a
    /// script file written here could meet ETXTBSY: a concurrent test's
    /// child may hold it open for writing until exec).
    fn sh(args: [&str; 2]) -> Launch {
        Launch::new(Path::new("/bin/sh"))
            .and_then(|l| l.args(args))
            .and_then(|l| l.env_block(["PATH=/usr/bin:/bin"]))
            .expect("launch")
    }

    /// stdout, stderr and the exit status of a child whose stdin is done.
    fn output(mut child: Spawned) -> (String, String, ExitStatus) {
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut p) = child.stdout.take() {
            p.read_to_string(&mut out).expect("stdout");
        }
        if let Some(mut p) = child.stderr.take() {
            p.read_to_string(&mut err).expect("stderr");
        }
        let status = child.wait().expect("wait");
        (out, err, status)
    }

    #[test]
    fn the_child_gets_exactly_its_env_block_its_stdin_and_its_own_group() {
        let mut child = sh([
            "-c",
            "tr '\\0' '\\n' </proc/$$/environ | grep '^A=' | tr '\\n' ' '\n\
             read line\necho \"got $line\"\n\
             cut -d' ' -f5 /proc/$$/stat >&2\necho $$ >&2",
        ])
        .env_block(["A=1", "PATH=/usr/bin:/bin", "A=2"])
        .expect("env")
        .spawn()
        .expect("spawn");
        let mut stdin = child.stdin.take().expect("a piped stdin");
        stdin.write_all(b"hello\n").expect("feed");
        drop(stdin);
        let (out, err, status) = output(child);
        assert!(status.success(), "{out} {err}");
        assert_eq!(out.trim_end(), "A=1 A=2 got hello", "{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert_eq!(lines[0], lines[1], "the child leads its own process group");
    }

    #[test]
    fn null_or_closed_stdin_the_directory_and_default_signals_reach_the_child() {
        let dir = tempfile::tempdir().expect("tmp");
        // The masks are read by the shell's last command exec'd in its
        // place: dash blocks every signal for a moment around each fork.
        for (input, fd0) in [(Input::Null, "/dev/null"), (Input::Closed, "closed")] {
            let child = sh([
                "-c",
                "readlink /proc/$$/fd/0 || echo closed\npwd\n\
                 exec grep -E '^Sig(Ign|Blk)' /proc/self/status",
            ])
            .input(input)
            .current_dir(dir.path())
            .expect("dir")
            .spawn()
            .expect("spawn");
            assert!(child.stdin.is_none());
            let (out, err, status) = output(child);
            assert!(status.success(), "{out} {err}");
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.first(), Some(&fd0), "{out}");
            let here = dir.path().canonicalize().expect("canonical");
            assert_eq!(lines.get(1).map(Path::new), Some(here.as_path()), "{out}");
            // This test binary ignores SIGPIPE (the Rust runtime does); the
            // child must not inherit that, nor a blocked signal.
            for mask in ["SigBlk", "SigIgn"] {
                let value = lines
                    .iter()
                    .find_map(|l| l.strip_prefix(mask))
                    .map(|v| v.trim_start_matches(':').trim())
                    .unwrap_or_else(|| panic!("{mask} in {out}"));
                let bits = u64::from_str_radix(value, 16).expect("hex mask");
                assert_eq!(bits & (1 << (libc::SIGPIPE - 1)), 0, "{mask}: {out}");
                if mask == "SigBlk" {
                    assert_eq!(bits, 0, "no signal blocked: {out}");
                }
            }
        }
    }

    #[test]
    fn a_failed_step_is_named() {
        let err = Launch::new(Path::new("/nonexistent/plugin"))
            .expect("path")
            .spawn()
            .expect_err("no such program");
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        assert!(err.to_string().starts_with("exec: "), "{err}");
        let bad = sh(["-c", "true"])
            .current_dir(Path::new("/nonexistent/dir"))
            .expect("dir")
            .spawn()
            .expect_err("no such directory");
        assert!(bad.to_string().starts_with("chdir: "), "{bad}");
        let nul = sh(["-c", "true"])
            .env_block(["A=\0"])
            .expect_err("a NUL byte");
        assert_eq!(nul.kind(), io::ErrorKind::InvalidInput);
    }

    /// Root (cgroup v2): the child is in the call's cgroup before it execs,
    /// so what it starts is too.
    #[test]
    fn root_the_child_joins_the_calls_cgroup_before_exec() {
        let scope = super::super::scope::CallScope::new();
        let Some(procs) = scope.procs_fd() else {
            panic!("this test needs root and a cgroup v2 hierarchy: it checks that a call's child joins its cgroup");
        };
        let child = sh([
            "-c",
            "grep '^0::' /proc/$$/cgroup; sh -c 'grep \"^0::\" /proc/$$/cgroup'",
        ])
        .input(Input::Null)
        .into_cgroup(Some(procs))
        .spawn()
        .expect("spawn");
        let (out, err, status) = output(child);
        assert!(status.success(), "{out} {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        let name = scope.cgroup_name().expect("a cgroup");
        for line in lines {
            assert!(
                line.ends_with(&format!("/{name}")),
                "{line} is not in {name}"
            );
        }
    }
}
