//! `cnilab lab`: a multi-node data plane in namespaces, checked end to end.
//!
//! A multi-node cluster's data plane simulated in network
//! namespaces, with real kernel objects, the real plugin binary and real
//! routes and firewall rules; a connectivity matrix with diagnoses. Bug
//! scenarios (`crate::scenario`) and `cnilab sweep` (`crate::sweep`) build
//! on it; the command line (`cli/lab.rs`) prints and picks exit codes.
//!
//! Where things happen, floor by floor (each file imports only from the
//! floors below it): [`topology`] (TOML or flags, validated; the shapes'
//! settings and flags in `topology/shapes.rs`) and [`base`] (errors, options,
//! namespace/netlink/nft helpers, where the bundled programs are); then
//! [`template`] (config templates and their placeholders), [`recipe`] (what
//! a lab needs besides its topology, found and checked once: plugin
//! directory, template, pod MTU, containerd), [`built`] (`Lab`,
//! `Node`, `Pod`: what a built lab is made of), [`routes`] (node addresses, static routes, the
//! masquerade ruleset, the agents' node list) and [`facts`] (what the
//! diagnosis reads from a node); then the builder's steps, and [`build`] on
//! top (the one builder: the topology compiled by [`compile`] and made into
//! namespaces by `crate::model::apply`, then the agents, the pods through
//! the runtime, the Services); [`neighbours`] (the host's neighbour tables: the
//! fit, pinning, `--tune-host`, the overflow watch), [`checks`] (the check
//! groups and the probes of the catalogue and the Services), [`send`] (the
//! responders, the probes sent and each reply judged) and [`probe`] (sockets
//! in namespaces), [`diagnose`] (node rules) and [`diagnose_path`] (rules
//! along a probe's path, detour warnings), [`tally`] (a check's report),
//! [`state`] and [`pidfile`] (standing labs), [`profile`]
//! (`CNILAB_PROFILE_ATTACH`: where the pods' attach goes); underlay shapes
//! (routed, NAT) in [`underlay`], the VXLAN overlay in [`vxlan`],
//! kube-proxy-like Services in [`services`], real kube-proxy chains'
//! Services (read from captures, probed, diagnosed) in [`kube_proxy`]; a
//! topology compiled into the model of what the builder makes in
//! [`compile`] (the model itself, its reader, `apply` and the identity sit
//! a floor below, in `crate::model`), the lab's namespaces by role in
//! [`layout`]; captured nodes (`crate::capture`) stood up as a lab in
//! [`replay`] (`lab up --capture`;
//! its external host where the nodes' default routes lead in [`outside`],
//! each node's uplink and its other NICs in [`uplinks`]),
//! and [`trace`] (`lab trace`: FROM/TO and the lab's namespaces resolved for
//! the tracer in `crate::trace`). Pods are attached by
//! executing the plugin (`direct`) or, with `--runtime containerd`, through
//! the CRI of a containerd per node ([`cri`]). Here: [`check`] and [`run`]
//! (up, check, down), and what Ctrl-C removes of a lab
//! ([`cleanup_on_interrupt`], on `crate::interrupt`'s watcher).

pub mod base;
pub mod build;
pub mod built;
pub mod checks;
pub mod compile;
pub mod cri;
pub mod diagnose;
pub mod diagnose_path;
pub mod facts;
pub mod kube_proxy;
pub mod layout;
pub mod neighbours;
pub mod outside;
pub mod pidfile;
pub mod probe;
pub mod profile;
pub mod recipe;
pub mod replay;
mod replay_pods;
pub mod routes;
pub mod send;
pub mod services;
pub mod state;
pub mod tally;
pub mod template;
pub mod topology;
pub mod trace;
pub mod underlay;
pub mod uplinks;
pub mod vxlan;

#[cfg(test)]
mod model_tests;

use built::Lab;
use report::Report;
use std::time::{Duration, Instant};

/// The report lives with the connectivity checks (e2e writes the same one).
pub use crate::connectivity::report;
pub use base::{LabError, UpOptions};
pub use topology::Topology;

/// On Ctrl-C, remove the lab (see [`crate::interrupt`]): its sandboxes
/// first, the host's neighbour tables restored, its namespaces (this
/// process's, and those `extra` names: a standing lab's) and scratch run
/// directory removed.
pub fn cleanup_on_interrupt(extra: Option<crate::interrupt::NamespaceFilter>) {
    crate::interrupt::cleanup_on_interrupt(crate::interrupt::Teardown {
        first: cri::daemon::stop_all_started,
        then: neighbours::restore_host,
        extra,
        run_dir: scratch_run_dir(),
    });
}

/// [`cleanup_on_interrupt`] for `lab up --name NAME` (compiled or
/// replayed) of `nodes`: the namespaces the lab's ledger proves its own go,
/// and so does its run directory (a killed `lab up` leaves nothing behind).
pub fn cleanup_standing_on_interrupt(name: &str, nodes: Vec<String>) {
    let lab = name.to_string();
    crate::interrupt::cleanup_on_interrupt(crate::interrupt::Teardown {
        first: cri::daemon::stop_all_started,
        then: neighbours::restore_host,
        extra: Some(Box::new(move |ns: &str| {
            state::owns(&state::run_dir(&lab), &lab, &nodes, ns)
        })),
        run_dir: state::run_dir(name),
    });
}

