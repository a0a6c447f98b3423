//! `cnilab capture --kubeconfig` (root) without a cluster: the collection
//! talks to a recorded API server (the Node, Pod, Service and EndpointSlice
//! lists a kind cluster with two workers answers, and the capture pods'
//! create, get and delete), and each capture pod's exec runs the real
//! capture script, as the pod's command line says, against a hand-built
//! flannel-style node (`capture_common/styles.rs`) whose pods are
//! `cni-<uuid>` namespaces. The bundle names every pod as the API does,
//! carries the API's facts, deletes every pod it made, and replays whole
//! (`lab up --capture BUNDLE`, then `lab check` passes with every pod
//! probed under its Kubernetes name). The real cluster runs in the
//! e2e-kind workflow.

mod capture_common;

use capture_common::styles;
use cnilab_harness::capture::bundle::Bundle;
use cnilab_harness::e2e::check::probes::ExecOutput;
use cnilab_harness::e2e::check::{PodCommand, PodExec};
use cnilab_harness::e2e::collect::{self, CollectOptions};
use cnilab_net::netns::Netns;
use cnilab_tests::{cnilab, host_untouched, output_text, StandingLab};
use futures_util::future::BoxFuture;
use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WORKERS: [&str; 2] = ["kind-worker", "kind-worker2"];

/// The API's pods of worker `i` (0-based), each with the address the
/// flannel fixture gives its `j`-th pod, and one host-network pod.
fn api_pods(i: usize) -> Vec<(&'static str, String)> {
    let names: [[&str; 2]; 2] = [
        [
            "kube-system/coredns-5d78c9869d-x2x7k",
            "default/web-7f8d9c6b5-abcde",
        ],
        [
            "default/web-7f8d9c6b5-fghij",
            "kube-system/coredns-5d78c9869d-q8w4z",
        ],
    ];
    names[i]
        .iter()
        .enumerate()
        .map(|(j, n)| (*n, format!("10.244.{}.{}", i + 1, j + 2)))
        .collect()
}

fn recorded_lists() -> (Value, Value, Value, Value) {
    let nodes: Vec<Value> = WORKERS
        .iter()
        .enumerate()
        .map(|(i, name)| {
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": name, "labels": { "kubernetes.io/hostname": name } },
                "spec": {
                    "podCIDR": format!("10.244.{}.0/24", i + 1),
                    "podCIDRs": [format!("10.244.{}.0/24", i + 1)],
                    "providerID": format!("kind://docker/kind/{name}")
                },
                "status": {
                    "addresses": [
                        { "type": "InternalIP", "address": format!("192.0.2.{}", i + 1) },
                        { "type": "Hostname", "address": name }
                    ],
                    "conditions": [{ "type": "Ready", "status": "True" }]
                }
            })
        })
        .collect();
    let mut pods = Vec::new();
    for (i, node) in WORKERS.iter().enumerate() {
        for (name, ip) in api_pods(i) {
            let (ns, name) = name.split_once('/').expect("ns/name");
            pods.push(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": name, "namespace": ns },
                "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "i" }] },
                "status": { "phase": "Running", "podIP": ip, "podIPs": [{ "ip": ip }] }
            }));
        }
        let host_ip = format!("192.0.2.{}", i + 1);
        pods.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": format!("kube-proxy-{}x9z", i), "namespace": "kube-system" },
            "spec": { "nodeName": node, "hostNetwork": true, "containers": [{ "name": "kube-proxy" }] },
            "status": { "phase": "Running", "podIP": host_ip, "podIPs": [{ "ip": host_ip }] }
        }));
    }
    let services = json!([{
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "kube-dns", "namespace": "kube-system" },
        "spec": {
            "type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
            "ports": [{ "name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53 }]
        }
    }]);
    let slices = json!([{
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-m5x2q", "namespace": "kube-system",
            "labels": { "kubernetes.io/service-name": "kube-dns" }
        },
        "addressType": "IPv4",
        "endpoints": [{
            "addresses": ["10.244.1.2"], "conditions": { "ready": true },
            "nodeName": "kind-worker",
            "targetRef": { "kind": "Pod", "namespace": "kube-system", "name": "coredns-5d78c9869d-x2x7k" }
        }],
        "ports": [{ "name": "dns", "port": 53, "protocol": "UDP" }]
    }]);
    (json!(nodes), json!(pods), services, slices)
}

#[derive(Default)]
struct Api {
    requests: Vec<String>,
    /// The capture pods made, by name.
    made: Vec<Value>,
    deleted: Vec<String>,
}

fn reply(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .expect("response")
}

fn list(kind: &str, items: &Value) -> Value {
    json!({ "apiVersion": "v1", "kind": kind, "metadata": { "resourceVersion": "4711" }, "items": items })
}

