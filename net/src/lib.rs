//! cnilab-net: network namespaces, netlink and nftables for the whole
//! workspace. The plugin, the agent and the harness build on it, so there
//! is one CNI result type, one namespace helper and one Link/Address/Route
//! type in the project.
//!
//! Where things happen: [`spec`] holds the CNI 1.1 types (pure data);
//! [`netns`] is the only place that calls `setns` ([`netns::run_in`] and
//! [`netns::netlink_job`], on dedicated threads) and holds the throwaway [`netns::Netns`] and
//! [`netns::sweep`]; [`nl`] reads and writes links, addresses and routes
//! through a handle bound to one namespace; [`nft`] runs `nft -f -` in a
//! namespace; [`masquerade`] writes a node's masquerade chain (the agent's
//! and the lab's); [`nftnl`] adds and removes set elements over netlink (the
//! per-pod masquerade change, no process); [`naming`] derives veth names and
//! MACs (pure); [`snapshot`]
//! reads what a namespace holds and compares two readings; [`cluster`]
//! has the node sanity rules (NAT address, overlapping pod CIDRs); [`testing`]
//! (feature `testing`) has the root-test fixtures and `require_root`.
//!
//! Dependencies stay those of the plugin binary (no kube, no clap), since
//! the plugin starts once per pod.

pub mod cluster;
pub mod masquerade;
pub mod naming;
pub mod netns;
pub mod nft;
pub mod nftnl;
pub mod nl;
pub mod snapshot;
pub mod spec;
#[cfg(feature = "testing")]
pub mod testing;
