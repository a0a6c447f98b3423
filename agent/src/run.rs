//! The `run`, `uninstall` and `install-plugin` commands.

use crate::cli::{InstallPluginArgs, NodeArgs, RunArgs, UninstallArgs};
use crate::cni_config::{self, ConflistOptions, PLUGIN_BINARY_NAME};
use crate::error::{AgentError, Result};
use crate::metrics::{self, Metrics};
use crate::nftables;
use crate::nodes::Snapshot;
use crate::reconcile::{NodeSetup, Reconciler};
use crate::routes;
use crate::source;
use std::fs::File;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

fn open_netns(node: &NodeArgs) -> Result<Option<Arc<File>>> {
    node.netns
        .as_ref()
        .map(|path| {
            crate::files::open_netns(path)
                .map(Arc::new)
                .map_err(|e| AgentError::io("open --netns", e))
        })
        .transpose()
}

pub async fn run(args: RunArgs) -> Result<()> {
    let node_name = args
        .node_name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| AgentError::Config("--node-name (or NODE_NAME) is required".into()))?;
    if args.cluster_cidrs.is_empty() {
        return Err(AgentError::Config(
            "--cluster-cidr is required (the cluster's pod network, e.g. 10.244.0.0/16): \
             it decides what is forwarded and what is masqueraded"
                .into(),
        ));
    }
    let netns = open_netns(&args.node)?;
    let metrics = Arc::new(Metrics::default());

    if let Some(binary) = &args.plugin_binary {
        if cni_config::install_plugin(binary, &args.node.cni_bin_dir)? {
            tracing::info!(dir = %args.node.cni_bin_dir.display(), "installed {PLUGIN_BINARY_NAME}");
        }
    }

    let setup = NodeSetup {
        node_name: node_name.clone(),
        cluster_cidrs: args.cluster_cidrs.clone(),
        masquerade: !args.no_masquerade,
        conflist_path: args.node.cni_conf_dir.join(&args.node.cni_conf_name),
        conflist: ConflistOptions {
            network_name: args.network_name.clone(),
            bridge: args.bridge.clone(),
            mtu: args.mtu,
            portmap: args.portmap,
            plugin_ip_masq: args.no_masquerade,
            cni_version: args.cni_version.clone(),
            ipam_data_dir: args.ipam_data_dir.clone(),
        },
        nft: args.node.nft.clone(),
    };
    let mut reconciler = Reconciler::new(setup, netns, metrics.clone())?;

    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| AgentError::io("install SIGTERM handler", e))?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|e| AgentError::io("install SIGINT handler", e))?;

    if !args.no_metrics && !args.once {
        let listener = metrics::listen(args.metrics_addr).await?;
        tokio::spawn(metrics::serve(listener, metrics.clone()));
    }

    // The source task publishes snapshots; the loop below reconciles the
    // latest one, so a burst of changes costs one pass.
    let (tx, mut rx) = watch::channel::<Option<Snapshot>>(None);
    let publish = move |snapshot: Snapshot| {
        tx.send_replace(Some(snapshot));
    };
    let source_task = if let Some(path) = args.nodes_file.clone() {
        // Read once up front so a missing or broken file stops --once and startup.
        let first = source::file::read(&path)?;
        publish(first.clone());
        tokio::spawn(source::file::watch(
            path,
            Duration::from_millis(args.poll_ms.max(50)),
            Some(first),
            publish,
            metrics.clone(),
        ))
    } else {
        let client = source::kube::client(args.kubeconfig.as_deref()).await?;
        tokio::spawn(source::kube::watch(client, publish, metrics.clone()))
    };

    // First pass: refuse to start on a node that cannot work.
    // --once must not hang on an unreachable API server; the daemon waits
    // (the watcher retries with backoff and logs each failure).
    let first_list_timeout = if args.once {
        Duration::from_secs(60)
    } else {
        Duration::MAX
    };
    let first = tokio::select! {
        changed = rx.wait_for(Option::is_some) => changed
            .map_err(|_| AgentError::NodeSource("node source ended".into()))?
            .clone()
            .unwrap_or_default(),
        _ = terminate.recv() => { source_task.abort(); return Ok(()); }
        _ = interrupt.recv() => { source_task.abort(); return Ok(()); }
        _ = tokio::time::sleep(first_list_timeout) => {
            source_task.abort();
            return Err(AgentError::NodeSource(format!(
                "no node list within {}s (is the API server reachable?)",
                first_list_timeout.as_secs()
            )));
        }
    };
    rx.mark_unchanged();
    reconciler.own_node(&first)?;
    let outcome = reconciler.reconcile(&first, true).await;
    if args.once {
        source_task.abort();
        let outcome = outcome?;
        if outcome.failed > 0 {
            return Err(AgentError::Config(format!(
                "{} route change(s) failed",
                outcome.failed
            )));
        }
        return Ok(());
    }
    if let Err(e) = outcome {
        tracing::error!(error = %e, "reconcile failed; retrying at the next change or resync");
    }

    let mut resync = tokio::time::interval(Duration::from_secs(args.resync_seconds.max(1)));
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    resync.tick().await;
    loop {
        let force_rules = tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return Err(AgentError::NodeSource("node source ended".into()));
                }
                false
            }
            _ = resync.tick() => true,
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        };
        let nodes = rx.borrow_and_update().clone().unwrap_or_default();
        if let Err(e) = reconciler.reconcile(&nodes, force_rules).await {
            tracing::error!(error = %e, "reconcile failed; retrying at the next change or resync");
        }
    }
    // Routes, rules and the conflist stay: running pods keep working while
    // the agent is restarted or upgraded.
    source_task.abort();
    tracing::info!("stopping; routes and rules left in place");
    Ok(())
}

pub async fn uninstall(args: UninstallArgs) -> Result<()> {
    let netns = open_netns(&args.node)?;
    let handle = cnilab_net::netns::connect(netns.as_deref())
        .map_err(|e| AgentError::io("open netlink connection", e))?;
    let mut errors = Vec::new();
    match routes::delete_all_own(&handle).await {
        Ok(n) => tracing::info!(routes = n, "deleted own routes"),
        Err(e) => errors.push(e),
    }
    let nft = args.node.nft.clone();
    let ns = netns.clone();
    let removed = tokio::task::spawn_blocking(move || {
        nftables::load(
            &nft,
            ns.as_deref(),
            "delete table inet cnilab_agent",
            &nftables::delete_ruleset(),
        )
    })
    .await
    .map_err(|e| AgentError::Config(format!("nft task: {e}")))?;
    match removed {
        Ok(()) => tracing::info!(table = nftables::TABLE, "deleted nftables table"),
        Err(e) => errors.push(e),
    }
    for path in [
        args.node.cni_conf_dir.join(&args.node.cni_conf_name),
        args.node.cni_bin_dir.join(PLUGIN_BINARY_NAME),
    ] {
        match cni_config::remove_if_exists(&path) {
            Ok(true) => tracing::info!(path = %path.display(), "removed"),
            Ok(false) => {}
            Err(e) => errors.push(e),
        }
    }
    // Best effort: everything was tried; report the first failure.
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

pub fn install_plugin(args: InstallPluginArgs) -> Result<()> {
    if cni_config::install_plugin(&args.plugin_binary, &args.cni_bin_dir)? {
        tracing::info!(dir = %args.cni_bin_dir.display(), "installed {PLUGIN_BINARY_NAME}");
    } else {
        tracing::info!(dir = %args.cni_bin_dir.display(), "{PLUGIN_BINARY_NAME} already up to date");
    }
    Ok(())
}
