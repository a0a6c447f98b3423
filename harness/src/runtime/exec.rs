//! Executing plugin binaries: environment, stdin, timeouts, and collecting
//! what a child process produced.

use super::{CniCommand, Execution, NetworkConfig, Runtime, RuntimeConf, RuntimeError, Timing};
use serde_json::{Map, Value};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

impl Runtime {
    /// Runs `plugin` with exactly `env` (plus `PATH`) and `stdin`. Nothing is
    /// checked or parsed: for conformance checks that send bad input.
    pub fn exec_raw(
        &self,
        plugin: &Path,
        env: &[(String, String)],
        stdin: &[u8],
    ) -> Result<Execution, RuntimeError> {
        self.exec_raw_killed_after(plugin, env, stdin, None)
    }

    /// [`Runtime::exec_raw`], but the plugin's process group is SIGKILLed
    /// after `kill_after` (when shorter than the timeout), the way a runtime
    /// that dies mid-operation leaves it. Such a kill is not a timeout: the
    /// execution reports `signal: Some(9)` and `timed_out: false`, unless
    /// the plugin exited first.
    pub fn exec_raw_killed_after(
        &self,
        plugin: &Path,
        env: &[(String, String)],
        stdin: &[u8],
        kill_after: Option<Duration>,
    ) -> Result<Execution, RuntimeError> {
        let spawn_err = |reason: String| RuntimeError::Spawn {
            path: plugin.to_path_buf(),
            reason,
        };
        let scope = super::scope::CallScope::new();
        let launch = super::spawn::Launch::new(plugin)
            .and_then(|l| l.env_block(env_block(env)))
            .map_err(|e| spawn_err(e.to_string()))?
            .into_cgroup(scope.procs_fd());
        let started = Instant::now();
        let child = launch
            .spawn_in(self.host.as_deref())
            .map_err(|e| spawn_err(e.to_string()))?;
        let stdin_text = String::from_utf8_lossy(stdin).into_owned();
        let deliberate = kill_after.filter(|k| *k < self.timeout);
        let body = stdin.to_vec();
        let out = collect_child(
            child,
            started,
            deliberate.unwrap_or(self.timeout),
            &scope,
            move |mut pipe| {
                // A plugin may exit without reading stdin: EPIPE is fine.
                let _ = pipe.write_all(&body);
            },
        )
        .map_err(|e| spawn_err(e.to_string()))?;
        let cut = out.cut();
        let exec = Execution {
            plugin: plugin.to_path_buf(),
            env: env.to_vec(),
            stdin: stdin_text,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            exit_code: out.status.code(),
            signal: out.status.signal(),
            timed_out: out.killed && deliberate.is_none(),
            duration: out.duration,
            cut,
            leftover: out.leftover,
            cpu: self.cpu_accounting.then(|| scope.cpu()).flatten(),
        };
        self.record(&exec);
        Ok(exec)
    }

    pub(super) fn record(&self, exec: &Execution) {
        if let Ok(mut t) = self.timings.lock() {
            t.push(Timing {
                command: exec.command().unwrap_or("?").to_string(),
                duration: exec.duration,
                success: exec.success(),
            });
        }
    }

    /// The `CNI_*` environment libcni sends for `command`.
    pub fn cni_env(&self, command: CniCommand, rt: Option<&RuntimeConf>) -> Vec<(String, String)> {
        let mut env = vec![("CNI_COMMAND".to_string(), command.as_str().to_string())];
        if let Some(rt) = rt {
            env.push(("CNI_CONTAINERID".into(), rt.container_id.clone()));
            if let Some(netns) = &rt.netns {
                env.push(("CNI_NETNS".into(), netns.to_string_lossy().into_owned()));
            }
            env.push(("CNI_IFNAME".into(), rt.ifname.clone()));
            env.push(("CNI_ARGS".into(), rt.cni_args()));
        }
        env.push(("CNI_PATH".into(), self.cni_path()));
        env
    }

