//! The shared context of a conformance run and the helpers checks use:
//! raw calls with bad input, "nothing changed" verification, a spy IPAM.

use super::ConformError;
use crate::host_state;
use crate::lifecycle::{HostSnapshot, Target};
use crate::netns::Netns;
use crate::runtime::{CniCommand, Execution, NetworkConfig, Runtime, RuntimeConf};
use crate::util::clip;
use crate::verdict::Finding;
use cnilab_net::spec::Version;
use serde_json::{Map, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

pub(crate) struct Suite<'a> {
    pub runtime: &'a Runtime,
    pub host: &'a Netns,
    pub net: &'a NetworkConfig,
    pub ifname: String,
    pub plugin_dir: String,
    pub scratch: PathBuf,
    pub data_dir: PathBuf,
    /// Parsed `supportedVersions` of the first plugin (empty when VERSION failed).
    pub versions: Vec<Version>,
    pub version_strings: Vec<String>,
    /// Why `versions` is narrower than the first plugin's own list (a
    /// chained or delegated IPAM plugin that supports fewer versions).
    pub limits: Vec<String>,
    /// V1/V2 findings, made while discovering the versions.
    pub version_findings: Vec<Finding>,
    /// The first plugin's versions narrowed only by its delegated IPAM
    /// (what a call of the first plugin alone can be held to); `versions`
    /// is narrowed by the whole chain.
    pub single_versions: Vec<Version>,
    counter: Arc<AtomicU32>,
    /// Seeds the container IDs ([`Suite::cid`]).
    seed: u64,
    layout: OnceLock<bool>,
}

/// Result of an error-expecting call.
pub(crate) struct Expect<'a> {
    pub id: &'static str,
    pub what: &'a str,
    /// Acceptable codes; empty accepts any code.
    pub codes: &'a [u32],
    /// A word the message (msg or details) must contain.
    pub names: Option<&'a str>,
}

