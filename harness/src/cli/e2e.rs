//! `cnilab e2e …`: real clusters (kind, minikube) and the in-cluster check:
//! the flags, the step sequence (a dump after a failed step, delete unless
//! `--keep`), what is printed and the exit code.

use super::args::CheckOutputArgs;
use super::CliResult;
use crate::e2e::capture::{provider, CaptureOptions, Via, DEFAULT_POD_IMAGE};
use crate::e2e::check::access::Access;
use crate::e2e::check::CheckOptions;
use crate::e2e::cluster::KindConfig;
use crate::e2e::options::{
    E2eOptions, IpFamily, Provider, Step, DEFAULT_IMAGE, DEFAULT_PROBE_IMAGE,
};
use crate::e2e::E2eError;
use crate::util::parse_duration;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Real clusters: kind and minikube step by step, and the in-cluster check.
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab e2e kind --dry-run\n  \
    cnilab e2e check -o junit > e2e.xml\n\n",
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
        cnilab e2e kind create --workers 3 --timeout 5m --dry-run\n  \
        cnilab e2e kind --config my-kind.yaml --cni-manifest kube-flannel.yml\n\n",
        crate::exit_codes_help!()))]
    Kind(ProviderArgs),
    /// A minikube cluster (docker driver, containerd, the manifests as --cni=FILE).
    #[command(after_help = concat!("Examples:\n  \
        cnilab e2e minikube\n  \
        cnilab e2e minikube --cni-manifest calico.yaml --dry-run\n  \
        cnilab e2e minikube check -o json\n\n",
        crate::exit_codes_help!()))]
    Minikube(ProviderArgs),
    /// Only the in-cluster connectivity check, against any cluster.
    #[command(after_help = concat!("Examples:\n  \
        cnilab e2e check                       # $KUBECONFIG or ~/.kube/config, current context\n  \
        cnilab e2e check --context kind-cnilab --ip-family dual -o json\n  \
        cnilab e2e check --kubeconfig kc.yaml --junit e2e.xml\n\n",
        crate::exit_codes_help!()))]
    Check(CheckArgs),
    /// Two VMs (vagrant, libvirt, offline box), pods through each VM's
    /// containerd, probes between them (lab/vagrant/README.md, "Offline mode").
    #[command(after_help = concat!("Examples:\n  \
        cnilab e2e vagrant --dry-run\n  \
        cnilab e2e vagrant -o junit > vagrant.xml\n  \
        cnilab e2e vagrant up --name a && cnilab e2e vagrant check --name a\n\n",
        crate::exit_codes_help!()))]
    Vagrant(super::e2e_vagrant::VagrantArgs),
    /// Runs inside a VM of `e2e vagrant`.
    #[command(hide = true, after_help = concat!("Examples:\n  \
        cnilab e2e vagrant-node pause-image > pause-oci.tar\n  \
        cnilab e2e vagrant-node facts node1-pod0 node1-pod1\n\n",
        crate::exit_codes_help!()))]
    VagrantNode(super::e2e_vagrant::VagrantNodeArgs),
    /// `cnilab capture` on every node of a cluster, the files into one
    /// directory to replay elsewhere (`cnilab lab up --capture DIR/*.json`).
    #[command(after_help = concat!("Examples:\n  \
        cnilab e2e capture kind --name cnilab --out captures/\n  \
        cnilab e2e capture minikube --name cnilab --dry-run\n  \
        cnilab e2e capture pod --context prod --binary ./cnilab-static --out captures/\n\n",
        crate::exit_codes_help!()))]
    Capture(CaptureArgs),
}

