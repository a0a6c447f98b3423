//! The in-cluster connectivity check (`cnilab e2e check`).
//!
//! For any CNI.
//! Creates a namespace with probe pods pinned to every node (and a
//! hostNetwork pod per node) plus ClusterIP services, runs every probe
//! through the API's exec, diagnoses failures (with what the Node objects
//! say), reports like `cnilab lab`, and deletes the namespace.

pub mod access;
pub mod nodes;
pub mod objects;
pub mod probes;

use super::options::{IpFamily, DEFAULT_PROBE_IMAGE};
use super::E2eError;
use crate::connectivity::report::{Failure, NodeView, Report};
use crate::report::quote;
use crate::report::{Format, Rendered};
use futures_util::future::BoxFuture;
use futures_util::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, Service};
use kube::api::{Api, AttachParams, DeleteParams, ListParams, PostParams};
use nodes::{ClusterNode, NodeFinding};
use probes::{Cluster, ExecOutput, ProbePod};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq)]
pub struct CheckOptions {
    /// Which cluster: `--kubeconfig`/`--context`, else as kubectl finds it.
    pub access: access::Access,
    pub ip_family: IpFamily,
    pub probe_image: String,
    pub namespace: String,
    pub format: Format,
    pub junit: Option<PathBuf>,
    /// HTML report.
    pub report: Option<PathBuf>,
    /// JSON report file (the provider steps write report.json).
    pub json: Option<PathBuf>,
    /// Report title.
    pub title: String,
    /// Node names for the dry run (the real run lists the nodes).
    pub predicted_nodes: Vec<String>,
    /// Waiting for the probe pods (and for a leftover namespace to go).
    pub timeout: Duration,
    /// Execs running at once.
    pub concurrency: usize,
}

impl CheckOptions {
    pub fn new(access: access::Access) -> CheckOptions {
        CheckOptions {
            access,
            ip_family: IpFamily::Ipv4,
            probe_image: DEFAULT_PROBE_IMAGE.to_string(),
            namespace: "cnilab-e2e".into(),
            format: Format::Table,
            junit: None,
            report: None,
            json: None,
            title: "e2e".into(),
            predicted_nodes: Vec::new(),
            timeout: Duration::from_secs(180),
            concurrency: 12,
        }
    }

    /// The equivalent `cnilab e2e check` command line.
    pub fn command_line(&self) -> String {
        let mut s = String::from("cnilab e2e check");
        if let Some(k) = &self.access.kubeconfig {
            let _ = write!(s, " --kubeconfig {}", quote(&k.to_string_lossy()));
        }
        if let Some(c) = &self.access.context {
            let _ = write!(s, " --context {}", quote(c));
        }
        let _ = write!(s, " --ip-family {}", self.ip_family.as_str());
        if self.probe_image != DEFAULT_PROBE_IMAGE {
            let _ = write!(s, " --image {}", quote(&self.probe_image));
        }
        if let Some(j) = &self.junit {
            let _ = write!(s, " --junit {}", quote(&j.to_string_lossy()));
        }
        if let Some(r) = &self.report {
            let _ = write!(s, " --report {}", quote(&r.to_string_lossy()));
        }
        s
    }
}

/// Runs a command in a pod: the API's exec in production, a scripted
/// stand-in for the API server in tests.
pub trait PodExec: Send + Sync {
    fn exec(&self, call: PodCommand) -> BoxFuture<'_, Result<ExecOutput, String>>;
}

/// One command to run in one pod's `probe` container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCommand {
    pub namespace: String,
    pub pod: String,
    /// The container (`probe` unless [`PodCommand::in_container`]).
    pub container: String,
    pub command: Vec<String>,
}

impl PodCommand {
    pub fn new(namespace: &str, pod: &str, command: Vec<String>) -> Self {
        Self {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            container: "probe".to_string(),
            command,
        }
    }

    /// The same command in another container of the pod.
    pub fn in_container(mut self, container: &str) -> Self {
        self.container = container.to_string();
        self
    }
}

/// Exec through the API server (websocket).
pub struct KubeExec {
    pub client: kube::Client,
    pub timeout: Duration,
}

