//! The one CLI convention: examples and exit codes in every
//! `--help`, help text on every flag, `-o table|json[|junit]` with a
//! `schemaVersion`, exit 2 on usage errors, shell completions.

mod common;

use assert_cmd::Command;
use clap::{CommandFactory, Parser};
use cnilab_harness::cli::Cli;
use common::*;

const EXIT_CODES: &str =
    "Exit codes: 0 pass, 1 a check failed, 2 usage or environment error, 3 inconclusive";

fn cnilab() -> Command {
    Command::cargo_bin("cnilab").expect("cnilab binary")
}

/// Every command path (`["lab", "status"]`, …), clap's own `help` excluded.
fn command_paths() -> Vec<Vec<String>> {
    fn walk(cmd: &clap::Command, prefix: &[String], out: &mut Vec<Vec<String>>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut path = prefix.to_vec();
            path.push(sub.get_name().to_string());
            out.push(path.clone());
            walk(sub, &path, out);
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), &[], &mut out);
    out
}

#[test]
fn the_walk_sees_every_subcommand() {
    let paths: Vec<String> = command_paths().iter().map(|p| p.join(" ")).collect();
    for expected in [
        "conform",
        "lifecycle",
        "bench",
        "soak",
        "lab run",
        "lab status",
        "scenario run",
        "e2e check",
        "sweep",
        "completions",
    ] {
        assert!(paths.iter().any(|p| p == expected), "{expected}: {paths:?}");
    }
}

#[test]
fn every_help_has_examples_and_exit_codes() {
    let mut paths = command_paths();
    paths.push(Vec::new());
    for path in paths {
        let out = cnilab().args(&path).arg("--help").output().expect("runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let shown = path.join(" ");
        assert_eq!(out.status.code(), Some(0), "cnilab {shown} --help");
        assert!(
            text.contains("Examples:\n  cnilab"),
            "cnilab {shown}:\n{text}"
        );
        assert!(text.contains(EXIT_CODES), "cnilab {shown}:\n{text}");
    }
}

#[test]
fn every_flag_and_argument_has_help() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            if help.trim().is_empty() {
                missing.push(format!("{path} {id}"));
            }
        }
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let about = sub.get_about().map(|h| h.to_string()).unwrap_or_default();
            if about.trim().is_empty() {
                missing.push(format!("{path} {} (about)", sub.get_name()));
            }
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut missing = Vec::new();
    walk(&Cli::command(), "cnilab", &mut missing);
    assert!(missing.is_empty(), "without help text: {missing:?}");
}

#[test]
fn the_command_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn output_flag_is_the_same_everywhere() {
    // Every command path that prints a result takes -o/--output.
    for path in [
        "conform",
        "lifecycle",
        "bench",
        "soak",
        "sweep",
        "lab run",
        "lab check",
        "lab status",
        "lab show",
        "lab up",
        "scenario list",
        "scenario run",
        "e2e check",
        "e2e kind",
        "e2e minikube",
    ] {
        let mut cmd = Cli::command();
        let mut sub = &mut cmd;
        for word in path.split(' ') {
            sub = sub
                .find_subcommand_mut(word)
                .unwrap_or_else(|| panic!("no subcommand {path}"));
        }
        let output = sub
            .get_arguments()
            .find(|a| a.get_id() == "output")
            .unwrap_or_else(|| panic!("cnilab {path} has no -o/--output"));
        assert_eq!(output.get_short(), Some('o'), "{path}");
        assert_eq!(output.get_long(), Some("output"), "{path}");
        let values: Vec<String> = output
            .get_possible_values()
            .iter()
            .map(|v| v.get_name().to_string())
            .collect();
        assert!(
            values.starts_with(&["table".to_string(), "json".to_string()]),
            "{path}: {values:?}"
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["lab", "status", "-o", "yaml"][..],
        &["lab", "status", "-o", "junit"],
        &[
            "conform",
            "--plugin-dir",
            "/x",
            "--config",
            "/y",
            "-o",
            "xml",
        ],
        &[
            "conform",
            "--plugin-dir",
            "/x",
            "--config",
            "/y",
            "--timeout",
            "0s",
        ],
        &[
            "soak",
            "--plugin-dir",
            "/x",
            "--config",
            "/y",
            "--duration",
            "3 days",
        ],
        &["no-such-command"],
        &["completions", "powershell"],
    ] {
        let out = cnilab().args(args).output().expect("runs");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{args:?} printed a result");
    }
}

#[test]
fn completions_are_scripts_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef cnilab"),
        ("fish", "complete -c cnilab"),
    ] {
        let out = cnilab()
            .args(["completions", shell])
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(marker), "{shell}: {marker} missing");
        for sub in ["conform", "lifecycle", "scenario", "output"] {
            assert!(text.contains(sub), "{shell} completes {sub}");
        }
    }
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout={} stderr={}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn lab_status_json_has_a_schema_version() {
    // A name no lab has: status of it is an error (exit 2), not an empty list.
    let out = cnilab()
        .args(["lab", "status", "--name", "no-such-lab-cli-convention"])
        .args(["-o", "json"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("cnilab: "));
    for spelling in [
        &["-o", "json"][..],
        &["--output", "json"],
        &["--format", "json"],
    ] {
        let out = cnilab()
            .args(["lab", "status"])
            .args(spelling)
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(0), "{spelling:?}");
        let v = json_of(&out);
        assert_eq!(
            v["schemaVersion"],
            cnilab_harness::report::SCHEMA_VERSION,
            "{v}"
        );
        assert_eq!(v["kind"], "LabStatus", "{v}");
        let labs = v["labs"].as_array().expect("labs is an array");
        for lab in labs {
            assert!(lab["name"].is_string() && lab["nodes"].is_u64(), "{lab}");
        }
    }
}

