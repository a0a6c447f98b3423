//! `Runtime`: plays the container runtime the way libcni does. It loads a
//! network config, executes plugin binaries with the `CNI_*` environment and
//! the config on stdin, chains `prevResult`, caches the final ADD result for
//! CHECK and DEL, and records every execution (for evidence and timing).
//!
//! Plugins run inside a chosen "host" namespace, so their bridges and host
//! veths never appear in the real host namespace.

use cnilab_net::spec::{self, CniResult, ErrorBody, Version, VersionInfo};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot read network config {path}: {reason}")]
    ReadConfig { path: PathBuf, reason: String },
    #[error("invalid network config {path}: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error("plugin {name:?} not found in CNI_PATH {cni_path} (check --plugin-dir)")]
    PluginNotFound { name: String, cni_path: String },
    #[error("cannot start plugin {path}: {reason}")]
    Spawn { path: PathBuf, reason: String },
    #[error("plugin {} timed out after {:?} and was killed", .0.plugin.display(), .0.duration)]
    Timeout(Box<Execution>),
    #[error("plugin {} failed: code {} {}{}", .exec.plugin.display(), .error.code, .error.msg, if .error.details.is_empty() { String::new() } else { format!(" ({})", .error.details) })]
    Plugin {
        error: ErrorBody,
        exec: Box<Execution>,
    },
    #[error("plugin {} exited with {} without a CNI error body on stdout", .0.plugin.display(), .0.status_text())]
    Crashed(Box<Execution>),
    #[error("plugin defect in {}: {reason}", .exec.plugin.display())]
    Defect {
        reason: String,
        exec: Box<Execution>,
    },
    #[error("{command} is disabled by the network config ({key})")]
    Disabled {
        command: &'static str,
        key: &'static str,
    },
    #[error("{command} needs config version {need} or later; the network uses {have}")]
    VersionTooLow {
        command: &'static str,
        need: Version,
        have: Version,
    },
    #[error(
        "no cached ADD result for network {network}, container {container_id}, ifname {ifname}"
    )]
    NotCached {
        network: String,
        container_id: String,
        ifname: String,
    },
    #[error("cache {path}: {reason}")]
    Cache { path: PathBuf, reason: String },
}

impl RuntimeError {
    /// The plugin execution this error came from, if any (for evidence).
    pub fn execution(&self) -> Option<&Execution> {
        match self {
            RuntimeError::Timeout(e) | RuntimeError::Crashed(e) => Some(e),
            RuntimeError::Plugin { exec, .. } | RuntimeError::Defect { exec, .. } => Some(exec),
            _ => None,
        }
    }

    /// The CNI error body, when the plugin printed one.
    pub fn error_body(&self) -> Option<&ErrorBody> {
        match self {
            RuntimeError::Plugin { error, .. } => Some(error),
            _ => None,
        }
    }
}

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
    /// The complete environment the plugin saw (besides `PATH`).
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
            _ if self.timed_out => "timeout".into(),
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

/// Per-call inputs (libcni's `RuntimeConf`).
#[derive(Clone, Debug, Default)]
pub struct RuntimeConf {
    pub container_id: String,
    /// `CNI_NETNS`; `None` leaves it unset (allowed for DEL).
    pub netns: Option<PathBuf>,
    pub ifname: String,
    /// Extra `CNI_ARGS` pairs; `IgnoreUnknown=1` is always sent first.
    pub args: Vec<(String, String)>,
    /// Capability arguments, injected as `runtimeConfig` for plugins that
    /// declare the capability.
    pub capability_args: Map<String, Value>,
}

impl RuntimeConf {
    pub fn new(container_id: &str, netns: Option<&Path>, ifname: &str) -> Self {
        RuntimeConf {
            container_id: container_id.to_string(),
            netns: netns.map(Path::to_path_buf),
            ifname: ifname.to_string(),
            ..Default::default()
        }
    }

    fn cni_args(&self) -> String {
        let mut s = String::from("IgnoreUnknown=1");
        for (k, v) in &self.args {
            s.push_str(&format!(";{k}={v}"));
        }
        s
    }
}

/// A loaded `.conf` or `.conflist`.
#[derive(Clone, Debug)]
pub struct NetworkConfig {
    pub name: String,
    /// The version chosen for this run (highest of cniVersion ∪ cniVersions
    /// that the runtime supports).
    pub version: Version,
    pub disable_check: bool,
    pub disable_gc: bool,
    /// The plugin configs, in chain order.
    pub plugins: Vec<Map<String, Value>>,
    /// Where it came from (for messages).
    pub source: PathBuf,
}

