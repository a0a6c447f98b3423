//! One module per CNI command; `run` dispatches and turns errors into the
//! spec's JSON error body.

pub mod add;
pub mod addresses;
pub mod check;
pub mod del;
pub mod delegate;
pub mod gc;
pub mod status;
pub mod version;

use crate::config::{self, IpamPlan, Plan};
use crate::env::{CniEnv, Command};
use crate::error::{CniError, Result};
pub use crate::notes::note;
use crate::notes::take_notes;
use cnilab_net::naming::fnv1a;
pub use cnilab_net::naming::host_veth_name;
use cnilab_net::spec::{self, code, CniResult, Version};
use std::io::Write;
use std::time::Instant;

/// The largest config accepted on stdin.
pub const MAX_STDIN: usize = 1 << 20;

/// What the binary prints and its exit status.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub exit_code: i32,
    /// One human line for the logs (stderr and `logFile`).
    pub log: String,
}

/// The ownership mark ADD writes into `IFLA_IFALIAS` of both ends of the
/// veth pair: `cnilab/<network hash>/<ifname>/<containerID>` (the network
/// as an 8-hex-digit FNV-1a hash, so the mark fits the kernel's 255 bytes;
/// neither an ifname nor a container ID can contain `/`). DEL and GC remove
/// only links marked for their own attachment (DEL) or network (GC), or
/// not marked at all.
pub fn ownership_mark(network: &str, container_id: &str, ifname: &str) -> String {
    format!(
        "{MARK_PREFIX}{}/{ifname}/{container_id}",
        network_hash(network)
    )
}

const MARK_PREFIX: &str = "cnilab/";

fn network_hash(network: &str) -> String {
    format!("{:08x}", fnv1a(network.as_bytes()) as u32)
}

/// Who a link belongs to, by its alias.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Marked for exactly this attachment.
    This,
    /// No cnilab mark (made by an older version, or the mark was lost).
    Unmarked,
    /// Marked for another attachment or another network.
    Other(String),
}

/// Classifies a link's alias against the mark of (network, container, ifname).
pub fn owner_of(alias: Option<&str>, mark: &str) -> Owner {
    match alias {
        Some(a) if a == mark => Owner::This,
        Some(a) if a.starts_with(MARK_PREFIX) => Owner::Other(a.to_string()),
        _ => Owner::Unmarked,
    }
}

/// True when `alias` is a cnilab ownership mark (of any attachment).
pub fn is_mark(alias: &str) -> bool {
    alias.starts_with(MARK_PREFIX)
}

/// The (containerID, ifname) a mark names, when it is a mark of `network`.
pub fn marked_attachment(alias: &str, network: &str) -> Option<(String, String)> {
    let rest = alias.strip_prefix(MARK_PREFIX)?;
    let (hash, rest) = rest.split_once('/')?;
    let (ifname, id) = rest.split_once('/')?;
    (hash == network_hash(network)).then(|| (id.to_string(), ifname.to_string()))
}

/// A log line with every control character escaped (`\n`, `\u{1b}`), so
/// input can never start a line of its own in a log.
pub fn escape_log(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Opens `CNI_NETNS` for ADD and CHECK: never blocks, must be a network
/// namespace (code 4 otherwise), and never the plugin's own namespace (the
/// runtime's, where the pod interface and its default route would land in
/// the host).
pub(crate) fn open_pod_netns(env: &CniEnv) -> Result<std::fs::File> {
    let ns = cnilab_net::netns::open_network_namespace(&env.netns)
        .map_err(|e| CniError::env(format!("CNI_NETNS {}: {e}", env.netns)))?;
    refuse_own_netns(env, &ns)?;
    Ok(ns)
}

/// Code 4 when `ns` is the plugin's own network namespace.
pub(crate) fn refuse_own_netns(env: &CniEnv, ns: &std::fs::File) -> Result<()> {
    match cnilab_net::netns::is_own_namespace(ns) {
        Ok(false) => Ok(()),
        Ok(true) => Err(CniError::env(format!(
            "CNI_NETNS {} is the plugin's own network namespace (the runtime's), not a pod's",
            env.netns
        ))),
        Err(e) => Err(CniError::env(format!("CNI_NETNS {}: {e}", env.netns))),
    }
}

/// A current-thread runtime: the plugin runs one operation and exits.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CniError::io(format!("start tokio runtime: {e}")))
}

