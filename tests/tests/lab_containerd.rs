//! Root tests of `--runtime containerd`: labs whose pods are made through
//! the CRI of a containerd per node (as kubelet makes them), with
//! cnilab-bridge, the reference plugins and agent routing; a scenario; and
//! what Ctrl-C, `lab down` and `cnilab sweep` leave (no containerd, shim,
//! pause process, mount or namespace). They need containerd and runc
//! (`lab/install-deps.sh`): without them they fail with that remedy.

use cnilab_harness::cri::Cri;
use cnilab_harness::lab::cri::daemon::children_of;
use cnilab_harness::lab::pidfile::Identity;
use cnilab_tests::{host_untouched, require_root, workspace_bin};
use rstest::rstest;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `cnilab ARGS` from the repository root, as root.
fn command(args: &[&str]) -> Command {
    require_root();
    let mut cmd = Command::new(workspace_bin("cnilab"));
    cmd.args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    cmd
}

/// Runs `cnilab ARGS` to its end: its pid, its exit status and all its output.
fn run(args: &[&str]) -> (u32, Output, String) {
    run_command(command(args))
}

fn run_command(mut cmd: Command) -> (u32, Output, String) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cnilab runs");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (pid, out, all)
}

/// Every process whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Every process that runs for the lab whose files are under `dir`:
/// containerds and shims (their command lines name the dir) and the
/// shims' children, as identities (pid + start time).
fn lab_processes(dir: &str) -> Vec<Identity> {
    let mut ids = Vec::new();
    for pid in processes_with(dir) {
        ids.extend(Identity::of(pid));
        ids.extend(children_of(pid).into_iter().filter_map(Identity::of));
    }
    ids
}

/// Waits (up to 10 s) until none of `ids` runs; fails naming those that do.
fn assert_all_gone(ids: &[Identity], context: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while ids.iter().any(Identity::alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each survivor with its command line and state, to say what escaped.
    let alive: Vec<String> = ids
        .iter()
        .filter(|i| i.alive())
        .map(|i| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", i.pid)).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", i.pid)).unwrap_or_default();
            format!(
                "{} ({}) {stat}",
                i.pid,
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            )
        })
        .collect();
    assert!(
        alive.is_empty(),
        "processes of the lab still run: {alive:#?}\n{context}"
    );
}

/// Fails when anything of the lab under `dir` is left: a process naming
/// it, a mount under it, a namespace starting with `ns_prefix`.
fn assert_nothing_left(dir: &str, ns_prefix: &str, context: &str) {
    assert_all_gone(&lab_processes(dir), context);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(dir)).collect();
    assert!(left.is_empty(), "mounts left: {left:?}\n{context}");
    let ns: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with(ns_prefix))
        .collect();
    assert!(ns.is_empty(), "namespaces left: {ns:?}\n{context}");
    let cached = cached_results_of(dir);
    assert!(
        cached.is_empty(),
        "libcni cache entries left: {cached:?}\n{context}"
    );
}

/// The entries of libcni's cache of ADD results (where containerd's CNI
/// calls keep them, /var/lib/cni/results) whose network config names
/// `dir`: the lab's plugin config (its IPAM store is there) for a sandbox
/// whose ADD no DEL undid.
fn cached_results_of(dir: &str) -> Vec<String> {
    use base64::Engine as _;
    let names_dir = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let entry: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let config = entry["config"]
            .as_str()
            .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok())
            .unwrap_or_default();
        String::from_utf8_lossy(&config).contains(dir)
    };
    std::fs::read_dir("/var/lib/cni/results")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| names_dir(&e.path()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// A 2×2 lab (cnilab-bridge, the reference plugins, agent routing) passes
/// every check with its pods made through the CRI, and leaves nothing.
#[rstest]
#[case::cnilab_bridge(&[], "plugin dir (bundled cnilab-bridge)")]
#[case::reference_plugins(&["--topology", "lab/topologies/reference.toml"], "plugin dir /usr/lib/cni")]
#[case::agent_routing(&["--topology", "lab/topologies/agent.toml"], "routes by the agent")]
fn two_by_two_through_the_cri_passes(#[case] extra: &[&str], #[case] shows: &str) {
    let _host = host_untouched();
    let mut args = vec!["lab", "run", "--runtime", "containerd", "-o", "json"];
    args.extend_from_slice(extra);
    let (pid, out, all) = run(&args);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("runtime: containerd"), "{all}");
    assert!(all.contains(shows), "the topology was used: {all}");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("JSON: {e}\n{all}"));
    let groups = report["groups"].as_array().expect("groups");
    assert!(!groups.is_empty(), "{all}");
    for g in groups {
        assert_eq!(g["probes"], g["passed"], "{g}");
        assert!(g["probes"].as_u64().unwrap_or(0) > 0, "{g}");
    }
    assert_nothing_left(
        &format!("/run/cnilab/run-{pid}/"),
        &format!("cnilab-{pid}-"),
        &all,
    );
}

