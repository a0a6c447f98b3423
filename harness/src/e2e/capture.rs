//! `cnilab e2e capture`: `cnilab capture` run on every node of a cluster,
//! the files collected into one directory, to replay on another machine
//! (`cnilab lab up --capture DIR/*.json`, then `lab check`).
//!
//! Three ways onto a node, each a plan (`plan::Plan`) that `--dry-run`
//! prints and `harness/tests/e2e_flags.rs` checks against the tools' flag
//! tables like the other e2e plans:
//! - **kind**: nodes are containers: `docker cp` the cnilab binary in,
//!   `docker exec` the capture (the node's own network namespace, its
//!   pods, its containerd for pod names), `docker cp` the file out;
//! - **minikube**: `minikube cp` in, `minikube ssh -- sudo` the capture,
//!   `minikube cp` out;
//! - **pod** (any cluster, through `kubectl`): one privileged pod per node
//!   (hostNetwork, hostPID, the node's `/` at `/host`), `kubectl cp` the
//!   binary into the node's `/var/tmp`, `kubectl exec` the capture under
//!   `chroot /host` (the node's own `nft`, `iptables`, `/run/netns`, CRI
//!   socket), `kubectl cp` the file out, the pod deleted.
//!
//! Each node's file is `DIR/<node>.json` (the capture's node name is the
//! Kubernetes node name); the binary and the file are removed from the
//! node afterwards. `DIR/README.txt` says how to replay them.

use super::options::{E2eOptions, Provider};
use super::plan::{Action, Cmd, Plan};
use super::E2eError;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SHORT: Duration = Duration::from_secs(60);
/// A capture of a node with many pods, copied over a slow link.
const CAPTURE: Duration = Duration::from_secs(300);

/// Where the binary and the file live on a node while it is captured.
const NODE_BIN: &str = "/var/tmp/cnilab";
const NODE_FILE: &str = "/var/tmp/cnilab-capture.json";

/// The image of the pod that reaches a node (`pod`): any image with
/// `sleep` and the `tar` that `kubectl cp` needs.
pub const DEFAULT_POD_IMAGE: &str = "busybox:1.37";

/// How `e2e capture` reaches the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    /// A kind cluster's node containers (`docker`).
    Kind,
    /// A minikube cluster's nodes (`minikube ssh`/`cp`).
    Minikube,
    /// Any cluster: a privileged hostNetwork pod per node (`kubectl`).
    Pod,
}

#[derive(Clone, Debug)]
pub struct CaptureOptions {
    pub via: Via,
    /// kind/minikube: the cluster (name, workers for the dry run's node
    /// names, kubeconfig). `pod`: only `name`, for the work directory.
    pub cluster: E2eOptions,
    /// `pod`: the kubeconfig and context (default: as kubectl finds them).
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: String,
    pub pod_image: String,
    /// The cnilab binary copied onto each node.
    pub binary: PathBuf,
    pub out: PathBuf,
}

