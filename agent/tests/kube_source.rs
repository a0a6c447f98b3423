//! The Kubernetes node source against a mock API server (no cluster): a
//! scenario answers the watcher's list and watch requests for Nodes and
//! checks each request it gets.

use cnilab_agent::metrics::Metrics;
use cnilab_agent::nodes::{NodeInfo, Snapshot};
use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tower_test::mock;

type Handle = mock::Handle<Request<Body>, Response<Body>>;

fn node(name: &str, ip: &str, cidr: &str, resource_version: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": name, "resourceVersion": resource_version },
        "spec": { "podCIDR": cidr, "podCIDRs": [cidr] },
        "status": { "addresses": [
            { "type": "Hostname", "address": name },
            { "type": "InternalIP", "address": ip }
        ] }
    })
}

fn node_list(resource_version: &str, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "NodeList",
        "metadata": { "resourceVersion": resource_version },
        "items": items
    })
}

fn watch_event(kind: &str, object: Value) -> String {
    format!("{}\n", json!({ "type": kind, "object": object }))
}

fn gone() -> String {
    watch_event(
        "ERROR",
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "too old resource version: 1 (7)",
            "reason": "Expired", "code": 410
        }),
    )
}

fn query(request: &Request<Body>) -> String {
    request.uri().query().unwrap_or("").to_string()
}

/// Waits for the next request and checks it is a list (not a watch) of Nodes.
async fn expect_list(handle: &mut Handle, body: Value) {
    let (request, respond) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .expect("a list request within 10s")
        .expect("client alive");
    assert_eq!(request.method(), http::Method::GET);
    assert_eq!(request.uri().path(), "/api/v1/nodes");
    assert!(
        !query(&request).contains("watch=true"),
        "expected a list: {}",
        request.uri()
    );
    let response = Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(body.to_string().into_bytes()))
        .expect("response");
    respond.send_response(response);
}

/// Waits for a watch from `resource_version` and answers with these events.
async fn expect_watch(handle: &mut Handle, resource_version: &str, events: &[String]) {
    let (request, respond) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .expect("a watch request within 10s")
        .expect("client alive");
    assert_eq!(request.uri().path(), "/api/v1/nodes");
    let q = query(&request);
    assert!(
        q.contains("watch=true"),
        "expected a watch: {}",
        request.uri()
    );
    assert!(
        q.contains(&format!("resourceVersion={resource_version}")),
        "expected a watch from {resource_version}: {}",
        request.uri()
    );
    let response = Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(events.concat().into_bytes()))
        .expect("response");
    respond.send_response(response);
}

/// The next published snapshot (within 10s).
async fn next_full_snapshot(rx: &mut mpsc::UnboundedReceiver<Snapshot>) -> Snapshot {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a snapshot within 10s")
        .expect("source alive")
}

/// The node names of the next published snapshot.
async fn next_snapshot(rx: &mut mpsc::UnboundedReceiver<Snapshot>) -> Vec<String> {
    let snapshot = next_full_snapshot(rx).await;
    snapshot.iter().map(|n| n.name.clone()).collect()
}

fn start() -> (
    Handle,
    mpsc::UnboundedReceiver<Snapshot>,
    Arc<Metrics>,
    tokio::task::JoinHandle<()>,
) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let (tx, rx) = mpsc::unbounded_channel();
    let metrics = Arc::new(Metrics::default());
    let task = tokio::spawn(cnilab_agent::source::kube::watch(
        client,
        move |snapshot| {
            let _ = tx.send(snapshot);
        },
        metrics.clone(),
    ));
    (handle, rx, metrics, task)
}

#[tokio::test]
async fn initial_list_then_watch_add_and_delete() {
    let (mut handle, mut rx, _metrics, task) = start();
    expect_list(
        &mut handle,
        node_list(
            "10",
            vec![
                node("a", "172.18.0.2", "10.244.0.0/24", "5"),
                node("b", "172.18.0.3", "10.244.1.0/24", "6"),
            ],
        ),
    )
    .await;
    let first = next_full_snapshot(&mut rx).await;
    assert_eq!(
        first[1],
        NodeInfo::new(
            "b",
            &["172.18.0.3".parse().expect("ip")],
            &["10.244.1.0/24".parse().expect("net")]
        )
    );

    expect_watch(
        &mut handle,
        "10",
        &[
            watch_event("ADDED", node("c", "172.18.0.4", "10.244.2.0/24", "11")),
            // A status-only update (same addresses and CIDRs) must not publish.
            watch_event("MODIFIED", node("a", "172.18.0.2", "10.244.0.0/24", "12")),
            watch_event("DELETED", node("b", "172.18.0.3", "10.244.1.0/24", "13")),
        ],
    )
    .await;
    assert_eq!(next_snapshot(&mut rx).await, ["a", "b", "c"]);
    assert_eq!(next_snapshot(&mut rx).await, ["a", "c"]);
    // The watch body ended: the watcher resumes from the last version seen.
    expect_watch(&mut handle, "13", &[]).await;
    task.abort();
}

#[tokio::test]
async fn watch_error_relists_and_reconnects() {
    let (mut handle, mut rx, metrics, task) = start();
    expect_list(
        &mut handle,
        node_list("1", vec![node("a", "172.18.0.2", "10.244.0.0/24", "1")]),
    )
    .await;
    assert_eq!(next_snapshot(&mut rx).await, ["a"]);

    // The resource version expired (410 Gone): the watcher reports the error,
    // backs off, lists again and watches from the new list's version.
    expect_watch(&mut handle, "1", &[gone()]).await;
    expect_list(
        &mut handle,
        node_list(
            "7",
            vec![
                node("a", "172.18.0.2", "10.244.0.0/24", "1"),
                node("d", "172.18.0.5", "10.244.3.0/24", "7"),
            ],
        ),
    )
    .await;
    assert_eq!(next_snapshot(&mut rx).await, ["a", "d"]);
    assert_eq!(metrics.source_errors.load(Ordering::Relaxed), 1);
    expect_watch(
        &mut handle,
        "7",
        &[watch_event(
            "ADDED",
            node("e", "172.18.0.6", "10.244.4.0/24", "8"),
        )],
    )
    .await;
    assert_eq!(next_snapshot(&mut rx).await, ["a", "d", "e"]);
    task.abort();
}

#[tokio::test]
async fn a_failing_api_server_is_retried() {
    let (mut handle, mut rx, metrics, task) = start();
    let (_, respond) = handle.next_request().await.expect("list request");
    respond.send_response(
        Response::builder()
            .status(500)
            .body(Body::from(
                json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"etcd down","reason":"InternalError","code":500})
                    .to_string()
                    .into_bytes(),
            ))
            .expect("response"),
    );
    expect_list(
        &mut handle,
        node_list("3", vec![node("a", "172.18.0.2", "10.244.0.0/24", "3")]),
    )
    .await;
    assert_eq!(next_snapshot(&mut rx).await, ["a"]);
    assert!(metrics.source_errors.load(Ordering::Relaxed) >= 1);
    task.abort();
}
