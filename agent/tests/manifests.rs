//! Every document in lab/manifests parses into its k8s-openapi type with no
//! field lost (so a typo fails here, not in the cluster), and the deployment
//! keeps its security properties.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

fn manifests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../lab/manifests")
}

fn documents(file: &str) -> Vec<Value> {
    let path = manifests_dir().join(file);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{file}: invalid YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// Drops nulls so a typed round trip compares equal to the source.
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// Parses into `T` and checks that serializing gives the same document back:
/// k8s-openapi ignores unknown fields, so a misspelt field shows up as a loss.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> T {
    let object: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{e}: {doc:#}"));
    let back = without_nulls(serde_json::to_value(&object).expect("serialize"));
    assert_eq!(
        back,
        without_nulls(doc.clone()),
        "fields lost in the round trip (typo?)"
    );
    object
}

struct Manifest {
    service_accounts: Vec<ServiceAccount>,
    roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    daemonsets: Vec<DaemonSet>,
}

fn load() -> Manifest {
    let mut m = Manifest {
        service_accounts: vec![],
        roles: vec![],
        bindings: vec![],
        daemonsets: vec![],
    };
    for doc in documents("cnilab.yaml") {
        let kind = (doc["apiVersion"].as_str(), doc["kind"].as_str());
        match kind {
            (Some("v1"), Some("ServiceAccount")) => m.service_accounts.push(typed(&doc)),
            (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRole")) => {
                m.roles.push(typed(&doc))
            }
            (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRoleBinding")) => {
                m.bindings.push(typed(&doc))
            }
            (Some("apps/v1"), Some("DaemonSet")) => m.daemonsets.push(typed(&doc)),
            other => panic!("unexpected document kind {other:?} in cnilab.yaml"),
        }
    }
    m
}

fn daemonset() -> DaemonSet {
    let mut m = load();
    assert_eq!(m.daemonsets.len(), 1);
    m.daemonsets.remove(0)
}

fn all_containers(ds: &DaemonSet) -> Vec<Container> {
    let pod = ds.spec.template.spec.as_ref().expect("pod spec");
    pod.init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .cloned()
        .collect()
}

#[test]
fn every_document_parses_into_its_type() {
    let m = load();
    assert_eq!(m.service_accounts.len(), 1);
    assert_eq!(m.roles.len(), 1);
    assert_eq!(m.bindings.len(), 1);
    assert_eq!(m.daemonsets.len(), 1);
}

#[test]
fn rbac_is_read_only_on_nodes() {
    let m = load();
    let rules = m.roles[0].rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), 1, "only one rule");
    let rule = &rules[0];
    assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
    assert_eq!(rule.resources.as_deref(), Some(&["nodes".to_string()][..]));
    assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
    let mut verbs = rule.verbs.clone();
    verbs.sort();
    assert_eq!(verbs, ["get", "list", "watch"]);

    let binding = &m.bindings[0];
    assert_eq!(
        binding.role_ref.name,
        m.roles[0].metadata.name.clone().unwrap_or_default()
    );
    let subject = &binding.subjects.as_ref().expect("subjects")[0];
    let sa = &m.service_accounts[0].metadata;
    assert_eq!(
        (Some(&subject.name), subject.namespace.as_ref()),
        (sa.name.as_ref(), sa.namespace.as_ref())
    );
    let pod = daemonset().spec.template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name, sa.name);
}

#[test]
fn containers_are_not_privileged_and_only_get_net_admin() {
    for c in all_containers(&daemonset()) {
        let sc = c
            .security_context
            .clone()
            .unwrap_or_else(|| panic!("{}: no securityContext", c.name));
        assert_ne!(sc.privileged, Some(true), "{}: privileged", c.name);
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        let caps = sc.capabilities.clone().unwrap_or_default();
        assert_eq!(
            caps.drop.as_deref(),
            Some(&["ALL".to_string()][..]),
            "{}: drop ALL",
            c.name
        );
        for cap in caps.add.iter().flatten() {
            assert!(
                cap == "NET_ADMIN" || cap == "NET_RAW",
                "{}: capability {cap}",
                c.name
            );
        }
        if c.name == "agent" {
            assert_eq!(caps.add.as_deref(), Some(&["NET_ADMIN".to_string()][..]));
        }
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        assert!(
            requests.is_some_and(|r| r.contains_key("cpu") && r.contains_key("memory")),
            "{}: resource requests",
            c.name
        );
        assert_eq!(
            c.image.as_deref(),
            Some("ghcr.io/cnilab/cnilab:dev"),
            "{}: image tag the e2e replaces",
            c.name
        );
    }
}

#[test]
fn daemonset_runs_on_every_node_in_the_host_network() {
    let pod = daemonset().spec.template.spec.expect("pod spec");
    assert_eq!(pod.host_network, Some(true));
    let tolerations = pod.tolerations.unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "a toleration for every taint: {tolerations:?}"
    );
}

#[test]
fn init_container_installs_the_plugin_into_the_host_cni_bin_dir() {
    let pod = daemonset().spec.template.spec.expect("pod spec");
    let init = pod.init_containers.clone().unwrap_or_default();
    let install = init
        .iter()
        .find(|c| c.args.iter().flatten().any(|a| a == "install-plugin"))
        .expect("install-plugin initContainer");
    let args = install.args.clone().unwrap_or_default();
    let mount = install
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| args.contains(&format!("--cni-bin-dir={}", m.mount_path)))
        .expect("--cni-bin-dir is a mounted volume");
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .expect("volume");
    assert_eq!(
        volume.host_path.as_ref().map(|h| h.path.as_str()),
        Some("/opt/cni/bin")
    );
}

#[test]
fn agent_is_ready_on_healthz_at_its_metrics_port_and_knows_its_node() {
    let pod = daemonset().spec.template.spec.expect("pod spec");
    let agent = pod
        .containers
        .iter()
        .find(|c| c.name == "agent")
        .expect("agent container");
    let probe = agent
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .expect("readiness httpGet");
    assert_eq!(probe.path.as_deref(), Some("/healthz"));
    let port = match &probe.port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => p.to_string(),
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
    };
    let args = agent.args.clone().unwrap_or_default();
    assert!(
        args.contains(&format!("--metrics-addr=[::]:{port}")),
        "{args:?}"
    );
    let env = agent.env.clone().unwrap_or_default();
    let node_name = env
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME env");
    let field = node_name
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(field, Some("spec.nodeName"));
    assert!(env
        .iter()
        .any(|e| e.name == "CNILAB_CLUSTER_CIDR" && e.value.is_some()));
}

#[test]
fn kustomization_lists_the_manifest_and_the_image() {
    let docs = documents("kustomization.yaml");
    assert_eq!(docs.len(), 1);
    let k = &docs[0];
    assert_eq!(k["kind"], "Kustomization");
    assert_eq!(k["resources"], serde_json::json!(["cnilab.yaml"]));
    assert_eq!(k["images"][0]["name"], "ghcr.io/cnilab/cnilab");
}
