//! `cnilab lifecycle` as a user reads it: a header and a summary line like
//! `conform`, one verdict per ID, and a note for every step not run.

mod common;

use assert_cmd::Command;
use common::*;

#[test]
fn lifecycle_has_a_header_one_verdict_per_id_and_says_what_was_not_run() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = reference_config_edited(
        tmp.path(),
        "v031.conflist",
        "\"cniVersion\": \"1.0.0\"",
        "\"cniVersion\": \"0.3.1\"",
    );
    let run = |format: &str| {
        Command::cargo_bin("cnilab")
            .expect("cnilab binary")
            .args(["lifecycle", "--plugin-dir", REFERENCE_DIR, "--config"])
            .arg(&config)
            .args(["-o", format])
            .output()
            .expect("runs")
    };
    let out = run("table");
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(
        table.starts_with("cnilab lifecycle: plugin bridge from /usr/lib/cni"),
        "{table}"
    );
    let ids: Vec<&str> = table
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.len() <= 3 && w.chars().next().is_some_and(|c| c.is_ascii_uppercase()))
        .filter(|w| w[1..].chars().all(|c| c.is_ascii_digit()) && w.len() > 1)
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(ids.len(), unique.len(), "one line per ID: {table}");
    assert!(ids.contains(&"A1") && ids.contains(&"D2"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("not run: K2, K4, K5") && l.contains("0.4.0")),
        "{table}"
    );
    let last = table.lines().last().unwrap_or("");
    assert!(
        last.contains(&format!("{} IDs:", ids.len())) && last.ends_with("3 not run"),
        "{last}"
    );

    let out = run("json");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        v["not_run"][0]["ids"],
        serde_json::json!(["K2", "K4", "K5"]),
        "{v}"
    );
    assert_eq!(v["summary"]["ids"].as_u64(), Some(ids.len() as u64), "{v}");
}
