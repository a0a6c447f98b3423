//! `cnilab e2e …`: real clusters (kind, minikube) and the in-cluster check.

use super::args::CheckOutputArgs;
use super::CliResult;
use crate::e2e::check::CheckOptions;
use crate::e2e::options::{
    E2eOptions, IpFamily, Provider, Step, DEFAULT_IMAGE, DEFAULT_PROBE_IMAGE,
};
use crate::e2e::E2eError;
use crate::util::parse_duration;
use std::path::PathBuf;
use std::time::Duration;

/// Real clusters: kind and minikube step by step, and the in-cluster check.
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab e2e kind --dry-run\n  \
    cnilab e2e check --kubeconfig ~/.kube/config -o junit > e2e.xml\n\n",
    crate::exit_codes_help!()))]
pub struct E2e {
    #[command(subcommand)]
    pub command: E2eCmd,
}

/// Every provider step accepts every option, so a workflow can pass the
/// same flags to each step (lab/e2e-plan.md, "Commands and flags").
#[derive(clap::Subcommand)]
pub enum E2eCmd {
    /// A kind cluster (1 control plane + N workers, no default CNI).
    #[command(after_help = concat!("Examples:\n  \
        cnilab e2e kind\n  \
        cnilab e2e kind create --workers 3 --timeout 5m --dry-run\n\n",
        crate::exit_codes_help!()))]
    Kind(ProviderArgs),
    /// A minikube cluster (docker driver, containerd, --cni=false).
    #[command(after_help = concat!("Examples:\n  \
        cnilab e2e minikube\n  \
        cnilab e2e minikube check -o json\n\n",
        crate::exit_codes_help!()))]
    Minikube(ProviderArgs),
    /// Only the in-cluster connectivity check, against any cluster.
    #[command(after_help = concat!("Examples:\n  \
        cnilab e2e check --kubeconfig ~/.kube/config\n  \
        cnilab e2e check --kubeconfig kc.yaml --ip-family dual -o json --junit e2e.xml\n\n",
        crate::exit_codes_help!()))]
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
    /// Address family of the cluster.
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
    #[command(flatten)]
    pub output: CheckOutputArgs,
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
        o.format = self.output.output;
        o.format = self.output.output;
        o
    }
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Kubeconfig of the cluster to check.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Address family of the probes.
    #[arg(long, value_enum, default_value_t = IpFamily::Ipv4)]
    pub ip_family: IpFamily,
    /// Image of the probe pods (must provide agnhost's netexec, curl and ping).
    #[arg(long, default_value = DEFAULT_PROBE_IMAGE)]
    pub image: String,
    /// Namespace the check creates and deletes.
    #[arg(long, default_value = "cnilab-e2e")]
    pub namespace: String,
    #[command(flatten)]
    pub output: CheckOutputArgs,
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
        o.format = self.output.output;
        o.junit = self.junit.clone();
        o.report = self.report.clone();
        o.timeout = self.timeout;
        o.title = "e2e-check".into();
        o.predicted_nodes = vec!["<node-0>".into(), "<node-1>".into()];
        Ok(o)
    }
}

impl E2e {
    pub fn run(self) -> CliResult {
        let code = match self.command {
            E2eCmd::Kind(a) => crate::e2e::command(&a.options(Provider::Kind), a.step),
            E2eCmd::Minikube(a) => crate::e2e::command(&a.options(Provider::Minikube), a.step),
            E2eCmd::Check(a) => crate::e2e::check_command(&a.options()?, a.dry_run),
        }?;
        Ok(code)
    }
}
