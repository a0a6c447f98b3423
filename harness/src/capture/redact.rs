//! `cnilab capture --redact`: addresses and names replaced consistently, so
//! a capture can be posted in public and still replays the bug.
//!
//! The mapping is keyed (HMAC-SHA256 with `--redact-key`, else a random key
//! that is never written): the same key gives the same output for the same
//! input on every node, so run every node's capture of one cluster with the
//! same key. Without the key the mapping cannot be recomputed; with it, it
//! can (keep it private).
//!
//! - **Addresses** are mapped bit by bit, prefix-preserving: bit *i* of the
//!   output is bit *i* of the input flipped by one keyed bit of the first
//!   *i* input bits. So two addresses share exactly as many leading bits
//!   after as before: same subnet stays same subnet, a /32 route still
//!   names its pod's address, a gateway stays inside its subnet; the map is
//!   one-to-one. Prefix lengths are kept; a prefix whose host bits are zero
//!   (a route's destination, a pod CIDR) maps to one whose host bits are
//!   zero. Bits that lead into a reserved range are never flipped, so
//!   10/8, 100.64/10, 172.16/12, 192.168/16 and fc00::/7 stay themselves
//!   (their host bits are mapped), and 0/8, 127/8, 169.254/16, 224/4,
//!   240/4, `::`, `::1`, fe80::/10 and ff00::/8 are kept whole (an address
//!   that shares leading bits with one of them keeps those bits).
//! - **Names**: the node name and hostname become `node-<8 hex>`, pod and
//!   namespace names `pod-<8 hex>` (`pid:<n>` stays), everywhere they
//!   appear as a word (also in warnings and the `--netns` path); nftables
//!   and iptables `comment`s (kube-proxy writes Service names there) become
//!   `c-<8 hex>`. Link names and numbers are kept.
//! - **MACs** (a link's, a neighbour's, an FDB entry's, and in firewall
//!   text) are mapped the same prefix-preserving way over their 48 bits, so
//!   the map is one-to-one and a neighbour or FDB entry naming a link's MAC
//!   names that link's mapped MAC, on every node of one key. The
//!   multicast and locally-administered bits are kept; multicast (and
//!   broadcast) and all-zero MACs are kept whole. A tunnel's 4- or 16-byte
//!   link-layer address (ipip, gre, sit: its local address) is mapped as
//!   that address.

use super::Capture;
use crate::model::{Lower, Namespace, VethPeer};
use ipnet::IpNet;
use ring::hmac;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Ranges kept recognisable: (bits, prefix length, kept whole). A range
/// kept whole maps each of its addresses to itself (loopback, link-local,
/// multicast, `0/8`, `240/4`: nothing private, and replay needs them as
/// they are, such as Calico's 169.254.1.1); the others keep only their
/// prefix.
const RESERVED_V4: &[(u32, u8, bool)] = &[
    (0x0000_0000, 8, true),
    (0x0a00_0000, 8, false),
    (0x6440_0000, 10, false),
    (0x7f00_0000, 8, true),
    (0xa9fe_0000, 16, true),
    (0xac10_0000, 12, false),
    (0xc0a8_0000, 16, false),
    (0xe000_0000, 4, true),
    (0xf000_0000, 4, true),
];
const RESERVED_V6: &[(u128, u8, bool)] = &[
    (0, 128, true),
    (1, 128, true),
    (0xfc00 << 112, 7, false),
    (0xfe80 << 112, 10, true),
    (0xff00 << 112, 8, true),
];

/// What a mapped bit string is: its width, its keyed flips and the bits
/// it keeps.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Family {
    V4,
    V6,
    Mac,
}

