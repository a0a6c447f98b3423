//! Tests of the registry of causes: every id the sources name is declared,
//! the docs' table is the registry's, and each cause's `proven_by` is
//! exactly the tests that apply its fix.

use super::causes::*;
use std::path::{Path, PathBuf};

#[test]
fn each_cause_is_declared_once_in_full() {
    for (i, c) in CAUSES.iter().enumerate() {
        assert!(
            CAUSES[..i].iter().all(|o| o.id != c.id),
            "{} declared twice",
            c.id
        );
        assert!(
            c.id.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "{}",
            c.id
        );
        assert!(!c.found_by.is_empty(), "{}", c.id);
        for (what, text) in [("means", c.means), ("evidence", c.evidence), ("fix", c.fix)] {
            assert!(text.len() > 8, "{}: {what} is empty", c.id);
        }
    }
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("harness sources").flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every diagnosis a rule or the cluster check makes names a declared
/// cause: each `Diagnosis { id: "…"` in the sources (outside tests),
/// and every id the trace names ([`crate::trace::CAUSES`] is checked in
/// `trace/`).
#[test]
fn every_id_the_sources_name_is_declared() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut seen = 0;
    for f in files {
        // Test-only modules (`*_tests.rs`) declare nothing.
        if f.to_string_lossy().ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("source");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("Diagnosis {") {
            rest = &rest[at + "Diagnosis {".len()..];
            let head: String = rest.chars().take(120).collect();
            let Some(id) = head
                .trim_start()
                .strip_prefix("id: \"")
                .and_then(|s| s.split('"').next())
            else {
                continue;
            };
            assert!(
                find(id).is_some(),
                "{}: the cause {id:?} is not declared in connectivity/causes.rs",
                f.display()
            );
            seen += 1;
        }
    }
    assert!(seen > 25, "only {seen} diagnoses found in the sources");
}

/// The proofs of fixes found in the tests: for each cause, the tests
/// (`BINARY::TEST`) that call a fix assertion (`assert_fixed`,
/// `assert_fixed_on`, `assert_fixed_in`) with its id, or that hand a
/// fault of that cause to `each_fault_named_by_check` (which applies the
/// fix and asserts it), and the shipped scenarios (`scenario NAME`)
/// that expect the cause, heal, and then expect a pass.
fn proofs_in_the_tests() -> std::collections::BTreeMap<String, Vec<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut add = |id: &str, proof: String| found.entry(id.to_string()).or_default().push(proof);
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("tests/tests"))
        .expect("tests/tests")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    for f in files {
        let binary = f
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let text = std::fs::read_to_string(&f).expect("test source");
        for piece in text.split("\nfn ").skip(1) {
            let name = piece.split('(').next().unwrap_or_default();
            let body = piece.split("\n}\n").next().unwrap_or_default();
            for call in ["assert_fixed(", "assert_fixed_on(", "assert_fixed_in("] {
                for after in body.split(call).skip(1) {
                    let id = after
                        .split_once(',')
                        .map(|(_, rest)| rest.trim_start())
                        .and_then(|rest| rest.strip_prefix('"'))
                        .and_then(|rest| rest.split('"').next());
                    if let Some(id) = id {
                        add(id, format!("{binary}::{name}"));
                    }
                }
            }
            if body.contains("each_fault_named_by_check(") {
                for after in body.split("cause: \"").skip(1) {
                    let id = after.split('"').next().unwrap_or_default();
                    add(id, format!("{binary}::{name}"));
                }
            }
        }
    }
    for e in std::fs::read_dir(root.join("lab/scenarios"))
        .expect("lab/scenarios")
        .flatten()
    {
        let p = e.path();
        let Some(name) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".toml"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&p).expect("scenario");
        for after in text.split("diagnosis = \"").skip(1) {
            let id = after.split('"').next().unwrap_or_default();
            let healed = after
                .split_once("do = \"heal\"")
                .is_some_and(|(_, rest)| rest.contains("expect = \"pass\""));
            if healed {
                add(id, format!("scenario {name}"));
            }
        }
    }
    for proofs in found.values_mut() {
        proofs.sort();
        proofs.dedup();
    }
    found
}

/// Each cause's `proven_by` is exactly the tests that apply its fix:
/// none is named that does not, none that does is left out, and every
/// id a fix test names is declared.
#[test]
fn the_tests_named_as_proofs_apply_the_fix() {
    let found = proofs_in_the_tests();
    for (id, proofs) in &found {
        let c = find(id)
            .unwrap_or_else(|| panic!("a test proves the fix of {id:?}, which is not declared"));
        let mut declared: Vec<String> = c.proven_by.iter().map(|p| p.to_string()).collect();
        declared.sort();
        assert_eq!(
            &declared, proofs,
            "{id}: proven_by should name exactly the tests that apply its fix"
        );
    }
    for c in CAUSES {
        assert!(
            c.proven_by.is_empty() || found.contains_key(c.id),
            "{}: proven_by names {:?}, but no test applies its fix",
            c.id,
            c.proven_by
        );
    }
    let proven = CAUSES.iter().filter(|c| !c.proven_by.is_empty()).count();
    assert!(proven >= 50, "only {proven} causes have a tested fix");
}

/// The docs' table of causes is this table.
#[test]
fn the_docs_table_is_the_registry() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/diagnoses.md");
    let text = std::fs::read_to_string(&docs).expect("docs/src/diagnoses.md");
    let table = markdown();
    assert!(
        text.contains(&table),
        "docs/src/diagnoses.md's table of causes differs from the registry; it should read:\n{table}"
    );
}
