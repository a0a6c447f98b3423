//! `cnilab e2e kind|minikube --dry-run`: the complete command sequence of
//! every step, as lab/e2e-plan.md writes it and the workflows call it. The
//! binary runs at the repository root, like the workflows.

mod common;

use assert_cmd::Command;
use common::e2e::{dry_run, repo_root, run_dry, FLANNEL};
use serde_json::Value;

fn fails(args: &[&str]) -> String {
    let out = run_dry(args);
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `+ ` lines: external commands, in order.
fn commands(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("+ "))
        .map(str::to_string)
        .collect()
}

/// The content of `--- write <path>` blocks, by path.
fn writes(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(path) = line.strip_prefix("--- write ") {
            current = Some((path.to_string(), String::new()));
        } else if line == "--- end" {
            out.extend(current.take());
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

fn yaml(text: &str) -> Value {
    serde_norway::from_str(text).expect("YAML")
}

const KIND: &[&str] = &[
    "--name",
    "cnilab-ipv4",
    "--ip-family",
    "ipv4",
    "--k8s-version",
    "v1.36.1",
    "--image",
    "localhost/cnilab:e2e",
];
const W: &str = "target/cnilab-e2e/cnilab-ipv4";
const K: &str = "kubectl --kubeconfig target/cnilab-e2e/cnilab-ipv4/kubeconfig";

fn kind(step: &str, extra: &[&str]) -> String {
    let mut args = vec!["kind", step];
    args.extend_from_slice(KIND);
    args.extend_from_slice(extra);
    dry_run(&args)
}

#[test]
fn kind_create_writes_the_lab_config_and_pins_the_node_image() {
    let out = kind("create", &[]);
    assert_eq!(
        commands(&out),
        [format!(
            "kind create cluster --name cnilab-ipv4 --config {W}/kind-config.yaml --image kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b84759d1014dbd78f7ebd5 --kubeconfig {W}/kubeconfig --retain"
        )]
    );
    let files = writes(&out);
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].0, format!("{W}/kind-config.yaml"));
    let committed = std::fs::read_to_string(repo_root().join("lab/kind/ipv4.yaml"))
        .expect("lab/kind/ipv4.yaml");
    assert_eq!(yaml(&files[0].1), yaml(&committed));
    assert!(
        !out.contains("--wait"),
        "no --wait: nodes stay NotReady until deploy"
    );
}

#[test]
fn kind_configs_equal_the_committed_ones_for_every_family() {
    for family in ["ipv4", "ipv6", "dual"] {
        let out = dry_run(&["kind", "create", "--name", "c", "--ip-family", family]);
        let files = writes(&out);
        let committed =
            std::fs::read_to_string(repo_root().join(format!("lab/kind/{family}.yaml")))
                .expect("committed config");
        assert_eq!(yaml(&files[0].1), yaml(&committed), "{family}");
    }
    let three = writes(&dry_run(&[
        "kind",
        "create",
        "--name",
        "c",
        "--workers",
        "3",
    ]));
    assert_eq!(yaml(&three[0].1)["nodes"].as_array().map(Vec::len), Some(4));
}

#[test]
fn kind_node_image_follows_the_version_table() {
    // Each pin is the default image of a kind release, as its
    // pkg/apis/config/defaults/image.go writes it.
    let out = dry_run(&["kind", "create", "--name", "c", "--k8s-version", "1.35.0"]);
    assert!(out.contains("--image kindest/node:v1.35.0@sha256:452d707d4862f52530247495d180205e029056831160e22870e37e3f6c1ac31f"), "{out}");
    let default = dry_run(&["kind", "create", "--name", "c"]);
    assert!(default.contains("--image kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b84759d1014dbd78f7ebd5"), "{default}");
    // The digests kind's source does not show are gone.
    let err = fails(&["kind", "create", "--name", "c", "--k8s-version", "v1.37.0"]);
    assert!(
        err.contains("--node-image") && err.contains("v1.36.1 (kind v0.32.0)"),
        "{err}"
    );
    let err = fails(&["kind", "create", "--name", "c", "--k8s-version", "v1.29.0"]);
    assert!(err.contains("--node-image"), "{err}");
    let own = dry_run(&[
        "kind",
        "create",
        "--name",
        "c",
        "--k8s-version",
        "v1.29.0",
        "--node-image",
        "kindest/node:v1.29.0@sha256:abc",
    ]);
    assert!(own.contains("--image kindest/node:v1.29.0@sha256:abc"));
}

