//! Real kube-proxy Services, as its iptables mode writes them and a capture
//! holds them: `KUBE-SERVICES` matches a ClusterIP, protocol and port and
//! jumps to `KUBE-SVC-…`, which picks one `KUBE-SEP-…` chain, which DNATs
//! to the endpoint. Not the lab's own Service (`table ip kube-proxy`,
//! [`super::services`]).
//!
//! Where things happen: [`from_iptables_save`] and [`from_nft`] read the
//! two texts a capture holds (`iptables-save`, with kube-proxy's comments
//! naming the Services; `nft list ruleset`, where iptables-nft's chains
//! show without them), both through one rule reader and [`assemble`], pure;
//! [`of_namespace`] picks them for a captured namespace and [`merge`] makes
//! the union over a replay's nodes (the topology's `kube_services`, which
//! `services::probes` probes); [`diagnose`] names
//! the node and the chain of a failed probe: a Service its node lacks, an
//! endpoint chain without a DNAT rule, or one that DNATs elsewhere than
//! the other nodes'.

use super::built::Lab;
use super::facts::NodeFacts;
use super::topology::shapes::{KubeEndpoint, KubeService};
use crate::connectivity::{Diagnosis, ProbeOutcome};
use crate::model::Namespace;
use std::net::{IpAddr, SocketAddr};

/// What one rule of a nat chain says, as far as the Services go.
#[derive(Debug, Default)]
struct Rule {
    chain: String,
    daddr: Option<IpAddr>,
    proto: Option<String>,
    dport: Option<u16>,
    jump: Option<String>,
    dnat: Option<SocketAddr>,
    comment: Option<String>,
}

/// Splits a rule into words, a double-quoted string being one word.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// An address as a rule writes it (`10.96.0.10`, `10.96.0.10/32`).
fn host(word: &str) -> Option<IpAddr> {
    word.split('/').next()?.parse().ok()
}

/// `-A CHAIN …` of `iptables-save`.
fn iptables_rule(line: &str) -> Option<Rule> {
    let w = words(line.strip_prefix("-A ")?);
    let mut r = Rule {
        chain: w.first()?.clone(),
        ..Rule::default()
    };
    for (k, word) in w.iter().enumerate().skip(1) {
        let next = w.get(k + 1);
        match word.as_str() {
            "-d" | "--destination" => r.daddr = next.and_then(|v| host(v)),
            "-p" | "--protocol" => r.proto = next.cloned(),
            "--dport" | "--destination-port" => r.dport = next.and_then(|v| v.parse().ok()),
            "-j" | "--jump" | "-g" | "--goto" => r.jump = next.cloned(),
            "--to-destination" => r.dnat = next.and_then(|v| v.parse().ok()),
            "--comment" => r.comment = next.cloned(),
            _ => {}
        }
    }
    Some(r)
}

/// A rule line of `nft list ruleset`, inside chain `chain`.
fn nft_rule(chain: &str, line: &str) -> Rule {
    let w = words(line);
    let mut r = Rule {
        chain: chain.to_string(),
        ..Rule::default()
    };
    for (k, word) in w.iter().enumerate() {
        let next = w.get(k + 1);
        match (w.get(k.wrapping_sub(1)).map(String::as_str), word.as_str()) {
            (Some("ip" | "ip6"), "daddr") => r.daddr = next.and_then(|v| host(v)),
            (Some("l4proto" | "protocol" | "nexthdr"), p) => r.proto = Some(p.to_string()),
            (Some("tcp" | "udp" | "sctp"), "dport") => {
                r.dport = next.and_then(|v| v.parse().ok());
            }
            (_, "jump" | "goto") => r.jump = next.cloned(),
            (Some("dnat"), "to") => r.dnat = next.and_then(|v| v.parse().ok()),
            (_, "comment") => r.comment = next.cloned(),
            _ => {}
        }
    }
    r
}

/// The rules of chain `c`.
fn in_chain<'a>(rules: &'a [Rule], c: &'a str) -> impl Iterator<Item = &'a Rule> + 'a {
    rules.iter().filter(move |r| r.chain == c)
}

