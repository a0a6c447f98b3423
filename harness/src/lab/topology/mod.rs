//! Lab topologies: TOML files (see `lab/topologies/`) or the flags
//! `--nodes N --pods-per-node M`, validated before anything is created.
//!
//! Where things happen: the types, reading and the TOML error lines here;
//! the checks of a whole topology in [`check`]; the settings of the
//! underlay shapes, the VXLAN overlay and the Service, and what they
//! require, in [`shapes`]. Nothing here imports the builders above it.

mod check;
pub mod shapes;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// How routes to other nodes' pod CIDRs are made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Routing {
    /// The lab installs `podCIDR via nodeIP` on every node, like a cloud route table.
    #[default]
    Static,
    /// An agent started inside every node namespace does the routing.
    Agent,
    /// A kernel VXLAN overlay the lab programs like flannel's vxlan backend
    /// (device, FDB and neighbour entries, routes); see `lab/vxlan.rs`.
    Vxlan,
}

/// Who masquerades pod traffic that leaves the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Masquerade {
    /// The plugin (`ipMasq` in its config).
    #[default]
    Plugin,
    /// The lab, one nftables rule per node, like a node agent or a cloud NAT.
    Node,
    /// Neither the plugin nor the lab: an agent does it (or nobody, and
    /// pod → external fails with a diagnosis).
    None,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    pub name: String,
    /// Underlay address, in `underlay` (IPv4 or IPv6).
    pub address: IpAddr,
    /// Second underlay address, in `underlay6` (a dual-stack underlay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<IpAddr>,
    /// Pod CIDRs, one per family.
    pub pod_cidr: Vec<IpNet>,
    /// MTU of the node's underlay interface.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Extra sysctls set in the node namespace (`net/ipv4/conf/all/rp_filter = "1"`).
    #[serde(default)]
    pub sysctls: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// Directory (or colon-separated list) with the plugin binaries.
    #[serde(default)]
    pub dir: Option<String>,
    /// Config template; placeholders `{{node}}`, `{{pod_cidr}}`,
    /// `{{pod_cidr6}}`, `{{cluster_cidr}}`, `{{data_dir}}`, `{{mtu}}`,
    /// `{{ip_masq}}`. Default: the bundled cnilab-bridge template.
    #[serde(default)]
    pub config: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// The command started in each node namespace; placeholders
    /// `{{node}}`, `{{nodes_file}}`, `{{cluster_cidr}}`, `{{conf_dir}}`,
    /// `{{bin_dir}}`, `{{run_dir}}`. The first word is looked up next to
    /// the `cnilab` binary, then on PATH.
    pub command: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalSpec {
    pub address: IpAddr,
    /// Its address in `underlay6` (a dual-stack underlay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<IpAddr>,
    /// The nodes' default route goes via it, as a real node's goes via its
    /// gateway to the outside world (an `l2` underlay only: a routed one's
    /// nodes route via the router, a `nat` one's via the NAT box). A
    /// capture of such a node names the external host, so its replay
    /// stands one up there (`lab/outside.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gateway: bool,
}

impl ExternalSpec {
    /// Its address of one family, if it has one.
    pub fn address_of(&self, v6: bool) -> Option<IpAddr> {
        [Some(self.address), self.address6]
            .into_iter()
            .flatten()
            .find(|a| a.is_ipv6() == v6)
    }
}

impl NodeSpec {
    /// Its underlay addresses (one per family).
    pub fn addresses(&self) -> Vec<IpAddr> {
        [Some(self.address), self.address6]
            .into_iter()
            .flatten()
            .collect()
    }

    /// Its underlay address of one family, if it has one.
    pub fn address_of(&self, v6: bool) -> Option<IpAddr> {
        self.addresses().into_iter().find(|a| a.is_ipv6() == v6)
    }

    /// Its pod CIDR of one family, if it has one.
    pub fn pod_cidr_of(&self, v6: bool) -> Option<IpNet> {
        self.pod_cidr
            .iter()
            .find(|c| c.addr().is_ipv6() == v6)
            .map(IpNet::trunc)
    }
}

