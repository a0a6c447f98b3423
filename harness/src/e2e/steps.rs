//! The plan of each step for kind and minikube (lab/e2e-plan.md). Pure:
//! options (and the manifests' text) in, a `Plan` out.

use super::check::CheckOptions;
use super::options::{E2eOptions, Provider, Step, IMAGE_PLACEHOLDER};
use super::plan::{Action, Cmd, Gate, Plan, Verify};
use super::E2eError;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SHORT: Duration = Duration::from_secs(60);
const LONG: Duration = Duration::from_secs(900);

/// A manifest file as read from `--manifests`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub file_name: String,
    pub text: String,
}

/// The DaemonSet the manifests deploy, which `wait` and `dump` watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentRef {
    pub namespace: String,
    pub name: String,
    /// `key=value,...`
    pub selector: String,
}

impl Default for AgentRef {
    fn default() -> AgentRef {
        AgentRef {
            namespace: "kube-system".into(),
            name: "cnilab-agent".into(),
            selector: "app.kubernetes.io/name=cnilab-agent".into(),
        }
    }
}

/// The rendered manifests and the DaemonSet found in them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    pub files: Vec<Manifest>,
    pub agent: AgentRef,
}

/// Reads `*.yaml` in `dir`, sorted, except kustomization.yaml.
pub fn read_manifests(dir: &Path) -> Result<Vec<Manifest>, E2eError> {
    let entries = std::fs::read_dir(dir).map_err(|e| E2eError::Io {
        what: format!("cannot read the manifests directory {}", dir.display()),
        source: e,
    })?;
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if !file_name.ends_with(".yaml") || file_name == "kustomization.yaml" {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).map_err(|e| E2eError::Io {
            what: format!("cannot read {}", entry.path().display()),
            source: e,
        })?;
        files.push(Manifest { file_name, text });
    }
    files.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    if files.is_empty() {
        return Err(E2eError::Invalid(format!(
            "no *.yaml manifests in {}",
            dir.display()
        )));
    }
    Ok(files)
}

/// Points every use of the placeholder image at `image` and sets the
/// agent's CNILAB_CLUSTER_CIDR to the cluster's pod subnet; finds the
/// DaemonSet. Line-based so that comments and layout survive.
pub fn render_manifests(
    files: &[Manifest],
    image: &str,
    cluster_cidr: &str,
) -> Result<Rendered, E2eError> {
    let mut out = Vec::new();
    let mut placeholder_seen = false;
    let mut cidr_seen = false;
    for f in files {
        placeholder_seen |= f.text.contains(IMAGE_PLACEHOLDER);
        let replaced = f.text.replace(IMAGE_PLACEHOLDER, image);
        let mut lines: Vec<String> = replaced.lines().map(str::to_string).collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i].trim_start().trim_start_matches("- ").trim() == "name: CNILAB_CLUSTER_CIDR"
            {
                let next = lines
                    .iter()
                    .enumerate()
                    .skip(i + 1)
                    .find(|(_, l)| !l.trim().is_empty());
                match next {
                    Some((j, l)) if l.trim_start().starts_with("value:") => {
                        let indent = &l[..l.len() - l.trim_start().len()];
                        lines[j] = format!("{indent}value: \"{cluster_cidr}\"");
                        cidr_seen = true;
                        i = j;
                    }
                    _ => {
                        return Err(E2eError::Invalid(format!(
                            "{}: CNILAB_CLUSTER_CIDR has no literal `value:` on the next line",
                            f.file_name
                        )))
                    }
                }
            }
            i += 1;
        }
        let mut text = lines.join("\n");
        if replaced.ends_with('\n') {
            text.push('\n');
        }
        out.push(Manifest {
            file_name: f.file_name.clone(),
            text,
        });
    }
    if !placeholder_seen {
        return Err(E2eError::Invalid(format!(
            "no manifest uses the image placeholder {IMAGE_PLACEHOLDER}: the image under test would never run"
        )));
    }
    if !cidr_seen {
        return Err(E2eError::Invalid(
            "no manifest sets CNILAB_CLUSTER_CIDR: the agent would masquerade pod-to-pod traffic"
                .into(),
        ));
    }
    let mut agent = None;
    for f in &out {
        for doc in serde_norway::Deserializer::from_str(&f.text) {
            let value: serde_json::Value = serde::Deserialize::deserialize(doc)
                .map_err(|e| E2eError::Invalid(format!("{}: not valid YAML: {e}", f.file_name)))?;
            check_pull_policy(&f.file_name, &value, image)?;
            if value["kind"] == "DaemonSet" && agent.is_none() {
                agent = Some(agent_ref(&f.file_name, &value)?);
            }
        }
    }
    let agent = agent.ok_or_else(|| E2eError::Invalid("no DaemonSet in the manifests".into()))?;
    Ok(Rendered { files: out, agent })
}

