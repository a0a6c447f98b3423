//! The lab's side of `--runtime containerd`: a node's CNI dirs and
//! containerd, and its pods made through the CRI.

use super::{Containerd, Support};
use crate::lab::base::LabError;
use crate::lab::built::{Lab, Pod};
use crate::lab::topology::Routing;
use crate::netns::Netns;
use std::path::Path;
use std::time::Duration;

/// The conflist's name in a node's conf dir (the agent's default too).
pub const CONFLIST: &str = "10-cnilab.conflist";
/// The sandbox image tar in a lab's run dir.
const IMAGE_TAR: &str = "pause-oci.tar";

fn setup(msg: impl Into<String>) -> LabError {
    LabError::Setup(msg.into())
}

/// Writes the sandbox image once per lab run dir.
pub fn write_image(run_dir: &Path) -> Result<(), LabError> {
    let path = run_dir.join(IMAGE_TAR);
    std::fs::write(
        &path,
        crate::cri::image::oci_layout_tar(crate::cri::image::PAUSE),
    )
    .map_err(|e| setup(format!("{}: {e}", path.display())))
}

/// The agent's flags for this containerd, when the agent is cnilab-agent:
/// its conflist at a version the CRI accepts, and with the node's own IPAM
/// store `ipam_dir` (containerd runs the plugin with the conflist as the
/// agent wrote it, which would otherwise keep the plugin's default store,
/// the host's /var/lib/cni/networks).
pub fn agent_flags(program: &Path, support: Option<&Support>, ipam_dir: &Path) -> Vec<String> {
    match support {
        Some(s) if program.file_name().is_some_and(|n| n == "cnilab-agent") => vec![
            "--cni-version".into(),
            s.cni_version().into(),
            "--ipam-data-dir".into(),
            ipam_dir.display().to_string(),
        ],
        _ => Vec::new(),
    }
}

impl Lab {
    /// Starts node `i`'s containerd (once): its bin dir of links, its
    /// conflist (rendered from the lab's template, unless an agent writes
    /// it), then containerd itself, ready with the sandbox image and the
    /// CNI network.
    pub(crate) fn start_containerd(&mut self, i: usize) -> Result<(), LabError> {
        if self.containerd.is_none() || self.nodes[i].cri.is_some() {
            return Ok(());
        }
        if !self.opts.run_dir.join(IMAGE_TAR).is_file() {
            write_image(&self.opts.run_dir)?;
        }
        self.nodes[i].cri = self.start_one(i)?;
        Ok(())
    }

    /// Starts every node's containerd, in parallel.
    pub(crate) fn start_all_containerd(&mut self) -> Result<(), LabError> {
        if self.containerd.is_none() {
            return Ok(());
        }
        write_image(&self.opts.run_dir)?;
        let lab = &*self;
        let started: Vec<Result<Option<Containerd>, LabError>> = crate::util::parallel_map(
            0..lab.nodes.len(),
            crate::util::A_THREAD_EACH,
            |i| lab.start_one(i),
            || Err(setup("containerd thread panicked")),
        );
        let mut first_error = None;
        for (i, r) in started.into_iter().enumerate() {
            match r {
                Ok(d) => self.nodes[i].cri = d,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// [`Lab::start_containerd`] without touching the node (for threads).
    fn start_one(&self, i: usize) -> Result<Option<Containerd>, LabError> {
        let Some(support) = self.containerd.as_ref() else {
            return Ok(None);
        };
        let node_dir = self.opts.run_dir.join(&self.nodes[i].spec.name);
        let conf_dir = super::conf_dir(&node_dir);
        let bin_dir = super::bin_dir(&node_dir);
        let rendered = std::fs::read_to_string(node_dir.join("net.conflist"))
            .map_err(|e| setup(format!("{}: {e}", node_dir.display())))?;
        if self.topo.routing != Routing::Agent {
            std::fs::create_dir_all(&conf_dir)
                .map_err(|e| setup(format!("{}: {e}", conf_dir.display())))?;
            let path = conf_dir.join(CONFLIST);
            std::fs::write(&path, super::conflist_for(&rendered, support)?)
                .map_err(|e| setup(format!("{}: {e}", path.display())))?;
        }
        super::fill_bin_dir(&bin_dir, &self.plugin_dir, &super::plugin_types(&rendered))?;
        let dir = super::node_cri_dir(&node_dir);
        let config = super::config_toml(&dir, &conf_dir, &bin_dir);
        let mut d = Containerd::start(
            &self.nodes[i].ns,
            &dir,
            &config,
            &self.opts.run_dir.join(IMAGE_TAR),
        )?;
        d.wait_network_ready(Duration::from_secs(15))?;
        Ok(Some(d))
    }
}

/// Makes pod `name` on a node through its containerd: RunPodSandbox, then
/// the pod's network namespace (the pause process's) gets the lab's name
/// for it under /run/netns, so probes, diagnoses and `ip netns exec` find
/// it like a direct pod's. Its addresses are read from its eth0.
pub fn add_pod(
    d: &Containerd,
    name: &str,
    make_ns: &dyn Fn(&Path) -> Result<Netns, LabError>,
) -> Result<Pod, LabError> {
    let (id, pid) = d.run_pod(name).map_err(setup)?;
    let named = make_ns(Path::new(&format!("/proc/{pid}/ns/net"))).and_then(|ns| {
        crate::lab::probe::allow_ping_sockets(ns.file())
            .map_err(|e| setup(format!("{name}: {e}")))?;
        let ips = ns
            .addresses()?
            .into_iter()
            .map(|a| a.addr)
            .filter(|a| match a.addr() {
                std::net::IpAddr::V4(v4) => !v4.is_loopback(),
                std::net::IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local(),
            })
            .collect();
        Ok((ns, ips))
    });
    match named {
        Ok((ns, ips)) => Ok(Pod {
            name: name.to_string(),
            container_id: id,
            ns,
            ips,
        }),
        Err(e) => {
            let _ = d.cri.remove_pod(&id);
            Err(e)
        }
    }
}