#[test]
fn kind_load_with_an_archive_then_checks_every_node() {
    let out = kind("load", &["--image-archive", "e2e-inputs/cnilab-image.tar"]);
    assert_eq!(
        commands(&out),
        [
            "kind load image-archive e2e-inputs/cnilab-image.tar --name cnilab-ipv4",
            "docker exec cnilab-ipv4-control-plane crictl inspecti -q localhost/cnilab:e2e",
            "docker exec cnilab-ipv4-worker crictl inspecti -q localhost/cnilab:e2e",
            "docker exec cnilab-ipv4-worker2 crictl inspecti -q localhost/cnilab:e2e",
        ]
    );
}

#[test]
fn kind_load_without_an_archive_builds_and_saves_first() {
    let cmds = commands(&kind("load", &[]));
    assert_eq!(
        cmds[..3],
        [
            "docker build --file lab/image/Dockerfile --tag localhost/cnilab:e2e .".to_string(),
            format!("docker save localhost/cnilab:e2e --output {W}/cnilab-image.tar"),
            format!("kind load image-archive {W}/cnilab-image.tar --name cnilab-ipv4"),
        ]
    );
    assert_eq!(cmds.len(), 6);
    assert!(
        !cmds.iter().any(|c| c.contains("load docker-image")),
        "docker-image breaks on Docker 29"
    );
}

#[test]
fn kind_deploy_renders_every_manifest_with_the_image_and_cidr() {
    let out = kind("deploy", &[]);
    let files = writes(&out);
    let manifests: Vec<String> = {
        let mut names: Vec<String> = std::fs::read_dir(repo_root().join("lab/manifests"))
            .expect("lab/manifests")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        files.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
        manifests
            .iter()
            .map(|n| format!("{W}/manifests/{n}"))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        commands(&out),
        manifests
            .iter()
            .map(|n| format!("{K} apply --filename {W}/manifests/{n}"))
            .collect::<Vec<_>>()
    );
    let all: String = files.iter().map(|(_, t)| t.as_str()).collect();
    assert!(
        !all.contains("ghcr.io/cnilab/cnilab:dev"),
        "placeholder left"
    );
    assert!(all.contains("image: localhost/cnilab:e2e"));
    assert!(all.contains("value: \"10.244.0.0/16\""));
    // Still valid YAML, with the DaemonSet's env set.
    for (path, text) in &files {
        for doc in serde_norway::Deserializer::from_str(text) {
            let v: Value =
                serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{path}: {e}"));
            if v["kind"] == "DaemonSet" {
                let env = &v["spec"]["template"]["spec"]["containers"][0]["env"];
                let cidr = env
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|e| e["name"] == "CNILAB_CLUSTER_CIDR");
                assert_eq!(
                    cidr.map(|e| e["value"].clone()),
                    Some(Value::from("10.244.0.0/16"))
                );
            }
        }
    }
}

#[test]
fn kind_dual_sets_both_families_everywhere() {
    let args = [
        "--name",
        "cnilab-dual",
        "--ip-family",
        "dual",
        "--k8s-version",
        "v1.35.0",
    ];
    let create = dry_run(&[&["kind", "create"][..], &args[..]].concat());
    let config = yaml(&writes(&create)[0].1);
    assert_eq!(
        config["networking"]["podSubnet"],
        "10.244.0.0/16,fd00:10:244::/56"
    );
    assert_eq!(
        config["networking"]["serviceSubnet"],
        "10.96.0.0/16,fd00:10:96::/112"
    );
    let deploy = dry_run(&[&["kind", "deploy"][..], &args[..]].concat());
    assert!(
        deploy.contains("value: \"10.244.0.0/16,fd00:10:244::/56\""),
        "dual CNILAB_CLUSTER_CIDR"
    );
    let check = dry_run(&[&["kind", "check"][..], &args[..]].concat());
    assert!(check.contains("# cnilab e2e check --kubeconfig target/cnilab-e2e/cnilab-dual/kubeconfig --ip-family dual --junit target/cnilab-reports/e2e-kind-cnilab-dual/junit.xml --report target/cnilab-reports/e2e-kind-cnilab-dual/report.html"), "{check}");
    assert!(check.contains("\"ipFamilyPolicy\": \"PreferDualStack\""));
    assert!(check.contains("IPv4 and IPv6"));
}

