//! The identity of the lab model (root): for every topology in
//! `lab/topologies/`, the lab today's builder makes, read back, equals the
//! topology compiled into the model, after the normalising and the
//! structural check of plugin-made state that `harness/src/lab/model/mod.rs`
//! documents. A failure lists every difference by namespace, object and
//! field. Both runtimes: pods made by executing the plugin (`direct`) and
//! through the CRI of a containerd per node (`containerd`, which needs
//! containerd and runc: `lab/install-deps.sh`).

use cnilab_harness::lab::build::Lab;
use cnilab_harness::lab::cri::RuntimeKind;
use cnilab_harness::lab::model::{compile, identity, read};
use cnilab_harness::lab::{Topology, UpOptions};
use cnilab_tests::{host_untouched, require_root, workspace_bin};
use rstest::rstest;
use std::path::PathBuf;
use std::time::Instant;

/// Builds `topo` with the direct runtime (the plugin of its `[plugin]`, else
/// the bundled cnilab-bridge; the agent binary next to it).
fn build(mut topo: Topology, run: &std::path::Path, runtime: RuntimeKind) -> Lab {
    let bin_dir = workspace_bin("cnilab-bridge")
        .parent()
        .map(|d| d.display().to_string());
    if let Some(agent) = topo.agent.as_mut() {
        if agent.command.first().map(String::as_str) == Some("cnilab-agent") {
            agent.command[0] = workspace_bin("cnilab-agent").display().to_string();
        }
    }
    let plugin_dir = topo.plugin.as_ref().and_then(|p| p.dir.clone()).or(bin_dir);
    let opts = UpOptions {
        plugin_dir,
        persistent: None,
        run_dir: run.to_path_buf(),
        runtime,
    };
    Lab::up(topo, opts).expect("lab up")
}

#[rstest]
fn a_built_lab_reads_back_as_its_compiled_model(
    #[files("../lab/topologies/*.toml")] path: PathBuf,
) {
    identity_of(&path, RuntimeKind::Direct);
}

#[rstest]
fn a_containerd_lab_reads_back_as_its_compiled_model(
    #[files("../lab/topologies/*.toml")] path: PathBuf,
) {
    identity_of(&path, RuntimeKind::Containerd);
}

/// Builds the lab of `path`, reads it and compares it with its compiled
/// model; prints how long building and reading took.
fn identity_of(path: &std::path::Path, runtime: RuntimeKind) {
    let _host = host_untouched();
    require_root();
    let topo = Topology::load(path).expect("topology");
    let compiled = compile::compile(&topo).expect("compiles");
    let run = tempfile::tempdir().expect("run dir");
    let started = Instant::now();
    let lab = build(topo.clone(), run.path(), runtime);
    let built = started.elapsed();
    let started = Instant::now();
    let model = read::read(&read::layout_of(&lab)).expect("read");
    let read_took = started.elapsed();
    let expected = identity::expected(&compiled, &model).expect("expected model");
    let differences = identity::differences(&expected, &model);
    // The agent is a step of building: its own table must be there.
    let missing_agent_table: Vec<&str> = match topo.agent {
        Some(_) => model
            .nodes
            .iter()
            .filter(|n| {
                !n.net
                    .nftables
                    .iter()
                    .any(|t| t.family == "inet" && t.name == "cnilab_agent")
            })
            .map(|n| n.net.name.as_str())
            .collect(),
        None => Vec::new(),
    };
    let name = path.file_name().map(|f| f.to_string_lossy().into_owned());
    eprintln!(
        "{name:?} ({runtime:?}): built in {built:?}, read {} namespaces in {read_took:?}",
        model.namespaces().count()
    );
    lab.down();
    assert!(
        differences.is_empty(),
        "{name:?}: read(build(t)) differs from compile(t):\n{}",
        differences.join("\n")
    );
    assert!(
        missing_agent_table.is_empty(),
        "no agent table on {missing_agent_table:?}"
    );
}

/// Runs `cnilab ARGS` from the repository root.
fn cnilab(args: &[&str]) -> std::process::Output {
    require_root();
    std::process::Command::new(workspace_bin("cnilab"))
        .args(args)
        .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("cnilab runs")
}

/// Takes a standing lab down when dropped (also after a failed assert).
struct Standing(String);

impl Drop for Standing {
    fn drop(&mut self) {
        let _ = cnilab(&["lab", "down", "--name", &self.0]);
    }
}

/// `cnilab lab show` prints a standing lab read back into the model: as
/// JSON (the model itself, with its own `schemaVersion`) and as text, one object a
/// line; a lab that is not up is an error that says how to start one.
#[test]
fn lab_show_prints_the_model_of_a_standing_lab() {
    let _host = host_untouched();
    let name = format!("show{}", std::process::id());
    let _down = Standing(name.clone());
    let up = cnilab(&[
        "lab",
        "up",
        "--name",
        &name,
        "--nodes",
        "2",
        "--pods-per-node",
        "1",
    ]);
    let all = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(up.status.success(), "{}", all(&up));
    let json = cnilab(&["lab", "show", "--name", &name, "-o", "json"]);
    assert!(json.status.success(), "{}", all(&json));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let model = &v;
    assert_eq!(model["schemaVersion"], 1);
    assert_eq!(model["name"], name.as_str());
    let node1 = &model["nodes"][0];
    assert_eq!(node1["name"], "node1");
    let eth0 = node1["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "eth0"))
        .expect("node1 has eth0");
    assert_eq!(eth0["addresses"], serde_json::json!(["10.250.0.1/24"]));
    assert_eq!(eth0["veth"]["namespace"], "switch");
    let pod = &node1["pods"][0];
    assert_eq!(pod["name"], "node1-pod0");
    let pod_ip = pod["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == "eth0"))
        .and_then(|l| l["addresses"][0].as_str().map(str::to_string))
        .expect("the pod has an address on eth0");
    assert!(pod_ip.starts_with("10.244.1."), "{pod_ip}");
    let routes = node1["routes"].to_string();
    assert!(routes.contains("10.244.2.0/24"), "{routes}");

    let text = cnilab(&["lab", "show", "--name", &name]);
    assert!(text.status.success(), "{}", all(&text));
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    for line in [
        "node node1 (pod CIDRs 10.244.1.0/24)",
        "link eth0 veth up mtu 1500 peer switch/p-node1 10.250.0.1/24",
        "route 10.244.2.0/24 via 10.250.0.2 dev eth0 proto static scope universe",
    ] {
        assert!(
            text.lines().any(|l| l.trim() == line),
            "no {line:?} in:\n{text}"
        );
    }

    let missing = cnilab(&["lab", "show", "--name", "nosuchlab"]);
    assert_eq!(missing.status.code(), Some(2), "{}", all(&missing));
    assert!(
        all(&missing).contains("cnilab lab up --name nosuchlab"),
        "{}",
        all(&missing)
    );
}
