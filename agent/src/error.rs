//! The agent's error type: what failed, on which object, and what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("read nodes file {path}: {source}")]
    NodesFileRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parse nodes file {path}: {message}")]
    NodesFileParse { path: PathBuf, message: String },
    #[error(
        "node {name:?} is not in the node list: check --node-name (or the NODE_NAME env, \
         set from spec.nodeName in the DaemonSet)"
    )]
    SelfNodeMissing { name: String },
    #[error(
        "node {name:?} has no podCIDR: the cluster must allocate node CIDRs \
         (kube-controller-manager --allocate-node-cidrs, kubeadm --pod-network-cidr, \
         or podCIDRs in the nodes file)"
    )]
    NoPodCidr { name: String },
    #[error("{what}: {source}")]
    Netlink {
        what: String,
        source: rtnetlink::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("nft {action} failed: {message}")]
    Nft { action: String, message: String },
    #[error("kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{0}")]
    NodeSource(String),
}

impl AgentError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        AgentError::Io {
            what: what.into(),
            source,
        }
    }

    pub fn netlink(what: impl Into<String>, source: rtnetlink::Error) -> Self {
        AgentError::Netlink {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = AgentError> = std::result::Result<T, E>;
