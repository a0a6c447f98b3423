//! The `cnilab e2e` command line (lab/e2e-plan.md, "Commands and flags").
//! Every provider step accepts every option, so a workflow can pass the
//! same flags to each step.

use super::check::{CheckFormat, CheckOptions};
use super::options::{
    parse_duration, E2eOptions, IpFamily, Provider, Step, DEFAULT_IMAGE, DEFAULT_PROBE_IMAGE,
};
use super::E2eError;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum E2eCmd {
    /// A kind cluster (1 control plane + N workers, no default CNI).
    Kind(ProviderArgs),
    /// A minikube cluster (docker driver, containerd, --cni=false).
    Minikube(ProviderArgs),
    /// Only the in-cluster connectivity check, against any cluster.
    Check(CheckArgs),
}

#[derive(clap::Args)]
pub struct ProviderArgs {
    /// Step to run; without one: create, load, deploy, wait, check, then
    /// dump on failure and delete unless --keep.
    #[arg(value_enum, default_value_t = Step::All)]
    pub step: Step,
    /// Cluster (profile) name; also names target/cnilab-e2e/<name>.
    #[arg(long, default_value = "cnilab")]
    pub name: String,
    /// Workers besides the control plane [kind: 2, minikube: 1].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Kubernetes version [kind: v1.37.0, minikube: v1.34.0].
    #[arg(long)]
    pub k8s_version: Option<String>,
    #[arg(long, value_enum, default_value_t = IpFamily::Ipv4)]
    pub ip_family: IpFamily,
    /// kind node image (default: the digest-pinned image for --k8s-version).
    #[arg(long)]
    pub node_image: Option<String>,
    /// Tag of the cnilab image under test.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// Image archive to load instead of building (docker save output).
    #[arg(long)]
    pub image_archive: Option<PathBuf>,
    /// Directory of the manifests to deploy.
    #[arg(long, default_value = "lab/manifests")]
    pub manifests: PathBuf,
    /// Timeout of each wait gate (180s, 3m, ...).
    #[arg(long, default_value = "180s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Directory for `dump` [default: target/cnilab-e2e/<name>/diag].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep the cluster after a full run.
    #[arg(long)]
    pub keep: bool,
    /// Print every command and file, run nothing, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Image of the check's probe pods (must provide agnhost's netexec, curl and ping).
    #[arg(long, default_value = DEFAULT_PROBE_IMAGE)]
    pub probe_image: String,
    /// JUnit file of the check [default: target/cnilab-reports/e2e-<provider>-<name>/junit.xml].
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// HTML report of the check [default: …/report.html].
    #[arg(long)]
    pub report: Option<PathBuf>,
}

impl ProviderArgs {
    pub fn options(&self, provider: Provider) -> E2eOptions {
        let mut o = E2eOptions::new(provider, &self.name);
        o.workers = self.workers;
        o.k8s_version = self.k8s_version.clone();
        o.ip_family = self.ip_family;
        o.node_image = self.node_image.clone();
        o.image = self.image.clone();
        o.image_archive = self.image_archive.clone();
        o.manifests = self.manifests.clone();
        o.timeout = self.timeout;
        o.out = self.out.clone();
        o.keep = self.keep;
        o.dry_run = self.dry_run;
        o.probe_image = self.probe_image.clone();
        o.junit = self.junit.clone();
        o.report = self.report.clone();
        o
    }
}

#[derive(clap::Args)]
pub struct CheckArgs {
    #[arg(long)]
    pub kubeconfig: PathBuf,
    #[arg(long, value_enum, default_value_t = IpFamily::Ipv4)]
    pub ip_family: IpFamily,
    /// Image of the probe pods (must provide agnhost's netexec, curl and ping).
    #[arg(long, default_value = DEFAULT_PROBE_IMAGE)]
    pub image: String,
    /// Namespace the check creates and deletes.
    #[arg(long, default_value = "cnilab-e2e")]
    pub namespace: String,
    #[arg(long, value_enum, default_value_t = CheckFormat::Table)]
    pub format: CheckFormat,
    /// Also write JUnit XML to this file.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Also write a self-contained HTML report to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// How long to wait for the probe pods.
    #[arg(long, default_value = "180s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print the objects and probes, create nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl CheckArgs {
    pub fn options(&self) -> Result<CheckOptions, E2eError> {
        let ns_ok = !self.namespace.is_empty()
            && self.namespace.len() <= 63
            && self
                .namespace
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ns_ok {
            return Err(E2eError::Invalid(format!(
                "--namespace {:?}: not a namespace name",
                self.namespace
            )));
        }
        let mut o = CheckOptions::new(self.kubeconfig.clone());
        o.ip_family = self.ip_family;
        o.probe_image = self.image.clone();
        o.namespace = self.namespace.clone();
        o.format = self.format;
        o.junit = self.junit.clone();
        o.report = self.report.clone();
        o.timeout = self.timeout;
        o.title = "e2e-check".into();
        o.predicted_nodes = vec!["<node-0>".into(), "<node-1>".into()];
        Ok(o)
    }
}

pub fn dispatch(cmd: E2eCmd) -> Result<ExitCode, E2eError> {
    match cmd {
        E2eCmd::Kind(a) => super::command(&a.options(Provider::Kind), a.step),
        E2eCmd::Minikube(a) => super::command(&a.options(Provider::Minikube), a.step),
        E2eCmd::Check(a) => super::check_command(&a.options()?, a.dry_run),
    }
}