#[test]
fn kind_wait_gates_in_order() {
    assert_eq!(
        commands(&kind("wait", &[])),
        [
            format!("{K} --namespace kube-system rollout status daemonset/cnilab-agent --timeout=180s"),
            format!("{K} wait --for=condition=Ready nodes --all --timeout=180s"),
            format!("{K} --namespace kube-system wait --for=condition=Ready pods --selector=k8s-app=kube-dns --timeout=180s"),
        ]
    );
    assert!(commands(&kind("wait", &["--timeout", "5m"]))[0].ends_with("--timeout=300s"));
}

#[test]
fn kind_check_runs_in_process_and_lists_its_objects() {
    let out = kind("check", &[]);
    assert!(
        commands(&out).is_empty(),
        "the check runs no external command"
    );
    assert!(out.starts_with(&format!(
        "# cnilab e2e check --kubeconfig {W}/kubeconfig --ip-family ipv4 --junit target/cnilab-reports/e2e-kind-cnilab-ipv4/junit.xml --report target/cnilab-reports/e2e-kind-cnilab-ipv4/report.html\n"
    )));
    let objects = writes(&out);
    assert_eq!(
        objects.len(),
        1 + 9 + 4,
        "namespace, 2 pods + 1 host pod on 3 nodes, 4 services"
    );
    assert!(out.contains("\"nodeName\": \"cnilab-ipv4-worker2\""));
}

#[test]
fn kind_dump_collects_everything() {
    let out = kind("dump", &["--out", "diag/"]);
    let d = "diag";
    let mut expected = vec![
        format!("{K} get nodes -o wide > {d}/nodes.txt"),
        format!("{K} get nodes -o yaml > {d}/nodes.yaml"),
        format!("{K} get pods --all-namespaces -o wide > {d}/pods.txt"),
        format!("{K} get events --all-namespaces --sort-by=.lastTimestamp > {d}/events.txt"),
        format!("{K} --namespace kube-system describe daemonset cnilab-agent > {d}/workloads/kube-system.cnilab-agent/describe.txt"),
        format!("{K} --namespace kube-system describe pods --selector=app.kubernetes.io/name=cnilab-agent > {d}/workloads/kube-system.cnilab-agent/pods.txt"),
        format!("{K} --namespace kube-system get pods --selector=app.kubernetes.io/name=cnilab-agent -o name"),
        format!("{K} --namespace kube-system logs <pod> --all-containers --timestamps > {d}/workloads/kube-system.cnilab-agent/<pod>.log"),
        format!("{K} --namespace kube-system logs <pod> --all-containers --timestamps --previous > {d}/workloads/kube-system.cnilab-agent/<pod>.previous.log"),
        format!("{K} --namespace kube-system describe pods --selector=k8s-app=kube-dns > {d}/coredns.txt"),
        "kind get nodes --name cnilab-ipv4".to_string(),
    ];
    for n in [
        "cnilab-ipv4-control-plane",
        "cnilab-ipv4-worker",
        "cnilab-ipv4-worker2",
    ] {
        let f = |name: &str| format!("{d}/nodes/{n}/{name}");
        expected.extend([
            format!("docker exec {n} ip -details address show > {}", f("addresses.txt")),
            format!("docker exec {n} ip -4 route show table all > {}", f("routes4.txt")),
            format!("docker exec {n} ip -6 route show table all > {}", f("routes6.txt")),
            format!("docker exec {n} ip rule show > {}", f("rules.txt")),
            format!("docker exec {n} nft list ruleset > {}", f("nft.txt")),
            format!("docker exec {n} iptables-save > {}", f("iptables.txt")),
            format!("docker exec {n} sysctl -e net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv4.conf.all.rp_filter net.ipv4.conf.default.rp_filter net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables > {}", f("sysctls.txt")),
            format!("docker exec {n} ls -l /etc/cni/net.d /opt/cni/bin > {}", f("cni-files.txt")),
            format!("docker exec {n} sh -c 'for f in /etc/cni/net.d/*; do echo \"== $f\"; cat \"$f\"; done' > {}", f("cni-config.txt")),
            format!("docker exec {n} crictl pods > {}", f("crictl-pods.txt")),
        ]);
    }
    expected.push(format!("kind export logs {d}/kind-logs --name cnilab-ipv4"));
    assert_eq!(commands(&out), expected);
}

