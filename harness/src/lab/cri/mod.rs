//! `lab --runtime containerd`: pods made the way kubelet makes them. Each
//! node runs its own containerd inside its network namespace (and a private
//! mount namespace), and the lab creates pods through the CRI
//! (RunPodSandbox; StopPodSandbox + RemovePodSandbox to remove them), so
//! containerd executes the CNI plugin from the node's conf and bin dirs.
//!
//! - `mod.rs`: the runtime choice, what the installed containerd supports,
//!   the per-node containerd config and CNI dirs.
//! - `daemon.rs`: one node's containerd: start, pods, stop, and the sweep of
//!   a dead run's instances (pidfiles, then the CRI, then the shims).
//! - the CRI client and the sandbox image (a static pause binary in an OCI
//!   layout tar, imported offline: containerd never pulls) are `crate::cri`.

pub mod attach;
pub mod daemon;

use super::base::LabError;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use daemon::Containerd;

use crate::cri::SANDBOX_IMAGE;

/// What the installed containerd is and what the lab does for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Support {
    /// As `containerd --version` prints it, e.g. `1.6.20~ds1`.
    pub version: String,
    pub major: u32,
    pub minor: u32,
}

impl Support {
    /// The highest CNI result version this containerd accepts from a
    /// plugin: 1.6 and 1.7 refuse 1.1.0 results ("unsupported CNI result
    /// version"); 2.x vendors a libcni that knows 1.1.0, not verified here,
    /// so the lab stays at 1.0.0 for every version.
    pub fn cni_version(&self) -> &'static str {
        "1.0.0"
    }

    /// One line for the run's header.
    pub fn describe(&self) -> String {
        format!(
            "containerd {} (CRI v1, config version 2, cgroupfs; CNI results up to {}: conflists rendered at that version)",
            self.version,
            self.cni_version()
        )
    }
}

/// Parses the version word of `containerd --version`
/// (`containerd github.com/containerd/containerd 1.6.20~ds1 <commit>`).
pub fn parse_version(text: &str) -> Option<Support> {
    let word = text
        .split_whitespace()
        .map(|w| w.trim_start_matches('v'))
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))?;
    let mut parts = word.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some(Support {
        version: word.to_string(),
        major,
        minor,
    })
}

/// Checks that containerd, its runc shim, runc and ctr are installed and
/// that this containerd is one the lab can drive (1.6 or later). The error
/// says what to install: an environment error, never a plugin failure.
pub fn detect() -> Result<Support, LabError> {
    let remedy =
        "install them with `bash lab/install-deps.sh` (Debian/Ubuntu packages containerd and runc)";
    let missing: Vec<&str> = ["containerd", "containerd-shim-runc-v2", "runc", "ctr"]
        .into_iter()
        .filter(|p| !crate::util::on_path(p))
        .collect();
    if !missing.is_empty() {
        return Err(LabError::Setup(format!(
            "--runtime containerd needs {} on PATH: {remedy}",
            missing.join(", ")
        )));
    }
    if crate::cri::image::PAUSE.is_empty() {
        return Err(LabError::Setup(
            "--runtime containerd: this cnilab was built without its pause binary (no static C toolchain at build time): install gcc and libc6-dev and rebuild".into(),
        ));
    }
    let out = Command::new("containerd")
        .arg("--version")
        .output()
        .map_err(|e| LabError::Setup(format!("containerd --version: {e}; {remedy}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let support = parse_version(&text).ok_or_else(|| {
        LabError::Setup(format!(
            "cannot read the containerd version from {:?}",
            text.trim()
        ))
    })?;
    if (support.major, support.minor) < (1, 6) {
        return Err(LabError::Setup(format!(
            "containerd {} is too old for the lab (CRI v1 needs 1.6 or later): {remedy}",
            support.version
        )));
    }
    Ok(support)
}

/// Where a node's containerd keeps its files: `<node dir>/cri/`.
pub fn node_cri_dir(node_dir: &Path) -> PathBuf {
    node_dir.join("cri")
}

/// The node's CNI conf dir (the agent's `{{conf_dir}}` too) and bin dir
/// (the agent's `{{bin_dir}}`).
pub fn conf_dir(node_dir: &Path) -> PathBuf {
    node_dir.join("net.d")
}

pub fn bin_dir(node_dir: &Path) -> PathBuf {
    node_dir.join("bin")
}

/// containerd's config (version 2, read by 1.6, 1.7 and, migrated, 2.x):
/// its own root, state, sockets, runc root and CNI dirs, everything under
/// `dir`; the settings this machine needs (see /work/shared/containerd-cri.md).
pub fn config_toml(dir: &Path, conf_dir: &Path, bin_dir: &Path) -> String {
    let q = |p: &Path| toml_string(&p.display().to_string());
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        r#"version = 2
root = {root}
state = {state}
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = {sock}

[ttrpc]
  address = {ttrpc}

[{cri}]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

[{cri}.cni]
  bin_dir = {bin}
  conf_dir = {conf}
  max_conf_num = 1

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = {runc}
"#,
        root = q(&dir.join("root")),
        state = q(&dir.join("state")),
        sock = q(&daemon::socket_path(dir)),
        ttrpc = q(&dir.join("sock.ttrpc")),
        bin = q(bin_dir),
        conf = q(conf_dir),
        runc = q(&dir.join("runc")),
    )
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The conflist as containerd gets it: the rendered template with its
/// cniVersion lowered to what this containerd accepts (1.1.0 → 1.0.0).
pub fn conflist_for(text: &str, support: &Support) -> Result<String, LabError> {
    let mut v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| LabError::Setup(format!("plugin config template: {e}")))?;
    let max = support.cni_version();
    let newer = v
        .get("cniVersion")
        .and_then(|x| x.as_str())
        .is_some_and(|cur| version_key(cur) > version_key(max));
    if newer {
        v["cniVersion"] = serde_json::Value::String(max.to_string());
    }
    serde_json::to_string_pretty(&v).map_err(|e| LabError::Setup(e.to_string()))
}