impl Family {
    fn width(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
            Family::Mac => 48,
        }
    }

    fn label(self) -> &'static [u8] {
        match self {
            Family::V4 => b"ip4",
            Family::V6 => b"ip6",
            Family::Mac => b"mac",
        }
    }

    /// Whether bit `i` of `x` (whose first `i` bits are `prefix`) is kept:
    /// it leads into a reserved range or lies inside one kept whole; a
    /// MAC's multicast and locally-administered bits, and every bit of a
    /// multicast or all-zero MAC.
    fn pinned(self, x: u128, i: u8, prefix: u128) -> bool {
        let width = self.width();
        let top = |v: u128, n: u8| if n == 0 { 0 } else { v >> (width - n) };
        let reserved = |net: u128, l: u8, whole: bool| {
            (i < l && top(net, i) == prefix) || (whole && i >= l && top(x, l) == top(net, l))
        };
        match self {
            Family::V4 => RESERVED_V4
                .iter()
                .any(|&(net, l, whole)| reserved(u128::from(net), l, whole)),
            Family::V6 => RESERVED_V6
                .iter()
                .any(|&(net, l, whole)| reserved(net, l, whole)),
            Family::Mac => i == 6 || i == 7 || x == 0 || (x >> 40) & 1 == 1,
        }
    }
}

/// A keyed mapping of addresses and names.
pub struct Redactor {
    key: hmac::Key,
    names: BTreeMap<String, String>,
    bits: BTreeMap<(Family, u8, u128), bool>,
}

/// A random key (32 bytes) for a run without `--redact-key`.
pub fn random_key() -> Result<Vec<u8>, String> {
    use ring::rand::SecureRandom;
    let mut key = vec![0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| "no random key: the system's random source failed".to_string())?;
    Ok(key)
}

impl Redactor {
    pub fn new(key: &[u8]) -> Redactor {
        Redactor {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            names: BTreeMap::new(),
            bits: BTreeMap::new(),
        }
    }

