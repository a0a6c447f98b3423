//! The in-cluster check against a mock API server (no cluster here; the
//! real one runs in the e2e-kind workflow). A small fake API server keeps
//! the objects the check creates and records every request; exec is either
//! the real websocket client (whose requests the server records and
//! refuses) or a scripted stand-in for the API server's exec endpoint that
//! models a cluster's network.

use cnilab_harness::connectivity::report::Report;
use cnilab_harness::e2e::check::nodes::{self, ClusterNode};
use cnilab_harness::e2e::check::probes::ExecOutput;
use cnilab_harness::e2e::check::{self, CheckOptions, KubeExec, PodCommand, PodExec};
use cnilab_harness::report::Rendered;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_test::mock;

type Handle = mock::Handle<Request<Body>, Response<Body>>;

const NS: &str = "cnilab-e2e";
const NODES: [&str; 3] = ["kind-control-plane", "kind-worker", "kind-worker2"];

fn node_ip(i: usize) -> String {
    format!("172.18.0.{}", 2 + i)
}

/// The address the fake API server gives a pod (host pods: their node's).
fn pod_ip(name: &str) -> Option<String> {
    if let Some(n) = name.strip_prefix("host-n") {
        return Some(node_ip(n.parse().ok()?));
    }
    let rest = name.strip_prefix("pod-n")?;
    let (n, k) = rest.split_once('-')?;
    Some(format!(
        "10.244.{}.{}",
        n.parse::<usize>().ok()?,
        10 + k.parse::<usize>().ok()?
    ))
}

fn service_ip(name: &str) -> String {
    match name.strip_prefix("self-n") {
        Some(n) => format!("10.96.1.{}", 10 + n.parse::<usize>().unwrap_or(99)),
        None => "10.96.0.10".to_string(),
    }
}

fn node(name: &str, ip: &str, cidrs: &[&str]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name },
        "spec": { "podCIDR": cidrs.first(), "podCIDRs": cidrs },
        "status": {
            "addresses": [
                { "type": "InternalIP", "address": ip },
                { "type": "Hostname", "address": name }
            ],
            "conditions": [{ "type": "Ready", "status": "True" }]
        }
    })
}

fn healthy_nodes() -> Vec<Value> {
    (0..3)
        .map(|i| node(NODES[i], &node_ip(i), &[&format!("10.244.{i}.0/24")]))
        .collect()
}

#[derive(Default)]
struct ApiState {
    /// `METHOD path?query` of every request, in order.
    requests: Vec<String>,
    namespaces: Vec<Value>,
    pods: Vec<Value>,
    services: Vec<Value>,
    /// Decoded `command` parameters of exec requests, with the pod.
    execs: Vec<(String, Vec<String>)>,
    /// Pods that stay ContainerCreating, with a sandbox warning event.
    stuck: Vec<String>,
}

