//! The one setup that conform, soak and bench share: a network config with
//! its IPAM `dataDir` moved to a scratch directory, a throwaway host
//! namespace with `lo` up, and a runtime that runs the plugins in it.

use super::{NetworkConfig, Runtime, RuntimeError};
use crate::netns::{Netns, NetnsError};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One network, ready to be driven in a namespace of its own.
pub struct Session {
    /// The config, with `ipam.dataDir` set to `data_dir`.
    pub net: NetworkConfig,
    pub data_dir: PathBuf,
    /// Where the plugins run (their bridges and host veths live here).
    pub host: Netns,
    pub runtime: Runtime,
}

impl Session {
    /// Sets up `net` for `plugin_dir` (colon-separated, like `CNI_PATH`):
    /// the IPAM store goes to `data_dir`, the host namespace is labelled
    /// `host_label`, and every plugin call is killed after `timeout`.
    pub fn open<E>(
        plugin_dir: &str,
        net: &NetworkConfig,
        data_dir: &Path,
        host_label: &str,
        timeout: Duration,
    ) -> Result<Session, E>
    where
        E: From<NetnsError> + From<Box<RuntimeError>>,
    {
        let mut net = net.clone();
        net.set_ipam_data_dir(data_dir);
        let host = Netns::with_label(host_label)?;
        host.set_lo_up()?;
        let runtime = Runtime::new(plugin_dir)
            .in_netns(&host)
            .map_err(Box::new)?
            .with_timeout(timeout);
        Ok(Session {
            net,
            data_dir: data_dir.to_path_buf(),
            host,
            runtime,
        })
    }
}
