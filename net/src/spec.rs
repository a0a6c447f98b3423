//! CNI specification types shared by the plugin, the harness and the agent:
//! versions, results, error bodies. One result type, used everywhere.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::fmt;
use std::net::IpAddr;

/// The versions `cnilab-bridge` accepts, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Version the plugin speaks natively.
pub const CURRENT_VERSION: &str = "1.1.0";

/// Error codes from the spec (SPEC.md "Error" section) and libcni.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const NOT_AVAILABLE_DEGRADED: u32 = 51;
    /// Plugin-specific: a kernel (netlink, sysctl, firewall) operation failed.
    pub const KERNEL: u32 = 100;
    /// Plugin-specific: the address range is exhausted.
    pub const RANGE_EXHAUSTED: u32 = 101;
    /// Plugin-specific: CHECK found the kernel state different from prevResult.
    pub const CHECK_MISMATCH: u32 = 102;
    /// Plugin-specific: a delegated IPAM plugin failed.
    pub const IPAM_DELEGATE: u32 = 103;
    /// Plugin-specific: the interface already exists in the container.
    pub const INTERFACE_EXISTS: u32 = 104;
}

/// A CNI semantic version. Compared numerically, never as a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const V0_3_0: Version = Version::new(0, 3, 0);
    pub const V0_4_0: Version = Version::new(0, 4, 0);
    pub const V1_0_0: Version = Version::new(1, 0, 0);
    pub const V1_1_0: Version = Version::new(1, 1, 0);

    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Parses `X.Y.Z` (missing components count as 0, as libcni does).
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.');
        let mut next = |required: bool| -> Option<u32> {
            match parts.next() {
                Some(p)
                    if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.len() < 10 =>
                {
                    p.parse().ok()
                }
                None if !required => Some(0),
                _ => None,
            }
        };
        let v = Version::new(next(true)?, next(false)?, next(false)?);
        if parts.next().is_some() {
            return None;
        }
        Some(v)
    }

    /// True when results of this version carry `"version"` in each IP (0.3.x, 0.4.0).
    pub fn ips_carry_version(self) -> bool {
        self < Version::V1_0_0
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch).cmp(&(other.major, other.minor, other.patch))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Is `version` one that this plugin accepts?
pub fn is_supported(version: &str) -> bool {
    SUPPORTED_VERSIONS.contains(&version)
}

/// `interfaces[]` entry of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    #[serde(
        default,
        rename = "socketPath",
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    #[serde(default, rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

/// `ips[]` entry of a result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Present in 0.3.x/0.4.0 results only: "4" or "6".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

/// `routes[]` entry of a result or of an IPAM config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl Route {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Self {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// `dns` of a config or result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// A CNI result (ADD output, `prevResult`), in the 0.3.0 .. 1.1.0 shapes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
}

impl CniResult {
    /// Converts the result to the shape of `version` (0.3.0 .. 1.1.0).
    /// Fields a version does not know are dropped.
    pub fn to_version(&self, version: Version) -> CniResult {
        let mut out = self.clone();
        out.cni_version = version.to_string();
        for ip in &mut out.ips {
            ip.version = if version.ips_carry_version() {
                Some(
                    if ip.address.addr().is_ipv4() {
                        "4"
                    } else {
                        "6"
                    }
                    .to_string(),
                )
            } else {
                None
            };
        }
        if version < Version::V1_1_0 {
            for iface in &mut out.interfaces {
                iface.mtu = None;
                iface.socket_path = None;
                iface.pci_id = None;
            }
            for r in &mut out.routes {
                r.mtu = None;
                r.advmss = None;
                r.priority = None;
                r.table = None;
                r.scope = None;
            }
        }
        if out.dns.as_ref().is_some_and(Dns::is_empty) {
            out.dns = None;
        }
        out
    }

    /// Index of the interface named `name` whose sandbox matches `sandbox`.
    pub fn interface_index(&self, name: &str, sandbox: Option<&str>) -> Option<usize> {
        self.interfaces
            .iter()
            .position(|i| i.name == name && i.sandbox.as_deref() == sandbox)
    }
}

/// The error body a plugin prints on stdout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cni_version: Option<String>,
    pub code: u32,
    #[serde(default)]
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

/// VERSION output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    #[serde(rename = "supportedVersions")]
    pub supported_versions: Vec<String>,
}

