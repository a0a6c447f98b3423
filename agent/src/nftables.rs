//! The agent's own nftables table, `inet cnilab_agent`: accept forwarding of
//! cluster traffic, and masquerade pod traffic leaving the cluster CIDR (the
//! chain `cnilab_net::masquerade` writes, which the lab's nodes use too).
//!
//! Rules go to `nft -f -` as one ruleset on stdin, so the table is replaced
//! in a single kernel transaction and no input string ever passes a shell.
//! Note: an `accept` in our forward chain does not override a `drop` verdict
//! of another base chain on the same hook (Docker's FORWARD policy DROP): the
//! agent warns about such chains, it does not fight them.

use crate::error::{AgentError, Result};
use cnilab_net::masquerade::{self, set_of_family};
use ipnet::IpNet;
use std::fmt::Write as _;
use std::fs::File;
use std::path::Path;

pub const TABLE: &str = "cnilab_agent";

/// What goes into the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatPolicy {
    pub cluster_cidrs: Vec<IpNet>,
    pub pod_cidrs: Vec<IpNet>,
    pub masquerade: bool,
}

/// The complete ruleset text, which replaces the table atomically (the
/// leading `table` + `delete table` makes it work whether or not the table
/// exists).
pub fn ruleset(policy: &NatPolicy) -> String {
    format!(
        "table inet {TABLE} {{}}\ndelete table inet {TABLE}\n{}",
        table(policy)
    )
}

/// Whether `listing` (from `nft list table inet cnilab_agent`) is the table
/// `policy` asks for, counters aside. A false "no" only costs a reload.
pub fn listing_matches(listing: &str, policy: &NatPolicy) -> bool {
    normalize(listing) == normalize(&table(policy))
}

fn normalize(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| {
            let mut tokens = Vec::new();
            let mut words = line.split_whitespace().peekable();
            while let Some(word) = words.next() {
                let is_number = |w: &&str| w.chars().all(|c| c.is_ascii_digit());
                if (word == "packets" || word == "bytes") && words.peek().is_some_and(is_number) {
                    words.next();
                    continue;
                }
                tokens.push(word);
            }
            tokens.join(" ")
        })
        .filter(|line| !line.is_empty())
        .collect()
}

/// The table itself, as `nft list table` prints it.
fn table(policy: &NatPolicy) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "table inet {TABLE} {{");
    let _ = writeln!(text, "\tchain forward {{");
    let _ = writeln!(
        text,
        "\t\ttype filter hook forward priority filter; policy accept;"
    );
    for family in ["ip", "ip6"] {
        let Some(set) = set_of_family(&policy.cluster_cidrs, family) else {
            continue;
        };
        let _ = writeln!(text, "\t\t{family} saddr {set} counter accept");
        let _ = writeln!(text, "\t\t{family} daddr {set} counter accept");
    }
    let _ = writeln!(text, "\t}}");
    if policy.masquerade {
        text.push_str(&masquerade::postrouting_chain(
            &policy.pod_cidrs,
            &policy.cluster_cidrs,
        ));
    }
    let _ = writeln!(text, "}}");
    text
}

/// Text that removes the table, whether or not it exists.
pub fn delete_ruleset() -> String {
    format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\n")
}

/// Runs `nft -f -` with `ruleset` on stdin, inside `netns` when given.
pub fn load(nft: &Path, netns: Option<&File>, action: &str, ruleset: &str) -> Result<()> {
    run(nft, netns, &["-f", "-"], Some(ruleset), action).map(|_| ())
}

/// Runs nft with arguments (no shell) and returns stdout.
pub fn run(
    nft: &Path,
    netns: Option<&File>,
    args: &[&str],
    stdin: Option<&str>,
    action: &str,
) -> Result<String> {
    use cnilab_net::nft::NftError;
    cnilab_net::nft::run(nft, netns, args, stdin).map_err(|e| AgentError::Nft {
        action: action.to_string(),
        message: match e {
            NftError::Spawn { source, .. } => format!(
                "cannot run {}: {source} (the agent needs the nftables `nft` binary)",
                nft.display()
            ),
            other => other.to_string(),
        },
    })
}

/// Base chains of other tables on the forward hook whose policy is drop:
/// their verdict wins over our accept (e.g. Docker's `filter FORWARD`).
pub fn foreign_forward_drop_chains(nft: &Path, netns: Option<&File>) -> Result<Vec<String>> {
    let json = run(nft, netns, &["-j", "list", "chains"], None, "list chains")?;
    let value: serde_json::Value = serde_json::from_str(&json).map_err(|e| AgentError::Nft {
        action: "list chains".into(),
        message: format!("unparsable JSON: {e}"),
    })?;
    let mut found = Vec::new();
    for item in value
        .get("nftables")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
    {
        let Some(chain) = item.get("chain") else {
            continue;
        };
        let field = |k: &str| chain.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        if field("hook") == "forward" && field("policy") == "drop" && field("table") != TABLE {
            found.push(format!(
                "{} {} {}",
                field("family"),
                field("table"),
                field("name")
            ));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().expect("test net")).collect()
    }

    #[test]
    fn dual_stack_ruleset() {
        let text = ruleset(&NatPolicy {
            cluster_cidrs: nets(&["10.244.0.0/16", "fd00:10:244::/56"]),
            pod_cidrs: nets(&["10.244.1.0/24", "fd00:10:244:1::/64"]),
            masquerade: true,
        });
        assert!(text.contains("ip saddr 10.244.0.0/16 counter accept"));
        assert!(text.contains("ip6 daddr fd00:10:244::/56 counter accept"));
        assert!(
            text.contains("ip saddr 10.244.1.0/24 ip daddr != 10.244.0.0/16 counter masquerade")
        );
        assert!(text.contains(
            "ip6 saddr fd00:10:244:1::/64 ip6 daddr != fd00:10:244::/56 counter masquerade"
        ));
    }

    #[test]
    fn a_listing_with_counters_matches_its_policy() {
        let policy = NatPolicy {
            cluster_cidrs: nets(&["10.244.0.0/16", "10.245.0.0/16"]),
            pod_cidrs: nets(&["10.244.1.0/24"]),
            masquerade: true,
        };
        let listing = "table inet cnilab_agent {\n\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tip saddr { 10.244.0.0/16, 10.245.0.0/16 } counter packets 3 bytes 252 accept\n\t\tip daddr { 10.244.0.0/16, 10.245.0.0/16 } counter packets 0 bytes 0 accept\n\t}\n\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip saddr 10.244.1.0/24 ip daddr != { 10.244.0.0/16, 10.245.0.0/16 } counter packets 1 bytes 84 masquerade\n\t}\n}\n";
        assert!(listing_matches(listing, &policy));
        let other = NatPolicy {
            masquerade: false,
            ..policy
        };
        assert!(!listing_matches(listing, &other));
    }

    #[test]
    fn no_masquerade_no_nat_chain() {
        let text = ruleset(&NatPolicy {
            cluster_cidrs: nets(&["10.244.0.0/16"]),
            pod_cidrs: nets(&["10.244.1.0/24"]),
            masquerade: false,
        });
        assert!(!text.contains("postrouting"));
    }

    #[test]
    fn no_masquerade_for_a_family_without_cluster_cidr() {
        let text = ruleset(&NatPolicy {
            cluster_cidrs: nets(&["10.244.0.0/16"]),
            pod_cidrs: nets(&["10.244.1.0/24", "fd00:10:244:1::/64"]),
            masquerade: true,
        });
        assert!(!text.contains("ip6 saddr"));
    }
}
