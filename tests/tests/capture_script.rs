//! `cnilab capture --script` (root): the printed script, run under `dash`
//! (and `busybox sh` with busybox's own coreutils) against a node's
//! namespace the way `cnilab capture --netns` takes one
//! (`CNILAB_NETNS=PATH`), read back with `cnilab capture --from-script`,
//! gives the capture the native reader gives: the same `node` (every
//! object kind of the model), the same pods with the same evidence, the
//! same peers and warnings. For every topology in `lab/topologies/` (each
//! node of a standing lab) and every hand-built node style of
//! `capture_common/styles.rs` (flannel, Calico, kube-proxy's
//! iptables-nft). The script passes `shellcheck -s sh` and changes no
//! namespace; a hostile file is refused with the section named, exit 2,
//! nothing made. Where `crictl` is (a stand-in printing what crictl prints:
//! Debian has no crictl), pods are named `<namespace>/<name>` as the native
//! capture names them from the CRI socket.
//!
//! What is normalised before comparing, and why: `provenance` (the time
//! differs between the two runs; the rest is compared) and the warning
//! counting processes whose namespace was unreadable, and a pod's `pid`
//! that only one side has (processes of the machine come and go between
//! the two runs; pids both sides have are compared). The CNI cache both read is
//! a copy of the machine's taken once, since other labs on the machine
//! write theirs meanwhile.

mod capture_common;

use capture_common::all;
use capture_common::styles::{self, Cluster};
use cnilab_net::testing::network_of;
use cnilab_tests::{
    cnilab, host_untouched, lab_namespaces, output_text, require_root, StandingLab,
};
use rstest::rstest;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The printed script, in `dir`.
fn script_file(dir: &Path) -> PathBuf {
    let out = cnilab(&["capture", "--script"]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        out.stdout.starts_with(b"#!/bin/sh\n"),
        "{}",
        output_text(&out)
    );
    let file = dir.join("node.sh");
    std::fs::write(&file, &out.stdout).expect("write the script");
    file
}

/// A copy of the machine's CNI cache, taken once for both readers.
fn cache_copy(dir: &Path) -> PathBuf {
    let copy = dir.join("cni-cache");
    std::fs::create_dir_all(&copy).expect("dir");
    for e in std::fs::read_dir("/var/lib/cni/results")
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::copy(e.path(), copy.join(e.file_name()));
        }
    }
    copy
}

/// How the script is run: `dash`, or `busybox sh` with busybox's applets
/// first on PATH (its stat, od, sort, grep…; ip, nsenter, nft are the
/// system's).
#[derive(Clone, Copy, Debug)]
enum Shell {
    Dash,
    Busybox,
}

fn shell_command(shell: Shell, dir: &Path) -> Command {
    match shell {
        Shell::Dash => Command::new("dash"),
        Shell::Busybox => {
            let busybox = which("busybox").unwrap_or_else(|| {
                panic!("busybox is not installed: install busybox (lab/install-deps.sh)")
            });
            let bin = dir.join("busybox-bin");
            std::fs::create_dir_all(&bin).expect("dir");
            for applet in [
                "stat", "od", "tr", "sort", "cat", "head", "mktemp", "grep", "rm", "date", "uname",
                "sh",
            ] {
                let link = bin.join(applet);
                if !link.exists() {
                    std::os::unix::fs::symlink(&busybox, &link).expect("symlink an applet");
                }
            }
            let path = format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            );
            let mut c = Command::new(&busybox);
            c.arg("sh").env("PATH", path);
            c
        }
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// The script run under `shell` with the node at `node` into a file, read
/// back with `cnilab capture --from-script`: the file and the capture.
fn scripted(shell: Shell, node: &Path, cache: &Path, dir: &Path) -> (PathBuf, Value) {
    let script = script_file(dir);
    let file = dir.join(format!("{shell:?}.capture"));
    let out = shell_command(shell, dir)
        .arg(&script)
        .arg(&file)
        .env("CNILAB_NETNS", node)
        .env("CNILAB_CNI_CACHE", cache)
        .output()
        .expect("the shell runs");
    assert!(out.status.success(), "{shell:?}: {}", all(&out));
    let c = capture_common::from_script(&file, &dir.join(format!("{shell:?}.json")));
    capture_common::assert_conforms(&c);
    (file, c)
}

/// The parts compared (see the header: provenance's time and the
/// unreadable-process count left out).
fn comparable(c: &Value) -> Value {
    let warnings: Vec<&Value> = c["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| {
            !w.as_str()
                .is_some_and(|w| w.contains("processes was not readable"))
        })
        .collect();
    let mut p = c["provenance"].clone();
    p["time"] = Value::Null;
    serde_json::json!({
        "node": c["node"],
        "pods": c["pods"],
        "peers": c["peers"],
        "warnings": warnings,
        "provenance": p,
    })
}