fn flag(value: Option<&Value>, key: &str, path: &Path) -> Result<bool, RuntimeError> {
    match value {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(RuntimeError::BadConfig {
            path: path.to_path_buf(),
            reason: format!("{key} must be true/false or \"true\"/\"false\", got {other}"),
        }),
    }
}

impl NetworkConfig {
    /// Reads a `.conf` (one plugin) or `.conflist` (a `plugins` array).
    pub fn load(path: &Path) -> Result<NetworkConfig, RuntimeError> {
        let text = std::fs::read_to_string(path).map_err(|e| RuntimeError::ReadConfig {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::parse(&text, path)
    }

    /// Parses config text; `source` only names it in messages.
    pub fn parse(text: &str, source: &Path) -> Result<NetworkConfig, RuntimeError> {
        let bad = |reason: String| RuntimeError::BadConfig {
            path: source.to_path_buf(),
            reason,
        };
        let value: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Value::Object(top) = value else {
            return Err(bad("the top level must be a JSON object".into()));
        };
        let name = match top.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            _ => return Err(bad("missing \"name\" (a non-empty string)".into())),
        };
        let mut offered: Vec<String> = Vec::new();
        if let Some(Value::String(v)) = top.get("cniVersion") {
            offered.push(v.clone());
        }
        if let Some(list) = top.get("cniVersions") {
            let Value::Array(list) = list else {
                return Err(bad("\"cniVersions\" must be an array of strings".into()));
            };
            for v in list {
                match v {
                    Value::String(s) => offered.push(s.clone()),
                    _ => return Err(bad("\"cniVersions\" must be an array of strings".into())),
                }
            }
        }
        let version = offered
            .iter()
            .filter(|v| spec::is_supported(v))
            .filter_map(|v| Version::parse(v))
            .max()
            .ok_or_else(|| {
                bad(format!(
                    "no supported version among {offered:?}; the harness speaks {:?}",
                    spec::SUPPORTED_VERSIONS
                ))
            })?;
        let plugins = match top.get("plugins") {
            Some(Value::Array(list)) => {
                let mut out = Vec::new();
                for (i, p) in list.iter().enumerate() {
                    match p {
                        Value::Object(o) if o.get("type").is_some_and(Value::is_string) => {
                            out.push(o.clone())
                        }
                        _ => {
                            return Err(bad(format!(
                                "plugins[{i}] must be an object with a \"type\" string"
                            )))
                        }
                    }
                }
                if out.is_empty() {
                    return Err(bad("\"plugins\" is empty".into()));
                }
                out
            }
            Some(_) => return Err(bad("\"plugins\" must be an array".into())),
            None => {
                if !top.get("type").is_some_and(Value::is_string) {
                    return Err(bad(
                        "a .conf needs a \"type\" (or use a .conflist with \"plugins\")".into(),
                    ));
                }
                vec![top.clone()]
            }
        };
        Ok(NetworkConfig {
            name,
            version,
            disable_check: flag(top.get("disableCheck"), "disableCheck", source)?,
            disable_gc: flag(top.get("disableGC"), "disableGC", source)?,
            plugins,
            source: source.to_path_buf(),
        })
    }

    /// The same network at another config version (for per-version runs).
    pub fn with_version(&self, version: Version) -> NetworkConfig {
        NetworkConfig {
            version,
            ..self.clone()
        }
    }

    /// Plugin `index`'s `type`.
    pub fn plugin_type(&self, index: usize) -> &str {
        self.plugins
            .get(index)
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// What plugin `index` gets on stdin, as libcni builds it: the plugin's
    /// own object plus `name`, `cniVersion`, `prevResult` (when given) and
    /// `runtimeConfig` restricted to the plugin's declared capabilities.
    pub fn plugin_stdin(
        &self,
        index: usize,
        prev_result: Option<&Value>,
        rt: Option<&RuntimeConf>,
    ) -> Map<String, Value> {
        let mut conf = self.plugins.get(index).cloned().unwrap_or_default();
        conf.insert("name".into(), Value::String(self.name.clone()));
        conf.insert("cniVersion".into(), Value::String(self.version.to_string()));
        conf.remove("prevResult");
        if let Some(prev) = prev_result {
            conf.insert("prevResult".into(), prev.clone());
        }
        if let Some(rt) = rt {
            let caps: HashSet<String> = match conf.get("capabilities") {
                Some(Value::Object(c)) => c
                    .iter()
                    .filter(|(_, v)| v.as_bool() == Some(true))
                    .map(|(k, _)| k.clone())
                    .collect(),
                _ => HashSet::new(),
            };
            let runtime_config: Map<String, Value> = rt
                .capability_args
                .iter()
                .filter(|(k, _)| caps.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !runtime_config.is_empty() {
                conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
            }
        }
        conf
    }

    /// Points every plugin's `ipam.dataDir` at `dir`, so a run keeps its
    /// address reservations in a scratch directory of its own.
    pub fn set_ipam_data_dir(&mut self, dir: &Path) {
        for plugin in &mut self.plugins {
            if let Some(Value::Object(ipam)) = plugin.get_mut("ipam") {
                ipam.insert(
                    "dataDir".into(),
                    Value::String(dir.to_string_lossy().into_owned()),
                );
            }
        }
    }

    /// `ipam.dataDir` of the first plugin when it keeps a host-local style
    /// store (`<dataDir>/<network>/<ip>` files). `None` when unknown.
    pub fn ipam_store_dir(&self) -> Option<PathBuf> {
        let ipam = self.plugins.first()?.get("ipam")?.as_object()?;
        let data_dir = ipam
            .get("dataDir")
            .and_then(Value::as_str)
            .unwrap_or("/var/lib/cni/networks");
        Some(Path::new(data_dir).join(&self.name))
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

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct CacheKey {
    network: String,
    container_id: String,
    ifname: String,
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

    fn record(&self, exec: &Execution) {
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
    /// stdout, a CNI error, a crash, or a timeout.
    fn exec_plugin(
        &self,
        net: &NetworkConfig,
        index: usize,
        command: CniCommand,
        rt: Option<&RuntimeConf>,
        stdin: &Map<String, Value>,
    ) -> Result<Execution, RuntimeError> {
        self.exec_plugin_until(net, index, command, rt, stdin, None)
    }

    /// [`Runtime::exec_plugin`] with an optional moment at which the plugin
    /// is SIGKILLed (see [`Runtime::add_killed_after`]).
    fn exec_plugin_until(
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
            let exec =
                self.exec_plugin_until(net, index, CniCommand::Add, Some(rt), &stdin, kill_at)?;
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
        if net.version < Version::V0_4_0 {
            return Err(RuntimeError::VersionTooLow {
                command: "CHECK",
                need: Version::V0_4_0,
                have: net.version,
            });
        }
        if net.disable_check {
            return Err(RuntimeError::Disabled {
                command: "CHECK",
                key: "disableCheck",
            });
        }
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
            execs.push(self.exec_plugin(net, index, command, rt, &stdin)?);
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
        if net.version < Version::V1_1_0 {
            return Err(RuntimeError::VersionTooLow {
                command: "STATUS",
                need: Version::V1_1_0,
                have: net.version,
            });
        }
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
        if net.version < Version::V1_1_0 {
            return Err(RuntimeError::VersionTooLow {
                command: "GC",
                need: Version::V1_1_0,
                have: net.version,
            });
        }
        if net.disable_gc {
            return Err(RuntimeError::Disabled {
                command: "GC",
                key: "disableGC",
            });
        }
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
            execs.push(self.exec_plugin(net, index, CniCommand::Gc, None, &stdin)?);
        }
        drop(busy);
        Ok(execs)
    }

    fn cache_file(&self, key: &CacheKey) -> Option<PathBuf> {
        let dir = self.cache_dir.as_ref()?;
        let safe = |s: &str| spec::valid_container_id(s);
        if !safe(&key.network)
            || !safe(&key.container_id)
            || spec::check_ifname(&key.ifname).is_err()
        {
            return None;
        }
        Some(dir.join(format!(
            "{}-{}-{}",
            key.network, key.container_id, key.ifname
        )))
    }

    fn cached(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<Option<Value>, RuntimeError> {
        let key = CacheKey {
            network: net.name.clone(),
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
        };
        if let Some(v) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(Some(v));
        }
        let Some(path) = self.cache_file(&key) else {
            return Ok(None);
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| RuntimeError::Cache {
                    path,
                    reason: format!("corrupt cache entry: {e}"),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RuntimeError::Cache {
                path,
                reason: e.to_string(),
            }),
        }
    }

    fn store_cached(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
        value: Option<&Value>,
    ) -> Result<(), RuntimeError> {
        let key = CacheKey {
            network: net.name.clone(),
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
        };
        let file = self.cache_file(&key);
        if let Ok(mut cache) = self.cache.lock() {
            match value {
                Some(v) => {
                    cache.insert(key, v.clone());
                }
                None => {
                    cache.remove(&key);
                }
            }
        }
        let Some(path) = file else {
            return Ok(());
        };
        let io = |e: std::io::Error| RuntimeError::Cache {
            path: path.clone(),
            reason: e.to_string(),
        };
        match value {
            Some(v) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
                std::fs::write(&path, v.to_string()).map_err(io)
            }
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
                _ => Ok(()),
            },
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn parse(text: &str) -> Result<NetworkConfig, RuntimeError> {
        NetworkConfig::parse(text, Path::new("test.conflist"))
    }

    #[rstest]
    #[case(
        r#"{"name":"n","cniVersion":"0.4.0","plugins":[{"type":"bridge"}]}"#,
        "0.4.0"
    )]
    #[case(r#"{"name":"n","cniVersion":"0.4.0","cniVersions":["1.0.0","0.3.1"],"plugins":[{"type":"bridge"}]}"#, "1.0.0")]
    #[case(r#"{"name":"n","cniVersion":"1.0.0","cniVersions":["9.0.0"],"plugins":[{"type":"bridge"}]}"#, "1.0.0")]
    #[case(r#"{"name":"n","cniVersion":"1.1.0","type":"bridge"}"#, "1.1.0")]
    fn chooses_the_highest_supported_version(#[case] text: &str, #[case] want: &str) {
        let net = parse(text).expect("parses");
        assert_eq!(net.version.to_string(), want);
    }

    #[rstest]
    #[case(r#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#, "name")]
    #[case(
        r#"{"name":"n","cniVersion":"7.0.0","plugins":[{"type":"bridge"}]}"#,
        "no supported version"
    )]
    #[case(r#"{"name":"n","cniVersion":"1.0.0","plugins":[{}]}"#, "type")]
    #[case(
        r#"{"name":"n","cniVersion":"1.0.0","disableCheck":"maybe","plugins":[{"type":"x"}]}"#,
        "disableCheck"
    )]
    #[case(r#"{"name":"n","cniVersion":"1.0.0"}"#, "type")]
    #[case("not json", "not JSON")]
    fn rejects_bad_configs(#[case] text: &str, #[case] needle: &str) {
        let err = parse(text).expect_err("must be rejected").to_string();
        assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    }

    #[rstest]
    #[case(r#"true"#, true)]
    #[case(r#""true""#, true)]
    #[case(r#""False""#, false)]
    #[case(r#"false"#, false)]
    fn honours_disable_flags_as_bool_or_string(#[case] value: &str, #[case] want: bool) {
        let text = format!(
            r#"{{"name":"n","cniVersion":"1.1.0","disableCheck":{value},"disableGC":{value},"plugins":[{{"type":"x"}}]}}"#
        );
        let net = parse(&text).expect("parses");
        assert_eq!(net.disable_check, want);
        assert_eq!(net.disable_gc, want);
    }

    #[test]
    fn plugin_stdin_injects_name_version_prev_result_and_capabilities() {
        let net = parse(
            r#"{"name":"net1","cniVersion":"1.0.0","plugins":[{"type":"a"},{"type":"b","capabilities":{"portMappings":true},"prevResult":"stale"}]}"#,
        )
        .expect("parses");
        let mut rt = RuntimeConf::new("c1", None, "eth0");
        rt.capability_args
            .insert("portMappings".into(), serde_json::json!([{"hostPort": 80}]));
        rt.capability_args
            .insert("bandwidth".into(), serde_json::json!({}));
        let first = net.plugin_stdin(0, None, Some(&rt));
        assert_eq!(first["name"], "net1");
        assert_eq!(first["cniVersion"], "1.0.0");
        assert!(first.get("prevResult").is_none());
        assert!(
            first.get("runtimeConfig").is_none(),
            "no capability declared"
        );
        let prev = serde_json::json!({"cniVersion":"1.0.0"});
        let second = net.plugin_stdin(1, Some(&prev), Some(&rt));
        assert_eq!(second["prevResult"], prev);
        assert!(second["runtimeConfig"].get("portMappings").is_some());
        assert!(second["runtimeConfig"].get("bandwidth").is_none());
    }

    #[test]
    fn cni_args_always_start_with_ignore_unknown() {
        let mut rt = RuntimeConf::new("c", None, "eth0");
        rt.args.push(("K8S_POD_NAME".into(), "p".into()));
        assert_eq!(rt.cni_args(), "IgnoreUnknown=1;K8S_POD_NAME=p");
    }

    #[test]
    fn unknown_plugins_are_reported_with_the_search_path() {
        let rt = Runtime::new("/nonexistent-a:/nonexistent-b");
        let err = rt.find_plugin("bridge").expect_err("not there").to_string();
        assert!(err.contains("/nonexistent-a:/nonexistent-b"), "{err}");
        assert!(rt.find_plugin("../bin/sh").is_err());
    }
}
