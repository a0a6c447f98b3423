//! cnilab-agent: the node agent. It learns the cluster's nodes (from the
//! Kubernetes API or, in the lab, a nodes file), routes every other node's
//! pod CIDRs via that node's InternalIP, and sets this node up for the
//! cnilab-bridge plugin (conflist, forwarding, masquerade).
//!
//! Where things happen: [`plan`] decides route changes (with [`cidrs`]:
//! which pod CIDRs are in scope, overlap queries in O(log n)), [`routes`] reads
//! the table (through `cnilab_net::nl`) and makes them, [`reconcile`] runs
//! one pass, [`run`] holds the loop, [`source`] the node sources,
//! [`nftables`] (loaded with `cnilab_net::nft`) and [`cni_config`] the node
//! setup. Namespaces and netlink connections come from `cnilab_net::netns`.

pub mod cidrs;
pub mod cli;
pub mod cni_config;
pub mod error;
pub mod files;
pub mod metrics;
pub mod nftables;
pub mod nodes;
pub mod plan;
pub mod reconcile;
pub mod routes;
pub mod run;
pub mod source;
