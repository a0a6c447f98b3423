//! VERSION: only `CNI_COMMAND` is required; the answer echoes the input's
//! version when it is one we speak.

use super::Outcome;
use crate::config::sniff_version;
use cnilab_net::spec::{self, VersionInfo};
use std::time::Instant;

pub fn run(stdin: &[u8], what: String, started: Instant) -> Outcome {
    let cni_version = sniff_version(stdin)
        .filter(|v| spec::is_supported(v))
        .unwrap_or_else(|| spec::CURRENT_VERSION.to_string());
    let info = VersionInfo {
        cni_version,
        supported_versions: spec::SUPPORTED_VERSIONS
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    Outcome {
        stdout: serde_json::to_string(&info).unwrap_or_default(),
        exit_code: 0,
        log: format!("{what} ok in {:?}", started.elapsed()),
    }
}