impl CaptureOptions {
    pub fn validate(&self) -> Result<(), E2eError> {
        self.cluster.validate()?;
        super::check_namespace(&self.namespace)?;
        if self.via != Via::Pod && (self.kubeconfig.is_some() || self.context.is_some()) {
            return Err(E2eError::Invalid(
                "--kubeconfig and --context choose the cluster of `e2e capture pod`; kind and minikube use the cluster named by --name".into(),
            ));
        }
        Ok(())
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `cnilab capture` as run on a node (the binary at `NODE_BIN`).
fn capture_args(node: &str) -> Vec<String> {
    [NODE_BIN, "capture", "--node-name", node, "-o", NODE_FILE]
        .map(String::from)
        .to_vec()
}

fn kubectl(o: &CaptureOptions) -> Cmd {
    let mut cmd = Cmd::new("kubectl");
    if let Some(k) = &o.kubeconfig {
        cmd = cmd.args(["--kubeconfig".to_string(), path(k)]);
    }
    if let Some(c) = &o.context {
        cmd = cmd.args(["--context", c.as_str()]);
    }
    cmd
}

fn minikube(o: &CaptureOptions) -> Cmd {
    Cmd::new("minikube")
        .env("KUBECONFIG", path(&o.cluster.kubeconfig()))
        .args(["--profile", o.cluster.name.as_str()])
}

/// The pod that reaches `node` (`pod`).
fn pod_manifest(o: &CaptureOptions, node: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: cnilab-capture-{node}
  namespace: {ns}
  labels:
    app.kubernetes.io/name: cnilab-capture
spec:
  nodeName: {node}
  hostNetwork: true
  hostPID: true
  restartPolicy: Never
  tolerations:
  - operator: Exists
  containers:
  - name: capture
    image: {image}
    command: [\"sleep\", \"3600\"]
    securityContext:
      privileged: true
    volumeMounts:
    - name: host
      mountPath: /host
  volumes:
  - name: host
    hostPath:
      path: /
",
        ns = o.namespace,
        image = o.pod_image,
    )
}

/// The commands for one node (`<node>` filled in at run time).
fn per_node(o: &CaptureOptions) -> Vec<Action> {
    let node = "<node>";
    let file = path(&o.out.join(format!("{node}.json")));
    let bin = path(&o.binary);
    let run = |cmd: Cmd, t| Action::run(cmd, t);
    match o.via {
        Via::Kind => {
            let exec = || Cmd::new("docker").args(["exec", node]);
            vec![
                run(
                    Cmd::new("docker").args(["cp".to_string(), bin, format!("{node}:{NODE_BIN}")]),
                    SHORT,
                ),
                run(exec().args(capture_args(node)), CAPTURE),
                run(
                    Cmd::new("docker").args([
                        "cp".to_string(),
                        format!("{node}:{NODE_FILE}"),
                        file,
                    ]),
                    SHORT,
                ),
                run(exec().args(["rm", "-f", NODE_BIN, NODE_FILE]), SHORT),
            ]
        }
        Via::Minikube => {
            let ssh = || minikube(o).args(["ssh", "--node", node, "--", "sudo"]);
            vec![
                run(
                    minikube(o).args(["cp".to_string(), bin, format!("{node}:{NODE_BIN}")]),
                    SHORT,
                ),
                // minikube cp writes mode 0644.
                run(ssh().args(["chmod", "0755", NODE_BIN]), SHORT),
                run(ssh().args(capture_args(node)), CAPTURE),
                run(
                    minikube(o).args(["cp".to_string(), format!("{node}:{NODE_FILE}"), file]),
                    SHORT,
                ),
                run(ssh().args(["rm", "-f", NODE_BIN, NODE_FILE]), SHORT),
            ]
        }
        Via::Pod => {
            let pod = format!("cnilab-capture-{node}");
            let ns = o.namespace.as_str();
            let manifest = o
                .cluster
                .work_dir()
                .join(format!("capture-pods/{node}.yaml"));
            let in_pod = |p: &str| format!("{ns}/{pod}:/host{p}");
            let exec = || {
                kubectl(o).args([
                    "--namespace",
                    ns,
                    "exec",
                    pod.as_str(),
                    "--",
                    "chroot",
                    "/host",
                ])
            };
            vec![
                Action::Write {
                    path: manifest.clone(),
                    content: pod_manifest(o, node),
                },
                run(kubectl(o).args(["apply", "-f", &path(&manifest)]), SHORT),
                run(
                    kubectl(o).args([
                        "--namespace",
                        ns,
                        "wait",
                        "--for",
                        "condition=Ready",
                        &format!("pod/{pod}"),
                        "--timeout",
                        &format!("{}s", o.cluster.timeout.as_secs()),
                    ]),
                    o.cluster.timeout + SHORT,
                ),
                run(
                    kubectl(o).args(["cp".to_string(), bin, in_pod(NODE_BIN)]),
                    SHORT,
                ),
                run(exec().args(capture_args(node)), CAPTURE),
                run(
                    kubectl(o).args(["cp".to_string(), in_pod(NODE_FILE), file]),
                    SHORT,
                ),
                run(exec().args(["rm", "-f", NODE_BIN, NODE_FILE]), SHORT),
                run(
                    kubectl(o).args([
                        "--namespace",
                        ns,
                        "delete",
                        "pod",
                        pod.as_str(),
                        "--ignore-not-found",
                        "--timeout",
                        "60s",
                    ]),
                    SHORT + SHORT,
                ),
            ]
        }
    }
}

/// How to replay what was collected (`DIR/README.txt`).
fn readme(o: &CaptureOptions) -> String {
    let files = path(&o.out.join("*.json"));
    format!(
        "One cnilab capture per node of the {via} cluster {name} (cnilab e2e capture).\n\
         Replay and check them on any Linux machine, as root:\n\
         \n  cnilab lab up --name replay --capture {files}\n  cnilab lab check --name replay\n  cnilab lab down --name replay\n",
        via = match o.via {
            Via::Kind => "kind",
            Via::Minikube => "minikube",
            Via::Pod => "Kubernetes",
        },
        name = o.cluster.name,
    )
}

/// The whole plan.
pub fn plan(o: &CaptureOptions) -> Plan {
    let mut plan = Plan::default();
    let (tools, list, predicted) = match o.via {
        Via::Kind => (
            vec!["kind", "docker"],
            Cmd::new("kind").args(["get", "nodes", "--name", o.cluster.name.as_str()]),
            Some(o.cluster.predicted_nodes()),
        ),
        Via::Minikube => (
            vec!["minikube"],
            minikube(o).args(["node", "list"]),
            Some(o.cluster.predicted_nodes()),
        ),
        Via::Pod => (
            vec!["kubectl"],
            kubectl(o).args(["get", "nodes", "-o", "name"]),
            None,
        ),
    };
    plan.push(Action::Preflight {
        tools: tools.into_iter().map(String::from).collect(),
        sysctls: Vec::new(),
    });
    plan.push(Action::RequireFile {
        path: o.binary.clone(),
        why: "the cnilab binary to copy onto each node is missing; give --binary FILE (a cnilab built for the nodes' architecture)".into(),
    });
    plan.push(Action::Write {
        path: o.out.join("README.txt"),
        content: readme(o),
    });
    plan.push(Action::ForEach {
        list,
        placeholder: "<node>".into(),
        predicted,
        body: per_node(o),
    });
    plan.push(Action::Note(format!(
        "replay: cnilab lab up --capture {}, then cnilab lab check",
        path(&o.out.join("*.json"))
    )));
    plan
}

/// Provider of the cluster options for `via`.
pub fn provider(via: Via) -> Provider {
    match via {
        Via::Minikube => Provider::Minikube,
        Via::Kind | Via::Pod => Provider::Kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(via: Via) -> CaptureOptions {
        CaptureOptions {
            via,
            cluster: E2eOptions::new(provider(via), "c"),
            kubeconfig: None,
            context: None,
            namespace: "kube-system".into(),
            pod_image: DEFAULT_POD_IMAGE.into(),
            binary: PathBuf::from("bin/cnilab"),
            out: PathBuf::from("caps"),
        }
    }

    #[test]
    fn kind_copies_in_captures_and_copies_out_on_every_node() {
        let text = plan(&opts(Via::Kind)).dry_run();
        for node in ["c-control-plane", "c-worker", "c-worker2"] {
            for line in [
                format!("+ docker cp bin/cnilab {node}:/var/tmp/cnilab"),
                format!("+ docker exec {node} /var/tmp/cnilab capture --node-name {node} -o /var/tmp/cnilab-capture.json"),
                format!("+ docker cp {node}:/var/tmp/cnilab-capture.json caps/{node}.json"),
                format!("+ docker exec {node} rm -f /var/tmp/cnilab /var/tmp/cnilab-capture.json"),
            ] {
                assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
            }
        }
        assert!(
            text.starts_with("# preflight: kind, docker on PATH"),
            "{text}"
        );
        assert!(text.contains("+ kind get nodes --name c\n"), "{text}");
        assert!(text.contains("--- write caps/README.txt\n"), "{text}");
        assert!(
            text.contains("cnilab lab up --name replay --capture caps/*.json"),
            "{text}"
        );
    }

    #[test]
    fn minikube_and_pod_reach_each_node_their_way() {
        let mk = plan(&opts(Via::Minikube)).dry_run();
        for line in [
            "+ KUBECONFIG=target/cnilab-e2e/c/kubeconfig minikube --profile c cp bin/cnilab c-m02:/var/tmp/cnilab",
            "+ KUBECONFIG=target/cnilab-e2e/c/kubeconfig minikube --profile c ssh --node c-m02 -- sudo /var/tmp/cnilab capture --node-name c-m02 -o /var/tmp/cnilab-capture.json",
            "+ KUBECONFIG=target/cnilab-e2e/c/kubeconfig minikube --profile c cp c:/var/tmp/cnilab-capture.json caps/c.json",
        ] {
            assert!(mk.lines().any(|l| l == line), "{line:?} not in\n{mk}");
        }
        let mut o = opts(Via::Pod);
        o.context = Some("prod".into());
        let pod = plan(&o).dry_run();
        for line in [
            "+ kubectl --context prod get nodes -o name",
            "+ kubectl --context prod --namespace kube-system exec cnilab-capture-<node> -- chroot /host /var/tmp/cnilab capture --node-name <node> -o /var/tmp/cnilab-capture.json",
            "+ kubectl --context prod cp 'kube-system/cnilab-capture-<node>:/host/var/tmp/cnilab-capture.json' caps/<node>.json",
            "+ kubectl --context prod --namespace kube-system delete pod cnilab-capture-<node> --ignore-not-found --timeout 60s",
        ] {
            assert!(pod.lines().any(|l| l == line), "{line:?} not in\n{pod}");
        }
        for needle in [
            "nodeName: <node>",
            "hostNetwork: true",
            "hostPID: true",
            "privileged: true",
            "path: /\n",
        ] {
            assert!(pod.contains(needle), "{needle:?} not in\n{pod}");
        }
    }

    #[test]
    fn bad_options_are_refused() {
        let mut o = opts(Via::Kind);
        o.context = Some("x".into());
        assert!(o.validate().is_err());
        let mut o = opts(Via::Pod);
        o.namespace = "Kube System".into();
        assert!(o.validate().is_err());
        assert!(opts(Via::Pod).validate().is_ok());
    }
}
