//! The objects the check creates: its namespace, two pods pinned to every
//! node, a hostNetwork pod per node, a ClusterIP service over all pods and
//! one "self" service per node whose only backend is that node's first pod
//! (a pod reaching itself through it proves hairpin).

use super::CheckOptions;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use serde_json::{json, Value};

/// Label on everything the check creates (and the namespace it may delete).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "cnilab-e2e");
/// netexec's HTTP (TCP) and UDP ports in every probe pod.
pub const HTTP_PORT: u16 = 7777;
pub const UDP_PORT: u16 = 7778;
/// Pods on each node.
pub const PODS_PER_NODE: usize = 2;
/// The service over every (non-host) probe pod.
pub const ECHO_SERVICE: &str = "echo";

pub fn pod_name(node_index: usize, k: usize) -> String {
    format!("pod-n{node_index}-{k}")
}

pub fn host_pod_name(node_index: usize) -> String {
    format!("host-n{node_index}")
}

pub fn self_service_name(node_index: usize) -> String {
    format!("self-n{node_index}")
}

pub fn namespace(opts: &CheckOptions) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": opts.namespace,
            "labels": { MANAGED_BY.0: MANAGED_BY.1 }
        }
    })
}

fn probe_pod(opts: &CheckOptions, name: &str, node: &str, host: bool) -> Value {
    let role = if host { "host" } else { "pod" };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": opts.namespace,
            "labels": {
                MANAGED_BY.0: MANAGED_BY.1,
                "cnilab.io/role": role,
                "cnilab.io/probe": name
            },
            "annotations": { "cnilab.io/node": node }
        },
        "spec": {
            // nodeName bypasses the scheduler: the pod lands on exactly this
            // node, NotReady or tainted (the tolerations keep it there).
            "nodeName": node,
            "tolerations": [{ "operator": "Exists" }],
            "hostNetwork": host,
            "dnsPolicy": if host { "ClusterFirstWithHostNet" } else { "ClusterFirst" },
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "probe",
                "image": opts.probe_image,
                "imagePullPolicy": "IfNotPresent",
                "args": [
                    "netexec",
                    format!("--http-port={HTTP_PORT}"),
                    format!("--udp-port={UDP_PORT}")
                ],
                "ports": [
                    { "name": "http", "containerPort": HTTP_PORT, "protocol": "TCP" },
                    { "name": "udp", "containerPort": UDP_PORT, "protocol": "UDP" }
                ]
            }]
        }
    })
}

/// Every pod, in creation order: the two pods of each node, then the host pods.
pub fn pods(opts: &CheckOptions, nodes: &[String]) -> Vec<Value> {
    let mut out = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        for k in 0..PODS_PER_NODE {
            out.push(probe_pod(opts, &pod_name(i, k), node, false));
        }
    }
    for (i, node) in nodes.iter().enumerate() {
        out.push(probe_pod(opts, &host_pod_name(i), node, true));
    }
    out
}

fn service(opts: &CheckOptions, name: &str, selector: Value, udp: bool) -> Value {
    let mut ports =
        vec![json!({ "name": "http", "port": 80, "targetPort": HTTP_PORT, "protocol": "TCP" })];
    if udp {
        ports.push(json!({ "name": "udp", "port": 80, "targetPort": UDP_PORT, "protocol": "UDP" }));
    }
    let (v4, v6) = opts.ip_family.families();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": opts.namespace,
            "labels": { MANAGED_BY.0: MANAGED_BY.1 }
        },
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ipFamilyPolicy": if v4 && v6 { "PreferDualStack" } else { "SingleStack" },
            "ports": ports
        }
    })
}

pub fn services(opts: &CheckOptions, nodes: usize) -> Vec<Value> {
    let mut out = vec![service(
        opts,
        ECHO_SERVICE,
        json!({ "cnilab.io/role": "pod" }),
        true,
    )];
    for i in 0..nodes {
        out.push(service(
            opts,
            &self_service_name(i),
            json!({ "cnilab.io/probe": pod_name(i, 0) }),
            false,
        ));
    }
    out
}

pub fn typed_namespace(v: Value) -> Result<Namespace, serde_json::Error> {
    serde_json::from_value(v)
}

pub fn typed_pod(v: Value) -> Result<Pod, serde_json::Error> {
    serde_json::from_value(v)
}

pub fn typed_service(v: Value) -> Result<Service, serde_json::Error> {
    serde_json::from_value(v)
}