impl<'a> Suite<'a> {
    pub fn new(
        runtime: &'a Runtime,
        host: &'a Netns,
        net: &'a NetworkConfig,
        opts: &super::ConformOptions,
        scratch: &Path,
        data_dir: &Path,
    ) -> Result<Suite<'a>, ConformError> {
        let mut suite = Suite {
            runtime,
            host,
            net,
            ifname: opts.ifname.clone(),
            plugin_dir: opts.plugin_dir.clone(),
            scratch: scratch.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            versions: Vec::new(),
            version_strings: Vec::new(),
            limits: Vec::new(),
            version_findings: Vec::new(),
            single_versions: Vec::new(),
            counter: Arc::new(AtomicU32::new(0)),
            seed: opts.seed.unwrap_or_else(crate::rng::seed_from_clock),
            layout: OnceLock::new(),
        };
        suite.discover_versions();
        suite.narrow_to_helpers();
        Ok(suite)
    }

    /// The same suite in another group's world (host namespace, runtime,
    /// network with its own `dataDir`); container IDs stay unique.
    pub fn for_world<'b>(
        &'b self,
        runtime: &'b Runtime,
        host: &'b Netns,
        net: &'b NetworkConfig,
        data_dir: &Path,
    ) -> Suite<'b> {
        Suite {
            runtime,
            host,
            net,
            ifname: self.ifname.clone(),
            plugin_dir: self.plugin_dir.clone(),
            scratch: self.scratch.clone(),
            data_dir: data_dir.to_path_buf(),
            versions: self.versions.clone(),
            version_strings: self.version_strings.clone(),
            limits: self.limits.clone(),
            version_findings: Vec::new(),
            single_versions: self.single_versions.clone(),
            counter: Arc::clone(&self.counter),
            seed: self.seed,
            layout: OnceLock::new(),
        }
    }

    pub fn plugin_versions(&self) -> Vec<String> {
        self.version_strings.clone()
    }

    /// V1 and V2: VERSION with only CNI_COMMAND set.
    fn discover_versions(&mut self) {
        let Ok(plugin) = self.runtime.find_plugin(self.net.plugin_type(0)) else {
            return;
        };
        let env = vec![("CNI_COMMAND".to_string(), "VERSION".to_string())];
        let ask = |v: &str| {
            let body = serde_json::json!({ "cniVersion": v }).to_string();
            self.runtime.exec_raw(&plugin, &env, body.as_bytes())
        };
        let exec = match ask(&self.net.version.to_string()) {
            Ok(e) => e,
            Err(e) => {
                self.version_findings
                    .push(Finding::fail("V1", format!("VERSION could not run: {e}")));
                return;
            }
        };
        let parsed: Option<cnilab_net::spec::VersionInfo> = if exec.success() {
            serde_json::from_str(exec.stdout.trim()).ok()
        } else {
            None
        };
        let Some(info) = parsed else {
            self.version_findings.push(
                Finding::fail(
                    "V1",
                    format!(
                        "expected exit 0 and {{\"cniVersion\",\"supportedVersions\":[…]}} with only CNI_COMMAND set; saw {} stdout {:?}",
                        exec.status_text(),
                        clip(&exec.stdout)
                    ),
                )
                .with(&exec),
            );
            return;
        };
        let bad: Vec<&String> = info
            .supported_versions
            .iter()
            .filter(|v| Version::parse(v).is_none())
            .collect();
        self.versions = info
            .supported_versions
            .iter()
            .filter_map(|v| Version::parse(v))
            .collect();
        self.version_strings = info.supported_versions.clone();
        self.version_findings.push(Finding::check(
            "V1",
            !self.versions.is_empty() && bad.is_empty(),
            format!("supportedVersions {:?}", info.supported_versions),
        ));
        for v in &info.supported_versions {
            match ask(v) {
                Ok(e) => {
                    let echoed = serde_json::from_str::<Value>(e.stdout.trim())
                        .ok()
                        .and_then(|j| {
                            j.get("cniVersion")
                                .and_then(Value::as_str)
                                .map(String::from)
                        });
                    match echoed {
                        Some(ref s) if s == v => {
                            self.version_findings.push(Finding::pass("V2", format!("echoes {v}")))
                        }
                        Some(s) if e.success() => self.version_findings.push(
                            Finding::warn(
                                "V2",
                                format!("asked with {v}, VERSION answered cniVersion {s} (known reference deviation)"),
                            )
                            .with(&e),
                        ),
                        _ => self.version_findings.push(
                            Finding::fail("V2", format!("VERSION with cniVersion {v} failed: {}", e.status_text()))
                                .with(&e),
                        ),
                    }
                }
                Err(e) => self
                    .version_findings
                    .push(Finding::fail("V2", format!("VERSION could not run: {e}"))),
            }
        }
    }

    /// Narrows `versions` to what every other plugin the network runs
    /// (chained plugins, delegated IPAM) also lists in its VERSION: the
    /// lifecycle cannot pass at a version one of them refuses.
    fn narrow_to_helpers(&mut self) {
        let mut helpers: Vec<String> = Vec::new();
        for (i, p) in self.net.plugins.iter().enumerate() {
            if i > 0 {
                helpers.push(self.net.plugin_type(i).to_string());
            }
            if let Some(t) = p
                .get("ipam")
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str)
            {
                helpers.push(t.to_string());
            }
        }
        helpers.dedup();
        self.single_versions = self.versions.clone();
        let own_ipam = self.ipam_type();
        let env = vec![("CNI_COMMAND".to_string(), "VERSION".to_string())];
        for helper in helpers {
            let Ok(path) = self.runtime.find_plugin(&helper) else {
                continue;
            };
            let body =
                serde_json::json!({ "cniVersion": self.net.version.to_string() }).to_string();
            let Ok(exec) = self.runtime.exec_raw(&path, &env, body.as_bytes()) else {
                continue;
            };
            let Ok(info) =
                serde_json::from_str::<cnilab_net::spec::VersionInfo>(exec.stdout.trim())
            else {
                continue;
            };
            let theirs: Vec<Version> = info
                .supported_versions
                .iter()
                .filter_map(|v| Version::parse(v))
                .collect();
            if own_ipam.as_deref() == Some(helper.as_str()) {
                self.single_versions.retain(|v| theirs.contains(v));
            }
            let before = self.versions.len();
            self.versions.retain(|v| theirs.contains(v));
            if self.versions.len() != before {
                self.limits.push(format!(
                    "{helper} lists only {}",
                    info.supported_versions.join(", ")
                ));
            }
        }
    }

    /// Why a 1.1.0-only check is skipped.
    pub fn why_not(&self, version: &str) -> String {
        if self.limits.is_empty() {
            format!("the plugin's VERSION does not list {version}")
        } else {
            format!(
                "not every plugin of the network supports {version}: {}",
                self.limits.join("; ")
            )
        }
    }

    pub fn target(&self) -> Target<'_> {
        Target::new(self.runtime, self.host, self.net)
    }

    pub fn target_for<'b>(&'b self, net: &'b NetworkConfig) -> Target<'b> {
        Target::new(self.runtime, self.host, net)
    }

    /// A fresh container ID like a runtime's: 64 hex characters, from the
    /// run's seed and a counter, so IDs share no prefix (a plugin naming
    /// host veths after the first characters of the ID does not collide).
    /// `tag` names the check in nothing but the caller.
    pub fn cid(&self, _tag: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        crate::rng::container_id(self.seed, u64::from(n))
    }

    pub fn pod(&self) -> Result<Netns, ConformError> {
        Ok(Netns::with_label("pod")?)
    }

    pub fn supports(&self, v: Version) -> bool {
        super::lists(&self.versions, v)
    }

    /// The highest version both the plugin and the harness speak, at least `min`.
    pub fn best_version_at_least(&self, min: Version) -> Option<Version> {
        let mut ok: Vec<Version> = self
            .versions
            .iter()
            .copied()
            .filter(|v| *v >= min && cnilab_net::spec::is_supported(&v.to_string()))
            .collect();
        ok.sort();
        if ok.contains(&self.net.version) && self.net.version >= min {
            return Some(self.net.version);
        }
        ok.pop()
    }

    pub fn first_plugin(&self) -> Result<PathBuf, ConformError> {
        Ok(self
            .runtime
            .find_plugin(self.net.plugin_type(0))
            .map_err(Box::new)?)
    }

    /// The first plugin's stdin for `net`, without prevResult.
    pub fn stdin_of(&self, net: &NetworkConfig) -> Map<String, Value> {
        net.plugin_stdin(0, None, None)
    }

    pub fn env(
        &self,
        cmd: CniCommand,
        cid: &str,
        netns: Option<&Path>,
        ifname: &str,
    ) -> Vec<(String, String)> {
        self.runtime
            .cni_env(cmd, Some(&RuntimeConf::new(cid, netns, ifname)))
    }

    /// Every file under the IPAM data dir (to prove bad input wrote nothing).
    pub fn store_files(&self) -> Vec<String> {
        fn walk(dir: &Path, out: &mut Vec<String>) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    let p = e.path();
                    out.push(p.to_string_lossy().into_owned());
                    if p.is_dir() {
                        walk(&p, out);
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.data_dir, &mut out);
        out.sort();
        out
    }

    /// Sends bad input and expects a CNI error that changes nothing.
    pub fn expect_error(
        &self,
        expect: &Expect<'_>,
        env: &[(String, String)],
        stdin: &[u8],
        pod: Option<&Netns>,
    ) -> Finding {
        let target = self.target();
        let before: Option<HostSnapshot> = target.snapshot().ok();
        let pod_before = pod.and_then(|p| p.links().ok());
        let files_before = self.store_files();
        let plugin = match self.first_plugin() {
            Ok(p) => p,
            Err(e) => return Finding::fail(expect.id, e.to_string()),
        };
        let exec = match self.runtime.exec_raw(&plugin, env, stdin) {
            Ok(e) => e,
            Err(e) => {
                return Finding::fail(expect.id, format!("{}: could not run: {e}", expect.what))
            }
        };
        let mut problems = Vec::new();
        let mut warn = None;
        if exec.success() {
            problems.push("expected a non-zero exit with a CNI error, saw exit 0".to_string());
        } else if exec.timed_out {
            problems.push("timed out".to_string());
        } else {
            match exec.error_body() {
                None => problems.push(format!(
                    "expected a JSON error body {{code,msg}} on stdout, saw {:?}",
                    clip(&exec.stdout)
                )),
                Some(body) => {
                    if !expect.codes.is_empty() && !expect.codes.contains(&body.code) {
                        problems.push(format!(
                            "expected code {}, saw code {} ({})",
                            expect
                                .codes
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(" or "),
                            body.code,
                            body.msg
                        ));
                    }
                    if let Some(name) = expect.names {
                        let text = format!("{} {}", body.msg, body.details);
                        if !text.contains(name) {
                            problems.push(format!("message {:?} does not name {name}", body.msg));
                        }
                    }
                    if body.cni_version.is_none() {
                        warn = Some("error body lacks cniVersion (known reference deviation)");
                    }
                }
            }
        }
        if let Some(before) = &before {
            if let Ok(leaks) = target.leaks_since(before, &[]) {
                for l in leaks {
                    problems.push(format!("host changed: {l}"));
                }
            }
        }
        if let (Some(pod), Some(b)) = (pod, pod_before) {
            let after = pod.links().unwrap_or_default();
            for l in &after {
                if !b.iter().any(|x| x.name == l.name) {
                    problems.push(format!("pod namespace changed: new link {}", l.name));
                }
            }
        }
        let files_after = self.store_files();
        for f in &files_after {
            if !files_before.contains(f) {
                problems.push(format!("store changed: new file {f}"));
            }
        }
        if exec.success() {
            // Undo whatever it did, like a runtime would (after the
            // comparison, so the cleanup is not blamed on the plugin).
            let del_env: Vec<(String, String)> = env
                .iter()
                .map(|(k, v)| {
                    let v = if k == "CNI_COMMAND" {
                        "DEL"
                    } else {
                        v.as_str()
                    };
                    (k.clone(), v.to_string())
                })
                .collect();
            let _ = self.runtime.exec_raw(&plugin, &del_env, stdin);
        }
        let f = if !problems.is_empty() {
            Finding::fail(
                expect.id,
                format!("{}: {}", expect.what, problems.join("; ")),
            )
        } else if let Some(w) = warn {
            Finding::warn(expect.id, format!("{}: {w}", expect.what))
        } else {
            Finding::pass(
                expect.id,
                format!(
                    "{}: code {}, nothing changed",
                    expect.what,
                    exec.error_body().map(|b| b.code).unwrap_or_default()
                ),
            )
        };
        f.with(&exec)
    }

    /// Runs the first plugin raw and expects success; returns the execution.
    pub fn expect_success(
        &self,
        id: &'static str,
        what: &str,
        env: &[(String, String)],
        stdin: &[u8],
    ) -> Result<Execution, Finding> {
        let plugin = self
            .first_plugin()
            .map_err(|e| Finding::fail(id, e.to_string()))?;
        match self.runtime.exec_raw(&plugin, env, stdin) {
            Ok(e) if e.success() => Ok(e),
            Ok(e) => Err(Finding::fail(
                id,
                format!(
                    "{what}: expected exit 0, saw {} stdout {:?}",
                    e.status_text(),
                    clip(&e.stdout)
                ),
            )
            .with(&e)),
            Err(e) => Err(Finding::fail(id, format!("{what}: could not run: {e}"))),
        }
    }

    /// Whether the config names `ip` itself (static IPAM's `addresses`, an
    /// `ips`/`address` field): handing it out twice is then by design.
    pub fn configured_address(&self, ip: std::net::IpAddr) -> bool {
        crate::accounting::configured(self.net, ip)
    }

    /// The first plugin's `ipam.type`, when it delegates IPAM.
    pub fn ipam_type(&self) -> Option<String> {
        self.net
            .plugins
            .first()?
            .get("ipam")?
            .get("type")?
            .as_str()
            .map(String::from)
    }

    /// Builds a spy IPAM: a script that records each call and then runs the
    /// real IPAM plugin. Touch `<dir>/fail-<COMMAND>` to make it fail that
    /// command with a CNI error instead.
    pub fn spy_ipam(&self, real: &Path) -> Result<Spy, ConformError> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let dir = self.scratch.join(format!("spy-{n}"));
        let calls = dir.join("calls");
        std::fs::create_dir_all(&calls)?;
        let script = dir.join(SPY_NAME);
        let text = format!(
            "#!/bin/sh\n\
             # cnilab spy IPAM: records the call, then runs the real IPAM.\n\
             d='{calls}'\n\
             n=$(date +%s%N)-$$\n\
             cat > \"$d/$n.$CNI_COMMAND.stdin\"\n\
             env > \"$d/$n.$CNI_COMMAND.env\"\n\
             if [ -e '{dir}/fail-'\"$CNI_COMMAND\" ]; then\n\
               printf '{{\"code\":999,\"msg\":\"cnilab spy IPAM: injected %s failure\"}}' \"$CNI_COMMAND\"\n\
               exit 1\n\
             fi\n\
             out=$('{real}' < \"$d/$n.$CNI_COMMAND.stdin\")\n\
             rc=$?\n\
             printf '%s' \"$out\" > \"$d/$n.$CNI_COMMAND.stdout\"\n\
             printf '%s' \"$out\"\n\
             exit $rc\n",
            calls = calls.display(),
            dir = dir.display(),
            real = real.display(),
        );
        std::fs::write(&script, text)?;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
        Ok(Spy { dir, calls })
    }
}

