//! The network configuration on stdin, decoded and validated into a `Plan`
//! before the kernel or the store is touched.

use crate::error::{CniError, Result};
use cnilab_net::naming::{from_u128, to_u128};
use cnilab_net::spec::{self, check_ifname, Attachment, Dns, Route, Version};
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::net::IpAddr;
use std::path::PathBuf;

pub const DEFAULT_BRIDGE: &str = "cnilab0";
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// The config exactly as it came in (typed, plugin-specific fields kept).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    #[serde(default)]
    pub cni_version: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, rename = "type")]
    pub plugin_type: Option<String>,
    #[serde(default)]
    pub bridge: Option<String>,
    #[serde(default)]
    pub mtu: Option<u32>,
    #[serde(default)]
    pub is_gateway: bool,
    #[serde(default)]
    pub is_default_gateway: bool,
    #[serde(default)]
    pub hairpin_mode: bool,
    #[serde(default)]
    pub promisc_mode: bool,
    #[serde(default)]
    pub ip_masq: bool,
    /// Destinations never masqueraded besides the pod range itself: the
    /// cluster CIDR, so pod-to-pod traffic across nodes keeps its source.
    #[serde(default)]
    pub ip_masq_exclude: Vec<IpNet>,
    #[serde(default)]
    pub dns: Option<Dns>,
    #[serde(default)]
    pub log_file: Option<PathBuf>,
    #[serde(default)]
    pub ipam: Option<IpamConf>,
    #[serde(default)]
    pub prev_result: Option<Value>,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<Attachment>>,
    #[serde(default, rename = "cni.dev/attachments")]
    pub attachments: Option<Vec<Attachment>>,
    /// runtimeConfig, args and any plugin-specific field: tolerated.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamConf {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub ranges: Option<Vec<Vec<RangeConf>>>,
    #[serde(default)]
    pub subnet: Option<IpNet>,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
    #[serde(default)]
    pub range_start: Option<IpAddr>,
    #[serde(default)]
    pub range_end: Option<IpAddr>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RangeConf {
    pub subnet: IpNet,
    #[serde(default)]
    pub range_start: Option<IpAddr>,
    #[serde(default)]
    pub range_end: Option<IpAddr>,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
}

/// A validated range: every address in `start..=end` except `gateway` may be handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl Range {
    /// Number of addresses that can be handed out.
    pub fn capacity(&self) -> u128 {
        let span = to_u128(self.end) - to_u128(self.start) + 1;
        if self.contains(self.gateway) {
            span - 1
        } else {
            span
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.start.is_ipv4()
            && to_u128(ip) >= to_u128(self.start)
            && to_u128(ip) <= to_u128(self.end)
    }

    /// The address as a CIDR in this range's subnet (`10.1.0.5/24`).
    pub fn with_prefix(&self, ip: IpAddr) -> IpNet {
        // The prefix comes from a parsed IpNet of the same family: always valid.
        IpNet::new(ip, self.subnet.prefix_len()).unwrap_or_else(|_| IpNet::from(ip))
    }
}

/// One range set: the ranges of one address family, tried in order.
pub type RangeSet = Vec<Range>;

/// Where the addresses come from.
#[derive(Clone, Debug)]
pub enum IpamPlan {
    /// No `ipam` section: the interface gets no address (L2 only).
    None,
    /// The built-in host-local-style store.
    Builtin(BuiltinIpam),
    /// Another IPAM plugin, executed from `CNI_PATH`.
    Delegate { plugin: String },
}

#[derive(Clone, Debug)]
pub struct BuiltinIpam {
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<Route>,
    /// `dataDir/<network name>`.
    pub store_dir: PathBuf,
}