fn respond(status: u16, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .expect("response")
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code
    })
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Serves requests until the client is dropped.
async fn fake_api_server(mut handle: Handle, nodes: Vec<Value>, state: Arc<Mutex<ApiState>>) {
    while let Some((request, send)) = handle.next_request().await {
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let query = request.uri().query().unwrap_or("").to_string();
        let body = request
            .into_body()
            .collect_bytes()
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut st = state.lock().expect("state");
        st.requests.push(format!("{method} {path}?{query}"));
        let pods_path = format!("/api/v1/namespaces/{NS}/pods");
        let response = match (method.as_str(), path.as_str()) {
            ("GET", "/api/v1/nodes") => respond(
                200,
                json!({
                    "apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes
                }),
            ),
            ("GET", p) if p == format!("/api/v1/namespaces/{NS}") => match st.namespaces.first() {
                Some(ns) => respond(200, ns.clone()),
                None => respond(
                    404,
                    status(404, "NotFound", "namespaces \"cnilab-e2e\" not found"),
                ),
            },
            ("POST", "/api/v1/namespaces") => {
                st.namespaces.push(body.clone());
                respond(201, body)
            }
            ("DELETE", p) if p == format!("/api/v1/namespaces/{NS}") => {
                let ns = st.namespaces.pop().unwrap_or(Value::Null);
                respond(200, ns)
            }
            ("POST", p) if p == pods_path => {
                st.pods.push(body.clone());
                respond(201, body)
            }
            ("GET", p) if p == pods_path => {
                let items: Vec<Value> = st
                    .pods
                    .iter()
                    .map(|p| {
                        let mut p = p.clone();
                        let name = p["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string();
                        if st.stuck.contains(&name) {
                            p["status"] = json!({
                                "phase": "Pending",
                                "containerStatuses": [{
                                    "name": "probe", "image": "agnhost", "imageID": "",
                                    "ready": false, "restartCount": 0,
                                    "state": { "waiting": { "reason": "ContainerCreating" } }
                                }]
                            });
                            return p;
                        }
                        let ip = pod_ip(&name).unwrap_or_default();
                        p["status"] = json!({
                            "phase": "Running",
                            "conditions": [{ "type": "Ready", "status": "True" }],
                            "podIP": ip, "podIPs": [{ "ip": ip }]
                        });
                        p
                    })
                    .collect();
                respond(
                    200,
                    json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items }),
                )
            }
            ("GET", p) if p == format!("/api/v1/namespaces/{NS}/events") => {
                let items: Vec<Value> = st.stuck.iter().map(|pod| json!({
                    "apiVersion": "v1", "kind": "Event",
                    "metadata": { "name": format!("{pod}.1"), "namespace": NS },
                    "involvedObject": { "kind": "Pod", "name": pod, "namespace": NS },
                    "type": "Warning", "reason": "FailedCreatePodSandBox", "count": 3,
                    "message": "Failed to create pod sandbox: plugin type=\"cnilab-bridge\" failed (add): no podCIDR for this node"
                })).collect();
                respond(
                    200,
                    json!({ "apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": items }),
                )
            }
            ("POST", p) if p == format!("/api/v1/namespaces/{NS}/services") => {
                let mut svc = body.clone();
                let ip = service_ip(svc["metadata"]["name"].as_str().unwrap_or_default());
                svc["spec"]["clusterIP"] = json!(ip);
                svc["spec"]["clusterIPs"] = json!([ip]);
                st.services.push(svc.clone());
                respond(201, svc)
            }
            ("GET", p) if p.ends_with("/exec") => {
                let pod = p
                    .trim_end_matches("/exec")
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let command: Vec<String> = query
                    .split('&')
                    .filter_map(|kv| kv.strip_prefix("command="))
                    .map(decode)
                    .collect();
                st.execs.push((pod, command));
                respond(
                    403,
                    status(403, "Forbidden", "exec is not served by this mock"),
                )
            }
            _ => respond(
                404,
                status(
                    404,
                    "NotFound",
                    &format!("mock: no route for {method} {path}"),
                ),
            ),
        };
        drop(st);
        send.send_response(response);
    }
}

fn start(
    nodes: Vec<Value>,
) -> (
    kube::Client,
    Arc<Mutex<ApiState>>,
    tokio::task::JoinHandle<()>,
) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let state = Arc::new(Mutex::new(ApiState::default()));
    let server = tokio::spawn(fake_api_server(handle, nodes, state.clone()));
    (client, state, server)
}

fn options() -> CheckOptions {
    let mut o = CheckOptions::new(Default::default());
    o.timeout = Duration::from_secs(10);
    o.title = "mock".into();
    o
}

/// A scripted exec endpoint: `reach(from_pod, to_ip)` is the network.
struct ScriptedExec<F> {
    reach: F,
    /// Full-MTU DF pings fail (the path MTU is smaller than the pods').
    df_broken: bool,
    /// A pod cannot reach itself through its own service.
    hairpin_broken: bool,
    /// The peer sees this source instead of the pod's own address.
    snat_to: Option<String>,
    calls: Mutex<Vec<(String, Vec<String>)>>,
}

