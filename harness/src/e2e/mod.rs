//! `cnilab e2e`: kind/minikube plans and the in-cluster check.
//!
//! cnilab on real Kubernetes. kind and minikube clusters
//! driven step by step (create, load, deploy, wait, check, dump, delete) from
//! plans that `--dry-run` prints, and an in-cluster connectivity check that
//! works against any cluster (lab/e2e-plan.md is the contract).
//!
//! - `options`: what a run is about, and the pinned versions (with sources);
//! - `cluster`: the IP family and its subnets, kind configs (lab/kind compiled
//!   in, or `--config`), node names;
//! - `manifests`: cnilab's or any CNI's manifests, rendered, and their workloads;
//! - `steps` → `plan` → `runner`: each step as data, printed or executed;
//! - `check/`: the in-cluster check (`access`: the kubeconfig as kubectl finds it);
//! - `vagrant/` (`options` → `mod.rs` → `check`, `node`, `replay`):
//!   `cnilab e2e vagrant`, the offline two-VM lab
//!   (lab/vagrant/offline.rb): its up/down plans, the check between the
//!   VMs, the side that runs inside a VM, and (`--capture DIR`) the VMs
//!   captured, replayed here and the verdicts compared;
//! - `capture`: `cnilab capture` on every node (kind, minikube, or a pod per
//!   node), the files collected into one directory to replay.
//!
//! Here: [`plan_for`] (a step's plan), [`run_step`], [`dry_run_all`]; the
//! command line (`cli/e2e.rs`) runs the sequence, prints and picks exit
//! codes.

pub mod capture;
pub mod check;
pub mod cluster;
pub mod collect;
pub mod manifests;
pub mod options;
pub mod plan;
pub mod runner;
pub mod steps;
pub mod vagrant;

use options::{E2eOptions, Provider, Step};
use plan::Plan;
use runner::Runner;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum E2eError {
    #[error("{0}")]
    Invalid(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed (exit status {}){}", status.map(|s| s.to_string()).unwrap_or_else(|| "none: killed".into()), if stderr.is_empty() { String::new() } else { format!(":\n{stderr}") })]
    Failed {
        command: String,
        status: Option<i32>,
        stderr: String,
    },
    #[error("`{command}` did not finish within {}s{}", after.as_secs(), if stderr.is_empty() { String::new() } else { format!(":\n{stderr}") })]
    Timeout {
        command: String,
        after: Duration,
        stderr: String,
    },
    #[error("{hint}: {cause}")]
    Hint { hint: String, cause: Box<E2eError> },
    #[error("gate `{what}` failed: {cause}")]
    Gate { what: String, cause: Box<E2eError> },
    #[error("Kubernetes API: {0}")]
    Kube(String),
    #[error("building an API object: {0}")]
    Object(#[source] serde_json::Error),
    #[error("the in-cluster check found failures")]
    CheckFailed,
    /// A report file that could not be written.
    #[error("{0}")]
    Write(String),
}

/// A Kubernetes namespace name the check or the capture pods may use.
pub fn check_namespace(namespace: &str) -> Result<(), E2eError> {
    let ok = !namespace.is_empty()
        && namespace.len() <= 63
        && namespace
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(E2eError::Invalid(format!(
            "--namespace {namespace:?}: not a namespace name"
        )))
    }
}

/// The manifests of a run, read and rendered for the cluster.
pub fn rendered(opts: &E2eOptions) -> Result<manifests::Rendered, E2eError> {
    let (files, origin) = manifests::read(opts)?;
    manifests::render(&files, origin, &opts.image, &opts.pod_subnet())
}

/// The plan of a step, reading the manifests when the step needs them.
pub fn plan_for(opts: &E2eOptions, step: Step) -> Result<Plan, E2eError> {
    let rendered = match (step, opts.provider) {
        (Step::Load | Step::Deploy | Step::Wait, _) | (Step::Create, Provider::Minikube) => {
            rendered(opts)?
        }
        // dump must work even with broken manifests: it falls back to the
        // cnilab agent.
        (Step::Dump, _) => rendered(opts).unwrap_or_else(|_| manifests::Rendered {
            files: Vec::new(),
            workloads: vec![manifests::Workload::cnilab_agent()],
        }),
        _ => manifests::Rendered::default(),
    };
    steps::step_plan(opts, step, &rendered)
}

/// Where a `dump` step left its diagnostics, and how many of its commands
/// failed (a dump goes on past a failure).
pub struct Dumped {
    pub dir: PathBuf,
    pub failed: usize,
}

/// Runs one step's plan: strictly, or for `dump` best effort into its
/// directory (then says where).
pub fn run_step(opts: &E2eOptions, step: Step, plan: &Plan) -> Result<Option<Dumped>, E2eError> {
    if step == Step::Dump {
        let dir = opts.dump_dir();
        std::fs::create_dir_all(&dir).map_err(|e| E2eError::Io {
            what: format!("cannot create {}", dir.display()),
            source: e,
        })?;
        let mut runner = Runner::best_effort(dir.join("errors.txt"));
        runner.run(plan)?;
        return Ok(Some(Dumped {
            dir,
            failed: runner.recorded,
        }));
    }
    Runner::strict().run(plan).map(|()| None)
}

/// The whole dry run of `all`: every step, the dump shown as conditional.
pub fn dry_run_all(opts: &E2eOptions) -> Result<String, E2eError> {
    let mut out = String::new();
    for step in steps::SEQUENCE {
        out.push_str(&plan_for(opts, step)?.dry_run());
    }
    out.push_str("# if a step above failed:\n");
    out.push_str(&plan_for(opts, Step::Dump)?.dry_run());
    if !opts.keep {
        out.push_str(&plan_for(opts, Step::Delete)?.dry_run());
    }
    Ok(out)
}
