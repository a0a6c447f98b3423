//! Node setup on disk: the CNI conflist and the plugin binary, both written
//! to a temporary file in the target directory and renamed into place, so
//! the container runtime never reads half a file.

use crate::error::{AgentError, Result};
use ipnet::IpNet;
use serde_json::{json, Value};
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const PLUGIN_BINARY_NAME: &str = "cnilab-bridge";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflistOptions {
    pub network_name: String,
    pub bridge: String,
    pub mtu: u32,
    pub portmap: bool,
    /// The plugin masquerades (only when the agent does not).
    pub plugin_ip_masq: bool,
    /// The conflist's cniVersion (containerd 1.6/1.7 refuse 1.1.0 results).
    pub cni_version: String,
    /// `ipam.dataDir`: where the plugin keeps its IPAM store (`None`: the
    /// plugin's default).
    pub ipam_data_dir: Option<PathBuf>,
}

/// The conflist for a node with these pod CIDRs: one IPAM range set per
/// CIDR (so dual-stack gets one address per family).
pub fn conflist(pod_cidrs: &[IpNet], options: &ConflistOptions) -> Value {
    let ranges: Vec<Value> = pod_cidrs
        .iter()
        .map(|cidr| json!([{ "subnet": cidr.to_string() }]))
        .collect();
    let mut ipam = json!({ "ranges": ranges });
    if let Some(dir) = &options.ipam_data_dir {
        ipam["dataDir"] = json!(dir.display().to_string());
    }
    let mut plugins = vec![json!({
        "type": PLUGIN_BINARY_NAME,
        "bridge": options.bridge,
        "isGateway": true,
        "isDefaultGateway": true,
        "ipMasq": options.plugin_ip_masq,
        "hairpinMode": true,
        "mtu": options.mtu,
        "ipam": ipam,
    })];
    if options.portmap {
        plugins.push(json!({ "type": "portmap", "capabilities": { "portMappings": true } }));
    }
    json!({
        "cniVersion": options.cni_version,
        "name": options.network_name,
        "plugins": plugins,
    })
}

/// Writes `contents` to `path` through a temporary file and a rename, unless
/// the file already holds exactly these bytes. Returns whether it wrote.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<bool> {
    if fs::read(path).is_ok_and(|existing| existing == contents) {
        let mode_ok = fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o7777 == mode);
        if mode_ok {
            return Ok(false);
        }
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| AgentError::io(format!("create {}", dir.display()), e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| AgentError::Config(format!("{} has no file name", path.display())))?;
    // A dot prefix and no .conf/.conflist suffix: runtimes ignore it.
    let temp: PathBuf = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut file = fs::File::create(&temp)?;
        file.write_all(contents)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&temp);
        return Err(AgentError::io(format!("write {}", path.display()), e));
    }
    Ok(true)
}

/// Writes the conflist; returns whether it changed.
pub fn write_conflist(path: &Path, config: &Value) -> Result<bool> {
    let mut text = serde_json::to_string_pretty(config)
        .map_err(|e| AgentError::Config(format!("serialize conflist: {e}")))?;
    text.push('\n');
    write_atomic(path, text.as_bytes(), 0o644)
}

/// Copies the plugin binary into the CNI bin dir as `cnilab-bridge`.
pub fn install_plugin(source: &Path, bin_dir: &Path) -> Result<bool> {
    let bytes = fs::read(source)
        .map_err(|e| AgentError::io(format!("read plugin binary {}", source.display()), e))?;
    write_atomic(&bin_dir.join(PLUGIN_BINARY_NAME), &bytes, 0o755)
}

/// Removes a file; a missing file is fine. Returns whether it existed.
pub fn remove_if_exists(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(AgentError::io(format!("remove {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflist_matches_the_plugin_format() {
        let cidrs: Vec<IpNet> = vec![
            "10.244.1.0/24".parse().expect("net"),
            "fd00:10:244:1::/64".parse().expect("net"),
        ];
        let options = ConflistOptions {
            network_name: "cnilab".into(),
            bridge: "cnilab0".into(),
            mtu: 1500,
            portmap: true,
            plugin_ip_masq: false,
            cni_version: "1.1.0".into(),
            ipam_data_dir: None,
        };
        let expected = json!({"cniVersion":"1.1.0","name":"cnilab","plugins":[
            {"type":"cnilab-bridge","bridge":"cnilab0","isGateway":true,"isDefaultGateway":true,
             "ipMasq":false,"hairpinMode":true,"mtu":1500,
             "ipam":{"ranges":[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:10:244:1::/64"}]]}},
            {"type":"portmap","capabilities":{"portMappings":true}}]});
        assert_eq!(conflist(&cidrs, &options), expected);
        // An IPAM store of its own (a lab's node): the plugin's dataDir.
        let own = ConflistOptions {
            ipam_data_dir: Some(PathBuf::from("/run/cnilab/lab/node1/ipam")),
            ..options
        };
        let c = conflist(&cidrs, &own);
        assert_eq!(
            c["plugins"][0]["ipam"]["dataDir"],
            "/run/cnilab/lab/node1/ipam"
        );
        assert_eq!(
            c["plugins"][0]["ipam"]["ranges"],
            expected["plugins"][0]["ipam"]["ranges"]
        );
    }

    #[test]
    fn write_atomic_writes_once_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("net.d/10-cnilab.conflist");
        assert!(write_atomic(&path, b"a", 0o644).expect("first write"));
        assert!(!write_atomic(&path, b"a", 0o644).expect("same content"));
        assert!(write_atomic(&path, b"b", 0o644).expect("new content"));
        assert_eq!(fs::read(&path).expect("read"), b"b");
        let entries = fs::read_dir(dir.path().join("net.d")).expect("dir").count();
        assert_eq!(entries, 1);
    }
}
