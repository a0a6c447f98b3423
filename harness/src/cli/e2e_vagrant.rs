//! `cnilab e2e vagrant` and its in-VM side `cnilab e2e vagrant-node`.

use super::args::CheckOutputArgs;
use crate::e2e::vagrant::{VagrantOptions, VagrantStep};
use crate::e2e::E2eError;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct VagrantArgs {
    /// Step to run; without one: up, check, then down unless --retain.
    #[arg(value_enum, default_value_t = VagrantStep::All)]
    pub step: VagrantStep,
    /// Names the run (namespace cnilab-vg-<name>); needed by single steps
    /// and --retain [default: cnilab-<pid>-vg, removed by the run].
    #[arg(long)]
    pub name: Option<String>,
    /// The cnilab checkout (Vagrantfile, lab/vagrant).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Directory with the cnilab-bridge, cnilab-agent and cnilab copied into
    /// the VMs [default: this cnilab's own directory].
    #[arg(long, value_name = "DIR")]
    pub bin: Option<PathBuf>,
    /// Keep the VMs (and the namespace) after the check.
    #[arg(long)]
    pub retain: bool,
    /// Print every command, run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// JUnit file of the check.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// JSON report file of the check.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// After the check, capture each VM into DIR/<vm>.json, replay the
    /// captures here as a lab and compare its verdict with the VMs'
    /// (exit 1 when a group differs).
    #[arg(long, value_name = "DIR")]
    pub capture: Option<PathBuf>,
    #[command(flatten)]
    pub output: CheckOutputArgs,
}

impl VagrantArgs {
    pub fn options(&self) -> Result<VagrantOptions, E2eError> {
        let bin = match &self.bin {
            Some(b) => b.clone(),
            None => std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.to_path_buf()))
                .ok_or_else(|| {
                    E2eError::Invalid("cannot find this cnilab's directory: pass --bin DIR".into())
                })?,
        };
        Ok(VagrantOptions {
            repo: self.repo.clone(),
            name: self.name.clone(),
            bin,
            retain: self.retain,
            dry_run: self.dry_run,
            format: self.output.output,
            junit: self.junit.clone(),
            json: self.json.clone(),
            capture: self.capture.clone(),
        })
    }
}

/// Inside a VM of `e2e vagrant` (JSON for the host side).
#[derive(clap::Args)]
pub struct VagrantNodeArgs {
    /// pause-image (the sandbox image tar on stdout) or facts (make the
    /// pods, print them with the node's routes, sysctls and ruleset).
    pub what: String,
    /// Pod names (facts).
    pub pods: Vec<String>,
}