/// A pod's or a peer's `pid` that only one side has: a process holding its
/// namespace (the lowest pid) that started or ended between the two runs
/// (a sandbox's, or any tool entering the namespace for a moment, as
/// `cnilab sweep` does to list its tables). Both sides' pids are compared
/// where both have one.
fn forget_lone_pids(a: &mut Value, b: &mut Value) {
    for list in ["pods", "peers"] {
        let (Some(pa), Some(pb)) = (a[list].as_array_mut(), b[list].as_array_mut()) else {
            continue;
        };
        for x in pa.iter_mut() {
            let Some(y) = pb.iter_mut().find(|y| y["name"] == x["name"]) else {
                continue;
            };
            if x.get("pid").is_some() != y.get("pid").is_some() {
                for p in [&mut *x, y] {
                    if let Some(o) = p.as_object_mut() {
                        o.remove("pid");
                    }
                }
            }
        }
    }
}

/// Asserts the two captures are equal, naming the first lines that differ.
fn assert_same(native: &Value, script: &Value, what: &str) {
    let (mut a, mut b) = (comparable(native), comparable(script));
    forget_lone_pids(&mut a, &mut b);
    let text = |v: &Value| serde_json::to_string_pretty(v).expect("json");
    if let Some(diff) = cnilab_tests::line_diff(&text(&a), &text(&b), 40) {
        panic!("{what}: the script's capture differs from the native one (- native, + script):\n{diff}");
    }
}

/// Native and scripted captures of each node of `cluster`, compared; no
/// namespace changed by the script.
fn style_round(cluster: &Cluster, label: &str, shells: &[Shell]) {
    let dir = tempfile::tempdir().expect("dir");
    let cache = cache_copy(dir.path());
    let cache_arg = cache.display().to_string();
    for (i, node) in cluster.nodes.iter().enumerate() {
        let native = cluster.capture(i, &["--cni-cache", &cache_arg]);
        for shell in shells {
            let before: Vec<_> = cluster.all().iter().map(|n| network_of(n)).collect();
            let (_, script) = scripted(*shell, node.path(), &cache, dir.path());
            for (n, b) in cluster.all().iter().zip(&before) {
                let changes = network_of(n).changes_since(b);
                assert!(
                    changes.is_empty(),
                    "the script changed {}: {changes:?}",
                    n.name()
                );
            }
            assert_same(
                &native,
                &script,
                &format!("{label} node {} ({shell:?})", i + 1),
            );
        }
    }
}

#[test]
fn flannel_nodes_capture_the_same_by_script_under_dash_and_busybox() {
    let _host = host_untouched();
    let c = styles::flannel();
    style_round(&c, "flannel", &[Shell::Dash, Shell::Busybox]);
}

#[test]
fn calico_nodes_capture_the_same_by_script() {
    let _host = host_untouched();
    let c = styles::calico_cluster();
    style_round(&c, "calico", &[Shell::Dash]);
}

/// capture.rs's Calico node: two `cali` pods, a macvlan of the node's
/// `eth0` in a namespace of its own, legacy iptables.
#[test]
fn a_macvlan_and_legacy_iptables_capture_the_same_by_script() {
    let _host = host_untouched();
    let c = capture_common::calico();
    let dir = tempfile::tempdir().expect("dir");
    let cache = cache_copy(dir.path());
    let cache_arg = cache.display().to_string();
    let mut every: Vec<&cnilab_net::netns::Netns> = vec![&c.node, &c.macvlan];
    every.extend(c.pods.iter());
    let native = capture_common::capture(&c.node, &["--cni-cache", &cache_arg], &every);
    let (_, script) = scripted(Shell::Dash, c.node.path(), &cache, dir.path());
    assert_same(&native, &script, "calico with a macvlan");
    let mv = capture_common::pod_named(&script, c.macvlan.name());
    assert_eq!(
        capture_common::link(mv, "mv0")["lower"]["namespace"],
        native["node"]["name"],
        "{mv}"
    );
}