fn check_pull_policy(file: &str, doc: &serde_json::Value, image: &str) -> Result<(), E2eError> {
    let spec = &doc["spec"]["template"]["spec"];
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            if c["image"] == image && c["imagePullPolicy"] == "Always" {
                return Err(E2eError::Invalid(format!(
                    "{file}: container {} pulls {image} with imagePullPolicy: Always, but a loaded image cannot be pulled (use IfNotPresent)",
                    c["name"].as_str().unwrap_or("?")
                )));
            }
        }
    }
    Ok(())
}

fn agent_ref(file: &str, doc: &serde_json::Value) -> Result<AgentRef, E2eError> {
    let name = doc["metadata"]["name"].as_str();
    let labels = doc["spec"]["selector"]["matchLabels"].as_object();
    match (name, labels) {
        (Some(name), Some(labels)) if !labels.is_empty() => Ok(AgentRef {
            namespace: doc["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string(),
            name: name.to_string(),
            selector: labels
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(","),
        }),
        _ => Err(E2eError::Invalid(format!(
            "{file}: the DaemonSet needs metadata.name and spec.selector.matchLabels"
        ))),
    }
}

/// The kind cluster config; equals lab/kind/<family>.yaml for 2 workers.
pub fn kind_config(opts: &E2eOptions) -> String {
    let family = opts.ip_family;
    let mut s = format!(
        "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnetworking:\n  ipFamily: {}\n  disableDefaultCNI: true\n  podSubnet: {}\n  serviceSubnet: {}\nnodes:\n  - role: control-plane\n",
        family.as_str(),
        family.pod_subnet(),
        family.service_subnet()
    );
    for _ in 0..opts.workers() {
        s.push_str("  - role: worker\n");
    }
    s
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn kubectl(opts: &E2eOptions) -> Cmd {
    Cmd::new("kubectl").args(["--kubeconfig".to_string(), path(&opts.kubeconfig())])
}

fn minikube(opts: &E2eOptions) -> Cmd {
    Cmd::new("minikube")
        .env("KUBECONFIG", path(&opts.kubeconfig()))
        .args(["--profile", opts.name.as_str()])
}

/// A command on a node, as root: `docker exec N` or `minikube ssh`.
fn on_node(opts: &E2eOptions, node: &str) -> Cmd {
    match opts.provider {
        Provider::Kind => Cmd::new("docker").args(["exec", node]),
        Provider::Minikube => minikube(opts).args(["ssh", "--node", node, "--", "sudo"]),
    }
}

pub fn create(opts: &E2eOptions) -> Result<Plan, E2eError> {
    let mut plan = Plan::default();
    match opts.provider {
        Provider::Kind => {
            let config = opts.work_dir().join("kind-config.yaml");
            plan.push(Action::Preflight {
                tools: vec!["kind".into(), "docker".into(), "kubectl".into()],
                sysctls: inotify_limits(),
            });
            plan.push(Action::Write {
                path: config.clone(),
                content: kind_config(opts),
            });
            plan.push(Action::run(
                Cmd::new("kind").args([
                    "create".to_string(),
                    "cluster".into(),
                    "--name".into(),
                    opts.name.clone(),
                    "--config".into(),
                    path(&config),
                    "--image".into(),
                    opts.kind_node_image()?,
                    "--kubeconfig".into(),
                    path(&opts.kubeconfig()),
                    "--retain".into(),
                ]),
                LONG,
            ));
        }
        Provider::Minikube => {
            plan.push(Action::Preflight {
                tools: vec!["minikube".into(), "docker".into(), "kubectl".into()],
                sysctls: inotify_limits(),
            });
            plan.push(Action::run(minikube_start(opts), LONG));
        }
    }
    Ok(plan)
}

fn minikube_start(opts: &E2eOptions) -> Cmd {
    // `--profile` goes after `start` here, as minikube's own docs write it.
    Cmd::new("minikube")
        .env("KUBECONFIG", path(&opts.kubeconfig()))
        .args([
            "start".to_string(),
            "--profile".into(),
            opts.name.clone(),
            "--nodes".into(),
            (opts.workers() + 1).to_string(),
            "--cni=false".into(),
            "--driver=docker".into(),
            "--container-runtime=containerd".into(),
            format!("--kubernetes-version={}", opts.k8s_version()),
            format!(
                "--extra-config=kubeadm.pod-network-cidr={}",
                opts.ip_family.pod_subnet()
            ),
            format!(
                "--service-cluster-ip-range={}",
                opts.ip_family.service_subnet()
            ),
            "--wait=apiserver".into(),
        ])
}

fn inotify_limits() -> Vec<(String, u64)> {
    vec![
        ("fs/inotify/max_user_watches".into(), 524_288),
        ("fs/inotify/max_user_instances".into(), 512),
    ]
}

pub fn load(opts: &E2eOptions) -> Plan {
    let mut plan = Plan::default();
    let archive = opts.archive();
    match &opts.image_archive {
        Some(given) => plan.push(Action::RequireFile {
            path: given.clone(),
            why: "--image-archive names a file that does not exist (cnilab does not rebuild it silently; drop the flag to build the image)".into(),
        }),
        None => {
            plan.push(Action::run(
                Cmd::new("docker").args([
                    "build",
                    "--file",
                    "lab/image/Dockerfile",
                    "--tag",
                    opts.image.as_str(),
                    ".",
                ]),
                Duration::from_secs(3600),
            ));
            plan.push(Action::run(
                Cmd::new("docker").args([
                    "save".to_string(),
                    opts.image.clone(),
                    "--output".into(),
                    path(&archive),
                ]),
                LONG,
            ));
        }
    }
    match opts.provider {
        Provider::Kind => plan.push(Action::run(
            Cmd::new("kind").args([
                "load".to_string(),
                "image-archive".into(),
                path(&archive),
                "--name".into(),
                opts.name.clone(),
            ]),
            LONG,
        )),
        Provider::Minikube => plan.push(Action::run(
            minikube(opts).args(["image".to_string(), "load".into(), path(&archive)]),
            LONG,
        )),
    }
    for node in opts.predicted_nodes() {
        let cmd = on_node(opts, &node).args(["crictl", "inspecti", "-q", opts.image.as_str()]);
        plan.push(Action::Run {
            cmd,
            timeout: SHORT,
            hint: Some(format!(
                "node {node} does not have the image {}",
                opts.image
            )),
            gate: None,
        });
    }
    plan
}

pub fn deploy(opts: &E2eOptions, rendered: &Rendered) -> Plan {
    let mut plan = Plan::default();
    let dir = opts.work_dir().join("manifests");
    let paths: Vec<PathBuf> = rendered
        .files
        .iter()
        .map(|f| dir.join(&f.file_name))
        .collect();
    for (f, p) in rendered.files.iter().zip(&paths) {
        plan.push(Action::Write {
            path: p.clone(),
            content: f.text.clone(),
        });
    }
    for p in &paths {
        plan.push(Action::run(
            kubectl(opts).args(["apply".to_string(), "--filename".into(), path(p)]),
            SHORT,
        ));
    }
    plan
}

pub fn wait(opts: &E2eOptions, agent: &AgentRef) -> Plan {
    let mut plan = Plan::default();
    if opts.provider == Provider::Minikube {
        for node in opts.predicted_nodes() {
            plan.push(Action::Verify {
                // sed, not grep: no match is not an error, whatever exit
                // status `minikube ssh` would make of grep's 1.
                cmd: on_node(opts, &node).args([
                    "sed",
                    "-n",
                    "-e",
                    "/conf_dir/p",
                    "-e",
                    "/confDir/p",
                    "/etc/containerd/config.toml",
                ]),
                verify: Verify::CniConfDir { node },
                timeout: SHORT,
            });
        }
    }
    let t = format!("--timeout={}s", opts.timeout.as_secs());
    // kubectl's own timeout ends the gate; ours only catches a hung kubectl.
    let hard = opts.timeout + Duration::from_secs(30);
    let ns_pods = |ns: &str| {
        kubectl(opts).args([
            "--namespace".to_string(),
            ns.to_string(),
            "get".into(),
            "pods".into(),
            "-o".into(),
            "wide".into(),
        ])
    };
    let gates = [
        (
            kubectl(opts).args([
                "--namespace".to_string(),
                agent.namespace.clone(),
                "rollout".into(),
                "status".into(),
                format!("daemonset/{}", agent.name),
                t.clone(),
            ]),
            format!("daemonset {}/{}", agent.namespace, agent.name),
            ns_pods(&agent.namespace),
        ),
        (
            kubectl(opts).args([
                "wait".to_string(),
                "--for=condition=Ready".into(),
                "nodes".into(),
                "--all".into(),
                t.clone(),
            ]),
            "nodes Ready".to_string(),
            kubectl(opts).args(["get", "nodes", "-o", "wide"]),
        ),
        (
            kubectl(opts).args([
                "--namespace".to_string(),
                "kube-system".into(),
                "wait".into(),
                "--for=condition=Ready".into(),
                "pods".into(),
                "--selector=k8s-app=kube-dns".into(),
                t,
            ]),
            "CoreDNS Ready".to_string(),
            ns_pods("kube-system"),
        ),
    ];
    for (cmd, what, on_failure) in gates {
        plan.push(Action::Run {
            cmd,
            timeout: hard,
            hint: None,
            gate: Some(Gate {
                what,
                timeout: opts.timeout,
                on_failure,
            }),
        });
    }
    plan
}

/// The check's options for a provider run: reports under
/// `target/cnilab-reports/e2e-<provider>-<name>/`.
pub fn check_options(opts: &E2eOptions) -> CheckOptions {
    let reports = opts.reports_dir();
    let mut check = CheckOptions::new(opts.kubeconfig());
    check.ip_family = opts.ip_family;
    check.probe_image = opts.probe_image.clone();
    check.format = opts.format;
    check.format = opts.format;
    check.junit = Some(
        opts.junit
            .clone()
            .unwrap_or_else(|| reports.join("junit.xml")),
    );
    check.report = Some(
        opts.report
            .clone()
            .unwrap_or_else(|| reports.join("report.html")),
    );
    check.json = Some(reports.join("report.json"));
    check.title = format!("e2e-{}-{}", opts.provider.as_str(), opts.name);
    check.predicted_nodes = opts.predicted_nodes();
    check.timeout = opts.timeout;
    check
}

pub fn check(opts: &E2eOptions) -> Plan {
    Plan {
        actions: vec![Action::Check(Box::new(check_options(opts)))],
    }
}

pub fn dump(opts: &E2eOptions, agent: &AgentRef) -> Plan {
    let mut plan = Plan::default();
    let out = opts.dump_dir();
    let capture = |cmd: Cmd, file: &str| Action::Capture {
        cmd,
        file: out.join(file),
        timeout: SHORT,
    };
    let in_agent_ns = || kubectl(opts).args(["--namespace", agent.namespace.as_str()]);
    let selector = format!("--selector={}", agent.selector);
    plan.push(capture(
        kubectl(opts).args(["get", "nodes", "-o", "wide"]),
        "nodes.txt",
    ));
    plan.push(capture(
        kubectl(opts).args(["get", "nodes", "-o", "yaml"]),
        "nodes.yaml",
    ));
    plan.push(capture(
        kubectl(opts).args(["get", "pods", "--all-namespaces", "-o", "wide"]),
        "pods.txt",
    ));
    plan.push(capture(
        kubectl(opts).args([
            "get",
            "events",
            "--all-namespaces",
            "--sort-by=.lastTimestamp",
        ]),
        "events.txt",
    ));
    plan.push(capture(
        in_agent_ns().args(["describe", "daemonset", agent.name.as_str()]),
        "agent/daemonset.txt",
    ));
    plan.push(capture(
        in_agent_ns().args(["describe", "pods", selector.as_str()]),
        "agent/pods.txt",
    ));
    let logs = |previous: bool, file: &str| {
        let mut cmd =
            in_agent_ns().args(["logs", "<agent-pod>", "--all-containers", "--timestamps"]);
        if previous {
            cmd = cmd.arg("--previous");
        }
        capture(cmd, file)
    };
    plan.push(Action::ForEach {
        list: in_agent_ns().args(["get", "pods", selector.as_str(), "-o", "name"]),
        placeholder: "<agent-pod>".into(),
        predicted: None,
        body: vec![
            logs(false, "agent/<agent-pod>.log"),
            logs(true, "agent/<agent-pod>.previous.log"),
        ],
    });
    plan.push(capture(
        kubectl(opts).args([
            "--namespace",
            "kube-system",
            "describe",
            "pods",
            "--selector=k8s-app=kube-dns",
        ]),
        "coredns.txt",
    ));
    let node_cmd = |args: &[&str]| on_node(opts, "<node>").args(args.iter().copied());
    let node_file = |f: &str| format!("nodes/<node>/{f}");
    let mut cni_files = vec!["ls", "-l", "/etc/cni/net.d", "/opt/cni/bin"];
    let cni_config = match opts.provider {
        Provider::Kind => node_cmd(&[
            "sh",
            "-c",
            r#"for f in /etc/cni/net.d/*; do echo "== $f"; cat "$f"; done"#,
        ]),
        // `minikube ssh` hands its arguments to a remote shell as one line, so
        // no shell script here: head prints a `==> file <==` header per file.
        Provider::Minikube => {
            cni_files.push("/etc/cni/net.mk");
            node_cmd(&[
                "head",
                "-n",
                "100000",
                "/etc/cni/net.d/*",
                "/etc/cni/net.mk/*",
            ])
        }
    };
    let body = vec![
        capture(
            node_cmd(&["ip", "-details", "address", "show"]),
            &node_file("addresses.txt"),
        ),
        capture(
            node_cmd(&["ip", "-4", "route", "show", "table", "all"]),
            &node_file("routes4.txt"),
        ),
        capture(
            node_cmd(&["ip", "-6", "route", "show", "table", "all"]),
            &node_file("routes6.txt"),
        ),
        capture(node_cmd(&["ip", "rule", "show"]), &node_file("rules.txt")),
        capture(node_cmd(&["nft", "list", "ruleset"]), &node_file("nft.txt")),
        capture(node_cmd(&["iptables-save"]), &node_file("iptables.txt")),
        capture(
            node_cmd(&[
                "sysctl",
                "-e",
                "net.ipv4.ip_forward",
                "net.ipv6.conf.all.forwarding",
                "net.ipv4.conf.all.rp_filter",
                "net.ipv4.conf.default.rp_filter",
                "net.bridge.bridge-nf-call-iptables",
                "net.bridge.bridge-nf-call-ip6tables",
            ]),
            &node_file("sysctls.txt"),
        ),
        capture(node_cmd(&cni_files), &node_file("cni-files.txt")),
        capture(cni_config, &node_file("cni-config.txt")),
        capture(node_cmd(&["crictl", "pods"]), &node_file("crictl-pods.txt")),
    ];
    let list = match opts.provider {
        Provider::Kind => Cmd::new("kind").args(["get", "nodes", "--name", opts.name.as_str()]),
        Provider::Minikube => minikube(opts).args(["node", "list"]),
    };
    plan.push(Action::ForEach {
        list,
        placeholder: "<node>".into(),
        predicted: Some(opts.predicted_nodes()),
        body,
    });
    match opts.provider {
        Provider::Kind => plan.push(Action::run(
            Cmd::new("kind").args([
                "export".to_string(),
                "logs".into(),
                path(&out.join("kind-logs")),
                "--name".into(),
                opts.name.clone(),
            ]),
            LONG,
        )),
        Provider::Minikube => plan.push(Action::run(
            minikube(opts).args([
                "logs".to_string(),
                "--file".into(),
                path(&out.join("minikube-logs.txt")),
            ]),
            LONG,
        )),
    }
    plan
}

pub fn delete(opts: &E2eOptions) -> Plan {
    let cmd = match opts.provider {
        Provider::Kind => Cmd::new("kind").args([
            "delete".to_string(),
            "cluster".into(),
            "--name".into(),
            opts.name.clone(),
            "--kubeconfig".into(),
            path(&opts.kubeconfig()),
        ]),
        Provider::Minikube => Cmd::new("minikube")
            .env("KUBECONFIG", path(&opts.kubeconfig()))
            .args(["delete", "--profile", opts.name.as_str()]),
    };
    Plan {
        actions: vec![Action::run(cmd, LONG)],
    }
}

/// The plan of one step. `deploy`, `wait` and `dump` read the manifests
/// (the DaemonSet's name and selector come from them).
pub fn step_plan(opts: &E2eOptions, step: Step, manifests: &[Manifest]) -> Result<Plan, E2eError> {
    let rendered = || render_manifests(manifests, &opts.image, opts.ip_family.pod_subnet());
    Ok(match step {
        Step::Create => create(opts)?,
        Step::Load => load(opts),
        Step::Deploy => deploy(opts, &rendered()?),
        Step::Wait => wait(opts, &rendered()?.agent),
        Step::Check => check(opts),
        Step::Dump => dump(opts, &rendered().map(|r| r.agent).unwrap_or_default()),
        Step::Delete => delete(opts),
        Step::All => {
            return Err(E2eError::Invalid(
                "`all` is a sequence of plans, not one".into(),
            ))
        }
    })
}

/// The steps of a full run before the failure handling.
pub const SEQUENCE: [Step; 5] = [
    Step::Create,
    Step::Load,
    Step::Deploy,
    Step::Wait,
    Step::Check,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(text: &str) -> Vec<Manifest> {
        vec![Manifest {
            file_name: "a.yaml".into(),
            text: text.into(),
        }]
    }

    const DS: &str = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: agent\n  namespace: net\nspec:\n  selector:\n    matchLabels:\n      app: agent\n  template:\n    spec:\n      containers:\n        - name: agent\n          image: ghcr.io/cnilab/cnilab:dev\n          imagePullPolicy: IfNotPresent\n          env:\n            - name: CNILAB_CLUSTER_CIDR\n              value: \"10.0.0.0/8\"\n";

    #[test]
    fn renders_image_cidr_and_finds_the_daemonset() {
        let r = render_manifests(
            &manifest(DS),
            "localhost/x:1",
            "10.244.0.0/16,fd00:10:244::/56",
        );
        let r = match r {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        assert!(r.files[0].text.contains("image: localhost/x:1"));
        assert!(r.files[0]
            .text
            .contains("              value: \"10.244.0.0/16,fd00:10:244::/56\"\n"));
        assert_eq!(
            r.agent,
            AgentRef {
                namespace: "net".into(),
                name: "agent".into(),
                selector: "app=agent".into()
            }
        );
    }

    #[test]
    fn refuses_what_cannot_work_in_a_kind_cluster() {
        let always = DS.replace("IfNotPresent", "Always");
        let err = render_manifests(&manifest(&always), "localhost/x:1", "10.244.0.0/16");
        assert!(matches!(err, Err(E2eError::Invalid(m)) if m.contains("imagePullPolicy: Always")));
        let no_placeholder = DS.replace("ghcr.io/cnilab/cnilab:dev", "busybox");
        let err = render_manifests(&manifest(&no_placeholder), "localhost/x:1", "10.244.0.0/16");
        assert!(matches!(err, Err(E2eError::Invalid(m)) if m.contains("placeholder")));
        let no_cidr = DS.replace("CNILAB_CLUSTER_CIDR", "OTHER");
        let err = render_manifests(&manifest(&no_cidr), "localhost/x:1", "10.244.0.0/16");
        assert!(matches!(err, Err(E2eError::Invalid(m)) if m.contains("CNILAB_CLUSTER_CIDR")));
    }
}
