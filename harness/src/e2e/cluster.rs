//! The cluster's shape: its IP family (pod and Service subnets), and for
//! kind the default configs (lab/kind/*.yaml,
//! compiled in, so the files and the code cannot drift apart), the user's
//! own `--config`, and the node names kind gives (in config order, named
//! as kind's pkg/cluster/internal/providers/common/namer.go does).

use super::E2eError;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IpFamily {
    #[default]
    Ipv4,
    Ipv6,
    Dual,
}

impl IpFamily {
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "ipv4",
            IpFamily::Ipv6 => "ipv6",
            IpFamily::Dual => "dual",
        }
    }

    /// The cluster's pod network (also the agent's CNILAB_CLUSTER_CIDR).
    pub fn pod_subnet(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "10.244.0.0/16",
            IpFamily::Ipv6 => "fd00:10:244::/56",
            IpFamily::Dual => "10.244.0.0/16,fd00:10:244::/56",
        }
    }

    pub fn service_subnet(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "10.96.0.0/16",
            IpFamily::Ipv6 => "fd00:10:96::/112",
            IpFamily::Dual => "10.96.0.0/16,fd00:10:96::/112",
        }
    }

    /// Whether probes run over IPv4 and IPv6, in that order.
    pub fn families(self) -> (bool, bool) {
        match self {
            IpFamily::Ipv4 => (true, false),
            IpFamily::Ipv6 => (false, true),
            IpFamily::Dual => (true, true),
        }
    }
}

/// lab/kind/<family>.yaml: 1 control plane + 2 workers, no default CNI.
const DEFAULT_CONFIGS: [(IpFamily, &str); 3] = [
    (IpFamily::Ipv4, include_str!("../../../lab/kind/ipv4.yaml")),
    (IpFamily::Ipv6, include_str!("../../../lab/kind/ipv6.yaml")),
    (IpFamily::Dual, include_str!("../../../lab/kind/dual.yaml")),
];

const WORKER_LINE: &str = "  - role: worker";

/// The config `create` writes when the user gives none: lab/kind/<family>.yaml
/// with its worker lines replaced by `workers` of them (unchanged for 2).
pub fn default_kind_config(family: IpFamily, workers: usize) -> String {
    let text = DEFAULT_CONFIGS
        .iter()
        .find(|(f, _)| *f == family)
        .map(|(_, t)| *t)
        .unwrap_or(DEFAULT_CONFIGS[0].1);
    let mut out = String::new();
    for line in text.lines().filter(|l| l.trim_end() != WORKER_LINE) {
        out.push_str(line);
        out.push('\n');
    }
    for _ in 0..workers {
        out.push_str(WORKER_LINE);
        out.push('\n');
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    ControlPlane,
    Worker,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::ControlPlane => "control-plane",
            Role::Worker => "worker",
        }
    }
}

/// What cnilab needs to know of a kind config (`--config FILE`); kind
/// itself reads the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindConfig {
    pub path: PathBuf,
    pub ip_family: IpFamily,
    /// `networking.podSubnet`, or kind's default for the family
    /// (pkg/apis/config/v1alpha4/default.go).
    pub pod_subnet: String,
    pub roles: Vec<Role>,
}

impl KindConfig {
    pub fn read(path: &Path) -> Result<KindConfig, E2eError> {
        let text = std::fs::read_to_string(path).map_err(|e| E2eError::Io {
            what: format!("cannot read the kind config {}", path.display()),
            source: e,
        })?;
        KindConfig::parse(path, &text)
    }

