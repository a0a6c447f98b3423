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
