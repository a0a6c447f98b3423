//! What `lab run`, `lab up` and `scenario run` do before a lab is built:
//! the plugin's config template made the topology's, the plugin directory
//! checked, and the runtime said.

use crate::lab::cri::{self, RuntimeKind};
use crate::lab::topology::{Masquerade, PluginSpec, Topology};
use std::path::Path;

/// Makes `config` the plugin's template. A template that cannot tell the
/// plugin to masquerade (no `{{ip_masq}}`) in a lab whose masquerade was not
/// chosen by a topology file for its plugin (`generated`: a `--nodes` lab,
/// or a scenario's, which describes the cluster): the nodes masquerade, as an
/// agent would.
pub(super) fn use_template(topo: &mut Topology, config: &Path, generated: bool) {
    let tells_plugin = crate::assets::read_to_string(config)
        .map(|t| t.contains("{{ip_masq}}"))
        .unwrap_or(true);
    if generated && !tells_plugin && topo.masquerade == Masquerade::Plugin {
        topo.masquerade = Masquerade::Node;
    }
    let dir = topo.plugin.as_ref().and_then(|p| p.dir.clone());
    topo.plugin = Some(PluginSpec {
        dir,
        config: Some(config.to_path_buf()),
    });
}

/// The plugin directory (the flag's, else the topology's) has the
/// cnilab-bridge the default template needs, or the bundled one is there;
/// then the topology's template is sound. Nothing is built otherwise.
pub(super) fn check_plugin(
    plugin_dir: &Option<String>,
    topo: &Topology,
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = crate::lab::base::given_plugin_dir(plugin_dir.as_deref(), topo);
    let template = topo.plugin.as_ref().and_then(|p| p.config.as_ref());
    if let (Some(dir), None) = (dir, template) {
        let has_bridge = std::env::split_paths(dir).any(|d| d.join("cnilab-bridge").is_file());
        if !has_bridge {
            return Err(format!(
                "--plugin-dir {dir} has no cnilab-bridge, which the default config template uses: pass --config TEMPLATE for your plugin (see `cnilab lab run --help` for the placeholders)"
            )
            .into());
        }
    }
    // None given: the bundled plugin must be there (the error says how).
    crate::lab::base::plugin_dir(plugin_dir.as_deref(), topo)?;
    crate::lab::template::check_template_of(topo)?;
    Ok(())
}

/// With `--runtime containerd`: which containerd runs the pods and what it
/// supports; a missing or unusable containerd is an environment error (exit 2).
pub(super) fn runtime_header(runtime: RuntimeKind) -> Result<(), Box<dyn std::error::Error>> {
    if runtime == RuntimeKind::Containerd {
        let support = cri::detect()?;
        eprintln!("🐳 runtime: {}", support.describe());
    }
    Ok(())
}
