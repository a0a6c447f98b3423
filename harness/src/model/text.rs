//! A model as text, one line per object, in the words of `ip` and `nft`
//! (what `cnilab lab show` prints without `-o json`).

use super::{LabModel, Link, Namespace, Route};
use std::fmt::Write as _;

impl LabModel {
    pub(crate) fn to_text(&self) -> String {
        let mut out = format!(
            "lab {} (schemaVersion {})\n",
            self.name, self.schema_version
        );
        for ns in &self.underlay {
            namespace(&mut out, ns, "");
        }
        for node in &self.nodes {
            let cidrs: Vec<String> = node.pod_cidrs.iter().map(|c| c.to_string()).collect();
            let _ = writeln!(
                out,
                "node {} (pod CIDRs {})",
                node.net.name,
                cidrs.join(", ")
            );
            namespace(&mut out, &node.net, "  ");
            for pod in &node.pods {
                namespace(&mut out, pod, "  ");
            }
        }
        out
    }
}

fn namespace(out: &mut String, ns: &Namespace, indent: &str) {
    let _ = writeln!(out, "{indent}namespace {}", ns.name);
    let i = format!("{indent}  ");
    for l in &ns.links {
        let _ = writeln!(out, "{i}link {}", link(l));
    }
    for r in &ns.routes {
        let _ = writeln!(out, "{i}route {}", route(r));
    }
    for r in &ns.rules {
        let from = r.src.map(|s| format!(" from {s}")).unwrap_or_default();
        let to = r.dst.map(|s| format!(" to {s}")).unwrap_or_default();
        let mark = r
            .fwmark
            .map(|m| format!(" fwmark {m:#x}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{i}rule {}{from}{to}{mark} {} {}",
            r.priority, r.action, r.table
        );
    }
    for n in &ns.neighbours {
        let mac = n.mac.as_deref().unwrap_or("-");
        let _ = writeln!(
            out,
            "{i}neigh {} lladdr {mac} dev {} {}",
            n.addr, n.dev, n.state
        );
    }
    for f in &ns.fdb {
        let dst = f.dst.map(|d| format!(" dst {d}")).unwrap_or_default();
        let _ = writeln!(out, "{i}fdb {} dev {}{dst} {}", f.mac, f.dev, f.state);
    }
    for q in &ns.qdiscs {
        let _ = writeln!(
            out,
            "{i}qdisc {} {} dev {} parent {}",
            q.kind, q.handle, q.dev, q.parent
        );
    }
    for t in &ns.nftables {
        let _ = writeln!(out, "{i}nft table {} {}", t.family, t.name);
    }
    for t in &ns.iptables {
        let _ = writeln!(out, "{i}iptables {} {}", t.backend, t.family);
    }
    for (k, v) in &ns.sysctls {
        let _ = writeln!(out, "{i}sysctl {k} = {v}");
    }
}

fn link(l: &Link) -> String {
    let mut s = format!(
        "{} {} {}",
        l.name,
        serde_json::to_value(&l.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        if l.up { "up" } else { "down" }
    );
    if let Some(m) = l.mtu {
        let _ = write!(s, " mtu {m}");
    }
    if let Some(c) = &l.controller {
        let _ = write!(s, " master {c}");
    }
    if let Some(p) = &l.veth {
        let _ = write!(
            s,
            " peer {}/{}",
            p.namespace.as_deref().unwrap_or("?"),
            p.name
        );
    }
    if let Some(low) = &l.lower {
        let ns = low.link.namespace.as_deref().unwrap_or("?");
        let _ = write!(s, " link {ns}/{}", low.link.name);
        if let Some(m) = &low.mode {
            let _ = write!(s, " mode {m}");
        }
    }
    if let Some(v) = &l.vxlan {
        let _ = write!(s, " vxlan id {} dstport {}", v.vni, v.port);
        if let Some(local) = v.local {
            let _ = write!(s, " local {local}");
        }
        if let Some(dev) = &v.dev {
            let _ = write!(s, " dev {dev}");
        }
        if !v.learning {
            s.push_str(" nolearning");
        }
    }
    for a in &l.addresses {
        let _ = write!(s, " {a}");
    }
    s
}

fn route(r: &Route) -> String {
    let mut s = match r.kind {
        super::RouteType::Unicast => r.dst.to_string(),
        _ => format!(
            "{} {}",
            serde_json::to_value(&r.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            r.dst
        ),
    };
    if let Some(g) = r.gateway {
        let _ = write!(s, " via {g}");
    }
    if let Some(d) = &r.dev {
        let _ = write!(s, " dev {d}");
    }
    if r.table != cnilab_net::nl::MAIN_TABLE {
        let _ = write!(s, " table {}", r.table);
    }
    let _ = write!(s, " proto {} scope {}", r.proto, r.scope);
    if r.metric != 0 {
        let _ = write!(s, " metric {}", r.metric);
    }
    if r.onlink {
        s.push_str(" onlink");
    }
    s
}