/// The entry point for the binary: the raw environment block. A `CNI_*`
/// value that is not UTF-8 is refused with code 4 (converting it lossily
/// would turn `eth\xff` into another name).
pub fn run_with_os_vars(
    vars: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    stdin: &[u8],
) -> Outcome {
    let mut out = Vec::with_capacity(vars.len());
    for (k, v) in vars {
        let key = k.to_string_lossy().into_owned();
        match v.into_string() {
            Ok(v) => out.push((key, v)),
            Err(raw) if key.starts_with("CNI_") => {
                let version = config::sniff_version(stdin)
                    .filter(|v| spec::is_supported(v))
                    .unwrap_or_else(|| spec::CURRENT_VERSION.to_string());
                let e = CniError::env(format!(
                    "{key} {:?} is not valid UTF-8",
                    raw.to_string_lossy()
                ));
                return failure(&version, e, "env".into(), Instant::now());
            }
            Err(raw) => out.push((key, raw.to_string_lossy().into_owned())),
        }
    }
    run_with_vars(&out, stdin)
}

/// The entry point for a process: `vars` is the whole environment block in
/// order. A `CNI_*` variable given twice is ambiguous (libraries disagree on
/// which one wins) and refused with code 4.
pub fn run_with_vars(vars: &[(String, String)], stdin: &[u8]) -> Outcome {
    let mut seen: Vec<&str> = Vec::new();
    for (key, _) in vars.iter().filter(|(k, _)| k.starts_with("CNI_")) {
        if seen.contains(&key.as_str()) {
            let version = config::sniff_version(stdin)
                .filter(|v| spec::is_supported(v))
                .unwrap_or_else(|| spec::CURRENT_VERSION.to_string());
            let e = CniError::env(format!(
                "{key} is set more than once in the environment; set it once"
            ));
            return failure(&version, e, "env".into(), Instant::now());
        }
        seen.push(key);
    }
    let get = |key: &str| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    run(&get, stdin)
}

/// The plugin's entry point with its environment and stdin as parameters,
/// so that unit tests can drive it without a process.
pub fn run(get: &dyn Fn(&str) -> Option<String>, stdin: &[u8]) -> Outcome {
    let started = Instant::now();
    let sniffed = config::sniff_version(stdin)
        .filter(|v| spec::is_supported(v))
        .unwrap_or_else(|| spec::CURRENT_VERSION.to_string());
    let env = match CniEnv::parse(get) {
        Ok(env) => env,
        Err(e) => return failure(&sniffed, e, "env".into(), started),
    };
    let what = format!(
        "{} container={} netns={} ifname={}",
        env.command.as_str(),
        env.container_id,
        env.netns,
        env.ifname
    );
    for ignored in &env.ignored_path {
        note(format!(
            "CNI_PATH entry {ignored:?} ignored: only absolute directories are searched"
        ));
    }
    if stdin.len() > MAX_STDIN {
        let e = CniError::decode(format!("config on stdin is larger than {MAX_STDIN} bytes"));
        return failure(&sniffed, e, what, started);
    }
    if env.command == Command::Version {
        return version::run(stdin, what, started);
    }
    let plan = match config::parse(stdin) {
        Ok(p) => p,
        Err(e) => return failure(&sniffed, e, what, started),
    };
    let version_text = plan.version.to_string();
    let result = dispatch(&env, &plan);
    let notes = take_notes();
    let what = if notes.is_empty() {
        what
    } else {
        format!("{what} [{}]", notes.join("; "))
    };
    let outcome = match result {
        Ok(Some(res)) => {
            let text = serde_json::to_string(&res.to_version(plan.version))
                .unwrap_or_else(|e| format!("{{\"code\":999,\"msg\":\"encode result: {e}\"}}"));
            let ips: Vec<String> = res.ips.iter().map(|i| i.address.to_string()).collect();
            Outcome {
                stdout: text,
                exit_code: 0,
                log: format!(
                    "{what} ok ips=[{}] in {:?}",
                    ips.join(","),
                    started.elapsed()
                ),
            }
        }
        Ok(None) => Outcome {
            stdout: String::new(),
            exit_code: 0,
            log: format!("{what} ok in {:?}", started.elapsed()),
        },
        Err(e) => failure(&version_text, e, what, started),
    };
    write_log(plan.log_file.as_deref(), get, &outcome.log);
    outcome
}

