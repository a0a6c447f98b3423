//! The connectivity report (lab and `e2e check`): a terminal summary in the spirit of `cilium
//! connectivity test`, JSON, JUnit XML, and one self-contained HTML file
//! (inline SVG, no external assets) to attach to bug reports.

use super::diagnosis::Diagnosis;
use super::probe::ProbeOutcome;
use crate::report::escape as xml;
use std::fmt::Write as _;
use std::time::Duration;

#[derive(Clone, Debug, serde::Serialize)]
pub struct GroupResult {
    pub name: String,
    pub probes: usize,
    pub passed: usize,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Failure {
    /// Position of the probe in the plan.
    pub index: usize,
    pub outcome: ProbeOutcome,
    pub diagnoses: Vec<Diagnosis>,
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
        Report {
            lab: title.to_string(),
            plugin_dir: subject.to_string(),
            routing: routing.to_string(),
            nodes,
            groups: group_results(groups, &outcomes),
            failures,
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
        self.failures.is_empty() && self.probes > 0
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

    pub fn table(&self) -> String {
        let mut s = String::new();
        for g in &self.groups {
            let mark = if g.passed == g.probes { "✅" } else { "❌" };
            let _ = writeln!(
                s,
                "{mark} [{}] {}/{} probes passed",
                g.name, g.passed, g.probes
            );
        }
        let _ = writeln!(s);
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
                "❌ {failed_groups}/{} checks failed ({}/{} probes)",
                self.groups.len(),
                self.failures.len(),
                self.probes
            );
            for f in self.failures.iter().take(40) {
                let o = &f.outcome;
                let _ = writeln!(s, "  [{}] {}", o.spec.group, o.describe());
                for d in &f.diagnoses {
                    let _ = writeln!(s, "      ↳ {}: {}", d.id, d.message);
                }
            }
            if self.failures.len() > 40 {
                let _ = writeln!(
                    s,
                    "  … and {} more failed probes (see -o json)",
                    self.failures.len() - 40
                );
            }
            let ids = self.diagnosis_ids();
            if !ids.is_empty() {
                let _ = writeln!(s, "Likely causes: {}", ids.join(", "));
            }
        }
        let phases: Vec<String> = self
            .phases_ms
            .iter()
            .map(|(p, ms)| format!("{p} {:.0} ms", ms))
            .collect();
        let _ = writeln!(s, "Phases: {}", phases.join(", "));
        s
    }

    pub fn json(&self) -> String {
        crate::report::json("LabReport", self)
    }