/// The Services the nat rules of one node make.
fn assemble(rules: &[Rule]) -> Vec<KubeService> {
    let mut out: Vec<KubeService> = Vec::new();
    for r in in_chain(rules, "KUBE-SERVICES") {
        let (Some(ip), Some(port), Some(svc)) = (r.daddr, r.dport, r.jump.as_deref()) else {
            continue;
        };
        if !svc.starts_with("KUBE-SVC-") {
            continue;
        }
        let mut endpoints: Vec<KubeEndpoint> = Vec::new();
        for sep in in_chain(rules, svc).filter_map(|r| r.jump.as_deref()) {
            if sep.starts_with("KUBE-SEP-") && !endpoints.iter().any(|e| e.chain == sep) {
                endpoints.push(KubeEndpoint {
                    chain: sep.to_string(),
                    dnat: in_chain(rules, sep).find_map(|r| r.dnat),
                });
            }
        }
        let name = r
            .comment
            .as_deref()
            .map(|c| c.trim_end_matches(" cluster IP").to_string())
            .unwrap_or_else(|| svc.to_string());
        out.push(KubeService {
            name,
            chain: svc.to_string(),
            cluster_ip: ip,
            proto: r.proto.clone().unwrap_or_else(|| "tcp".into()),
            port,
            endpoints,
        });
    }
    out
}

/// The Services of `iptables-save` text (its `*nat` table).
pub fn from_iptables_save(text: &str) -> Vec<KubeService> {
    let mut table = "";
    let mut rules = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(t) = line.strip_prefix('*') {
            table = t;
        } else if table == "nat" {
            rules.extend(iptables_rule(line));
        }
    }
    assemble(&rules)
}

/// The Services of `nft list ruleset` text (iptables-nft's `table ip nat`
/// and `table ip6 nat`).
pub fn from_nft(text: &str) -> Vec<KubeService> {
    let mut in_nat = false;
    let mut chain: Option<&str> = None;
    let mut rules = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(t) = line.strip_prefix("table ") {
            in_nat = matches!(t.trim_end_matches('{').trim(), "ip nat" | "ip6 nat");
            chain = None;
        } else if let Some(c) = line.strip_prefix("chain ") {
            chain = Some(c.trim_end_matches('{').trim());
        } else if line == "}" {
            chain = None;
        } else if let (true, Some(c)) = (in_nat, chain) {
            rules.push(nft_rule(c, line));
        }
    }
    assemble(&rules)
}

