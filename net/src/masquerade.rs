//! A node's masquerade rules: pod traffic that leaves the cluster CIDRs
//! goes out with the node's address. The agent's table (`cnilab_agent`)
//! and the lab's `masquerade = "node"` table (`cnilab_lab_nat`) both hold
//! this one chain, written the way `nft list` prints it (so a listing can
//! be compared with it, counters aside). Pure text; [`crate::nft`] loads it.

use ipnet::IpNet;
use std::fmt::Write as _;

/// `ip` or `ip6`: the nft keyword of a network's family.
pub fn family_keyword(net: &IpNet) -> &'static str {
    match net {
        IpNet::V4(_) => "ip",
        IpNet::V6(_) => "ip6",
    }
}

/// The networks of one family (`ip` or `ip6`) as a set, written the way
/// `nft list` prints it (one element without braces); `None` when there
/// are none.
pub fn set_of_family(nets: &[IpNet], family: &str) -> Option<String> {
    let items: Vec<String> = nets
        .iter()
        .filter(|n| family_keyword(n) == family)
        .map(IpNet::to_string)
        .collect();
    match items.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        _ => Some(format!("{{ {} }}", items.join(", "))),
    }
}

/// The `postrouting` NAT chain: one rule per pod CIDR, masquerading what
/// it sends outside the cluster CIDRs of its family. A pod CIDR whose
/// family has no cluster CIDR gets no rule: every destination would look
/// external, pod-to-pod included.
pub fn postrouting_chain(pod_cidrs: &[IpNet], cluster_cidrs: &[IpNet]) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "\tchain postrouting {{");
    let _ = writeln!(
        text,
        "\t\ttype nat hook postrouting priority srcnat; policy accept;"
    );
    for pod in pod_cidrs {
        let family = family_keyword(pod);
        let Some(set) = set_of_family(cluster_cidrs, family) else {
            continue;
        };
        let _ = writeln!(
            text,
            "\t\t{family} saddr {} {family} daddr != {set} counter masquerade",
            pod.trunc()
        );
    }
    let _ = writeln!(text, "\t}}");
    text
}

/// An `inet` table `name` holding only [`postrouting_chain`].
pub fn table(name: &str, pod_cidrs: &[IpNet], cluster_cidrs: &[IpNet]) -> String {
    format!(
        "table inet {name} {{\n{}}}\n",
        postrouting_chain(pod_cidrs, cluster_cidrs)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().filter_map(|s| s.parse().ok()).collect()
    }

    #[test]
    fn each_pod_cidr_is_masqueraded_outside_its_familys_cluster_cidrs() {
        let chain = postrouting_chain(
            &nets(&["10.244.1.7/24", "fd00:10:244:1::/64"]),
            &nets(&["10.244.0.0/16", "10.245.0.0/16", "fd00:10:244::/56"]),
        );
        assert!(
            chain.contains(
                "\t\tip saddr 10.244.1.0/24 ip daddr != { 10.244.0.0/16, 10.245.0.0/16 } counter masquerade\n"
            ),
            "{chain}"
        );
        assert!(
            chain.contains(
                "\t\tip6 saddr fd00:10:244:1::/64 ip6 daddr != fd00:10:244::/56 counter masquerade\n"
            ),
            "{chain}"
        );
    }

    #[test]
    fn a_family_without_cluster_cidr_gets_no_rule() {
        let chain = postrouting_chain(
            &nets(&["10.244.1.0/24", "fd00:10:244:1::/64"]),
            &nets(&["10.244.0.0/16"]),
        );
        assert!(!chain.contains("ip6"), "{chain}");
        assert_eq!(chain.matches("masquerade").count(), 1, "{chain}");
    }

    #[test]
    fn the_table_holds_only_the_chain() {
        let text = table("t", &nets(&["10.244.1.0/24"]), &nets(&["10.244.0.0/16"]));
        assert!(text.starts_with("table inet t {\n\tchain postrouting {\n"));
        assert!(text.ends_with("\t}\n}\n"), "{text}");
    }
}
