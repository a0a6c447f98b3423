//! What a `cnilab e2e` run is about: provider, cluster name, versions, IP
//! family, and the paths derived from them (lab/e2e-plan.md, "Commands and
//! flags").

use super::E2eError;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    Kind,
    Minikube,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Kind => "kind",
            Provider::Minikube => "minikube",
        }
    }
}

/// One step of a run; `All` is the whole sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Step {
    All,
    Create,
    Load,
    Deploy,
    Wait,
    Check,
    Dump,
    Delete,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::All => "all",
            Step::Create => "create",
            Step::Load => "load",
            Step::Deploy => "deploy",
            Step::Wait => "wait",
            Step::Check => "check",
            Step::Dump => "dump",
            Step::Delete => "delete",
        }
    }
}

/// The IP family is the cluster's (its pod and Service subnets).
pub use super::cluster::IpFamily;

/// A node image and the kind release that ships it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindNodeImage {
    /// The kind release built for this image (kind supports an image only
    /// with its own release; other pairings are best effort).
    pub kind: &'static str,
    pub k8s: &'static str,
    pub image: &'static str,
    /// Where the digest is written in kind's own source.
    pub source: &'static str,
}

/// The kind release cnilab's plans and workflows are written for.
/// Source: kubernetes-sigs/kind tag v0.32.0 (commit
/// cda67ef8588f6bfdac5358233f2471cb2149ecaf), pkg/cmd/kind/version/version.go
/// `versionCore = "0.32.0"`. (The newest tag in kind's repository is
/// v0.33.0-alpha, a development marker, not a release.)
pub const KIND_VERSION: &str = "v0.32.0";

/// Node images pinned by digest, each the default image of a kind release:
/// the `Image` constant in pkg/apis/config/defaults/image.go at that tag.
/// Only images traced that way are listed; pass `--node-image` for others.
pub const KIND_NODE_IMAGES: &[KindNodeImage] = &[
    KindNodeImage {
        kind: "v0.32.0",
        k8s: "v1.36.1",
        image: "kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b84759d1014dbd78f7ebd5",
        source: "kubernetes-sigs/kind@v0.32.0 (cda67ef8) pkg/apis/config/defaults/image.go",
    },
    KindNodeImage {
        kind: "v0.31.0",
        k8s: "v1.35.0",
        image: "kindest/node:v1.35.0@sha256:452d707d4862f52530247495d180205e029056831160e22870e37e3f6c1ac31f",
        source: "kubernetes-sigs/kind@v0.31.0 (a323333f) pkg/apis/config/defaults/image.go",
    },
];

/// The minikube release of the plans and workflows. Source: kubernetes/minikube
/// tag v1.38.1 (commit c93a4cb9311efc66b90d33ea03f75f2c4120e9b0).
pub const MINIKUBE_VERSION: &str = "v1.38.1";
/// minikube v1.38.1's default Kubernetes: pkg/minikube/constants/constants.go
/// `DefaultKubernetesVersion = "v1.35.1"` (also its NewestKubernetesVersion).
pub const MINIKUBE_K8S_VERSION: &str = "v1.35.1";

pub const DEFAULT_IMAGE: &str = "localhost/cnilab:e2e";
pub const DEFAULT_PROBE_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.53";
/// The tag `lab/manifests/*.yaml` use for the cnilab image.
pub const IMAGE_PLACEHOLDER: &str = "ghcr.io/cnilab/cnilab:dev";

