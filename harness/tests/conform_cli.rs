//! `cnilab conform` as a user with a plugin of their own meets it: the
//! pre-checks that stop a run which cannot judge anything (exit 2 with the
//! fix), container IDs like a runtime's, and a report that says what to fix
//! first.

mod common;

use assert_cmd::Command;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn cnilab() -> Command {
    Command::cargo_bin("cnilab").expect("cnilab binary")
}

/// The reference example config with `type` set to `plugin`, in `dir`.
fn config_for(dir: &Path, plugin: &str) -> std::path::PathBuf {
    reference_config_edited(
        dir,
        "c.conflist",
        "\"type\": \"bridge\"",
        &format!("\"type\": \"{plugin}\""),
    )
}

/// A plugin `name` in `dir` with `body` and `mode`.
fn plugin(dir: &Path, name: &str, body: &str, mode: u32) {
    let path = dir.join(name);
    std::fs::write(&path, body).expect("write plugin");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn conform(dir: &Path, config: &Path, extra: &[&str]) -> std::process::Output {
    cnilab()
        .args(["conform", "--plugin-dir"])
        .arg(format!("{}:{REFERENCE_DIR}", dir.display()))
        .arg("--config")
        .arg(config)
        .args(extra)
        .output()
        .expect("runs")
}

fn all(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_plugin_that_cannot_run_is_exit_2_with_the_fix_before_any_rule() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = config_for(tmp.path(), "mine");

    // Exec bit off.
    plugin(
        tmp.path(),
        "mine",
        "#!/bin/sh\nexec /usr/lib/cni/bridge\n",
        0o644,
    );
    let out = conform(tmp.path(), &config, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", all(&out));
    let text = all(&out);
    assert!(
        text.contains(&format!("chmod +x {}", tmp.path().join("mine").display())),
        "{text}"
    );
    assert!(!text.contains("FAIL"), "no rule may run: {text}");

    // An interpreter that does not exist: VERSION cannot start.
    plugin(tmp.path(), "mine", "#!/no/such/shell\n", 0o755);
    let out = conform(tmp.path(), &config, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", all(&out));
    let text = all(&out);
    assert!(text.contains("does not answer VERSION"), "{text}");
    assert!(!text.contains("FAIL"), "no rule may run: {text}");

    // Not there at all: names the flags.
    let out = conform(tmp.path(), &config_for(tmp.path(), "absent"), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", all(&out));
    assert!(all(&out).contains("--plugin-dir"), "{}", all(&out));
}

/// Every `CNI_CONTAINERID` in a JSON report's environments
/// (`{"name": "CNI_CONTAINERID", "value": …}`).
fn container_ids(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Array(items) => items.iter().for_each(|i| container_ids(i, out)),
        serde_json::Value::Object(map) => {
            if map.get("name").is_some_and(|n| n == "CNI_CONTAINERID") {
                out.extend(map.get("value").and_then(|v| v.as_str()).map(String::from));
            }
            map.values().for_each(|i| container_ids(i, out));
        }
        _ => {}
    }
}

#[test]
fn container_ids_are_64_hex_like_a_runtimes_and_follow_the_seed() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = config_for(tmp.path(), "wrong-error-code");
    let ids = |seed: &str| {
        let out = conform(
            &broken_plugins_dir(),
            &config,
            &["--only", "C1", "-o", "json", "--seed", seed],
        );
        assert_eq!(out.status.code(), Some(1), "{}", all(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let mut found = Vec::new();
        container_ids(&v, &mut found);
        assert!(!found.is_empty(), "the C1 evidence shows its call: {v}");
        for id in &found {
            assert!(
                id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()),
                "not a runtime-like ID: {id}"
            );
        }
        found
    };
    let first = ids("7");
    assert_eq!(ids("7"), first, "the same seed gives the same IDs");
    assert_ne!(ids("8"), first, "another seed, other IDs");
}

/// A blog-post-style plugin whose errors are plain text: one root cause
/// behind every error rule, listed first with the rules it explains; each
/// failed rule says how to fix it.
#[test]
fn one_root_cause_comes_first_with_the_rules_it_explains_and_each_rule_its_fix() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = config_for(tmp.path(), "text-errors");
    let run = |format: &str| {
        conform(
            &broken_plugins_dir(),
            &config,
            &["--only", "E1,E2,C1,C2,A5", "-o", format],
        )
    };
    let out = run("table");
    assert_eq!(out.status.code(), Some(1), "{}", all(&out));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let first = table.find("Fix first").expect("a fix-first list");
    assert!(first < table.find("\nID ").expect("the rules"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.contains("no CNI error JSON on stdout")
                && l.contains("explains E1, E2, C1, C2")),
        "{table}"
    );
    assert!(
        table.contains("how to fix: refuse an unknown CNI_COMMAND"),
        "{table}"
    );

    let out = run("json");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        v["root_causes"][0]["ids"],
        serde_json::json!(["E1", "E2", "C1", "C2"]),
        "{v}"
    );
    for c in v["checks"].as_array().expect("checks") {
        let failed = c["verdict"]
            .as_str()
            .is_some_and(|s| s.eq_ignore_ascii_case("fail"));
        assert_eq!(
            failed,
            c["fix"].as_str().is_some_and(|f| !f.is_empty()),
            "{c}"
        );
    }
}

/// A JSON report as docs/src/cli/conventions.md promises: objects, not Rust's tuples
/// (`[["CNI_COMMAND","ADD"],…]`), and lowercase enum values, never
/// `"Fail"` or an externally tagged `{"Crashed": …}`.
fn assert_plain_json(v: &serde_json::Value, path: &str) {
    use serde_json::Value;
    let pascal = |s: &str| {
        s.len() > 1
            && s.starts_with(|c: char| c.is_ascii_uppercase())
            && s.chars().all(|c| c.is_ascii_alphabetic())
            && s.chars().skip(1).any(|c| c.is_ascii_lowercase())
    };
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                assert!(!pascal(k), "{path}.{k}: an enum variant as a key");
                if ["verdict", "outcome", "routing", "masquerade"].contains(&k.as_str()) {
                    if let Some(s) = x.as_str() {
                        assert_eq!(s, s.to_lowercase(), "{path}.{k}");
                    }
                }
                assert_plain_json(x, &format!("{path}.{k}"));
            }
        }
        Value::Array(a) => {
            let scalar = |x: &Value| !x.is_object() && !x.is_array();
            let pairs = !a.is_empty()
                && a.iter().all(|e| {
                    e.as_array()
                        .is_some_and(|p| p.len() == 2 && p.iter().all(scalar))
                });
            assert!(!pairs, "{path}: pairs instead of objects: {v}");
            for x in a {
                assert_plain_json(x, &format!("{path}[]"));
            }
        }
        Value::String(s) => assert!(!s.starts_with("Some("), "{path}: {s}"),
        _ => {}
    }
}

#[test]
fn conform_and_lifecycle_json_use_objects_and_lowercase_enums() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = config_for(tmp.path(), "text-errors");
    let dir = format!("{}:{REFERENCE_DIR}", broken_plugins_dir().display());
    for args in [vec!["conform", "--only", "E1,A7"], vec!["lifecycle"]] {
        let out = cnilab()
            .args(&args)
            .args(["--plugin-dir", &dir, "--config"])
            .arg(&config)
            .args(["-o", "json"])
            .output()
            .expect("runs");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", all(&out)));
        assert_plain_json(&v, args[0]);
        let text = v.to_string();
        assert!(
            text.contains("\"CNI_COMMAND\""),
            "{args:?} shows its evidence: {text}"
        );
    }
}
