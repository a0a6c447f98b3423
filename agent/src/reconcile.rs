//! One reconcile pass: set up this node (sysctls, conflist, nftables table)
//! and make the routes to other nodes match the node list. Level-triggered:
//! it looks at the whole list and the kernel's state every time, so running
//! it twice changes nothing the second time.

use crate::cni_config::{self, ConflistOptions};
use crate::error::{AgentError, Result};
use crate::metrics::{now_ms, Metrics};
use crate::nftables::{self, NatPolicy};
use crate::nodes::NodeInfo;
use crate::plan::{self, RouteAction, Warning};
use crate::routes;
use ipnet::IpNet;
use std::collections::BTreeSet;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Everything a reconcile pass needs to know besides the node list.
#[derive(Debug, Clone)]
pub struct NodeSetup {
    pub node_name: String,
    pub cluster_cidrs: Vec<IpNet>,
    pub masquerade: bool,
    pub conflist_path: PathBuf,
    pub conflist: ConflistOptions,
    pub nft: PathBuf,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub added: usize,
    pub replaced: usize,
    pub deleted: usize,
    pub failed: usize,
    pub managed: usize,
}

pub struct Reconciler {
    setup: NodeSetup,
    netns: Option<Arc<File>>,
    handle: rtnetlink::Handle,
    metrics: Arc<Metrics>,
    applied_ruleset: Option<String>,
    reported_warnings: BTreeSet<Warning>,
    checked_forward_policy: bool,
}

impl Reconciler {
    /// `netns`: do the kernel work inside this namespace instead of the
    /// caller's. Must be called inside a tokio runtime.
    pub fn new(setup: NodeSetup, netns: Option<Arc<File>>, metrics: Arc<Metrics>) -> Result<Self> {
        let handle = cnilab_net::netns::connect(netns.as_deref())
            .map_err(|e| AgentError::io("open netlink connection", e))?;
        Ok(Reconciler {
            setup,
            netns,
            handle,
            metrics,
            applied_ruleset: None,
            reported_warnings: BTreeSet::new(),
            checked_forward_policy: false,
        })
    }