fn scripted<F: Fn(&str, &str) -> bool + Send + Sync>(reach: F) -> ScriptedExec<F> {
    ScriptedExec {
        reach,
        df_broken: false,
        hairpin_broken: false,
        snat_to: None,
        calls: Mutex::new(Vec::new()),
    }
}

fn name_at(ip: &str) -> Option<String> {
    for (i, node) in NODES.iter().enumerate() {
        if node_ip(i) == ip {
            return Some(node.to_string());
        }
        for k in 0..2 {
            let p = format!("pod-n{i}-{k}");
            if pod_ip(&p).as_deref() == Some(ip) {
                return Some(p);
            }
        }
    }
    None
}

fn ok(stdout: String) -> ExecOutput {
    ExecOutput {
        success: true,
        stdout,
        ..ExecOutput::default()
    }
}

fn fail(stderr: &str) -> ExecOutput {
    ExecOutput {
        success: false,
        stderr: stderr.into(),
        message: "command terminated with non-zero exit code".into(),
        ..ExecOutput::default()
    }
}

impl<F: Fn(&str, &str) -> bool + Send + Sync> ScriptedExec<F> {
    fn answer(&self, pod: &str, cmd: &[String]) -> ExecOutput {
        let me = pod_ip(pod).unwrap_or_default();
        let first = cmd.first().map(String::as_str).unwrap_or_default();
        let target = cmd.last().cloned().unwrap_or_default();
        match first {
            "cat" => ok("1500\n".into()),
            "ping" => {
                let df = cmd.iter().any(|a| a == "-s");
                if (self.reach)(pod, &target) && !(df && self.df_broken) {
                    ok("1 packets transmitted, 1 received\n".to_string())
                } else {
                    fail(&format!("1 packets transmitted, 0 received ({target})"))
                }
            }
            "curl" => {
                let mut out = String::new();
                for url in cmd.iter().filter(|a| a.starts_with("http://")) {
                    let rest = &url["http://".len()..];
                    let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
                    let host = match hostport.strip_prefix('[') {
                        Some(v6) => v6.split(']').next().unwrap_or_default().to_string(),
                        None => hostport.split(':').next().unwrap_or_default().to_string(),
                    };
                    if host == "127.0.0.1" {
                        let dst = path
                            .split('&')
                            .find_map(|kv| kv.strip_prefix("host="))
                            .unwrap_or_default();
                        return match ((self.reach)(pod, dst), name_at(dst)) {
                            (true, Some(name)) => ok(json!({ "responses": [name] }).to_string()),
                            _ => ok(json!({ "errors": ["reading from udp connection failed. err:'i/o timeout'"] }).to_string()),
                        };
                    }
                    let ip = if host == format!("echo.{NS}.svc") {
                        service_ip("echo")
                    } else {
                        host.clone()
                    };
                    let who = if ip == service_ip("echo") {
                        Some("pod-n1-1".to_string())
                    } else if let Some(n) =
                        (0..NODES.len()).find(|n| service_ip(&format!("self-n{n}")) == ip)
                    {
                        let backend = format!("pod-n{n}-0");
                        if self.hairpin_broken && backend == pod {
                            None
                        } else {
                            Some(backend)
                        }
                    } else if (self.reach)(pod, &ip) {
                        name_at(&ip)
                    } else {
                        None
                    };
                    let Some(who) = who else {
                        return fail(&format!(
                            "curl: (28) Connection timed out after 5001 milliseconds ({url})"
                        ));
                    };
                    if path.starts_with("clientip") {
                        let src = self.snat_to.clone().unwrap_or(me.clone());
                        out.push_str(&format!("{src}:40312\n"));
                    } else {
                        out.push_str(&format!("{who}\n"));
                    }
                }
                ok(out)
            }
            _ => fail("unknown command"),
        }
    }
}

