//! Building blocks for plugin tests in any Rust project's `cargo test`:
//! a host namespace, a pod namespace, a runtime bound to a plugin dir.
//!
//! They are plain functions so that the library does not depend on a test
//! framework; wrap them as rstest fixtures in your test crate:
//!
//! ```no_run
//! use cnilab_harness::netns::Netns;
//! use cnilab_harness::runtime::{NetworkConfig, Runtime, RuntimeConf};
//! use cnilab_harness::testing;
//! use rstest::{fixture, rstest};
//!
//! #[fixture]
//! fn host() -> Netns {
//!     testing::host_netns()
//! }
//!
//! #[fixture]
//! fn pod() -> Netns {
//!     testing::pod_netns()
//! }
//!
//! #[rstest]
//! fn bridge_adds_eth0(host: Netns, pod: Netns) {
//!     let runtime = testing::runtime(&host, "/usr/lib/cni");
//!     let store = tempfile::tempdir().unwrap();
//!     let mut net = NetworkConfig::load("my.conflist".as_ref()).unwrap();
//!     net.set_ipam_data_dir(store.path());
//!     let rt = RuntimeConf::new("c1", Some(pod.path()), "eth0");
//!     runtime.add(&net, &rt).expect("ADD");
//!     assert!(pod.links().unwrap().iter().any(|l| l.name == "eth0"));
//!     runtime.del(&net, &rt).expect("DEL");
//! }
//! ```
//!
//! Each function panics with a message that says what to fix (for example
//! "must run as root"): a root test must fail, never pass silently.

use crate::netns::{self, Netns};
use crate::runtime::Runtime;

/// Panics unless the process can create namespaces.
pub fn require_root() {
    if let Err(e) = netns::require_root() {
        panic!("this test creates network namespaces and must run as root: {e}");
    }
}

/// A throwaway namespace standing for the node, with `lo` up.
pub fn host_netns() -> Netns {
    require_root();
    let ns = Netns::with_label("t-host").unwrap_or_else(|e| panic!("host netns: {e}"));
    ns.set_lo_up()
        .unwrap_or_else(|e| panic!("lo up in {}: {e}", ns.name()));
    ns
}

/// A throwaway namespace standing for a pod.
pub fn pod_netns() -> Netns {
    require_root();
    Netns::with_label("t-pod").unwrap_or_else(|e| panic!("pod netns: {e}"))
}

/// A runtime that finds plugins on `cni_path` and runs them inside `host`.
pub fn runtime(host: &Netns, cni_path: &str) -> Runtime {
    Runtime::new(cni_path)
        .in_netns(host)
        .unwrap_or_else(|e| panic!("runtime in {}: {e}", host.name()))
}
