//! Summaries that make a report readable when something breaks: failures
//! grouped by cause (one line per diagnosis, with its count and one example
//! probe), the node × node reachability matrix per address family, and the
//! node (or pod) a diagnosis is about, which the HTML drawing marks.

use super::diagnosis::{Diagnosis, Failure};
use super::probe::{ProbeOutcome, FAMILIES};
use std::fmt::Write as _;

/// One cause: a diagnosis, how many failed probes it explains, and one of them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Cause {
    pub id: &'static str,
    /// The first message given (for a traced cause, about one probe; the
    /// others differ only in their source, destination or protocol).
    pub message: String,
    /// Failed probes this diagnosis was given to.
    pub count: usize,
    /// One of them (`from (ip) → to (ip) family proto: error`).
    pub example: String,
    /// The example's check group.
    pub example_group: String,
    /// Every check group with probes it explains, and how many.
    pub groups: std::collections::BTreeMap<String, usize>,
    /// The protocols of the probes it explains.
    pub protocols: std::collections::BTreeSet<&'static str>,
}

/// The root a diagnosis names: for a traced cause, where the packet (or
/// its answer: the same route kills both) died, the cause and the object
/// (`died at node1: blackhole-route route 10.244.2.0/24`), the same for
/// every probe it killed whatever the probe's source, destination,
/// protocol or group; else the whole message.
fn root(d: &Diagnosis) -> String {
    let m = d.message.as_str();
    let Some(at) = m.find("died at ") else {
        return m.to_string();
    };
    let rest = &m[at..];
    // `died at NS: CAUSE OBJECT: evidence…`: up to the second `: `.
    let end = rest.find(": ").and_then(|first| {
        let after = first + 2;
        rest[after..].find(": ").map(|second| after + second)
    });
    match end {
        Some(end) => rest[..end].to_string(),
        None => m.to_string(),
    }
}

/// The failures grouped by root cause (same id and root: one entry however
/// many groups, protocols and pairs it explains), most frequent first;
/// ties keep the order in which they were first seen.
pub fn causes(failures: &[Failure]) -> Vec<Cause> {
    let mut out: Vec<(String, Cause)> = Vec::new();
    for f in failures {
        for d in &f.diagnoses {
            // Unexplained failures are one cause ("nothing matched"); the
            // example names a probe, JSON has each.
            let (key, message) = if d.id == Diagnosis::UNDIAGNOSED {
                let m = "no known cause matched".to_string();
                (m.clone(), m)
            } else {
                (root(d), d.message.clone())
            };
            let group = f.outcome.spec.group.to_string();
            let proto = f.outcome.spec.proto.as_str();
            let at = out.iter().position(|(k, c)| c.id == d.id && *k == key);
            let c = match at {
                Some(i) => &mut out[i].1,
                None => {
                    out.push((
                        key,
                        Cause {
                            id: d.id,
                            message,
                            count: 0,
                            example: f.outcome.describe(),
                            example_group: group.clone(),
                            groups: Default::default(),
                            protocols: Default::default(),
                        },
                    ));
                    let last = out.len() - 1;
                    &mut out[last].1
                }
            };
            c.count += 1;
            *c.groups.entry(group).or_default() += 1;
            c.protocols.insert(proto);
        }
    }
    // Stable: equal counts keep their first-seen order.
    let mut out: Vec<Cause> = out.into_iter().map(|(_, c)| c).collect();
    out.sort_by_key(|c| std::cmp::Reverse(c.count));
    out
}

impl Cause {
    /// `service/cluster-ip ×12100, pod-to-pod/same-node ×330; icmp, tcp,
    /// udp`: where it was seen, when that is more than one group or
    /// protocol.
    pub fn spread(&self) -> Option<String> {
        if self.groups.len() < 2 && self.protocols.len() < 2 {
            return None;
        }
        let mut groups: Vec<(&String, &usize)> = self.groups.iter().collect();
        groups.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
        let groups: Vec<String> = groups.iter().map(|(g, n)| format!("{g} ×{n}")).collect();
        let protocols: Vec<&str> = self.protocols.iter().copied().collect();
        Some(format!("{}; {}", groups.join(", "), protocols.join(", ")))
    }
}

