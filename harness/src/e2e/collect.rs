//! `cnilab capture --kubeconfig`: a whole cluster as one bundle
//! (`crate::capture::bundle`), through the API server alone.
//!
//! On each node chosen, one privileged pod (host network and PID, the
//! node's `/` mounted read-only at `/host`, an emptyDir over `/host/tmp`
//! for the script's scratch files, pinned with `nodeName`, every taint
//! tolerated) runs the capture script (`cnilab capture --script`) under
//! `chroot /host`: the node's own `ip`, `nft`, `iptables-save`, `crictl`
//! and `/run/netns`. The script's output comes back over exec and is read
//! into the node's capture here, with what only the API knows (the Node's
//! pod CIDRs and InternalIPs, which pod is which, Services and
//! EndpointSlices). The pods are deleted whatever happens; one left by an
//! interrupted run ends by itself (`activeDeadlineSeconds`).

use super::check::nodes::ClusterNode;
use super::check::objects::MANAGED_BY;
use super::check::{kube_err, pod_state, PodCommand, PodExec};
use super::E2eError;
use crate::capture::bundle::{
    self, ApiPod, Bundle, BundleNode, ClusterFacts, EndpointFact, PortFact, ServiceFact, SliceFact,
};
use crate::capture::script;
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, HostPathVolumeSource, Node, Pod, PodSpec, SecurityContext,
    Service, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The capture pod's container.
pub const CONTAINER: &str = "capture";
/// How long a capture pod may live (it is deleted as soon as its node is
/// read; this ends one an interrupted run left).
const DEADLINE_SECONDS: i64 = 3600;

/// What `cnilab capture --kubeconfig` was asked.
#[derive(Clone, Debug)]
pub struct CollectOptions {
    /// Kubernetes node names (empty: every node).
    pub nodes: Vec<String>,
    /// The namespace the capture pods run in.
    pub namespace: String,
    /// The capture pods' image: any with `sleep` and `chroot`.
    pub image: String,
    /// How long a capture pod may take to start.
    pub start_timeout: Duration,
    /// Redact the bundle with this key.
    pub redact: Option<Vec<u8>>,
    /// The cluster, for the bundle (`context`, API `server`).
    pub context: String,
    pub server: String,
}

/// The capture pod for `node`, named `name`.
pub fn capture_pod(name: &str, node: &str, opts: &CollectOptions) -> Pod {
    let labels = BTreeMap::from([
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
        ("cnilab.io/role".to_string(), "capture".to_string()),
    ]);
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    let container = Container {
        name: CONTAINER.into(),
        image: Some(opts.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["sleep".into(), DEADLINE_SECONDS.to_string()]),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            mount("host", "/host", true),
            mount("scratch", "/host/tmp", false),
        ]),
        ..Container::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(opts.namespace.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            host_network: Some(true),
            host_pid: Some(true),
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".into()),
                ..Toleration::default()
            }]),
            restart_policy: Some("Never".into()),
            active_deadline_seconds: Some(DEADLINE_SECONDS),
            automount_service_account_token: Some(false),
            termination_grace_period_seconds: Some(0),
            containers: vec![container],
            volumes: Some(vec![
                Volume {
                    name: "host".into(),
                    host_path: Some(HostPathVolumeSource {
                        path: "/".into(),
                        type_: Some("Directory".into()),
                    }),
                    ..Volume::default()
                },
                Volume {
                    name: "scratch".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Volume::default()
                },
            ]),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The capture pod's name for `node`: `cnilab-capture-<node>-<tag>`, at
/// most 63 bytes of `[a-z0-9-]` (`tag` tells this run's pods from a
/// leftover's).
pub fn pod_name(node: &str, tag: &str) -> String {
    let node: String = node
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    format!("cnilab-capture-{}-{tag}", node.trim_matches('-'))
}

/// What the capture pod runs: the script, under `chroot /host`.
pub fn command() -> Vec<String> {
    ["chroot", "/host", "sh", "-c", &script::script()]
        .map(String::from)
        .to_vec()
}

