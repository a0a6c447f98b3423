//! The node's CNI configuration (`/etc/cni/net.d`): each network's name,
//! its plugin chain and the subnets its IPAM hands out. A namespace whose
//! address lies in one of them is evidence of a pod (`evidence.rs`).

use ipnet::IpNet;
use std::net::IpAddr;
use std::path::Path;

/// Where a node keeps its CNI configuration.
pub const CNI_CONF_DIR: &str = "/etc/cni/net.d";

/// The most files and bytes per file read: the directory is the node's.
const MAX_FILES: usize = 1_000;
const MAX_BYTES: u64 = 1 << 20;

/// One configuration file's network.
#[derive(Debug, PartialEq, Eq)]
pub struct Conf {
    pub file: String,
    pub network: String,
    pub plugins: Vec<String>,
    pub subnets: Vec<IpNet>,
}

impl Conf {
    /// What the configuration says of a namespace holding `ip`, if it hands
    /// out that address.
    pub fn evidence(&self, ip: IpAddr) -> Option<String> {
        let subnet = self.subnets.iter().find(|s| s.contains(&ip))?;
        Some(format!(
            "its address {ip} is in subnet {subnet} of the node's CNI config {} (network {}: {})",
            self.file,
            self.network,
            self.plugins.join(", ")
        ))
    }
}

/// The configurations in `dir` (`.conf`, `.conflist`, `.json`, as libcni
/// loads them); a file that is no configuration is passed over with a
/// warning, a missing directory has none.
pub fn read_dir(dir: &Path, warnings: &mut Vec<String>) -> Vec<Conf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| ["conf", "conflist", "json"].iter().any(|e| x == *e))
        })
        .take(MAX_FILES)
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let regular =
            std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() <= MAX_BYTES);
        let text = regular
            .then(|| std::fs::read_to_string(&path).ok())
            .flatten();
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match text.and_then(|t| parse(&file, &t)) {
            Some(c) => out.push(c),
            None => warnings.push(format!(
                "CNI config {}: not a CNI configuration; passed over",
                path.display()
            )),
        }
    }
    out
}

/// A `.conf` (one plugin) or `.conflist` (a chain) as JSON.
fn parse(file: &str, text: &str) -> Option<Conf> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let network = v.get("name")?.as_str()?.to_string();
    let plugins: Vec<String> = match v.get("plugins").and_then(|p| p.as_array()) {
        Some(list) => list
            .iter()
            .filter_map(|p| p.get("type")?.as_str().map(str::to_string))
            .collect(),
        None => vec![v.get("type")?.as_str()?.to_string()],
    };
    let mut subnets = Vec::new();
    subnets_in(&v, &mut subnets);
    Some(Conf {
        file: file.to_string(),
        network,
        plugins,
        subnets,
    })
}

/// Every `"subnet": "<cidr>"` anywhere in the configuration (host-local's
/// `subnet` and `ranges`, the bridge plugin's, a delegate's).
fn subnets_in(v: &serde_json::Value, out: &mut Vec<IpNet>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, x) in map {
                let cidr = x.as_str().and_then(|s| s.parse::<IpNet>().ok());
                match cidr {
                    Some(net) if k == "subnet" => {
                        if !out.contains(&net.trunc()) {
                            out.push(net.trunc());
                        }
                    }
                    _ => subnets_in(x, out),
                }
            }
        }
        serde_json::Value::Array(list) => list.iter().for_each(|x| subnets_in(x, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_and_its_ipam_ranges_are_read() {
        let dir = tempfile::tempdir().expect("dir");
        let list = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "cbr0",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]]}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        std::fs::write(dir.path().join("10-bridge.conflist"), list.to_string()).expect("write");
        std::fs::write(dir.path().join("99-broken.conf"), "{").expect("write");
        std::fs::write(dir.path().join("README"), "not read").expect("write");
        let mut warnings = Vec::new();
        let confs = read_dir(dir.path(), &mut warnings);
        assert_eq!(confs.len(), 1, "{confs:?}");
        assert_eq!(confs[0].plugins, vec!["bridge", "portmap"]);
        assert_eq!(confs[0].subnets.len(), 2);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("99-broken.conf"));
        let ip: IpAddr = "10.244.1.7".parse().expect("ip");
        assert_eq!(
            confs[0].evidence(ip).as_deref(),
            Some("its address 10.244.1.7 is in subnet 10.244.1.0/24 of the node's CNI config 10-bridge.conflist (network cbr0: bridge, portmap)")
        );
        assert!(confs[0]
            .evidence("10.245.0.1".parse().expect("ip"))
            .is_none());
        assert!(read_dir(&dir.path().join("absent"), &mut warnings).is_empty());
    }
}