/// A whole lab.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    #[serde(default = "default_name")]
    pub name: String,
    #[serde(default)]
    pub routing: Routing,
    #[serde(default)]
    pub masquerade: Masquerade,
    /// The cluster CIDR(s): traffic to them is never masqueraded.
    #[serde(default = "default_cluster_cidr")]
    pub cluster_cidr: Vec<IpNet>,
    /// The underlay subnet the nodes share (IPv4 or IPv6).
    #[serde(default = "default_underlay")]
    pub underlay: IpNet,
    /// A second, IPv6 underlay subnet (dual-stack underlay): each node then
    /// has `address6` in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underlay6: Option<IpNet>,
    /// MTU of the pods' interfaces (and the default underlay MTU).
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    #[serde(default = "default_pods")]
    pub pods_per_node: usize,
    /// Per-probe timeout in milliseconds.
    #[serde(default = "default_timeout")]
    pub probe_timeout_ms: u64,
    #[serde(default)]
    pub plugin: Option<PluginSpec>,
    #[serde(default)]
    pub agent: Option<AgentSpec>,
    #[serde(default = "default_external")]
    pub external: Option<ExternalSpec>,
    #[serde(default, rename = "node")]
    pub nodes: Vec<NodeSpec>,
    /// The underlay's shape: `l2`, `routed` or `nat` (see `lab/underlay.rs`).
    #[serde(default)]
    pub shape: shapes::Shape,
    /// VXLAN settings of `routing = "vxlan"`.
    #[serde(default)]
    pub vxlan: Option<shapes::VxlanSpec>,
    /// A kube-proxy-like Service (see `lab/services.rs`).
    #[serde(default)]
    pub service: Option<shapes::ServiceSpec>,
    /// The Services of captured kube-proxy chains (a replay sets them, see
    /// `lab/kube_proxy.rs`); `service/cluster-ip` probes each one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kube_services: Vec<shapes::KubeService>,
}

fn default_name() -> String {
    "lab".into()
}
fn default_cluster_cidr() -> Vec<IpNet> {
    vec![net("10.244.0.0/16")]
}
fn default_underlay() -> IpNet {
    net("10.250.0.0/24")
}
fn default_mtu() -> u32 {
    1500
}
fn default_pods() -> usize {
    2
}
fn default_timeout() -> u64 {
    1000
}
fn default_external() -> Option<ExternalSpec> {
    Some(ExternalSpec {
        address: IpAddr::from([10, 250, 0, 254]),
        address6: None,
        gateway: false,
    })
}

fn net(text: &str) -> IpNet {
    // Only called with the literals above.
    text.parse()
        .unwrap_or_else(|_| IpNet::from(IpAddr::from([0, 0, 0, 0])))
}

/// A TOML error as a user reads it: an address or CIDR the parser refused
/// ("invalid IP address syntax") says what is wrong with it.
pub fn explain_toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.to_string().trim().to_string();
    let value = e
        .span()
        .and_then(|s| text.get(s))
        .map(|v| v.trim().trim_matches('"'));
    match value.and_then(cidr_hint) {
        Some(hint) => message.replace("invalid IP address syntax", &hint),
        None => message,
    }
}

/// What is wrong with `value` as an address or a CIDR (`None`: nothing
/// this can say).
fn cidr_hint(value: &str) -> Option<String> {
    let (addr, prefix) = match value.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (value, None),
    };
    let Ok(ip) = addr.parse::<IpAddr>() else {
        return Some(format!("{addr:?} is not an IPv4 or IPv6 address"));
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
    match prefix.map(str::parse::<u8>) {
        None => Some(format!(
            "{value} has no prefix length: write it as a CIDR, e.g. {value}/{}",
            if ip.is_ipv4() { 24 } else { 64 }
        )),
        Some(Ok(p)) if p > max => Some(format!(
            "{value}: the prefix length /{p} is longer than an {family} address (at most /{max})"
        )),
        Some(Err(_)) => Some(format!(
            "{value}: the prefix length after '/' must be a number from 0 to {max}"
        )),
        Some(Ok(_)) => None,
    }
}

/// Why a topology was refused: the file, and the line or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read topology {path} (--topology FILE): {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("topology {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("topology {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// One step of a path into a TOML document: a key or an array index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seg {
    Key(&'static str),
    Index(usize),
}

/// A refused value: where it is and why.
#[derive(Debug)]
struct Invalid {
    field: Vec<Seg>,
    message: String,
}

/// The 1-based line of the value at `path` in the TOML `text` (or of the
/// nearest enclosing table when the value was left to its default).
pub fn toml_line(text: &str, path: &[Seg]) -> Option<usize> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let mut span: Option<std::ops::Range<usize>> = None;
    let mut table = Some(doc.get_ref());
    let mut array = None;
    for seg in path {
        let found = match (seg, table, array) {
            (Seg::Key(key), Some(t), _) => t
                .iter()
                .find(|(k, _)| k.get_ref().as_ref() == *key)
                .map(|(k, v)| (k.span(), v)),
            (Seg::Index(i), _, Some(items)) => {
                let items: &toml::de::DeArray = items;
                items.get(*i).map(|v| (v.span(), v))
            }
            _ => None,
        };
        let Some((at, value)) = found else { break };
        span = Some(at);
        table = None;
        array = None;
        match value.get_ref() {
            DeValue::Table(t) => table = Some(t),
            DeValue::Array(a) => array = Some(a),
            _ => {}
        }
    }
    let start = span?.start;
    Some(text.get(..start)?.matches('\n').count() + 1)
}

