//! Plugin config templates: the bundled one, the placeholders a template may
//! use, their check (before anything is built) and filling one in for a node.

use super::base::{setup, LabError};
use super::topology::{Masquerade, NodeSpec, Topology};
use ipnet::IpNet;
use std::path::Path;

/// The default plugin config template (cnilab-bridge).
pub const DEFAULT_TEMPLATE: &str = include_str!("../../../lab/configs/lab-cnilab.conflist.tmpl");

fn ranges_json(cidrs: &[IpNet]) -> String {
    let sets: Vec<String> = cidrs
        .iter()
        .map(|c| format!("[{{\"subnet\":\"{}\"}}]", c.trunc()))
        .collect();
    format!("[{}]", sets.join(","))
}

/// The placeholders a plugin config template may use, with what each
/// becomes (`cnilab lab run --help` and docs/src/cli/lab.md list the same).
pub const PLACEHOLDERS: &[(&str, &str)] = &[
    ("node", "the node's name"),
    ("pod_cidr", "the node's IPv4 pod CIDR"),
    ("pod_cidr6", "the node's IPv6 pod CIDR"),
    (
        "ranges",
        "host-local `ranges`: one range set per pod CIDR (JSON)",
    ),
    ("cluster_cidr", "the cluster CIDRs as a JSON list"),
    ("data_dir", "a per-node directory for IPAM state"),
    ("mtu", "the pods' MTU"),
    (
        "ip_masq",
        "true when the plugin is to masquerade (masquerade = \"plugin\")",
    ),
];

/// Refuses a template with a placeholder that is not in [`PLACEHOLDERS`],
/// or one that some node of `topo` has no value for (`{{pod_cidr6}}` on a
/// node without an IPv6 pod CIDR): the error names the line. `pod_mtu`
/// fills `{{mtu}}`.
pub fn check_template(template: &str, topo: &Topology, pod_mtu: u32) -> Result<(), String> {
    for (n, line) in template.lines().enumerate() {
        let mut rest = line;
        while let Some(open) = rest.find("{{") {
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(format!(
                    "line {}: an unclosed placeholder: {}",
                    n + 1,
                    line.trim()
                ));
            };
            let name = after[..close].trim();
            if !PLACEHOLDERS.iter().any(|(p, _)| *p == name) {
                let known: Vec<String> = PLACEHOLDERS
                    .iter()
                    .map(|(p, _)| format!("{{{{{p}}}}}"))
                    .collect();
                return Err(format!(
                    "line {}: unknown placeholder {{{{{name}}}}}; the placeholders are {}",
                    n + 1,
                    known.join(", ")
                ));
            }
            for node in &topo.nodes {
                let v6 = match name {
                    "pod_cidr" => false,
                    "pod_cidr6" => true,
                    _ => continue,
                };
                if node.pod_cidr_of(v6).is_none() {
                    return Err(format!(
                        "line {}: {{{{{name}}}}} has no value on node {}: it has no {} pod CIDR",
                        n + 1,
                        node.name,
                        if v6 { "IPv6" } else { "IPv4" }
                    ));
                }
            }
            rest = &after[close + 2..];
        }
    }
    // Filled in, it must be JSON: said against the template's own lines
    // (no value spans lines), before anything is built.
    for node in &topo.nodes {
        let text = render_template(
            template,
            topo,
            node,
            Path::new("/var/lib/cni/cnilab"),
            pod_mtu,
        );
        if let Err(e) = serde_json::from_str::<serde_json::Value>(&text) {
            let what = e.to_string();
            let what = what.split(" at line ").next().unwrap_or(&what);
            return Err(format!(
                "line {} column {}: filled in for {}, it is not JSON: {what}",
                e.line(),
                e.column(),
                node.name
            ));
        }
    }
    Ok(())
}

/// The plugin's config template: the topology's `[plugin] config`, else
/// the bundled one.
pub fn template_of(topo: &Topology) -> Result<String, LabError> {
    match topo.plugin.as_ref().and_then(|p| p.config.as_ref()) {
        Some(path) => crate::assets::read_to_string(path)
            .map_err(|e| setup(format!("plugin config template {}: {e}", path.display()))),
        None => Ok(DEFAULT_TEMPLATE.to_string()),
    }
}