/// The Services a captured namespace holds: from its `iptables-save`
/// texts (legacy and iptables-nft, with the comments), else from its
/// nftables.
pub fn of_namespace(ns: &Namespace) -> Vec<KubeService> {
    let saved: Vec<KubeService> = ns
        .iptables
        .iter()
        .flat_map(|t| from_iptables_save(&t.text))
        .collect();
    if !saved.is_empty() {
        return saved;
    }
    let nft: String = ns
        .nftables
        .iter()
        .map(|t| t.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    from_nft(&nft)
}

fn key(s: &KubeService) -> (IpAddr, &str, u16) {
    (s.cluster_ip, s.proto.as_str(), s.port)
}

/// The union over nodes: one Service per ClusterIP, protocol and port
/// (named by a node that had kube-proxy's comment), every endpoint chain
/// any node has, each with the DNAT target most nodes agree on.
pub fn merge(nodes: &[Vec<KubeService>]) -> Vec<KubeService> {
    let mut out: Vec<KubeService> = Vec::new();
    for s in nodes.iter().flatten() {
        match out.iter_mut().find(|o| key(o) == key(s)) {
            None => out.push(s.clone()),
            Some(o) => {
                if o.name == o.chain {
                    o.name.clone_from(&s.name);
                }
                for e in &s.endpoints {
                    if !o.endpoints.iter().any(|x| x.chain == e.chain) {
                        o.endpoints.push(e.clone());
                    }
                }
            }
        }
    }
    for s in &mut out {
        let k = (s.cluster_ip, s.proto.clone(), s.port);
        for e in &mut s.endpoints {
            e.dnat = majority(nodes, (k.0, &k.1, k.2), &e.chain);
        }
    }
    out
}

/// The DNAT target of endpoint chain `chain` of Service `k` most nodes hold.
fn majority(nodes: &[Vec<KubeService>], k: (IpAddr, &str, u16), chain: &str) -> Option<SocketAddr> {
    let targets: Vec<SocketAddr> = nodes
        .iter()
        .flatten()
        .filter(|s| key(s) == k)
        .flat_map(|s| &s.endpoints)
        .filter(|e| e.chain == chain)
        .filter_map(|e| e.dnat)
        .collect();
    let count = |t: &SocketAddr| targets.iter().filter(|x| *x == t).count();
    targets.iter().copied().max_by_key(|t| count(t))
}

/// Why a probe to a captured Service failed, by the source node's live
/// nat rules (`facts`) against the Service the replay holds: the node has
/// no `KUBE-SERVICES` rule for it, or an endpoint chain there has no DNAT
/// rule, or DNATs elsewhere than the other nodes'.
pub fn diagnose(lab: &Lab, facts: &[NodeFacts], o: &ProbeOutcome, out: &mut Vec<Diagnosis>) {
    let spec = &o.spec;
    let Some(via) = &spec.service else { return };
    let Some(src) = spec.from.node.and_then(|i| facts.get(i)) else {
        return;
    };
    let wanted = lab
        .topo
        .kube_services
        .iter()
        .find(|s| s.cluster_ip == spec.to.ip && s.port == via.port);
    let Some(want) = wanted else { return };
    let node = &src.name;
    let what = format!(
        "Service {} ({}:{}/{})",
        want.name, want.cluster_ip, want.port, want.proto
    );
    let have = from_nft(&src.ruleset);
    let Some(have) = have.iter().find(|s| key(s) == key(want)) else {
        out.push(Diagnosis {
            id: "kube-proxy-service-missing",
            message: format!(
                "{node} has no KUBE-SERVICES rule for {what} (chain {}): traffic to the ClusterIP leaves {node} un-NATed and nothing answers",
                want.chain
            ),
        });
        return;
    };
    for e in &want.endpoints {
        let there = have.endpoints.iter().find(|h| h.chain == e.chain);
        let target = e.dnat.map_or("its endpoint".to_string(), |d| d.to_string());
        match there.map(|h| h.dnat) {
            None => out.push(Diagnosis {
                id: "kube-proxy-endpoint-missing",
                message: format!(
                    "{node}'s {} never jumps to {} (the endpoint {target} of {what} on the other nodes): connections from {node} never reach it",
                    want.chain, e.chain
                ),
            }),
            Some(None) => out.push(Diagnosis {
                id: "kube-proxy-endpoint-dnat-missing",
                message: format!(
                    "{node}'s endpoint chain {} of {what} has no DNAT rule (the other nodes DNAT to {target}): a connection {} sends there falls through un-NATed to the ClusterIP and nothing answers",
                    e.chain, want.chain
                ),
            }),
            Some(Some(got)) if e.dnat.is_some_and(|d| d != got) => out.push(Diagnosis {
                id: "kube-proxy-endpoint-wrong",
                message: format!(
                    "{node}'s endpoint chain {} of {what} DNATs to {got}; the other nodes DNAT it to {target}",
                    e.chain
                ),
            }),
            Some(Some(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube-proxy's iptables mode on one node, as `iptables-save` prints
    /// it: Service web (two endpoints) and db (one, whose DNAT rule is
    /// gone), a filter table with a KUBE-SERVICES chain of its own.
    const SAVE: &str = r#"*filter
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.99/32 -p tcp -m comment --comment "default/none:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-WEB4HTTP - [0:0]
:KUBE-SVC-DB - [0:0]
:KUBE-SEP-NODE1WEB - [0:0]
:KUBE-SEP-NODE2WEB - [0:0]
:KUBE-SEP-DB - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SEP-DB -s 10.244.2.2/32 -m comment --comment "default/db:pg" -j KUBE-MARK-MASQ
-A KUBE-SEP-NODE1WEB -s 10.244.1.2/32 -m comment --comment "default/web:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-NODE1WEB -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.1.2:8080
-A KUBE-SEP-NODE2WEB -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.2.2:8080
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEB4HTTP
-A KUBE-SERVICES -d 10.96.0.20/32 -p udp -m comment --comment "default/db:pg cluster IP" -m udp --dport 5432 -j KUBE-SVC-DB
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-WEB4HTTP ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-WEB4HTTP -m comment --comment "default/web:http -> 10.244.1.2:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-NODE1WEB
-A KUBE-SVC-WEB4HTTP -m comment --comment "default/web:http -> 10.244.2.2:8080" -j KUBE-SEP-NODE2WEB
-A KUBE-SVC-DB -m comment --comment "default/db:pg -> 10.244.2.2:5432" -j KUBE-SEP-DB
COMMIT
"#;

    /// The same chains as `nft list ruleset` shows iptables-nft's (no
    /// comments), next to a table of another name with a look-alike chain.
    const NFT: &str = "table ip filter {
	chain KUBE-SERVICES {
		meta l4proto tcp ip daddr 10.96.0.99  tcp dport 80 counter packets 0 bytes 0 reject
	}
}
table ip nat {
	chain KUBE-SERVICES {
		meta l4proto tcp ip daddr 10.96.0.10  tcp dport 80 counter packets 0 bytes 0 jump KUBE-SVC-WEB4HTTP
		meta l4proto udp ip daddr 10.96.0.20  udp dport 5432 counter packets 0 bytes 0 jump KUBE-SVC-DB
	}

	chain KUBE-SVC-WEB4HTTP {
		 meta random & 2147483647 < 1073741824 counter packets 0 bytes 0 jump KUBE-SEP-NODE1WEB
		counter packets 0 bytes 0 jump KUBE-SEP-NODE2WEB
	}

	chain KUBE-SVC-DB {
		counter packets 0 bytes 0 jump KUBE-SEP-DB
	}

	chain KUBE-SEP-NODE1WEB {
		ip saddr 10.244.1.2  counter packets 0 bytes 0 jump KUBE-MARK-MASQ
		meta l4proto tcp   counter packets 0 bytes 0 dnat to 10.244.1.2:8080
	}

	chain KUBE-SEP-NODE2WEB {
		meta l4proto tcp   counter packets 0 bytes 0 dnat to 10.244.2.2:8080
	}

	chain KUBE-SEP-DB {
		ip saddr 10.244.2.2  counter packets 0 bytes 0 jump KUBE-MARK-MASQ
	}
}
table ip other {
	chain KUBE-SERVICES {
		ip daddr 10.96.0.77 tcp dport 1 jump KUBE-SVC-OTHER
	}
}
";

    fn ep(chain: &str, dnat: Option<&str>) -> KubeEndpoint {
        KubeEndpoint {
            chain: chain.into(),
            dnat: dnat.map(|d| d.parse().expect("socket address")),
        }
    }

    fn web(name: &str) -> KubeService {
        KubeService {
            name: name.into(),
            chain: "KUBE-SVC-WEB4HTTP".into(),
            cluster_ip: "10.96.0.10".parse().expect("ip"),
            proto: "tcp".into(),
            port: 80,
            endpoints: vec![
                ep("KUBE-SEP-NODE1WEB", Some("10.244.1.2:8080")),
                ep("KUBE-SEP-NODE2WEB", Some("10.244.2.2:8080")),
            ],
        }
    }

    fn db(name: &str) -> KubeService {
        KubeService {
            name: name.into(),
            chain: "KUBE-SVC-DB".into(),
            cluster_ip: "10.96.0.20".parse().expect("ip"),
            proto: "udp".into(),
            port: 5432,
            endpoints: vec![ep("KUBE-SEP-DB", None)],
        }
    }

    #[test]
    fn iptables_save_gives_the_nat_services_named_by_their_comments() {
        assert_eq!(
            from_iptables_save(SAVE),
            vec![web("default/web:http"), db("default/db:pg")]
        );
    }

    #[test]
    fn nft_gives_the_same_services_named_by_their_chains() {
        assert_eq!(
            from_nft(NFT),
            vec![web("KUBE-SVC-WEB4HTTP"), db("KUBE-SVC-DB")]
        );
    }

    #[test]
    fn merge_keeps_a_comment_name_every_chain_and_the_majority_target() {
        let mut wrong = web("KUBE-SVC-WEB4HTTP");
        wrong.endpoints[0].dnat = Some("10.244.1.2:9999".parse().expect("addr"));
        let mut fixed_db = db("default/db:pg");
        fixed_db.endpoints[0].dnat = Some("10.244.2.2:5432".parse().expect("addr"));
        let merged = merge(&[
            from_nft(NFT),
            vec![web("default/web:http"), fixed_db.clone()],
            vec![web("KUBE-SVC-WEB4HTTP"), wrong],
        ]);
        assert_eq!(merged, vec![web("default/web:http"), fixed_db]);
        // A name from a comment wins over a chain's.
        let named = merge(&[
            vec![web("KUBE-SVC-WEB4HTTP")],
            vec![web("default/web:http")],
        ]);
        assert_eq!(named[0].name, "default/web:http");
    }

    #[test]
    fn rules_without_a_service_shape_give_nothing() {
        assert!(
            from_iptables_save("*nat\n-A KUBE-SERVICES -j KUBE-NODEPORTS\nCOMMIT\n").is_empty()
        );
        assert!(
            from_nft("table ip nat {\n\tchain POSTROUTING {\n\t\tmasquerade\n\t}\n}\n").is_empty()
        );
        assert!(from_iptables_save("").is_empty());
    }
}
