//! The runtime floor: drives any CNI plugin like a container runtime.
//!
//! Where things happen: `config` loads and edits network configs, `exec`
//! runs plugin binaries (bounded output, one deadline for the whole call),
//! [`scope`] contains and kills what a call leaves (a cgroup per call, else
//! the process group and the holders of its pipes), [`spawn`] starts a
//! plugin into that cgroup without copying the harness (a vfork-style
//! clone), `cache` keeps ADD results, `error` says what
//! went wrong, [`session`] is the setup conform, soak and bench share; this
//! file holds [`Runtime`] and its operations (ADD, CHECK, DEL, STATUS, GC).
//!
//! `Runtime`: plays the container runtime the way libcni does. It loads a
//! network config, executes plugin binaries with the `CNI_*` environment and
//! the config on stdin, chains `prevResult`, caches the final ADD result for
//! CHECK and DEL, and records every execution (for evidence and timing).
//!
//! Plugins run inside a chosen "host" namespace, so their bridges and host
//! veths never appear in the real host namespace.

mod cache;
mod config;
mod error;
mod exec;
pub mod scope;
pub mod session;
pub mod spawn;

use cache::CacheKey;
use cnilab_net::spec::{self, CniResult, ErrorBody, Version, VersionInfo};
pub use config::{NetworkConfig, RuntimeConf};
pub use error::RuntimeError;
pub use exec::{collect_child, Collected, DEFAULT_PATH, KEEP_BYTES};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The CNI commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum CniCommand {
    Add,
    Check,
    Del,
    Version,
    Status,
    Gc,
}

impl CniCommand {
    pub fn as_str(self) -> &'static str {
        match self {
            CniCommand::Add => "ADD",
            CniCommand::Check => "CHECK",
            CniCommand::Del => "DEL",
            CniCommand::Version => "VERSION",
            CniCommand::Status => "STATUS",
            CniCommand::Gc => "GC",
        }
    }
}

impl fmt::Display for CniCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One plugin process: what was sent and what came back.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Execution {
    pub plugin: PathBuf,
    /// The complete environment the plugin saw (besides `PATH`); JSON:
    /// `[{"name": "CNI_COMMAND", "value": "ADD"}, …]`.
    #[serde(serialize_with = "env_objects")]
    pub env: Vec<(String, String)>,
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    /// Exit code; `None` when killed by a signal.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    #[serde(serialize_with = "serialize_duration")]
    pub duration: Duration,
    /// What was cut from stdout/stderr (more than [`exec::KEEP_BYTES`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut: Option<String>,
    /// Processes the plugin left holding its output past the deadline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leftover: Option<String>,
    /// CPU time of the call's processes (its cgroup's; `None` without one
    /// or without [`Runtime::with_cpu_accounting`]): what `cnilab bench`
    /// compares, not part of reports.
    #[serde(skip)]
    pub cpu: Option<Duration>,
}

fn env_objects<S: serde::Serializer>(v: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    crate::report::pairs_as_objects(v, "name", "value", s)
}

fn serialize_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

impl Execution {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }

    /// `CNI_COMMAND`, when set.
    pub fn command(&self) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == "CNI_COMMAND")
            .map(|(_, v)| v.as_str())
    }

    pub fn status_text(&self) -> String {
        match (self.exit_code, self.signal) {
            _ if self.timed_out => match &self.leftover {
                Some(leftover) => format!("timeout: {leftover}"),
                None => "timeout".into(),
            },
            (Some(c), _) => format!("exit {c}"),
            (None, Some(s)) => format!("signal {s}"),
            _ => "unknown status".into(),
        }
    }

    /// The error body on stdout, if stdout parses as one.
    pub fn error_body(&self) -> Option<ErrorBody> {
        serde_json::from_str(self.stdout.trim()).ok()
    }

    /// A shell line that reproduces the call (for evidence).
    pub fn shell_line(&self) -> String {
        let mut line = String::new();
        for (k, v) in &self.env {
            line.push_str(&format!("{k}={} ", crate::report::quote(v)));
        }
        line.push_str(&crate::report::quote(&self.plugin.to_string_lossy()));
        line.push_str(" <<< ");
        line.push_str(&crate::report::quote(&self.stdin));
        line
    }
}