/// Probes between the nodes (and their pods) of one family, as a square
/// matrix: `cells[from][to] = (probes, passed)`; JSON:
/// `[[{"probes": 14, "passed": 14}, …], …]`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct FamilyMatrix {
    pub family: &'static str,
    pub nodes: Vec<String>,
    #[serde(serialize_with = "cell_objects")]
    pub cells: Vec<Vec<(usize, usize)>>,
}

fn cell_objects<S: serde::Serializer>(
    rows: &[Vec<(usize, usize)>],
    s: S,
) -> Result<S::Ok, S::Error> {
    struct Row<'a>(&'a [(usize, usize)]);
    impl serde::Serialize for Row<'_> {
        fn serialize<S2: serde::Serializer>(&self, s: S2) -> Result<S2::Ok, S2::Error> {
            crate::report::pairs_as_objects(self.0, "probes", "passed", s)
        }
    }
    s.collect_seq(rows.iter().map(|r| Row(r)))
}

impl FamilyMatrix {
    pub fn failed(&self) -> usize {
        self.cells.iter().flatten().map(|(p, ok)| p - ok).sum()
    }
}

/// One matrix per family that has probes between nodes. A probe counts for
/// the node of its source and the node of its destination (pods count for
/// the node they run on).
pub fn matrices(nodes: &[String], outcomes: &[ProbeOutcome]) -> Vec<FamilyMatrix> {
    let n = nodes.len();
    FAMILIES
        .iter()
        .filter_map(|family| {
            let mut cells = vec![vec![(0usize, 0usize); n]; n];
            let mut any = false;
            for o in outcomes.iter().filter(|o| o.spec.family() == *family) {
                let (Some(a), Some(b)) = (o.spec.from.node, o.spec.to.node) else {
                    continue;
                };
                if a >= n || b >= n {
                    continue;
                }
                any = true;
                cells[a][b].0 += 1;
                if o.passed() {
                    cells[a][b].1 += 1;
                }
            }
            any.then(|| FamilyMatrix {
                family,
                nodes: nodes.to_vec(),
                cells,
            })
        })
        .collect()
}

/// The widest matrix the terminal shows; larger labs are shown by their
/// failing rows only.
const TERMINAL_MATRIX_NODES: usize = 16;

/// The matrix for a terminal: `ok` where every probe passed, `passed/probes`
/// where some failed, `·` where nothing was probed. Large labs show only
/// rows and columns with failures.
pub fn matrix_table(m: &FamilyMatrix) -> String {
    let n = m.nodes.len();
    let bad_row = |i: usize| m.cells[i].iter().any(|(p, ok)| p != ok);
    let bad_col = |j: usize| m.cells.iter().any(|r| r[j].0 != r[j].1);
    let (rows, cols): (Vec<usize>, Vec<usize>) = if n <= TERMINAL_MATRIX_NODES {
        ((0..n).collect(), (0..n).collect())
    } else {
        (
            (0..n).filter(|i| bad_row(*i)).collect(),
            (0..n).filter(|j| bad_col(*j)).collect(),
        )
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} reachability, node × node (row: from, column: to){}",
        m.family,
        if n > TERMINAL_MATRIX_NODES {
            format!(
                ": {n} nodes, {} with failures shown (the HTML report draws all)",
                rows.len().max(cols.len())
            )
        } else {
            String::new()
        }
    );
    if rows.is_empty() {
        let _ = writeln!(s, "  every probe between the {n} nodes passed");
        return s;
    }
    let cell = |(p, ok): (usize, usize)| {
        if p == 0 {
            "·".to_string()
        } else if p == ok {
            "ok".to_string()
        } else {
            format!("{ok}/{p}")
        }
    };
    let width = cols
        .iter()
        .map(|j| m.nodes[*j].chars().count())
        .chain(
            rows.iter()
                .flat_map(|i| cols.iter().map(|j| cell(m.cells[*i][*j]).len())),
        )
        .max()
        .unwrap_or(2)
        .max(2);
    let first = rows
        .iter()
        .map(|i| m.nodes[*i].chars().count())
        .max()
        .unwrap_or(4);
    let _ = write!(s, "  {:first$}", "");
    for j in &cols {
        let _ = write!(s, " {:>width$}", m.nodes[*j]);
    }
    let _ = writeln!(s);
    for i in &rows {
        let _ = write!(s, "  {:first$}", m.nodes[*i]);
        for j in &cols {
            let _ = write!(s, " {:>width$}", cell(m.cells[*i][*j]));
        }
        let _ = writeln!(s);
    }
    s
}

