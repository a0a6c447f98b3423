//! The plan of each step for kind and minikube (lab/e2e-plan.md). Pure:
//! options (and the manifests' text) in, a `Plan` out.

use super::check::CheckOptions;
use super::manifests::{Rendered, Workload};
use super::options::{E2eOptions, Provider, Step};
use super::plan::{Action, Cmd, Gate, Plan, Verify};
use super::E2eError;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SHORT: Duration = Duration::from_secs(60);
const LONG: Duration = Duration::from_secs(900);

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

pub fn create(opts: &E2eOptions, rendered: &Rendered) -> Result<Plan, E2eError> {
    let mut plan = Plan::default();
    match opts.provider {
        Provider::Kind => {
            plan.push(Action::Preflight {
                tools: vec!["kind".into(), "docker".into(), "kubectl".into()],
                sysctls: inotify_limits(),
            });
            // The user's own config is read by kind as it is; the default
            // one is lab/kind/<family>.yaml (compiled in), written out.
            let config = match &opts.kind_config {
                Some(own) => own.path.clone(),
                None => {
                    let config = opts.work_dir().join("kind-config.yaml");
                    plan.push(Action::Write {
                        path: config.clone(),
                        content: super::cluster::default_kind_config(
                            opts.ip_family,
                            opts.workers(),
                        ),
                    });
                    config
                }
            };
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
            let cni = minikube_cni_file(opts);
            plan.push(Action::Write {
                path: cni.clone(),
                content: rendered.combined(),
            });
            plan.push(Action::run(minikube_start(opts, &cni), LONG));
        }
    }
    Ok(plan)
}

/// The one manifest file `minikube start --cni=FILE` applies.
pub fn minikube_cni_file(opts: &E2eOptions) -> PathBuf {
    opts.work_dir().join("cni.yaml")
}