impl<F: Fn(&str, &str) -> bool + Send + Sync> PodExec for ScriptedExec<F> {
    fn exec(&self, call: PodCommand) -> BoxFuture<'_, Result<ExecOutput, String>> {
        Box::pin(async move {
            assert_eq!(call.namespace, NS);
            let out = self.answer(&call.pod, &call.command);
            self.calls
                .lock()
                .expect("calls")
                .push((call.pod, call.command));
            Ok(out)
        })
    }
}

fn node_of_ip(ip: &str) -> Option<usize> {
    if let Some(i) = (0..NODES.len()).find(|i| node_ip(*i) == ip) {
        return Some(i);
    }
    let mut parts = ip.split('.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("10"), Some("244"), Some(n)) => n.parse().ok(),
        _ => None,
    }
}

fn node_of_pod(pod: &str) -> Option<usize> {
    pod_ip(pod).and_then(|ip| node_of_ip(&ip))
}

async fn run_with(exec: &dyn PodExec, nodes: Vec<Value>) -> (Report, Arc<Mutex<ApiState>>) {
    let (client, state, _server) = start(nodes);
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        check::run(client, exec, &options()),
    )
    .await
    .expect("the check finishes")
    .expect("the check runs");
    (report, state)
}

fn group<'a>(
    report: &'a Report,
    name: &str,
) -> &'a cnilab_harness::connectivity::report::GroupResult {
    report
        .groups
        .iter()
        .find(|g| g.name == name)
        .unwrap_or_else(|| panic!("group {name} in {:?}", report.groups))
}

#[tokio::test]
async fn creates_pinned_pods_services_and_execs_through_the_api() {
    let (client, state, _server) = start(healthy_nodes());
    let exec = KubeExec {
        client: client.clone(),
        timeout: Duration::from_secs(5),
    };
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        check::run(client, &exec, &options()),
    )
    .await
    .expect("the check finishes")
    .expect("the check runs");
    let st = state.lock().expect("state");

    // The namespace: created with our label, deleted at the end.
    assert_eq!(
        st.requests
            .iter()
            .filter(|r| r.starts_with("POST /api/v1/namespaces?"))
            .count(),
        1
    );
    assert!(
        st.requests
            .last()
            .is_some_and(|r| r.starts_with(&format!("DELETE /api/v1/namespaces/{NS}"))),
        "last request: {:?}",
        st.requests.last()
    );
    assert!(st.namespaces.is_empty(), "the namespace was deleted");

    // Two pods per node and a hostNetwork pod per node, each pinned.
    assert_eq!(st.pods.len(), 9);
    for (i, node) in NODES.iter().enumerate() {
        for name in [
            format!("pod-n{i}-0"),
            format!("pod-n{i}-1"),
            format!("host-n{i}"),
        ] {
            let pod = st
                .pods
                .iter()
                .find(|p| p["metadata"]["name"] == name.as_str())
                .unwrap_or_else(|| panic!("pod {name}"));
            assert_eq!(pod["spec"]["nodeName"], *node, "{name} pinned to {node}");
            assert_eq!(
                pod["spec"]["hostNetwork"],
                name.starts_with("host-"),
                "{name}"
            );
            assert_eq!(
                pod["spec"]["containers"][0]["image"],
                "registry.k8s.io/e2e-test-images/agnhost:2.53"
            );
            assert_eq!(pod["spec"]["containers"][0]["args"][0], "netexec");
            assert_eq!(pod["spec"]["tolerations"][0]["operator"], "Exists");
            assert_eq!(
                pod["metadata"]["labels"]["app.kubernetes.io/managed-by"],
                "cnilab-e2e"
            );
        }
    }
    // The echo service over every pod and one self service per node.
    let svc_names: Vec<&str> = st
        .services
        .iter()
        .filter_map(|s| s["metadata"]["name"].as_str())
        .collect();
    assert_eq!(svc_names, ["echo", "self-n0", "self-n1", "self-n2"]);
    assert_eq!(st.services[0]["spec"]["selector"]["cnilab.io/role"], "pod");
    assert_eq!(
        st.services[2]["spec"]["selector"]["cnilab.io/probe"],
        "pod-n1-0"
    );
    assert_eq!(st.services[0]["spec"]["type"], "ClusterIP");

    // Every exec went to the API's exec subresource of a probe pod, in its container.
    assert!(st
        .requests
        .iter()
        .filter(|r| r.contains("/exec?"))
        .all(|r| r.contains("container=probe") && r.contains("stdout=true")));
    let execs = &st.execs;
    assert!(execs
        .iter()
        .any(|(p, c)| p == "pod-n0-0" && c == &["cat", "/sys/class/net/eth0/mtu"]));
    assert!(
        execs
            .iter()
            .any(|(p, c)| p == "pod-n0-0" && c == &["ping", "-c", "1", "-W", "2", "10.244.1.10"]),
        "cross-node ping from pod-n0-0"
    );
    assert!(
        execs.iter().any(|(p, c)| p == "host-n2"
            && c.first().is_some_and(|x| x == "ping")
            && c.last().is_some_and(|x| x == "10.244.0.11")),
        "node-to-pod from host-n2"
    );
    assert!(execs.iter().any(|(p, c)| p == "pod-n1-0" && c.iter().any(|a| a == "http://10.96.1.11:80/hostname")), "hairpin through self-n1");
    assert!(
        execs.iter().any(|(_, c)| c
            .iter()
            .any(|a| a == &format!("http://echo.{NS}.svc/hostname"))),
        "service DNS name"
    );
    assert!(
        execs.iter().any(|(_, c)| c
            .iter()
            .any(|a| a.contains("/dial?request=hostname&protocol=udp"))),
        "UDP through netexec's dial"
    );

    // The pods are Ready, but the mock refuses exec, so every probe fails,
    // with the API's reason.
    assert!(!report.passed());
    assert_eq!(group(&report, "pods-ready").passed, 9);
    assert_eq!(report.failures.len(), report.probes - 9);
    assert!(
        report.failures[0]
            .outcome
            .error
            .as_deref()
            .is_some_and(|e| e.contains("exec in")),
        "{:?}",
        report.failures[0].outcome.error
    );
}

