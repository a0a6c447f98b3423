//! The environment parser on arbitrary `CNI_*` values, and the plugin's
//! whole entry point (`commands::run`) for the commands that touch neither
//! disk nor kernel (VERSION, unknown or missing commands): no panic, the
//! answer is always one JSON document, exit 0 exactly when it is not an
//! error body, and only the documented codes.

#![no_main]

use cnilab_plugin::commands;
use cnilab_plugin::env::{parse_args, CniEnv, Command};
use cnilab_net::spec::{
    check_ifname, valid_container_id, ErrorBody, VersionInfo, SUPPORTED_VERSIONS,
};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

const KEYS: [&str; 6] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

fuzz_target!(|data: &[u8]| {
    // Fields separated by 0xff: six variables (an empty field unsets it),
    // then stdin.
    let mut parts = data.splitn(KEYS.len() + 1, |b| *b == 0xff);
    let mut env: HashMap<String, String> = HashMap::new();
    for key in KEYS {
        match parts.next() {
            Some(v) if !v.is_empty() => {
                env.insert(key.to_string(), String::from_utf8_lossy(v).into_owned());
            }
            _ => {}
        }
    }
    let stdin = parts.next().unwrap_or_default();
    let get = |k: &str| env.get(k).cloned();

    if let Some(args) = env.get("CNI_ARGS") {
        let _ = parse_args(args);
    }
    if let Ok(parsed) = CniEnv::parse(&get) {
        if matches!(parsed.command, Command::Add | Command::Del | Command::Check) {
            assert!(
                valid_container_id(&parsed.container_id),
                "{:?}",
                parsed.container_id
            );
            assert!(check_ifname(&parsed.ifname).is_ok(), "{:?}", parsed.ifname);
            assert!(parsed.netns.is_empty() || parsed.netns.starts_with('/'));
            assert!(!parsed.netns.contains('\0'));
        }
    }

    // Only what cannot reach the disk or the kernel goes through run().
    let harmless = match env.get("CNI_COMMAND") {
        None => true,
        Some(c) => Command::parse(c).is_none_or(|c| c == Command::Version),
    };
    if !harmless {
        return;
    }
    let out = commands::run(&get, stdin);
    if out.exit_code == 0 {
        let info: VersionInfo = serde_json::from_str(&out.stdout).expect("VERSION answers JSON");
        assert!(SUPPORTED_VERSIONS.contains(&info.cni_version.as_str()));
        assert_eq!(info.supported_versions, SUPPORTED_VERSIONS);
    } else {
        let body: ErrorBody = serde_json::from_str(&out.stdout).expect("errors are JSON bodies");
        assert!(!body.msg.is_empty());
        // Why a VERSION (or unknown command) may fail: the command itself
        // (4), CNI_ARGS, which is parsed for every command (4 or 2, exactly
        // as parse_args answers), or an oversized stdin (6).
        let command_ok = env.get("CNI_COMMAND").is_some_and(|c| c == "VERSION");
        let args_error = env.get("CNI_ARGS").and_then(|a| parse_args(a).err());
        match (command_ok, args_error) {
            (false, _) => assert_eq!(body.code, 4, "{}", body.msg),
            (true, Some(e)) => assert_eq!(body.code, e.code, "{}", body.msg),
            (true, None) => {
                assert_eq!(body.code, 6, "{}", body.msg);
                assert!(stdin.len() > commands::MAX_STDIN);
            }
        }
    }
});
