//! `cnilab e2e vagrant`'s options: what a run is (its name, namespace,
//! binaries, outputs) and how its commands reach vagrant (inside the run's
//! namespace, with the offline Vagrantfile). Below both the plans
//! (`mod.rs`) and the check between the VMs (`check.rs`).

use crate::e2e::plan::Cmd;
use crate::e2e::E2eError;
use crate::report::Format;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The name `vagrant box add` gives the offline box (offline.rb uses it).
pub const BOX_NAME: &str = "cnilab/bookworm-offline";
/// Where env.sh keeps run directories (its CNILAB_VAGRANT_RUN_ROOT default).
pub const RUN_ROOT: &str = "/var/tmp/cnilab-vagrant";
/// Namespaces of runs: `cnilab-<pid>-vg` and `cnilab-vg-<name>`.
pub(super) const SUFFIX: &str = "-vg";
const NAMED: &str = "cnilab-vg-";

pub(super) const SHORT: Duration = Duration::from_secs(120);
/// The box build (mmdebstrap, a first boot under TCG) and `vagrant up`.
pub(super) const LONG: Duration = Duration::from_secs(1800);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VagrantStep {
    /// up, check, then down unless --retain.
    All,
    /// Box, namespace, libvirtd, `vagrant up` of node1 and node2.
    Up,
    /// Pods in each VM through its containerd, probes between them.
    Check,
    /// `vagrant destroy`, every process of the namespace, the namespace.
    Down,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VagrantOptions {
    /// The checkout with the Vagrantfile and lab/vagrant.
    pub repo: PathBuf,
    /// `--name`: the run's namespace is `cnilab-vg-<name>`; without one it
    /// is `cnilab-<pid>-vg`, which only a whole run (`all`) may use.
    pub name: Option<String>,
    /// Directory of cnilab-bridge, cnilab-agent and cnilab copied into the VMs.
    pub bin: PathBuf,
    pub retain: bool,
    pub dry_run: bool,
    pub format: Format,
    pub junit: Option<PathBuf>,
    pub json: Option<PathBuf>,
    /// `--capture DIR`: after the check, each VM captured into
    /// `DIR/<vm>.json` and replayed here (`replay.rs`).
    pub capture: Option<PathBuf>,
}

impl VagrantOptions {
    /// The run's network namespace.
    pub fn namespace(&self) -> String {
        match &self.name {
            Some(n) => format!("{NAMED}{n}"),
            None => format!("{}{}{SUFFIX}", crate::netns::PREFIX, std::process::id()),
        }
    }

    pub fn validate(&self, step: VagrantStep) -> Result<(), E2eError> {
        if let Some(n) = &self.name {
            let ok = !n.is_empty()
                && n.len() <= 8
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            if !ok {
                return Err(E2eError::Invalid(format!(
                    "--name {n:?}: use 1 to 8 lowercase letters or digits (it names the namespace cnilab-vg-<name>)"
                )));
            }
        } else if step != VagrantStep::All || self.retain {
            return Err(E2eError::Invalid(
                "a run that outlives this process (a single step, or --retain) needs --name NAME: \
                 `cnilab e2e vagrant up --name a`, then `check --name a`, `down --name a`"
                    .into(),
            ));
        }
        if !self.dry_run && !self.repo.join("lab/vagrant/env.sh").is_file() {
            return Err(E2eError::Invalid(format!(
                "{}: no lab/vagrant/env.sh here; run from the cnilab checkout or pass --repo DIR",
                self.repo.display()
            )));
        }
        Ok(())
    }

    pub(super) fn script(&self, name: &str) -> String {
        path(&self.repo.join("lab/vagrant").join(name))
    }

    /// Where the box link and reports go: target/cnilab-e2e/vagrant-<ns>.
    pub fn work_dir(&self) -> PathBuf {
        self.repo
            .join("target/cnilab-e2e")
            .join(format!("vagrant-{}", self.namespace()))
    }

    /// `vagrant ARGS` inside the run's namespace, with the offline Vagrantfile.
    pub fn vagrant(&self) -> Cmd {
        Cmd::new("bash")
            .env("VAGRANT_CWD", path(&self.repo))
            .env("CNILAB_VAGRANT_MODE", "offline")
            .env("CNILAB_VAGRANT_BIN", path(&self.bin))
            .args([self.script("env.sh"), "exec".into(), self.namespace()])
            .arg("vagrant")
    }
}

pub(super) fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}