    /// Runs one plugin of the chain and classifies the outcome: success with
    /// stdout, a CNI error, a crash, or a timeout. With `kill_at`, the plugin
    /// is SIGKILLed at that moment (see [`Runtime::add_killed_after`]).
    pub(super) fn exec_plugin(
        &self,
        net: &NetworkConfig,
        index: usize,
        command: CniCommand,
        rt: Option<&RuntimeConf>,
        stdin: &Map<String, Value>,
        kill_at: Option<Instant>,
    ) -> Result<Execution, RuntimeError> {
        let plugin = self.find_plugin(net.plugin_type(index))?;
        let env = self.cni_env(command, rt);
        let body = serde_json::to_vec(stdin).map_err(|e| RuntimeError::BadConfig {
            path: net.source.clone(),
            reason: e.to_string(),
        })?;
        let kill_after = kill_at.map(|at| at.saturating_duration_since(Instant::now()));
        let exec = self.exec_raw_killed_after(&plugin, &env, &body, kill_after)?;
        if exec.timed_out {
            return Err(RuntimeError::Timeout(Box::new(exec)));
        }
        if let Some(cut) = &exec.cut {
            return Err(RuntimeError::Defect {
                reason: format!("unbounded output: {cut}"),
                exec: Box::new(exec),
            });
        }
        if exec.success() {
            return Ok(exec);
        }
        match exec.error_body() {
            Some(error) => Err(RuntimeError::Plugin {
                error,
                exec: Box::new(exec),
            }),
            None => Err(RuntimeError::Crashed(Box::new(exec))),
        }
    }
}

/// The environment a plugin call gets: this process's `PATH` (or a
/// default), then `env`; a later entry replaces an earlier one of the same
/// name, in its place.
fn env_block(env: &[(String, String)]) -> Vec<String> {
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.into());
    let mut entries: Vec<(&str, &str)> = vec![("PATH", &path)];
    for (key, value) in env {
        match entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => entries.push((key, value)),
        }
    }
    entries
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// The `PATH` a plugin gets when the harness has none to pass on.
pub const DEFAULT_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// How much of each output stream is kept. CNI results and errors are a few
/// KiB; what is beyond this is read and dropped, and the execution says so.
pub const KEEP_BYTES: usize = 1 << 20;

/// After the deadline and the kill, how long the rest of the output may
/// take to arrive before the pipes are given up.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// What a child process produced, once it exited or was killed.
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// All bytes written to stdout and stderr, kept or not.
    pub stdout_total: u64,
    pub stderr_total: u64,
    pub status: std::process::ExitStatus,
    /// The call was killed because `limit` passed before it ended (exit and
    /// end of both outputs).
    pub killed: bool,
    /// Processes outside the plugin that held its output open: what was done.
    pub leftover: Option<String>,
    /// From `started` to the end of stdout.
    pub duration: Duration,
}

impl Collected {
    /// What was cut from the output, if anything.
    pub fn cut(&self) -> Option<String> {
        let cut = |what: &str, total: u64, kept: usize| {
            (total > kept as u64).then(|| {
                format!("{what} was {total} bytes, only the first {kept} were kept (output cut)")
            })
        };
        let parts: Vec<String> = [
            cut("stdout", self.stdout_total, self.stdout.len()),
            cut("stderr", self.stderr_total, self.stderr.len()),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// One output pipe being drained: at most [`KEEP_BYTES`] kept.
struct Drain {
    pipe: Option<std::fs::File>,
    kept: Vec<u8>,
    total: u64,
}

impl Drain {
    fn new(pipe: Option<impl Into<std::os::fd::OwnedFd>>) -> Drain {
        Drain {
            pipe: pipe.map(|p| std::fs::File::from(p.into())),
            kept: Vec::new(),
            total: 0,
        }
    }

    /// Reads what is there; closes the pipe at its end.
    fn read_some(&mut self) {
        let Some(pipe) = self.pipe.as_mut() else {
            return;
        };
        let mut buf = [0u8; 64 * 1024];
        match pipe.read(&mut buf) {
            Ok(0) => self.pipe = None,
            Ok(n) => {
                self.total += n as u64;
                let room = KEEP_BYTES.saturating_sub(self.kept.len());
                self.kept.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => self.pipe = None,
        }
    }
}

/// Reads both pipes until both end or `until` passes; true when both ended.
fn drain_until(out: &mut Drain, err: &mut Drain, until: Instant) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    loop {
        if out.pipe.is_none() && err.pipe.is_none() {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let ms = u16::try_from(left.as_millis().clamp(1, 10_000)).unwrap_or(10_000);
        let (ready_out, ready_err) = {
            let mut fds: Vec<PollFd> = [&out.pipe, &err.pipe]
                .into_iter()
                .flatten()
                .map(|p| PollFd::new(p.as_fd(), PollFlags::POLLIN))
                .collect();
            if poll(&mut fds, PollTimeout::from(ms)).is_err() {
                continue;
            }
            let ready = |i: usize| {
                fds.get(i)
                    .and_then(PollFd::revents)
                    .is_some_and(|r| !r.is_empty())
            };
            match (out.pipe.is_some(), err.pipe.is_some()) {
                (true, true) => (ready(0), ready(1)),
                (true, false) => (ready(0), false),
                _ => (false, ready(0)),
            }
        };
        if ready_out {
            out.read_some();
        }
        if ready_err {
            err.read_some();
        }
    }
}

/// Waits for the child's exit until `until`; `None` when it still runs.
/// Called once both outputs ended, which a plugin's exit does a moment
/// before its exit status can be collected: the first polls come quickly
/// (from 20 µs, doubling up to 2 ms), so that moment is not measured as a
/// whole 2 ms sleep in every call's latency.
fn wait_until(
    child: &mut super::spawn::Spawned,
    until: Instant,
) -> Option<std::io::Result<std::process::ExitStatus>> {
    let mut pause = Duration::from_micros(20);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(Ok(status)),
            Ok(None) if Instant::now() >= until => return None,
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(2));
            }
            Err(e) => return Some(Err(e)),
        }
    }
}

