//! Runtime tests: chaining and caching (root, reference bridge + a script
//! plugin that echoes its prevResult), and how plugin failures are typed.

mod common;

use cnilab_harness::runtime::{CniCommand, RuntimeError};
use common::*;
use rstest::rstest;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Writes an executable script plugin into `dir`.
fn script(dir: &Path, name: &str, body: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A chained plugin that records its stdin and environment per command and
/// echoes `prevResult` (plus one interface of its own) on ADD.
fn echo_plugin(dir: &Path, record: &Path) {
    let body = format!(
        r#"rec='{rec}'
n=$(date +%s%N)
cat > "$rec/$n.$CNI_COMMAND.stdin"
env > "$rec/$n.$CNI_COMMAND.env"
[ "$CNI_COMMAND" = ADD ] || exit 0
exec python3 -c '
import json, sys
conf = json.load(open(sys.argv[1]))
res = conf["prevResult"]
res.setdefault("interfaces", []).append({{"name": "echo0"}})
print(json.dumps(res))
' "$rec/$n.$CNI_COMMAND.stdin"
"#,
        rec = record.display()
    );
    script(dir, "cnilab-echo", &body);
}

/// Recorded calls of one command, oldest first: (stdin JSON, env text).
fn recorded(record: &Path, command: &str) -> Vec<(Value, String)> {
    let mut names: Vec<String> = std::fs::read_dir(record)
        .expect("record dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(&format!(".{command}.stdin")))
        .collect();
    names.sort();
    names
        .iter()
        .map(|n| {
            let stdin = std::fs::read_to_string(record.join(n)).expect("stdin");
            let env =
                std::fs::read_to_string(record.join(n.replace(".stdin", ".env"))).expect("env");
            (serde_json::from_str(&stdin).expect("stdin is JSON"), env)
        })
        .collect()
}

#[rstest]
fn chains_prev_result_and_caches_the_final_result(host: Netns, pod: Netns) {
    let _host = host_untouched();
    require_reference();
    assert!(
        std::process::Command::new("python3")
            .arg("-V")
            .output()
            .is_ok(),
        "the echo test plugin needs python3"
    );
    let plugins = tempfile::tempdir().expect("tmp");
    let record = tempfile::tempdir().expect("tmp");
    let store = tempfile::tempdir().expect("tmp");
    let cache = tempfile::tempdir().expect("tmp");
    echo_plugin(plugins.path(), record.path());
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"chain","plugins":[
            {{"type":"bridge","bridge":"t-br0","isGateway":true,
              "ipam":{{"type":"host-local","subnet":"10.66.0.0/24","dataDir":"{}"}}}},
            {{"type":"cnilab-echo"}}]}}"#,
        store.path().display()
    );
    let net = NetworkConfig::parse(&conf, Path::new("chain.conflist")).expect("config");
    let cni_path = format!("{}:{REFERENCE_DIR}", plugins.path().display());
    let runtime = runtime_in(&host, &cni_path).with_cache_dir(cache.path());
    let mut rt = RuntimeConf::new("chain-1", Some(pod.path()), "eth0");
    rt.args.push(("K8S_POD_NAME".into(), "p1".into()));

    let added = runtime.add(&net, &rt).expect("ADD through the chain");
    assert_eq!(added.executions.len(), 2);
    let bridge_out: Value =
        serde_json::from_str(&added.executions[0].stdout).expect("bridge result");
    let bridge_stdin: Value =
        serde_json::from_str(&added.executions[0].stdin).expect("bridge stdin");
    assert!(
        bridge_stdin.get("prevResult").is_none(),
        "the first plugin gets no prevResult"
    );
    let adds = recorded(record.path(), "ADD");
    assert_eq!(adds.len(), 1);
    assert_eq!(
        adds[0].0["prevResult"], bridge_out,
        "plugin 2 gets plugin 1's result"
    );
    assert_eq!(adds[0].0["name"], "chain");
    assert_eq!(adds[0].0["cniVersion"], "1.0.0");
    assert!(
        adds[0]
            .1
            .contains("CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAME=p1"),
        "{}",
        adds[0].1
    );
    assert!(
        added.result.interfaces.iter().any(|i| i.name == "echo0"),
        "final result is the last plugin's"
    );
    assert!(added.result.interfaces.iter().any(|i| i.name == "eth0"));

    // The final result is cached, in memory and on disk.
    assert_eq!(runtime.cached_result(&net, &rt), Some(added.raw.clone()));
    let cached_files: Vec<_> = std::fs::read_dir(cache.path())
        .expect("cache")
        .flatten()
        .collect();
    assert_eq!(cached_files.len(), 1);

    // CHECK and DEL get the cached final result as prevResult.
    runtime.check(&net, &rt).expect("CHECK");
    let checks = recorded(record.path(), "CHECK");
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].0["prevResult"], added.raw);
    let dels = runtime.del(&net, &rt).expect("DEL");
    assert_eq!(dels.len(), 2);
    assert!(
        dels[0].plugin.ends_with("cnilab-echo"),
        "DEL runs the chain in reverse"
    );
    let del_records = recorded(record.path(), "DEL");
    assert_eq!(del_records[0].0["prevResult"], added.raw);
    assert_eq!(
        runtime.cached_result(&net, &rt),
        None,
        "DEL drops the cache entry"
    );
    assert_eq!(std::fs::read_dir(cache.path()).expect("cache").count(), 0);
    assert!(!pod.links().expect("links").iter().any(|l| l.name == "eth0"));

    // A fresh runtime with the same cache dir finds cached results on disk.
    runtime.add(&net, &rt).expect("ADD again");
    let again = runtime_in(&host, &cni_path).with_cache_dir(cache.path());
    assert!(again.cached_result(&net, &rt).is_some());
    again.del(&net, &rt).expect("DEL from the second runtime");
}