/// One entry of `cni.dev/valid-attachments` (GC).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// The longest container ID accepted: IDs end up in file names (records,
/// libcni's `<network>-<id>-<ifname>` cache), which hold 255 bytes.
pub const MAX_CONTAINER_ID: usize = 200;

/// Container IDs per SPEC.md: `^[A-Za-z0-9][A-Za-z0-9_.-]*$`, at most
/// [`MAX_CONTAINER_ID`] bytes.
pub fn valid_container_id(id: &str) -> bool {
    if id.len() > MAX_CONTAINER_ID {
        return false;
    }
    let mut bytes = id.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Interface names per SPEC.md: non-empty, at most 15 bytes, not `.` or `..`,
/// no `/`, `:` or whitespace; and no `%`, which the kernel expands (`eth%d`
/// becomes eth0, eth1, ... on each creation: a new link every call).
/// Returns why the name is refused.
pub fn check_ifname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > 15 {
        return Err("is longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return Err("must not be '.' or '..'");
    }
    if name
        .chars()
        .any(|c| matches!(c, '/' | ':' | '%') || c.is_whitespace() || c.is_control())
    {
        return Err(
            "must not contain '/', ':', '%' (the kernel expands %d), whitespace or control characters",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("1.1.0", Some(Version::new(1, 1, 0)))]
    #[case("0.3.1", Some(Version::new(0, 3, 1)))]
    #[case("1.0", Some(Version::new(1, 0, 0)))]
    #[case("1.x.0", None)]
    #[case("", None)]
    #[case("1.0.0.0", None)]
    #[case("-1.0.0", None)]
    fn parses_versions(#[case] text: &str, #[case] want: Option<Version>) {
        assert_eq!(Version::parse(text), want);
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(Version::parse("0.10.0") > Version::parse("0.4.0"));
        assert!(Version::V1_1_0 > Version::V1_0_0);
    }

    #[rstest]
    #[case("abc", true)]
    #[case("a-b_c.d", true)]
    #[case("../../etc", false)]
    #[case("-abc", false)]
    #[case("", false)]
    #[case("a/b", false)]
    fn container_ids(#[case] id: &str, #[case] ok: bool) {
        assert_eq!(valid_container_id(id), ok);
    }

    #[rstest]
    #[case("eth0", true)]
    #[case("", false)]
    #[case(".", false)]
    #[case("..", false)]
    #[case("a/b", false)]
    #[case("a:b", false)]
    #[case("a b", false)]
    #[case("eth%d", false)]
    #[case("%", false)]
    #[case("abcdefghijklmnop", false)]
    #[case("abcdefghijklmno", true)]
    fn ifnames(#[case] name: &str, #[case] ok: bool) {
        assert_eq!(check_ifname(name).is_ok(), ok);
    }

    fn sample() -> CniResult {
        serde_json::from_str(
            r#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","mtu":1400,"sandbox":"/var/run/netns/x"}],
            "ips":[{"interface":0,"address":"10.1.0.5/24","gateway":"10.1.0.1"},{"interface":0,"address":"fd00::5/64"}],
            "routes":[{"dst":"0.0.0.0/0","gw":"10.1.0.1","mtu":1400}],"dns":{}}"#,
        )
        .expect("sample parses")
    }

    #[rstest]
    #[case("0.3.1", Some("4"), None)]
    #[case("0.4.0", Some("4"), None)]
    #[case("1.0.0", None, None)]
    #[case("1.1.0", None, Some(1400))]
    fn converts_result_versions(
        #[case] v: &str,
        #[case] ipver: Option<&str>,
        #[case] mtu: Option<u32>,
    ) {
        let version = Version::parse(v).expect("version");
        let out = sample().to_version(version);
        assert_eq!(out.cni_version, v);
        assert_eq!(out.ips[0].version.as_deref(), ipver);
        assert_eq!(out.interfaces[0].mtu, mtu);
        assert_eq!(out.routes[0].mtu, mtu);
        assert_eq!(out.dns, None, "empty dns is dropped");
        if ipver.is_some() {
            assert_eq!(out.ips[1].version.as_deref(), Some("6"));
        }
        let text = serde_json::to_string(&out).expect("serializes");
        assert_eq!(text.contains("\"version\""), ipver.is_some());
    }
}
