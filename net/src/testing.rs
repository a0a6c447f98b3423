//! Building blocks for root tests in any Rust project's `cargo test`
//! (feature `testing`): throwaway host and pod namespaces, one
//! [`require_root`], and a guard that fails a test which changed the
//! machine's own network.
//!
//! They are plain functions so that the library does not depend on a test
//! framework; wrap them as rstest fixtures in your test crate:
//!
//! ```no_run
//! use cnilab_net::netns::Netns;
//! use cnilab_net::testing;
//! use rstest::{fixture, rstest};
//!
//! #[fixture]
//! fn pod() -> Netns {
//!     testing::pod_netns()
//! }
//!
//! #[rstest]
//! fn starts_with_lo_only(pod: Netns) {
//!     let _host = testing::host_untouched();
//!     let names: Vec<String> = pod.links().unwrap().into_iter().map(|l| l.name).collect();
//!     assert_eq!(names, ["lo"]);
//! }
//! ```
//!
//! Each function panics with a message that says what to fix (for example
//! "must run as root"): a root test must fail, never pass silently.

use crate::netns::{self, Netns};
use crate::snapshot::HostNetwork;

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

/// Snapshots the machine's own network; panics with the reason when it
/// cannot be read (never passes without looking).
pub fn host_network() -> HostNetwork {
    require_root();
    network_of(&Netns::machine().unwrap_or_else(|e| panic!("{e}")))
}

/// The same snapshot of any namespace (tests of the snapshot itself use a
/// throwaway one).
pub fn network_of(ns: &Netns) -> HostNetwork {
    HostNetwork::of(ns).unwrap_or_else(|e| panic!("links, addresses, routes of {}: {e}", ns.name()))
}

/// A guard for a root test: snapshots the machine's own network when made,
/// and when dropped at the end of the test compares again and fails the
/// test if anything differs (links, addresses, routes v4/v6, nft and
/// iptables rules, forwarding sysctls). Tests work only in namespaces they
/// create, so the machine's network must be exactly as before.
///
/// ```no_run
/// let _host = cnilab_net::testing::host_untouched();
/// // ... the test ...
/// ```
#[must_use = "bind it (`let _host = ...`): dropped at once it checks nothing"]
pub struct HostUntouched {
    before: HostNetwork,
}

pub fn host_untouched() -> HostUntouched {
    HostUntouched {
        before: host_network(),
    }
}

impl HostUntouched {
    /// Panics with every difference since the guard was made.
    pub fn check(&self) {
        let changes = host_network().changes_since(&self.before);
        assert!(
            changes.is_empty(),
            "the machine's own network changed during this test:\n  {}",
            changes.join("\n  ")
        );
    }
}

impl Drop for HostUntouched {
    fn drop(&mut self) {
        // A test that already failed keeps its own message.
        if !std::thread::panicking() {
            self.check();
        }
    }
}
