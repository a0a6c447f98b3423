//! What a loaded capture may hold: every field that reaches a program, a
//! path or the kernel, checked against what it may be before anything is
//! made. A capture arrives attached to a bug report and is replayed as root.
//!
//! The error names the field as a path into the file
//! (`node.pods[1].links[0].name`) and the value, `{:?}`-quoted so that no
//! control character of it reaches a terminal raw.
//!
//! - Link names (and every name of a link: controller, VXLAN `dev`, veth
//!   peer, lower device, a route's, neighbour's, FDB entry's or qdisc's
//!   `dev`, a rule's `iif`/`oif`): what the kernel takes as a device name
//!   (1-15 bytes, not `.` or `..`, no `/`, `:`, whitespace or NUL). Other
//!   bytes the kernel takes (an escape sequence) are kept: a real node can
//!   have them, and every human print path escapes them.
//! - Words the model spells (route `scope`/`proto`, rule `action`,
//!   neighbour `state`, a qdisc's `kind`, `handle`, `parent`, a port's STP
//!   `state`, a macvlan `mode`, a link kind cnilab does not know):
//!   1-32 of `[A-Za-z0-9_.:-]`.
//! - MACs: hex pairs; a neighbour's or FDB entry's may instead be a
//!   reference `@<namespace>/<link>` to a link of the capture.
//! - Sysctls: keys under `net/ipv4`, `net/ipv6`, `net/bridge` only, plain
//!   paths (`crate::model::apply::sysctl_allowed`); values one line of
//!   printable text.
//! - nftables: the family is one nft knows; the text is one table block,
//!   with no `include`, `define` or command beside it
//!   (`crate::model::firewall::nft_table_problem`).
//! - iptables: the backend is `legacy` or `nft` (refused while parsing:
//!   `crate::model::Backend`), the family `ipv4` or `ipv6`, and the text
//!   lines of `iptables-save` (`crate::model::firewall::iptables_text_problem`).
//! - Names of pods and where they were found (`pods[]`, `peers[]`):
//!   printable, at most 253 bytes; each `evidence` entry (at most 64) and
//!   `skipped`, printable, at most 512.

use super::Capture;
use crate::model::firewall::{iptables_text_problem, nft_table_problem};
use crate::model::{LinkKind, Namespace};

/// The first field of `c` that is not what it may be, named.
pub(crate) fn check(c: &Capture) -> Result<(), String> {
    let mut at = vec![("node".to_string(), &c.node.net)];
    for (k, p) in c.node.pods.iter().enumerate() {
        at.push((format!("node.pods[{k}]"), p));
        text(&format!("node.pods[{k}].name"), &p.name, 253)?;
    }
    let roles: Vec<&str> = at.iter().map(|(_, ns)| ns.name.as_str()).collect();
    for (path, ns) in &at {
        namespace(path, ns, &roles)?;
    }
    for (list, sources) in [("pods", &c.pods), ("peers", &c.peers)] {
        for (k, s) in sources.iter().enumerate() {
            let fields = [
                ("name", Some(&s.name)),
                ("netns", s.netns.as_ref()),
                ("cri", s.cri.as_ref()),
            ];
            for (field, value) in fields {
                if let Some(v) = value {
                    text(&format!("{list}[{k}].{field}"), v, 253)?;
                }
            }
            if s.evidence.len() > super::evidence::MAX_EVIDENCE {
                let n = s.evidence.len().to_string();
                return refuse(&format!("{list}[{k}].evidence"), &n, "more than 64 entries");
            }
            for (e, v) in s.evidence.iter().enumerate() {
                text(&format!("{list}[{k}].evidence[{e}]"), v, 512)?;
            }
            if let Some(v) = &s.skipped {
                text(&format!("{list}[{k}].skipped"), v, 512)?;
            }
        }
    }
    Ok(())
}

fn refuse(field: &str, value: &str, why: &str) -> Result<(), String> {
    Err(format!("{field} {value:?}: {why}"))
}

/// Printable text of at most `max` bytes.
fn text(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() > max || value.chars().any(char::is_control) {
        return refuse(
            field,
            value,
            &format!("must be printable text of at most {max} bytes"),
        );
    }
    Ok(())
}

