//! Building blocks for plugin tests in any Rust project's `cargo test`:
//! a host namespace, a pod namespace, a runtime bound to a plugin dir.
//! The namespace fixtures, `require_root` and the host-untouched guard are
//! cnilab-net's (`cnilab_net::testing`, re-exported here so harness users
//! need one import); the runtime fixture is the harness's own.
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

// Re-export: one set of namespace fixtures for the workspace (cnilab_net).
pub use cnilab_net::testing::*;

use crate::netns::Netns;
use crate::runtime::Runtime;

/// A runtime that finds plugins on `cni_path` and runs them inside `host`.
pub fn runtime(host: &Netns, cni_path: &str) -> Runtime {
    Runtime::new(cni_path)
        .in_netns(host)
        .unwrap_or_else(|e| panic!("runtime in {}: {e}", host.name()))
}
