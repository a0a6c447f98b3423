//! `cnilab e2e vagrant-node`: the side of `cnilab e2e vagrant` that runs
//! inside a VM (as root, the host's cnilab binary copied in by
//! lab/vagrant/offline-node.sh). Not for people: its output is JSON for the
//! host side ([`super::check`]).
//!
//! - `pause-image`: the lab's sandbox image (an OCI layout tar) on stdout,
//!   for `ctr images import` at provisioning;
//! - `facts POD...`: makes the pods through the VM's containerd (the lab's
//!   CRI client; pods of the same names from an earlier check are removed
//!   first) and prints them with what the diagnoses read of the node: its
//!   routes and addresses (`ip -j`), forwarding and rp_filter sysctls and
//!   nftables ruleset.

use crate::cri::Cri;
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// containerd's CRI socket in the VM.
const SOCKET: &str = "/run/containerd/containerd.sock";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct PodFacts {
    pub name: String,
    pub pid: u32,
    /// The pod's IPv4 address on eth0.
    pub ip: String,
}

/// What `facts` prints.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct NodeReport {
    pub hostname: String,
    /// `ip -j -4 route show table main`.
    pub routes: serde_json::Value,
    /// `ip -j -4 addr show`.
    pub addresses: serde_json::Value,
    pub ip_forward: String,
    /// The larger of `all` and every interface's value (what the kernel uses).
    pub rp_filter: String,
    pub ruleset: String,
    pub pods: Vec<PodFacts>,
}

fn output(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip_json(args: &[&str]) -> Result<serde_json::Value, String> {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    let text = output("ip", &all)?;
    serde_json::from_str(&text).map_err(|e| format!("ip {}: not JSON: {e}", args.join(" ")))
}

fn sysctl(key: &str) -> String {
    std::fs::read_to_string(Path::new("/proc/sys").join(key))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

/// The first IPv4 address in an `ip -j addr` answer.
pub fn first_ipv4(addresses: &serde_json::Value) -> Option<String> {
    addresses
        .as_array()?
        .iter()
        .flat_map(|link| link["addr_info"].as_array().into_iter().flatten())
        .find(|a| a["family"] == "inet" && a["scope"] == "global")
        .and_then(|a| a["local"].as_str().map(str::to_string))
}

fn make_pods(names: &[String]) -> Result<Vec<PodFacts>, String> {
    let cri = Cri::new(Path::new(SOCKET))?;
    for old in cri.sandboxes()? {
        if names.contains(&old.name) {
            cri.remove_pod(&old.id)?;
        }
    }
    let mut pods = Vec::new();
    for name in names {
        let logs = Path::new("/var/log/cnilab-pods").join(name);
        let id = cri.run_pod(name, name, &logs)?;
        let pid = cri.sandbox_pid(&id)?;
        let target = pid.to_string();
        let addresses = {
            let text = output(
                "nsenter",
                &[
                    "--target", &target, "--net", "ip", "-j", "-4", "addr", "show", "dev", "eth0",
                ],
            )?;
            serde_json::from_str(&text).map_err(|e| format!("pod {name}: ip -j addr: {e}"))?
        };
        let ip = first_ipv4(&addresses).ok_or(format!("pod {name}: no IPv4 address on eth0"))?;
        pods.push(PodFacts {
            name: name.clone(),
            pid,
            ip,
        });
    }
    Ok(pods)
}

fn rp_filter() -> String {
    let mut values = vec![sysctl("net/ipv4/conf/all/rp_filter")];
    for entry in std::fs::read_dir("/proc/sys/net/ipv4/conf")
        .into_iter()
        .flatten()
        .flatten()
    {
        values.push(sysctl(&format!(
            "net/ipv4/conf/{}/rp_filter",
            entry.file_name().to_string_lossy()
        )));
    }
    values.into_iter().max().unwrap_or_default()
}

/// `facts POD...`: the pods made, then the node read (after the pods, so
/// that their routes and rules are in it).
pub fn facts(pods: &[String]) -> Result<NodeReport, String> {
    let pods = make_pods(pods)?;
    Ok(NodeReport {
        hostname: output("hostname", &[])?.trim().to_string(),
        routes: ip_json(&["-4", "route", "show", "table", "main"])?,
        addresses: ip_json(&["-4", "addr", "show"])?,
        ip_forward: sysctl("net/ipv4/ip_forward"),
        rp_filter: rp_filter(),
        ruleset: output("nft", &["list", "ruleset"]).unwrap_or_default(),
        pods,
    })
}

/// `cnilab e2e vagrant-node pause-image|facts`.
pub fn command(what: &str, pods: &[String]) -> Result<(), String> {
    match what {
        "pause-image" => {
            let image = &crate::cri::image::PAUSE;
            if image.is_empty() {
                return Err("this cnilab was built without its pause binary (install gcc and libc6-dev and rebuild)".into());
            }
            std::io::stdout()
                .write_all(&crate::cri::image::oci_layout_tar(image))
                .map_err(|e| format!("stdout: {e}"))
        }
        "facts" => {
            let report = facts(pods)?;
            let text = serde_json::to_string(&report).map_err(|e| e.to_string())?;
            println!("{text}");
            Ok(())
        }
        other => Err(format!(
            "unknown vagrant-node command {other:?} (pause-image, facts)"
        )),
    }
}
