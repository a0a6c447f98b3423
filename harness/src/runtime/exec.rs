//! Executing plugin binaries: environment, stdin, timeouts, and collecting
//! what a child process produced.

use super::{CniCommand, Execution, NetworkConfig, Runtime, RuntimeConf, RuntimeError, Timing};
use serde_json::{Map, Value};
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
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
        let mut cmd = Command::new(plugin);
        cmd.env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            )
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own process group, so that a timeout kills helpers (IPAM) too.
            .process_group(0);
        let started = Instant::now();
        let spawned = match &self.host {
            Some(host) => cnilab_net::netns::spawn_in(host, &mut cmd),
            None => cmd.spawn(),
        };
        let child = spawned.map_err(|e| spawn_err(e.to_string()))?;
        let stdin_text = String::from_utf8_lossy(stdin).into_owned();
        let deliberate = kill_after.filter(|k| *k < self.timeout);
        let out = collect_child(
            child,
            started,
            deliberate.unwrap_or(self.timeout),
            |mut pipe| {
                // A plugin may exit without reading stdin: EPIPE is fine.
                let _ = pipe.write_all(stdin);
            },
        )
        .map_err(|e| spawn_err(e.to_string()))?;
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

/// What a child process produced, once it exited or was killed.
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: std::process::ExitStatus,
    /// The process group was SIGKILLed because `limit` passed.
    pub killed: bool,
    /// From `started` to the end of stdout.
    pub duration: Duration,
}

/// Feeds the child's stdin with `feed` on a thread of its own, reads stdout
/// and stderr to the end, and SIGKILLs the child's process group (the child
/// must lead one) if it has not exited `limit` after it started.
pub fn collect_child(
    mut child: std::process::Child,
    started: Instant,
    limit: Duration,
    feed: impl FnOnce(std::process::ChildStdin) + Send,
) -> std::io::Result<Collected> {
    let pid = child.id();
    let stdin = child.stdin.take();
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            if let Some(pipe) = stdin {
                feed(pipe);
            }
        });
        let stderr_reader = scope.spawn(move || {
            let mut buf = Vec::new();
            if let Some(pipe) = err_pipe.as_mut() {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        });
        let stdout_reader = scope.spawn(move || {
            let mut buf = Vec::new();
            if let Some(pipe) = out_pipe.as_mut() {
                let _ = pipe.read_to_end(&mut buf);
            }
            let status = child.wait();
            let _ = tx.send(());
            (buf, status)
        });
        let killed = rx.recv_timeout(limit).is_err();
        if killed {
            // Kill the whole group: the plugin and anything it started.
            if let Ok(pgid) = i32::try_from(pid) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pgid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let panicked = |what: &str| std::io::Error::other(format!("{what} reader panicked"));
        let (stdout, status) = stdout_reader.join().map_err(|_| panicked("stdout"))?;
        let duration = started.elapsed();
        let stderr = stderr_reader.join().map_err(|_| panicked("stderr"))?;
        Ok(Collected {
            stdout,
            stderr,
            status: status.map_err(|e| std::io::Error::new(e.kind(), format!("wait: {e}")))?,
            killed,
            duration,
        })
    })
}
