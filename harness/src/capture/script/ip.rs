//! One namespace's sections (`ip -N -d -j …`, `bridge -j fdb`, `tc -j
//! qdisc`, sysctls) into the model's types, by the rules of the netlink
//! reader (`crate::model::read`): what it leaves out is left out here by
//! the same functions (`kept_route`, `fdb_kept`), names of protocols and
//! scopes from the same tables.

use crate::model::read::{fdb_kept, kept_route, own_macs, proto_name, scope_name, RawLink};
use crate::model::{
    Bridge, BridgePort, FdbEntry, Link, LinkFlag, LinkKind, Namespace, Neighbour, Nexthop, Qdisc,
    Route, Rule, Vxlan,
};
use ipnet::IpNet;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A link's ends as `ip -j link` gives them, for telling which namespace
/// a peer is in.
#[derive(Clone, Debug)]
pub struct End {
    pub index: u32,
    pub kind: LinkKind,
    /// The peer's (or lower device's) index.
    pub link_index: Option<u32>,
    /// This namespace's id for the peer's namespace (`None`: this one).
    pub netnsid: Option<i32>,
    /// A bridge port.
    pub port: bool,
}

/// The links of `ip -N -d -j link show`, and their ends.
pub fn links(v: &Value) -> Result<(Vec<RawLink>, Vec<End>), String> {
    let list = v.as_array().ok_or("not a JSON list")?;
    let by_name: BTreeMap<&str, u32> = list
        .iter()
        .filter_map(|l| Some((l["ifname"].as_str()?, u32_of(&l["ifindex"])?)))
        .collect();
    let mut raw = Vec::new();
    let mut ends = Vec::new();
    for l in list {
        let index = u32_of(&l["ifindex"]).ok_or("a link without ifindex")?;
        let name = l["ifname"].as_str().ok_or("a link without ifname")?;
        let info = &l["linkinfo"];
        let kind = LinkKind::from_kind(info["info_kind"].as_str(), name);
        let flags: Vec<&str> = l["flags"]
            .as_array()
            .map(|f| f.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut link = Link::new(name, kind.clone(), flags.contains(&"UP"));
        link.mtu = u32_of(&l["mtu"]);
        link.mac = l["address"].as_str().map(mac_of);
        for (flag, ours) in [
            ("NOARP", LinkFlag::Noarp),
            ("PROMISC", LinkFlag::Promisc),
            ("ALLMULTI", LinkFlag::Allmulti),
        ] {
            if flags.contains(&flag) {
                link.flags.push(ours);
            }
        }
        let data = &info["info_data"];
        let mut vxlan_dev = None;
        let mut mode = None;
        match kind {
            LinkKind::Bridge if data.is_object() => {
                link.bridge = Some(Bridge {
                    stp: data["stp_state"].as_u64().is_some_and(|s| s != 0),
                    vlan_filtering: data["vlan_filtering"].as_u64().is_some_and(|s| s != 0),
                })
            }
            LinkKind::Vxlan if data.is_object() => {
                link.vxlan = Some(Vxlan {
                    vni: u32_of(&data["id"]).unwrap_or(0),
                    local: data["local"].as_str().and_then(|a| a.parse().ok()),
                    port: data["port"]
                        .as_u64()
                        .and_then(|p| u16::try_from(p).ok())
                        .unwrap_or(0),
                    dev: None,
                    learning: data["learning"].as_bool().unwrap_or(false),
                });
                vxlan_dev = data["link"].as_str().and_then(|d| by_name.get(d).copied());
            }
            LinkKind::Macvlan | LinkKind::Ipvlan => {
                mode = data["mode"].as_str().map(str::to_string);
            }
            _ => {}
        }
        let port = info["info_slave_kind"].as_str() == Some("bridge");
        if port {
            let p = &info["info_slave_data"];
            link.port = Some(BridgePort {
                hairpin: p["hairpin"].as_bool().unwrap_or(false),
                isolated: p["isolated"].as_bool().unwrap_or(false),
                learning: p["learning"].as_bool().unwrap_or(false),
                state: p["state"].as_str().map(str::to_string),
            });
        }
        let netnsid = l["link_netnsid"]
            .as_i64()
            .and_then(|i| i32::try_from(i).ok());
        // The peer by index in another namespace, by name in this one.
        let link_index = u32_of(&l["link_index"]).or_else(|| match l["link"].as_str() {
            Some(n) => by_name
                .get(n)
                .copied()
                .or_else(|| n.strip_prefix("if").and_then(|i| i.parse().ok())),
            None => None,
        });
        let linked = matches!(kind, LinkKind::Veth | LinkKind::Macvlan | LinkKind::Ipvlan);
        ends.push(End {
            index,
            kind: kind.clone(),
            link_index,
            netnsid,
            port,
        });
        raw.push(RawLink {
            index,
            link,
            controller: l["master"].as_str().and_then(|m| by_name.get(m).copied()),
            peer: link_index.filter(|_| linked).map(|i| (i, None)),
            vxlan_dev,
            mode,
        });
    }
    Ok((raw, ends))
}

/// A MAC as the netlink reader prints it; a tunnel's IP-shaped address
/// as its bytes.
fn mac_of(text: &str) -> String {
    match text.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => cnilab_net::nl::mac_string(&a.octets()),
        Ok(IpAddr::V6(a)) => cnilab_net::nl::mac_string(&a.octets()),
        Err(_) => text.to_ascii_lowercase(),
    }
}