#[tokio::test]
async fn healthy_cluster_passes_every_group() {
    let exec = scripted(|_: &str, _: &str| true);
    let (report, state) = run_with(&exec, healthy_nodes()).await;
    assert!(report.passed(), "{}", report.table());
    let names: Vec<&str> = report.groups.iter().map(|g| g.name.as_str()).collect();
    // The report's groups, written out here (comparing with probes::GROUPS
    // would miss a group dropped from GROUPS).
    let expected = "pods-ready pod-to-pod/same-node pod-to-pod/cross-node node-to-pod \
                    pod-to-node pod-to-service pod-to-service/dns hairpin mtu/df-cross-node";
    assert_eq!(names, expected.split_whitespace().collect::<Vec<_>>());
    // 6 pods: 1 same-node peer and 2 cross-node peers each, 3 protocols.
    assert_eq!(group(&report, "pod-to-pod/same-node").probes, 18);
    assert_eq!(group(&report, "pod-to-pod/cross-node").probes, 36);
    // 3 nodes x 6 pods x (icmp, tcp).
    assert_eq!(group(&report, "node-to-pod").probes, 36);
    assert_eq!(group(&report, "hairpin").probes, 3);
    assert_eq!(group(&report, "mtu/df-cross-node").probes, 6);
    let calls = exec.calls.lock().expect("calls");
    assert!(
        calls
            .iter()
            .any(|(_, c)| c == &["ping", "-c", "1", "-W", "2", "-s", "1472", "10.244.1.10"]),
        "DF ping at the pod MTU"
    );
    // Table, JSON and JUnit like the lab's.
    assert!(
        report.table().contains("All 9 checks"),
        "{}",
        report.table()
    );
    let junit = report.junit();
    assert!(
        junit.contains(
            "<testsuite name=\"hairpin\" tests=\"3\" failures=\"0\" errors=\"0\" skipped=\"0\">"
        ),
        "{junit}"
    );
    let json: Value = serde_json::from_str(&report.json()).expect("json");
    assert_eq!(json["nodes"][1]["name"], "kind-worker");
    assert_eq!(json["nodes"][1]["pod_cidr"][0], "10.244.1.0/24");
    assert!(state.lock().expect("state").namespaces.is_empty());
}