#[test]
fn kind_delete() {
    assert_eq!(
        commands(&kind("delete", &[])),
        [format!(
            "kind delete cluster --name cnilab-ipv4 --kubeconfig {W}/kubeconfig"
        )]
    );
}

#[test]
fn full_run_order_dump_on_failure_and_keep() {
    let out = kind("all", &["--image-archive", "e2e-inputs/cnilab-image.tar"]);
    let cmds = commands(&out);
    let pos = |needle: &str| {
        cmds.iter()
            .position(|c| c.contains(needle))
            .unwrap_or_else(|| panic!("{needle} in {cmds:#?}"))
    };
    assert!(pos("kind create cluster") < pos("kind load image-archive"));
    assert!(pos("kind load image-archive") < pos(" apply --filename"));
    assert!(pos(" apply --filename") < pos("rollout status"));
    assert!(pos("rollout status") < pos("get nodes -o wide"));
    assert!(
        out.find("# cnilab e2e check").unwrap_or(usize::MAX)
            < out.find("# if a step above failed:").unwrap_or(0)
    );
    assert_eq!(
        cmds.last().map(String::as_str),
        Some(
            format!("kind delete cluster --name cnilab-ipv4 --kubeconfig {W}/kubeconfig").as_str()
        )
    );
    let kept = commands(&kind("all", &["--keep"]));
    assert!(!kept.iter().any(|c| c.starts_with("kind delete")));
    // Without a step, the same as `all`.
    let mut args = vec!["kind"];
    args.extend_from_slice(KIND);
    args.extend(["--image-archive", "e2e-inputs/cnilab-image.tar"]);
    assert_eq!(dry_run(&args), out);
}

#[test]
fn dry_run_writes_nothing() {
    let name = format!("dry-{}", std::process::id());
    for step in ["create", "load", "deploy", "check", "dump", "all"] {
        dry_run(&["kind", step, "--name", &name]);
        dry_run(&["minikube", step, "--name", &name]);
    }
    assert!(!repo_root().join("target/cnilab-e2e").join(&name).exists());
    assert!(!repo_root()
        .join("target/cnilab-reports")
        .join(format!("e2e-kind-{name}"))
        .exists());
}

const MK: &str = "KUBECONFIG=target/cnilab-e2e/cnilab-minikube/kubeconfig minikube";
const MK_ARGS: &[&str] = &[
    "--name",
    "cnilab-minikube",
    "--k8s-version",
    "v1.35.1",
    "--image",
    "localhost/cnilab:e2e",
];

fn minikube(step: &str, extra: &[&str]) -> String {
    let mut args = vec!["minikube", step];
    args.extend_from_slice(MK_ARGS);
    args.extend_from_slice(extra);
    dry_run(&args)
}

