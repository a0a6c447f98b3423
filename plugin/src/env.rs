//! The `CNI_*` environment, parsed and validated before anything touches
//! disk or the kernel.

use crate::error::{CniError, Result};
use cnilab_net::spec::{check_ifname, code, valid_container_id};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn parse(text: &str) -> Option<Command> {
        Some(match text {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }
}

/// `CNI_ARGS` keys this plugin understands (kubelet sends the K8S_ ones).
const KNOWN_ARGS: &[&str] = &[
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: String,
    /// Empty when unset (DEL may omit it).
    pub netns: String,
    pub ifname: String,
    pub args: Vec<(String, String)>,
    /// The absolute `CNI_PATH` directories.
    pub path: Vec<PathBuf>,
    /// Relative `CNI_PATH` entries (`.`, `bin`): never searched (they would
    /// run a binary from whatever the current directory is); logged.
    pub ignored_path: Vec<String>,
}

impl CniEnv {
    /// Reads and validates the environment through `get` (a lookup such as
    /// `std::env::var`), per command: ADD/CHECK need container, netns and
    /// ifname; DEL needs container and ifname; VERSION, STATUS and GC need
    /// only the command.
    pub fn parse(get: &dyn Fn(&str) -> Option<String>) -> Result<CniEnv> {
        let command_text =
            get("CNI_COMMAND").ok_or_else(|| CniError::env("CNI_COMMAND is not set"))?;
        let command = Command::parse(&command_text).ok_or_else(|| {
            CniError::env(format!(
                "unknown CNI_COMMAND {command_text:?}: expected ADD, DEL, CHECK, VERSION, STATUS or GC"
            ))
        })?;
        let needs_attachment = matches!(command, Command::Add | Command::Del | Command::Check);
        let required = |key: &str, needed: bool| -> Result<String> {
            match get(key) {
                Some(v) if !v.is_empty() => Ok(v),
                _ if needed => Err(CniError::env(format!(
                    "{key} is not set: {} needs it",
                    command.as_str()
                ))),
                _ => Ok(String::new()),
            }
        };
        let container_id = required("CNI_CONTAINERID", needs_attachment)?;
        let netns = required(
            "CNI_NETNS",
            matches!(command, Command::Add | Command::Check),
        )?;
        let ifname = required("CNI_IFNAME", needs_attachment)?;
        if needs_attachment {
            if !valid_container_id(&container_id) {
                let shown: String = container_id.chars().take(64).collect();
                return Err(CniError::env(format!(
                    "CNI_CONTAINERID {shown:?}{} is invalid: it must match ^[A-Za-z0-9][A-Za-z0-9_.-]*$ and be at most {} bytes",
                    if container_id.len() > 64 { "…" } else { "" },
                    cnilab_net::spec::MAX_CONTAINER_ID
                )));
            }
            if let Err(why) = check_ifname(&ifname) {
                return Err(CniError::env(format!("CNI_IFNAME {ifname:?} {why}")));
            }
            if !netns.is_empty() && (netns.chars().any(char::is_control) || !netns.starts_with('/'))
            {
                return Err(CniError::env(format!(
                    "CNI_NETNS {netns:?} must be an absolute path to a network namespace, without control characters"
                )));
            }
        }
        let args = parse_args(&get("CNI_ARGS").unwrap_or_default())?;
        let cni_path = get("CNI_PATH").unwrap_or_default();
        let (absolute, relative): (Vec<&str>, Vec<&str>) = cni_path
            .split(':')
            .filter(|p| !p.is_empty())
            .partition(|p| p.starts_with('/'));
        Ok(CniEnv {
            command,
            container_id,
            netns,
            ifname,
            args,
            path: absolute.into_iter().map(PathBuf::from).collect(),
            ignored_path: relative.into_iter().map(str::to_string).collect(),
        })
    }
}

/// Parses `K=V;K=V`. Unknown keys are refused unless `IgnoreUnknown` is true.
pub fn parse_args(text: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for pair in text.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            CniError::env(format!(
                "CNI_ARGS: {pair:?} is not KEY=VALUE (pairs are separated by ';')"
            ))
        })?;
        out.push((k.to_string(), v.to_string()));
    }
    let ignore_unknown = out
        .iter()
        .any(|(k, v)| k == "IgnoreUnknown" && (v == "1" || v.eq_ignore_ascii_case("true")));
    if !ignore_unknown {
        if let Some((k, v)) = out.iter().find(|(k, _)| !KNOWN_ARGS.contains(&k.as_str())) {
            return Err(CniError::new(
                code::UNSUPPORTED_FIELD,
                format!(
                    "CNI_ARGS: unknown key {k:?} (value {v:?}); send IgnoreUnknown=1 to ignore it"
                ),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> Result<CniEnv> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CniEnv::parse(&|k| map.get(k).cloned())
    }

    const FULL: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    #[test]
    fn full_add_env_parses() {
        let env = env_of(FULL).expect("valid env");
        assert_eq!(env.command, Command::Add);
        assert_eq!(env.path.len(), 2);
    }

    #[rstest]
    #[case("CNI_COMMAND", None, 4, "CNI_COMMAND")]
    #[case("CNI_COMMAND", Some("FROB"), 4, "FROB")]
    #[case("CNI_CONTAINERID", None, 4, "CNI_CONTAINERID")]
    #[case("CNI_NETNS", None, 4, "CNI_NETNS")]
    #[case("CNI_IFNAME", None, 4, "CNI_IFNAME")]
    #[case("CNI_CONTAINERID", Some("../../etc"), 4, "CNI_CONTAINERID")]
    #[case("CNI_IFNAME", Some("a/b"), 4, "CNI_IFNAME")]
    #[case("CNI_IFNAME", Some("sixteen-bytes-xx"), 4, "CNI_IFNAME")]
    #[case("CNI_NETNS", Some("relative/path"), 4, "CNI_NETNS")]
    #[case("CNI_NETNS", Some("/var/run/netns/x\nforged log line"), 4, "CNI_NETNS")]
    #[case("CNI_IFNAME", Some("eth\u{1}"), 4, "CNI_IFNAME")]
    #[case("CNI_ARGS", Some("novalue"), 4, "CNI_ARGS")]
    #[case("CNI_ARGS", Some("FOO=bar"), 2, "FOO")]
    fn bad_env_is_refused(
        #[case] key: &str,
        #[case] value: Option<&str>,
        #[case] want_code: u32,
        #[case] named: &str,
    ) {
        let mut pairs: Vec<(&str, &str)> =
            FULL.iter().copied().filter(|(k, _)| *k != key).collect();
        if let Some(v) = value {
            pairs.push((key, v));
        }
        let err = env_of(&pairs).expect_err("must be refused");
        assert_eq!(err.code, want_code, "{err}");
        assert!(
            err.msg.contains(named),
            "message {:?} names {named}",
            err.msg
        );
    }

    #[test]
    fn relative_cni_path_entries_are_set_aside() {
        let mut pairs: Vec<(&str, &str)> = FULL
            .iter()
            .copied()
            .filter(|(k, _)| *k != "CNI_PATH")
            .collect();
        pairs.push(("CNI_PATH", ".:/opt/cni/bin:bin"));
        let env = env_of(&pairs).expect("valid env");
        assert_eq!(env.path, vec![PathBuf::from("/opt/cni/bin")]);
        assert_eq!(env.ignored_path, vec![".".to_string(), "bin".to_string()]);
    }

    #[test]
    fn del_does_not_need_netns() {
        let env = env_of(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
        ])
        .expect("DEL without netns");
        assert!(env.netns.is_empty());
    }

    #[test]
    fn version_needs_only_the_command() {
        assert!(env_of(&[("CNI_COMMAND", "VERSION")]).is_ok());
        assert!(env_of(&[("CNI_COMMAND", "GC")]).is_ok());
    }

    #[test]
    fn ignore_unknown_allows_any_key() {
        let args = parse_args("IgnoreUnknown=1;FOO=bar;K8S_POD_NAME=p").expect("accepted");
        assert_eq!(args.len(), 3);
    }
}