impl Suite<'_> {
    /// `net` with its delegated IPAM replaced by a spy, and a runtime that
    /// finds the spy. `None` when the first plugin does not delegate IPAM.
    pub fn spied(&self, net: &NetworkConfig) -> Result<Option<Spied>, ConformError> {
        let Some(ipam) = self.ipam_type() else {
            return Ok(None);
        };
        let real = self.runtime.find_plugin(&ipam).map_err(Box::new)?;
        let spy = self.spy_ipam(&real)?;
        let runtime = Runtime::new(&spy.cni_path(&self.plugin_dir))
            .in_netns(self.host)
            .map_err(Box::new)?
            .with_timeout(self.runtime.timeout());
        let mut net = net.clone();
        if let Some(Value::Object(ipam)) = net.plugins[0].get_mut("ipam") {
            ipam.insert("type".into(), Value::String(SPY_NAME.into()));
        }
        Ok(Some(Spied { spy, runtime, net }))
    }

    /// Whether host-local's layout applies to this network's store: one
    /// sample pod's address shows up in it (asked once per group).
    pub fn layout_applies(&self) -> bool {
        *self.layout.get_or_init(|| {
            let Ok(pod) = self.pod() else { return false };
            let rt = RuntimeConf::new(&self.cid("layout"), Some(pod.path()), &self.ifname);
            let target = self.target();
            let applies = self
                .runtime
                .add(self.net, &rt)
                .is_ok_and(|a| target.layout_applies(&rt.container_id, &a.result));
            let _ = self.runtime.del(self.net, &rt);
            applies
        })
    }
}

