//! The hostile-input corpus (`tests/corpus/*.json`): one bad invocation per
//! file, with the error code the plugin must answer, and the runner that
//! executes a case against a plugin binary inside throwaway namespaces and
//! checks everything a bad input must not do.
//!
//! A case file:
//!
//! ```json
//! {
//!   "description": "what is wrong and why the code",
//!   "generic": true,
//!   "command": "ADD",
//!   "env": {"CNI_IFNAME": "a/b", "CNI_NETNS": null},
//!   "env_extra": [["CNI_COMMAND", "FROB"]],
//!   "stdin": {"base": {"cniVersion": "9.9.9"}},
//!   "code": 1,
//!   "generic_codes": [1],
//!   "known_defect": "why cnilab-bridge does not pass this yet",
//!   "found_by": "fuzz:config_parse"
//! }
//! ```
//!
//! - `env` overrides the standard environment (`CNI_COMMAND` = `command`,
//!   `CNI_CONTAINERID=corpus-case`, `CNI_NETNS` = a pod namespace,
//!   `CNI_IFNAME=eth0`, `CNI_ARGS=IgnoreUnknown=1`, `CNI_PATH` = the plugin's
//!   directory); `null` removes a variable. `env_extra` appends raw entries,
//!   so a variable can appear twice in the environment block.
//! - `stdin` is one of `{"base": patch}` (a JSON merge patch, RFC 7396,
//!   applied to the plugin's own valid config), `{"json": value}`,
//!   `{"text": "..."}`, `{"file": "name"}` (bytes of a file next to the
//!   case, e.g. a fuzzer finding) or `{"mode": "closed" | "empty" |
//!   "endless" | "huge"}` (fd 0 closed, `/dev/null`, a stream that never
//!   ends, a valid config larger than any sane limit).
//! - Strings in `env`, `text` and `json`/`base` values may use `{netns}`,
//!   `{dataDir}` (the scratch IPAM directory), `{file}` (a regular file),
//!   `{cniPath}` and `{repeat:N:TEXT}` (TEXT N times).
//! - `code` is what cnilab-bridge answers; `generic` cases are
//!   plugin-agnostic and are what `cnilab conform` may run against any
//!   plugin, accepting `generic_codes` (default `[code]`; `[]` = any code).
//! - `known_defect`: cnilab-bridge does not handle this input as documented
//!   yet; the corpus test reports it and fails once it is fixed, so the
//!   marker cannot go stale.

use crate::netns::{NetState, Netns};
use crate::runtime::spawn::{Input, Launch};
use cnilab_net::spec::ErrorBody;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("corpus case {path}: {reason}")]
    Case { path: PathBuf, reason: String },
    #[error("corpus directory {path} (--corpus DIR): {reason}")]
    Dir { path: PathBuf, reason: String },
    #[error("cannot run the plugin {plugin}: {reason}")]
    Spawn { plugin: PathBuf, reason: String },
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
}

/// How stdin is fed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamMode {
    /// File descriptor 0 is closed.
    Closed,
    /// `/dev/null`: immediate end of file.
    Empty,
    /// A pipe that keeps delivering a config that never ends.
    Endless,
    /// A valid config padded to 4 MiB.
    Huge,
}

/// The stdin of a case.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StdinSpec {
    Base(Value),
    Json(Value),
    Text(String),
    File(String),
    Mode(StreamMode),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    description: String,
    #[serde(default)]
    generic: bool,
    #[serde(default = "default_command")]
    command: String,
    #[serde(default)]
    env: BTreeMap<String, Option<String>>,
    #[serde(default)]
    env_extra: Vec<(String, String)>,
    stdin: StdinSpec,
    code: u32,
    #[serde(default)]
    generic_codes: Option<Vec<u32>>,
    #[serde(default)]
    known_defect: Option<String>,
    #[serde(default)]
    found_by: Option<String>,
}

fn default_command() -> String {
    "ADD".into()
}

/// One bad invocation.
#[derive(Clone, Debug)]
pub struct Case {
    /// The file name without `.json`.
    pub name: String,
    pub description: String,
    pub generic: bool,
    pub command: String,
    pub env: BTreeMap<String, Option<String>>,
    pub env_extra: Vec<(String, String)>,
    pub stdin: StdinSpec,
    /// cnilab-bridge's documented code.
    pub code: u32,
    /// Codes any plugin may answer (empty: any code).
    pub generic_codes: Vec<u32>,
    pub known_defect: Option<String>,
    pub found_by: Option<String>,
    /// Where `{"file": ...}` stdin is looked up.
    pub dir: PathBuf,
}