impl PodExec for KubeExec {
    fn exec(&self, call: PodCommand) -> BoxFuture<'_, Result<ExecOutput, String>> {
        Box::pin(async move {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &call.namespace);
            let params = AttachParams::default()
                .container(call.container.as_str())
                .stdout(true)
                .stderr(true);
            let run = async {
                let mut process = api
                    .exec(&call.pod, call.command, &params)
                    .await
                    .map_err(|e| e.to_string())?;
                let stdout = process.stdout();
                let stderr = process.stderr();
                let status = process.take_status();
                let read = |pipe: Option<tokio::io::ReadHalf<tokio::io::SimplexStream>>| async move {
                    let mut buf = Vec::new();
                    if let Some(mut p) = pipe {
                        use tokio::io::AsyncReadExt;
                        let _ = p.read_to_end(&mut buf).await;
                    }
                    String::from_utf8_lossy(&buf).into_owned()
                };
                let (stdout, stderr) = tokio::join!(read(stdout), read(stderr));
                let status = match status {
                    Some(s) => s.await,
                    None => None,
                };
                let _ = process.join().await;
                let (success, message) = match status {
                    Some(s) => (
                        s.status.as_deref() == Some("Success"),
                        s.message.unwrap_or_default(),
                    ),
                    None => (false, "no exit status from the API server".to_string()),
                };
                Ok(ExecOutput {
                    success,
                    stdout,
                    stderr,
                    message,
                })
            };
            match tokio::time::timeout(self.timeout, run).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {}s", self.timeout.as_secs())),
            }
        })
    }
}

/// The dry run: the objects it would create and the probes it would run on
/// the predicted nodes (addresses are only known at run time).
pub fn dry_run(opts: &CheckOptions) -> String {
    let mut out = String::new();
    let ns = &opts.namespace;
    let mut block = |path: String, v: &serde_json::Value| {
        let _ = writeln!(out, "--- write {path}");
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(v).unwrap_or_default()
        );
        out.push_str("--- end\n");
    };
    block("/api/v1/namespaces".into(), &objects::namespace(opts));
    for p in objects::pods(opts, &opts.predicted_nodes) {
        block(format!("/api/v1/namespaces/{ns}/pods"), &p);
    }
    for s in objects::services(opts, opts.predicted_nodes.len()) {
        block(format!("/api/v1/namespaces/{ns}/services"), &s);
    }
    let (v4, v6) = opts.ip_family.families();
    let names = &opts.predicted_nodes;
    let per_node = objects::PODS_PER_NODE;
    let _ = writeln!(
        out,
        "# probes ({}): pods-ready, pod-to-pod/same-node and cross-node (icmp, tcp, udp), node-to-pod (icmp, tcp) from {}, pod-to-node (icmp, tcp), pod-to-service and {}.{ns}.svc (tcp), hairpin through self-n<i> (tcp), mtu/df-cross-node (a ping filling the pod MTU)",
        match (v4, v6) {
            (true, true) => "IPv4 and IPv6",
            (false, true) => "IPv6",
            _ => "IPv4",
        },
        (0..names.len()).map(objects::host_pod_name).collect::<Vec<_>>().join(", "),
        objects::ECHO_SERVICE
    );
    let _ = writeln!(
        out,
        "# {} probe pods on {} nodes; namespace {ns} deleted at the end",
        names.len() * per_node,
        names.len()
    );
    out
}

/// The runtime an API client runs on (two workers).
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, E2eError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| E2eError::Io {
            what: "cannot start the tokio runtime".into(),
            source: e,
        })
}

/// Loads the kubeconfig, runs the check, writes the reports. `Ok(true)`
/// iff every probe passed.
pub fn run_blocking(opts: &CheckOptions) -> Result<bool, E2eError> {
    let rt = runtime()?;
    rt.block_on(async {
        let resolved = access::resolve(&opts.access)?;
        eprintln!("cnilab e2e check: {}", resolved.describe());
        let client = access::client(resolved).await?;
        let exec = KubeExec {
            client: client.clone(),
            timeout: Duration::from_secs(30),
        };
        let report = run(client, &exec, opts).await?;
        emit(&report, opts)?;
        Ok(report.passed())
    })
}

/// Prints the report and writes the files `opts` asks for (JUnit XML,
/// the JSON document, the HTML page).
pub(crate) fn emit(report: &Report, opts: &CheckOptions) -> Result<(), E2eError> {
    let (junit, html) = (opts.junit.as_deref(), opts.report.as_deref());
    crate::report::emit(report, opts.format, junit, html).map_err(E2eError::Write)?;
    if let Some(p) = &opts.json {
        crate::report::write_file(p, &report.json()).map_err(E2eError::Write)?;
    }
    Ok(())
}