/// Everything ADD/DEL/CHECK/STATUS/GC needs, validated.
#[derive(Clone, Debug)]
pub struct Plan {
    pub version: Version,
    pub name: String,
    pub bridge: String,
    pub mtu: Option<u32>,
    pub is_gateway: bool,
    pub is_default_gateway: bool,
    pub hairpin: bool,
    pub promisc: bool,
    pub ip_masq: bool,
    pub ip_masq_exclude: Vec<IpNet>,
    pub dns: Option<Dns>,
    pub log_file: Option<PathBuf>,
    pub ipam: IpamPlan,
    pub prev_result: Option<Value>,
    pub valid_attachments: Option<Vec<Attachment>>,
    /// `<dataDir>/.cnilab-bridge/<network>`: the per-attachment locks and
    /// caches ([`crate::attachments`]); `None` without an `ipam` section.
    pub attachments_dir: Option<PathBuf>,
    /// The raw config bytes, forwarded to a delegated IPAM plugin.
    pub raw: Vec<u8>,
}

/// Only the version, for error bodies and VERSION: what the input claims,
/// if it is readable at all.
pub fn sniff_version(stdin: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(stdin).ok()?;
    value.get("cniVersion")?.as_str().map(str::to_string)
}

/// Decodes and validates the config. Errors: 6 for undecodable JSON, 1 for
/// an unsupported version, 7 for anything invalid.
pub fn parse(stdin: &[u8]) -> Result<Plan> {
    let value: Value = serde_json::from_slice(stdin)
        .map_err(|e| CniError::decode(format!("config on stdin is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(CniError::decode("config on stdin must be a JSON object"));
    }
    let conf: NetConf = serde_json::from_value(value)
        .map_err(|e| CniError::config(format!("invalid network config: {e}")))?;
    // A missing cniVersion means 0.1.0, which this plugin does not speak.
    let version_text = conf
        .cni_version
        .clone()
        .unwrap_or_else(|| "0.1.0".to_string());
    if !spec::is_supported(&version_text) {
        return Err(CniError::version(format!(
            "cniVersion {version_text:?} is not supported; supported: {}",
            spec::SUPPORTED_VERSIONS.join(", ")
        )));
    }
    let version = Version::parse(&version_text).ok_or_else(|| {
        CniError::version(format!("cniVersion {version_text:?} is not a version"))
    })?;
    let name = conf
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| CniError::config("network config has no \"name\""))?;
    if name.contains('/') || name == "." || name == ".." || name.contains('\0') || name.len() > 200
    {
        return Err(CniError::config(format!(
            "network name {name:?} is invalid: it must not contain '/' or NUL, nor be '.' or '..'"
        )));
    }
    let bridge = conf
        .bridge
        .clone()
        .unwrap_or_else(|| DEFAULT_BRIDGE.to_string());
    check_ifname(&bridge)
        .map_err(|why| CniError::config(format!("bridge name {bridge:?} {why}")))?;
    if let Some(mtu) = conf.mtu {
        if !(68..=65535).contains(&mtu) {
            return Err(CniError::config(format!(
                "mtu {mtu} is out of range 68..65535"
            )));
        }
    }
    let ipam = match &conf.ipam {
        None => IpamPlan::None,
        Some(ipam) => match ipam.kind.as_deref() {
            None | Some("") | Some("builtin") | Some("cnilab") => {
                IpamPlan::Builtin(builtin_ipam(ipam, &name)?)
            }
            Some(plugin) => {
                if plugin.contains('/') || plugin.starts_with('.') {
                    return Err(CniError::config(format!(
                        "ipam.type {plugin:?} must be a plugin name, not a path"
                    )));
                }
                IpamPlan::Delegate {
                    plugin: plugin.to_string(),
                }
            }
        },
    };
    let attachments_dir = attachments_dir(&conf, &name);
    Ok(Plan {
        version,
        name,
        bridge,
        mtu: conf.mtu,
        is_gateway: conf.is_gateway || conf.is_default_gateway,
        is_default_gateway: conf.is_default_gateway,
        hairpin: conf.hairpin_mode,
        promisc: conf.promisc_mode,
        ip_masq: conf.ip_masq,
        ip_masq_exclude: conf.ip_masq_exclude.clone(),
        dns: conf.dns.clone(),
        log_file: conf.log_file.clone(),
        ipam,
        prev_result: conf.prev_result.clone(),
        valid_attachments: conf.valid_attachments.clone().or(conf.attachments.clone()),
        attachments_dir,
        raw: stdin.to_vec(),
    })
}

/// Where the attachments of a network with an `ipam` section are kept: in
/// `ipam.dataDir` (a delegate's own store lives there too, but never in
/// `.cnilab-bridge`), or the default data directory.
fn attachments_dir(conf: &NetConf, network: &str) -> Option<PathBuf> {
    let ipam = conf.ipam.as_ref()?;
    let data_dir = ipam
        .data_dir
        .clone()
        .filter(|d| d.is_absolute())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    Some(data_dir.join(".cnilab-bridge").join(network))
}

fn builtin_ipam(ipam: &IpamConf, network: &str) -> Result<BuiltinIpam> {
    let mut sets: Vec<Vec<RangeConf>> = ipam.ranges.clone().unwrap_or_default();
    if let Some(subnet) = ipam.subnet {
        sets.insert(
            0,
            vec![RangeConf {
                subnet,
                range_start: ipam.range_start,
                range_end: ipam.range_end,
                gateway: ipam.gateway,
            }],
        );
    }
    if sets.is_empty() {
        return Err(CniError::config(
            "ipam has neither \"ranges\" nor \"subnet\": give at least one range",
        ));
    }
    let mut range_sets = Vec::new();
    for (i, set) in sets.iter().enumerate() {
        if set.is_empty() {
            return Err(CniError::config(format!("ipam.ranges[{i}] is empty")));
        }
        let mut ranges = Vec::new();
        for conf in set {
            let range = validate_range(conf)?;
            if let Some(first) = ranges.first() {
                let first: &Range = first;
                if first.subnet.addr().is_ipv4() != range.subnet.addr().is_ipv4() {
                    return Err(CniError::config(format!(
                        "ipam.ranges[{i}] mixes IPv4 and IPv6 ({} and {}): use one range set per family",
                        first.subnet, range.subnet
                    )));
                }
            }
            ranges.push(range);
        }
        range_sets.push(ranges);
    }
    let all: Vec<&Range> = range_sets.iter().flatten().collect();
    for (a_i, a) in all.iter().enumerate() {
        for b in all.iter().skip(a_i + 1) {
            if a.contains(b.start) || a.contains(b.end) || b.contains(a.start) {
                return Err(CniError::config(format!(
                    "ipam ranges overlap: {}-{} and {}-{}",
                    a.start, a.end, b.start, b.end
                )));
            }
        }
        // Another range would hand this range's gateway to a pod.
        if let Some(b) = all
            .iter()
            .find(|b| b.contains(a.gateway) && b.gateway != a.gateway)
        {
            return Err(CniError::config(format!(
                "gateway {} of subnet {} lies in range {}-{} of subnet {}, which would hand it to a pod",
                a.gateway, a.subnet, b.start, b.end, b.subnet
            )));
        }
    }
    let data_dir = ipam
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    if !data_dir.is_absolute() {
        return Err(CniError::config(format!(
            "ipam.dataDir {} must be an absolute path",
            data_dir.display()
        )));
    }
    Ok(BuiltinIpam {
        range_sets,
        routes: ipam.routes.clone(),
        store_dir: data_dir.join(network),
    })
}

/// Address blocks that can never be a pod range: loopback, multicast,
/// the unspecified address.
fn reserved_block(subnet: IpNet) -> Option<&'static str> {
    let blocks: [(&str, &str); 5] = [
        ("127.0.0.0/8", "loopback"),
        ("::1/128", "loopback"),
        ("224.0.0.0/4", "multicast"),
        ("ff00::/8", "multicast"),
        ("0.0.0.0/8", "\"this network\" (unspecified)"),
    ];
    blocks.iter().find_map(|(block, what)| {
        let block: IpNet = block.parse().ok()?;
        let overlaps = block.contains(&subnet.network()) || subnet.contains(&block.network());
        overlaps.then_some(*what)
    })
}