/// The nodes `wanted` names (every node when empty), or which are unknown.
pub fn select<'a>(
    listed: &'a [ClusterNode],
    wanted: &[String],
) -> Result<Vec<&'a ClusterNode>, E2eError> {
    if wanted.is_empty() {
        return Ok(listed.iter().collect());
    }
    let unknown: Vec<&str> = wanted
        .iter()
        .filter(|w| !listed.iter().any(|n| &n.name == *w))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        let known: Vec<&str> = listed.iter().map(|n| n.name.as_str()).collect();
        return Err(E2eError::Invalid(format!(
            "--nodes: no node {} in the cluster; its nodes: {}",
            unknown.join(", "),
            known.join(", ")
        )));
    }
    Ok(listed.iter().filter(|n| wanted.contains(&n.name)).collect())
}

fn qualified(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// A pod as the bundle keeps it.
pub fn api_pod(p: &Pod) -> ApiPod {
    let spec = p.spec.as_ref();
    let status = p.status.as_ref();
    let mut ips: Vec<std::net::IpAddr> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(status.and_then(|s| s.pod_ip.as_ref()?.parse::<std::net::IpAddr>().ok()));
    }
    ApiPod {
        name: qualified(&p.metadata),
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        ips,
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
    }
}

/// A Service as the bundle keeps it.
pub fn service_fact(s: &Service) -> ServiceFact {
    let spec = s.spec.as_ref();
    let cluster_ips = spec
        .and_then(|s| {
            s.cluster_ips
                .clone()
                .or_else(|| Some(vec![s.cluster_ip.clone()?]))
        })
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    let ports = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| PortFact {
            name: p.name.clone().unwrap_or_default(),
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            port: p.port,
            target_port: p.target_port.as_ref().map(|t| match t {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => n.to_string(),
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
            }),
            node_port: p.node_port,
        })
        .collect();
    ServiceFact {
        name: qualified(&s.metadata),
        type_: spec
            .and_then(|s| s.type_.clone())
            .unwrap_or_else(|| "ClusterIP".into()),
        cluster_ips,
        ports,
    }
}

/// An EndpointSlice as the bundle keeps it.
pub fn slice_fact(s: &EndpointSlice) -> SliceFact {
    let endpoints = s
        .endpoints
        .iter()
        .flatten()
        .map(|e| EndpointFact {
            addresses: e.addresses.clone(),
            ready: e.conditions.as_ref().and_then(|c| c.ready),
            node: e.node_name.clone(),
            pod: e
                .target_ref
                .as_ref()
                .filter(|t| t.kind.as_deref() == Some("Pod"))
                .map(|t| {
                    format!(
                        "{}/{}",
                        t.namespace.as_deref().unwrap_or_default(),
                        t.name.as_deref().unwrap_or_default()
                    )
                }),
        })
        .collect();
    let ports = s
        .ports
        .iter()
        .flatten()
        .map(|p| PortFact {
            name: p.name.clone().unwrap_or_default(),
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            port: p.port.unwrap_or_default(),
            target_port: None,
            node_port: None,
        })
        .collect();
    SliceFact {
        name: qualified(&s.metadata),
        service: s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .map(|svc| {
                format!(
                    "{}/{svc}",
                    s.metadata.namespace.as_deref().unwrap_or_default()
                )
            })
            .unwrap_or_default(),
        address_type: s.address_type.clone(),
        endpoints,
        ports,
    }
}

/// A tag for this run's pod names: 5 hex digits of the clock and the pid.
fn run_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{:05x}",
        (nanos ^ std::process::id().rotate_left(7)) & 0xf_ffff
    )
}