/// The exit status of a child just SIGKILLed, waited for [`AFTER_KILL`] at
/// most: a child that is still there then (stuck in the kernel) is reaped
/// by a thread of its own, the call reports it in `leftover` and ends as
/// killed, and a timeout holds whatever the child does.
fn reap_killed(
    mut child: super::spawn::Spawned,
    leftover: &mut Option<String>,
) -> std::io::Result<std::process::ExitStatus> {
    if let Some(status) = wait_until(&mut child, Instant::now() + AFTER_KILL) {
        return status;
    }
    *leftover = Some(format!(
        "the plugin (pid {}) had not exited {} s after SIGKILL: the call was given up",
        child.id(),
        AFTER_KILL.as_secs()
    ));
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    Ok(std::process::ExitStatus::from_raw(nix::libc::SIGKILL))
}

/// Feeds the child's stdin with `feed` on a thread of its own, reads stdout
/// and stderr (keeping at most [`KEEP_BYTES`] of each) until they end, and
/// waits for the child. If the whole call (exit and the end of both
/// outputs) is not over `limit` after `started`, everything of the call is
/// killed through `scope` (the child must lead a process group); a process
/// that then still holds an output pipe is given up on after a short grace
/// and named in `leftover`.
pub fn collect_child(
    mut child: super::spawn::Spawned,
    started: Instant,
    limit: Duration,
    scope: &super::scope::CallScope,
    feed: impl FnOnce(std::fs::File) + Send + 'static,
) -> std::io::Result<Collected> {
    use std::os::fd::AsRawFd;
    let pid = child.id();
    if let Some(pipe) = child.stdin.take() {
        // Not joined: a feeder blocked on a pipe held by an escaped process
        // must not hold up the report.
        std::thread::spawn(move || feed(pipe));
    }
    let mut out = Drain::new(child.stdout.take());
    let mut err = Drain::new(child.stderr.take());
    let deadline = started + limit;
    let ended = drain_until(&mut out, &mut err, deadline);
    let stdout_end = started.elapsed();
    let status = if ended {
        wait_until(&mut child, deadline)
    } else {
        None
    };
    let killed = status.is_none();
    let mut leftover = None;
    if killed {
        let pipes: Vec<i32> = [&out.pipe, &err.pipe]
            .into_iter()
            .flatten()
            .map(|p| p.as_raw_fd())
            .collect();
        let exited_already = matches!(child.try_wait(), Ok(Some(_)));
        scope.kill(pid, exited_already, &pipes);
        if !pipes.is_empty() && exited_already {
            leftover = Some(format!(
                "the plugin exited but a process it left held its output open past the deadline; killed through {}",
                scope.kind()
            ));
        }
        if !drain_until(&mut out, &mut err, Instant::now() + AFTER_KILL) {
            leftover = Some(format!(
                "a process the plugin left still held its output {} s after the kill through {}: it could not be ended, the output was given up",
                AFTER_KILL.as_secs(),
                scope.kind()
            ));
        }
    }
    let status = match status {
        Some(status) => status,
        None => reap_killed(child, &mut leftover),
    };
    let duration = if killed {
        started.elapsed()
    } else {
        stdout_end
    };
    Ok(Collected {
        stdout: out.kept,
        stderr: err.kept,
        stdout_total: out.total,
        stderr_total: err.total,
        status: status.map_err(|e| std::io::Error::new(e.kind(), format!("wait: {e}")))?,
        killed,
        leftover,
        duration,
    })
}