#[test]
fn minikube_steps() {
    // The manifests go in as `--cni=FILE`: minikube v1.38.1 refuses
    // `--cni=false` with containerd unless --force (validateCNI).
    let create = minikube("create", &[]);
    assert_eq!(
        commands(&create),
        [format!("{MK} start --profile cnilab-minikube --nodes 2 --cni=target/cnilab-e2e/cnilab-minikube/cni.yaml --driver=docker --container-runtime=containerd --kubernetes-version=v1.35.1 --extra-config=kubeadm.pod-network-cidr=10.244.0.0/16 --service-cluster-ip-range=10.96.0.0/16 --wait=apiserver")]
    );
    assert!(!create.contains("--cni=false") && !create.contains("--force"));
    let files = writes(&create);
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].0, "target/cnilab-e2e/cnilab-minikube/cni.yaml");
    let docs: Vec<Value> = serde_norway::Deserializer::from_str(&files[0].1)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect();
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the agent DaemonSet in cni.yaml");
    assert_eq!(ds["metadata"]["name"], "cnilab-agent");
    assert!(files[0].1.contains("image: localhost/cnilab:e2e"));
    assert!(!files[0].1.contains("ghcr.io/cnilab/cnilab:dev"));
    assert_eq!(
        commands(&minikube("load", &["--image-archive", "e2e-inputs/cnilab-image.tar"])),
        [
            format!("{MK} --profile cnilab-minikube image load e2e-inputs/cnilab-image.tar"),
            format!("{MK} --profile cnilab-minikube ssh --node cnilab-minikube -- sudo crictl inspecti -q localhost/cnilab:e2e"),
            format!("{MK} --profile cnilab-minikube ssh --node cnilab-minikube-m02 -- sudo crictl inspecti -q localhost/cnilab:e2e"),
        ]
    );
    let mk_k = "kubectl --kubeconfig target/cnilab-e2e/cnilab-minikube/kubeconfig";
    // `start` applied the manifests before the image was loaded: deploy
    // re-applies them and restarts what runs the image.
    assert_eq!(
        commands(&minikube("deploy", &[])),
        [
            format!(
                "{mk_k} apply --filename target/cnilab-e2e/cnilab-minikube/manifests/cnilab.yaml"
            ),
            format!("{mk_k} --namespace kube-system rollout restart daemonset/cnilab-agent"),
        ]
    );
    let wait = commands(&minikube("wait", &[]));
    assert_eq!(wait.len(), 5);
    assert_eq!(wait[0], format!("{MK} --profile cnilab-minikube ssh --node cnilab-minikube -- sudo sed -n -e /conf_dir/p -e /confDir/p /etc/containerd/config.toml"));
    assert_eq!(wait[1], format!("{MK} --profile cnilab-minikube ssh --node cnilab-minikube-m02 -- sudo sed -n -e /conf_dir/p -e /confDir/p /etc/containerd/config.toml"));
    assert_eq!(
        wait[2],
        format!(
            "{mk_k} --namespace kube-system rollout status daemonset/cnilab-agent --timeout=180s"
        )
    );
    let check = minikube("check", &[]);
    assert!(check.starts_with("# cnilab e2e check --kubeconfig target/cnilab-e2e/cnilab-minikube/kubeconfig --ip-family ipv4 --junit target/cnilab-reports/e2e-minikube-cnilab-minikube/junit.xml --report target/cnilab-reports/e2e-minikube-cnilab-minikube/report.html\n"));
    assert!(check.contains("\"nodeName\": \"cnilab-minikube-m02\""));
    let dump = commands(&minikube("dump", &["--out", "diag/"]));
    assert!(dump.contains(&format!("{MK} --profile cnilab-minikube node list")));
    assert!(dump.contains(&format!("{MK} --profile cnilab-minikube ssh --node cnilab-minikube-m02 -- sudo ip -4 route show table all > diag/nodes/cnilab-minikube-m02/routes4.txt")));
    assert!(dump.contains(&format!("{MK} --profile cnilab-minikube ssh --node cnilab-minikube -- sudo ls -l /etc/cni/net.d /opt/cni/bin /etc/cni/net.mk > diag/nodes/cnilab-minikube/cni-files.txt")));
    assert_eq!(
        dump.last(),
        Some(&format!(
            "{MK} --profile cnilab-minikube logs --file diag/minikube-logs.txt"
        ))
    );
    assert_eq!(dump.len(), 10 + 1 + 2 * 10 + 1);
    assert_eq!(
        commands(&minikube("delete", &[])),
        [format!("{MK} delete --profile cnilab-minikube")]
    );
}

#[test]
fn minikube_workers_and_families() {
    let out = dry_run(&["minikube", "create", "--name", "m", "--workers", "2"]);
    assert!(out.contains(" --nodes 3 "), "{out}");
    let err = fails(&["minikube", "create", "--name", "m", "--ip-family", "dual"]);
    assert!(err.contains("IPv4 only"), "{err}");
}