#[rstest]
fn honours_disable_check(host: Netns) {
    let _host = host_untouched();
    let net = NetworkConfig::parse(
        r#"{"cniVersion":"1.0.0","name":"n","disableCheck":"true","plugins":[{"type":"bridge"}]}"#,
        Path::new("x"),
    )
    .expect("config");
    let runtime = runtime_in(&host, REFERENCE_DIR);
    let rt = RuntimeConf::new("c", None, "eth0");
    match runtime.check(&net, &rt) {
        Err(RuntimeError::Disabled { key, .. }) => assert_eq!(key, "disableCheck"),
        other => panic!("expected Disabled, got {other:?}"),
    }
}

fn single(name: &str) -> NetworkConfig {
    NetworkConfig::parse(
        &format!(r#"{{"cniVersion":"1.0.0","name":"n","type":"{name}"}}"#),
        Path::new("x.conf"),
    )
    .expect("config")
}

#[test]
fn plugin_failures_are_typed_not_panics() {
    let _host = host_untouched();
    let dir = tempfile::tempdir().expect("tmp");
    script(
        dir.path(),
        "garbage",
        "cat >/dev/null; echo 'not json at all'\n",
    );
    script(
        dir.path(),
        "coded",
        "cat >/dev/null; echo '{\"code\":7,\"msg\":\"bad config\",\"details\":\"d\"}'; exit 1\n",
    );
    script(
        dir.path(),
        "crash",
        "cat >/dev/null; echo oops >&2; exit 3\n",
    );
    script(dir.path(), "hang", "exec sleep 60\n");
    // The answering plugins get the default timeout, so a loaded machine
    // cannot turn their answer into a timeout; only the one that never
    // answers runs under a short one (any length gives the same outcome).
    let runtime = Runtime::new(&dir.path().display().to_string());
    let impatient = Runtime::new(&dir.path().display().to_string())
        .with_timeout(std::time::Duration::from_secs(1));
    let rt = RuntimeConf::new("c", Some(Path::new("/run/netns/none")), "eth0");

    match runtime.add(&single("garbage"), &rt) {
        Err(RuntimeError::Defect { reason, exec }) => {
            assert!(reason.contains("not one JSON result"), "{reason}");
            assert_eq!(exec.stdout.trim(), "not json at all");
        }
        other => panic!("expected Defect, got {other:?}"),
    }
    match runtime.add(&single("coded"), &rt) {
        Err(RuntimeError::Plugin { error, .. }) => {
            assert_eq!(error.code, 7);
            assert_eq!(error.msg, "bad config");
        }
        other => panic!("expected Plugin error, got {other:?}"),
    }
    match runtime.add(&single("crash"), &rt) {
        Err(RuntimeError::Crashed(exec)) => {
            assert_eq!(exec.exit_code, Some(3));
            assert_eq!(exec.stderr.trim(), "oops");
        }
        other => panic!("expected Crashed, got {other:?}"),
    }
    match impatient.add(&single("hang"), &rt) {
        Err(RuntimeError::Timeout(exec)) => {
            assert!(exec.timed_out);
            assert_eq!(exec.signal, Some(9), "the plugin is killed");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    match runtime.add(&single("missing"), &rt) {
        Err(e @ RuntimeError::PluginNotFound { .. }) => assert!(e.to_string().contains("missing")),
        other => panic!("expected PluginNotFound, got {other:?}"),
    }
    // Nothing cached after failures.
    assert!(runtime.cached_result(&single("garbage"), &rt).is_none());
}

#[test]
fn exec_raw_sends_exactly_the_given_environment() {
    let _host = host_untouched();
    let dir = tempfile::tempdir().expect("tmp");
    script(dir.path(), "envdump", "env\n");
    let runtime = Runtime::new(&dir.path().display().to_string());
    let env = runtime.cni_env(CniCommand::Version, None);
    let exec = runtime
        .exec_raw(&dir.path().join("envdump"), &env, b"{}")
        .expect("runs");
    let seen: Vec<&str> = exec
        .stdout
        .lines()
        .filter(|l| l.starts_with("CNI_"))
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.contains(&"CNI_COMMAND=VERSION"));
    assert!(exec.shell_line().contains("CNI_COMMAND=VERSION"));
}