/// The whole collection: list, capture every chosen node through its pod
/// (`exec` runs the script), merge what the API says, redact.
pub async fn collect(
    client: kube::Client,
    exec: &dyn PodExec,
    opts: &CollectOptions,
) -> Result<Bundle, E2eError> {
    let lp = ListParams::default();
    let nodes: Vec<ClusterNode> = Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .map_err(kube_err("list nodes"))?
        .items
        .iter()
        .map(ClusterNode::from_node)
        .collect();
    let chosen = select(&nodes, &opts.nodes)?;
    let pods: Vec<ApiPod> = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(kube_err("list pods"))?
        .items
        .iter()
        .map(api_pod)
        .collect();
    let mut warnings = Vec::new();
    let services = match Api::<Service>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items.iter().map(service_fact).collect(),
        Err(e) => {
            warnings.push(format!("Services not listed: {e}"));
            Vec::new()
        }
    };
    let endpoint_slices = match Api::<EndpointSlice>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items.iter().map(slice_fact).collect(),
        Err(e) => {
            warnings.push(format!("EndpointSlices not listed: {e}"));
            Vec::new()
        }
    };
    let api: Api<Pod> = Api::namespaced(client, &opts.namespace);
    let tag = run_tag();
    let mut taken = Vec::new();
    let plans: Vec<(&ClusterNode, String, String)> = chosen
        .iter()
        .map(|n| {
            let replay = bundle::replay_name(&n.name, &mut taken);
            (*n, pod_name(&n.name, &tag), replay)
        })
        .collect();
    let runs = plans
        .iter()
        .map(|(node, pod, replay)| capture_node(&api, exec, opts, node, pod, replay));
    let results = futures_util::future::join_all(runs).await;
    let mut bundle_nodes = Vec::new();
    for ((node, _, _), result) in plans.iter().zip(results) {
        let mut n = BundleNode {
            name: node.name.clone(),
            pod_cidrs: node.pod_cidrs.clone(),
            internal_ips: node.internal_ips.clone(),
            capture: None,
            error: None,
        };
        match result {
            Ok(mut c) => {
                bundle::merge_api(&mut c, &n, &pods);
                n.capture = Some(c);
            }
            Err(e) => n.error = Some(e),
        }
        bundle_nodes.push(n);
    }
    let mut b = Bundle {
        kind: bundle::KIND.into(),
        schema_version: bundle::SCHEMA_VERSION,
        cluster: ClusterFacts {
            context: opts.context.clone(),
            server: opts.server.clone(),
            time: crate::capture::rfc3339(std::time::SystemTime::now()),
            cnilab_version: env!("CARGO_PKG_VERSION").into(),
            redacted: false,
        },
        nodes: bundle_nodes,
        pods,
        services,
        endpoint_slices,
        warnings,
    };
    if let Some(key) = &opts.redact {
        bundle::redact(&mut b, key);
    }
    Ok(b)
}

/// Resolves the cluster as kubectl does (`access`), then [`collect`]s it
/// with the API server's exec; says which cluster on stderr.
pub fn collect_blocking(
    access: &super::check::access::Access,
    mut opts: CollectOptions,
) -> Result<Bundle, E2eError> {
    let rt = super::check::runtime()?;
    rt.block_on(async {
        let resolved = super::check::access::resolve(access)?;
        eprintln!("cnilab capture: {}", resolved.describe());
        opts.context = resolved.context.clone();
        opts.server = server_of(&resolved);
        let client = super::check::access::client(resolved).await?;
        let exec = super::check::KubeExec {
            client: client.clone(),
            timeout: SCRIPT_TIMEOUT,
        };
        collect(client, &exec, &opts).await
    })
}

/// How long the script may take on one node (a node of a few hundred pods
/// takes tens of seconds).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(600);

/// The API server of the resolved context.
fn server_of(r: &super::check::access::Resolved) -> String {
    let cluster = r
        .config
        .contexts
        .iter()
        .find(|c| c.name == r.context)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone());
    r.config
        .clusters
        .iter()
        .find(|c| Some(&c.name) == cluster.as_ref())
        .and_then(|c| c.cluster.as_ref()?.server.clone())
        .unwrap_or_default()
}

/// One node: its pod made, waited for, the script run in it, the pod
/// deleted (whatever happened), the output read into a capture.
async fn capture_node(
    api: &Api<Pod>,
    exec: &dyn PodExec,
    opts: &CollectOptions,
    node: &ClusterNode,
    pod: &str,
    replay: &str,
) -> Result<crate::capture::Capture, String> {
    let made = api
        .create(&PostParams::default(), &capture_pod(pod, &node.name, opts))
        .await
        .map_err(|e| format!("creating pod {}/{pod}: {e}", opts.namespace));
    let output = match made {
        Ok(_) => match wait_running(api, pod, opts.start_timeout).await {
            Ok(()) => {
                let call = PodCommand::new(&opts.namespace, pod, command()).in_container(CONTAINER);
                exec.exec(call).await
            }
            Err(e) => Err(e),
        },
        Err(e) => return Err(e),
    };
    let _ = api.delete(pod, &DeleteParams::default()).await;
    let out = output.map_err(|e| format!("the capture script in pod {pod}: {e}"))?;
    if !out.success {
        let tail: String = out
            .stderr
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(format!(
            "the capture script in pod {pod} failed ({}): {}",
            out.message,
            tail.trim()
        ));
    }
    let read = script::Options {
        node_name: Some(replay.to_string()),
        redact: None,
    };
    script::from_text(&out.stdout, &read)
        .map_err(|e| format!("the script's output of node {}: {e}", node.name))
}

