//! Shared by the e2e plan tests: `cnilab e2e … --dry-run` at the
//! repository root, like the workflows, and a flannel-like manifest.
use assert_cmd::Command;
use std::path::PathBuf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Runs `cnilab e2e <args> --dry-run` at the repository root.
pub fn run_dry(args: &[&str]) -> std::process::Output {
    Command::cargo_bin("cnilab")
        .expect("cnilab binary")
        .current_dir(repo_root())
        .arg("e2e")
        .args(args)
        .arg("--dry-run")
        .output()
        .expect("runs")
}

/// Runs `cnilab e2e <args> --dry-run` and returns stdout.
pub fn dry_run(args: &[&str]) -> String {
    let out = run_dry(args);
    assert!(
        out.status.success(),
        "cnilab e2e {args:?} --dry-run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A flannel-like CNI manifest: its own namespace and DaemonSet, no
/// cnilab image.
pub const FLANNEL: &str = "---\nkind: Namespace\napiVersion: v1\nmetadata:\n  name: kube-flannel\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: kube-flannel-ds\n  namespace: kube-flannel\nspec:\n  selector:\n    matchLabels:\n      app: flannel\n  template:\n    spec:\n      containers:\n      - name: kube-flannel\n        image: ghcr.io/flannel-io/flannel:v0.27.0\n";