/// `lab up --name <prefix><pid> --runtime containerd EXTRA`: the lab's
/// name and run dir, and what `lab up` said.
fn up_standing(prefix: &str, extra: &[&str]) -> (String, String, Output, String) {
    let name = format!("{prefix}{}", std::process::id());
    let dir = format!("/run/cnilab/labs/{name}/");
    let (_, up, log) = {
        let mut args = vec!["lab", "up", "--name", &name, "--runtime", "containerd"];
        args.extend_from_slice(extra);
        run(&args)
    };
    (name, dir, up, log)
}

/// `lab up --runtime containerd`: each node runs its own containerd; each
/// pod is a CRI sandbox whose pause process holds the very namespace the
/// lab names for the pod; `lab check` passes; `lab down` removes the
/// sandboxes and stops containerd, its shims and the pause processes.
#[test]
fn standing_lab_pods_are_cri_sandboxes() {
    let _host = host_untouched();
    let (name, dir, up, log) = up_standing("c", &["-o", "json"]);
    let down = || run(&["lab", "down", "--name", &name]);
    if !up.status.success() {
        let _ = down();
        panic!("lab up: {log}");
    }
    let state: serde_json::Value = serde_json::from_slice(&up.stdout).expect("JSON");
    let nodes = state["labs"][0]["state"]["nodes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(nodes.len(), 2, "{log}");
    let before = lab_processes(&dir);
    let mut problems = Vec::new();
    for node in &nodes {
        let node_name = node["name"].as_str().unwrap_or_default();
        let socket = PathBuf::from(format!("{dir}{node_name}/cri/sock"));
        let cri = Cri::new(&socket).expect("client");
        let sandboxes = cri.sandboxes().unwrap_or_else(|e| panic!("{e}"));
        let pods = node["pods"].as_array().cloned().unwrap_or_default();
        if sandboxes.len() != pods.len() || pods.len() != 2 {
            problems.push(format!(
                "{node_name}: {} sandboxes for {} pods",
                sandboxes.len(),
                pods.len()
            ));
        }
        for pod in &pods {
            let id = pod["container_id"].as_str().unwrap_or_default();
            let named = Path::new("/run/netns").join(pod["netns"].as_str().unwrap_or_default());
            let ready = sandboxes.iter().any(|s| s.id == id && s.ready);
            let pid = cri.sandbox_pid(id).unwrap_or(0);
            let same = std::fs::metadata(&named)
                .and_then(|a| {
                    std::fs::metadata(format!("/proc/{pid}/ns/net")).map(|b| a.ino() == b.ino())
                })
                .unwrap_or(false);
            if !ready || !same {
                problems.push(format!(
                    "pod {pod}: ready {ready}, netns of pause pid {pid} {same}"
                ));
            }
        }
    }
    let (_, check, check_log) = run(&["lab", "check", "--name", &name]);
    let (_, down_out, down_log) = down();
    assert!(problems.is_empty(), "{problems:?}\n{log}");
    assert!(check.status.success(), "{check_log}");
    assert!(down_out.status.success(), "{down_log}");
    // containerd ×2, 4 shims, 4 pause processes at least.
    assert!(before.len() >= 10, "{before:?}");
    assert_all_gone(&before, &down_log);
    assert_nothing_left(&dir, &format!("cnilab-lab-{name}-"), &down_log);
}

/// Agent routing through the CRI: containerd runs the plugin with the
/// conflist the agent wrote, so that conflist names the node's own IPAM
/// store (the lab's run dir), where the pods' addresses are then kept;
/// without it the plugin would keep them in the host's
/// /var/lib/cni/networks.
#[test]
fn an_agents_conflist_keeps_the_ipam_store_in_the_lab() {
    let _host = host_untouched();
    let (name, dir, up, log) = up_standing("ca", &["--topology", "lab/topologies/agent.toml"]);
    let read = || -> Result<Vec<(String, usize)>, String> {
        let mut out = Vec::new();
        for node in ["node1", "node2"] {
            let path = format!("{dir}{node}/net.d/10-cnilab.conflist");
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
            let c: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
            let data_dir = c["plugins"][0]["ipam"]["dataDir"].as_str().unwrap_or("");
            // The store of network `cnilab`: one file an address held.
            let store = Path::new(data_dir).join("cnilab");
            let held = std::fs::read_dir(&store)
                .map(|d| {
                    d.filter_map(Result::ok)
                        .filter(|e| e.file_name().to_string_lossy().starts_with("10.244."))
                        .count()
                })
                .unwrap_or(0);
            out.push((data_dir.to_string(), held));
        }
        Ok(out)
    };
    let found = read();
    let (_, down, down_log) = run(&["lab", "down", "--name", &name]);
    assert!(up.status.success(), "lab up: {log}");
    let found = found.unwrap_or_else(|e| panic!("{e}\n{log}"));
    for ((data_dir, held), node) in found.iter().zip(["node1", "node2"]) {
        assert_eq!(data_dir, &format!("{dir}{node}/ipam"), "{log}");
        assert_eq!(
            *held, 2,
            "{node}'s two pods hold their addresses in {data_dir}"
        );
    }
    assert!(down.status.success(), "{down_log}");
}

/// One scenario replayed in each runtime (the containerd one adds a node
/// to a running lab, so that node's containerd starts late).
#[rstest]
#[case::direct("direct", "missing-route")]
#[case::containerd("containerd", "missing-route")]
#[case::containerd_node_joins("containerd", "agent-node-joins-late")]
fn a_scenario_behaves_as_written(#[case] runtime: &str, #[case] name: &str) {
    let _host = host_untouched();
    let file = format!("lab/scenarios/{name}.toml");
    let (pid, out, log) = run(&["scenario", "run", &file, "--runtime", runtime]);
    assert!(out.status.success(), "{log}");
    assert!(log.contains(&format!("PASS scenario {name}")), "{log}");
    assert_eq!(
        log.contains("runtime: containerd"),
        runtime == "containerd",
        "{log}"
    );
    assert_nothing_left(
        &format!("/run/cnilab/run-{pid}/"),
        &format!("cnilab-{pid}-"),
        &log,
    );
}

/// Without containerd on PATH the run is an environment error (exit 2) that
/// names the remedy, and creates nothing.
#[test]
fn missing_containerd_is_an_environment_error() {
    let empty = tempfile::tempdir().expect("tmp");
    let mut cmd = command(&["lab", "run", "--runtime", "containerd"]);
    cmd.env("PATH", empty.path());
    let (pid, out, log) = run_command(cmd);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(
        log.contains("containerd") && log.contains("install-deps.sh"),
        "{log}"
    );
    assert_nothing_left(
        &format!("/run/cnilab/run-{pid}/"),
        &format!("cnilab-{pid}-"),
        &log,
    );
    assert!(!Path::new(&format!("/run/cnilab/run-{pid}")).exists());
}

fn is_containerd(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"containerd\0"))
}