fn u32_of(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// `ip -j addr show` onto the links: not IPv6 link-local, not `lo`'s own.
pub fn addresses(v: &Value, links: &mut [RawLink]) -> Result<(), String> {
    let list = v.as_array().ok_or("not a JSON list")?;
    for l in list {
        let Some(index) = u32_of(&l["ifindex"]) else {
            continue;
        };
        let Some(link) = links.iter_mut().find(|r| r.index == index) else {
            continue;
        };
        for a in l["addr_info"].as_array().into_iter().flatten() {
            let (Some(ip), Some(len)) = (
                a["local"].as_str().and_then(|s| s.parse::<IpAddr>().ok()),
                a["prefixlen"].as_u64().and_then(|p| u8::try_from(p).ok()),
            ) else {
                continue;
            };
            let Ok(net) = IpNet::new(ip, len) else {
                continue;
            };
            let link_local = matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
            let loopback = link.link.kind == LinkKind::Loopback
                && ["127.0.0.1/8", "::1/128"].contains(&net.to_string().as_str());
            if !link_local && !loopback {
                link.link.addresses.push(net);
            }
        }
    }
    Ok(())
}

/// A destination as `ip -j route` prints it (`default`, a bare host).
fn dst_of(text: &str, v6: bool) -> Option<IpNet> {
    if text == "default" {
        return Some(if v6 {
            IpNet::V6(Default::default())
        } else {
            IpNet::V4(Default::default())
        });
    }
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}

fn ip_of(v: &Value) -> Option<IpAddr> {
    v.as_str().and_then(|s| s.parse().ok())
}

fn has_flag(v: &Value, flag: &str) -> bool {
    v["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == flag))
}

/// `ip -N -d -j -4|-6 route show table all`: the routes the model keeps.
pub fn routes(v: &Value, v6: bool) -> Result<Vec<Route>, String> {
    let list = v.as_array().ok_or("not a JSON list")?;
    let num = |r: &Value, k: &str| u32_of(&r[k]);
    let mut out = Vec::new();
    for r in list {
        let table = num(r, "table").unwrap_or(254);
        let protocol = num(r, "protocol")
            .and_then(|p| u8::try_from(p).ok())
            .unwrap_or(0);
        let kind = num(r, "type")
            .and_then(|p| u8::try_from(p).ok())
            .unwrap_or(1);
        let Some(kind) = kept_route(kind, table, protocol) else {
            continue;
        };
        let dst = r["dst"]
            .as_str()
            .and_then(|d| dst_of(d, v6))
            .ok_or_else(|| format!("a route without a destination: {r}"))?;
        let nexthops = r["nexthops"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|h| Nexthop {
                gateway: ip_of(&h["gateway"]),
                dev: h["dev"].as_str().map(str::to_string),
                weight: h["weight"]
                    .as_u64()
                    .and_then(|w| u16::try_from(w).ok())
                    .unwrap_or(1),
                onlink: has_flag(h, "onlink"),
            })
            .collect();
        let scope = num(r, "scope")
            .and_then(|s| u8::try_from(s).ok())
            .unwrap_or(0);
        out.push(Route {
            table,
            kind,
            dst,
            gateway: ip_of(&r["gateway"]),
            dev: r["dev"].as_str().map(str::to_string),
            onlink: has_flag(r, "onlink"),
            scope: scope_name(scope),
            proto: proto_name(protocol),
            metric: num(r, "metric").unwrap_or(0),
            src: ip_of(&r["prefsrc"]),
            nexthops,
        });
    }
    Ok(out)
}

/// `ip -N -d -j -4|-6 rule show`, without the kernel's own rules.
pub fn rules(v: &Value, v6: bool) -> Result<Vec<Rule>, String> {
    let list = v.as_array().ok_or("not a JSON list")?;
    let hex = |x: &Value| {
        x.as_str()
            .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    let net = |addr: &Value, len: &Value| {
        let ip = ip_of(addr)?;
        let len = len
            .as_u64()
            .and_then(|l| u8::try_from(l).ok())
            .unwrap_or(if ip.is_ipv6() { 128 } else { 32 });
        IpNet::new(ip, len).ok()
    };
    let mut out = Vec::new();
    for r in list {
        if u32_of(&r["protocol"]) == Some(2) {
            continue;
        }
        let action = match u32_of(&r["action"]) {
            None if r.get("goto").is_some() => "goto".to_string(),
            None if r.get("nop").is_some() => "nop".to_string(),
            None => "lookup".to_string(),
            Some(2) => "goto".into(),
            Some(3) => "nop".into(),
            Some(6) => "blackhole".into(),
            Some(7) => "unreachable".into(),
            Some(8) => "prohibit".into(),
            Some(n) => format!("other({n})"),
        };
        out.push(Rule {
            priority: u32_of(&r["priority"]).unwrap_or(0),
            v6,
            src: net(&r["src"], &r["srclen"]),
            dst: net(&r["dst"], &r["dstlen"]),
            iif: r["iif"].as_str().map(str::to_string),
            oif: r["oif"].as_str().map(str::to_string),
            fwmark: hex(&r["fwmark"]),
            fwmask: hex(&r["fwmask"]),
            invert: r.get("not").is_some(),
            action,
            table: u32_of(&r["table"]).unwrap_or(0),
        });
    }
    Ok(out)
}

/// `ip -j neigh show nud permanent`.
pub fn neighbours(v: &Value) -> Result<Vec<Neighbour>, String> {
    let list = v.as_array().ok_or("not a JSON list")?;
    Ok(list
        .iter()
        .filter(|n| {
            n["state"]
                .as_array()
                .is_some_and(|s| s.iter().any(|x| x == "PERMANENT"))
        })
        .filter_map(|n| {
            Some(Neighbour {
                dev: n["dev"].as_str().unwrap_or_default().to_string(),
                addr: ip_of(&n["dst"])?,
                mac: n["lladdr"].as_str().map(mac_of),
                state: "permanent".into(),
            })
        })
        .collect())
}

/// `bridge -j fdb show`: the entries configuration made.
pub fn fdb(v: &Value, links: &[RawLink]) -> Result<Vec<FdbEntry>, String> {
    let list = v.as_array().ok_or("not a JSON list")?;
    let own = own_macs(links);
    let mut out = Vec::new();
    for e in list {
        let state = match e["state"].as_str() {
            Some("permanent") => "permanent",
            Some("static") => "static",
            _ => continue,
        };
        let Some(mac) = e["mac"].as_str().map(mac_of) else {
            continue;
        };
        if !fdb_kept(&mac, &own) {
            continue;
        }
        out.push(FdbEntry {
            dev: e["ifname"].as_str().unwrap_or_default().to_string(),
            mac,
            dst: ip_of(&e["dst"]),
            state: state.into(),
        });
    }
    Ok(out)
}

/// `tc -j qdisc show`: the ones with a handle.
pub fn qdiscs(v: &Value) -> Result<Vec<Qdisc>, String> {
    let list = v.as_array().ok_or("not a JSON list")?;
    Ok(list
        .iter()
        .filter(|q| {
            q["handle"]
                .as_str()
                .is_some_and(|h| h != "0:" && h != "0:0")
        })
        .map(|q| Qdisc {
            dev: q["dev"].as_str().unwrap_or_default().to_string(),
            kind: q["kind"].as_str().unwrap_or_default().to_string(),
            handle: q["handle"].as_str().unwrap_or_default().to_string(),
            parent: if q["root"].as_bool() == Some(true) {
                "root".to_string()
            } else {
                q["parent"].as_str().unwrap_or_default().to_string()
            },
        })
        .collect())
}

/// `KEY:VALUE` lines (`grep -H`), values with single spaces as the reader
/// keeps them.
pub fn sysctls(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| {
            let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
            (k.to_string(), v)
        })
        .collect()
}

/// iproute2's JSON with the control characters it leaves raw inside
/// strings (a link named with an escape sequence) escaped, as JSON wants
/// them.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c < ' ' && c != '\n') {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 16);
    let (mut quoted, mut escaped) = (false, false);
    for c in text.chars() {
        match c {
            c if quoted && c < ' ' => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
        if quoted && escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        }
    }
    out.into()
}

/// An empty namespace named `role`.
pub fn namespace(role: &str) -> Namespace {
    Namespace {
        name: role.to_string(),
        ..Namespace::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_control_character_in_a_name_is_escaped_and_kept() {
        let raw = "[{\"ifname\":\"cali\u{1b}[31m\\\"x\",\n\"mtu\":1}]";
        let v: Value = serde_json::from_str(&escape_controls(raw)).expect("JSON");
        assert_eq!(v[0]["ifname"], "cali\u{1b}[31m\"x");
        assert_eq!(v[0]["mtu"], 1);
    }

    #[test]
    fn routes_keep_what_the_netlink_reader_keeps() {
        let v: Value = serde_json::from_str(
            r#"[{"type":"1","dst":"10.3.3.3","dev":"d0","table":"100","protocol":"3","scope":"253","prefsrc":"192.0.2.1","metric":5},
                {"type":"6","dst":"default","table":"254","protocol":"12","scope":"0"},
                {"type":"2","dst":"127.0.0.1","dev":"lo","table":"255","protocol":"2","scope":"254"},
                {"type":"1","dst":"192.0.2.0/24","dev":"d0","table":"254","protocol":"2","scope":"253"}]"#,
        )
        .expect("JSON");
        let r = routes(&v, false).expect("routes");
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].dst.to_string(), "10.3.3.3/32");
        assert_eq!(
            (r[0].scope.as_str(), r[0].proto.as_str(), r[0].metric),
            ("link", "boot", 5)
        );
        assert_eq!(r[1].dst.to_string(), "0.0.0.0/0");
        assert_eq!(
            (r[1].kind.clone(), r[1].proto.as_str()),
            (crate::model::RouteType::Blackhole, "bird")
        );
    }
}