fn validate_range(conf: &RangeConf) -> Result<Range> {
    let subnet = conf.subnet.trunc();
    let v4 = subnet.addr().is_ipv4();
    if let Some(what) = reserved_block(subnet) {
        return Err(CniError::config(format!(
            "subnet {subnet} overlaps the {what} block: pods cannot use it"
        )));
    }
    let net = to_u128(subnet.network());
    let last = to_u128(subnet.broadcast());
    let same_family_in_subnet = |ip: IpAddr, what: &str| -> Result<u128> {
        if ip.is_ipv4() != v4 || !subnet.contains(&ip) {
            return Err(CniError::config(format!(
                "{what} {ip} is not in subnet {subnet}"
            )));
        }
        Ok(to_u128(ip))
    };
    // The network address and (IPv4) the broadcast address are never handed out.
    let min = net + 1;
    let max = if v4 { last.saturating_sub(1) } else { last };
    if min > max {
        return Err(CniError::config(format!(
            "subnet {subnet} has no usable address"
        )));
    }
    let gateway = match conf.gateway {
        Some(gw) => same_family_in_subnet(gw, "gateway")?,
        None => min,
    };
    if v4 && (gateway == net || gateway == last) {
        return Err(CniError::config(format!(
            "gateway {} is the {} address of subnet {subnet}",
            from_u128(v4, gateway),
            if gateway == net {
                "network"
            } else {
                "broadcast"
            }
        )));
    }
    let start = match conf.range_start {
        Some(ip) => same_family_in_subnet(ip, "rangeStart")?.max(min),
        None => min,
    };
    let end = match conf.range_end {
        Some(ip) => same_family_in_subnet(ip, "rangeEnd")?.min(max),
        None => max,
    };
    if start > end {
        return Err(CniError::config(format!(
            "range of subnet {subnet} is empty: rangeStart {} is after rangeEnd {}",
            from_u128(v4, start),
            from_u128(v4, end)
        )));
    }
    let range = Range {
        subnet,
        start: from_u128(v4, start),
        end: from_u128(v4, end),
        gateway: from_u128(v4, gateway),
    };
    if range.capacity() == 0 {
        return Err(CniError::config(format!(
            "range {}-{} of subnet {subnet} has no usable address besides the gateway",
            range.start, range.end
        )));
    }
    Ok(range)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn conf(body: &str) -> Result<Plan> {
        parse(body.as_bytes())
    }

    #[test]
    fn dual_stack_config_parses() {
        let plan = conf(
            r#"{"cniVersion":"1.1.0","name":"n","type":"cnilab-bridge","isDefaultGateway":true,"ipMasq":true,
               "custom":{"x":1},"runtimeConfig":{},"args":{},"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}],
               "ipam":{"ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd00:1::/64","gateway":"fd00:1::fe"}]],"dataDir":"/tmp/x"}}"#,
        )
        .expect("valid");
        assert!(plan.is_gateway, "isDefaultGateway implies isGateway");
        assert_eq!(plan.bridge, DEFAULT_BRIDGE);
        assert_eq!(plan.valid_attachments.as_ref().map(Vec::len), Some(1));
        let IpamPlan::Builtin(ipam) = plan.ipam else {
            panic!("builtin ipam expected")
        };
        assert_eq!(ipam.store_dir, PathBuf::from("/tmp/x/n"));
        assert_eq!(ipam.range_sets.len(), 2);
        let v4 = &ipam.range_sets[0][0];
        assert_eq!(v4.gateway.to_string(), "10.1.0.1");
        assert_eq!(v4.start.to_string(), "10.1.0.1");
        assert_eq!(v4.end.to_string(), "10.1.0.254");
        assert_eq!(v4.capacity(), 253);
        assert_eq!(ipam.range_sets[1][0].gateway.to_string(), "fd00:1::fe");
    }

    #[test]
    fn subnet_shorthand_and_delegation() {
        let plan = conf(r#"{"cniVersion":"0.4.0","name":"n","ipam":{"subnet":"10.2.0.0/16","rangeStart":"10.2.1.10","rangeEnd":"10.2.1.20"}}"#)
            .expect("valid");
        let IpamPlan::Builtin(ipam) = plan.ipam else {
            panic!("builtin")
        };
        assert_eq!(ipam.range_sets[0][0].capacity(), 11);
        let plan = conf(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"host-local","subnet":"10.2.0.0/16"}}"#)
            .expect("valid");
        assert!(matches!(plan.ipam, IpamPlan::Delegate { ref plugin } if plugin == "host-local"));
    }

    #[rstest]
    #[case::malformed("{\"cniVersion\":", 6)]
    #[case::not_object("[1,2]", 6)]
    #[case::missing_name(r#"{"cniVersion":"1.0.0"}"#, 7)]
    #[case::missing_version(r#"{"name":"n"}"#, 1)]
    #[case::unknown_version(r#"{"cniVersion":"9.9.9","name":"n"}"#, 1)]
    #[case::old_version(r#"{"cniVersion":"0.2.0","name":"n"}"#, 1)]
    #[case::wrong_type(r#"{"cniVersion":"1.0.0","name":"n","mtu":"big"}"#, 7)]
    #[case::huge_mtu(r#"{"cniVersion":"1.0.0","name":"n","mtu":100000}"#, 7)]
    #[case::bad_bridge(r#"{"cniVersion":"1.0.0","name":"n","bridge":"a/b"}"#, 7)]
    #[case::bad_cidr(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/33"}}"#,
        7
    )]
    #[case::no_ranges(r#"{"cniVersion":"1.0.0","name":"n","ipam":{}}"#, 7)]
    #[case::slash31(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/31"}}"#,
        7
    )]
    #[case::only_gateway(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/30","rangeStart":"10.0.0.1","rangeEnd":"10.0.0.1"}}"#, 7)]
    #[case::v6_gw_in_v4(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/24","gateway":"fd00::1"}}"#,
        7
    )]
    #[case::overlap(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.0/25"}]]}}"#, 7)]
    #[case::mixed_set(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]}}"#, 7)]
    #[case::name_traversal(
        r#"{"cniVersion":"1.0.0","name":"../x","ipam":{"subnet":"10.0.0.0/24"}}"#,
        7
    )]
    #[case::ipam_path(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"../../bin/sh"}}"#,
        7
    )]
    #[case::relative_data_dir(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/24","dataDir":"var/lib"}}"#,
        7
    )]
    #[case::gateway_broadcast(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/24","gateway":"10.0.0.255"}}"#,
        7
    )]
    #[case::gateway_network(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/24","gateway":"10.0.0.0"}}"#,
        7
    )]
    #[case::gateway_in_other_range(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.10","rangeEnd":"10.0.0.20","gateway":"10.0.0.1"},{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.1","rangeEnd":"10.0.0.5","gateway":"10.0.0.254"}]]}}"#,
        7
    )]
    #[case::loopback(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"127.0.0.0/8"}}"#,
        7
    )]
    #[case::loopback_inside(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"127.3.0.0/24"}}"#,
        7
    )]
    #[case::v6_loopback(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"::/96"}}"#, 7)]
    #[case::multicast(
        r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"239.1.0.0/24"}}"#,
        7
    )]
    #[case::start_after_end(r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.9","rangeEnd":"10.0.0.5"}}"#, 7)]
    fn bad_configs_get_their_code(#[case] body: &str, #[case] want: u32) {
        let err = conf(body).expect_err("must be refused");
        assert_eq!(err.code, want, "{err}");
    }
}