    /// JUnit XML: one suite per check group, one case per probe.
    pub fn junit(&self) -> String {
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
                    "{} -> {} {}",
                    o.spec.from.name,
                    o.spec.to.name,
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

    /// One self-contained HTML page: topology drawing, matrix, diagnoses.
    pub fn html(&self) -> String {
        let mut svg = String::new();
        let n = self.nodes.len().max(1);
        let width = 220 * n + 40;
        let max_pods = self.nodes.iter().map(|x| x.pods.len()).max().unwrap_or(0);
        let height = 170 + 22 * max_pods;
        let _ = write!(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"monospace\" font-size=\"11\">");
        let _ = write!(svg, "<rect x=\"10\" y=\"10\" width=\"{}\" height=\"26\" fill=\"#dfe8f5\" stroke=\"#345\"/><text x=\"20\" y=\"28\">underlay switch</text>", width - 20);
        for (i, node) in self.nodes.iter().enumerate() {
            let x = 20 + 220 * i;
            let _ = write!(
                svg,
                "<line x1=\"{}\" y1=\"36\" x2=\"{}\" y2=\"60\" stroke=\"#345\"/>",
                x + 100,
                x + 100
            );
            let h = 60 + 22 * node.pods.len();
            let _ = write!(svg, "<rect x=\"{x}\" y=\"60\" width=\"200\" height=\"{h}\" rx=\"6\" fill=\"#f4f7fb\" stroke=\"#345\"/>");
            let _ = write!(
                svg,
                "<text x=\"{}\" y=\"78\" font-weight=\"bold\">{}</text>",
                x + 8,
                xml(&node.name)
            );
            let _ = write!(
                svg,
                "<text x=\"{}\" y=\"94\">{} · {}</text>",
                x + 8,
                xml(&node.address),
                xml(&node.pod_cidr.join(","))
            );
            for (k, (pod, ips)) in node.pods.iter().enumerate() {
                let failed = self.failures.iter().any(|f| {
                    f.outcome.spec.from.name.ends_with(pod.as_str())
                        || f.outcome.spec.to.name.ends_with(pod.as_str())
                });
                let fill = if failed { "#f8d7da" } else { "#d4edda" };
                let y = 104 + 22 * k;
                let _ = write!(svg, "<rect x=\"{}\" y=\"{y}\" width=\"184\" height=\"18\" fill=\"{fill}\" stroke=\"#789\"/><text x=\"{}\" y=\"{}\">{} {}</text>", x + 8, x + 12, y + 13, xml(pod), xml(&ips.join(",")));
            }
        }
        svg.push_str("</svg>");

        let mut matrix =
            String::from("<table><tr><th>check</th><th>probes</th><th>passed</th></tr>");
        for g in &self.groups {
            let class = if g.passed == g.probes { "ok" } else { "bad" };
            let _ = write!(
                matrix,
                "<tr class=\"{class}\"><td>{}</td><td>{}</td><td>{}</td></tr>",
                xml(&g.name),
                g.probes,
                g.passed
            );
        }
        matrix.push_str("</table>");
        let mut pairs = String::from("<table><tr><th>from</th><th>to</th><th>proto</th><th>result</th><th>diagnosis</th></tr>");
        for f in &self.failures {
            let o = &f.outcome;
            let diag: Vec<String> = f
                .diagnoses
                .iter()
                .map(|d| format!("<b>{}</b>: {}", d.id, xml(&d.message)))
                .collect();
            let _ = write!(
                pairs,
                "<tr class=\"bad\"><td>{} ({})</td><td>{} ({})</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                xml(&o.spec.from.name),
                o.spec.from.ip,
                xml(&o.spec.to.name),
                o.spec.to.ip,
                o.spec.proto.as_str(),
                xml(o.error.as_deref().unwrap_or("")),
                diag.join("<br>")
            );
        }
        pairs.push_str("</table>");
        let verdict = if self.passed() {
            format!(
                "All {} checks ({} probes) passed",
                self.groups.len(),
                self.probes
            )
        } else {
            format!("{} of {} probes failed", self.failures.len(), self.probes)
        };
        format!(
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>cnilab lab {}</title><style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #999;padding:3px 8px;font-size:13px}}tr.ok{{background:#d4edda}}tr.bad{{background:#f8d7da}}</style></head><body><h1>cnilab lab: {}</h1><p>plugin {} · routing {} · <b>{}</b></p><h2>Topology</h2>{svg}<h2>Checks</h2>{matrix}<h2>Failed probes and diagnoses</h2>{}</body></html>\n",
            xml(&self.lab),
            xml(&self.lab),
            xml(&self.plugin_dir),
            xml(&self.routing),
            xml(&verdict),
            if self.failures.is_empty() { "<p>none</p>".to_string() } else { pairs }
        )
    }
}

/// Probes and passes per group, in `groups` order, without empty groups.
fn group_results(groups: &[&str], outcomes: &[ProbeOutcome]) -> Vec<GroupResult> {
    groups
        .iter()
        .map(|g| {
            let mine: Vec<&ProbeOutcome> = outcomes.iter().filter(|o| o.spec.group == *g).collect();
            GroupResult {
                name: g.to_string(),
                probes: mine.len(),
                passed: mine.iter().filter(|o| o.passed()).count(),
            }
        })
        .filter(|g| g.probes > 0)
        .collect()
}