#[test]
fn scenario_list_json_lists_objects() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/scenarios");
    let out = cnilab()
        .args(["scenario", "list", "-o", "json", "--dir"])
        .arg(&dir)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0));
    let v = json_of(&out);
    assert_eq!(v["schemaVersion"], cnilab_harness::report::SCHEMA_VERSION);
    let list = v["scenarios"].as_array().expect("scenarios");
    assert!(!list.is_empty(), "{v}");
    for s in list {
        assert!(s["name"].is_string() && s["error"].is_null(), "{s}");
    }
}

#[test]
fn lifecycle_json_has_a_schema_version_and_findings() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let out = cnilab()
        .args([
            "lifecycle",
            "--plugin-dir",
            REFERENCE_DIR,
            "--timeout",
            "30s",
        ])
        .arg("--config")
        .arg(examples_dir().join("reference-bridge.conflist"))
        .args(["-o", "json"])
        .output()
        .expect("runs");
    let v = json_of(&out);
    assert_eq!(v["schemaVersion"], cnilab_harness::report::SCHEMA_VERSION);
    assert_eq!(v["kind"], "LifecycleReport");
    let findings = v["findings"].as_array().expect("findings");
    assert!(!findings.is_empty(), "{v}");
    for f in findings {
        assert!(f["id"].is_string() && f["verdict"].is_string(), "{f}");
    }
    let passed = v["passed"].as_bool().expect("passed");
    assert_eq!(
        out.status.code(),
        Some(if passed { 0 } else { 1 }),
        "exit code follows the verdict"
    );
}

#[test]
fn conform_json_and_junit_on_stdout() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let config = examples_dir().join("reference-bridge.conflist");
    let out = cnilab()
        .args(["conform", "--plugin-dir", REFERENCE_DIR, "--only", "E1,C1"])
        .arg("--config")
        .arg(&config)
        .args(["-o", "json", "--timeout", "30"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0));
    let v = json_of(&out);
    assert_eq!(v["schemaVersion"], cnilab_harness::report::SCHEMA_VERSION);
    assert_eq!(v["kind"], "ConformReport");
    assert_eq!(v["summary"]["checks"], 2);

    let out = cnilab()
        .args(["conform", "--plugin-dir", REFERENCE_DIR, "--only", "E1,C1"])
        .arg("--config")
        .arg(&config)
        .args(["-o", "junit"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0));
    let xml = String::from_utf8_lossy(&out.stdout);
    let doc = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("{e}: {xml}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    assert_eq!(root.attribute("tests"), Some("2"));
    assert_eq!(root.attribute("failures"), Some("0"));
    let cases: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .filter_map(|n| n.attribute("name"))
        .collect();
    assert_eq!(cases.len(), 2, "{xml}");
    assert!(cases.iter().any(|c| c.starts_with("E1 ")), "{cases:?}");
}