/// Replays `files` as a throwaway lab (a scratch run directory), checks
/// `groups` on it and tears it down, the run directory too: `lab run
/// --capture` and `e2e vagrant --capture`. The report lists what the
/// replay could not make here (`not_made`).
pub fn check_replayed(
    name: &str,
    files: &[std::path::PathBuf],
    groups: &[String],
    progress: bool,
    tune_host: bool,
) -> Result<Report, LabError> {
    let prepared = replay::prepare(name, files, tune_host)?;
    // Restores the thresholds when dropped (and the Ctrl-C handler does).
    let _tuning = neighbours::HostTuning::apply(&prepared.host).map_err(LabError::Setup)?;
    let opts = UpOptions {
        plugin_dir: None,
        persistent: None,
        run_dir: scratch_run_dir(),
        runtime: base::RuntimeKind::Direct,
    };
    let run_dir = opts.run_dir.clone();
    let checked = replay::build_prepared(prepared, opts).and_then(|(lab, replayed)| {
        let report = check(&lab, groups, progress);
        lab.down();
        let mut report = report?;
        report.not_made = replayed.not_made;
        Ok(report)
    });
    replay::forget_run_dir(&run_dir);
    checked
}

/// Runs the connectivity matrix on a standing lab and diagnoses failures:
/// the probe plan ([`checks`]), sent and judged ([`send`]), the failures'
/// causes by rule ([`diagnose`]), then by trace where no rule explains
/// ([`trace`]), and the report ([`tally`]).
pub fn check(lab: &Lab, groups: &[String], progress: bool) -> Result<Report, LabError> {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| LabError::Setup(format!("tokio runtime: {e}")))?;
    let probes = checks::probes(lab, groups).map_err(LabError::Setup)?;
    let neighbours_before = facts::neighbours_before(lab);
    let bar = if progress {
        crate::report::progress::Progress::stderr()
    } else {
        crate::report::progress::Progress::quiet()
    };
    let show = |done: usize, total: usize| {
        if done == total {
            bar.clear();
        } else if done.is_multiple_of(25) {
            bar.status(&format!("⌛ probes {done}/{total}"));
        }
    };
    let watch = neighbours::Watch::start();
    let outcomes = send::run(lab, &probes, &rt, 256, &show).map_err(LabError::Setup)?;
    let host_limits = vec![watch.verdict(&outcomes), watch.backlog()];
    let (mut failures, mut warnings) = diagnose::failures(lab, &outcomes, neighbours_before);
    // What no rule explains is traced (while the responders still run).
    warnings.extend(trace::explain(lab, &mut failures));
    // Wait until the responders' tasks are dropped, so their sockets are
    // closed before the next check binds the same port (a background
    // shutdown let a scenario's second check race the first's UDP socket:
    // "Address already in use"). Bounded: a stuck probe cannot hang the run.
    rt.shutdown_timeout(Duration::from_secs(5));
    let checked = tally::Checked {
        outcomes,
        failures,
        host_limits,
        warnings,
        sampled: probes.sampled,
        started,
    };
    Ok(tally::report(lab, groups, checked))
}

/// `cnilab lab run`: up, check, down.
pub fn run(
    topo: Topology,
    opts: UpOptions,
    groups: &[String],
    progress: bool,
) -> Result<Report, LabError> {
    let recipe = recipe::Recipe::new(topo, opts.plugin_dir.as_deref(), opts.runtime)?;
    run_recipe(
        recipe,
        opts,
        groups,
        progress,
        &neighbours::HostFit::default(),
    )
}

/// [`run`] of a [`recipe::Recipe`], with how the lab fits the host's neighbour
/// tables (pinning the bulk paths when the lab would not fit them).
pub fn run_recipe(
    recipe: recipe::Recipe,
    opts: UpOptions,
    groups: &[String],
    progress: bool,
    host: &neighbours::HostFit,
) -> Result<Report, LabError> {
    let mut lab = Lab::build(recipe, opts)?;
    pin_if_needed(&mut lab, host)?;
    let report = check(&lab, groups, progress);
    let down = lab.down();
    let mut report = report?;
    report.add_phase("down", down);
    Ok(report)
}

/// Pins the bulk probe paths when `host` says so (see [`neighbours`]).
pub fn pin_if_needed(lab: &mut Lab, host: &neighbours::HostFit) -> Result<(), LabError> {
    if host.pin {
        let started = Instant::now();
        neighbours::pin_bulk(lab)?;
        lab.phases.push(("pin".into(), started.elapsed()));
    }
    Ok(())
}

/// The default run directory of a throwaway lab.
pub fn scratch_run_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/run/cnilab/run-{}", std::process::id()))
}
