//! Questions about networks that the plan asks for every node: is a pod CIDR
//! in scope (inside a cluster CIDR, clear of the special-purpose blocks), and
//! which networks of a large set overlap one another. CIDR blocks are either
//! nested or disjoint, never partly overlapping, so a sorted set answers an
//! overlap query in O(log n) and all overlapping pairs come from one sorted
//! sweep: node lists of 100k+ entries stay n log n.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Bound;

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> IpNet {
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len))
}

const fn v6(segments: [u16; 8], len: u8) -> IpNet {
    let [a, b, c, d, e, f, g, h] = segments;
    IpNet::V6(Ipv6Net::new_assert(
        Ipv6Addr::new(a, b, c, d, e, f, g, h),
        len,
    ))
}

/// Blocks no pod CIDR may overlap, whatever `--cluster-cidr` says: "this
/// network", loopback, link-local (the cloud metadata address
/// 169.254.169.254), multicast, reserved and broadcast; IPv6 unspecified,
/// loopback, IPv4-mapped, link-local and multicast.
pub const SPECIAL_PURPOSE: [IpNet; 10] = [
    v4(0, 0, 0, 0, 8),
    v4(127, 0, 0, 0, 8),
    v4(169, 254, 0, 0, 16),
    v4(224, 0, 0, 0, 4),
    v4(240, 0, 0, 0, 4),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128),
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
];

/// Why a pod CIDR is out of scope, if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfScope {
    /// Overlaps this special-purpose block.
    Special(IpNet),
    /// Not inside any cluster CIDR.
    OutsideCluster,
}

/// Whether `dst` may be routed as a pod CIDR at all.
pub fn scope(dst: &IpNet, cluster_cidrs: &[IpNet]) -> Option<OutOfScope> {
    if let Some(block) = SPECIAL_PURPOSE.iter().find(|b| overlaps(b, dst)) {
        return Some(OutOfScope::Special(*block));
    }
    if !cluster_cidrs.iter().any(|c| c.contains(dst)) {
        return Some(OutOfScope::OutsideCluster);
    }
    None
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    cnilab_net::cluster::overlaps(a, b)
}

/// The sort key of a network: its first address, then the wider first.
fn start(net: &IpNet) -> IpNet {
    net.trunc()
}

/// A set of networks answering "which one overlaps this?" in O(log n).
#[derive(Debug, Default, Clone)]
pub struct NetSet {
    nets: BTreeSet<IpNet>,
}

impl NetSet {
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> Self {
        NetSet {
            nets: nets.into_iter().map(|n| start(&n)).collect(),
        }
    }

    /// A member that overlaps `query`: one that contains it (one of its at
    /// most 129 supernets) or one that starts inside it.
    pub fn overlapping(&self, query: &IpNet) -> Option<IpNet> {
        let query = start(query);
        let supernet = (0..=query.prefix_len()).find_map(|len| {
            let candidate = IpNet::new(query.network(), len).ok()?.trunc();
            self.nets.get(&candidate).copied()
        });
        supernet.or_else(|| self.starting_inside(&query).next())
    }

    /// The members that start inside `query` (and so lie inside it).
    fn starting_inside<'a>(&'a self, query: &IpNet) -> impl Iterator<Item = IpNet> + 'a {
        let low = Bound::Included(*query);
        let high = IpNet::new(query.broadcast(), query.max_prefix_len())
            .map(Bound::Included)
            .unwrap_or(Bound::Unbounded);
        self.nets.range((low, high)).copied()
    }
}

/// Whether a set of addresses has one inside `net`, in O(log n).
pub fn contains_any(addresses: &BTreeSet<IpAddr>, net: &IpNet) -> Option<IpAddr> {
    addresses
        .range(net.network()..=net.broadcast())
        .next()
        .copied()
}

