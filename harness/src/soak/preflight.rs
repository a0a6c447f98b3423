//! Before the churn: every plugin of the chain is found, asked its
//! VERSION, and which operations the soak may use (CHECK, GC) is decided.

use super::{SoakError, SoakOptions};
use crate::runtime::{NetworkConfig, Runtime};
use cnilab_net::spec::Version;

/// What the soak may do with this chain, and why not where it may not.
pub(super) struct Preflight {
    /// Lines for the report: what is not run, and why.
    pub notes: Vec<String>,
    /// Each plugin of the chain with the versions its VERSION lists (empty
    /// when VERSION failed).
    pub plugin_versions: Vec<(String, Vec<String>)>,
    pub check_supported: bool,
    pub gc_supported: bool,
}

/// Finds every plugin (a missing one is an error) and decides CHECK and GC.
pub(super) fn preflight(
    opts: &SoakOptions,
    runtime: &Runtime,
    net: &NetworkConfig,
) -> Result<Preflight, SoakError> {
    let mut notes = Vec::new();
    let mut plugin_versions = Vec::new();
    for index in 0..net.plugins.len() {
        let name = net.plugin_type(index).to_string();
        runtime.find_plugin(&name).map_err(Box::new)?;
        match runtime.version(&name, &net.version.to_string()) {
            Ok((info, _)) => plugin_versions.push((name, info.supported_versions)),
            Err(e) => {
                notes.push(format!(
                    "VERSION of {name} failed ({e}): GC is not attempted"
                ));
                plugin_versions.push((name, Vec::new()));
            }
        }
    }
    let every_plugin_lists = |v: &str| {
        plugin_versions
            .iter()
            .all(|(_, l)| l.iter().any(|s| s == v))
    };
    let check_supported = net.version >= Version::V0_4_0 && !net.disable_check;
    if !check_supported {
        notes.push(format!(
            "CHECK is not run: config version {}{}",
            net.version,
            if net.disable_check {
                ", disableCheck"
            } else {
                ""
            }
        ));
    }
    let gc_supported = opts.gc_every > 0
        && net.version >= Version::V1_1_0
        && !net.disable_gc
        && every_plugin_lists("1.1.0");
    if !gc_supported {
        let why = if opts.gc_every == 0 {
            "--gc-every 0".to_string()
        } else if net.version < Version::V1_1_0 {
            format!("the config's version {} is below 1.1.0", net.version)
        } else if net.disable_gc {
            "the config sets disableGC".into()
        } else {
            let missing: Vec<&str> = plugin_versions
                .iter()
                .filter(|(_, l)| !l.iter().any(|s| s == "1.1.0"))
                .map(|(n, _)| n.as_str())
                .collect();
            format!("VERSION of {} does not list 1.1.0", missing.join(", "))
        };
        notes.push(format!("GC is never called: {why}"));
    }
    Ok(Preflight {
        notes,
        plugin_versions,
        check_supported,
        gc_supported,
    })
}