    /// This node's entry, which must exist and have a pod CIDR.
    pub fn own_node<'a>(&self, nodes: &'a [NodeInfo]) -> Result<&'a NodeInfo> {
        let own = nodes
            .iter()
            .find(|n| n.name == self.setup.node_name)
            .ok_or_else(|| AgentError::SelfNodeMissing {
                name: self.setup.node_name.clone(),
            })?;
        if own.pod_cidrs.is_empty() {
            return Err(AgentError::NoPodCidr {
                name: own.name.clone(),
            });
        }
        Ok(own)
    }

    /// One full pass. `force_rules` re-applies the nftables table even if
    /// this process already loaded the same text (the periodic resync repairs
    /// drift that way).
    pub async fn reconcile(&mut self, nodes: &[NodeInfo], force_rules: bool) -> Result<Outcome> {
        let started = now_ms();
        let result = self.pass(nodes, force_rules).await;
        self.metrics.reconciles.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .last_reconcile_ms
            .store(started, Ordering::Relaxed);
        self.metrics
            .nodes
            .store(nodes.len() as u64, Ordering::Relaxed);
        match &result {
            Ok(outcome) if outcome.failed == 0 => {
                self.metrics
                    .last_success_ms
                    .store(started, Ordering::Relaxed);
                self.metrics.ready.store(true, Ordering::Relaxed);
            }
            _ => {
                self.metrics
                    .reconcile_errors
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    async fn pass(&mut self, nodes: &[NodeInfo], force_rules: bool) -> Result<Outcome> {
        let own = self.own_node(nodes)?.clone();
        self.set_up_node(&own, force_rules).await?;

        let installed = routes::list_main_table(&self.handle).await?;
        let plan = plan::plan(
            &self.setup.node_name,
            nodes,
            &installed,
            &self.setup.cluster_cidrs,
        );
        self.report_warnings(&plan.warnings);
        let refused = plan
            .warnings
            .iter()
            .filter(|w| w.refused_out_of_scope().is_some())
            .count();
        self.metrics
            .pod_cidrs_refused
            .store(refused as u64, Ordering::Relaxed);

        let mut outcome = Outcome::default();
        let mut first_error = None;
        for action in &plan.actions {
            match routes::apply(&self.handle, action).await {
                Ok(()) => {
                    tracing::info!(action = %action, "route changed");
                    let (slot, counter) = match action {
                        RouteAction::Add(_) => (&mut outcome.added, &self.metrics.routes_added),
                        RouteAction::Replace { .. } => {
                            (&mut outcome.replaced, &self.metrics.routes_replaced)
                        }
                        RouteAction::Delete(_) => {
                            (&mut outcome.deleted, &self.metrics.routes_deleted)
                        }
                    };
                    *slot += 1;
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(error = %e, "route change failed");
                    outcome.failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        outcome.managed = routes::list_own(&self.handle).await?.len();
        self.metrics
            .routes_managed
            .store(outcome.managed as u64, Ordering::Relaxed);
        // Quiet when a resync finds nothing to do; every change is logged above.
        let noteworthy = outcome.added + outcome.replaced + outcome.deleted + outcome.failed > 0
            || self.metrics.reconciles.load(Ordering::Relaxed) == 0;
        // `tracing` wants the level as a constant: one summary, two levels.
        macro_rules! reconciled {
            ($level:expr) => {
                tracing::event!(
                    $level,
                    nodes = nodes.len(),
                    desired = plan.desired.len(),
                    managed = outcome.managed,
                    added = outcome.added,
                    replaced = outcome.replaced,
                    deleted = outcome.deleted,
                    failed = outcome.failed,
                    "reconciled"
                )
            };
        }
        if noteworthy {
            reconciled!(tracing::Level::INFO);
        } else {
            reconciled!(tracing::Level::DEBUG);
        }
        match first_error {
            // Other routes were still applied; the error makes the pass count
            // as failed and is returned for --once.
            Some(e) if outcome.failed == plan.actions.len() => Err(e),
            _ => Ok(outcome),
        }
    }

    async fn set_up_node(&mut self, own: &NodeInfo, force_rules: bool) -> Result<()> {
        let setup = &self.setup;
        let uses_v6 = own
            .pod_cidrs
            .iter()
            .chain(&setup.cluster_cidrs)
            .any(|c| matches!(c, IpNet::V6(_)));
        let mut sysctls = vec!["net/ipv4/ip_forward"];
        if uses_v6 {
            sysctls.push("net/ipv6/conf/all/forwarding");
        }
        for key in sysctls {
            let netns = self.netns.as_deref();
            if cnilab_net::netns::read_sysctl(netns, key).ok().as_deref() != Some("1") {
                cnilab_net::netns::write_sysctl(netns, key, "1").map_err(|e| {
                    AgentError::io(
                        format!(
                            "enable {key} (in an unprivileged container /proc/sys is read-only: \
                             set it on the node, e.g. `sysctl -w {}=1`)",
                            key.replace('/', ".")
                        ),
                        e,
                    )
                })?;
                tracing::info!(sysctl = key, "enabled forwarding");
            }
        }

        for pod in &own.pod_cidrs {
            if !setup.cluster_cidrs.iter().any(|c| c.contains(pod)) {
                tracing::warn!(pod_cidr = %pod, cluster_cidrs = ?setup.cluster_cidrs, "this node's podCIDR is outside every --cluster-cidr: its pods' traffic to other nodes would be masqueraded");
            }
        }

        let config = cni_config::conflist(&own.pod_cidrs, &setup.conflist);
        if cni_config::write_conflist(&setup.conflist_path, &config)? {
            tracing::info!(path = %setup.conflist_path.display(), pod_cidrs = ?own.pod_cidrs, "wrote CNI conflist");
        }

        let policy = NatPolicy {
            cluster_cidrs: setup.cluster_cidrs.clone(),
            pod_cidrs: own.pod_cidrs.clone(),
            masquerade: setup.masquerade,
        };
        let ruleset = nftables::ruleset(&policy);
        if force_rules || self.applied_ruleset.as_ref() != Some(&ruleset) {
            let nft = setup.nft.clone();
            let netns = self.netns.clone();
            let text = ruleset.clone();
            // Reload only when the kernel's table differs: a reload would
            // reset the rule counters people read when debugging.
            let loaded = tokio::task::spawn_blocking(move || {
                let current = nftables::run(
                    &nft,
                    netns.as_deref(),
                    &["list", "table", "inet", nftables::TABLE],
                    None,
                    "list table",
                );
                if current.is_ok_and(|listing| nftables::listing_matches(&listing, &policy)) {
                    return Ok(false);
                }
                nftables::load(
                    &nft,
                    netns.as_deref(),
                    "load table inet cnilab_agent",
                    &text,
                )
                .map(|()| true)
            })
            .await
            .map_err(|e| AgentError::Config(format!("nft task: {e}")))??;
            if loaded {
                tracing::info!(table = nftables::TABLE, "loaded nftables table");
            }
            self.applied_ruleset = Some(ruleset);
        }
        if !self.checked_forward_policy {
            self.checked_forward_policy = true;
            let nft = setup.nft.clone();
            let netns = self.netns.clone();
            let found = tokio::task::spawn_blocking(move || {
                nftables::foreign_forward_drop_chains(&nft, netns.as_deref())
            })
            .await;
            if let Ok(Ok(chains)) = found {
                for chain in chains {
                    tracing::warn!(chain = %chain, "a forward chain with policy drop exists; its verdict wins over cnilab's accept, so cross-node pod traffic may be dropped (Docker does this: add an accept for the cluster CIDR there)");
                }
            }
        }
        Ok(())
    }

    fn report_warnings(&mut self, warnings: &[Warning]) {
        for warning in warnings {
            if !self.reported_warnings.contains(warning) {
                tracing::warn!("{warning}");
            }
        }
        self.reported_warnings = warnings.iter().cloned().collect();
    }
}