/// Everything a step needs; every step accepts every option.
#[derive(Clone, Debug)]
pub struct E2eOptions {
    pub provider: Provider,
    pub name: String,
    /// Workers besides the control plane (kind default 2, minikube 1).
    pub workers: Option<usize>,
    pub k8s_version: Option<String>,
    pub ip_family: IpFamily,
    pub node_image: Option<String>,
    /// Tag of the cnilab image under test.
    pub image: String,
    pub image_archive: Option<PathBuf>,
    pub manifests: PathBuf,
    /// `--cni-manifest FILE…`: deploy these instead of `manifests` (any CNI).
    pub cni_manifests: Vec<PathBuf>,
    /// `--config FILE`: the user's own kind config (kind only).
    pub kind_config: Option<super::cluster::KindConfig>,
    /// Each gate of `wait`.
    pub timeout: Duration,
    pub out: Option<PathBuf>,
    pub keep: bool,
    pub dry_run: bool,
    /// Image of the check's pods.
    pub probe_image: String,
    pub junit: Option<PathBuf>,
    pub report: Option<PathBuf>,
    /// Output format of the check's report on stdout.
    pub format: crate::report::Format,
}

impl E2eOptions {
    pub fn new(provider: Provider, name: &str) -> E2eOptions {
        E2eOptions {
            provider,
            name: name.to_string(),
            workers: None,
            k8s_version: None,
            ip_family: IpFamily::Ipv4,
            node_image: None,
            image: DEFAULT_IMAGE.to_string(),
            image_archive: None,
            manifests: PathBuf::from(crate::assets::MANIFESTS),
            cni_manifests: Vec::new(),
            kind_config: None,
            timeout: Duration::from_secs(180),
            out: None,
            keep: false,
            dry_run: false,
            probe_image: DEFAULT_PROBE_IMAGE.to_string(),
            junit: None,
            report: None,
            format: crate::report::Format::Table,
        }
    }

    /// Rejects what would make a wrong plan before anything runs.
    pub fn validate(&self) -> Result<(), E2eError> {
        if self.kind_config.is_some() && self.provider != Provider::Kind {
            return Err(E2eError::Invalid(
                "--config is a kind config: only `cnilab e2e kind` takes it".into(),
            ));
        }
        if self.node_image.is_some() && self.provider != Provider::Kind {
            return Err(E2eError::Invalid(
                "--node-image is a kind node image: only `cnilab e2e kind` takes it (minikube: --k8s-version)".into(),
            ));
        }
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 40
            && self
                .name
                .starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !name_ok {
            return Err(E2eError::Invalid(format!(
                "--name {:?}: use 1-40 lowercase letters, digits and '-' (it names the cluster, its nodes and target/cnilab-e2e/<name>)",
                self.name
            )));
        }
        if self.workers() > 20 {
            return Err(E2eError::Invalid(format!(
                "--workers {}: at most 20",
                self.workers()
            )));
        }
        if self.provider == Provider::Minikube && self.ip_family != IpFamily::Ipv4 {
            return Err(E2eError::Invalid(format!(
                "--ip-family {}: the minikube path is IPv4 only (use kind for ipv6 and dual)",
                self.ip_family.as_str()
            )));
        }
        if self.provider == Provider::Kind {
            self.kind_node_image()?;
        }
        if let Some(config) = &self.kind_config {
            if self.ip_family != config.ip_family {
                return Err(E2eError::Invalid(format!(
                    "--ip-family {} but {} sets networking.ipFamily {}: drop one",
                    self.ip_family.as_str(),
                    config.path.display(),
                    config.ip_family.as_str()
                )));
            }
            if let Some(w) = self.workers.filter(|w| *w != config.workers()) {
                return Err(E2eError::Invalid(format!(
                    "--workers {w} but {} has {} workers: drop --workers",
                    config.path.display(),
                    config.workers()
                )));
            }
        }
        Ok(())
    }

    /// The cluster's pod network (the agent's CNILAB_CLUSTER_CIDR).
    pub fn pod_subnet(&self) -> String {
        match &self.kind_config {
            Some(c) => c.pod_subnet.clone(),
            None => self.ip_family.pod_subnet().to_string(),
        }
    }

    pub fn workers(&self) -> usize {
        if let Some(c) = &self.kind_config {
            return c.workers();
        }
        self.workers.unwrap_or(match self.provider {
            Provider::Kind => 2,
            Provider::Minikube => 1,
        })
    }