#[derive(clap::Args)]
pub struct CaptureArgs {
    /// How to reach the nodes: kind (docker), minikube (minikube ssh/cp),
    /// pod (any cluster: a privileged hostNetwork pod per node, kubectl).
    #[arg(value_enum)]
    pub via: Via,
    /// kind/minikube: the cluster (profile) name.
    #[arg(long, default_value = "cnilab")]
    pub name: String,
    /// kind/minikube: workers besides the control plane (only names the
    /// nodes in --dry-run; a run lists the real ones) [kind: 2, minikube: 1].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Directory of the captures, one `<node>.json` per node
    /// [default: target/cnilab-e2e/<name>/capture].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The cnilab binary copied onto each node; it must run there (a
    /// static build for other distributions) [default: this cnilab].
    #[arg(long, value_name = "FILE")]
    pub binary: Option<PathBuf>,
    /// pod: kubeconfig of the cluster [default: as kubectl finds it].
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// pod: context to use [default: the current one].
    #[arg(long)]
    pub context: Option<String>,
    /// pod: namespace of the capture pods.
    #[arg(long, default_value = "kube-system")]
    pub namespace: String,
    /// pod: image of the capture pods (needs sleep and tar).
    #[arg(long, default_value = DEFAULT_POD_IMAGE)]
    pub image: String,
    /// pod: how long to wait for each capture pod.
    #[arg(long, default_value = "180s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print every command and file, run nothing, write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl CaptureArgs {
    pub fn options(&self) -> Result<CaptureOptions, E2eError> {
        let mut cluster = E2eOptions::new(provider(self.via), &self.name);
        cluster.workers = self.workers;
        cluster.timeout = self.timeout;
        let binary = match &self.binary {
            Some(b) => b.clone(),
            None => std::env::current_exe().map_err(|e| E2eError::Io {
                what: "cannot find this cnilab's binary; give --binary FILE".into(),
                source: e,
            })?,
        };
        Ok(CaptureOptions {
            via: self.via,
            out: self
                .out
                .clone()
                .unwrap_or_else(|| cluster.work_dir().join("capture")),
            cluster,
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            namespace: self.namespace.clone(),
            pod_image: self.image.clone(),
            binary,
        })
    }
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
    /// Kubernetes version [kind: v1.36.1, minikube: v1.35.1].
    #[arg(long)]
    pub k8s_version: Option<String>,
    /// Address family of the cluster [default: ipv4, or the --config's].
    #[arg(long, value_enum)]
    pub ip_family: Option<IpFamily>,
    /// kind only: your own kind config (kubeProxyMode, nodes, subnets, …);
    /// it must set networking.disableDefaultCNI: true [default: lab/kind/<ip-family>.yaml].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// kind node image (default: the digest-pinned image for --k8s-version).
    #[arg(long)]
    pub node_image: Option<String>,
    /// Tag of the cnilab image under test.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// Image archive to load instead of building (docker save output).
    #[arg(long)]
    pub image_archive: Option<PathBuf>,
    /// Directory of cnilab's manifests to deploy (the built-in ones when
    /// lab/manifests is not in the working directory).
    #[arg(long, default_value = "lab/manifests")]
    pub manifests: PathBuf,
    /// Deploy this CNI manifest instead of cnilab's (flannel, calico, your
    /// own); repeat for several files, applied in order. `wait` waits for
    /// every DaemonSet and Deployment in them.
    #[arg(long = "cni-manifest", value_name = "FILE")]
    pub cni_manifests: Vec<PathBuf>,
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
    pub fn options(&self, provider: Provider) -> Result<E2eOptions, E2eError> {
        let mut o = E2eOptions::new(provider, &self.name);
        o.workers = self.workers;
        o.k8s_version = self.k8s_version.clone();
        o.kind_config = self.config.as_deref().map(KindConfig::read).transpose()?;
        o.ip_family = self
            .ip_family
            .or(o.kind_config.as_ref().map(|c| c.ip_family))
            .unwrap_or_default();
        o.node_image = self.node_image.clone();
        o.image = self.image.clone();
        o.image_archive = self.image_archive.clone();
        o.manifests = self.manifests.clone();
        o.cni_manifests = self.cni_manifests.clone();
        o.timeout = self.timeout;
        o.out = self.out.clone();
        o.keep = self.keep;
        o.dry_run = self.dry_run;
        o.probe_image = self.probe_image.clone();
        o.junit = self.junit.clone();
        o.report = self.report.clone();
        o.format = self.output.output;
        Ok(o)
    }
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Kubeconfig of the cluster to check [default: as kubectl: the files
    /// of $KUBECONFIG merged, else ~/.kube/config].
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context to use [default: the kubeconfig's current-context].
    #[arg(long)]
    pub context: Option<String>,
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
        crate::e2e::check_namespace(&self.namespace)?;
        let mut o = CheckOptions::new(Access {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        });
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
            E2eCmd::Kind(a) => command(&a.options(Provider::Kind)?, a.step),
            E2eCmd::Minikube(a) => command(&a.options(Provider::Minikube)?, a.step),
            E2eCmd::Check(a) => check_command(&a.options()?, a.dry_run),
            E2eCmd::Vagrant(a) => {
                crate::e2e::vagrant::command(&a.options()?, a.step, replay_and_check)
            }
            E2eCmd::VagrantNode(a) => {
                crate::e2e::vagrant::node::command(&a.what, &a.pods).map_err(E2eError::Invalid)?;
                Ok(std::process::ExitCode::SUCCESS)
            }
            E2eCmd::Capture(a) => capture_command(&a.options()?, a.dry_run),
        }?;
        Ok(code)
    }
}