/// How long a plugin may keep reading an endless stdin. A plugin that caps
/// its input answers within milliseconds; one that keeps reading is still
/// reading after this, and waiting longer cannot change the verdict.
pub const ENDLESS_STDIN_BOUND: Duration = Duration::from_secs(1);

impl Case {
    /// Whether stdin never ends.
    pub fn is_endless(&self) -> bool {
        matches!(self.stdin, StdinSpec::Mode(StreamMode::Endless))
    }

    /// The time this case gets: `timeout`, or [`ENDLESS_STDIN_BOUND`] when
    /// stdin never ends (hang or cap is decided within that bound).
    pub fn timeout_within(&self, timeout: Duration) -> Duration {
        if self.is_endless() {
            timeout.min(ENDLESS_STDIN_BOUND)
        } else {
            timeout
        }
    }
}

/// Loads every `*.json` case of `dir`, sorted by name.
pub fn load_dir(dir: &Path) -> Result<Vec<Case>, CorpusError> {
    let paths: Vec<PathBuf> = crate::assets::list(dir)
        .map_err(|e| CorpusError::Dir {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        })?
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.iter().map(|p| load_case(p)).collect()
}

/// Loads one case file.
pub fn load_case(path: &Path) -> Result<Case, CorpusError> {
    let bad = |reason: String| CorpusError::Case {
        path: path.to_path_buf(),
        reason,
    };
    let text = crate::assets::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let file: CaseFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if let StdinSpec::File(name) = &file.stdin {
        if name.contains('/') || name.starts_with('.') {
            return Err(bad(format!(
                "stdin file {name:?} must be a plain file name"
            )));
        }
    }
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Case {
        name,
        description: file.description,
        generic: file.generic,
        command: file.command,
        env: file.env,
        env_extra: file.env_extra,
        stdin: file.stdin,
        code: file.code,
        generic_codes: file.generic_codes.unwrap_or_else(|| vec![file.code]),
        known_defect: file.known_defect,
        found_by: file.found_by,
        dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
    })
}

/// Where and against what a corpus case runs (its venue: the namespaces,
/// the plugin, the valid config it patches, the paths it may name).
pub struct Venue<'a> {
    /// Where the plugin runs (stands for the node).
    pub host: &'a Netns,
    /// The namespace `{netns}` names.
    pub pod: &'a Netns,
    pub plugin: &'a Path,
    /// `CNI_PATH` (`{cniPath}`).
    pub cni_path: String,
    /// The plugin's valid config, with its `ipam.dataDir` at `data_dir`.
    pub base: &'a Value,
    pub data_dir: &'a Path,
    /// A regular file (`{file}`).
    pub a_file: &'a Path,
    /// A directory whose whole tree must stay unchanged (holds `data_dir`
    /// and `a_file`, so a traversal out of `data_dir` shows up too).
    pub watched: &'a Path,
    pub timeout: Duration,
}

/// Which expectation a run is held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// cnilab-bridge's documented code.
    Documented,
    /// Any of the case's generic codes (a plugin-agnostic check).
    Generic,
}

/// What happened, and every way it differs from what a bad input must get.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CaseRun {
    pub case: String,
    /// The plugin process, as the runtime records every execution.
    #[serde(flatten)]
    pub exec: crate::runtime::Execution,
    pub error: Option<ErrorBody>,
    /// Empty when the plugin handled the input as it must.
    pub problems: Vec<String>,
}