/// A name the kernel takes for a network device (`dev_valid_name`).
pub(crate) fn ifname(field: &str, value: &str) -> Result<(), String> {
    let bad = |c: char| c == '/' || c == ':' || c == '\0' || c.is_ascii_whitespace();
    if value.is_empty()
        || value.len() > 15
        || value == "."
        || value == ".."
        || value.chars().any(bad)
    {
        return refuse(
            field,
            value,
            "not a device name (1-15 bytes, not . or .., no /, :, space or NUL)",
        );
    }
    Ok(())
}

fn word(field: &str, value: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "_.:-".contains(c);
    if value.is_empty() || value.len() > 32 || !value.chars().all(ok) {
        return refuse(field, value, "use 1-32 of [A-Za-z0-9_.:-]");
    }
    Ok(())
}

fn mac(field: &str, value: &str, roles: &[&str]) -> Result<(), String> {
    if let Some((ns, link)) = value.strip_prefix('@').and_then(|r| r.split_once('/')) {
        if !roles.contains(&ns) {
            return refuse(field, value, "names a namespace the capture does not hold");
        }
        return ifname(field, link);
    }
    // A device without a hardware address reads as no bytes at all.
    if value.is_empty() {
        return Ok(());
    }
    let pairs: Vec<&str> = value.split(':').collect();
    let hex = |p: &&str| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit());
    if pairs.len() > 32 || !pairs.iter().all(hex) {
        return refuse(field, value, "not a MAC (hex pairs joined by :)");
    }
    Ok(())
}

fn namespace(at: &str, ns: &Namespace, roles: &[&str]) -> Result<(), String> {
    for (i, l) in ns.links.iter().enumerate() {
        let f = |name: &str| format!("{at}.links[{i}].{name}");
        ifname(&f("name"), &l.name)?;
        if let LinkKind::Other(kind) = &l.kind {
            word(&f("kind"), kind)?;
        }
        if let Some(m) = &l.mac {
            mac(&f("mac"), m, &[])?;
        }
        let devs = [
            ("controller", l.controller.as_ref()),
            ("vxlan.dev", l.vxlan.as_ref().and_then(|v| v.dev.as_ref())),
            ("veth.name", l.veth.as_ref().map(|v| &v.name)),
            ("lower.name", l.lower.as_ref().map(|v| &v.link.name)),
        ];
        for (name, dev) in devs {
            if let Some(d) = dev {
                ifname(&f(name), d)?;
            }
        }
        let peers = [
            (
                "veth.namespace",
                l.veth.as_ref().and_then(|v| v.namespace.as_ref()),
            ),
            (
                "lower.namespace",
                l.lower.as_ref().and_then(|v| v.link.namespace.as_ref()),
            ),
        ];
        for (name, peer) in peers {
            if let Some(p) = peer {
                text(&f(name), p, 253)?;
            }
        }
        let words = [
            ("port.state", l.port.as_ref().and_then(|p| p.state.as_ref())),
            ("lower.mode", l.lower.as_ref().and_then(|v| v.mode.as_ref())),
        ];
        for (name, w) in words {
            if let Some(w) = w {
                word(&f(name), w)?;
            }
        }
    }
    routes_and_rules(at, ns)?;
    for (k, n) in ns.neighbours.iter().enumerate() {
        ifname(&format!("{at}.neighbours[{k}].dev"), &n.dev)?;
        word(&format!("{at}.neighbours[{k}].state"), &n.state)?;
        if let Some(m) = &n.mac {
            mac(&format!("{at}.neighbours[{k}].mac"), m, roles)?;
        }
    }
    for (k, e) in ns.fdb.iter().enumerate() {
        ifname(&format!("{at}.fdb[{k}].dev"), &e.dev)?;
        word(&format!("{at}.fdb[{k}].state"), &e.state)?;
        mac(&format!("{at}.fdb[{k}].mac"), &e.mac, roles)?;
    }
    for (k, q) in ns.qdiscs.iter().enumerate() {
        ifname(&format!("{at}.qdiscs[{k}].dev"), &q.dev)?;
        for (name, w) in [
            ("kind", &q.kind),
            ("handle", &q.handle),
            ("parent", &q.parent),
        ] {
            word(&format!("{at}.qdiscs[{k}].{name}"), w)?;
        }
    }
    for (k, h) in ns.hooks.iter().enumerate() {
        ifname(&format!("{at}.hooks[{k}].dev"), &h.dev)?;
        if !["xdp", "tc ingress", "tc egress"].contains(&h.hook.as_str()) {
            return refuse(
                &format!("{at}.hooks[{k}].hook"),
                &h.hook,
                "must be xdp, tc ingress or tc egress",
            );
        }
        word(&format!("{at}.hooks[{k}].kind"), &h.kind)?;
    }
    firewall(at, ns)
}