/// Whether the containerd of the pidfile at `path` runs (the child writes
/// the pidfile before its exec: only then is it containerd).
fn containerd_runs(path: &Path) -> bool {
    cnilab_harness::lab::pidfile::read(path).is_some_and(|id| is_containerd(id.pid))
}

/// `cnilab ARGS` started with its output discarded.
fn spawn_quiet(args: &[&str]) -> Child {
    command(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs")
}

/// Waits (up to 60 s) until `ready` holds or `child` ended.
fn wait_for(child: &mut Child, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() && Instant::now() < deadline {
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig);
}

/// SIGKILLs `child` once `ready` holds (or it ended), reaps it, and
/// returns the lab processes that ran at the moment of the kill. When
/// `ready` held, a containerd was among them (it outlives the lab process).
fn kill_when(child: &mut Child, dir: &str, ready: impl Fn() -> bool) -> Vec<Identity> {
    wait_for(child, &ready);
    signal(child, nix::sys::signal::Signal::SIGKILL);
    // What ran when the kill landed (the lab process itself is going).
    let running = lab_processes(dir);
    child.wait().expect("reap");
    if ready() {
        let containerd = running.iter().any(|id| is_containerd(id.pid));
        assert!(
            containerd,
            "a started containerd outlives the killed lab: {running:?}"
        );
    }
    running
}

/// `lab run --runtime containerd` SIGKILLed while its containerds run:
/// containerd outlives it (so the sandboxes can still go through the CRI),
/// and `cnilab sweep` leaves no containerd, shim, pause process, mount,
/// namespace or directory of it. Holds wherever the kill lands.
#[test]
fn sweep_after_a_sigkilled_containerd_lab_run() {
    let child = spawn_quiet(&[
        "lab",
        "run",
        "--runtime",
        "containerd",
        "--pods-per-node",
        "4",
    ]);
    let pid = child.id();
    let dir = format!("/run/cnilab/run-{pid}/");
    kill_then_sweep(child, &dir, &format!("cnilab-{pid}-"), None);
}

/// SIGKILLs `child` once node2's containerd runs (or it ended), then runs
/// `cnilab sweep` (and `lab down --name LAB` when `standing` names a lab
/// that had already stood): nothing of the lab under `dir` is left.
fn kill_then_sweep(mut child: Child, dir: &str, ns_prefix: &str, standing: Option<&str>) {
    let pidfile = PathBuf::from(format!("{dir}node2/cri/containerd.pid"));
    let running = kill_when(&mut child, dir, || containerd_runs(&pidfile));
    let (_, sweep, mut log) = run(&["sweep"]);
    assert!(sweep.status.success(), "{log}");
    if let Some(name) = standing.filter(|_| Path::new(dir).join("state.json").exists()) {
        // The kill came after the lab stood: it is a lab like any other.
        let (_, down, down_log) = run(&["lab", "down", "--name", name]);
        log.push_str(&down_log);
        assert!(down.status.success(), "{log}");
    }
    assert_all_gone(&running, &log);
    assert_nothing_left(dir, ns_prefix, &log);
    assert!(!Path::new(dir).exists(), "{dir} left: {log}");
}

/// `lab up --runtime containerd` SIGKILLed while it builds: after
/// `cnilab sweep` (and `lab down` if the lab had already stood) nothing of
/// it is left, wherever the kill lands.
#[test]
fn sweep_after_a_sigkilled_containerd_lab_up() {
    let name = format!("q{}", std::process::id());
    let dir = format!("/run/cnilab/labs/{name}/");
    let child = spawn_quiet(&["lab", "up", "--name", &name, "--runtime", "containerd"]);
    kill_then_sweep(child, &dir, &format!("cnilab-lab-{name}-"), Some(&name));
}

/// A panic while a containerd lab stands (built in this process through the
/// library): unwinding stops each containerd after removing its sandboxes
/// through the CRI, and the namespaces go with the lab.
#[test]
fn a_panic_tears_the_containerd_lab_down() {
    use cnilab_harness::lab::base::RuntimeKind;
    use cnilab_harness::lab::{built::Lab, Topology, UpOptions};
    let _host = host_untouched();
    require_root();
    let run_dir = tempfile::tempdir().expect("run dir");
    let dir = format!("{}/", run_dir.path().display());
    let bin = workspace_bin("cnilab-bridge");
    let opts = UpOptions {
        plugin_dir: bin.parent().map(|d| d.display().to_string()),
        persistent: None,
        run_dir: run_dir.path().to_path_buf(),
        runtime: RuntimeKind::Containerd,
    };
    let topo = Topology::generated(2, 1).expect("topology");
    let mut seen = Vec::new();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let lab = Lab::up(topo, opts).expect("lab up");
        seen = lab_processes(&dir);
        let names: Vec<String> = lab.nodes.iter().map(|n| n.ns.name().to_string()).collect();
        panic!("on purpose, with {names:?} standing");
    }));
    assert!(unwound.is_err());
    // 2 containerds, 2 shims, 2 pause processes.
    assert!(seen.len() >= 6, "{seen:?}");
    assert_all_gone(&seen, "after the panic");
    assert_nothing_left(
        &dir,
        &format!("cnilab-{}-", std::process::id()),
        "after the panic",
    );
}