    /// `v1.36.1`, whether or not the user wrote the `v`.
    pub fn k8s_version(&self) -> String {
        let v = self.k8s_version.clone().unwrap_or_else(|| {
            match self.provider {
                Provider::Kind => KIND_NODE_IMAGES[0].k8s,
                Provider::Minikube => MINIKUBE_K8S_VERSION,
            }
            .to_string()
        });
        if v.starts_with('v') {
            v
        } else {
            format!("v{v}")
        }
    }

    pub fn kind_node_image(&self) -> Result<String, E2eError> {
        if let Some(image) = &self.node_image {
            return Ok(image.clone());
        }
        let version = self.k8s_version();
        KIND_NODE_IMAGES
            .iter()
            .find(|i| i.k8s == version)
            .map(|i| i.image.to_string())
            .ok_or_else(|| {
                let known: Vec<String> = KIND_NODE_IMAGES
                    .iter()
                    .map(|i| format!("{} (kind {})", i.k8s, i.kind))
                    .collect();
                E2eError::Invalid(format!(
                    "--k8s-version {version}: cnilab pins node images only for {}; pass --node-image kindest/node:{version}@sha256:<digest> from the release notes of your kind",
                    known.join(", ")
                ))
            })
    }

    /// `target/cnilab-e2e/<name>`.
    pub fn work_dir(&self) -> PathBuf {
        PathBuf::from("target/cnilab-e2e").join(&self.name)
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.work_dir().join("kubeconfig")
    }

    /// `target/cnilab-reports/e2e-<provider>-<name>`.
    pub fn reports_dir(&self) -> PathBuf {
        PathBuf::from("target/cnilab-reports").join(format!(
            "e2e-{}-{}",
            self.provider.as_str(),
            self.name
        ))
    }

    pub fn dump_dir(&self) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| self.work_dir().join("diag"))
    }

    /// The archive `load` reads: the given one, or the one it builds.
    pub fn archive(&self) -> PathBuf {
        self.image_archive
            .clone()
            .unwrap_or_else(|| self.work_dir().join("cnilab-image.tar"))
    }

    /// Node names the provider will give, in creation order.
    pub fn predicted_nodes(&self) -> Vec<String> {
        let total = self.workers() + 1;
        match self.provider {
            Provider::Kind => match &self.kind_config {
                Some(c) => super::cluster::kind_node_names(&self.name, &c.roles),
                None => super::cluster::kind_node_names(
                    &self.name,
                    &super::cluster::default_roles(self.workers()),
                ),
            },
            Provider::Minikube => (0..total)
                .map(|i| match i {
                    0 => self.name.clone(),
                    n => format!("{}-m{:02}", self.name, n + 1),
                })
                .collect(),
        }
    }
}

/// Durations are written one way everywhere (`180s`, `3m`).
pub use crate::util::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("180s"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn predicted_names() {
        let kind = E2eOptions::new(Provider::Kind, "c");
        assert_eq!(
            kind.predicted_nodes(),
            ["c-control-plane", "c-worker", "c-worker2"]
        );
        let mut mk = E2eOptions::new(Provider::Minikube, "m");
        assert_eq!(mk.predicted_nodes(), ["m", "m-m02"]);
        mk.workers = Some(2);
        assert_eq!(mk.predicted_nodes(), ["m", "m-m02", "m-m03"]);
    }

    #[test]
    fn validation() {
        let mut o = E2eOptions::new(Provider::Kind, "../etc");
        assert!(o.validate().is_err());
        o.name = "ok-1".into();
        assert!(o.validate().is_ok());
        o.k8s_version = Some("1.30.0".into());
        let err = o
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("--node-image"), "{err}");
        o.node_image = Some("kindest/node:v1.30.0".into());
        assert!(o.validate().is_ok());
        let mut mk = E2eOptions::new(Provider::Minikube, "m");
        mk.ip_family = IpFamily::Dual;
        assert!(mk.validate().is_err());
    }
}
