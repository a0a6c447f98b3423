//! Opt-in cluster test (`cargo test -p cnilab-agent --features cluster-tests
//! --test cluster_k3s`): a real API server (k3s in Docker, through
//! testcontainers), Node objects created through the API, and the agent
//! binary programming a node namespace from them. Needs root and a Docker
//! engine; it runs in the GitHub workflow (`e2e-kind.yml`), not by default.
//! Without the feature, `cargo test` lists it as ignored, with the reason.

#[cfg(not(feature = "cluster-tests"))]
const OPT_IN: &str = "needs root and a Docker engine (k3s in a container): \
run `cargo test -p cnilab-agent --features cluster-tests --test cluster_k3s`";

/// Stands in for the real test when the feature is off, so the exclusion
/// shows in the test output; run with `--ignored`, it fails with the reason.
#[cfg(not(feature = "cluster-tests"))]
#[test]
#[ignore = "opt-in: needs root and a Docker engine; run with `--features cluster-tests` (see docs/src/testing.md)"]
fn agent_routes_nodes_created_through_the_api() {
    panic!("built without the `cluster-tests` feature: {OPT_IN}");
}

#[cfg(feature = "cluster-tests")]
mod support;

#[cfg(feature = "cluster-tests")]
mod k3s {
    use super::support::{netns, require_root, Netns, NetnsExt};
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use kube::config::{KubeConfigOptions, Kubeconfig};
    use serde_json::json;
    use std::net::IpAddr;
    use std::process::Command;
    use testcontainers_modules::k3s::{K3s, KUBE_SECURE_PORT};
    use testcontainers_modules::testcontainers::runners::AsyncRunner;
    use testcontainers_modules::testcontainers::ImageExt;

    const AGENT: &str = env!("CARGO_BIN_EXE_cnilab-agent");

    async fn create_node(api: &Api<Node>, name: &str, ip: &str, cidr: &str) {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": name, "labels": { "cnilab.test/fake": "true" } },
            "spec": { "podCIDR": cidr, "podCIDRs": [cidr] }
        }))
        .expect("node object");
        api.create(&PostParams::default(), &node)
            .await
            .expect("create node");
        let status =
            json!({ "status": { "addresses": [ { "type": "InternalIP", "address": ip } ] } });
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("set node addresses");
    }

    fn run_agent_once(ns: &Netns, kubeconfig: &std::path::Path, dir: &std::path::Path) -> String {
        let out = Command::new(AGENT)
            .args([
                "--once",
                "--node-name",
                "cnilab-a",
                "--cluster-cidr",
                "10.42.0.0/16",
            ])
            .arg("--netns")
            .arg(ns.path())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cni-conf-dir")
            .arg(dir.join("net.d"))
            .env("NO_COLOR", "1")
            .output()
            .expect("run agent");
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "agent failed:\n{log}");
        log
    }

    #[tokio::test]
    async fn agent_routes_nodes_created_through_the_api() {
        require_root();
        let conf_dir = tempfile::tempdir().expect("tempdir");
        let k3s = K3s::default()
            .with_conf_mount(conf_dir.path())
            .with_privileged(true)
            .with_userns_mode("host")
            .start()
            .await
            .expect("start k3s (needs a Docker engine)");
        let port = k3s
            .get_host_port_ipv4(KUBE_SECURE_PORT)
            .await
            .expect("API port");
        let yaml = k3s.image().read_kube_config().expect("k3s kubeconfig");
        let mut kubeconfig = Kubeconfig::from_yaml(&yaml).expect("parse kubeconfig");
        for cluster in &mut kubeconfig.clusters {
            if let Some(c) = cluster.cluster.as_mut() {
                c.server = Some(format!("https://127.0.0.1:{port}"));
            }
        }
        let work = tempfile::tempdir().expect("tempdir");
        // JSON is YAML: the agent reads it with --kubeconfig.
        let kubeconfig_path = work.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig_path,
            serde_json::to_vec(&kubeconfig).expect("json"),
        )
        .expect("write kubeconfig");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("client config");
        let client = kube::Client::try_from(config).expect("client");
        let nodes: Api<Node> = Api::all(client);

        create_node(&nodes, "cnilab-a", "192.168.77.1", "10.42.101.0/24").await;
        create_node(&nodes, "cnilab-b", "192.168.77.2", "10.42.102.0/24").await;
        create_node(&nodes, "cnilab-c", "192.168.77.3", "10.42.103.0/24").await;

        let ns = netns();
        ns.uplink("192.168.77.1/24", "fd00:77::1/64");
        // The k3s container is a real node too: make its InternalIP on-link in
        // the test namespace so the route to its podCIDR can be made.
        for node in nodes.list(&Default::default()).await.expect("list nodes") {
            for address in node.status.and_then(|s| s.addresses).unwrap_or_default() {
                if address.type_ == "InternalIP"
                    && address
                        .address
                        .parse::<IpAddr>()
                        .is_ok_and(|ip| ip.is_ipv4())
                    && !address.address.starts_with("192.168.77.")
                {
                    ns.ip(&[
                        "route",
                        "add",
                        &format!("{}/32", address.address),
                        "dev",
                        "up0",
                    ]);
                }
            }
        }

        run_agent_once(&ns, &kubeconfig_path, work.path());
        let routes = ns.own_routes();
        assert!(
            routes.contains(&"10.42.102.0/24 via 192.168.77.2 proto 199".to_string()),
            "{routes:?}"
        );
        assert!(
            routes.contains(&"10.42.103.0/24 via 192.168.77.3 proto 199".to_string()),
            "{routes:?}"
        );
        assert!(
            !routes.iter().any(|r| r.starts_with("10.42.101.0/24")),
            "never a route to our own podCIDR"
        );

        nodes
            .delete("cnilab-c", &DeleteParams::default())
            .await
            .expect("delete node");
        let log = run_agent_once(&ns, &kubeconfig_path, work.path());
        let routes = ns.own_routes();
        assert!(
            !routes.iter().any(|r| r.starts_with("10.42.103.0/24")),
            "{routes:?}\n{log}"
        );
        assert!(
            routes.contains(&"10.42.102.0/24 via 192.168.77.2 proto 199".to_string()),
            "{routes:?}"
        );
    }
}
