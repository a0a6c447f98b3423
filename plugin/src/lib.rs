//! cnilab-bridge: a CNI 1.1.0 bridge plugin with built-in host-local-style IPAM.
//!
//! Where things happen: [`commands`] has one file per CNI verb (ADD, DEL,
//! CHECK, GC, STATUS, VERSION) and the dispatch; [`env`] reads the CNI
//! environment, [`config`] parses and validates the network config into a
//! plan, [`ipam`] is the address store, [`attachments`] the
//! per-attachment locks and caches beside it, [`masq`] the masquerade rules,
//! [`error`] the CNI error JSON, [`notes`] what the log line must say.
//! Arrows point down: `commands` uses the rest; `attachments` uses
//! `ipam`; `ipam`, `config`, `env`, `masq`, `notes` and `error` use no
//! command. CNI types, namespaces, netlink, nft and
//! name derivation come from `cnilab_net` (shared with the agent and the
//! harness).

pub mod attachments;
pub mod commands;
pub mod config;
pub mod env;
pub mod error;
pub mod ipam;
pub mod masq;
pub mod notes;