fn minikube_start(opts: &E2eOptions, cni: &Path) -> Cmd {
    // `--profile` goes after `start` here, as minikube's own docs write it.
    // `--cni=FILE`, not `--cni=false`: minikube v1.38.1 refuses
    // `--cni=false` with any runtime but docker ("The containerd container
    // runtime requires CNI", validateCNI in cmd/minikube/cmd/start.go) unless
    // --force. With a file, minikube applies it as a custom CNI
    // (pkg/minikube/cni/custom.go) instead of choosing kindnet for several
    // nodes (chooseDefault in pkg/minikube/cni/cni.go).
    Cmd::new("minikube")
        .env("KUBECONFIG", path(&opts.kubeconfig()))
        .args([
            "start".to_string(),
            "--profile".into(),
            opts.name.clone(),
            "--nodes".into(),
            (opts.workers() + 1).to_string(),
            format!("--cni={}", path(cni)),
            "--driver=docker".into(),
            "--container-runtime=containerd".into(),
            format!("--kubernetes-version={}", opts.k8s_version()),
            format!(
                "--extra-config=kubeadm.pod-network-cidr={}",
                opts.pod_subnet()
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

pub fn load(opts: &E2eOptions, rendered: &Rendered) -> Plan {
    let mut plan = Plan::default();
    let archive = opts.archive();
    if opts.image_archive.is_none() && !rendered.runs_image() {
        plan.push(Action::Note(format!(
            "load: no manifest runs {} and no --image-archive was given: nothing to load",
            opts.image
        )));
        return plan;
    }
    match &opts.image_archive {
        Some(given) => plan.push(Action::RequireFile {
            path: given.clone(),
            why: "--image-archive names a file that does not exist (cnilab does not rebuild it silently; drop the flag to build the image)".into(),
        }),
        None => {
            // The image is built from the repository (its root is the
            // build context): outside it, say so before docker does.
            plan.push(Action::RequireFile {
                path: PathBuf::from("lab/image/Dockerfile"),
                why: "building the cnilab image needs the repository: run from its root, or pass --image-archive FILE (a `docker save` of the image)".into(),
            });
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
    if opts.provider == Provider::Minikube {
        // `minikube start --cni=FILE` applied the manifests before `load`:
        // pods of the image under test may sit in ImagePullBackOff. New
        // pods find the loaded image at once.
        for w in rendered.workloads.iter().filter(|w| w.runs_image) {
            plan.push(Action::run(
                kubectl(opts).args([
                    "--namespace".to_string(),
                    w.namespace.clone(),
                    "rollout".into(),
                    "restart".into(),
                    format!("{}/{}", w.kind.resource(), w.name),
                ]),
                SHORT,
            ));
        }
    }
    plan
}

pub fn wait(opts: &E2eOptions, workloads: &[Workload]) -> Plan {
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
    // Every workload of the manifests first (nodes turn Ready only once
    // the CNI wrote its config), then the nodes, then CoreDNS.
    let mut gates: Vec<(Cmd, String, Cmd)> = workloads
        .iter()
        .map(|w| {
            (
                kubectl(opts).args([
                    "--namespace".to_string(),
                    w.namespace.clone(),
                    "rollout".into(),
                    "status".into(),
                    format!("{}/{}", w.kind.resource(), w.name),
                    t.clone(),
                ]),
                w.describe(),
                ns_pods(&w.namespace),
            )
        })
        .collect();
    gates.push((
        kubectl(opts).args([
            "wait".to_string(),
            "--for=condition=Ready".into(),
            "nodes".into(),
            "--all".into(),
            t.clone(),
        ]),
        "nodes Ready".to_string(),
        kubectl(opts).args(["get", "nodes", "-o", "wide"]),
    ));
    gates.push((
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
    ));
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
    let mut check = CheckOptions::new(super::check::access::Access {
        kubeconfig: Some(opts.kubeconfig()),
        context: None,
    });
    check.ip_family = opts.ip_family;
    check.probe_image = opts.probe_image.clone();
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

/// What `dump` saves when a step failed: the cluster's nodes, pods and
/// events, each workload of the manifests, CoreDNS, each node's network
/// (addresses, routes, rules, firewall, sysctls, CNI files), and the
/// provider's own logs, all under the dump directory.
pub fn dump(opts: &E2eOptions, workloads: &[Workload]) -> Plan {
    let mut plan = Plan::default();
    let out = opts.dump_dir();
    let capture = |cmd: Cmd, file: &str| Action::Capture {
        cmd,
        file: out.join(file),
        timeout: SHORT,
    };
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
    dump_workloads(opts, &out, workloads, &mut plan);
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
    plan.push(dump_nodes(opts, &out));
    plan.push(dump_provider_logs(opts, &out));
    plan
}

/// Each workload of the manifests: described, its pods described, and the
/// logs of each pod (current and previous) under
/// workloads/<namespace>.<name>/.
fn dump_workloads(opts: &E2eOptions, out: &Path, workloads: &[Workload], plan: &mut Plan) {
    let capture = |cmd: Cmd, file: &str| Action::Capture {
        cmd,
        file: out.join(file),
        timeout: SHORT,
    };
    for w in workloads {
        let in_ns = || kubectl(opts).args(["--namespace", w.namespace.as_str()]);
        let selector = format!("--selector={}", w.selector);
        let dir = format!("workloads/{}.{}", w.namespace, w.name);
        plan.push(capture(
            in_ns().args(["describe", w.kind.resource(), w.name.as_str()]),
            &format!("{dir}/describe.txt"),
        ));
        plan.push(capture(
            in_ns().args(["describe", "pods", selector.as_str()]),
            &format!("{dir}/pods.txt"),
        ));
        let logs = |previous: bool, file: String| {
            let mut cmd = in_ns().args(["logs", "<pod>", "--all-containers", "--timestamps"]);
            if previous {
                cmd = cmd.arg("--previous");
            }
            capture(cmd, &file)
        };
        plan.push(Action::ForEach {
            list: in_ns().args(["get", "pods", selector.as_str(), "-o", "name"]),
            placeholder: "<pod>".into(),
            predicted: None,
            body: vec![
                logs(false, format!("{dir}/<pod>.log")),
                logs(true, format!("{dir}/<pod>.previous.log")),
            ],
        });
    }
}

/// Each node's network and CNI files, one capture per file under
/// nodes/<node>/.
fn dump_nodes(opts: &E2eOptions, out: &Path) -> Action {
    let capture = |cmd: Cmd, file: &str| Action::Capture {
        cmd,
        file: out.join(file),
        timeout: SHORT,
    };
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
    Action::ForEach {
        list,
        placeholder: "<node>".into(),
        predicted: Some(opts.predicted_nodes()),
        body,
    }
}

/// The provider's own logs (`kind export logs`, `minikube logs`).
fn dump_provider_logs(opts: &E2eOptions, out: &Path) -> Action {
    match opts.provider {
        Provider::Kind => Action::run(
            Cmd::new("kind").args([
                "export".to_string(),
                "logs".into(),
                path(&out.join("kind-logs")),
                "--name".into(),
                opts.name.clone(),
            ]),
            LONG,
        ),
        Provider::Minikube => Action::run(
            minikube(opts).args([
                "logs".to_string(),
                "--file".into(),
                path(&out.join("minikube-logs.txt")),
            ]),
            LONG,
        ),
    }
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

/// The plan of one step. Every step but `check` and `delete` needs the
/// rendered manifests: `create` (minikube's `--cni=FILE`), `load` (whether
/// anything runs the image), `deploy`, and `wait`/`dump` (their workloads).
pub fn step_plan(opts: &E2eOptions, step: Step, rendered: &Rendered) -> Result<Plan, E2eError> {
    Ok(match step {
        Step::Create => create(opts, rendered)?,
        Step::Load => load(opts, rendered),
        Step::Deploy => deploy(opts, rendered),
        Step::Wait => wait(opts, &rendered.workloads),
        Step::Check => check(opts),
        Step::Dump => dump(opts, &rendered.workloads),
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