fn dispatch(env: &CniEnv, plan: &Plan) -> Result<Option<CniResult>> {
    match env.command {
        Command::Add => add::run(env, plan).map(Some),
        Command::Del => del::run(env, plan).map(|()| None),
        Command::Check => check::run(env, plan).map(|()| None),
        Command::Status => status::run(env, plan).map(|()| None),
        Command::Gc => gc::run(env, plan).map(|()| None),
        Command::Version => Ok(None),
    }
}

fn failure(version: &str, e: CniError, what: String, started: Instant) -> Outcome {
    let body = e.body(version);
    Outcome {
        stdout: serde_json::to_string(&body).unwrap_or_default(),
        exit_code: 1,
        log: escape_log(&format!("{what} failed in {:?}: {e}", started.elapsed())),
    }
}

fn write_log(file: Option<&std::path::Path>, get: &dyn Fn(&str) -> Option<String>, line: &str) {
    let path = file
        .map(|p| p.to_path_buf())
        .or_else(|| get("CNILAB_LOG").filter(|s| !s.is_empty()).map(Into::into));
    if let Some(path) = path {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "cnilab-bridge: {}", escape_log(line));
        }
    }
}

/// STATUS and GC exist from 1.1.0 on; CHECK from 0.4.0 on.
pub(crate) fn require_version(plan: &Plan, min: Version, command: &str) -> Result<()> {
    if plan.version < min {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "{command} needs cniVersion {min} or later; the config says {}",
                plan.version
            ),
        ));
    }
    Ok(())
}

/// `prevResult` from the config, decoded.
pub(crate) fn prev_result(plan: &Plan) -> Result<Option<CniResult>> {
    match &plan.prev_result {
        None => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| CniError::decode(format!("prevResult is not a valid CNI result: {e}"))),
    }
}