/// Runs (or with `--dry-run` prints) one step, saying which.
fn execute(opts: &E2eOptions, step: Step) -> Result<(), E2eError> {
    let plan = crate::e2e::plan_for(opts, step)?;
    if opts.dry_run {
        print!("{}", plan.dry_run());
        return Ok(());
    }
    eprintln!("== cnilab e2e {} {}", opts.provider.as_str(), step.as_str());
    if let Some(d) = crate::e2e::run_step(opts, step, &plan)? {
        eprintln!(
            "cnilab e2e: diagnostics in {} ({} commands failed, see errors.txt)",
            d.dir.display(),
            d.failed
        );
    }
    Ok(())
}

/// `cnilab e2e kind|minikube [STEP]`: exit 0 iff every step passed.
fn command(opts: &E2eOptions, step: Step) -> Result<ExitCode, E2eError> {
    opts.validate()?;
    if step != Step::All {
        return match execute(opts, step) {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(E2eError::CheckFailed) => Ok(ExitCode::FAILURE),
            Err(e) => Err(e),
        };
    }
    if opts.dry_run {
        print!("{}", crate::e2e::dry_run_all(opts)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut failed = None;
    for step in crate::e2e::steps::SEQUENCE {
        if let Err(e) = execute(opts, step) {
            eprintln!("cnilab e2e: {} failed: {e}", step.as_str());
            failed = Some(step);
            break;
        }
    }
    if failed.is_some() {
        if let Err(e) = execute(opts, Step::Dump) {
            eprintln!("cnilab e2e: dump failed: {e}");
        }
    }
    if opts.keep {
        eprintln!(
            "cnilab e2e: keeping the cluster (--keep); kubeconfig {}",
            opts.kubeconfig().display()
        );
    } else if let Err(e) = execute(opts, Step::Delete) {
        eprintln!("cnilab e2e: delete failed: {e}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(match failed {
        None => ExitCode::SUCCESS,
        Some(_) => ExitCode::FAILURE,
    })
}

/// `cnilab e2e check`: exit 0 iff every probe passed.
fn check_command(opts: &CheckOptions, dry_run: bool) -> Result<ExitCode, E2eError> {
    if dry_run {
        println!("# {}", opts.command_line());
        print!("{}", crate::e2e::check::dry_run(opts));
        return Ok(ExitCode::SUCCESS);
    }
    Ok(if crate::e2e::check::run_blocking(opts)? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `cnilab e2e capture`: exit 0 iff every node was captured.
fn capture_command(opts: &CaptureOptions, dry_run: bool) -> Result<ExitCode, E2eError> {
    opts.validate()?;
    let plan = crate::e2e::capture::plan(opts);
    if dry_run {
        print!("{}", plan.dry_run());
        return Ok(ExitCode::SUCCESS);
    }
    crate::e2e::runner::Runner::strict().run(&plan)?;
    eprintln!(
        "cnilab e2e capture: one file per node in {}; replay: cnilab lab up --capture {}/*.json",
        opts.out.display(),
        opts.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `e2e vagrant --capture`'s replay: the VMs' captures as a throwaway lab,
/// checked with the given groups.
fn replay_and_check(
    files: &[std::path::PathBuf],
    groups: &[String],
) -> Result<crate::connectivity::report::Report, String> {
    crate::lab::check_replayed("vagrant", files, groups, false, false).map_err(|e| e.to_string())
}