/// A network whose IPAM calls go through a spy.
pub(crate) struct Spied {
    pub spy: Spy,
    pub runtime: Runtime,
    pub net: NetworkConfig,
}

/// The spy IPAM binary's name.
pub(crate) const SPY_NAME: &str = "cnilab-spy-ipam";

pub(crate) struct Spy {
    pub dir: PathBuf,
    calls: PathBuf,
}

/// One recorded IPAM call.
pub(crate) struct SpyCall {
    pub command: String,
    pub env: Vec<(String, String)>,
    pub stdin: String,
    /// What the real IPAM printed.
    pub stdout: String,
}

impl Spy {
    pub fn calls(&self) -> Vec<SpyCall> {
        let mut names: Vec<String> = std::fs::read_dir(&self.calls)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".env"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
            .iter()
            .filter_map(|name| {
                let stem = name.strip_suffix(".env")?;
                let command = stem.rsplit('.').next()?.to_string();
                let env = std::fs::read_to_string(self.calls.join(name)).ok()?;
                let stdin = std::fs::read_to_string(self.calls.join(format!("{stem}.stdin")))
                    .unwrap_or_default();
                let stdout = std::fs::read_to_string(self.calls.join(format!("{stem}.stdout")))
                    .unwrap_or_default();
                Some(SpyCall {
                    command,
                    env: env
                        .lines()
                        .filter_map(|l| l.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    stdin,
                    stdout,
                })
            })
            .collect()
    }

    pub fn fail(&self, command: &str, on: bool) {
        let marker = self.dir.join(format!("fail-{command}"));
        if on {
            let _ = std::fs::write(marker, "");
        } else {
            let _ = std::fs::remove_file(marker);
        }
    }

    /// A CNI_PATH that finds the spy first.
    pub fn cni_path(&self, plugin_dir: &str) -> String {
        format!("{}:{plugin_dir}", self.dir.display())
    }
}

impl SpyCall {
    pub fn var(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Reservation check helper used by several groups.
pub(crate) fn reserved(
    target: &Target<'_>,
    cid: &str,
    ifname: &str,
) -> Vec<host_state::Reservation> {
    target.reservations_of(cid, ifname)
}