/// Whether `word` occurs in `text` on its own (not inside a longer name:
/// `node1` is not in `node10`).
fn position_of_word(text: &str, word: &str) -> Option<usize> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let mut from = 0;
    while let Some(at) = text.get(from..)?.find(word) {
        let start = from + at;
        let end = start + word.len();
        let before = text[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !is_name(c));
        let after = text[end..].chars().next().is_none_or(|c| !is_name(c));
        if before && after {
            return Some(start);
        }
        from = end;
    }
    None
}

/// The one of `names` a diagnosis is about: the one its message names first.
pub fn subject<'a>(d: &Diagnosis, names: &[&'a str]) -> Option<&'a str> {
    names
        .iter()
        .filter_map(|n| position_of_word(&d.message, n).map(|at| (at, *n)))
        .min_by_key(|(at, _)| *at)
        .map(|(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectivity::{Endpoint, ProbeSpec, Proto};
    use std::net::IpAddr;

    #[test]
    fn matrix_cells_are_objects_in_json() {
        let m = FamilyMatrix {
            family: "IPv4",
            nodes: vec!["node1".into(), "node2".into()],
            cells: vec![vec![(14, 14), (6, 3)], vec![(6, 6), (0, 0)]],
        };
        let v = serde_json::to_value(&m).expect("JSON");
        assert_eq!(
            v["cells"][0][1],
            serde_json::json!({"probes": 6, "passed": 3})
        );
    }

    fn outcome(from: usize, to: usize, ip: &str, ok: bool) -> ProbeOutcome {
        let ep = |n: usize| Endpoint {
            name: format!("node{}/p", n + 1),
            node: Some(n),
            pod: Some(0),
            ip: ip.parse::<IpAddr>().expect("ip"),
            external: false,
        };
        ProbeOutcome {
            spec: ProbeSpec {
                group: "pod-to-pod/cross-node",
                from: ep(from),
                to: ep(to),
                proto: Proto::Icmp,
                expect_source: None,
                service: None,
            },
            error: (!ok).then(|| "timed out".to_string()),
            seen_source: None,
            rtt_ms: None,
        }
    }

    fn failure(o: ProbeOutcome, id: &'static str, message: &str) -> Failure {
        Failure {
            index: 0,
            outcome: o,
            diagnoses: vec![Diagnosis {
                id,
                message: message.into(),
            }],
        }
    }

    #[test]
    fn failures_are_grouped_by_cause_with_a_count_and_an_example() {
        let route = "node1 has no route to 10.244.2.0/24";
        let mut failures: Vec<Failure> = (0..20)
            .map(|_| failure(outcome(0, 1, "10.244.2.2", false), "missing-route", route))
            .collect();
        failures.push(failure(
            outcome(1, 0, "fd00::2", false),
            "rp-filter",
            "strict on node1",
        ));
        let got = causes(&failures);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!((got[0].id, got[0].count), ("missing-route", 20));
        assert!(
            got[0].example.contains("IPv4 icmp: timed out"),
            "{:?}",
            got[0]
        );
        assert_eq!((got[1].id, got[1].count), ("rp-filter", 1));
        assert!(got[1].example.contains("IPv6"), "{:?}", got[1]);
    }

    /// A 3-node lab with one blackhole route on node1: every probe it
    /// kills, whatever its pair, protocol or group, is one cause on that
    /// route; a death elsewhere, or of the answer, is another.
    #[test]
    fn one_root_cause_is_one_entry_across_pairs_protocols_and_groups() {
        let traced = |from: &str, to: &str, at: &str, object: &str, proto: &str| {
            format!(
                "traced {from} → {to}: died at {at}: blackhole-route {object}:                  ip route get 10.244.2.2 from 10.244.1.2 iif veth1: EINVAL; reproduce:                  cnilab lab trace --name l {from} {to}{proto}"
            )
        };
        let mut failures = Vec::new();
        for (k, proto) in [
            (Proto::Icmp, ""),
            (Proto::Tcp, " --proto tcp"),
            (Proto::Udp, " --proto udp"),
        ] {
            for (from, to, group) in [
                ("node1/a", "node2/b", "pod-to-pod/cross-node"),
                ("node1/c", "node3/d", "pod-to-pod/cross-node"),
                ("node1/a", "node2", "pod-to-node"),
            ] {
                let mut o = outcome(0, 1, "10.244.2.2", false);
                o.spec.proto = k;
                o.spec.group = group;
                let m = traced(from, to, "node1", "route 10.244.2.0/24", proto);
                failures.push(failure(o, "blackhole-route", &m));
            }
        }
        let elsewhere = traced("node2/b", "node3/d", "node2", "route 10.244.3.0/24", "");
        failures.push(failure(
            outcome(1, 2, "10.244.3.2", false),
            "blackhole-route",
            &elsewhere,
        ));
        let answer = "traced node3 → node1/a: it arrived, and its answer died at node1: kernel-drop dev veth1: the answer was dropped; reproduce: x";
        failures.push(failure(
            outcome(2, 0, "10.244.1.2", false),
            "kernel-drop",
            answer,
        ));
        let got = causes(&failures);
        assert_eq!(got.len(), 3, "{got:#?}");
        assert_eq!((got[0].id, got[0].count), ("blackhole-route", 9));
        assert_eq!(got[0].groups.get("pod-to-pod/cross-node"), Some(&6));
        assert_eq!(got[0].groups.get("pod-to-node"), Some(&3));
        assert_eq!(got[0].protocols.len(), 3);
        let spread = got[0].spread().expect("spread");
        assert_eq!(
            spread,
            "pod-to-pod/cross-node ×6, pod-to-node ×3; icmp, tcp, udp"
        );
        assert_eq!(
            root(&failures[9].diagnoses[0]),
            "died at node2: blackhole-route route 10.244.3.0/24"
        );
        assert_eq!(
            root(&failures[10].diagnoses[0]),
            "died at node1: kernel-drop dev veth1"
        );
        assert!(got[1].spread().is_none());
    }

    #[test]
    fn matrix_counts_per_family_and_marks_failures() {
        let nodes = vec!["node1".to_string(), "node2".to_string()];
        let outcomes = vec![
            outcome(0, 1, "10.244.2.2", false),
            outcome(0, 1, "10.244.2.2", true),
            outcome(1, 0, "10.244.1.2", true),
            outcome(1, 1, "fd00::3", true),
        ];
        let m = matrices(&nodes, &outcomes);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].family, m[1].family), ("IPv4", "IPv6"));
        assert_eq!(m[0].cells[0][1], (2, 1));
        assert_eq!(m[0].failed(), 1);
        let table = matrix_table(&m[0]);
        assert!(table.contains("1/2") && table.contains("ok"), "{table}");
        assert_eq!(m[1].cells[1][1], (1, 1));
    }

    #[test]
    fn subject_is_the_first_node_named() {
        let d = Diagnosis {
            id: "missing-route",
            message: "node10 has no route to node1's podCIDR".into(),
        };
        assert_eq!(subject(&d, &["node1", "node10"]), Some("node10"));
        let none = Diagnosis {
            id: "x",
            message: "nothing".into(),
        };
        assert_eq!(subject(&none, &["node1"]), None);
    }
}
