//! The harness tests' one helper home: rstest fixtures for root tests, built
//! on `cnilab_harness::testing` (see its docs for using them in another
//! crate), and in [`e2e`] what the e2e plan tests share.
#![allow(dead_code, unused_imports)]

pub mod e2e;

pub use cnilab_harness::netns::Netns;
pub use cnilab_harness::runtime::{NetworkConfig, Runtime, RuntimeConf};
use rstest::fixture;
use std::path::{Path, PathBuf};

/// Debian's reference plugins (`apt-get install containernetworking-plugins`).
pub const REFERENCE_DIR: &str = "/usr/lib/cni";

pub use cnilab_harness::testing::{host_untouched, require_root};

/// Fails with a clear message when the reference plugins are missing.
pub fn require_reference() {
    for p in ["bridge", "host-local"] {
        let path = Path::new(REFERENCE_DIR).join(p);
        assert!(
            path.is_file(),
            "{} is missing: apt-get install containernetworking-plugins",
            path.display()
        );
    }
}

/// A throwaway namespace standing for the node; `lo` is up.
#[fixture]
pub fn host() -> Netns {
    cnilab_harness::testing::host_netns()
}

/// A throwaway namespace standing for a pod.
#[fixture]
pub fn pod() -> Netns {
    cnilab_harness::testing::pod_netns()
}

/// A runtime whose plugins run inside `host`, found on `cni_path`.
pub fn runtime_in(host: &Netns, cni_path: &str) -> Runtime {
    cnilab_harness::testing::runtime(host, cni_path)
}

pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

pub fn broken_plugins_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broken-plugins")
}

/// The reference example config with `from` replaced by `to`, written to
/// `dir/<name>` (the replacement must change something).
pub fn reference_config_edited(dir: &Path, name: &str, from: &str, to: &str) -> PathBuf {
    let text =
        std::fs::read_to_string(examples_dir().join("reference-bridge.conflist")).expect("config");
    let edited = text.replace(from, to);
    assert_ne!(edited, text, "the example config names {from}");
    let config = dir.join(name);
    std::fs::write(&config, edited).expect("write");
    config
}

/// The reference bridge + host-local example network, its IPAM store in `data_dir`.
pub fn reference_network(data_dir: &Path) -> NetworkConfig {
    require_reference();
    let mut net = NetworkConfig::load(&examples_dir().join("reference-bridge.conflist"))
        .expect("example config loads");
    net.set_ipam_data_dir(data_dir);
    net
}