fn version_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// The plugin types a conflist executes: each plugin and its delegated IPAM.
pub fn plugin_types(text: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    let mut types = Vec::new();
    for p in v["plugins"].as_array().into_iter().flatten() {
        for t in [&p["type"], &p["ipam"]["type"]] {
            if let Some(t) = t.as_str().filter(|t| !t.is_empty() && !t.contains('/')) {
                types.push(t.to_string());
            }
        }
    }
    types
}

/// Directories searched for the `loopback` plugin the CRI always calls.
const LOOPBACK_DIRS: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];

/// Fills the node's bin dir (containerd 1.6 takes ONE bin dir): a link to
/// each plugin `types` names, from `plugin_dir`, and to `loopback`. Entries
/// already there (the agent installs its plugin itself) are left alone.
pub fn fill_bin_dir(bin: &Path, plugin_dir: &str, types: &[String]) -> Result<(), LabError> {
    std::fs::create_dir_all(bin).map_err(|e| LabError::Setup(format!("{}: {e}", bin.display())))?;
    let mut wanted: Vec<(String, Vec<PathBuf>)> = types
        .iter()
        .map(|t| (t.clone(), vec![Path::new(plugin_dir).join(t)]))
        .collect();
    let mut loopback = vec![Path::new(plugin_dir).join("loopback")];
    loopback.extend(LOOPBACK_DIRS.iter().map(|d| Path::new(d).join("loopback")));
    wanted.push(("loopback".into(), loopback));
    for (name, candidates) in wanted {
        let link = bin.join(&name);
        if link.exists() {
            continue;
        }
        let Some(target) = candidates.into_iter().find(|c| c.is_file()) else {
            let hint = if name == "loopback" {
                " nor in /usr/lib/cni, /opt/cni/bin (the CRI calls `loopback` for every pod: install containernetworking-plugins)"
            } else {
                ""
            };
            return Err(LabError::Setup(format!(
                "--runtime containerd: plugin {name:?} not found in {plugin_dir}{hint}"
            )));
        };
        std::os::unix::fs::symlink(&target, &link)
            .map_err(|e| LabError::Setup(format!("link {}: {e}", link.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_debian_ubuntu_and_upstream_builds_parse() {
        let deb = parse_version(
            "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3",
        )
        .expect("debian");
        assert_eq!((deb.major, deb.minor), (1, 6));
        assert_eq!(deb.version, "1.6.20~ds1");
        let up = parse_version(
            "containerd containerd.io v1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da",
        )
        .expect("upstream");
        assert_eq!((up.major, up.minor), (1, 7));
        assert!(parse_version("containerd unknown").is_none());
    }

    #[test]
    fn conflists_are_lowered_to_what_containerd_accepts() {
        let s = parse_version("containerd x 1.6.20").expect("v");
        let out =
            conflist_for(r#"{"cniVersion":"1.1.0","name":"n","plugins":[]}"#, &s).expect("lowered");
        assert!(out.contains("\"cniVersion\": \"1.0.0\""), "{out}");
        let out =
            conflist_for(r#"{"cniVersion":"0.4.0","name":"n","plugins":[]}"#, &s).expect("kept");
        assert!(out.contains("\"0.4.0\""), "an older version stays: {out}");
    }

    #[test]
    fn plugin_types_include_delegated_ipam() {
        let t = plugin_types(
            r#"{"plugins":[{"type":"bridge","ipam":{"type":"host-local"}},{"type":"portmap"}]}"#,
        );
        assert_eq!(t, ["bridge", "host-local", "portmap"]);
    }

    #[test]
    fn the_config_keeps_every_path_in_the_node_dir() {
        let dir = Path::new("/run/cnilab/x/node1/cri");
        let text = config_toml(dir, Path::new("/n/net.d"), Path::new("/n/bin"));
        let v: toml::Table = toml::from_str(&text).expect("valid TOML");
        assert_eq!(v["root"].as_str(), Some("/run/cnilab/x/node1/cri/root"));
        let cri = &v["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["restrict_oom_score_adj"].as_bool(), Some(true));
        assert_eq!(cri["netns_mounts_under_state_dir"].as_bool(), Some(true));
        assert_eq!(cri["cni"]["bin_dir"].as_str(), Some("/n/bin"));
        assert_eq!(
            cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(),
            Some(false)
        );
    }
}