    fn tag(&self, what: &str, input: &[u8]) -> String {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(what.as_bytes());
        ctx.update(&[0]);
        ctx.update(input);
        let tag = ctx.sign();
        tag.as_ref()[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The keyed flip bit for the first `len` bits `prefix` of a family.
    fn flip(&mut self, family: Family, len: u8, prefix: u128) -> bool {
        if let Some(b) = self.bits.get(&(family, len, prefix)) {
            return *b;
        }
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(family.label());
        ctx.update(&[len]);
        ctx.update(&prefix.to_be_bytes());
        let b = ctx.sign().as_ref()[0] & 1 == 1;
        self.bits.insert((family, len, prefix), b);
        b
    }

    /// Maps the first `len` bits of `x` (a `family.width()`-bit string),
    /// the rest zero: bit *i* flipped by a keyed bit of the first *i*,
    /// unless the family pins it.
    fn map_bits(&mut self, family: Family, x: u128, len: u8) -> u128 {
        let width = family.width();
        let mut out = 0u128;
        for i in 0..len {
            let prefix = if i == 0 { 0 } else { x >> (width - i) };
            let bit = (x >> (width - 1 - i)) & 1;
            let flip = !family.pinned(x, i, prefix) && self.flip(family, i, prefix);
            out |= (bit ^ u128::from(flip)) << (width - 1 - i);
        }
        out
    }

    /// Maps the first `len` bits of `a`, the rest zero.
    fn map_prefix(&mut self, a: IpAddr, len: u8) -> IpAddr {
        match a {
            IpAddr::V4(v4) => {
                let bits = self.map_bits(Family::V4, u128::from(u32::from(v4)), len);
                IpAddr::V4(Ipv4Addr::from(bits as u32))
            }
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(self.map_bits(
                Family::V6,
                u128::from(v6),
                len,
            ))),
        }
    }

    pub fn addr(&mut self, a: IpAddr) -> IpAddr {
        let width = if a.is_ipv4() { 32 } else { 128 };
        self.map_prefix(a, width)
    }

    pub fn net(&mut self, n: IpNet) -> IpNet {
        let len = n.prefix_len();
        let mapped = if n.addr() == n.network() && len < n.max_prefix_len() {
            self.map_prefix(n.addr(), len)
        } else {
            self.addr(n.addr())
        };
        IpNet::new(mapped, len).unwrap_or(n)
    }

    /// A link-layer address as `nl::mac_string` prints it (`aa:bb:…`): a
    /// MAC mapped (see the module header), a tunnel's 4- or 16-byte one as
    /// the address it is; `@<namespace>/<link>` names its mapped
    /// namespace; anything else is kept.
    pub fn mac(&mut self, mac: &str) -> String {
        if let Some((ns, link)) = mac.strip_prefix('@').and_then(|r| r.split_once('/')) {
            return format!("@{}/{link}", self.name("pod", ns));
        }
        let Some(bytes) = parse_hw(mac) else {
            return mac.to_string();
        };
        let mapped: Vec<u8> = match bytes.len() {
            6 => {
                let x = bytes.iter().fold(0u128, |a, b| a << 8 | u128::from(*b));
                let out = self.map_bits(Family::Mac, x, 48);
                out.to_be_bytes()[10..].to_vec()
            }
            4 => match self.addr(IpAddr::V4(Ipv4Addr::new(
                bytes[0], bytes[1], bytes[2], bytes[3],
            ))) {
                IpAddr::V4(a) => a.octets().to_vec(),
                IpAddr::V6(_) => bytes,
            },
            16 => {
                let a: [u8; 16] = bytes.as_slice().try_into().unwrap_or([0; 16]);
                match self.addr(IpAddr::V6(Ipv6Addr::from(a))) {
                    IpAddr::V6(a) => a.octets().to_vec(),
                    IpAddr::V4(_) => bytes,
                }
            }
            _ => return mac.to_string(),
        };
        cnilab_net::nl::mac_string(&mapped)
    }

    /// Registers a name (`kind`: `node` or `pod`) and returns its mapping.
    pub fn name(&mut self, kind: &str, name: &str) -> String {
        if name.is_empty() || name.starts_with("pid:") {
            return name.to_string();
        }
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let mapped = format!("{kind}-{}", self.tag("name", name.as_bytes()));
        self.names.insert(name.to_string(), mapped.clone());
        mapped
    }

    /// A word of text: an address, a prefix, `addr:port`, `a-b`, a known
    /// name, or left as it is.
    fn word(&mut self, w: &str) -> String {
        if let Ok(n) = w.parse::<IpNet>() {
            return self.net(n).to_string();
        }
        if let Ok(a) = w.parse::<IpAddr>() {
            return self.addr(a).to_string();
        }
        if w.len() == 17 && parse_hw(w).is_some() {
            return self.mac(w);
        }
        if let Some(n) = self.names.get(w) {
            return n.clone();
        }
        if let Some((a, port)) = w.rsplit_once(':') {
            if let (Ok(a), Ok(_)) = (a.parse::<Ipv4Addr>(), port.parse::<u16>()) {
                return format!("{}:{port}", self.addr(IpAddr::V4(a)));
            }
        }
        if let Some((a, b)) = w.split_once('-') {
            if let (Ok(a), Ok(b)) = (a.parse::<IpAddr>(), b.parse::<IpAddr>()) {
                return format!("{}-{}", self.addr(a), self.addr(b));
            }
        }
        // A word ending a clause: `node1:`, `10.0.0.1.`
        if let Some(head) = w.strip_suffix(':').or_else(|| w.strip_suffix('.')) {
            if !head.is_empty() {
                return format!("{}{}", self.word(head), &w[head.len()..]);
            }
        }
        if w.contains('/') && w.len() > 1 {
            return w
                .split('/')
                .map(|p| self.word(p))
                .collect::<Vec<_>>()
                .join("/");
        }
        w.to_string()
    }

    /// Text (firewall rules, warnings, paths): every word mapped, every
    /// `comment "…"` replaced.
    pub fn text(&mut self, text: &str) -> String {
        let word_char = |c: char| c.is_ascii_alphanumeric() || "._:/-#".contains(c);
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find(word_char) {
            out.push_str(&rest[..start]);
            rest = &rest[start..];
            let end = rest.find(|c| !word_char(c)).unwrap_or(rest.len());
            let w = &rest[..end];
            rest = &rest[end..];
            out.push_str(&self.word(w));
            // nft: `comment "…"`; iptables: `--comment "…"` or one word
            // (iptables-save leaves plain comments unquoted).
            let quoted_only = w == "comment";
            if quoted_only || w == "--comment" {
                let r = rest.strip_prefix(' ').unwrap_or(rest);
                if quoted_only && !r.starts_with('"') {
                    continue;
                }
                let (comment, after) = match r.strip_prefix('"') {
                    Some(q) => match q.find('"') {
                        Some(close) => (&q[..close], &q[close + 1..]),
                        None => (q, ""),
                    },
                    None => r.split_at(r.find(char::is_whitespace).unwrap_or(r.len())),
                };
                if !comment.is_empty() {
                    let tag = self.tag("comment", comment.as_bytes());
                    out.push_str(&format!(" \"c-{tag}\""));
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }

    fn peer(&mut self, p: &mut VethPeer) {
        if let Some(ns) = p.namespace.as_mut() {
            *ns = self.name("pod", ns);
        }
    }

    fn namespace(&mut self, ns: &mut Namespace) {
        for l in &mut ns.links {
            l.mac = l.mac.as_deref().map(|m| self.mac(m));
            l.addresses = l.addresses.iter().map(|a| self.net(*a)).collect();
            if let Some(p) = l.veth.as_mut() {
                self.peer(p);
            }
            if let Some(Lower { link, .. }) = l.lower.as_mut() {
                self.peer(link);
            }
            if let Some(v) = l.vxlan.as_mut() {
                v.local = v.local.map(|a| self.addr(a));
            }
        }
        for r in &mut ns.routes {
            r.dst = self.net(r.dst);
            r.gateway = r.gateway.map(|a| self.addr(a));
            r.src = r.src.map(|a| self.addr(a));
            for h in &mut r.nexthops {
                h.gateway = h.gateway.map(|a| self.addr(a));
            }
        }
        for r in &mut ns.rules {
            r.src = r.src.map(|n| self.net(n));
            r.dst = r.dst.map(|n| self.net(n));
        }
        for n in &mut ns.neighbours {
            n.addr = self.addr(n.addr);
            n.mac = n.mac.as_deref().map(|m| self.mac(m));
        }
        for f in &mut ns.fdb {
            f.dst = f.dst.map(|a| self.addr(a));
            f.mac = self.mac(&f.mac);
        }
        for t in &mut ns.nftables {
            t.text = self.text(&t.text);
        }
        for t in &mut ns.iptables {
            t.text = self.text(&t.text);
        }
    }

    /// Redacts a whole capture (names first, so texts find them).
    pub fn capture(&mut self, c: &mut Capture) {
        let p = &mut c.provenance;
        p.node_name = self.name("node", &p.node_name);
        p.hostname = self.name("node", &p.hostname);
        for s in c.pods.iter_mut().chain(c.peers.iter_mut()) {
            for n in [Some(&mut s.name), s.netns.as_mut(), s.cri.as_mut()]
                .into_iter()
                .flatten()
            {
                *n = self.name("pod", n);
            }
            s.evidence = s.evidence.iter().map(|e| self.text(e)).collect();
        }
        c.provenance.source = self.text(&c.provenance.source);
        c.provenance.redacted = true;
        c.node.net.name = self.name("node", &c.node.net.name);
        c.node.pod_cidrs = c.node.pod_cidrs.iter().map(|n| self.net(*n)).collect();
        self.namespace(&mut c.node.net);
        for pod in &mut c.node.pods {
            pod.name = self.name("pod", &pod.name);
            self.namespace(pod);
        }
        c.warnings = c.warnings.iter().map(|w| self.text(w)).collect();
    }
}

/// `aa:bb:…` (two hex digits a byte) as its bytes.
fn parse_hw(s: &str) -> Option<Vec<u8>> {
    s.split(':')
        .map(|b| {
            (b.len() == 2)
                .then(|| u8::from_str_radix(b, 16).ok())
                .flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r() -> Redactor {
        Redactor::new(b"test key")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    #[test]
    fn addresses_keep_their_subnets_and_reserved_ranges() {
        let mut r = r();
        let a = r.addr(ip("10.244.1.5"));
        let b = r.addr(ip("10.244.1.9"));
        let other = r.addr(ip("10.244.2.5"));
        let cidr = r.net(net("10.244.1.0/24"));
        assert_ne!(a, ip("10.244.1.5"));
        assert!(a.to_string().starts_with("10."), "{a}");
        assert!(
            cidr.contains(&a) && cidr.contains(&b) && !cidr.contains(&other),
            "{cidr} {a} {b} {other}"
        );
        assert_eq!(cidr.addr(), cidr.network(), "host bits stay zero: {cidr}");
        assert_eq!(r.net(net("10.244.1.5/24")).addr(), a);
        assert_eq!(
            r.addr(ip("10.244.1.5")),
            a,
            "the same input, the same output"
        );
        assert_eq!(
            Redactor::new(b"test key").addr(ip("10.244.1.5")),
            a,
            "keyed, not random"
        );
        assert_ne!(Redactor::new(b"other key").addr(ip("10.244.1.5")), a);
        for s in ["127.0.0.53", "169.254.1.1", "fe80::1234", "224.0.0.5"] {
            assert_eq!(r.addr(ip(s)), ip(s), "kept whole");
        }
        let private = r.addr(ip("192.168.7.7"));
        assert!(
            private.to_string().starts_with("192.168.") && private != ip("192.168.7.7"),
            "{private}"
        );
        assert_eq!(r.addr(ip("::1")), ip("::1"));
        assert_eq!(r.net(net("0.0.0.0/0")), net("0.0.0.0/0"));
        let public = r.net(net("203.0.113.0/24"));
        assert_ne!(public, net("203.0.113.0/24"));
    }

    #[test]
    fn the_map_is_one_to_one() {
        let mut r = r();
        let mapped: std::collections::BTreeSet<IpAddr> = (0..=255u8)
            .flat_map(|a| {
                [
                    IpAddr::V4(Ipv4Addr::new(10, 0, 0, a)),
                    IpAddr::V4(Ipv4Addr::new(11, 1, 0, a)),
                ]
            })
            .map(|a| r.addr(a))
            .collect();
        assert_eq!(mapped.len(), 512);
    }

    #[test]
    fn text_maps_addresses_names_and_comments() {
        let mut r = r();
        let node = r.name("node", "worker-7");
        let svc = "ip daddr 10.96.0.10 tcp dport 53 counter dnat to 10.244.1.5:53 comment \"kube-system/kube-dns:dns-tcp\"";
        let out = r.text(svc);
        assert!(
            !out.contains("10.96.0.10") && !out.contains("10.244.1.5") && !out.contains("kube-dns"),
            "{out}"
        );
        assert!(
            out.contains(&format!("{}:53", r.addr(ip("10.244.1.5")))),
            "{out}"
        );
        assert!(
            out.starts_with("ip daddr 10.") && out.contains(" tcp dport 53 "),
            "{out}"
        );
        assert!(out.contains("comment \"c-"), "{out}");
        assert_eq!(
            r.text("on worker-7: nft missing"),
            format!("on {node}: nft missing")
        );
        assert_eq!(
            r.text("iifname \"cali*\" accept"),
            "iifname \"cali*\" accept"
        );
        let legacy = r.text("-A KUBE-SVC-X -m comment --comment default/web -j KUBE-SEP-Y");
        assert!(
            !legacy.contains("default/web") && legacy.ends_with(" -j KUBE-SEP-Y"),
            "{legacy}"
        );
        assert_eq!(r.text("/run/netns/worker-7"), format!("/run/netns/{node}"));
    }

    #[test]
    fn macs_are_mapped_one_to_one_keeping_their_kind() {
        let mut r = r();
        let byte0 = |m: &str| u8::from_str_radix(&m[..2], 16).expect("hex");
        let local = r.mac("02:aa:00:00:00:02");
        assert_ne!(local, "02:aa:00:00:00:02");
        assert_eq!(
            byte0(&local) & 3,
            2,
            "unicast, locally administered: {local}"
        );
        let global = r.mac("00:1b:21:3a:4f:10");
        assert_ne!(global, "00:1b:21:3a:4f:10");
        assert_eq!(byte0(&global) & 3, 0, "unicast, universal: {global}");
        assert_eq!(
            r.mac("02:aa:00:00:00:02"),
            local,
            "the same input, the same output"
        );
        assert_eq!(
            Redactor::new(b"test key").mac("02:aa:00:00:00:02"),
            local,
            "keyed: another node's capture with the key maps it the same"
        );
        assert_ne!(Redactor::new(b"other key").mac("02:aa:00:00:00:02"), local);
        for kept in [
            "ff:ff:ff:ff:ff:ff",
            "01:00:5e:00:00:fb",
            "33:33:00:00:00:01",
            "00:00:00:00:00:00",
        ] {
            assert_eq!(r.mac(kept), kept, "multicast, broadcast and zero are kept");
        }
        let mapped: std::collections::BTreeSet<String> = (0..=255u8)
            .flat_map(|b| {
                [
                    format!("02:42:ac:11:00:{b:02x}"),
                    format!("0a:58:0a:f4:01:{b:02x}"),
                ]
            })
            .map(|m| r.mac(&m))
            .collect();
        assert_eq!(mapped.len(), 512, "one to one");
        // A gre/ipip link's address is its local IPv4 address.
        assert_eq!(r.mac("cb:00:71:05"), {
            let IpAddr::V4(a) = r.addr(ip("203.0.113.5")) else {
                panic!("v4")
            };
            cnilab_net::nl::mac_string(&a.octets())
        });
        assert_eq!(r.mac("00:00:00:00"), "00:00:00:00");
        let node = r.name("node", "worker-7");
        assert_eq!(r.mac("@worker-7/eth0"), format!("@{node}/eth0"));
        assert_eq!(r.mac("not a mac"), "not a mac");
        let rule = r.text("ether saddr 02:aa:00:00:00:02 accept");
        assert_eq!(rule, format!("ether saddr {local} accept"));
    }

    #[test]
    fn a_neighbour_and_fdb_entry_still_name_the_links_mac() {
        use crate::model::{FdbEntry, Link, LinkKind, Neighbour};
        let mut vtep = Link::new("flannel.1", LinkKind::Vxlan, true);
        vtep.mac = Some("02:aa:00:00:00:01".into());
        let mut local = Namespace::new("node1");
        local.links.push(vtep);
        let mut remote = Namespace::new("node2");
        remote.neighbours.push(Neighbour {
            dev: "flannel.1".into(),
            addr: ip("10.244.1.0"),
            mac: Some("02:aa:00:00:00:01".into()),
            state: "permanent".into(),
        });
        remote.fdb.push(FdbEntry {
            dev: "flannel.1".into(),
            mac: "02:aa:00:00:00:01".into(),
            dst: Some(ip("192.0.2.1")),
            state: "permanent".into(),
        });
        // Two nodes, two runs, one key.
        Redactor::new(b"k").namespace(&mut local);
        Redactor::new(b"k").namespace(&mut remote);
        let mac = local.links[0].mac.clone().expect("mac");
        assert_ne!(mac, "02:aa:00:00:00:01");
        assert_eq!(remote.neighbours[0].mac.as_deref(), Some(mac.as_str()));
        assert_eq!(remote.fdb[0].mac, mac);
    }
}
