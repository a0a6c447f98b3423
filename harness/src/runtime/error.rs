//! What can go wrong when driving a plugin.

use super::Execution;
use cnilab_net::spec::{ErrorBody, Version};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot read network config {path} (--config FILE): {reason}")]
    ReadConfig { path: PathBuf, reason: String },
    #[error("invalid network config {path}: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error("plugin {name:?} not found in CNI_PATH {cni_path} (check --plugin-dir)")]
    PluginNotFound { name: String, cni_path: String },
    #[error("cannot start plugin {path}: {reason}")]
    Spawn { path: PathBuf, reason: String },
    #[error("plugin {} timed out after {:?} and was killed", .0.plugin.display(), .0.duration)]
    Timeout(Box<Execution>),
    #[error("plugin {} failed: code {} {}{}", .exec.plugin.display(), .error.code, .error.msg, if .error.details.is_empty() { String::new() } else { format!(" ({})", .error.details) })]
    Plugin {
        error: ErrorBody,
        exec: Box<Execution>,
    },
    #[error("plugin {} exited with {} without a CNI error body on stdout", .0.plugin.display(), .0.status_text())]
    Crashed(Box<Execution>),
    #[error("plugin defect in {}: {reason}", .exec.plugin.display())]
    Defect {
        reason: String,
        exec: Box<Execution>,
    },
    #[error("{command} is disabled by the network config ({key})")]
    Disabled {
        command: &'static str,
        key: &'static str,
    },
    #[error("{command} needs config version {need} or later; the network uses {have}")]
    VersionTooLow {
        command: &'static str,
        need: Version,
        have: Version,
    },
    #[error(
        "no cached ADD result for network {network}, container {container_id}, ifname {ifname}"
    )]
    NotCached {
        network: String,
        container_id: String,
        ifname: String,
    },
    #[error("cache {path}: {reason}")]
    Cache { path: PathBuf, reason: String },
}

impl RuntimeError {
    /// The plugin execution this error came from, if any (for evidence).
    pub fn execution(&self) -> Option<&Execution> {
        match self {
            RuntimeError::Timeout(e) | RuntimeError::Crashed(e) => Some(e),
            RuntimeError::Plugin { exec, .. } | RuntimeError::Defect { exec, .. } => Some(exec),
            _ => None,
        }
    }

    /// The CNI error body, when the plugin printed one.
    pub fn error_body(&self) -> Option<&ErrorBody> {
        match self {
            RuntimeError::Plugin { error, .. } => Some(error),
            _ => None,
        }
    }
}
