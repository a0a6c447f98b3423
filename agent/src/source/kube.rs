//! The Kubernetes node source: a kube-runtime watcher on Nodes (list, then
//! watch from the list's resourceVersion, re-list when it expires), with
//! exponential backoff after errors.

use crate::error::{AgentError, Result};
use crate::metrics::Metrics;
use crate::nodes::{NodeInfo, Snapshot};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A client from `--kubeconfig`, or else the usual inference (in-cluster
/// service account, then `$KUBECONFIG` / `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| AgentError::Kubeconfig(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| AgentError::Kubeconfig(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| AgentError::Kubeconfig(e.to_string()))?,
    };
    Ok(Client::try_from(config)?)
}

/// Watches all Nodes and publishes the node list after the initial list and
/// after every change that matters to routing (name, InternalIPs,
/// podCIDRs; status heartbeats do not count). Runs until the stream ends,
/// which the watcher never does on its own.
pub async fn watch(client: Client, mut publish: impl FnMut(Snapshot), metrics: Arc<Metrics>) {
    let api: Api<Node> = Api::all(client);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut nodes: Option<BTreeMap<String, NodeInfo>> = None;
    let mut relisting: Option<BTreeMap<String, NodeInfo>> = None;
    let mut published: Option<Snapshot> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => relisting = Some(BTreeMap::new()),
            Ok(Event::InitApply(node)) => {
                if let (Some(buffer), Some(info)) = (relisting.as_mut(), NodeInfo::from_k8s(&node))
                {
                    buffer.insert(info.name.clone(), info);
                }
            }
            Ok(Event::InitDone) => {
                nodes = Some(relisting.take().unwrap_or_default());
                tracing::info!(
                    nodes = nodes.as_ref().map_or(0, BTreeMap::len),
                    "listed nodes"
                );
            }
            Ok(Event::Apply(node)) => {
                if let (Some(nodes), Some(info)) = (nodes.as_mut(), NodeInfo::from_k8s(&node)) {
                    nodes.insert(info.name.clone(), info);
                }
            }
            Ok(Event::Delete(node)) => {
                if let (Some(nodes), Some(name)) = (nodes.as_mut(), node.metadata.name.as_ref()) {
                    nodes.remove(name);
                }
            }
            Err(e) => {
                metrics.source_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "node watch failed; retrying with backoff");
                continue;
            }
        }
        // During a re-list the previous complete list stays in force.
        if let Some(nodes) = nodes.as_ref() {
            let snapshot: Snapshot = nodes.values().cloned().collect();
            if published.as_ref() != Some(&snapshot) {
                published = Some(snapshot.clone());
                publish(snapshot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// Building an HTTPS client needs exactly one rustls crypto provider
    /// (kube's `ring` feature); without it this panics at startup.
    #[tokio::test]
    async fn an_https_client_can_be_built() {
        let url = "https://127.0.0.1:6443".parse().expect("url");
        let client = kube::Client::try_from(kube::Config::new(url));
        assert!(client.is_ok());
    }
}