#[test]
fn soak_junit_has_one_case_per_kind_of_finding() {
    let _host = host_untouched();
    require_root();
    require_reference();
    let out = cnilab()
        .args(["soak", "--plugin-dir", REFERENCE_DIR, "--config"])
        .arg(examples_dir().join("reference-bridge.conflist"))
        .args(["--cycles", "4", "--parallel", "2", "--pods", "1"])
        .args(["--seed", "7", "--timeout", "30s", "-o", "junit"])
        .output()
        .expect("runs");
    let xml = String::from_utf8_lossy(&out.stdout);
    let doc = roxmltree::Document::parse(&xml).unwrap_or_else(|e| {
        panic!(
            "{e}: {xml}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let cases: Vec<roxmltree::Node<'_, '_>> = doc
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    assert_eq!(cases.len(), 7, "{xml}");
    let failed = cases
        .iter()
        .filter(|c| c.children().any(|n| n.has_tag_name("failure")))
        .count();
    assert_eq!(
        doc.root_element().attribute("failures"),
        Some(failed.to_string().as_str())
    );
    assert_eq!(
        out.status.code(),
        Some(if failed == 0 { 0 } else { 1 }),
        "{xml}"
    );
}

/// Every example in every `--help`, one command per entry: continuation
/// lines joined, `&&` split, redirections and comments dropped.
fn help_examples() -> Vec<String> {
    fn walk(cmd: &clap::Command, out: &mut Vec<String>) {
        if let Some(help) = cmd.get_after_help() {
            let text = help.to_string();
            if let Some((_, rest)) = text.split_once("Examples:\n") {
                let block = rest.split("\n\n").next().unwrap_or("");
                let joined = block.replace("\\\n", " ");
                for line in joined.lines() {
                    for part in line.split("&&") {
                        let part = part.split(" #").next().unwrap_or(part);
                        let part = part.split('>').next().unwrap_or(part).trim();
                        if !part.is_empty() {
                            out.push(part.to_string());
                        }
                    }
                }
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), &mut out);
    out
}

#[test]
fn every_help_example_parses_and_names_repository_files_that_exist() {
    let examples = help_examples();
    assert!(examples.len() >= 30, "{examples:?}");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut problems = Vec::new();
    for example in &examples {
        let words: Vec<&str> = example.split_whitespace().collect();
        if let Err(e) = Cli::try_parse_from(&words) {
            problems.push(format!("{example}: {e}"));
        }
        // A path into the repository must exist there (and so is built
        // into the binary when it is an asset).
        for w in words.iter().flat_map(|w| w.split(':')) {
            let repo_path = ["lab/", "harness/", "tests/"]
                .iter()
                .any(|p| w.starts_with(p));
            if repo_path && !root.join(w).exists() {
                problems.push(format!("{example}: {w} does not exist"));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn lab_name_completes_standing_labs_not_file_names() {
    let script = |shell: &str| {
        let out = cnilab()
            .args(["completions", shell])
            .output()
            .expect("runs");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let labs = "ls /run/cnilab/labs";
    // bash: the lab subcommands' --name case lists the labs; e2e's does not.
    let bash = script("bash");
    let section = |name: &str| {
        let start = bash
            .find(&format!("        {name})\n"))
            .unwrap_or_else(|| panic!("{name} section"));
        let rest = &bash[start + name.len() + 10..];
        let end = rest.find("\n        cnilab__").unwrap_or(rest.len());
        rest[..end].to_string()
    };
    for sub in ["check", "down", "show", "status", "trace", "up"] {
        let s = section(&format!("cnilab__subcmd__lab__subcmd__{sub}"));
        assert!(
            s.contains(labs) && !s.contains("--name)\n                    COMPREPLY=($(compgen -f"),
            "lab {sub}:\n{s}"
        );
    }
    assert!(!section("cnilab__subcmd__e2e__subcmd__kind").contains(labs));
    let syntax = std::process::Command::new("bash")
        .args(["-n", "-c", &bash])
        .status()
        .expect("bash");
    assert!(syntax.success(), "the bash script parses");
    // zsh and fish: the lab --name lines, and only those.
    for (shell, lab_line, e2e_line) in [
        (
            "zsh",
            "'--name=[Lab name]",
            "'--name=[Cluster (profile) name",
        ),
        (
            "fish",
            "-l name -d 'Lab name'",
            "-l name -d 'Cluster (profile) name",
        ),
    ] {
        let text = script(shell);
        let lines = |m: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.contains(m))
                .map(String::from)
                .collect()
        };
        assert!(!lines(lab_line).is_empty(), "{shell}");
        for l in lines(lab_line) {
            assert!(l.contains("/run/cnilab/labs"), "{shell}: {l}");
        }
        for l in lines(e2e_line) {
            assert!(!l.contains("/run/cnilab/labs"), "{shell}: {l}");
        }
    }
}