/// The outcome of a successful ADD through the whole chain.
#[derive(Clone, Debug)]
pub struct AddResult {
    /// The final result, typed.
    pub result: CniResult,
    /// The final result as the last plugin printed it.
    pub raw: Value,
    pub executions: Vec<Execution>,
}

/// A recorded plugin call duration, for the timing summary.
#[derive(Clone, Debug)]
pub struct Timing {
    pub command: String,
    pub duration: Duration,
    pub success: bool,
}

/// Which GC config key carries the attachments to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcKey {
    /// `cni.dev/valid-attachments` (libcni since 1.2).
    ValidAttachments,
    /// `cni.dev/attachments` (SPEC 1.1.0 text).
    Attachments,
    /// Both keys, same list.
    Both,
}

/// Drives plugins. Cheap to share between threads (`&Runtime` is `Sync`).
#[derive(Debug)]
pub struct Runtime {
    cni_path: Vec<PathBuf>,
    host: Option<Arc<File>>,
    timeout: Duration,
    cache_dir: Option<PathBuf>,
    cache: Mutex<HashMap<CacheKey, Value>>,
    busy: Mutex<HashSet<String>>,
    idle: Condvar,
    timings: Mutex<Vec<Timing>>,
    /// Read each call's CPU time from its cgroup ([`Execution::cpu`]).
    cpu_accounting: bool,
}

impl Runtime {
    /// `cni_path` is colon-separated, like `CNI_PATH`.
    pub fn new(cni_path: &str) -> Runtime {
        Runtime {
            cni_path: cni_path
                .split(':')
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .collect(),
            host: None,
            timeout: DEFAULT_TIMEOUT,
            cache_dir: None,
            cache: Mutex::new(HashMap::new()),
            busy: Mutex::new(HashSet::new()),
            idle: Condvar::new(),
            timings: Mutex::new(Vec::new()),
            cpu_accounting: false,
        }
    }

    /// Runs every plugin process inside this namespace (a throwaway "host").
    pub fn in_netns(mut self, host: &crate::netns::Netns) -> Result<Runtime, RuntimeError> {
        let file = host.file().try_clone().map_err(|e| RuntimeError::Spawn {
            path: host.path().to_path_buf(),
            reason: format!("dup netns handle: {e}"),
        })?;
        self.host = Some(Arc::new(file));
        Ok(self)
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Runtime {
        self.timeout = timeout;
        self
    }

    /// Also reads each call's CPU time from its cgroup into
    /// [`Execution::cpu`] (one file read per call: `cnilab bench` only).
    pub fn with_cpu_accounting(mut self) -> Runtime {
        self.cpu_accounting = true;
        self
    }

    /// Also keeps cached ADD results as files in `dir` (like
    /// `/var/lib/cni/results`).
    pub fn with_cache_dir(mut self, dir: &Path) -> Runtime {
        self.cache_dir = Some(dir.to_path_buf());
        self
    }

    pub fn cni_path(&self) -> String {
        self.cni_path
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":")
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Every plugin call so far (command, duration).
    pub fn timings(&self) -> Vec<Timing> {
        self.timings.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// Finds every plugin of `net` on the CNI_PATH, so that a wrong plugin
    /// directory fails before any work.
    pub fn find_plugins(&self, net: &NetworkConfig) -> Result<Vec<PathBuf>, RuntimeError> {
        (0..net.plugins.len())
            .map(|index| self.find_plugin(net.plugin_type(index)))
            .collect()
    }

    /// Finds plugin `name` on the CNI_PATH.
    pub fn find_plugin(&self, name: &str) -> Result<PathBuf, RuntimeError> {
        let not_found = || RuntimeError::PluginNotFound {
            name: name.to_string(),
            cni_path: self.cni_path(),
        };
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(not_found());
        }
        self.cni_path
            .iter()
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
            .ok_or_else(not_found)
    }

    /// Waits until no other operation runs on `container_id`, then marks it
    /// busy until the guard drops (a runtime never overlaps operations on
    /// one container).
    fn lock_container(&self, container_id: &str) -> ContainerGuard<'_> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while busy.contains(container_id) {
            busy = self.idle.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        busy.insert(container_id.to_string());
        ContainerGuard {
            runtime: self,
            id: container_id.to_string(),
        }
    }