/// [`template_of`], checked with [`check_template`]; the error names the
/// file.
pub fn checked_template(topo: &Topology, pod_mtu: u32) -> Result<String, LabError> {
    let text = template_of(topo)?;
    let name = match topo.plugin.as_ref().and_then(|p| p.config.as_ref()) {
        Some(path) => format!("plugin config template {}", path.display()),
        None => "the bundled config template".to_string(),
    };
    check_template(&text, topo, pod_mtu).map_err(|e| setup(format!("{name}: {e}")))?;
    Ok(text)
}

/// Fills a config template for `node`; `pod_mtu` fills `{{mtu}}`.
pub fn render_template(
    template: &str,
    topo: &Topology,
    node: &NodeSpec,
    data_dir: &Path,
    pod_mtu: u32,
) -> String {
    let v4 = node.pod_cidr.iter().find(|c| c.addr().is_ipv4());
    let v6 = node.pod_cidr.iter().find(|c| c.addr().is_ipv6());
    let cluster: Vec<String> = topo
        .cluster_cidr
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect();
    template
        .replace("{{node}}", &node.name)
        .replace(
            "{{pod_cidr}}",
            &v4.map(|c| c.trunc().to_string()).unwrap_or_default(),
        )
        .replace(
            "{{pod_cidr6}}",
            &v6.map(|c| c.trunc().to_string()).unwrap_or_default(),
        )
        .replace("{{ranges}}", &ranges_json(&node.pod_cidr))
        .replace("{{cluster_cidr}}", &format!("[{}]", cluster.join(",")))
        .replace("{{data_dir}}", &data_dir.display().to_string())
        .replace("{{mtu}}", &pod_mtu.to_string())
        .replace(
            "{{ip_masq}}",
            if topo.masquerade == Masquerade::Plugin {
                "true"
            } else {
                "false"
            },
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::NetworkConfig;

    #[test]
    fn default_template_renders_to_a_valid_config() {
        let topo = Topology::generated(2, 1).expect("topology");
        let text = render_template(
            DEFAULT_TEMPLATE,
            &topo,
            &topo.nodes[1],
            Path::new("/tmp/x"),
            topo.pod_mtu(),
        );
        let net = NetworkConfig::parse(&text, Path::new("t.conflist")).expect("valid conflist");
        assert_eq!(net.plugin_type(0), "cnilab-bridge");
        assert!(text.contains("10.244.2.0/24"));
        assert!(text.contains("\"ipMasq\":true") || text.contains("\"ipMasq\": true"));
        assert!(
            text.contains("10.244.0.0/16"),
            "cluster CIDR excluded from masquerade"
        );
    }

    #[test]
    fn unknown_or_unfilled_placeholders_are_refused_with_the_line() {
        let topo = Topology::generated(2, 1).expect("topology");
        let err = check_template("{\n  \"subnet\": \"{{podcidr}}\"\n}", &topo, topo.pod_mtu())
            .expect_err("unknown");
        assert!(
            err.contains("line 2") && err.contains("{{podcidr}}"),
            "{err}"
        );
        assert!(err.contains("{{pod_cidr}}"), "lists the known ones: {err}");
        let err = check_template("\"{{pod_cidr6}}\"", &topo, topo.pod_mtu())
            .expect_err("no IPv6 pod CIDR");
        assert!(err.contains("node1") && err.contains("IPv6"), "{err}");
        check_template(DEFAULT_TEMPLATE, &topo, topo.pod_mtu())
            .expect("the bundled template is valid");
        let broken = DEFAULT_TEMPLATE.replacen("\"cniVersion\"", "cniVersion\"", 1);
        let line = 1 + DEFAULT_TEMPLATE
            [..DEFAULT_TEMPLATE.find("\"cniVersion\"").expect("cniVersion")]
            .matches('\n')
            .count();
        let err = check_template(&broken, &topo, topo.pod_mtu()).expect_err("not JSON");
        assert!(
            err.starts_with(&format!("line {line} column")) && err.contains("not JSON"),
            "{err}"
        );
        let ptp = include_str!("../../../lab/configs/lab-ptp.conflist.tmpl");
        check_template(ptp, &topo, topo.pod_mtu()).expect("the ptp template is valid");
    }
}
