//! What a connectivity probe is, wherever it runs (namespace lab or a
//! cluster): its endpoints, protocol, expected source address and outcome.

use std::net::IpAddr;

/// The address family of `ip`, as reports name it: `IPv4` or `IPv6`.
pub fn family(ip: &IpAddr) -> &'static str {
    if ip.is_ipv6() {
        "IPv6"
    } else {
        "IPv4"
    }
}

/// The families, in report order.
pub const FAMILIES: [&str; 2] = ["IPv4", "IPv6"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Icmp,
    Tcp,
    Udp,
    /// UDP with don't-fragment set, sized to the MTU.
    Df,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Icmp => "icmp",
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Df => "udp-df",
        }
    }
}

/// Where a probe starts or ends.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Endpoint {
    /// `node1/node1-pod0`, `node2`, `external`.
    pub name: String,
    /// The node it is on (pods and nodes), by index.
    pub node: Option<usize>,
    pub pod: Option<usize>,
    pub ip: IpAddr,
    pub external: bool,
}

/// What the responder must report as our source address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "address")]
pub enum ExpectSource {
    /// No NAT: the source pod's own address.
    Unchanged(IpAddr),
    /// Masqueraded to the node's underlay address.
    Masqueraded(IpAddr),
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeSpec {
    pub group: &'static str,
    pub from: Endpoint,
    pub to: Endpoint,
    pub proto: Proto,
    pub expect_source: Option<ExpectSource>,
    /// A probe to a Service at a port of its own (a captured kube-proxy
    /// Service); `None`: the responders' port, answered by `to` itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<ServicePort>,
}

/// The port of a [`ProbeSpec`] to a Service and the endpoints (by name)
/// that may answer it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ServicePort {
    pub port: u16,
    pub backends: Vec<String>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeOutcome {
    pub spec: ProbeSpec,
    /// `None` when the probe passed.
    pub error: Option<String>,
    pub seen_source: Option<IpAddr>,
    pub rtt_ms: Option<f64>,
}

impl ProbeSpec {
    /// `IPv4` or `IPv6`: the family of the destination address.
    pub fn family(&self) -> &'static str {
        family(&self.to.ip)
    }
}

impl ProbeOutcome {
    pub fn passed(&self) -> bool {
        self.error.is_none()
    }

    /// `from (ip) → to (ip) family proto: error`, for reports and logs.
    pub fn describe(&self) -> String {
        format!(
            "{} ({}) → {} ({}) {} {}: {}",
            self.spec.from.name,
            self.spec.from.ip,
            self.spec.to.name,
            self.spec.to.ip,
            self.spec.family(),
            self.spec.proto.as_str(),
            self.error.as_deref().unwrap_or("")
        )
    }
}