#[test]
fn bad_names_are_refused() {
    let err = fails(&["kind", "create", "--name", "../../etc"]);
    assert!(err.contains("--name"), "{err}");
}

#[test]
fn check_dry_run_for_any_cluster() {
    let out = dry_run(&[
        "check",
        "--kubeconfig",
        "/etc/kubernetes/admin.conf",
        "--image",
        "example.org/agnhost:1",
    ]);
    assert!(out.starts_with("# cnilab e2e check --kubeconfig /etc/kubernetes/admin.conf --ip-family ipv4 --image example.org/agnhost:1\n"), "{out}");
    assert!(out.contains("example.org/agnhost:1"));
}

/// Every `cnilab e2e` invocation in the workflows parses and plans.
#[test]
fn every_workflow_invocation_is_accepted() {
    let vars = [
        ("$CLUSTER", "cnilab-dual"),
        ("$IP_FAMILY", "dual"),
        ("$K8S_VERSION", "v1.35.0"),
        ("$IMAGE", "localhost/cnilab:e2e"),
    ];
    let mut seen = 0;
    for workflow in ["e2e-kind.yml", "e2e-minikube.yml"] {
        let path = repo_root().join(".github/workflows").join(workflow);
        let doc = yaml(&std::fs::read_to_string(&path).expect("workflow"));
        let jobs = doc["jobs"].as_object().expect("jobs");
        for job in jobs.values() {
            for step in job["steps"].as_array().into_iter().flatten() {
                let Some(run) = step["run"].as_str() else {
                    continue;
                };
                let Some(cmd) = run.trim().strip_prefix("cnilab e2e ") else {
                    continue;
                };
                // The fallback after `||` is for a missing cnilab.
                let cmd = cmd.split("||").next().unwrap_or_default();
                let mut line = cmd.replace('"', "");
                for (k, v) in vars {
                    line = line.replace(k, v);
                }
                let args: Vec<&str> = line.split_whitespace().collect();
                if workflow == "e2e-minikube.yml" {
                    assert!(!args.contains(&"--ip-family"), "{line}");
                }
                dry_run(&args);
                seen += 1;
            }
        }
    }
    assert!(seen >= 14, "found {seen} invocations");
}

fn temp_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).expect("write");
    p.to_string_lossy().into_owned()
}

#[test]
fn kind_takes_the_users_own_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let own = temp_file(
        &dir,
        "own.yaml",
        "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnetworking:\n  ipFamily: dual\n  disableDefaultCNI: true\n  kubeProxyMode: nftables\n  podSubnet: 10.100.0.0/16,fd00:100::/56\nnodes:\n- role: control-plane\n- role: control-plane\n- role: worker\n",
    );
    let create = dry_run(&["kind", "create", "--name", "own", "--config", &own]);
    assert!(
        writes(&create).is_empty(),
        "kind reads the user's file itself"
    );
    assert_eq!(
        commands(&create),
        [format!("kind create cluster --name own --config {own} --image kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b84759d1014dbd78f7ebd5 --kubeconfig target/cnilab-e2e/own/kubeconfig --retain")]
    );
    // Node names, family and pod subnet come from the config.
    let load = commands(&dry_run(&[
        "kind",
        "load",
        "--name",
        "own",
        "--config",
        &own,
        "--image-archive",
        "x.tar",
    ]));
    let nodes: Vec<&str> = load
        .iter()
        .filter_map(|c| c.strip_prefix("docker exec "))
        .filter_map(|c| c.split_whitespace().next())
        .collect();
    assert_eq!(
        nodes,
        ["own-control-plane", "own-control-plane2", "own-worker"]
    );
    let deploy = dry_run(&["kind", "deploy", "--name", "own", "--config", &own]);
    assert!(
        deploy.contains("value: \"10.100.0.0/16,fd00:100::/56\""),
        "{deploy}"
    );
    let check = dry_run(&["kind", "check", "--name", "own", "--config", &own]);
    assert!(check.contains("--ip-family dual"), "{check}");
    assert!(check.contains("\"nodeName\": \"own-control-plane2\""));
}

