//! The lab's node source: a JSON or TOML file, polled for changes.

use crate::error::{AgentError, Result};
use crate::metrics::Metrics;
use crate::nodes::{parse_nodes_file, Snapshot};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Reads and parses the nodes file once.
pub fn read(path: &Path) -> Result<Snapshot> {
    let text = crate::files::read_bounded(path).map_err(|source| AgentError::NodesFileRead {
        path: path.to_path_buf(),
        source,
    })?;
    parse_nodes_file(path, &text)
}

/// Polls `path` every `interval` and publishes the node list whenever its
/// content changes. A file that cannot be read or parsed is reported and the
/// last good list stays in force (an editor's half-written save must not
/// delete every route).
pub async fn watch(
    path: PathBuf,
    interval: Duration,
    mut last: Option<Snapshot>,
    mut publish: impl FnMut(Snapshot),
    metrics: Arc<Metrics>,
) {
    let mut last_text: Option<String> = None;
    let mut reported_error: Option<String> = None;
    loop {
        tokio::time::sleep(interval).await;
        let text = match crate::files::read_bounded(&path) {
            Ok(text) => text,
            Err(e) => {
                report(
                    &mut reported_error,
                    &metrics,
                    format!("read nodes file {}: {e}", path.display()),
                );
                continue;
            }
        };
        if last_text.as_deref() == Some(text.as_str()) {
            continue;
        }
        match parse_nodes_file(&path, &text) {
            Ok(nodes) => {
                reported_error = None;
                last_text = Some(text);
                if last.as_ref() != Some(&nodes) {
                    tracing::info!(path = %path.display(), nodes = nodes.len(), "nodes file changed");
                    last = Some(nodes.clone());
                    publish(nodes);
                }
            }
            Err(e) => report(&mut reported_error, &metrics, e.to_string()),
        }
    }
}

fn report(reported: &mut Option<String>, metrics: &Metrics, message: String) {
    if reported.as_deref() != Some(message.as_str()) {
        metrics.source_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %message, "keeping the last good node list");
        *reported = Some(message);
    }
}
