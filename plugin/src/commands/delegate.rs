//! Delegation to another IPAM plugin found on `CNI_PATH`: it receives the
//! same environment and the whole config, as the spec asks.

use crate::env::CniEnv;
use crate::error::{CniError, Result};
use cnilab_net::spec::{code, CniResult, ErrorBody};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The delegate's path: `plugin` in the first absolute `CNI_PATH` directory
/// that has it. It runs as root, so it is refused (code 103, naming the
/// path and the fix) unless the binary and every directory above it,
/// symlinks resolved, are owned by root (or this process's user) and not
/// writable by group or others; a sticky directory owned by root (`/tmp`)
/// is accepted, as others cannot replace what root put in it. This is the
/// rule runc and kubelet apply to the binaries they execute.
pub fn find(plugin: &str, env: &CniEnv) -> Result<PathBuf> {
    let found = env
        .path
        .iter()
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(plugin))
        .find(|p| p.is_file());
    let Some(path) = found else {
        return Err(CniError::new(
            code::IPAM_DELEGATE,
            format!(
                "IPAM plugin {plugin:?} not found in CNI_PATH ({})",
                env.path
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            ),
        ));
    };
    let refuse = |why: String| {
        CniError::new(
            code::IPAM_DELEGATE,
            format!(
                "refusing to run IPAM plugin {}: {why}; a delegate and every directory above it must be owned by root and not writable by group or others (fix with chown root and chmod go-w)",
                path.display()
            ),
        )
    };
    let real = std::fs::canonicalize(&path).map_err(|e| refuse(format!("resolve: {e}")))?;
    let mut checked: Vec<&Path> = vec![&real];
    checked.extend(real.ancestors().skip(1));
    if path != real {
        // The names the runtime gave (a symlinked CNI_PATH entry) must not
        // be replaceable by others either.
        checked.push(&path);
        checked.extend(path.ancestors().skip(1));
    }
    for p in checked {
        if let Some(why) = unsafe_because(p) {
            return Err(refuse(why));
        }
    }
    Ok(path)
}

/// Why others than root could replace `path` (or what it names), if they can.
fn unsafe_because(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let md = match std::fs::metadata(path) {
        Ok(md) => md,
        Err(e) => return Some(format!("{}: {e}", path.display())),
    };
    let me = nix::unistd::geteuid().as_raw();
    if md.uid() != 0 && md.uid() != me {
        return Some(format!(
            "{} is owned by uid {}, not root",
            path.display(),
            md.uid()
        ));
    }
    let sticky_root_dir = md.is_dir() && md.mode() & 0o1000 != 0 && md.uid() == 0;
    if md.mode() & 0o022 != 0 && !sticky_root_dir {
        return Some(format!(
            "{} is writable by group or others (mode {:o})",
            path.display(),
            md.mode() & 0o7777
        ));
    }
    None
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
