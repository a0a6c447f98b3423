//! Delegation to another IPAM plugin found on `CNI_PATH`: it receives the
//! same environment and the whole config, as the spec asks.

use crate::env::CniEnv;
use crate::error::{CniError, Result};
use cnilab_net::spec::{code, CniResult, ErrorBody};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn find(plugin: &str, env: &CniEnv) -> Result<PathBuf> {
    env.path
        .iter()
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                code::IPAM_DELEGATE,
                format!(
                    "IPAM plugin {plugin:?} not found in CNI_PATH ({})",
                    env.path
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(":")
                ),
            )
        })
}

/// Runs `plugin` for `command` (ADD, DEL, CHECK, STATUS, GC). Returns the
/// parsed result for ADD.
pub fn exec(plugin: &str, command: &str, env: &CniEnv, stdin: &[u8]) -> Result<Option<CniResult>> {
    let path = find(plugin, env)?;
    let args: Vec<String> = env.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let cni_path: Vec<String> = env.path.iter().map(|p| p.display().to_string()).collect();
    let mut child = Command::new(&path)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &env.container_id)
        .env("CNI_NETNS", &env.netns)
        .env("CNI_IFNAME", &env.ifname)
        .env("CNI_ARGS", args.join(";"))
        .env("CNI_PATH", cni_path.join(":"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            CniError::new(
                code::IPAM_DELEGATE,
                format!("run IPAM plugin {}: {e}", path.display()),
            )
        })?;
    if let Some(mut input) = child.stdin.take() {
        // A plugin that exits without reading is not an error here; its exit status tells.
        let _ = input.write_all(stdin);
    }
    let out = child.wait_with_output().map_err(|e| {
        CniError::new(
            code::IPAM_DELEGATE,
            format!("wait for IPAM plugin {plugin}: {e}"),
        )
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(match serde_json::from_str::<ErrorBody>(&stdout) {
            Ok(body) => CniError::new(
                body.code,
                format!("IPAM plugin {plugin} {command}: {}", body.msg),
            )
            .with_details(body.details),
            Err(_) => CniError::new(
                code::IPAM_DELEGATE,
                format!(
                    "IPAM plugin {plugin} {command} failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ),
        });
    }
    if command != "ADD" {
        return Ok(None);
    }
    serde_json::from_str::<CniResult>(&stdout)
        .map(Some)
        .map_err(|e| {
            CniError::new(
                code::IPAM_DELEGATE,
                format!("IPAM plugin {plugin} printed an invalid result: {e}"),
            )
            .with_details(stdout.to_string())
        })
}
