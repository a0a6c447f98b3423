//! The plugin binary as a runtime runs it, without root: VERSION and a
//! refused command. (This file also makes `cargo test --workspace` build
//! the `cnilab-bridge` binary that the root end-to-end tests execute.)

use assert_cmd::Command;
use cnilab_net::spec::{ErrorBody, VersionInfo, SUPPORTED_VERSIONS};

fn plugin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cnilab-bridge"));
    cmd.env_clear();
    cmd
}

#[test]
fn version_lists_every_supported_version() {
    let out = plugin()
        .env("CNI_COMMAND", "VERSION")
        .write_stdin(r#"{"cniVersion":"1.0.0"}"#)
        .output()
        .expect("runs");
    assert!(out.status.success());
    let info: VersionInfo = serde_json::from_slice(&out.stdout).expect("VERSION output is JSON");
    assert_eq!(info.cni_version, "1.0.0");
    assert_eq!(info.supported_versions, SUPPORTED_VERSIONS);
}

#[test]
fn unknown_command_is_a_json_error_with_code_4() {
    let out = plugin()
        .env("CNI_COMMAND", "DESTROY")
        .write_stdin("{}")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let body: ErrorBody = serde_json::from_slice(&out.stdout).expect("error body on stdout");
    assert_eq!(body.code, 4);
    assert!(body.msg.contains("DESTROY"));
}