/// `line N: ` when `path` can be found in `text`.
pub fn line_prefix(text: &str, path: &[Seg]) -> String {
    toml_line(text, path)
        .map(|n| format!("line {n}: "))
        .unwrap_or_default()
}

impl Topology {
    /// `nodes` nodes with `pods` pods each, addresses and CIDRs numbered from 1.
    pub fn generated(nodes: usize, pods: usize) -> Result<Topology, TopologyError> {
        let mut topo = Topology {
            name: format!("{nodes}x{pods}"),
            routing: Routing::Static,
            masquerade: Masquerade::Plugin,
            cluster_cidr: default_cluster_cidr(),
            underlay: default_underlay(),
            underlay6: None,
            mtu: default_mtu(),
            pods_per_node: pods,
            probe_timeout_ms: default_timeout(),
            plugin: None,
            agent: None,
            external: default_external(),
            nodes: Vec::new(),
            shape: Default::default(),
            vxlan: None,
            service: None,
            kube_services: Vec::new(),
        };
        for i in 1..=nodes {
            let i8 = u8::try_from(i).map_err(|_| TopologyError::Invalid {
                path: "--nodes".into(),
                message: format!("--nodes {nodes}: at most 200 nodes"),
            })?;
            topo.nodes.push(NodeSpec {
                name: format!("node{i}"),
                address: IpAddr::from([10, 250, 0, i8]),
                address6: None,
                pod_cidr: vec![net(&format!("10.244.{i}.0/24"))],
                mtu: None,
                sysctls: BTreeMap::new(),
            });
        }
        topo.validate(Path::new("--nodes"))?;
        Ok(topo)
    }