/// Ctrl-C while pods are being made through the CRI: exit 130, and no
/// containerd, shim, pause process, mount or namespace of the run remains.
/// Holds wherever the interrupt lands.
#[test]
fn ctrl_c_stops_the_containerd_lab() {
    let mut child = spawn_quiet(&[
        "lab",
        "run",
        "--runtime",
        "containerd",
        "--pods-per-node",
        "6",
    ]);
    let pid = child.id();
    let dir = format!("/run/cnilab/run-{pid}/");
    // Until node2's first shim runs (a pod is being made there; `ctr`
    // passes the socket as `--address`, a shim as `-address`).
    let shim = format!("\0-address\0{dir}node2/cri/sock");
    wait_for(&mut child, || !processes_with(&shim).is_empty());
    let running = lab_processes(&dir);
    signal(&child, nix::sys::signal::Signal::SIGINT);
    let status = child.wait().expect("wait");
    // 130 after the interrupt; 0 if the run had already ended.
    assert!(matches!(status.code(), Some(130) | Some(0)), "{status}");
    assert_all_gone(&running, "after Ctrl-C");
    assert_nothing_left(&dir, &format!("cnilab-{pid}-"), "after Ctrl-C");
    assert!(!Path::new(&dir).exists(), "{dir} left");
}
