//! The binaries installed outside the repository: copied into a bin
//! directory of their own (as `cargo install` lays them out) and run from an
//! empty working directory, so every scenario, topology, template, manifest
//! and corpus case they use must be the one built into `cnilab`.
//! `lab run`, `scenario run` and `conform` need root (they fail without it);
//! `scenario list` and the e2e dry runs do not.

use cnilab_tests::{host_untouched, require_root, workspace_bin};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A bin directory with copies of the workspace's binaries, and an empty
/// working directory; both removed on drop.
struct Installed {
    _root: tempfile::TempDir,
    bin: PathBuf,
    cwd: PathBuf,
}

const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

fn install(names: &[&str]) -> Installed {
    let root = tempfile::tempdir().expect("tempdir");
    let bin = root.path().join("bin");
    let cwd = root.path().join("work");
    std::fs::create_dir(&bin).expect("bin dir");
    std::fs::create_dir(&cwd).expect("work dir");
    for name in names {
        std::fs::copy(workspace_bin(name), bin.join(name)).expect("copy binary");
    }
    Installed {
        _root: root,
        bin,
        cwd,
    }
}

impl Installed {
    /// `cnilab ARGS` from the empty directory, with `path` as `$PATH`.
    fn cnilab_with_path(&self, path: &str, args: &[&str]) -> Output {
        let run = || {
            Command::new(self.bin.join("cnilab"))
                .args(args)
                .current_dir(&self.cwd)
                .env("PATH", path)
                .output()
        };
        // A fresh copy can be "text file busy" while another test thread's
        // fork still holds its write descriptor (until that child execs).
        let mut out = run();
        for _ in 0..100 {
            match &out {
                Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    out = run();
                }
                _ => break,
            }
        }
        let out = out.expect("cnilab runs");
        let left: Vec<_> = std::fs::read_dir(&self.cwd)
            .expect("work dir")
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert!(
            left.is_empty() || args.contains(&"e2e"),
            "{args:?} wrote {left:?}"
        );
        out
    }

    fn cnilab(&self, args: &[&str]) -> Output {
        self.cnilab_with_path(PATH, args)
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_exit(out: &Output, code: i32, what: &str) {
    assert_eq!(out.status.code(), Some(code), "{what}:\n{}", text(out));
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}):\n{}", text(out)))
}

fn repo_files(dir: &str, ext: &str) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir))
            .expect("repository dir")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|n| n.ends_with(ext))
            .collect();
    names.sort();
    names
}

#[test]
fn installed_scenario_list_shows_every_shipped_scenario() {
    let inst = install(&["cnilab"]);
    let out = inst.cnilab(&["scenario", "list", "-o", "json"]);
    assert_exit(&out, 0, "scenario list");
    let v = json(&out);
    let listed: Vec<String> = v["scenarios"]
        .as_array()
        .expect("scenarios")
        .iter()
        .map(|s| {
            assert!(s["error"].is_null(), "invalid built-in scenario: {s}");
            let file = s["file"].as_str().expect("file");
            file.rsplit('/').next().unwrap_or(file).to_string()
        })
        .collect();
    assert_eq!(listed, repo_files("lab/scenarios", ".toml"));
    // A directory the user names that does not exist says which flag it was.
    let out = inst.cnilab(&["scenario", "list", "--dir", "my/scenarios"]);
    assert_exit(&out, 2, "scenario list --dir my/scenarios");
    assert!(text(&out).contains("--dir"), "{}", text(&out));
}

#[test]
fn installed_e2e_dry_runs_render_the_builtin_manifests() {
    let inst = install(&["cnilab"]);
    for provider in ["kind", "minikube"] {
        let out = inst.cnilab(&["e2e", provider, "--dry-run"]);
        assert_exit(&out, 0, provider);
        let t = text(&out);
        assert!(
            t.contains("cnilab-bridge"),
            "{provider}: no manifest rendered:\n{t}"
        );
        assert!(
            t.contains("# require lab/image/Dockerfile"),
            "{provider}: the image build must say it needs the repository:\n{t}"
        );
    }
    let out = inst.cnilab(&["e2e", "kind", "--dry-run", "--manifests", "mine"]);
    assert_exit(&out, 2, "--manifests mine");
    assert!(text(&out).contains("--manifests"), "{}", text(&out));
}

#[test]
fn installed_lab_run_finds_the_bundled_plugin_next_to_it_or_on_path() {
    require_root();
    let _host = host_untouched();
    let inst = install(&["cnilab", "cnilab-bridge", "cnilab-agent"]);
    let out = inst.cnilab(&["lab", "run", "--only", "pod-to-pod"]);
    assert_exit(&out, 0, "lab run (plugin next to cnilab)");
    // The header in plain words, not Rust's names of the settings.
    assert!(
        text(&out).contains("static routes, the plugin masquerades"),
        "{}",
        text(&out)
    );
    // A topology of the built-in set whose template is named relative to it.
    let out = inst.cnilab(&[
        "lab",
        "run",
        "--topology",
        "lab/topologies/reference.toml",
        "--only",
        "pod-to-pod",
    ]);
    assert_exit(&out, 0, "lab run --topology lab/topologies/reference.toml");

    // cnilab alone; the plugin in another directory on $PATH.
    let alone = install(&["cnilab"]);
    let elsewhere = install(&["cnilab-bridge"]);
    let path = format!("{}:{PATH}", elsewhere.bin.display());
    let out = alone.cnilab_with_path(&path, &["lab", "run", "--only", "pod-to-pod"]);
    assert_exit(&out, 0, "lab run (plugin on $PATH)");
    // Nowhere: exit 2, and how to point at one.
    let out = alone.cnilab(&["lab", "run"]);
    assert_exit(&out, 2, "lab run without a plugin");
    let t = text(&out);
    assert!(
        t.contains("--plugin-dir") && t.contains("cargo install"),
        "{t}"
    );
}

#[test]
fn installed_scenario_run_replays_builtin_scenarios() {
    require_root();
    let _host = host_untouched();
    let inst = install(&["cnilab", "cnilab-bridge", "cnilab-agent"]);
    for given in ["missing-route", "lab/scenarios/ip-forward-off.toml"] {
        let out = inst.cnilab(&["scenario", "run", given]);
        assert_exit(&out, 0, given);
    }
}

#[test]
fn installed_conform_runs_x1_from_the_builtin_corpus() {
    require_root();
    let _host = host_untouched();
    let inst = install(&["cnilab", "cnilab-bridge"]);
    let bin = inst.bin.display().to_string();
    let x1 = |extra: &[&str]| {
        let mut args = vec![
            "conform",
            "--plugin-dir",
            &bin,
            "--config",
            "harness/examples/cnilab-bridge.conflist",
            "--only",
            "X1",
        ];
        args.extend_from_slice(extra);
        inst.cnilab(&args)
    };
    let out = x1(&["-o", "json"]);
    assert_exit(&out, 0, "conform --only X1");
    let v = json(&out);
    let check = v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["id"] == "X1")
        .expect("X1 in the report")
        .clone();
    assert_eq!(check["verdict"], "pass", "{check}");
    // A corpus the user names that does not exist says which flag it was.
    let out = x1(&["--corpus", "my-corpus"]);
    assert_exit(&out, 2, "--corpus my-corpus");
    assert!(text(&out).contains("--corpus"), "{}", text(&out));
}
