//! A lab ready to be built: what the builder needs besides the topology,
//! found and checked once, before anything is made. `lab run`, `lab up`
//! and `scenario run` make their [`Plan`] in `cli/lab_prep.rs` (and print
//! what it found); `Lab::up` makes one for callers that come without
//! (tests, `sweep`); the builder ([`super::build`]) only consumes it and
//! asks nothing back: the plugin directory, the config template, the pods'
//! MTU and, with `--runtime containerd`, what the installed containerd
//! supports.

use super::base::{plugin_dir, LabError, RuntimeKind};
use super::template::checked_template;
use super::topology::Topology;

/// A topology with everything its lab needs found and checked.
pub struct Plan {
    pub topo: Topology,
    /// The plugin directory (the flag's, the topology's, else the bundled
    /// one), `:`-joined.
    pub plugin_dir: String,
    /// The plugin's config template, checked against the topology.
    pub template: String,
    /// The pods' MTU (`{{mtu}}`): the underlay's, less the overlay's cost.
    pub pod_mtu: u32,
    /// `--runtime containerd`: what the installed containerd supports.
    pub containerd: Option<super::cri::Support>,
}

impl Plan {
    /// Finds and checks what `topo`'s lab needs; `plugin_dir` is the
    /// `--plugin-dir` flag. Nothing is built or changed.
    pub fn new(
        topo: Topology,
        plugin_dir_flag: Option<&str>,
        runtime: RuntimeKind,
    ) -> Result<Plan, LabError> {
        let containerd = match runtime {
            RuntimeKind::Containerd => Some(super::cri::detect()?),
            RuntimeKind::Direct => None,
        };
        let plugin_dir = plugin_dir(plugin_dir_flag, &topo).map_err(LabError::Setup)?;
        let pod_mtu = topo.pod_mtu();
        let template = checked_template(&topo, pod_mtu)?;
        Ok(Plan {
            topo,
            plugin_dir,
            template,
            pod_mtu,
            containerd,
        })
    }
}
