//! Names and numbers derived from input: host-side veth names, the bridge's
//! MAC, stable hashes, and addresses as integers. Pure functions: the
//! plugin derives names with them, and the harness recomputes the same
//! names to find what the plugin made.

use std::net::IpAddr;

/// FNV-1a, 64-bit: stable names derived from input without an extra crate.
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The host-side veth of an attachment: derived from (container, ifname), so
/// DEL and GC find it without the container's namespace.
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    let mut key = container_id.as_bytes().to_vec();
    key.push(b'/');
    key.extend_from_slice(ifname.as_bytes());
    format!("veth{:08x}", fnv1a(&key) as u32)
}

/// The kernel's longest interface name (IFNAMSIZ less the NUL).
pub const IFNAME_MAX: usize = 15;

/// `prefix` and `name` joined into an interface name that fits: as they are
/// when short enough, else `prefix`, the start of `name`, `-` and six hex
/// digits of `name`'s hash, so long names (`kind-control-plane`, cloud
/// hostnames) stay apart and each keeps the same name in every run.
pub fn fitted_ifname(prefix: &str, name: &str) -> String {
    let joined = format!("{prefix}{name}");
    if joined.len() <= IFNAME_MAX {
        return joined;
    }
    let hash = format!("-{:06x}", fnv1a(name.as_bytes()) & 0xff_ffff);
    let room = IFNAME_MAX.saturating_sub(prefix.len() + hash.len());
    let head: String = name.chars().take_while(char::is_ascii).take(room).collect();
    format!("{prefix}{head}{hash}")
}

/// A stable, locally administered MAC for a bridge, so the gateway's MAC
/// does not change as ports come and go.
pub fn bridge_mac(name: &str) -> Vec<u8> {
    let h = fnv1a(name.as_bytes()).to_be_bytes();
    vec![0x02, h[0], h[1], h[2], h[3], h[4]]
}

/// An address as a number (IPv4 in the low 32 bits), for range arithmetic.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The inverse of [`to_u128`] for the family given by `v4`.
pub fn from_u128(v4: bool, n: u128) -> IpAddr {
    if v4 {
        IpAddr::V4(std::net::Ipv4Addr::from(n as u32))
    } else {
        IpAddr::V6(std::net::Ipv6Addr::from(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitted_ifnames_keep_short_names_and_shorten_long_ones_apart() {
        assert_eq!(fitted_ifname("p-", "node1"), "p-node1");
        assert_eq!(fitted_ifname("p-", "node123456789"), "p-node123456789");
        let a = fitted_ifname("p-", "kind-control-plane");
        let b = fitted_ifname("p-", "kind-control-plane2");
        assert!(a.len() <= IFNAME_MAX && b.len() <= IFNAME_MAX, "{a} {b}");
        assert!(a.starts_with("p-kind-c"), "{a}");
        assert_ne!(a, b);
        assert_eq!(a, fitted_ifname("p-", "kind-control-plane"));
        let c = fitted_ifname("p-", "ip-10-0-1-23.eu-west-1.compute.internal");
        assert!(c.len() <= IFNAME_MAX, "{c}");
    }

    #[test]
    fn host_veth_names_fit_and_differ() {
        let a = host_veth_name("abc", "eth0");
        assert!(a.len() <= 15);
        assert_ne!(a, host_veth_name("abc", "eth1"));
        assert_eq!(a, host_veth_name("abc", "eth0"));
    }

    #[test]
    fn bridge_macs_are_locally_administered_unicast_and_stable() {
        let mac = bridge_mac("cni0");
        assert_eq!(mac.len(), 6);
        assert_eq!(mac[0] & 0x03, 0x02);
        assert_eq!(mac, bridge_mac("cni0"));
        assert_ne!(mac, bridge_mac("cni1"));
    }

    #[test]
    fn addresses_round_trip_through_numbers() {
        for ip in ["10.1.2.3", "255.255.255.255", "fd00::1", "::"] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert_eq!(from_u128(ip.is_ipv4(), to_u128(ip)), ip);
        }
        assert_eq!(to_u128("0.0.1.0".parse().expect("ip")), 256);
    }
}