/// The recorded API server: the lists, and the capture pods' lifecycle.
fn client(api: Arc<Mutex<Api>>) -> kube::Client {
    let (nodes, pods, services, slices) = recorded_lists();
    let service = tower::service_fn(move |req: Request<Body>| {
        let api = api.clone();
        let (nodes, pods, services, slices) = (
            nodes.clone(),
            pods.clone(),
            services.clone(),
            slices.clone(),
        );
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let body = req
                .into_body()
                .collect_bytes()
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            let mut st = api.lock().expect("api");
            st.requests.push(format!("{method} {path}"));
            let own = "/api/v1/namespaces/default/pods";
            let named = path.strip_prefix(&format!("{own}/")).map(str::to_string);
            let r = match (method.as_str(), path.as_str(), named) {
                ("GET", "/api/v1/nodes", _) => reply(200, &list("NodeList", &nodes)),
                ("GET", "/api/v1/pods", _) => reply(200, &list("PodList", &pods)),
                ("GET", "/api/v1/services", _) => reply(200, &list("ServiceList", &services)),
                ("GET", "/apis/discovery.k8s.io/v1/endpointslices", _) => {
                    reply(200, &list("EndpointSliceList", &slices))
                }
                ("POST", p, _) if p == own => {
                    let pod: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    st.made.push(pod.clone());
                    reply(201, &pod)
                }
                ("GET", _, Some(name)) => {
                    let found = st
                        .made
                        .iter()
                        .find(|p| p["metadata"]["name"] == name.as_str());
                    match found {
                        Some(p) => {
                            let mut p = p.clone();
                            p["status"] = json!({ "phase": "Running" });
                            reply(200, &p)
                        }
                        None => reply(
                            404,
                            &json!({ "kind": "Status", "code": 404, "reason": "NotFound" }),
                        ),
                    }
                }
                ("DELETE", _, Some(name)) => {
                    st.deleted.push(name.clone());
                    let p = st
                        .made
                        .iter()
                        .find(|p| p["metadata"]["name"] == name.as_str())
                        .cloned();
                    reply(200, &p.unwrap_or(Value::Null))
                }
                _ => reply(
                    404,
                    &json!({ "kind": "Status", "code": 404, "reason": "NotFound", "message": format!("no route for {method} {path}") }),
                ),
            };
            Ok::<_, std::convert::Infallible>(r)
        }
    });
    kube::Client::new(service, "default")
}

/// Runs the capture pod's command on this machine: `chroot /host sh -c
/// SCRIPT` becomes `sh -c SCRIPT` against the node namespace of the pod's
/// `nodeName`, the node's CNI files in `empty` (none).
struct LocalExec {
    api: Arc<Mutex<Api>>,
    nodes: Vec<PathBuf>,
    empty: PathBuf,
}