#[test]
fn kube_proxy_nodes_capture_the_same_by_script() {
    let _host = host_untouched();
    let c = styles::kube_proxy();
    style_round(&c, "kube-proxy", &[Shell::Dash]);
}

#[rstest]
fn every_topology_captures_the_same_by_script(#[files("../lab/topologies/*.toml")] path: PathBuf) {
    let _host = host_untouched();
    require_root();
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let h: u32 = stem.bytes().map(u32::from).sum::<u32>() % 1000;
    let name = format!("sc{h}-{}", std::process::id() % 100_000);
    let out = cnilab(&[
        "lab",
        "up",
        "--name",
        &name,
        "--topology",
        &path.display().to_string(),
    ]);
    let _lab = StandingLab(name.clone());
    assert!(out.status.success(), "lab up {stem}: {}", output_text(&out));
    let state = cnilab_harness::lab::state::load_state(&name).expect("lab state");
    let dir = tempfile::tempdir().expect("dir");
    let cache = cache_copy(dir.path());
    for n in &state.nodes {
        let ns = format!("cnilab-lab-{name}-{}", n.name);
        let file = dir.path().join(format!("{}.json", n.name));
        let out = cnilab(&[
            "capture",
            "--netns",
            &ns,
            "--cni-cache",
            &cache.display().to_string(),
            "-o",
            &file.display().to_string(),
        ]);
        assert!(out.status.success(), "capture {ns}: {}", output_text(&out));
        let native: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).expect("file")).expect("JSON");
        let path = Path::new("/run/netns").join(&ns);
        let (_, script) = scripted(Shell::Dash, &path, &cache, dir.path());
        assert_same(&native, &script, &format!("{stem} node {}", n.name));
        let pods = native["pods"].as_array().map_or(0, Vec::len);
        assert!(pods > 0, "{stem} node {}: no pod found", n.name);
    }
}

#[test]
fn the_printed_script_passes_shellcheck() {
    let dir = tempfile::tempdir().expect("dir");
    let script = script_file(dir.path());
    let out = Command::new("shellcheck")
        .args(["-s", "sh"])
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("shellcheck: {e}: install shellcheck (lab/install-deps.sh)"));
    assert!(out.status.success(), "shellcheck -s sh: {}", all(&out));
}