/// Every overlapping pair among `items` (an owner and a network each), as
/// indices `(outer, inner)` with `items[outer]` containing `items[inner]`.
/// One sort and one sweep with a stack of the enclosing networks (at most
/// 129 deep): O(n log n + pairs).
pub fn overlapping_pairs<T>(items: &[(T, IpNet)]) -> Vec<(usize, usize)> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| start(&items[i].1));
    let mut pairs = Vec::new();
    let mut enclosing: Vec<usize> = Vec::new();
    for i in order {
        let net = items[i].1;
        while let Some(&top) = enclosing.last() {
            if items[top].1.contains(&net) {
                break;
            }
            enclosing.pop();
        }
        pairs.extend(enclosing.iter().map(|&outer| (outer, i)));
        enclosing.push(i);
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    #[test]
    fn scope_refuses_special_blocks_and_what_is_outside_the_cluster() {
        let cluster = [net("10.244.0.0/16"), net("fd00:10:244::/56")];
        assert_eq!(scope(&net("10.244.2.0/24"), &cluster), None);
        assert_eq!(scope(&net("fd00:10:244:2::/64"), &cluster), None);
        assert_eq!(
            scope(&net("10.96.0.0/16"), &cluster),
            Some(OutOfScope::OutsideCluster)
        );
        for (cidr, block) in [
            ("169.254.169.254/32", "169.254.0.0/16"),
            ("127.0.0.0/8", "127.0.0.0/8"),
            ("255.255.255.255/32", "240.0.0.0/4"),
            ("128.0.0.0/1", "169.254.0.0/16"),
            ("0.0.0.0/0", "0.0.0.0/8"),
            ("fe80::/64", "fe80::/10"),
            ("ff02::/16", "ff00::/8"),
        ] {
            let wide = [net("0.0.0.0/0"), net("::/0")];
            assert_eq!(
                scope(&net(cidr), &wide),
                Some(OutOfScope::Special(net(block))),
                "{cidr}"
            );
        }
    }

    #[test]
    fn net_set_finds_supernets_and_subnets() {
        let set = NetSet::new([net("10.0.0.0/8"), net("192.168.1.0/24"), net("fd00::/64")]);
        assert_eq!(
            set.overlapping(&net("10.2.0.0/16")),
            Some(net("10.0.0.0/8"))
        );
        assert_eq!(
            set.overlapping(&net("192.168.0.0/16")),
            Some(net("192.168.1.0/24"))
        );
        assert_eq!(set.overlapping(&net("192.168.2.0/24")), None);
        assert_eq!(set.overlapping(&net("fd00::/48")), Some(net("fd00::/64")));
        assert_eq!(set.overlapping(&net("fd01::/64")), None);
        assert_eq!(set.overlapping(&net("11.0.0.0/8")), None);
    }

    #[test]
    fn addresses_inside_a_network() {
        let ips: BTreeSet<IpAddr> = ["10.0.0.1", "10.0.1.5"]
            .iter()
            .map(|s| s.parse().expect("ip"))
            .collect();
        assert!(contains_any(&ips, &net("10.0.1.0/24")).is_some());
        assert!(contains_any(&ips, &net("10.0.2.0/24")).is_none());
    }

    #[test]
    fn overlapping_pairs_are_exactly_the_nested_ones() {
        let items = [
            ("a", net("10.244.2.0/24")),
            ("b", net("10.244.0.0/16")),
            ("c", net("10.245.0.0/24")),
            ("d", net("10.244.3.0/24")),
            ("e", net("10.244.2.0/24")),
        ];
        let mut pairs: Vec<(&str, &str)> = overlapping_pairs(&items)
            .into_iter()
            .map(|(o, i)| (items[o].0, items[i].0))
            .collect();
        pairs.sort();
        let mut expected = vec![("b", "a"), ("b", "d"), ("b", "e")];
        // The two equal networks: one encloses the other, in sort order.
        expected.push(if pairs.contains(&("a", "e")) {
            ("a", "e")
        } else {
            ("e", "a")
        });
        expected.sort();
        assert_eq!(pairs, expected);
    }
}