/// Destinations that are never masqueraded: every configured range (or the
/// subnets of the addresses a delegated IPAM gave) plus `ipMasqExclude`.
pub(crate) fn subnets(plan: &Plan, ips: &[ipnet::IpNet]) -> Vec<ipnet::IpNet> {
    let mut nets: Vec<ipnet::IpNet> = match &plan.ipam {
        IpamPlan::Builtin(b) => b.range_sets.iter().flatten().map(|r| r.subnet).collect(),
        _ => ips.iter().map(|n| n.trunc()).collect(),
    };
    nets.extend(plan.ip_masq_exclude.iter().map(|n| n.trunc()));
    nets
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use std::collections::HashMap;

    fn run_with(pairs: &[(&str, &str)], stdin: &str) -> Outcome {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        run(&|k| map.get(k).cloned(), stdin.as_bytes())
    }

    #[test]
    fn ownership_marks_fit_and_name_their_attachment() {
        let long_id = "a".repeat(spec::MAX_CONTAINER_ID);
        let mark = ownership_mark(&"n".repeat(200), &long_id, "abcdefghijklmno");
        assert!(mark.len() < 256, "fits IFALIASZ: {}", mark.len());
        let mark = ownership_mark("net-a", "c1", "eth0");
        assert_eq!(owner_of(Some(&mark), &mark), Owner::This);
        assert_eq!(owner_of(None, &mark), Owner::Unmarked);
        assert_eq!(owner_of(Some("uplink to rack 3"), &mark), Owner::Unmarked);
        let other = ownership_mark("net-b", "c1", "eth0");
        assert_eq!(owner_of(Some(&other), &mark), Owner::Other(other.clone()));
        assert_eq!(
            marked_attachment(&mark, "net-a"),
            Some(("c1".to_string(), "eth0".to_string()))
        );
        assert_eq!(marked_attachment(&mark, "net-b"), None);
        assert!(is_mark(&other) && !is_mark("cnilab"));
    }

    #[test]
    fn log_lines_escape_control_characters() {
        assert_eq!(escape_log("a\nb\r\u{1b}c"), "a\\nb\\r\\u{1b}c");
        assert_eq!(escape_log("plain ünïcode"), "plain ünïcode");
    }

    #[test]
    fn non_utf8_cni_values_are_refused() {
        use std::os::unix::ffi::OsStringExt;
        let vars = vec![
            ("CNI_COMMAND".into(), "VERSION".into()),
            (
                "CNI_IFNAME".into(),
                std::ffi::OsString::from_vec(b"eth\xff".to_vec()),
            ),
        ];
        let out = run_with_os_vars(vars, b"");
        let body: spec::ErrorBody = serde_json::from_str(&out.stdout).expect("error body");
        assert_eq!(body.code, 4);
        assert!(body.msg.contains("CNI_IFNAME"), "{}", body.msg);
        let other = vec![
            ("CNI_COMMAND".into(), "VERSION".into()),
            (
                "LANG".into(),
                std::ffi::OsString::from_vec(b"x\xff".to_vec()),
            ),
        ];
        assert_eq!(run_with_os_vars(other, b"").exit_code, 0);
    }

    #[rstest]
    #[case::unknown_command(&[("CNI_COMMAND", "FROB")], "{}", 4)]
    #[case::missing_ifname(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "a"), ("CNI_NETNS", "/x")], r#"{"cniVersion":"1.1.0","name":"n"}"#, 4)]
    #[case::bad_json(&[("CNI_COMMAND", "STATUS")], "{", 6)]
    #[case::missing_name(&[("CNI_COMMAND", "STATUS")], r#"{"cniVersion":"1.1.0"}"#, 7)]
    #[case::status_old(&[("CNI_COMMAND", "STATUS")], r#"{"cniVersion":"1.0.0","name":"n"}"#, 1)]
    #[case::gc_old(&[("CNI_COMMAND", "GC")], r#"{"cniVersion":"0.4.0","name":"n"}"#, 1)]
    #[case::check_old(&[("CNI_COMMAND", "CHECK"), ("CNI_CONTAINERID", "a"), ("CNI_NETNS", "/x"), ("CNI_IFNAME", "eth0")], r#"{"cniVersion":"0.3.1","name":"n"}"#, 1)]
    #[case::check_without_prev(&[("CNI_COMMAND", "CHECK"), ("CNI_CONTAINERID", "a"), ("CNI_NETNS", "/x"), ("CNI_IFNAME", "eth0")], r#"{"cniVersion":"1.0.0","name":"n"}"#, 7)]
    fn errors_are_json_with_code(
        #[case] env: &[(&str, &str)],
        #[case] stdin: &str,
        #[case] want: u32,
    ) {
        let out = run_with(env, stdin);
        assert_ne!(out.exit_code, 0);
        let body: spec::ErrorBody = serde_json::from_str(&out.stdout).expect("error body is JSON");
        assert_eq!(body.code, want, "{}", out.stdout);
        assert!(body.cni_version.is_some());
        assert!(!body.msg.is_empty());
    }

    #[test]
    fn a_doubled_cni_variable_is_refused() {
        let vars: Vec<(String, String)> = [
            ("CNI_COMMAND", "VERSION"),
            ("PATH", "/bin"),
            ("CNI_COMMAND", "DEL"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let out = run_with_vars(&vars, b"");
        assert_ne!(out.exit_code, 0);
        let body: spec::ErrorBody = serde_json::from_str(&out.stdout).expect("error body");
        assert_eq!(body.code, 4);
        assert!(body.msg.contains("CNI_COMMAND"));
        let once = run_with_vars(&vars[..2], b"");
        assert_eq!(once.exit_code, 0, "{}", once.stdout);
    }

    #[test]
    fn version_echoes_input_version() {
        let out = run_with(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(out.exit_code, 0);
        let info: spec::VersionInfo = serde_json::from_str(&out.stdout).expect("version info");
        assert_eq!(info.cni_version, "0.4.0");
        assert_eq!(info.supported_versions, spec::SUPPORTED_VERSIONS);
        let out = run_with(&[("CNI_COMMAND", "VERSION")], "");
        let info: spec::VersionInfo = serde_json::from_str(&out.stdout).expect("version info");
        assert_eq!(info.cni_version, spec::CURRENT_VERSION);
    }
}