    pub fn load(path: &Path) -> Result<Topology, TopologyError> {
        let text = crate::assets::read_to_string(path).map_err(|source| TopologyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut topo = Self::parse(&text, path)?;
        topo.resolve_paths(path.parent().unwrap_or(Path::new(".")));
        Ok(topo)
    }

    /// Makes a relative plugin config template path relative to `base`
    /// (the directory of the file that named it), not to the working directory.
    pub fn resolve_paths(&mut self, base: &Path) {
        if let Some(plugin) = &mut self.plugin {
            if let Some(config) = &plugin.config {
                if config.is_relative() {
                    plugin.config = Some(base.join(config));
                }
            }
        }
    }

    pub fn parse(text: &str, path: &Path) -> Result<Topology, TopologyError> {
        let topo: Topology = toml::from_str(text).map_err(|e| TopologyError::Parse {
            path: path.to_path_buf(),
            message: explain_toml_error(text, &e),
        })?;
        topo.validate_text(path, text, &[])?;
        Ok(topo)
    }

    /// [`Topology::validate`] for a topology read from `text` (at `prefix`
    /// inside it, e.g. `[topology]` of a scenario): the error names the line.
    pub fn validate_text(
        &self,
        path: &Path,
        text: &str,
        prefix: &[Seg],
    ) -> Result<(), TopologyError> {
        check::check(self).map_err(|bad| {
            let mut field = prefix.to_vec();
            field.extend(bad.field);
            TopologyError::Invalid {
                path: path.to_path_buf(),
                message: format!("{}{}", line_prefix(text, &field), bad.message),
            }
        })
    }

    /// Checks what TOML cannot: names, address families, overlaps that are
    /// not deliberate. Overlapping pod CIDRs are allowed (scenarios
    /// reproduce that bug) and reported by the checks' diagnosis instead.
    pub fn validate(&self, path: &Path) -> Result<(), TopologyError> {
        check::check(self).map_err(|bad| TopologyError::Invalid {
            path: path.to_path_buf(),
            message: bad.message,
        })
    }
    /// Makes `config` the plugin's template. A template that cannot tell the
    /// plugin to masquerade (no `{{ip_masq}}`) in a lab whose masquerade was
    /// not chosen by a topology file for its plugin (`generated`: a
    /// `--nodes` lab, or a scenario's, which describes the cluster): the
    /// nodes masquerade, as an agent would.
    pub fn use_template(&mut self, config: &Path, generated: bool) {
        let tells_plugin = crate::assets::read_to_string(config)
            .map(|t| t.contains("{{ip_masq}}"))
            .unwrap_or(true);
        if generated && !tells_plugin && self.masquerade == Masquerade::Plugin {
            self.masquerade = Masquerade::Node;
        }
        let dir = self.plugin.as_ref().and_then(|p| p.dir.clone());
        self.plugin = Some(PluginSpec {
            dir,
            config: Some(config.to_path_buf()),
        });
    }

    /// The MTU of the pods' interfaces: the underlay's, less the overlay's
    /// encapsulation overhead (see `lab/vxlan.rs`).
    pub fn pod_mtu(&self) -> u32 {
        shapes::pod_mtu(self)
    }

    pub fn node(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("10.244.1.0/33", "/33 is longer than an IPv4 address (at most /32)")]
    #[case("fd00::/129", "/129 is longer than an IPv6 address (at most /128)")]
    #[case("10.244.1.0", "has no prefix length")]
    #[case("10.244.1.0/x", "must be a number from 0 to 32")]
    #[case("10.244.300.0/24", "is not an IPv4 or IPv6 address")]
    fn a_bad_cidr_says_what_is_wrong_with_it(#[case] cidr: &str, #[case] says: &str) {
        let text =
            format!("[[node]]\nname = \"a\"\naddress = \"10.250.0.1\"\npod_cidr = [\"{cidr}\"]\n");
        let err = Topology::parse(&text, Path::new("t.toml"))
            .expect_err("bad CIDR")
            .to_string();
        assert!(err.contains(says) && err.contains("line 4"), "{err}");
        assert!(!err.contains("invalid IP address syntax"), "{err}");
    }

    #[test]
    fn too_many_pods_per_node_says_why_not_that_there_are_none() {
        let mut t = Topology::generated(2, 2).expect("valid");
        t.pods_per_node = 100_000;
        let err = t
            .validate(Path::new("--pods-per-node"))
            .expect_err("too many")
            .to_string();
        assert!(
            err.contains("at most 250") && !err.contains("without pods"),
            "{err}"
        );
        t.pods_per_node = 0;
        let err = t
            .validate(Path::new("--pods-per-node"))
            .expect_err("none")
            .to_string();
        assert!(err.contains("without pods"), "{err}");
    }

    #[test]
    fn generated_topology_numbers_nodes() {
        let t = Topology::generated(3, 4).expect("valid");
        assert_eq!(t.nodes.len(), 3);
        assert_eq!(t.nodes[2].address.to_string(), "10.250.0.3");
        assert_eq!(t.nodes[2].pod_cidr[0].to_string(), "10.244.3.0/24");
        assert_eq!(t.pods_per_node, 4);
    }

    #[test]
    fn parses_a_full_file() {
        let t = Topology::parse(
            r#"
name = "demo"
routing = "static"
masquerade = "node"
underlay6 = "fd00:250::/64"
pods_per_node = 3
[plugin]
dir = "/usr/lib/cni"
config = "lab/configs/reference.conflist.tmpl"
[[node]]
name = "a"
address = "10.250.0.1"
address6 = "fd00:250::1"
pod_cidr = ["10.244.1.0/24", "fd00:244:1::/64"]
mtu = 1400
sysctls = { "net/ipv4/conf/all/rp_filter" = "1" }
[[node]]
name = "b"
address = "10.250.0.2"
address6 = "fd00:250::2"
pod_cidr = ["10.244.2.0/24"]
"#,
            Path::new("demo.toml"),
        )
        .expect("valid");
        assert_eq!(t.masquerade, Masquerade::Node);
        assert_eq!(t.nodes[0].mtu, Some(1400));
        assert_eq!(t.nodes[0].pod_cidr.len(), 2);
        assert_eq!(
            t.external
                .as_ref()
                .map(|e| e.address.to_string())
                .as_deref(),
            Some("10.250.0.254")
        );
    }

    #[rstest]
    #[case::unknown_field("[[node]]\nname = \"a\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\ncolour = 1\n", "colour")]
    #[case::bad_line("name = \n", "line 1")]
    #[case::bad_cidr(
        "[[node]]\nname = \"a\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/33\"]\n",
        "line"
    )]
    #[case::no_nodes("name = \"x\"\n", "no [[node]]")]
    #[case::long_name("[[node]]\nname = \"averyverylongname\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n", "node[0]")]
    #[case::outside_underlay(
        "[[node]]\nname = \"a\"\naddress = \"10.9.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n",
        "underlay"
    )]
    #[case::agent_without_command("routing = \"agent\"\n[[node]]\nname = \"a\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n", "[agent]")]
    #[case::bad_routing("routing = \"bgp\"\n", "line 1")]
    fn errors_name_the_line_or_field(#[case] text: &str, #[case] named: &str) {
        let err = Topology::parse(text, Path::new("t.toml")).expect_err("refused");
        let msg = err.to_string();
        assert!(msg.contains("t.toml"), "{msg}");
        assert!(msg.contains(named), "{msg} should mention {named}");
    }

    const TWO_NODES: &str = "[[node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n[[node]]\nname = \"node2\"\naddress = \"10.250.0.2\"\npod_cidr = [\"10.244.2.0/24\"]\n";

    /// Hostile values: each error names the file, the field and its line.
    #[rstest]
    #[case::pod_cidr_overlaps_underlay(
        "[[node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n[[node]]\nname = \"node2\"\naddress = \"10.250.0.2\"\npod_cidr = [\"10.250.0.0/25\"]\n",
        "pod_cidr",
        8
    )]
    #[case::pod_cidr_covers_underlay(
        "[[node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.0.0.0/8\"]\n",
        "pod_cidr",
        4
    )]
    #[case::probe_timeout_zero(&format!("name = \"x\"\nprobe_timeout_ms = 0\n{TWO_NODES}"), "probe_timeout_ms", 2)]
    #[case::pods_per_node_zero(&format!("pods_per_node = 0\n{TWO_NODES}"), "pods_per_node", 1)]
    #[case::broadcast_node_address(
        "[[node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n[[node]]\nname = \"node2\"\naddress = \"10.250.0.255\"\npod_cidr = [\"10.244.2.0/24\"]\n",
        "address",
        7
    )]
    #[case::network_node_address(
        "underlay = \"10.250.0.0/24\"\n[[node]]\nname = \"node1\"\naddress = \"10.250.0.0\"\npod_cidr = [\"10.244.1.0/24\"]\n",
        "address",
        4
    )]
    #[case::mtu_576_with_ipv6_pods(
        "mtu = 576\nunderlay6 = \"fd00:250::/64\"\n[[node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\naddress6 = \"fd00:250::1\"\npod_cidr = [\"10.244.1.0/24\", \"fd00:244:1::/64\"]\n",
        "mtu",
        1
    )]
    #[case::ipv6_pods_without_ipv6_underlay(
        "[[node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\", \"fd00:244:1::/64\"]\n",
        "underlay6",
        4
    )]
    #[case::address6_outside_underlay6(
        "underlay6 = \"fd00:250::/64\"\n[[node]]\nname = \"node1\"\naddress = \"10.250.0.1\"\naddress6 = \"fd00:9::1\"\npod_cidr = [\"10.244.1.0/24\"]\n",
        "address6",
        5
    )]
    #[case::external_gateway_outside_l2(&format!("shape = \"nat\"\n{TWO_NODES}[external]\naddress = \"10.250.0.254\"\ngateway = true\n"), "gateway", 12)]
    #[case::external_broadcast(&format!("{TWO_NODES}[external]\naddress = \"10.250.0.255\"\n"), "address", 10)]
    #[case::cluster_cidr_overlaps_underlay(&format!("cluster_cidr = [\"10.0.0.0/8\"]\n{TWO_NODES}"), "cluster_cidr", 1)]
    #[case::duplicate_name_in_second_node(
        "[[node]]\nname = \"a\"\naddress = \"10.250.0.1\"\npod_cidr = [\"10.244.1.0/24\"]\n\n[[node]]\nname = \"a\"\naddress = \"10.250.0.2\"\npod_cidr = [\"10.244.2.0/24\"]\n",
        "duplicate",
        7
    )]
    fn hostile_values_name_the_field_and_line(
        #[case] text: &str,
        #[case] field: &str,
        #[case] line: usize,
    ) {
        let err = Topology::parse(text, Path::new("t.toml")).expect_err("refused");
        let msg = err.to_string();
        assert!(msg.contains("t.toml"), "{msg}");
        assert!(msg.contains(field), "{msg} should name {field}");
        assert!(
            msg.contains(&format!("line {line}:")),
            "{msg} should name line {line}"
        );
    }

    #[test]
    fn shipped_topologies_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/topologies");
        for entry in std::fs::read_dir(&dir).expect("topologies") {
            let path = entry.expect("entry").path();
            Topology::load(&path).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