    /// Refuses a config cnilab cannot run a CNI on (kindnet left on) and
    /// what kind itself would refuse, before any cluster exists.
    pub fn parse(path: &Path, text: &str) -> Result<KindConfig, E2eError> {
        let bad = |why: String| E2eError::Invalid(format!("--config {}: {why}", path.display()));
        let doc: serde_json::Value =
            serde_norway::from_str(text).map_err(|e| bad(format!("not valid YAML: {e}")))?;
        if doc["kind"] != "Cluster" || doc["apiVersion"] != "kind.x-k8s.io/v1alpha4" {
            return Err(bad(
                "not a kind config (want `kind: Cluster` and `apiVersion: kind.x-k8s.io/v1alpha4`)"
                    .into(),
            ));
        }
        let net = &doc["networking"];
        if net["disableDefaultCNI"] != true {
            return Err(bad(
                "networking.disableDefaultCNI is not true, so kind would install kindnet beside the CNI under test; add `disableDefaultCNI: true` under `networking:`".into(),
            ));
        }
        let ip_family = match net["ipFamily"].as_str() {
            None => IpFamily::Ipv4,
            Some(s) => match s.to_ascii_lowercase().as_str() {
                "ipv4" => IpFamily::Ipv4,
                "ipv6" => IpFamily::Ipv6,
                "dual" => IpFamily::Dual,
                other => {
                    return Err(bad(format!(
                        "networking.ipFamily {other:?}: want ipv4, ipv6 or dual"
                    )))
                }
            },
        };
        let pod_subnet = match &net["podSubnet"] {
            serde_json::Value::Null => ip_family.pod_subnet().to_string(),
            serde_json::Value::String(s) if !s.trim().is_empty() => s.replace(' ', ""),
            other => {
                return Err(bad(format!(
                    "networking.podSubnet {other}: want a CIDR list"
                )))
            }
        };
        let roles = match &doc["nodes"] {
            serde_json::Value::Null => vec![Role::ControlPlane],
            serde_json::Value::Array(nodes) => nodes
                .iter()
                .map(|n| match n["role"].as_str() {
                    None | Some("control-plane") => Ok(Role::ControlPlane),
                    Some("worker") => Ok(Role::Worker),
                    Some(other) => Err(bad(format!(
                        "node role {other:?}: want control-plane or worker"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(bad("nodes is not a list".into())),
        };
        if !roles.contains(&Role::ControlPlane) {
            return Err(bad("no control-plane node".into()));
        }
        Ok(KindConfig {
            path: path.to_path_buf(),
            ip_family,
            pod_subnet,
            roles,
        })
    }

    pub fn workers(&self) -> usize {
        self.roles.iter().filter(|r| **r == Role::Worker).count()
    }
}

/// The Kubernetes node names kind gives, in config order: the first of a
/// role is `<cluster>-<role>`, the next `<cluster>-<role>2`, …
pub fn kind_node_names(cluster: &str, roles: &[Role]) -> Vec<String> {
    let mut seen = [0usize; 2];
    roles
        .iter()
        .map(|r| {
            let n = &mut seen[*r as usize];
            *n += 1;
            match *n {
                1 => format!("{cluster}-{}", r.as_str()),
                k => format!("{cluster}-{}{k}", r.as_str()),
            }
        })
        .collect()
}

/// The roles of the default config with `workers` workers.
pub fn default_roles(workers: usize) -> Vec<Role> {
    std::iter::once(Role::ControlPlane)
        .chain(std::iter::repeat_n(Role::Worker, workers))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<KindConfig, String> {
        KindConfig::parse(Path::new("c.yaml"), text).map_err(|e| e.to_string())
    }

    const HEAD: &str = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n";

    #[test]
    fn default_configs_are_the_lab_files() {
        for (family, text) in DEFAULT_CONFIGS {
            assert_eq!(default_kind_config(family, 2), strip_nothing(text));
            let parsed = KindConfig::parse(Path::new("lab"), text).expect("lab config parses");
            assert_eq!(parsed.ip_family, family);
            assert_eq!(parsed.pod_subnet, family.pod_subnet());
            assert_eq!(parsed.roles, default_roles(2), "{family:?}");
            let five = KindConfig::parse(Path::new("x"), &default_kind_config(family, 5));
            assert_eq!(five.map(|c| c.workers()).ok(), Some(5));
        }
    }

    fn strip_nothing(text: &str) -> String {
        text.lines().map(|l| format!("{l}\n")).collect()
    }

    #[test]
    fn user_configs() {
        let own = format!(
            "{HEAD}networking:\n  disableDefaultCNI: true\n  kubeProxyMode: nftables\n  ipFamily: dual\nnodes:\n- role: control-plane\n- role: control-plane\n- role: worker\n"
        );
        let c = parse(&own).expect("parses");
        assert_eq!(c.ip_family, IpFamily::Dual);
        assert_eq!(c.pod_subnet, "10.244.0.0/16,fd00:10:244::/56");
        assert_eq!(c.workers(), 1);
        assert_eq!(
            kind_node_names("k", &c.roles),
            ["k-control-plane", "k-control-plane2", "k-worker"]
        );
        let minimal = parse(&format!(
            "{HEAD}networking:\n  disableDefaultCNI: true\n  podSubnet: 10.100.0.0/16\n"
        ))
        .expect("parses");
        assert_eq!(minimal.roles, [Role::ControlPlane]);
        assert_eq!(minimal.pod_subnet, "10.100.0.0/16");
        let kindnet = parse(&format!("{HEAD}nodes:\n- role: control-plane\n"));
        assert!(
            matches!(&kindnet, Err(e) if e.contains("disableDefaultCNI")),
            "{kindnet:?}"
        );
        let other = parse("kind: Pod\n");
        assert!(matches!(&other, Err(e) if e.contains("not a kind config")));
        let role = parse(&format!(
            "{HEAD}networking:\n  disableDefaultCNI: true\nnodes:\n- role: master\n"
        ));
        assert!(matches!(&role, Err(e) if e.contains("master")));
        let family = parse(&format!(
            "{HEAD}networking:\n  disableDefaultCNI: true\n  ipFamily: ipv5\n"
        ));
        assert!(matches!(&family, Err(e) if e.contains("ipv5")));
    }

    #[test]
    fn node_names_follow_kinds_namer() {
        assert_eq!(
            kind_node_names("c", &default_roles(3)),
            ["c-control-plane", "c-worker", "c-worker2", "c-worker3"]
        );
    }
}
