//! rstest fixtures for root tests: a throwaway host namespace, a pod
//! namespace, and a runtime that drives plugins from a directory inside the
//! host namespace.
//!
//! ```ignore
//! use rstest::rstest;
//! mod common;
//! use common::*;
//!
//! #[rstest]
//! fn bridge_adds_eth0(host: Netns, pod: Netns) {
//!     let runtime = runtime_in(&host, REFERENCE_DIR);
//!     let store = tempfile::tempdir().unwrap();
//!     let net = reference_network(store.path());
//!     let rt = RuntimeConf::new("c1", Some(pod.path()), "eth0");
//!     let added = runtime.add(&net, &rt).expect("ADD");
//!     assert!(pod.links().unwrap().iter().any(|l| l.name == "eth0"));
//!     runtime.del(&net, &rt).expect("DEL");
//! }
//! ```
#![allow(dead_code, unused_imports)]

pub use cnilab_harness::netns::Netns;
pub use cnilab_harness::runtime::{NetworkConfig, Runtime, RuntimeConf};
use rstest::fixture;
use std::path::{Path, PathBuf};

/// Debian's reference plugins (`apt-get install containernetworking-plugins`).
pub const REFERENCE_DIR: &str = "/usr/lib/cni";

/// Fails (never skips) when the tests cannot do their job.
pub fn require_root() {
    if let Err(e) = cnilab_harness::netns::require_root() {
        panic!("this test creates network namespaces and must run as root: {e}");
    }
}

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
    require_root();
    let ns = Netns::with_label("t-host").expect("create host netns");
    ns.set_lo_up().expect("lo up");
    ns
}

/// A throwaway namespace standing for a pod.
#[fixture]
pub fn pod() -> Netns {
    require_root();
    Netns::with_label("t-pod").expect("create pod netns")
}

/// A runtime whose plugins run inside `host`, found on `cni_path`.
pub fn runtime_in(host: &Netns, cni_path: &str) -> Runtime {
    Runtime::new(cni_path)
        .in_netns(host)
        .expect("runtime in host netns")
}

pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

pub fn broken_plugins_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broken-plugins")
}

/// The reference bridge + host-local example network, its IPAM store in `data_dir`.
pub fn reference_network(data_dir: &Path) -> NetworkConfig {
    require_reference();
    let mut net = NetworkConfig::load(&examples_dir().join("reference-bridge.conflist"))
        .expect("example config loads");
    net.set_ipam_data_dir(data_dir);
    net
}