fn routes_and_rules(at: &str, ns: &Namespace) -> Result<(), String> {
    for (k, r) in ns.routes.iter().enumerate() {
        let f = |name: &str| format!("{at}.routes[{k}].{name}");
        if let Some(d) = &r.dev {
            ifname(&f("dev"), d)?;
        }
        for (h, hop) in r.nexthops.iter().enumerate() {
            if let Some(d) = &hop.dev {
                ifname(&f(&format!("nexthops[{h}].dev")), d)?;
            }
        }
        if let crate::model::RouteType::Other(t) = &r.kind {
            word(&f("type"), t)?;
        }
        word(&f("scope"), &r.scope)?;
        word(&f("proto"), &r.proto)?;
    }
    for (k, r) in ns.rules.iter().enumerate() {
        let f = |name: &str| format!("{at}.rules[{k}].{name}");
        for (name, dev) in [("iif", r.iif.as_ref()), ("oif", r.oif.as_ref())] {
            if let Some(d) = dev {
                ifname(&f(name), d)?;
            }
        }
        word(&f("action"), &r.action)?;
    }
    Ok(())
}

fn firewall(at: &str, ns: &Namespace) -> Result<(), String> {
    for (key, value) in &ns.sysctls {
        // A per-link key holds the link's name, which may hold any byte a
        // device name may: the key only ever reaches `openat` below the
        // namespace's `/proc/sys/net`, never a shell or a terminal raw.
        if !crate::model::apply::sysctl_allowed(key) || key.len() > 256 {
            return refuse(
                &format!("{at}.sysctls"),
                key,
                "not a namespace's networking sysctl (a plain key under net/ipv4, net/ipv6 or net/bridge)",
            );
        }
        let field = format!("{at}.sysctls[{key:?}]");
        text(&field, value, 256)?;
    }
    for (k, t) in ns.nftables.iter().enumerate() {
        if let Some(why) = nft_table_problem(&t.family, &t.name, &t.text) {
            return Err(format!(
                "{at}.nftables[{k}] (table {:?} {:?}): {why}",
                t.family, t.name
            ));
        }
    }
    for (k, t) in ns.iptables.iter().enumerate() {
        if !matches!(t.family.as_str(), "ipv4" | "ipv6") {
            return refuse(
                &format!("{at}.iptables[{k}].family"),
                &t.family,
                "must be \"ipv4\" or \"ipv6\"",
            );
        }
        if let Some(why) = iptables_text_problem(&t.text) {
            return Err(format!("{at}.iptables[{k}].text: {why}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::model::firewall::nft_table_problem;
    use serde_json::{json, Value};

    const TABLE: &str = "table inet t2 {\n\tset s {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t\telements = { 10.0.0.0/8 }\n\t}\n\n\tchain c {\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tip saddr @s counter comment \"hi # include there\"\n\t}\n}";

    /// RFC 7396 without deletion: enough for these patches.
    fn merge(target: &mut Value, patch: &Value) {
        match (target, patch) {
            (Value::Object(t), Value::Object(p)) => {
                for (k, v) in p {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
            (t, p) => *t = p.clone(),
        }
    }

    /// A real capture (Calico, redacted) with `patch` merged into it, loaded.
    fn loaded_with(patch: Value) -> Result<super::Capture, String> {
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../lab/scenarios/captures/calico-proxy-arp-off/node1.json");
        let mut v: Value =
            serde_json::from_str(&std::fs::read_to_string(base).expect("read")).expect("json");
        merge(&mut v, &patch);
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("node.json");
        std::fs::write(&file, v.to_string()).expect("write");
        super::super::load(&file)
    }

    #[test]
    fn a_real_capture_and_a_real_table_pass() {
        assert!(loaded_with(json!({})).is_ok());
        assert_eq!(nft_table_problem("inet", "t2", TABLE), None);
        let ok = loaded_with(
            json!({"node": {"nftables": [{"family": "inet", "name": "t2", "text": TABLE}],
            "iptables": [{"backend": "nft", "family": "ipv4", "text": "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -s 10.1.0.0/16 -m comment --comment \"x y\" -j MASQUERADE\nCOMMIT"}]}}),
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn an_iptables_backend_is_legacy_or_nft() {
        for bad in ["../../tmp/x", "nft; rm -rf /", "Legacy", "", "nft\u{1b}[2J"] {
            let e = loaded_with(json!({"node": {"iptables": [{"backend": bad, "family": "ipv4", "text": "*filter\nCOMMIT"}]}}))
                .expect_err(bad);
            assert!(
                e.contains("iptables backend") && e.contains("must be \"legacy\" or \"nft\""),
                "{bad}: {e}"
            );
            assert!(!e.contains('\u{1b}'), "{e}");
        }
    }

    #[test]
    fn nft_text_that_is_not_one_table_is_refused() {
        let cases = [
            ("include \"/etc/shadow\"", "include"),
            ("table inet t2 {\n\tinclude \"/etc/shadow\"\n}", "include"),
            ("define x = 1\ntable inet t2 {\n}", "define"),
            (
                "table inet t2 {\n\tchain c {\n\t\tip saddr $x accept\n\t}\n}",
                "$x",
            ),
            ("flush ruleset", "outside the table"),
            (
                "table inet t2 {\n}\nadd rule inet t2 c accept",
                "outside the table",
            ),
            ("table inet t2 {\n}\nmonitor", "outside the table"),
            ("table inet t2 {\n}\ntable inet t2 {\n}", "the one block"),
            ("table ip other {\n}", "the one block"),
            (
                "table inet t2 {\n}}\ninclude \"/etc/shadow\"",
                "closes nothing",
            ),
            ("table inet t2 {\n\tchain c {\n", "never closed"),
            ("table inet t2 {\n\tchain c { comment \"x\n}\n}", "string"),
            ("", "holds no"),
        ];
        for (text, says) in cases {
            let e = nft_table_problem("inet", "t2", text).unwrap_or_default();
            assert!(e.contains(says), "{text:?}: {e:?}");
            let e = loaded_with(
                json!({"node": {"nftables": [{"family": "inet", "name": "t2", "text": text}]}}),
            )
            .expect_err(text);
            assert!(e.contains("node.nftables[0]"), "{text:?}: {e}");
        }
        assert!(nft_table_problem("inet; x", "t2", TABLE).is_some());
        assert!(nft_table_problem("inet", "t2 {", TABLE).is_some());
    }

    #[test]
    fn every_field_that_reaches_the_kernel_or_a_path_is_named_when_wrong() {
        let cases = [
            (
                json!({"node": {"links": [{"name": "a/b", "kind": "dummy", "up": true}]}}),
                "node.links[0].name",
            ),
            (
                json!({"node": {"links": [{"name": "0123456789abcdef", "kind": "dummy", "up": true}]}}),
                "node.links[0].name",
            ),
            (
                json!({"node": {"links": [{"name": "d0", "kind": "x y", "up": true}]}}),
                "node.links[0].kind",
            ),
            (
                json!({"node": {"links": [{"name": "d0", "kind": "dummy", "up": true, "mac": "zz"}]}}),
                "node.links[0].mac",
            ),
            (
                json!({"node": {"sysctls": {"kernel/core_pattern": "|/tmp/x"}}}),
                "node.sysctls \"kernel/core_pattern\"",
            ),
            (
                json!({"node": {"sysctls": {"net/ipv4/../../kernel/hostname": "x"}}}),
                "node.sysctls",
            ),
            (
                json!({"node": {"sysctls": {"net/ipv4/ip_forward": "1\n0"}}}),
                "node.sysctls[\"net/ipv4/ip_forward\"]",
            ),
            (
                json!({"node": {"iptables": [{"backend": "legacy", "family": "ipv5", "text": ""}]}}),
                "node.iptables[0].family",
            ),
            (
                json!({"node": {"iptables": [{"backend": "legacy", "family": "ipv4", "text": "*filter\n-A INPUT -m bpf --object-pinned /etc/shadow -j DROP\nCOMMIT"}]}}),
                "node.iptables[0].text",
            ),
            (
                json!({"node": {"iptables": [{"backend": "legacy", "family": "ipv4", "text": "*filter\n!rm -rf /\nCOMMIT"}]}}),
                "node.iptables[0].text",
            ),
            (
                json!({"pods": [{"name": "p\u{1b}]0;owned\u{7}"}]}),
                "pods[0].name",
            ),
        ];
        for (patch, field) in cases {
            let e = loaded_with(patch.clone()).expect_err(&patch.to_string());
            assert!(e.contains(field) && e.contains("node.json"), "{patch}: {e}");
            assert!(!e.contains('\u{1b}'), "{e}");
        }
    }
}