/// Waits until `pod` runs; its state when it does not within `timeout`,
/// or at once when it ended.
async fn wait_running(api: &Api<Pod>, pod: &str, timeout: Duration) -> Result<(), String> {
    let until = Instant::now() + timeout;
    loop {
        let p = api
            .get(pod)
            .await
            .map_err(|e| format!("reading pod {pod}: {e}"))?;
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        match phase {
            Some("Running") => return Ok(()),
            Some("Failed") | Some("Succeeded") => {
                return Err(format!(
                    "pod {pod} ended before the capture: {}",
                    pod_state(&p)
                ))
            }
            _ => {}
        }
        if Instant::now() >= until {
            return Err(format!(
                "pod {pod} did not run within {} s: {}",
                timeout.as_secs(),
                pod_state(&p)
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> CollectOptions {
        CollectOptions {
            nodes: Vec::new(),
            namespace: "default".into(),
            image: "busybox:1.37".into(),
            start_timeout: Duration::from_secs(1),
            redact: None,
            context: "kind-kind".into(),
            server: "https://127.0.0.1:6443".into(),
        }
    }

    /// The pod, as k8s-openapi's types read it back from its JSON: pinned
    /// to its node, host network and PID, privileged, the node's root
    /// read-only with a writable scratch directory, every taint tolerated.
    #[test]
    fn the_capture_pod_reaches_the_node_read_only() {
        let pod = capture_pod(&pod_name("kind-worker", "0a1b2"), "kind-worker", &opts());
        let json = serde_json::to_value(&pod).expect("json");
        let back: Pod = serde_json::from_value(json.clone()).expect("a Pod");
        assert_eq!(back, pod);
        assert_eq!(json["metadata"]["name"], "cnilab-capture-kind-worker-0a1b2");
        let spec = &json["spec"];
        assert_eq!(spec["nodeName"], "kind-worker");
        assert_eq!(spec["hostNetwork"], true);
        assert_eq!(spec["hostPID"], true);
        assert_eq!(
            spec["tolerations"],
            serde_json::json!([{"operator": "Exists"}])
        );
        assert_eq!(spec["restartPolicy"], "Never");
        let c = &spec["containers"][0];
        assert_eq!(c["name"], CONTAINER);
        assert_eq!(c["securityContext"]["privileged"], true);
        assert_eq!(
            c["volumeMounts"],
            serde_json::json!([
                {"name": "host", "mountPath": "/host", "readOnly": true},
                {"name": "scratch", "mountPath": "/host/tmp"}
            ])
        );
        assert_eq!(spec["volumes"][0]["hostPath"]["path"], "/");
        assert!(spec["volumes"][1]["emptyDir"].is_object());
    }

    #[test]
    fn pod_names_are_dns_labels() {
        let long = "ip-10-0-1-23.eu-west-1.compute.internal.example.com";
        for node in ["kind-worker", long, "Node_A"] {
            let name = pod_name(node, "fffff");
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{name}"
            );
        }
    }

    #[test]
    fn unknown_nodes_are_named_with_the_known_ones() {
        let listed: Vec<ClusterNode> = ["kind-worker", "kind-worker2"]
            .iter()
            .map(|n| ClusterNode {
                name: n.to_string(),
                ..ClusterNode::default()
            })
            .collect();
        assert_eq!(select(&listed, &[]).expect("all").len(), 2);
        let one = select(&listed, &["kind-worker2".into()]).expect("one");
        assert_eq!(one[0].name, "kind-worker2");
        let e = select(&listed, &["kind-worker3".into()]).expect_err("unknown");
        assert!(
            e.to_string().contains("kind-worker3")
                && e.to_string().contains("kind-worker, kind-worker2"),
            "{e}"
        );
    }

    #[test]
    fn the_command_runs_the_script_on_the_nodes_root() {
        let c = command();
        assert_eq!(c, ["chroot", "/host", "sh", "-c", &script::script()]);
        assert!(c[4].starts_with("#!/bin/sh"));
    }
}