#[test]
fn own_config_conflicts_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let head = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n";
    let dual = temp_file(
        &dir,
        "dual.yaml",
        &format!("{head}networking:\n  ipFamily: dual\n  disableDefaultCNI: true\n"),
    );
    let err = fails(&["kind", "create", "--config", &dual, "--ip-family", "ipv4"]);
    assert!(
        err.contains("--ip-family ipv4") && err.contains("dual"),
        "{err}"
    );
    let err = fails(&["kind", "create", "--config", &dual, "--workers", "3"]);
    assert!(
        err.contains("--workers 3") && err.contains("0 workers"),
        "{err}"
    );
    let err = fails(&["minikube", "create", "--config", &dual]);
    assert!(err.contains("only `cnilab e2e kind`"), "{err}");
    let kindnet = temp_file(
        &dir,
        "kindnet.yaml",
        &format!("{head}nodes:\n- role: control-plane\n"),
    );
    let err = fails(&["kind", "create", "--config", &kindnet]);
    assert!(err.contains("disableDefaultCNI"), "{err}");
    let missing = dir.path().join("missing.yaml");
    let err = fails(&["kind", "create", "--config", &missing.to_string_lossy()]);
    assert!(err.contains("cannot read the kind config"), "{err}");
}

#[test]
fn any_cni_is_deployed_and_waited_for() {
    let dir = tempfile::tempdir().expect("temp dir");
    let flannel = temp_file(&dir, "kube-flannel.yml", FLANNEL);
    let args = |step: &'static str| -> Vec<String> {
        [
            "kind",
            step,
            "--name",
            "fl",
            "--cni-manifest",
            flannel.as_str(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let run = |step: &'static str, extra: &[&str]| {
        let mut a = args(step);
        a.extend(extra.iter().map(|s| s.to_string()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        dry_run(&a)
    };
    let k = "kubectl --kubeconfig target/cnilab-e2e/fl/kubeconfig";
    let deploy = run("deploy", &[]);
    let files = writes(&deploy);
    assert_eq!(files.len(), 1);
    assert_eq!(
        files[0],
        (
            "target/cnilab-e2e/fl/manifests/kube-flannel.yml".to_string(),
            FLANNEL.to_string()
        )
    );
    assert_eq!(
        commands(&deploy),
        [format!(
            "{k} apply --filename target/cnilab-e2e/fl/manifests/kube-flannel.yml"
        )]
    );
    let wait = commands(&run("wait", &[]));
    assert_eq!(
        wait[0],
        format!(
            "{k} --namespace kube-flannel rollout status daemonset/kube-flannel-ds --timeout=180s"
        )
    );
    assert!(
        !wait.iter().any(|c| c.contains("cnilab-agent")),
        "{wait:#?}"
    );
    assert_eq!(wait.len(), 3);
    // Nothing runs the cnilab image: nothing to build or load, unless an
    // archive is given (your own CNI's image).
    let load = run("load", &[]);
    assert!(commands(&load).is_empty(), "{load}");
    assert!(load.contains("nothing to load"));
    assert!(commands(&run("load", &["--image-archive", "own.tar"]))[0]
        .starts_with("kind load image-archive own.tar"));
    let dump = commands(&run("dump", &["--out", "d"]));
    assert!(dump.contains(&format!("{k} --namespace kube-flannel describe daemonset kube-flannel-ds > d/workloads/kube-flannel.kube-flannel-ds/describe.txt")), "{dump:#?}");
    // Several files, in the order given; two with one name are refused.
    let other = temp_file(
        &dir,
        "b.yaml",
        &FLANNEL.replace("kube-flannel-ds", "second"),
    );
    let both = commands(&dry_run(&[
        "kind",
        "wait",
        "--name",
        "fl",
        "--cni-manifest",
        &flannel,
        "--cni-manifest",
        &other,
    ]));
    assert!(
        both[0].contains("daemonset/kube-flannel-ds") && both[1].contains("daemonset/second"),
        "{both:#?}"
    );
    let err = fails(&[
        "kind",
        "deploy",
        "--cni-manifest",
        &flannel,
        "--cni-manifest",
        &flannel,
    ]);
    assert!(
        err.contains("two files are named kube-flannel.yml"),
        "{err}"
    );
    // minikube: the same file is its --cni, and nothing needs a restart.
    let mk = dry_run(&[
        "minikube",
        "create",
        "--name",
        "fl",
        "--cni-manifest",
        &flannel,
    ]);
    assert!(writes(&mk)[0].1.contains("name: kube-flannel-ds"));
    let mk_deploy = commands(&dry_run(&[
        "minikube",
        "deploy",
        "--name",
        "fl",
        "--cni-manifest",
        &flannel,
    ]));
    assert!(
        !mk_deploy.iter().any(|c| c.contains("rollout restart")),
        "{mk_deploy:#?}"
    );
}

#[test]
fn check_finds_the_cluster_as_kubectl_does() {
    let out = dry_run(&["check"]);
    assert!(
        out.starts_with("# cnilab e2e check --ip-family ipv4\n"),
        "{out}"
    );
    let out = dry_run(&["check", "--context", "kind-x"]);
    assert!(
        out.starts_with("# cnilab e2e check --context kind-x --ip-family ipv4\n"),
        "{out}"
    );
}

/// `cnilab e2e check` (not a dry run) reads the kubeconfig as kubectl
/// does; the cluster here is a closed port, so the run stops at the first
/// API call, after saying which context of which files it used.
#[test]
fn check_reads_kubeconfig_like_kubectl() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = |current: Option<&str>, name: &str| {
        format!(
            "apiVersion: v1\nkind: Config\n{}clusters:\n- name: {name}\n  cluster:\n    server: https://127.0.0.1:9\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n",
            current.map(|c| format!("current-context: {c}\n")).unwrap_or_default()
        )
    };
    let a = temp_file(&dir, "a.yaml", &config(None, "ctx-a"));
    let b = temp_file(&dir, "b.yaml", &config(Some("ctx-b"), "ctx-b"));
    let missing = dir
        .path()
        .join("missing.yaml")
        .to_string_lossy()
        .into_owned();
    let run = |kubeconfig: &str, extra: &[&str]| {
        Command::cargo_bin("cnilab")
            .expect("cnilab binary")
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", dir.path())
            .args(["e2e", "check", "--timeout", "5s"])
            .args(extra)
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .expect("runs")
    };
    // a sets no current-context; b's wins; the missing file is skipped.
    let out = run(&format!("{missing}:{a}:{b}"), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("context ctx-b (from {a}:{b})")),
        "{err}"
    );
    assert!(!out.status.success());
    let out = run(&format!("{a}:{b}"), &["--context", "ctx-a"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("context ctx-a (from "), "{err}");
    let out = run(&format!("{a}:{b}"), &["--context", "nope"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("\"nope\"") && err.contains("ctx-a, ctx-b"),
        "{err}"
    );
    let out = run(&missing, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("none of them exists"), "{err}");
    // Unset KUBECONFIG and no ~/.kube/config: a clear error.
    let out = Command::cargo_bin("cnilab")
        .expect("cnilab binary")
        .env_remove("KUBECONFIG")
        .env("HOME", dir.path())
        .args(["e2e", "check"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(".kube/config") && err.contains("does not exist"),
        "{err}"
    );
}

/// The example own config in lab/kind/examples is accepted and planned.
#[test]
fn the_example_own_kind_config_plans() {
    let example = "lab/kind/examples/kube-proxy-nftables.yaml";
    let out = dry_run(&["kind", "--name", "nft", "--config", example]);
    assert!(
        commands(&out)[0].starts_with(&format!(
            "kind create cluster --name nft --config {example} "
        )),
        "{out}"
    );
    assert!(out.contains("\"nodeName\": \"nft-worker3\""), "{out}");
}

#[test]
fn minikube_refuses_kind_only_flags() {
    for (flag, value) in [
        ("--config", "lab/kind/ipv4.yaml"),
        ("--node-image", "kindest/node:v1"),
    ] {
        let out = run_dry(&["minikube", "create", flag, value]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains(flag) && err.contains("only `cnilab e2e kind` takes it"),
            "{err}"
        );
    }
}