impl PodExec for LocalExec {
    fn exec(&self, call: PodCommand) -> BoxFuture<'_, Result<ExecOutput, String>> {
        let node = {
            let st = self.api.lock().expect("api");
            st.made
                .iter()
                .find(|p| p["metadata"]["name"] == call.pod.as_str())
                .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
        };
        let at = node.and_then(|n| WORKERS.iter().position(|w| *w == n));
        let node = at.map(|i| self.nodes[i].clone());
        let empty = self.empty.clone();
        Box::pin(async move {
            let node = node.ok_or("exec into a pod that was never made")?;
            assert_eq!(call.container, collect::CONTAINER);
            let (prefix, script) = call.command.split_at(4);
            assert_eq!(prefix, ["chroot", "/host", "sh", "-c"]);
            let script = script.first().cloned().unwrap_or_default();
            let out = tokio::task::spawn_blocking(move || {
                std::process::Command::new("sh")
                    .args(["-c", &script])
                    .env("CNILAB_NETNS", &node)
                    .env("CNILAB_CNI_CACHE", &empty)
                    .env("CNILAB_CNI_CONF", &empty)
                    .output()
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
            Ok(ExecOutput {
                success: out.status.success(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                message: out.status.to_string(),
            })
        })
    }
}

fn options(redact: Option<&str>) -> CollectOptions {
    CollectOptions {
        nodes: Vec::new(),
        namespace: "default".into(),
        image: "busybox:1.37".into(),
        start_timeout: Duration::from_secs(5),
        redact: redact.map(|k| k.as_bytes().to_vec()),
        context: "kind-kind".into(),
        server: "https://127.0.0.1:40123".into(),
    }
}

fn collect_from(nodes: &[Netns], empty: &std::path::Path, redact: Option<&str>) -> (Bundle, Api) {
    let api = Arc::new(Mutex::new(Api::default()));
    let exec = LocalExec {
        api: api.clone(),
        nodes: nodes.iter().map(|n| n.path().to_path_buf()).collect(),
        empty: empty.to_path_buf(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // kube's client spawns onto the runtime it is made in.
    let client = {
        let _in = rt.enter();
        client(api.clone())
    };
    let bundle = rt
        .block_on(collect::collect(client, &exec, &options(redact)))
        .expect("the collection runs");
    let st = std::mem::take(&mut *api.lock().expect("api"));
    (bundle, st)
}

#[test]
fn a_cluster_is_collected_named_by_the_api_and_replays_whole() {
    let _host = host_untouched();
    let cluster = styles::flannel();
    let dir = tempfile::tempdir().expect("dir");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("dir");
    let (bundle, api) = collect_from(&cluster.nodes, &empty, None);

    // One privileged pod per node, each deleted.
    let made: Vec<String> = api
        .made
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(made.len(), 2, "{:?}", api.requests);
    let mut deleted = api.deleted.clone();
    deleted.sort();
    let mut want = made.clone();
    want.sort();
    assert_eq!(deleted, want, "every capture pod is deleted");
    for (p, node) in api.made.iter().zip(WORKERS) {
        assert_eq!(p["spec"]["nodeName"], node, "{p}");
    }

    // Every node captured, its pods named as the API names them.
    assert_eq!(bundle.nodes.len(), 2);
    for (i, n) in bundle.nodes.iter().enumerate() {
        assert_eq!(n.name, WORKERS[i]);
        assert_eq!(
            n.pod_cidrs,
            vec![format!("10.244.{}.0/24", i + 1).parse().expect("cidr")]
        );
        let c = n
            .capture
            .as_ref()
            .unwrap_or_else(|| panic!("{}: {:?}", n.name, n.error));
        assert_eq!(c.node.net.name, WORKERS[i]);
        assert_eq!(c.node.pod_cidrs, n.pod_cidrs);
        let mut names: Vec<&str> = c.pods.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        let mut api_names: Vec<&str> = api_pods(i).iter().map(|(n, _)| *n).collect();
        api_names.sort_unstable();
        assert_eq!(names, api_names, "{:?}", c.pods);
        for p in &c.pods {
            assert!(p.skipped.is_none(), "{p:?}");
            assert!(
                p.evidence
                    .iter()
                    .any(|e| e.contains("the Kubernetes API lists pod")),
                "{p:?}"
            );
            assert!(c.node.pods.iter().any(|ns| ns.name == p.name), "{}", p.name);
        }
        // The node's veths point at the renamed pods.
        for l in c.node.net.links.iter().filter_map(|l| l.veth.as_ref()) {
            if let Some(ns) = &l.namespace {
                let known = *ns == c.node.net.name || c.node.pods.iter().any(|p| &p.name == ns);
                assert!(known, "{ns}");
            }
        }
    }
    assert_eq!(bundle.pods.len(), 6);
    assert!(bundle.pods.iter().any(|p| p.host_network));
    assert_eq!(bundle.services[0].name, "kube-system/kube-dns");
    assert_eq!(bundle.endpoint_slices[0].service, "kube-system/kube-dns");
    assert_eq!(
        bundle.endpoint_slices[0].endpoints[0].pod.as_deref(),
        Some("kube-system/coredns-5d78c9869d-x2x7k")
    );

    // The bundle replays whole: both nodes, all four pods probed.
    let file = dir.path().join("cluster.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&bundle).expect("json")).expect("write");
    let lab = format!("ccl{}", std::process::id() % 100_000);
    let file_arg = file.display().to_string();
    let up = cnilab(&["lab", "up", "--name", &lab, "--capture", &file_arg]);
    let _down = StandingLab(lab.clone());
    assert!(
        up.status.success(),
        "lab up --capture: {}",
        output_text(&up)
    );
    assert!(
        output_text(&up).contains("2 nodes, 4 pods"),
        "{}",
        output_text(&up)
    );
    let check = cnilab(&["lab", "check", "--name", &lab, "-o", "json"]);
    assert!(check.status.success(), "lab check: {}", output_text(&check));
    let text = String::from_utf8_lossy(&check.stdout);
    for (name, _) in api_pods(0).iter().chain(api_pods(1).iter()) {
        assert!(text.contains(name), "{name} not probed: {text}");
    }
}

#[test]
fn a_redacted_bundle_agrees_with_itself_and_keeps_no_name() {
    let _host = host_untouched();
    let cluster = styles::flannel();
    let dir = tempfile::tempdir().expect("dir");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("dir");
    let (bundle, _) = collect_from(&cluster.nodes, &empty, Some("k3y"));
    assert!(bundle.cluster.redacted);
    let text = serde_json::to_string(&bundle).expect("json");
    for secret in [
        "coredns",
        "web-7f8d9c6b5",
        "kind-worker",
        "kube-dns",
        "127.0.0.1",
    ] {
        assert!(!text.contains(secret), "{secret} left in the bundle");
    }
    // A pod's name and address agree between the API's list and the
    // captures.
    for n in &bundle.nodes {
        let c = n.capture.as_ref().expect("captured");
        assert_eq!(c.node.net.name, n.name);
        for p in &c.pods {
            let api = bundle
                .pods
                .iter()
                .find(|a| a.name == p.name)
                .expect("named in the API list");
            let ns = c
                .node
                .pods
                .iter()
                .find(|ns| ns.name == p.name)
                .expect("pod");
            let held: Vec<_> = ns
                .links
                .iter()
                .flat_map(|l| l.addresses.iter().map(|a| a.addr()))
                .collect();
            assert!(
                api.ips.iter().any(|ip| held.contains(ip)),
                "{api:?} vs {held:?}"
            );
        }
    }
    let file = dir.path().join("redacted.json");
    std::fs::write(&file, serde_json::to_vec(&bundle).expect("json")).expect("write");
    let loaded = cnilab_harness::capture::load_all(&file).expect("loads");
    assert_eq!(loaded.len(), 2);
}