#[tokio::test]
async fn cross_node_failure_names_the_missing_route() {
    // Nothing crosses between nodes 0 and 2; everything else works.
    let exec = scripted(|pod: &str, ip: &str| {
        let a = node_of_pod(pod);
        let b = node_of_ip(ip);
        !matches!((a, b), (Some(0), Some(2)) | (Some(2), Some(0)))
    });
    let (report, _) = run_with(&exec, healthy_nodes()).await;
    assert!(!report.passed());
    assert_eq!(group(&report, "pod-to-pod/same-node").passed, 18);
    let cross = report
        .failures
        .iter()
        .find(|f| {
            f.outcome.spec.group == "pod-to-pod/cross-node"
                && f.outcome.spec.from.name == "kind-control-plane/pod-n0-0"
        })
        .expect("a failed cross-node probe from node 0");
    assert_eq!(cross.outcome.spec.to.name, "kind-worker2/pod-n2-0");
    let d = cross
        .diagnoses
        .iter()
        .find(|d| d.id == "missing-route")
        .expect("missing-route diagnosis");
    assert!(
        d.message.contains("10.244.2.0/24 via 172.18.0.4"),
        "{}",
        d.message
    );
    assert!(
        report.table().contains("Likely causes: missing-route"),
        "{}",
        report.table()
    );
}

#[tokio::test]
async fn masquerade_hairpin_and_mtu_are_named() {
    let mut exec = scripted(|_: &str, _: &str| true);
    exec.snat_to = Some("172.18.0.2".into());
    exec.hairpin_broken = true;
    exec.df_broken = true;
    let (report, _) = run_with(&exec, healthy_nodes()).await;
    let ids = report.diagnosis_ids();
    for id in ["masquerade-too-broad", "hairpin", "mtu-mismatch"] {
        assert!(ids.contains(&id), "{id} in {ids:?}\n{}", report.table());
    }
    let tcp = report
        .failures
        .iter()
        .find(|f| f.outcome.spec.group == "pod-to-pod/same-node")
        .expect("a NATed same-node probe");
    assert_eq!(tcp.outcome.seen_source, "172.18.0.2".parse::<IpAddr>().ok());
    assert_eq!(group(&report, "hairpin").passed, 0);
    assert_eq!(
        group(&report, "pod-to-service").passed,
        group(&report, "pod-to-service").probes
    );
}

#[tokio::test]
async fn node_findings_ride_on_the_failed_probes() {
    // Vagrant without --node-ip: two nodes report the NAT address, and the
    // third has no podCIDR.
    let nodes = vec![
        node(NODES[0], "10.0.2.15", &["10.244.0.0/24"]),
        node(NODES[1], "10.0.2.15", &["10.244.1.0/24"]),
        node(NODES[2], "172.18.0.4", &[]),
    ];
    let exec = scripted(|pod: &str, ip: &str| node_of_pod(pod) == node_of_ip(ip));
    let (report, _) = run_with(&exec, nodes).await;
    assert!(!report.passed());
    let ids = report.diagnosis_ids();
    assert!(ids.contains(&"node-address-shared"), "{ids:?}");
    assert!(ids.contains(&"podcidr-missing"), "{ids:?}");
}

fn cluster_node(v: Value) -> ClusterNode {
    ClusterNode::from_node(&serde_json::from_value(v).expect("a Node"))
}