/// A good file of a small node, bent four ways: each refused by
/// `capture --from-script` and `lab up --capture` with exit 2, the section
/// (or what is missing) named, no file and no namespace made.
#[test]
fn a_hostile_script_file_is_refused_naming_the_section() {
    let _host = host_untouched();
    let dir = tempfile::tempdir().expect("dir");
    let node = capture_common::node("cap-scr", "198.18.9.1/24");
    let cache = dir.path().join("empty-cache");
    std::fs::create_dir_all(&cache).expect("dir");
    let (file, _) = scripted(Shell::Dash, node.path(), &cache, dir.path());
    let good = std::fs::read_to_string(&file).expect("file");
    let boundary = good
        .lines()
        .find_map(|l| l.strip_prefix("boundary "))
        .expect("a boundary line")
        .to_string();
    let close = format!("--{boundary}--\n");
    let link_open = format!("--{boundary} 0 link - \n");
    let at = good.find(&link_open).expect("the node's link section") + link_open.len();
    let cases = [
        (
            "truncated",
            good[..good.len() - close.len() - 40].to_string(),
            "cut short",
        ),
        (
            "wrong boundary",
            good.replacen(
                &format!("boundary {boundary}"),
                "boundary cnilab-00000000000000000000",
                1,
            ),
            "is no section of boundary",
        ),
        (
            "ghost namespace",
            good.replace(&close, &format!("--{boundary} 42 link 0 \n[]\n{close}")),
            "namespace 42 was never declared",
        ),
        (
            "garbage JSON",
            format!(
                "{}{{\"ifindex\": [oops\n{}",
                &good[..at],
                &good[good[at..].find("\n--").map_or(at, |e| at + e + 1)..]
            ),
            "section `0 link`: not JSON",
        ),
    ];
    for (label, text, says) in cases {
        let bad = dir
            .path()
            .join(format!("{}.capture", label.replace(' ', "-")));
        std::fs::write(&bad, text).expect("write");
        let out_json = dir.path().join("never.json");
        let out = cnilab(&[
            "capture",
            "--from-script",
            &bad.display().to_string(),
            "-o",
            &out_json.display().to_string(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{label}: {}", output_text(&out));
        let text = output_text(&out);
        assert!(
            text.contains(says) && text.contains(&bad.display().to_string()),
            "{label}: {text}"
        );
        assert!(!out_json.exists(), "{label}: a file was made");
        let lab = format!("scbad{}", std::process::id() % 100_000);
        let up = cnilab(&[
            "lab",
            "up",
            "--name",
            &lab,
            "--capture",
            &bad.display().to_string(),
        ]);
        let _gone = StandingLab(lab.clone());
        assert_eq!(
            up.status.code(),
            Some(2),
            "{label}: lab up: {}",
            output_text(&up)
        );
        assert!(
            output_text(&up).contains(says),
            "{label}: lab up: {}",
            output_text(&up)
        );
        assert!(
            lab_namespaces(&lab).is_empty(),
            "{label}: lab up made namespaces"
        );
    }
    drop(node);
}

/// The script's files of both flannel nodes stand up as a lab
/// (`lab up --capture`, the format told by the first line), each captured
/// pod a namespace of the lab; and convert (`--from-script`) to the
/// native capture's pods.
#[test]
fn script_files_stand_up_as_a_lab() {
    let _host = host_untouched();
    let c = styles::flannel();
    let dir = tempfile::tempdir().expect("dir");
    let cache = dir.path().join("empty-cache");
    std::fs::create_dir_all(&cache).expect("dir");
    let mut files = Vec::new();
    let mut pods = 0;
    for (i, node) in c.nodes.iter().enumerate() {
        let sub = dir.path().join(format!("n{i}"));
        std::fs::create_dir_all(&sub).expect("dir");
        let (file, capture) = scripted(Shell::Dash, node.path(), &cache, &sub);
        pods += capture["pods"].as_array().map_or(0, Vec::len);
        files.push(file.display().to_string());
    }
    assert_eq!(pods, c.pods.iter().map(Vec::len).sum::<usize>());
    let lab = format!("screp{}", std::process::id() % 100_000);
    let mut args = vec!["lab", "up", "--name", &lab, "--capture"];
    args.extend(files.iter().map(String::as_str));
    let up = cnilab(&args);
    let _down = StandingLab(lab.clone());
    assert!(
        up.status.success(),
        "lab up --capture: {}",
        output_text(&up)
    );
    let said = format!("{} nodes, {pods} pods", c.nodes.len());
    assert!(
        output_text(&up).contains(&said),
        "lab up --capture: {}",
        output_text(&up)
    );
    let made = lab_namespaces(&lab);
    assert!(
        made.len() >= c.nodes.len() + pods,
        "{} namespaces for {} nodes and {pods} pods: {made:?}",
        made.len(),
        c.nodes.len()
    );
}

/// `crictl` as the script runs it (`crictl pods -o json`, `crictl pods -q
/// --state ready`, `crictl inspectp -o json ID`), printing what crictl
/// prints for the given sandboxes: Debian has no crictl package, and
/// containerd's CRI socket is what the native capture asks instead.
fn crictl_stand_in(dir: &Path, sandboxes: &[(String, String, u32)]) -> PathBuf {
    let bin = dir.join("crictl-bin");
    let data = dir.join("crictl-data");
    std::fs::create_dir_all(&bin).expect("dir");
    std::fs::create_dir_all(&data).expect("dir");
    let mut items = Vec::new();
    let mut ids = String::new();
    for (k, (namespace, name, pid)) in sandboxes.iter().enumerate() {
        let id = format!("{:064x}", 0xc0ffee_u64 + k as u64);
        let metadata = serde_json::json!({
            "name": name, "uid": format!("5f0c1e2d-0000-4000-8000-{k:012}"),
            "namespace": namespace, "attempt": 0
        });
        items.push(serde_json::json!({
            "id": id, "metadata": metadata, "state": "SANDBOX_READY",
            "createdAt": "1764345600000000000", "labels": { "io.kubernetes.pod.name": name },
            "annotations": {}, "runtimeHandler": ""
        }));
        let inspect = serde_json::json!({
            "status": {
                "id": id, "metadata": metadata, "state": "SANDBOX_READY",
                "createdAt": "2026-11-28T16:00:00.000000000Z",
                "network": { "additionalIps": [], "ip": "" },
                "linux": { "namespaces": { "options": { "ipc": "POD", "network": "POD", "pid": "CONTAINER" } } },
                "labels": {}, "annotations": {}, "runtimeHandler": ""
            },
            "info": {
                "pid": pid, "processStatus": "running", "netNamespaceClosed": false,
                "image": "registry.k8s.io/pause:3.10", "snapshotKey": id, "snapshotter": "overlayfs",
                "runtimeHandler": "", "runtimeType": "io.containerd.runc.v2"
            }
        });
        std::fs::write(data.join(format!("{id}.json")), inspect.to_string()).expect("write");
        ids.push_str(&id);
        ids.push('\n');
    }
    let pods = serde_json::json!({ "items": items });
    std::fs::write(data.join("pods.json"), pods.to_string()).expect("write");
    std::fs::write(data.join("ids"), ids).expect("write");
    let stub = format!(
        "#!/bin/sh\nd={}\ncase \"$1 $2\" in\n\"pods -o\") cat \"$d/pods.json\" ;;\n\"pods -q\") cat \"$d/ids\" ;;\n\"inspectp -o\") cat \"$d/$4.json\" ;;\n*) echo \"crictl stand-in: $*\" >&2; exit 1 ;;\nesac\n",
        data.display()
    );
    let crictl = bin.join("crictl");
    std::fs::write(&crictl, stub).expect("write");
    std::fs::set_permissions(&crictl, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    bin
}

/// Where `crictl` is, the script names each sandbox's pod as the native
/// capture names it from the CRI socket, `<namespace>/<name>`, by its
/// pause process (pods held only by a process, kube-router style), with
/// the CRI as evidence.
#[test]
fn crictl_names_pods_held_by_a_sandbox_process() {
    let _host = host_untouched();
    let k = styles::kube_router();
    let dir = tempfile::tempdir().expect("dir");
    let sandboxes: Vec<(String, String, u32)> = k.names[0]
        .iter()
        .filter_map(|n| n.strip_prefix("pid:")?.parse().ok())
        .enumerate()
        .map(|(j, pid)| {
            (
                "kube-system".to_string(),
                format!("coredns-5d78c9869d-x2x7{j}"),
                pid,
            )
        })
        .collect();
    assert!(!sandboxes.is_empty(), "{:?}", k.names[0]);
    let bin = crictl_stand_in(dir.path(), &sandboxes);
    let script = script_file(dir.path());
    let file = dir.path().join("node.capture");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("dir");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("dash")
        .arg(&script)
        .arg(&file)
        .env("PATH", path)
        .env("CNILAB_NETNS", k.nodes[0].path())
        .env("CNILAB_CNI_CACHE", &empty)
        .output()
        .expect("dash runs");
    assert!(out.status.success(), "{}", all(&out));
    let c = capture_common::from_script(&file, &dir.path().join("node.json"));
    for (ns, name, _) in &sandboxes {
        let want = format!("{ns}/{name}");
        let pod = c["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == want.as_str())
            .unwrap_or_else(|| panic!("no pod {want}: {}", c["pods"]));
        assert_eq!(pod["cri"], want.as_str(), "{pod}");
        let evidence = pod["evidence"].to_string();
        assert!(
            evidence.contains(&format!("the node's CRI lists it as sandbox {want}")),
            "{pod}"
        );
    }
}