pub(crate) fn kube_err(what: &str) -> impl Fn(kube::Error) -> E2eError + '_ {
    move |e| E2eError::Kube(format!("{what}: {e}"))
}

/// The check against the cluster behind `client`. The namespace is deleted
/// whatever happens once it was created.
pub async fn run(
    client: kube::Client,
    exec: &dyn PodExec,
    opts: &CheckOptions,
) -> Result<Report, E2eError> {
    let started = Instant::now();
    let node_list = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(kube_err("cannot list nodes"))?;
    let mut cluster_nodes: Vec<ClusterNode> =
        node_list.items.iter().map(ClusterNode::from_node).collect();
    cluster_nodes.sort_by(|a, b| a.name.cmp(&b.name));
    if cluster_nodes.is_empty() {
        return Err(E2eError::Kube("the cluster has no nodes".into()));
    }
    let (v4, v6) = opts.ip_family.families();
    let findings = nodes::diagnose(&cluster_nodes, v4, v6);
    for f in &findings {
        eprintln!(
            "cnilab e2e: node check: {}: {}",
            f.diagnosis.id, f.diagnosis.message
        );
    }
    prepare_namespace(&client, opts).await?;
    let result = probe_cluster(&client, exec, opts, &cluster_nodes, &findings, started).await;
    let cleanup = Api::<Namespace>::all(client.clone())
        .delete(&opts.namespace, &DeleteParams::background())
        .await;
    if let Err(e) = cleanup {
        eprintln!(
            "cnilab e2e: could not delete namespace {}: {e} (kubectl delete namespace {})",
            opts.namespace, opts.namespace
        );
    }
    result
}

