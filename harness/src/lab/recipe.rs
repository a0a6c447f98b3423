//! A lab ready to be built: what the builder needs besides the topology,
//! found and checked once, before anything is made. `lab run`, `lab up`
//! and `scenario run` make their [`Recipe`] in `cli/lab_prep.rs` (and print
//! what it found); `Lab::up` makes one for callers that come without
//! (tests, `sweep`); the builder ([`super::build`]) only consumes it and
//! asks nothing back: the plugin directory, the config template, the pods'
//! MTU and, with `--runtime containerd`, what the installed containerd
//! supports.

use super::base::{given_plugin_dir, plugin_dir, LabError, RuntimeKind};
use super::template::checked_template;
use super::topology::{Masquerade, Routing, Topology};

/// A topology with everything its lab needs found and checked.
pub struct Recipe {
    pub topo: Topology,
    /// The plugin directory (the flag's, the topology's, else the bundled
    /// one), `:`-joined.
    pub plugin_dir: String,
    /// No directory was given (flag or topology): the bundled cnilab-bridge.
    pub bundled: bool,
    /// The plugin's config template, checked against the topology.
    pub template: String,
    /// The pods' MTU (`{{mtu}}`): the underlay's, less the overlay's cost.
    pub pod_mtu: u32,
    /// `--runtime containerd`: what the installed containerd supports.
    pub containerd: Option<super::cri::Support>,
}

impl Recipe {
    /// Finds and checks what `topo`'s lab needs; `plugin_dir` is the
    /// `--plugin-dir` flag. Nothing is built or changed.
    pub fn new(
        topo: Topology,
        plugin_dir_flag: Option<&str>,
        runtime: RuntimeKind,
    ) -> Result<Recipe, LabError> {
        has_bridge(plugin_dir_flag, &topo)?;
        let containerd = match runtime {
            RuntimeKind::Containerd => Some(super::cri::detect()?),
            RuntimeKind::Direct => None,
        };
        let bundled = given_plugin_dir(plugin_dir_flag, &topo).is_none();
        let plugin_dir = plugin_dir(plugin_dir_flag, &topo).map_err(LabError::Setup)?;
        let pod_mtu = topo.pod_mtu();
        let template = checked_template(&topo, pod_mtu)?;
        Ok(Recipe {
            topo,
            plugin_dir,
            bundled,
            template,
            pod_mtu,
            containerd,
        })
    }

    /// One line for the header of `lab run` and `lab up`: the lab's name,
    /// size, plugin directory, routing and masquerade.
    pub fn describe(&self) -> String {
        let topo = &self.topo;
        let pods: usize = topo.nodes.len() * topo.pods_per_node;
        let plugin_dir = match self.bundled {
            true => "(bundled cnilab-bridge)",
            false => self.plugin_dir.as_str(),
        };
        format!(
            "{}: {} nodes, {pods} pods, plugin dir {plugin_dir}, {}, {}",
            topo.name,
            topo.nodes.len(),
            match topo.routing {
                Routing::Static => "static routes",
                Routing::Agent => "routes by the agent",
                Routing::Vxlan => "a VXLAN overlay",
            },
            match topo.masquerade {
                Masquerade::Plugin => "the plugin masquerades",
                Masquerade::Node => "the nodes masquerade",
                Masquerade::None => "nobody masquerades",
            }
        )
    }
}

/// A plugin directory given (flag or topology) without a template of the
/// topology's has the cnilab-bridge the default template needs.
fn has_bridge(plugin_dir_flag: Option<&str>, topo: &Topology) -> Result<(), LabError> {
    let dir = given_plugin_dir(plugin_dir_flag, topo);
    let template = topo.plugin.as_ref().and_then(|p| p.config.as_ref());
    if let (Some(dir), None) = (dir, template) {
        if !std::env::split_paths(dir).any(|d| d.join("cnilab-bridge").is_file()) {
            return Err(LabError::Setup(format!(
                "--plugin-dir {dir} has no cnilab-bridge, which the default config template uses: pass --config TEMPLATE for your plugin (see `cnilab lab run --help` for the placeholders)"
            )));
        }
    }
    Ok(())
}
