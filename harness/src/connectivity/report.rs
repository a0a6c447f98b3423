//! The connectivity report (lab and `e2e check`): a terminal summary in the spirit of `cilium
//! connectivity test`, JSON, JUnit XML, and one self-contained HTML file
//! (inline SVG, no external assets) to attach to bug reports.

use super::diagnosis::Diagnosis;
/// A failed probe and its diagnoses (with the diagnoses, below the summary).
pub use super::diagnosis::Failure;
use super::probe::{ProbeOutcome, FAMILIES};
use super::summary::{self, Cause, FamilyMatrix};
use crate::report::escape as xml;
use std::fmt::Write as _;
use std::time::Duration;

#[derive(Clone, Debug, serde::Serialize)]
pub struct GroupResult {
    pub name: String,
    pub probes: usize,
    pub passed: usize,
    /// The same counts per address family (`IPv4`, `IPv6`), families without probes left out.
    pub families: Vec<FamilyResult>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct FamilyResult {
    pub family: &'static str,
    pub probes: usize,
    pub passed: usize,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct NodeView {
    pub name: String,
    pub address: String,
    pub pod_cidr: Vec<String>,
    /// JSON: `[{"name": …, "ips": […]}]`.
    #[serde(serialize_with = "pods")]
    pub pods: Vec<(String, Vec<String>)>,
}

fn pods<S: serde::Serializer>(v: &[(String, Vec<String>)], s: S) -> Result<S::Ok, S::Error> {
    crate::report::pairs_as_objects(v, "name", "ips", s)
}

fn skipped<S: serde::Serializer>(v: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    crate::report::pairs_as_objects(v, "group", "reason", s)
}

fn phases<S: serde::Serializer>(v: &[(String, f64)], s: S) -> Result<S::Ok, S::Error> {
    crate::report::pairs_as_objects(v, "phase", "ms", s)
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub lab: String,
    pub plugin_dir: String,
    pub routing: String,
    pub nodes: Vec<NodeView>,
    pub groups: Vec<GroupResult>,
    pub failures: Vec<Failure>,
    /// The failures grouped by diagnosis, most frequent first.
    pub causes: Vec<Cause>,
    /// Node × node reachability, one matrix per family.
    pub matrix: Vec<FamilyMatrix>,
    /// Things that work but are wrong (a detour through a third node).
    pub warnings: Vec<Diagnosis>,
    /// Why the run could not tell (the simulator hit a host limit): the
    /// verdict is then neither pass nor fail (exit 3).
    pub inconclusive: Option<String>,
    /// What the lab lacks because the machine could not make it (a
    /// replayed capture's link kind or sysctl this kernel has not): the
    /// verdict is about the lab without it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_made: Vec<crate::model::apply::NotMade>,
    /// The groups that do not apply to this lab, each with why (a replay
    /// of nodes without Services skips `service/*`). JSON: `[{"group": …,
    /// "reason": …}]`, left out when empty.
    #[serde(serialize_with = "skipped", skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<(String, String)>,
    /// What a sampled plan covers (a lab over the probe budget), left out
    /// of the JSON when the plan was full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampled: Option<String>,
    pub probes: usize,
    /// JSON: `[{"phase": …, "ms": …}]`.
    #[serde(serialize_with = "phases")]
    pub phases_ms: Vec<(String, f64)>,
    #[serde(skip)]
    pub outcomes: Vec<ProbeOutcome>,
}

impl Report {
    /// A report of probes that did not run in a namespace lab (the
    /// in-cluster check of `cnilab e2e`): its own nodes, groups and subject.
    pub fn from_parts(
        title: &str,
        subject: &str,
        routing: &str,
        nodes: Vec<NodeView>,
        groups: &[&str],
        outcomes: Vec<ProbeOutcome>,
        failures: Vec<Failure>,
    ) -> Report {
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        Report {
            lab: title.to_string(),
            plugin_dir: subject.to_string(),
            routing: routing.to_string(),
            nodes,
            groups: group_results(groups, &outcomes),
            causes: summary::causes(&failures),
            matrix: summary::matrices(&names, &outcomes),
            failures,
            warnings: Vec::new(),
            inconclusive: None,
            not_made: Vec::new(),
            skipped: Vec::new(),
            sampled: None,
            probes: outcomes.len(),
            phases_ms: Vec::new(),
            outcomes,
        }
    }

    pub fn add_phase(&mut self, name: &str, d: Duration) {
        self.phases_ms
            .push((name.to_string(), d.as_secs_f64() * 1000.0));
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.probes > 0 && self.inconclusive.is_none()
    }

    /// Makes the report INCONCLUSIVE for `why` (a host limit that may have
    /// caused the failures) when there are failures and none has a named
    /// cause that the host limit cannot have made: a diagnosis made from
    /// the kernel's state (a route, a rule, a sysctl) stands whatever else
    /// happened on the host, and the report FAILs. An earlier reason is
    /// kept.
    pub fn inconclusive_unless_explained(&mut self, why: Option<String>) {
        let unexplained = !self.failures.is_empty()
            && self
                .failures
                .iter()
                .all(|f| f.diagnoses.iter().all(Diagnosis::could_be_host_limit));
        if unexplained && self.inconclusive.is_none() {
            self.inconclusive = why;
        }
    }

    /// The exit code: 0 pass, 1 fail, 3 inconclusive (the failures may be
    /// the simulator's, not the plugin's).
    pub fn exit_code(&self) -> u8 {
        use crate::report::exit::{FAIL, INCONCLUSIVE, PASS};
        if self.inconclusive.is_some() {
            INCONCLUSIVE
        } else if self.passed() {
            PASS
        } else {
            FAIL
        }
    }

    /// Every diagnosis id found, once each.
    pub fn diagnosis_ids(&self) -> Vec<&'static str> {
        let mut ids: Vec<&'static str> = self
            .failures
            .iter()
            .flat_map(|f| f.diagnoses.iter().map(|d| d.id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// One self-contained HTML page: topology drawing (the nodes a
    /// diagnosis names are marked, with their causes; pods are drawn as a
    /// compact grid), the node × node matrix per family, the causes, and
    /// every failed probe.
    pub fn html(&self) -> String {
        let svg = self.html_topology();
        let checks = self.html_checks();
        let matrix = self.html_matrix();
        let causes = self.html_causes();
        let pairs = self.html_failed_probes();
        let verdict = if let Some(why) = &self.inconclusive {
            format!("INCONCLUSIVE: {why}")
        } else if self.passed() {
            format!(
                "All {} checks ({} probes) passed",
                self.groups.len(),
                self.probes
            )
        } else {
            format!("{} of {} probes failed", self.failures.len(), self.probes)
        };
        let failures = if self.failures.is_empty() && self.warnings.is_empty() {
            "<p>none</p>".to_string()
        } else {
            format!("{causes}{pairs}")
        };
        format!(
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>cnilab lab {}</title><style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #999;padding:3px 8px;font-size:13px}}tr.ok,td.ok{{background:#d4edda}}tr.bad,td.bad{{background:#f8d7da}}tr.warn{{background:#fff3cd}}td.none{{color:#aaa}}</style></head><body><h1>cnilab lab: {}</h1><p>plugin {} · routing {} · <b>{}</b></p><h2>Topology</h2>{svg}<h2>Checks</h2>{checks}<h2>Reachability</h2>{matrix}<h2>Causes</h2>{failures}</body></html>\n",
            xml(&self.lab),
            xml(&self.lab),
            xml(&self.plugin_dir),
            xml(&self.routing),
            xml(&verdict),
        )
    }

    /// The topology drawing: the underlay switch, each node (red when a
    /// cause names it, orange when a warning does) with its pods as a grid
    /// of squares and its first causes.
    fn html_topology(&self) -> String {
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        // Causes per node (by the node each diagnosis names first) and per pod.
        let mut node_causes: Vec<Vec<&Cause>> = vec![Vec::new(); self.nodes.len()];
        let mut bad_pods: Vec<String> = Vec::new();
        for c in &self.causes {
            let d = Diagnosis {
                id: c.id,
                message: c.message.clone(),
            };
            if let Some(i) =
                summary::subject(&d, &names).and_then(|n| names.iter().position(|x| *x == n))
            {
                node_causes[i].push(c);
            }
            for node in &self.nodes {
                for (pod, _) in &node.pods {
                    if summary::subject(&d, &[pod.as_str()]).is_some() {
                        bad_pods.push(pod.clone());
                    }
                }
            }
        }
        let warned: Vec<usize> = self
            .warnings
            .iter()
            .filter_map(|w| {
                summary::subject(w, &names).and_then(|n| names.iter().position(|x| *x == n))
            })
            .collect();
        // Per row of the grid: 20 pods as small squares.
        const PER_ROW: usize = 20;
        let mut svg = String::new();
        let n = self.nodes.len().max(1);
        let columns = n.min(8);
        let rows_of_nodes = n.div_ceil(columns);
        let max_pods = self.nodes.iter().map(|x| x.pods.len()).max().unwrap_or(0);
        let pod_rows = max_pods.div_ceil(PER_ROW);
        let max_causes = node_causes.iter().map(Vec::len).max().unwrap_or(0).min(4);
        let box_h = 70 + 10 * pod_rows + 14 * max_causes;
        let width = 230 * columns + 40;
        let height = 60 + (box_h + 40) * rows_of_nodes;
        let _ = write!(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"monospace\" font-size=\"11\">");
        let _ = write!(svg, "<rect x=\"10\" y=\"10\" width=\"{}\" height=\"26\" fill=\"#dfe8f5\" stroke=\"#345\"/><text x=\"20\" y=\"28\">underlay switch</text>", width - 20);
        for (i, node) in self.nodes.iter().enumerate() {
            let x = 20 + 230 * (i % columns);
            let y = 60 + (box_h + 40) * (i / columns);
            let faulty = !node_causes[i].is_empty();
            let link_fault = node_causes[i].iter().any(|c| LINK_CAUSES.contains(&c.id));
            let (stroke, width_px) = if faulty {
                ("#c00", 3)
            } else if warned.contains(&i) {
                ("#d80", 3)
            } else {
                ("#345", 1)
            };
            let link = if link_fault {
                "#c00\" stroke-width=\"3"
            } else {
                "#345"
            };
            let _ = write!(
                svg,
                "<line x1=\"{}\" y1=\"36\" x2=\"{}\" y2=\"{y}\" stroke=\"{link}\"/>",
                x + 100,
                x + 100
            );
            let _ = write!(svg, "<rect x=\"{x}\" y=\"{y}\" width=\"210\" height=\"{box_h}\" rx=\"6\" fill=\"#f4f7fb\" stroke=\"{stroke}\" stroke-width=\"{width_px}\"><title>{}</title></rect>", xml(&node.name));
            // Three lines of text: the name (✗ when faulty), the address,
            // the pod CIDRs with the pod count.
            let (tx, mark) = (x + 8, if faulty { " ✗" } else { "" });
            let _ = write!(
                svg,
                "<text x=\"{tx}\" y=\"{}\" font-weight=\"bold\">{}{mark}</text><text x=\"{tx}\" y=\"{}\">{}</text><text x=\"{tx}\" y=\"{}\">{} · {} pods</text>",
                y + 16,
                xml(&node.name),
                y + 30,
                xml(&node.address),
                y + 44,
                xml(&node.pod_cidr.join(",")),
                node.pods.len()
            );
            for (k, (pod, ips)) in node.pods.iter().enumerate() {
                let fill = if bad_pods.contains(pod) {
                    "#c00"
                } else {
                    "#8c8"
                };
                let _ = write!(
                    svg,
                    "<rect x=\"{}\" y=\"{}\" width=\"8\" height=\"8\" fill=\"{fill}\"><title>{} {}</title></rect>",
                    x + 8 + 10 * (k % PER_ROW),
                    y + 52 + 10 * (k / PER_ROW),
                    xml(pod),
                    xml(&ips.join(","))
                );
            }
            for (k, c) in node_causes[i].iter().take(4).enumerate() {
                let _ = write!(
                    svg,
                    "<text x=\"{}\" y=\"{}\" fill=\"#c00\">{} ×{}<title>{}</title></text>",
                    x + 8,
                    y + 64 + 10 * pod_rows + 14 * k,
                    xml(c.id),
                    c.count,
                    xml(&c.message)
                );
            }
        }
        svg.push_str("</svg>");
        svg
    }

    /// Each check group's probes and passes per family.
    fn html_checks(&self) -> String {
        let mut checks = String::from(
            "<table><tr><th>check</th><th>family</th><th>probes</th><th>passed</th></tr>",
        );
        for g in &self.groups {
            for f in &g.families {
                let class = if f.passed == f.probes { "ok" } else { "bad" };
                let _ = write!(
                    checks,
                    "<tr class=\"{class}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    xml(&g.name),
                    f.family,
                    f.probes,
                    f.passed
                );
            }
        }
        checks.push_str("</table>");
        checks
    }

    /// The node × node matrix per family.
    fn html_matrix(&self) -> String {
        let mut matrix = String::new();
        for m in &self.matrix {
            let _ = write!(
                matrix,
                "<h3>{} (row: from, column: to; passed/probes)</h3><table class=\"m\"><tr><th></th>",
                m.family
            );
            for name in &m.nodes {
                let _ = write!(matrix, "<th>{}</th>", xml(name));
            }
            matrix.push_str("</tr>");
            for (i, row) in m.cells.iter().enumerate() {
                let _ = write!(matrix, "<tr><th>{}</th>", xml(&m.nodes[i]));
                for (p, ok) in row {
                    let class = if *p == 0 {
                        "none"
                    } else if p == ok {
                        "ok"
                    } else {
                        "bad"
                    };
                    let _ = write!(matrix, "<td class=\"{class}\">{ok}/{p}</td>");
                }
                matrix.push_str("</tr>");
            }
            matrix.push_str("</table>");
        }
        matrix
    }

    /// The causes, then the warnings.
    fn html_causes(&self) -> String {
        let mut causes = String::from(
            "<table><tr><th>cause</th><th>failed probes</th><th>diagnosis</th><th>example probe</th></tr>",
        );
        for c in &self.causes {
            let _ = write!(
                causes,
                "<tr class=\"bad\"><td><b>{}</b></td><td>{}</td><td>{}</td><td>[{}] {}{}</td></tr>",
                xml(c.id),
                c.count,
                xml(&c.message),
                xml(&c.example_group),
                xml(&c.example),
                c.spread()
                    .map(|s| format!("<br>in {}", xml(&s)))
                    .unwrap_or_default()
            );
        }
        for w in &self.warnings {
            let _ = write!(
                causes,
                "<tr class=\"warn\"><td><b>WARN {}</b></td><td>0</td><td>{}</td><td></td></tr>",
                xml(w.id),
                xml(&w.message)
            );
        }
        causes.push_str("</table>");
        causes
    }

    /// Every failed probe (up to [`MAX_HTML_FAILURES`]), folded.
    fn html_failed_probes(&self) -> String {
        let mut pairs = String::from("<details><summary>every failed probe</summary><table><tr><th>from</th><th>to</th><th>family</th><th>proto</th><th>result</th><th>diagnosis</th></tr>");
        for f in self.failures.iter().take(MAX_HTML_FAILURES) {
            let o = &f.outcome;
            let diag: Vec<String> = f
                .diagnoses
                .iter()
                .map(|d| format!("<b>{}</b>: {}", d.id, xml(&d.message)))
                .collect();
            let _ = write!(
                pairs,
                "<tr class=\"bad\"><td>{} ({})</td><td>{} ({})</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                xml(&o.spec.from.name),
                o.spec.from.ip,
                xml(&o.spec.to.name),
                o.spec.to.ip,
                o.spec.family(),
                o.spec.proto.as_str(),
                xml(o.error.as_deref().unwrap_or("")),
                diag.join("<br>")
            );
        }
        pairs.push_str("</table>");
        if self.failures.len() > MAX_HTML_FAILURES {
            let _ = write!(
                pairs,
                "<p>… and {} more (see -o json)</p>",
                self.failures.len() - MAX_HTML_FAILURES
            );
        }
        pairs.push_str("</details>");
        pairs
    }
}

/// Causes that are about a node's link to the underlay: the drawing marks the link.
const LINK_CAUSES: &[&str] = &["mtu-mismatch", "stale-neighbour", "bridge-down"];

/// Failed probes listed one by one in the HTML (JSON has them all).
const MAX_HTML_FAILURES: usize = 500;

/// How many causes the terminal lists (JSON has them all).
const MAX_CAUSES: usize = 20;

/// Probes and passes per group, in `groups` order, without empty groups.
fn group_results(groups: &[&str], outcomes: &[ProbeOutcome]) -> Vec<GroupResult> {
    groups
        .iter()
        .map(|g| {
            let mine: Vec<&ProbeOutcome> = outcomes.iter().filter(|o| o.spec.group == *g).collect();
            let families = FAMILIES
                .iter()
                .map(|family| {
                    let of: Vec<&&ProbeOutcome> =
                        mine.iter().filter(|o| o.spec.family() == *family).collect();
                    FamilyResult {
                        family,
                        probes: of.len(),
                        passed: of.iter().filter(|o| o.passed()).count(),
                    }
                })
                .filter(|f| f.probes > 0)
                .collect();
            GroupResult {
                name: g.to_string(),
                probes: mine.len(),
                passed: mine.iter().filter(|o| o.passed()).count(),
                families,
            }
        })
        .filter(|g| g.probes > 0)
        .collect()
}

impl crate::report::Rendered for Report {
    fn table(&self) -> String {
        let mut s = String::new();
        if let Some(sampled) = &self.sampled {
            let _ = writeln!(s, "🎯 {sampled}");
        }
        for g in &self.groups {
            let mark = if g.passed == g.probes { "✅" } else { "❌" };
            let families: Vec<String> = g
                .families
                .iter()
                .map(|f| format!("{} {}/{}", f.family, f.passed, f.probes))
                .collect();
            let _ = writeln!(
                s,
                "{mark} [{}] {}/{} probes passed ({})",
                g.name,
                g.passed,
                g.probes,
                families.join(", ")
            );
        }
        for (g, why) in &self.skipped {
            let _ = writeln!(s, "⏭️  SKIP [{g}] {why}");
        }
        let _ = writeln!(s);
        for m in &self.matrix {
            s.push_str(&summary::matrix_table(m));
        }
        if !self.matrix.is_empty() {
            let _ = writeln!(s);
        }
        let failed_groups = self.groups.iter().filter(|g| g.passed < g.probes).count();
        if self.passed() {
            let _ = writeln!(
                s,
                "✅ All {} checks ({} probes) passed",
                self.groups.len(),
                self.probes
            );
        } else {
            let _ = writeln!(
                s,
                "{} {failed_groups}/{} checks {} ({}/{} probes)",
                if self.inconclusive.is_some() {
                    "❔"
                } else {
                    "❌"
                },
                self.groups.len(),
                if self.inconclusive.is_some() {
                    "had failed probes, verdict INCONCLUSIVE (see the end)"
                } else {
                    "failed"
                },
                self.failures.len(),
                self.probes
            );
            let _ = writeln!(
                s,
                "Causes ({}; every failed probe is in -o json):",
                self.causes.len()
            );
            for c in self.causes.iter().take(MAX_CAUSES) {
                let _ = writeln!(
                    s,
                    "  ↳ {} ×{}: {}\n      e.g. [{}] {}",
                    c.id, c.count, c.message, c.example_group, c.example
                );
                if let Some(spread) = c.spread() {
                    let _ = writeln!(s, "      in {spread}");
                }
            }
            if self.causes.len() > MAX_CAUSES {
                let _ = writeln!(
                    s,
                    "  … and {} more causes (see -o json)",
                    self.causes.len() - MAX_CAUSES
                );
            }
            let ids = self.diagnosis_ids();
            if !ids.is_empty() {
                let _ = writeln!(s, "Likely causes: {}", ids.join(", "));
            }
        }
        for w in &self.warnings {
            let _ = writeln!(s, "⚠️  WARN {}: {}", w.id, w.message);
        }
        if let Some(why) = &self.inconclusive {
            let _ = writeln!(s, "❔ INCONCLUSIVE: {why}");
        }
        let phases: Vec<String> = self
            .phases_ms
            .iter()
            .map(|(p, ms)| format!("{p} {:.0} ms", ms))
            .collect();
        let _ = writeln!(s, "Phases: {}", phases.join(", "));
        s
    }

    fn json(&self) -> String {
        crate::report::json("LabReport", self)
    }

    /// JUnit XML: one suite per check group, one case per probe.
    fn junit(&self) -> String {
        use crate::report::junit::{Case, Report as Junit, Suite};
        let mut doc = Junit::new(format!("cnilab lab {}", self.lab));
        for g in &self.groups {
            let mut suite = Suite::new(&g.name);
            for (i, o) in self
                .outcomes
                .iter()
                .enumerate()
                .filter(|(_, o)| o.spec.group == g.name)
            {
                let name = format!(
                    "{} -> {} {} {}",
                    o.spec.from.name,
                    o.spec.to.name,
                    o.spec.family(),
                    o.spec.proto.as_str()
                );
                let case = match &o.error {
                    None => Case::pass(name),
                    Some(err) => {
                        let diag: Vec<String> = self
                            .failures
                            .iter()
                            .filter(|f| f.index == i)
                            .flat_map(|f| {
                                f.diagnoses
                                    .iter()
                                    .map(|d| format!("{}: {}", d.id, d.message))
                            })
                            .collect();
                        Case::failure(name, err, diag.join("\n"))
                    }
                };
                suite.cases.push(case.time(Duration::from_secs_f64(
                    o.rtt_ms.unwrap_or(0.0).max(0.0) / 1000.0,
                )));
            }
            doc.suites.push(suite);
        }
        doc.to_xml()
    }

    fn html(&self) -> Option<String> {
        Some(Report::html(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectivity::{Endpoint, ProbeSpec, Proto};
    use crate::report::Rendered;

    fn failed_report() -> Report {
        let ep = Endpoint {
            name: "node1/p".into(),
            node: Some(0),
            pod: Some(0),
            ip: "10.244.1.2".parse().expect("ip"),
            external: false,
        };
        let outcome = ProbeOutcome {
            spec: ProbeSpec {
                group: "pod-to-pod/cross-node",
                from: ep.clone(),
                to: ep,
                proto: Proto::Tcp,
                expect_source: None,
                service: None,
            },
            error: Some("timed out after 1s".into()),
            seen_source: None,
            rtt_ms: None,
        };
        let failure = Failure {
            index: 0,
            outcome: outcome.clone(),
            diagnoses: vec![Diagnosis::undiagnosed(&outcome)],
        };
        Report::from_parts(
            "t",
            "p",
            "static",
            Vec::new(),
            &["pod-to-pod/cross-node"],
            vec![outcome],
            vec![failure],
        )
    }

    /// A host limit that may have caused the failures (the backlog's
    /// drops) makes them INCONCLUSIVE only when no failure has a named
    /// cause; a failure with a diagnosis stays a FAIL.
    #[test]
    fn a_possible_host_limit_spares_explained_failures() {
        let mut unexplained = failed_report();
        unexplained.inconclusive_unless_explained(Some("backlog dropped 3".into()));
        assert_eq!(unexplained.exit_code(), crate::report::exit::INCONCLUSIVE);
        let mut none = failed_report();
        none.inconclusive_unless_explained(None);
        assert_eq!(none.exit_code(), crate::report::exit::FAIL);
        let mut explained = failed_report();
        explained.failures[0].diagnoses = vec![Diagnosis {
            id: "firewall-drop",
            message: "a rule drops it".into(),
        }];
        explained.inconclusive_unless_explained(Some("backlog dropped 3".into()));
        assert_eq!(explained.exit_code(), crate::report::exit::FAIL);
        assert!(explained.inconclusive.is_none());
        // The neighbour table full: a named cause still FAILs; a neighbour
        // that never resolved may be the full table's doing.
        let full = "the host's IPv4 (ARP) neighbour table overflowed 2 time(s)";
        let mut named = failed_report();
        named.failures[0].diagnoses = vec![Diagnosis {
            id: "blackhole",
            message: "route blackhole 10.244.2.0/24".into(),
        }];
        named.inconclusive_unless_explained(Some(full.into()));
        assert_eq!(named.exit_code(), crate::report::exit::FAIL);
        for (id, message) in [
            ("neighbour-failed", "10.244.2.2 stayed FAILED"),
            (
                "kernel-drop",
                "dropped in node1 on eth0: NEIGH_FAILED (neigh_invalidate)",
            ),
        ] {
            let mut unresolved = failed_report();
            unresolved.failures[0].diagnoses = vec![Diagnosis {
                id,
                message: message.into(),
            }];
            unresolved.inconclusive_unless_explained(Some(full.into()));
            assert_eq!(
                unresolved.exit_code(),
                crate::report::exit::INCONCLUSIVE,
                "{id}"
            );
        }
    }

    /// Failures while the simulator hit a host limit are INCONCLUSIVE
    /// (exit 3), never FAIL; without that, the same failures FAIL (exit 1).
    #[test]
    fn a_host_limit_makes_failures_inconclusive() {
        let plain = failed_report();
        assert_eq!(plain.exit_code(), crate::report::exit::FAIL);
        assert!(
            plain.table().contains("❌ 1/1 checks failed"),
            "{}",
            plain.table()
        );
        let mut limited = failed_report();
        limited.inconclusive = Some("the host's IPv4 (ARP) neighbour table overflowed".into());
        assert!(!limited.passed());
        assert_eq!(limited.exit_code(), crate::report::exit::INCONCLUSIVE);
        let table = limited.table();
        assert!(
            table.contains("verdict INCONCLUSIVE")
                && table.contains("❔ INCONCLUSIVE: the host's IPv4"),
            "{table}"
        );
        assert!(!table.contains("❌ 1/1"), "{table}");
        assert!(limited.html().contains("INCONCLUSIVE"));
    }
}