/// Removes a namespace a killed run left behind (only ours), then creates it.
async fn prepare_namespace(client: &kube::Client, opts: &CheckOptions) -> Result<(), E2eError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let deadline = Instant::now() + opts.timeout;
    if let Some(old) = api
        .get_opt(&opts.namespace)
        .await
        .map_err(kube_err("cannot read namespaces"))?
    {
        let ours = old
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(objects::MANAGED_BY.0))
            .is_some_and(|v| v == objects::MANAGED_BY.1);
        if !ours {
            return Err(E2eError::Kube(format!(
                "namespace {} exists and was not made by cnilab e2e; not touching it",
                opts.namespace
            )));
        }
        eprintln!(
            "cnilab e2e: removing namespace {} left by an earlier run",
            opts.namespace
        );
        let _ = api
            .delete(&opts.namespace, &DeleteParams::background())
            .await;
        while api
            .get_opt(&opts.namespace)
            .await
            .map_err(kube_err("cannot read namespaces"))?
            .is_some()
        {
            if Instant::now() > deadline {
                return Err(E2eError::Kube(format!(
                    "namespace {} still terminating after {}s",
                    opts.namespace,
                    opts.timeout.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    let ns = objects::typed_namespace(objects::namespace(opts)).map_err(E2eError::Object)?;
    api.create(&PostParams::default(), &ns)
        .await
        .map_err(kube_err("cannot create the namespace"))?;
    Ok(())
}

fn cluster_ips(svc: &Service) -> Vec<IpAddr> {
    let spec = svc.spec.as_ref();
    let mut ips: Vec<IpAddr> = spec
        .and_then(|s| s.cluster_ips.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(
            spec.and_then(|s| s.cluster_ip.as_deref())
                .and_then(|i| i.parse::<IpAddr>().ok()),
        );
    }
    ips
}

async fn probe_cluster(
    client: &kube::Client,
    exec: &dyn PodExec,
    opts: &CheckOptions,
    cluster_nodes: &[ClusterNode],
    findings: &[NodeFinding],
    started: Instant,
) -> Result<Report, E2eError> {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &opts.namespace);
    let svc_api: Api<Service> = Api::namespaced(client.clone(), &opts.namespace);
    let names: Vec<String> = cluster_nodes.iter().map(|n| n.name.clone()).collect();
    for p in objects::pods(opts, &names) {
        let pod = objects::typed_pod(p).map_err(E2eError::Object)?;
        pods_api
            .create(&PostParams::default(), &pod)
            .await
            .map_err(kube_err("cannot create a probe pod"))?;
    }
    let mut services = Vec::new();
    for s in objects::services(opts, names.len()) {
        let svc = objects::typed_service(s).map_err(E2eError::Object)?;
        let created = svc_api
            .create(&PostParams::default(), &svc)
            .await
            .map_err(kube_err("cannot create a service"))?;
        services.push(cluster_ips(&created));
    }
    let setup = started.elapsed();
    let (running, not_ready) = wait_for_pods(client, opts, &names).await?;
    let ready = started.elapsed();

    let mut cluster = Cluster {
        namespace: opts.namespace.clone(),
        nodes: cluster_nodes.to_vec(),
        echo_ips: services.first().cloned().unwrap_or_default(),
        self_ips: services.iter().skip(1).cloned().collect(),
        ..Cluster::default()
    };
    for pod in running {
        if pod.host {
            cluster.hosts.push(pod);
        } else {
            cluster.pods.push(pod);
        }
    }
    cluster
        .pods
        .sort_by(|a, b| (a.node, &a.name).cmp(&(b.node, &b.name)));
    cluster.hosts.sort_by_key(|p| p.node);
    read_mtus(exec, opts, &mut cluster).await;

    let (v4, v6) = opts.ip_family.families();
    let mut outcomes = probes::readiness(&cluster, &not_ready, v6 && !v4);
    let plan = probes::plan(&cluster, v4, v6);
    let total = plan.len();
    eprintln!(
        "cnilab e2e: {total} probes from {} pods",
        cluster.pods.len() + cluster.hosts.len()
    );
    let done = std::sync::atomic::AtomicUsize::new(0);
    let probed: Vec<crate::connectivity::ProbeOutcome> = stream::iter(plan.iter())
        .map(|probe| async {
            let t = Instant::now();
            let result = exec
                .exec(PodCommand::new(
                    &opts.namespace,
                    &probe.exec_pod,
                    probe.command.clone(),
                ))
                .await;
            let mut outcome = probes::judge(probe, result);
            if outcome.passed() {
                outcome.rtt_ms = Some(t.elapsed().as_secs_f64() * 1000.0);
            }
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if n.is_multiple_of(25) || n == total {
                eprintln!("  {n}/{total} probes");
            }
            outcome
        })
        .buffered(opts.concurrency.max(1))
        .collect()
        .await;
    outcomes.extend(probed);
    let failures: Vec<Failure> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.passed())
        .map(|(index, o)| Failure {
            index,
            outcome: o.clone(),
            diagnoses: probes::diagnose(&cluster, &outcomes, findings, o),
        })
        .collect();
    if failures.is_empty() && !findings.is_empty() {
        eprintln!("cnilab e2e: every probe passed despite the node findings above");
    }
    let views = node_views(&cluster);
    let mut report = Report::from_parts(
        &opts.title,
        &format!("in-cluster ({})", opts.probe_image),
        "kubernetes",
        views,
        probes::GROUPS,
        outcomes,
        failures,
    );
    report.sampled = crate::connectivity::catalogue::sampled_note(&cluster);
    report.add_phase("setup", setup);
    report.add_phase("pods ready", ready - setup);
    report.add_phase("probes", started.elapsed() - ready);
    Ok(report)
}

/// Each probe pod's eth0 MTU, read in the pod (`None` where it cannot be
/// read, said on stderr). Reading the MTU is also the warm-up: netexec is
/// listening by then.
async fn read_mtus(exec: &dyn PodExec, opts: &CheckOptions, cluster: &mut Cluster) {
    let mtus: Vec<Option<u32>> = stream::iter(cluster.pods.iter())
        .map(|p| async {
            match exec
                .exec(PodCommand::new(
                    &opts.namespace,
                    &p.name,
                    probes::mtu_command(),
                ))
                .await
            {
                Ok(out) if out.success => out.stdout.trim().parse().ok(),
                Ok(out) => {
                    eprintln!(
                        "cnilab e2e: cannot read the MTU in {}: {}",
                        p.name,
                        out.stderr.trim()
                    );
                    None
                }
                Err(e) => {
                    eprintln!("cnilab e2e: exec into {} failed: {e}", p.name);
                    None
                }
            }
        })
        .buffered(opts.concurrency.max(1))
        .collect()
        .await;
    for (p, mtu) in cluster.pods.iter_mut().zip(mtus) {
        p.mtu = mtu;
    }
}

/// The nodes as the report draws them: address, pod CIDRs, probe pods.
fn node_views(cluster: &Cluster) -> Vec<NodeView> {
    cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| NodeView {
            name: n.name.clone(),
            address: n
                .internal_ips
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(","),
            pod_cidr: n.pod_cidrs.iter().map(|c| c.to_string()).collect(),
            pods: cluster
                .pods
                .iter()
                .filter(|p| p.node == i)
                .map(|p| {
                    (
                        p.name.clone(),
                        p.ips.iter().map(|a| a.to_string()).collect(),
                    )
                })
                .collect(),
        })
        .collect()
}

fn pod_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Why a pod is not running yet: the waiting reason of its container, else its phase.
pub(crate) fn pod_state(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let waiting = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .map(|w| {
            format!(
                "{}{}",
                w.reason.clone().unwrap_or_default(),
                w.message
                    .as_ref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            )
        })
        .next();
    waiting.unwrap_or_else(|| {
        status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into())
    })
}