#[test]
fn node_diagnosis_from_a_node_list() {
    let list = [
        cluster_node(node("a", "10.0.2.15", &["10.244.0.0/24"])),
        cluster_node(node("b", "10.0.2.15", &["10.244.0.0/16"])),
        cluster_node(node("c", "192.168.56.12", &[])),
        cluster_node(node("d", "192.168.56.13", &["10.245.9.0/24"])),
    ];
    let findings = nodes::diagnose(&list, true, false);
    let by_id = |id: &str| {
        findings
            .iter()
            .filter(|f| f.diagnosis.id == id)
            .collect::<Vec<_>>()
    };
    let missing = by_id("podcidr-missing");
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0].nodes, ["c"]);
    let overlap = by_id("podcidr-overlap");
    assert_eq!(overlap.len(), 1, "{findings:?}");
    assert_eq!(overlap[0].nodes, ["a", "b"]);
    assert!(
        overlap[0].diagnosis.message.contains("10.244.0.0/24")
            && overlap[0].diagnosis.message.contains("10.244.0.0/16")
    );
    let shared = by_id("node-address-shared");
    assert_eq!(shared.len(), 1);
    assert_eq!(shared[0].nodes, ["a", "b"]);
    assert!(
        shared[0].diagnosis.message.contains("--node-ip"),
        "{}",
        shared[0].diagnosis.message
    );
    assert!(
        by_id("node-address-nat").is_empty(),
        "shared already says it"
    );
    // A lone NAT address is still wrong.
    let lone = nodes::diagnose(
        &[cluster_node(node("x", "10.0.2.15", &["10.244.0.0/24"]))],
        true,
        false,
    );
    assert_eq!(
        lone.iter().map(|f| f.diagnosis.id).collect::<Vec<_>>(),
        ["node-address-nat"]
    );
}

#[test]
fn dry_run_lists_objects_for_the_predicted_nodes() {
    let mut o = options();
    o.predicted_nodes = vec!["n-control-plane".into(), "n-worker".into()];
    o.probe_image = "example.org/agnhost:test".into();
    let text = check::dry_run(&o);
    assert_eq!(
        text.matches("--- write /api/v1/namespaces/cnilab-e2e/pods")
            .count(),
        6
    );
    assert_eq!(
        text.matches("--- write /api/v1/namespaces/cnilab-e2e/services")
            .count(),
        3
    );
    assert!(text.contains("\"nodeName\": \"n-worker\""));
    assert!(text.contains("example.org/agnhost:test"));
    assert!(text.contains("\"hostNetwork\": true"));
}

#[tokio::test]
async fn a_pod_that_never_starts_is_reported_with_its_sandbox_error() {
    let (client, state, _server) = start(healthy_nodes());
    state.lock().expect("state").stuck = vec!["pod-n2-1".to_string()];
    let exec = scripted(|_: &str, _: &str| true);
    let mut opts = options();
    opts.timeout = Duration::from_secs(3);
    let report = tokio::time::timeout(Duration::from_secs(60), check::run(client, &exec, &opts))
        .await
        .expect("the check finishes")
        .expect("the check runs");
    assert!(!report.passed());
    let ready = group(&report, "pods-ready");
    assert_eq!((ready.probes, ready.passed), (9, 8));
    assert_eq!(report.failures.len(), 1, "{}", report.table());
    let f = &report.failures[0];
    assert_eq!(f.outcome.spec.to.name, "kind-worker2/pod-n2-1");
    let err = f.outcome.error.as_deref().unwrap_or_default();
    assert!(
        err.contains("ContainerCreating") && err.contains("FailedCreatePodSandBox"),
        "{err}"
    );
    assert_eq!(
        f.diagnoses.iter().map(|d| d.id).collect::<Vec<_>>(),
        ["cni-add-failed"]
    );
    // Its probes are not run; the other pods' are.
    let calls = exec.calls.lock().expect("calls");
    assert!(!calls.iter().any(|(p, _)| p == "pod-n2-1"));
    assert!(!calls
        .iter()
        .any(|(_, c)| c.iter().any(|a| a.contains("10.244.2.11"))));
    assert_eq!(
        group(&report, "pod-to-pod/same-node").probes,
        12,
        "pod-n2-0 has no same-node peer left"
    );
    assert!(
        state.lock().expect("state").namespaces.is_empty(),
        "namespace deleted"
    );
}