impl CaseRun {
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Expands `{netns}`, `{dataDir}`, `{file}`, `{cniPath}`, `{repeat:N:TEXT}`.
pub fn expand(text: &str, venue: &Venue<'_>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let key = &after[..end];
        let replaced = match key {
            "netns" => Some(venue.pod.path().to_string_lossy().into_owned()),
            "dataDir" => Some(venue.data_dir.to_string_lossy().into_owned()),
            "file" => Some(venue.a_file.to_string_lossy().into_owned()),
            "cniPath" => Some(venue.cni_path.clone()),
            _ => key.strip_prefix("repeat:").and_then(|spec| {
                let (n, unit) = spec.split_once(':')?;
                let n: usize = n.parse().ok()?;
                Some(unit.repeat(n.min(1 << 24)))
            }),
        };
        match replaced {
            Some(r) => {
                out.push_str(&r);
                rest = &after[end + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn expand_json(value: &Value, venue: &Venue<'_>) -> Value {
    match value {
        Value::String(s) => Value::String(expand(s, venue)),
        Value::Array(a) => Value::Array(a.iter().map(|v| expand_json(v, venue)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), expand_json(v, venue)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// RFC 7396 JSON merge patch: objects merge, `null` removes, anything else
/// replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The environment block of a case, in order, duplicates kept.
pub fn environment(case: &Case, venue: &Venue<'_>) -> Vec<(String, String)> {
    let mut env: Vec<(String, Option<String>)> = vec![
        ("CNI_COMMAND".into(), Some(case.command.clone())),
        ("CNI_CONTAINERID".into(), Some("corpus-case".into())),
        (
            "CNI_NETNS".into(),
            Some(venue.pod.path().to_string_lossy().into_owned()),
        ),
        ("CNI_IFNAME".into(), Some("eth0".into())),
        ("CNI_ARGS".into(), Some("IgnoreUnknown=1".into())),
        ("CNI_PATH".into(), Some(venue.cni_path.clone())),
    ];
    for (k, v) in &case.env {
        match env.iter_mut().find(|(key, _)| key == k) {
            Some(slot) => slot.1 = v.clone(),
            None => env.push((k.clone(), v.clone())),
        }
    }
    let mut out: Vec<(String, String)> = env
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, expand(&v, venue))))
        .collect();
    out.extend(
        case.env_extra
            .iter()
            .map(|(k, v)| (k.clone(), expand(v, venue))),
    );
    out
}

/// What goes to the plugin's fd 0.
enum Feed {
    Bytes(Vec<u8>),
    Closed,
    Empty,
    Endless,
}

fn feed(case: &Case, venue: &Venue<'_>) -> Result<(Feed, String), CorpusError> {
    let bad = |reason: String| CorpusError::Case {
        path: case.dir.join(format!("{}.json", case.name)),
        reason,
    };
    Ok(match &case.stdin {
        StdinSpec::Base(patch) => {
            let mut v = venue.base.clone();
            merge_patch(&mut v, &expand_json(patch, venue));
            let text = v.to_string();
            (Feed::Bytes(text.clone().into_bytes()), text)
        }
        StdinSpec::Json(v) => {
            let text = expand_json(v, venue).to_string();
            (Feed::Bytes(text.clone().into_bytes()), text)
        }
        StdinSpec::Text(t) => {
            let text = expand(t, venue);
            (Feed::Bytes(text.clone().into_bytes()), text)
        }
        StdinSpec::File(name) => {
            let bytes = crate::assets::read(&case.dir.join(name))
                .map_err(|e| bad(format!("stdin file {name}: {e}")))?;
            let shown = format!("<{} bytes of {name}>", bytes.len());
            (Feed::Bytes(bytes), shown)
        }
        StdinSpec::Mode(StreamMode::Closed) => (Feed::Closed, "<fd 0 closed>".into()),
        StdinSpec::Mode(StreamMode::Empty) => (Feed::Empty, "</dev/null>".into()),
        StdinSpec::Mode(StreamMode::Endless) => (Feed::Endless, "<endless stream>".into()),
        StdinSpec::Mode(StreamMode::Huge) => {
            let mut v = venue.base.clone();
            merge_patch(
                &mut v,
                &serde_json::json!({ "padding": "x".repeat(4 << 20) }),
            );
            let bytes = v.to_string().into_bytes();
            let shown = format!("<valid config padded to {} bytes>", bytes.len());
            (Feed::Bytes(bytes), shown)
        }
    })
}

/// Every file and directory under `root`: path → (mode, size, content).
fn tree(root: &Path) -> BTreeMap<PathBuf, (u32, u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let content = if meta.is_file() {
                std::fs::read(&path).unwrap_or_default()
            } else {
                Vec::new()
            };
            if meta.is_dir() {
                stack.push(path.clone());
            }
            out.insert(path, (meta.permissions().mode(), meta.size(), content));
        }
    }
    out
}

fn differences(label: &str, before: &NetState, after: &NetState) -> Vec<String> {
    let mut out: Vec<String> = after
        .added_since(before, &[])
        .into_iter()
        .map(|d| format!("{label}: {d}"))
        .collect();
    out.extend(
        before
            .added_since(after, &[])
            .into_iter()
            .map(|d| format!("{label}: removed: {}", d.trim_start_matches("new "))),
    );
    out
}

/// How [`run_case`] starts a problem that is a change in the host
/// namespace's links, addresses or routes.
pub const HOST_NETNS: &str = "host netns";

/// Runs one case and lists every problem: a zero exit, no JSON error on
/// stdout, another code than expected, a panic, a signal or a timeout, and
/// any change in the host namespace (links, addresses, routes, firewall
/// rules), the pod namespace or the watched tree.
pub fn run_case(case: &Case, venue: &Venue<'_>, expect: Expect) -> Result<CaseRun, CorpusError> {
    let env = environment(case, venue);
    let (input, shown) = feed(case, venue)?;
    let host_before = venue.host.snapshot()?;
    let pod_before = venue.pod.snapshot()?;
    let tree_before = tree(venue.watched);
    let rules_before = crate::host_state::firewall_rules(venue.host);
    let timeout = case.timeout_within(venue.timeout);
    let raw = spawn(venue, &env, input, timeout)?;
    let host_after = venue.host.snapshot()?;
    let pod_after = venue.pod.snapshot()?;
    let tree_after = tree(venue.watched);
    let rules_after = crate::host_state::firewall_rules(venue.host);

    let mut problems = Vec::new();
    let error: Option<ErrorBody> = serde_json::from_slice(raw.stdout.trim_ascii()).ok();
    let stdout = String::from_utf8_lossy(&raw.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&raw.stderr).into_owned();
    if raw.timed_out && case.is_endless() {
        problems.push(format!(
            "still reading an endless stdin after {timeout:?}: killed (a plugin must cap what it reads)"
        ));
    } else if raw.timed_out {
        problems.push(format!("no answer within {timeout:?}: killed"));
    } else if let Some(sig) = raw.signal {
        problems.push(format!("killed by signal {sig}"));
    } else if raw.exit_code == Some(0) {
        problems.push("exit 0: the bad input was accepted".into());
    }
    if stderr.contains("panicked at") || raw.exit_code == Some(101) {
        problems.push(format!("panicked: {}", stderr.trim()));
    }
    if !raw.timed_out && raw.exit_code != Some(0) {
        match &error {
            None => problems.push(format!(
                "stdout is not a CNI error body: {:?}",
                stdout.chars().take(300).collect::<String>()
            )),
            Some(body) => {
                let allowed: &[u32] = match expect {
                    Expect::Documented => std::slice::from_ref(&case.code),
                    Expect::Generic => &case.generic_codes,
                };
                if !allowed.is_empty() && !allowed.contains(&body.code) {
                    problems.push(format!(
                        "code {} ({}), expected {}",
                        body.code,
                        body.msg,
                        allowed
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(" or ")
                    ));
                }
                if body.msg.trim().is_empty() {
                    problems.push("the error body has an empty msg".into());
                }
            }
        }
    }
    problems.extend(differences(HOST_NETNS, &host_before, &host_after));
    problems.extend(differences("pod netns", &pod_before, &pod_after));
    if let (Some(before), Some(after)) = (&rules_before, &rules_after) {
        for rule in crate::host_state::new_lines(before, after) {
            problems.push(format!("host firewall: new rule {rule}"));
        }
        for rule in crate::host_state::new_lines(after, before) {
            problems.push(format!("host firewall: removed rule {rule}"));
        }
    }
    let paths: BTreeSet<&PathBuf> = tree_before.keys().chain(tree_after.keys()).collect();
    for p in paths {
        match (tree_before.get(p), tree_after.get(p)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(_), Some(_)) => problems.push(format!("changed: {}", p.display())),
            (None, Some(_)) => problems.push(format!("created: {}", p.display())),
            (Some(_), None) => problems.push(format!("removed: {}", p.display())),
            (None, None) => {}
        }
    }
    Ok(CaseRun {
        case: case.name.clone(),
        exec: crate::runtime::Execution {
            plugin: venue.plugin.to_path_buf(),
            env,
            stdin: shown.chars().take(2000).collect(),
            stdout,
            stderr,
            exit_code: raw.exit_code,
            signal: raw.signal,
            timed_out: raw.timed_out,
            duration: raw.duration,
            cut: raw.cut,
            leftover: raw.leftover,
            cpu: None,
        },
        error,
        problems,
    })
}

struct Raw {
    cut: Option<String>,
    leftover: Option<String>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    duration: Duration,
}

/// Runs the plugin inside the host namespace with exactly `env` as its
/// environment block (duplicates included, which `Command::env` cannot
/// express) and `input` on fd 0, started as the runtime starts a plugin
/// ([`Launch`]). No shell is involved.
fn spawn(
    venue: &Venue<'_>,
    env: &[(String, String)],
    input: Feed,
    timeout: Duration,
) -> Result<Raw, CorpusError> {
    let fail = |reason: String| CorpusError::Spawn {
        plugin: venue.plugin.to_path_buf(),
        reason,
    };
    let mut block: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    block.push(format!("PATH={}", crate::runtime::DEFAULT_PATH));
    let scope = crate::runtime::scope::CallScope::new();
    let launch = Launch::new(venue.plugin)
        .and_then(|l| l.env_block(block))
        // A relative path from the input then lands in the watched tree.
        .and_then(|l| l.current_dir(venue.watched))
        .map_err(|e| fail(e.to_string()))?
        .input(match input {
            Feed::Bytes(_) | Feed::Endless => Input::Piped,
            Feed::Empty => Input::Null,
            Feed::Closed => Input::Closed,
        })
        .into_cgroup(scope.procs_fd());
    let started = Instant::now();
    let child = launch
        .spawn_in(Some(venue.host.file()))
        .map_err(|e| fail(e.to_string()))?;
    let out = crate::runtime::collect_child(child, started, timeout, &scope, move |mut pipe| {
        match input {
            Feed::Bytes(bytes) => {
                let _ = pipe.write_all(&bytes);
            }
            Feed::Endless => {
                // A config whose string never closes; ends when the
                // plugin closes its end (EPIPE).
                let _ = pipe.write_all(br#"{"cniVersion":"1.1.0","name":"endless","pad":""#);
                let chunk = [b'x'; 64 * 1024];
                while pipe.write_all(&chunk).is_ok() {}
            }
            Feed::Closed | Feed::Empty => {}
        }
    })
    .map_err(|e| fail(e.to_string()))?;
    Ok(Raw {
        cut: out.cut(),
        leftover: out.leftover,
        stdout: out.stdout,
        stderr: out.stderr,
        exit_code: out.status.code(),
        signal: out.status.signal(),
        timed_out: out.killed,
        duration: out.duration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut v = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]});
        merge_patch(
            &mut v,
            &json!({"a": null, "b": {"c": 9}, "e": {"x": 1}, "f": "new"}),
        );
        assert_eq!(v, json!({"b": {"c": 9, "d": 3}, "e": {"x": 1}, "f": "new"}));
        let mut s = json!({"a": 1});
        merge_patch(&mut s, &json!("text"));
        assert_eq!(s, json!("text"));
    }

    #[test]
    fn every_case_in_the_corpus_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus");
        let cases = load_dir(&dir).expect("corpus loads");
        assert!(cases.len() >= 60, "only {} cases", cases.len());
        let names: BTreeSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.len(), cases.len());
        for c in &cases {
            assert!(!c.description.is_empty(), "{}", c.name);
            if let StdinSpec::File(f) = &c.stdin {
                assert!(c.dir.join(f).is_file(), "{}: missing {f}", c.name);
            }
        }
        assert!(cases.iter().any(|c| c.generic));
    }

    #[test]
    fn unknown_fields_in_a_case_are_refused() {
        let dir = crate::util::ScratchDir::new("corpus-test").expect("scratch");
        let path = dir.path().join("x.json");
        std::fs::write(
            &path,
            r#"{"description":"d","stdin":{"text":""},"code":6,"cdoe":1}"#,
        )
        .expect("write");
        assert!(load_case(&path).is_err());
        std::fs::write(
            &path,
            r#"{"description":"d","stdin":{"file":"../etc/passwd"},"code":6}"#,
        )
        .expect("write");
        assert!(load_case(&path).is_err());
    }
}