/// A probe pod that never became Ready, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReady {
    pub name: String,
    pub node: usize,
    pub state: String,
}

/// Waits until every probe pod is Ready or the timeout; then returns the
/// Ready ones and, for the others, their state and latest warning event
/// (a sandbox error there is usually the CNI plugin's ADD failing).
async fn wait_for_pods(
    client: &kube::Client,
    opts: &CheckOptions,
    names: &[String],
) -> Result<(Vec<ProbePod>, Vec<NotReady>), E2eError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &opts.namespace);
    let expected = names.len() * (objects::PODS_PER_NODE + 1);
    let selector = format!("{}={}", objects::MANAGED_BY.0, objects::MANAGED_BY.1);
    let start = Instant::now();
    let mut next_progress = Duration::from_secs(10);
    loop {
        let list = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(kube_err("cannot list the probe pods"))?;
        let ready: Vec<ProbePod> = list
            .items
            .iter()
            .filter(|p| pod_ready(p))
            .filter_map(probe_pod)
            .collect();
        let elapsed = start.elapsed();
        if ready.len() >= expected || elapsed >= opts.timeout {
            let mut not_ready = Vec::new();
            for (i, _) in names.iter().enumerate() {
                let mine = (0..objects::PODS_PER_NODE)
                    .map(|k| objects::pod_name(i, k))
                    .chain([objects::host_pod_name(i)]);
                for name in mine {
                    if ready.iter().any(|p| p.name == name) {
                        continue;
                    }
                    let state = list
                        .items
                        .iter()
                        .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
                        .map(pod_state)
                        .unwrap_or_else(|| "missing".into());
                    not_ready.push(NotReady {
                        name,
                        node: i,
                        state,
                    });
                }
            }
            if !not_ready.is_empty() {
                add_warnings(client, opts, &mut not_ready).await;
                eprintln!(
                    "cnilab e2e: {} of {expected} probe pods not Ready after {}s",
                    not_ready.len(),
                    elapsed.as_secs()
                );
            }
            return Ok((ready, not_ready));
        }
        if elapsed >= next_progress {
            eprintln!(
                "waiting for probe pods ({}/{expected} Ready): {}s/{}s",
                ready.len(),
                elapsed.as_secs(),
                opts.timeout.as_secs()
            );
            next_progress += Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Appends each pod's latest Warning event (FailedCreatePodSandBox...).
async fn add_warnings(client: &kube::Client, opts: &CheckOptions, pods: &mut [NotReady]) {
    let api: Api<Event> = Api::namespaced(client.clone(), &opts.namespace);
    let Ok(events) = api.list(&ListParams::default()).await else {
        return;
    };
    for pod in pods.iter_mut() {
        let latest = events
            .items
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(pod.name.as_str()))
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .max_by_key(|e| e.count.unwrap_or(0));
        if let Some(e) = latest {
            pod.state = format!(
                "{} ({}: {})",
                pod.state,
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default().trim()
            );
        }
    }
}

/// A running probe pod: node index from its name, addresses from its status.
fn probe_pod(pod: &Pod) -> Option<ProbePod> {
    let name = pod.metadata.name.clone()?;
    let (host, node) = if let Some(rest) = name.strip_prefix("host-n") {
        (true, rest.parse().ok()?)
    } else {
        let rest = name.strip_prefix("pod-n")?;
        (false, rest.split('-').next()?.parse().ok()?)
    };
    let status = pod.status.as_ref()?;
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .as_ref()
        .into_iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(
            status
                .pod_ip
                .as_deref()
                .and_then(|i| i.parse::<IpAddr>().ok()),
        );
    }
    Some(ProbePod {
        name,
        node,
        host,
        ips,
        mtu: None,
    })
}