    /// ADD through the whole chain. The final result is cached for CHECK
    /// and DEL. On failure nothing is cached and, like libcni's callers,
    /// the caller is expected to run [`Runtime::del`].
    pub fn add(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<AddResult, RuntimeError> {
        self.add_until(net, rt, None)
    }

    /// ADD whose plugin processes are SIGKILLed `after` this call starts
    /// (counted over the whole chain), as when the runtime is killed in the
    /// middle of an ADD. A plugin that was killed comes back as
    /// [`RuntimeError::Crashed`] with `signal == Some(9)`; one that finished
    /// in time as an ordinary result or error. Like any failed ADD, the
    /// caller is expected to run [`Runtime::del`] next.
    pub fn add_killed_after(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
        after: Duration,
    ) -> Result<AddResult, RuntimeError> {
        self.add_until(net, rt, Some(Instant::now() + after))
    }

    fn add_until(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
        kill_at: Option<Instant>,
    ) -> Result<AddResult, RuntimeError> {
        let _guard = self.lock_container(&rt.container_id);
        let mut prev: Option<Value> = None;
        let mut executions = Vec::new();
        for index in 0..net.plugins.len() {
            let stdin = net.plugin_stdin(index, prev.as_ref(), Some(rt));
            let exec = self.exec_plugin(net, index, CniCommand::Add, Some(rt), &stdin, kill_at)?;
            let value: Value = match serde_json::from_str(&exec.stdout) {
                Ok(v) => v,
                Err(e) => {
                    return Err(RuntimeError::Defect {
                        reason: format!("ADD exited 0 but stdout is not one JSON result: {e}"),
                        exec: Box::new(exec),
                    })
                }
            };
            executions.push(exec);
            prev = Some(value);
        }
        let raw = prev.unwrap_or(Value::Null);
        let result: CniResult = match serde_json::from_value(raw.clone()) {
            Ok(r) => r,
            Err(e) => {
                let exec = executions.pop().map(Box::new);
                return match exec {
                    Some(exec) => Err(RuntimeError::Defect {
                        reason: format!("ADD result does not match the CNI result schema: {e}"),
                        exec,
                    }),
                    None => Err(RuntimeError::BadConfig {
                        path: net.source.clone(),
                        reason: "no plugins".into(),
                    }),
                };
            }
        };
        self.store_cached(net, rt, Some(&raw))?;
        Ok(AddResult {
            result,
            raw,
            executions,
        })
    }

    /// CHECK through the chain with the cached ADD result as `prevResult`.
    pub fn check(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
    ) -> Result<Vec<Execution>, RuntimeError> {
        gate(
            net,
            "CHECK",
            Version::V0_4_0,
            Some(("disableCheck", net.disable_check)),
        )?;
        let _guard = self.lock_container(&rt.container_id);
        let prev = self
            .cached(net, rt)?
            .ok_or_else(|| RuntimeError::NotCached {
                network: net.name.clone(),
                container_id: rt.container_id.clone(),
                ifname: rt.ifname.clone(),
            })?;
        self.run_chain(net, CniCommand::Check, Some(rt), Some(&prev), false)
    }

    /// DEL through the chain in reverse order, with the cached ADD result
    /// as `prevResult` when there is one. The cache entry is removed on
    /// success.
    pub fn del(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
    ) -> Result<Vec<Execution>, RuntimeError> {
        let _guard = self.lock_container(&rt.container_id);
        let prev = self.cached(net, rt)?;
        let execs = self.run_chain(net, CniCommand::Del, Some(rt), prev.as_ref(), true)?;
        self.store_cached(net, rt, None)?;
        Ok(execs)
    }

    /// The cached final ADD result for an attachment.
    pub fn cached_result(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Option<Value> {
        self.cached(net, rt).ok().flatten()
    }

    fn run_chain(
        &self,
        net: &NetworkConfig,
        command: CniCommand,
        rt: Option<&RuntimeConf>,
        prev: Option<&Value>,
        reverse: bool,
    ) -> Result<Vec<Execution>, RuntimeError> {
        let mut order: Vec<usize> = (0..net.plugins.len()).collect();
        if reverse {
            order.reverse();
        }
        let mut execs = Vec::new();
        for index in order {
            let stdin = net.plugin_stdin(index, prev, rt);
            execs.push(self.exec_plugin(net, index, command, rt, &stdin, None)?);
        }
        Ok(execs)
    }

    /// VERSION of plugin `plugin` (a type name on the CNI_PATH), asking with
    /// `version` as the config's cniVersion.
    pub fn version(
        &self,
        plugin: &str,
        version: &str,
    ) -> Result<(VersionInfo, Execution), RuntimeError> {
        let path = self.find_plugin(plugin)?;
        let env = self.cni_env(CniCommand::Version, None);
        let body = serde_json::json!({ "cniVersion": version }).to_string();
        let exec = self.exec_raw(&path, &env, body.as_bytes())?;
        if exec.timed_out {
            return Err(RuntimeError::Timeout(Box::new(exec)));
        }
        if !exec.success() {
            return match exec.error_body() {
                Some(error) => Err(RuntimeError::Plugin {
                    error,
                    exec: Box::new(exec),
                }),
                None => Err(RuntimeError::Crashed(Box::new(exec))),
            };
        }
        match serde_json::from_str::<VersionInfo>(&exec.stdout) {
            Ok(info) => Ok((info, exec)),
            Err(e) => Err(RuntimeError::Defect {
                reason: format!("VERSION output is not {{cniVersion, supportedVersions}}: {e}"),
                exec: Box::new(exec),
            }),
        }
    }

    /// STATUS through the chain (1.1.0).
    pub fn status(&self, net: &NetworkConfig) -> Result<Vec<Execution>, RuntimeError> {
        gate(net, "STATUS", Version::V1_1_0, None)?;
        self.run_chain(net, CniCommand::Status, None, None, false)
    }

    /// GC through the chain (1.1.0): everything not in `keep` may be
    /// released. Runs exclusive of ADD/DEL on every container.
    pub fn gc(
        &self,
        net: &NetworkConfig,
        keep: &[spec::Attachment],
        key: GcKey,
    ) -> Result<Vec<Execution>, RuntimeError> {
        gate(
            net,
            "GC",
            Version::V1_1_0,
            Some(("disableGC", net.disable_gc)),
        )?;
        // Exclusive: wait until no container operation runs, and hold the
        // lock so that none starts.
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while !busy.is_empty() {
            busy = self.idle.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        let list = serde_json::to_value(keep).unwrap_or(Value::Array(Vec::new()));
        let mut execs = Vec::new();
        for index in 0..net.plugins.len() {
            let mut stdin = net.plugin_stdin(index, None, None);
            if matches!(key, GcKey::ValidAttachments | GcKey::Both) {
                stdin.insert("cni.dev/valid-attachments".into(), list.clone());
            }
            if matches!(key, GcKey::Attachments | GcKey::Both) {
                stdin.insert("cni.dev/attachments".into(), list.clone());
            }
            execs.push(self.exec_plugin(net, index, CniCommand::Gc, None, &stdin, None)?);
        }
        drop(busy);
        Ok(execs)
    }
}

/// Refuses a verb the network's config cannot run: its version is older
/// than `need` (checked first), or `disabled` names the config key that
/// turned it off and whether it is set.
fn gate(
    net: &NetworkConfig,
    command: &'static str,
    need: Version,
    disabled: Option<(&'static str, bool)>,
) -> Result<(), RuntimeError> {
    if net.version < need {
        return Err(RuntimeError::VersionTooLow {
            command,
            need,
            have: net.version,
        });
    }
    if let Some((key, true)) = disabled {
        return Err(RuntimeError::Disabled { command, key });
    }
    Ok(())
}

struct ContainerGuard<'a> {
    runtime: &'a Runtime,
    id: String,
}

impl Drop for ContainerGuard<'_> {
    fn drop(&mut self) {
        let mut busy = self.runtime.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy.remove(&self.id);
        self.runtime.idle.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_plugins_are_reported_with_the_search_path() {
        let rt = Runtime::new("/nonexistent-a:/nonexistent-b");
        let err = rt.find_plugin("bridge").expect_err("not there").to_string();
        assert!(err.contains("/nonexistent-a:/nonexistent-b"), "{err}");
        assert!(rt.find_plugin("../bin/sh").is_err());
    }
}
