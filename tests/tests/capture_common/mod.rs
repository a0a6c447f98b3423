//! Helpers of the `cnilab capture` root tests (`capture.rs`,
//! `capture_cli.rs`): nodes and pods made with plain `ip` commands, the
//! capture run with a before/after check and its schema check
//! (`cnilab schema capture`), lookups in its JSON.
#![allow(dead_code)]

pub mod styles;

use cnilab_net::netns::Netns;
use cnilab_net::testing::network_of;
use cnilab_tests::{require_root, workspace_bin};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

pub fn all(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn cnilab(args: &[&str]) -> Output {
    Command::new(workspace_bin("cnilab"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("cnilab runs")
}

/// `cnilab capture --from-script FILE -o JSON`: the capture a script's
/// output `file` converts to (written to `json`), which must convert.
pub fn from_script(file: &Path, json: &Path) -> Value {
    let conv = cnilab(&[
        "capture",
        "--from-script",
        &file.display().to_string(),
        "-o",
        &json.display().to_string(),
    ]);
    assert!(conv.status.success(), "{}: {}", file.display(), all(&conv));
    serde_json::from_str(&std::fs::read_to_string(json).expect("json")).expect("JSON")
}

/// Runs each `program` line (split on spaces) inside `ns`.
pub fn run(ns: &Netns, program: &str, lines: &[&str]) {
    for line in lines {
        let args: Vec<&str> = line.split(' ').collect();
        let out = ns.command(program).args(&args).output().expect("runs");
        assert!(out.status.success(), "{program} {line}: {}", all(&out));
    }
}

/// A throwaway node with `lo` up and an uplink `eth0` (a veth whose peer
/// stays in the node: no other namespace is linked) at `addr`.
pub fn node(label: &str, addr: &str) -> Netns {
    require_root();
    let ns = Netns::with_label(label).expect("netns");
    run(
        &ns,
        "ip",
        &[
            "link set lo up",
            "link add eth0 type veth peer name eth0p",
            "link set eth0p up",
            "link set eth0 up",
            &format!("addr add {addr} dev eth0"),
        ],
    );
    ns
}

/// A name as containerd's CRI gives a pod's namespace: `cni-<uuid v4>`.
pub fn runtime_netns_name() -> String {
    let mut b = [0u8; 16];
    let mut random = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
    std::io::Read::read_exact(&mut random, &mut b).expect("random bytes");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "cni-{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// A pod namespace whose `eth0` is a veth to `host_if` in `node`, with
/// `addr` and the routes in `routes`; named under `/run/netns` as a
/// runtime names it (`cni-<uuid>`), never as cnilab names its own.
pub fn pod(node: &Netns, host_if: &str, addr: &str, routes: &[&str]) -> Netns {
    let mut pod = Netns::with_label("cap-pod").expect("netns");
    pod.rename(&runtime_netns_name())
        .expect("rename as a runtime names it");
    run(
        node,
        "ip",
        &[
            &format!(
                "link add {host_if} type veth peer name eth0 netns {}",
                pod.name()
            ),
            &format!("link set {host_if} up"),
        ],
    );
    run(
        &pod,
        "ip",
        &[
            "link set lo up",
            "link set eth0 up",
            &format!("addr add {addr} dev eth0"),
        ],
    );
    run(&pod, "ip", routes);
    pod
}

/// `cnilab capture --netns NODE -o FILE EXTRA…`, parsed; asserts every
/// namespace in `same` is unchanged by it.
pub fn capture(node: &Netns, extra: &[&str], same: &[&Netns]) -> Value {
    let before: Vec<_> = same.iter().map(|n| network_of(n)).collect();
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("node.json");
    let path = node.path().display().to_string();
    let file_arg = file.display().to_string();
    let mut args = vec!["capture", "--netns", &path, "-o", &file_arg];
    args.extend_from_slice(extra);
    let out = cnilab(&args);
    assert!(out.status.success(), "{}", all(&out));
    for (n, b) in same.iter().zip(&before) {
        let changes = network_of(n).changes_since(b);
        assert!(
            changes.is_empty(),
            "capture changed {}: {changes:?}",
            n.name()
        );
    }
    let text = std::fs::read_to_string(&file).expect("the capture file");
    let c: Value = serde_json::from_str(&text).expect("JSON");
    assert_conforms(&c);
    c
}

/// `c` matches the schema `cnilab schema capture` prints.
pub fn assert_conforms(c: &Value) {
    assert_conforms_to("capture", c);
}

/// `v` matches the schema `cnilab schema KIND` prints.
pub fn assert_conforms_to(kind: &str, v: &Value) {
    let text = cnilab_harness::report::schema::schema(kind).expect("the schema");
    let schema: Value = serde_json::from_str(text).expect("the schema is JSON");
    let errors = cnilab_harness::report::schema::validate(&schema, v);
    assert!(
        errors.is_empty(),
        "the {kind} breaks its schema: {errors:#?}"
    );
}

pub fn link<'a>(ns: &'a Value, name: &str) -> &'a Value {
    ns["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("no link {name} in {}", ns["links"]))
}

pub fn pod_named<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["node"]["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no pod {name} in {}", c["pods"]))
}

/// The IPv4 iptables-save text of `backend` (`legacy`, `nft`) in `ns`.
pub fn iptables_text(ns: &Value, backend: &str) -> String {
    ns["iptables"]
        .as_array()
        .and_then(|t| {
            t.iter()
                .find(|t| t["backend"] == backend && t["family"] == "ipv4")
        })
        .and_then(|t| t["text"].as_str())
        .unwrap_or_else(|| panic!("no {backend} ipv4 iptables in {}", ns["iptables"]))
        .to_string()
}

pub fn has(list: &Value, want: Value) -> bool {
    let want = want.as_object().expect("object");
    list.as_array().is_some_and(|l| {
        l.iter()
            .any(|item| want.iter().all(|(k, v)| item.get(k) == Some(v)))
    })
}

/// A Calico node, and the same node redacted.
pub struct Calico {
    pub node: Netns,
    pub pods: Vec<Netns>,
    pub macvlan: Netns,
}

pub fn calico() -> Calico {
    let n = node("cap-calico", "198.18.7.1/24");
    run(
        &n,
        "ip",
        &[
            "route add blackhole 10.65.1.0/26 proto bird",
            "route add unreachable 203.0.113.0/24",
            "route add prohibit 198.51.100.0/24",
            "route add 100.70.0.0/16 nexthop via 198.18.7.2 weight 1 nexthop via 198.18.7.3 weight 2",
            "route add default via 198.18.7.254",
        ],
    );
    let pods = ["10.65.1.2", "10.65.1.3"]
        .iter()
        .enumerate()
        .map(|(i, addr)| calico_pod(&n, &format!("cali{i}abc"), addr))
        .collect();
    let mv = Netns::with_label("cap-mv").expect("netns");
    run(
        &n,
        "ip",
        &[
            "link add mv0 link eth0 type macvlan mode bridge",
            &format!("link set mv0 netns {}", mv.name()),
        ],
    );
    run(
        &mv,
        "ip",
        &["link set mv0 up", "addr add 198.18.7.50/24 dev mv0"],
    );
    run(
        &n,
        "iptables-legacy",
        &["-A FORWARD -i cali+ -m comment --comment cali-from-wl -j ACCEPT"],
    );
    Calico {
        node: n,
        pods,
        macvlan: mv,
    }
}

/// A pod the way Calico's CNI makes one: `eth0` at `addr`/32 with a
/// default route via 169.254.1.1 and a permanent neighbour for it naming
/// the node's `cali` veth, whose MAC is ee:ee:ee:ee:ee:ee; in the node a
/// /32 route to the pod through `cali`, and proxy ARP on it.
pub fn calico_pod(node: &Netns, cali: &str, addr: &str) -> Netns {
    let p = pod(
        node,
        cali,
        &format!("{addr}/32"),
        &[
            "route add 169.254.1.1 dev eth0 scope link",
            "route add default via 169.254.1.1 dev eth0",
            "neigh add 169.254.1.1 lladdr ee:ee:ee:ee:ee:ee dev eth0 nud permanent",
        ],
    );
    run(
        node,
        "ip",
        &[
            &format!("link set {cali} address ee:ee:ee:ee:ee:ee"),
            &format!("route add {addr}/32 dev {cali} scope link"),
        ],
    );
    sysctl(node, &format!("net/ipv4/conf/{cali}/proxy_arp"), "1");
    p
}

/// Sets a sysctl inside `ns`.
pub fn sysctl(ns: &Netns, key: &str, value: &str) {
    cnilab_net::netns::write_sysctl(Some(ns.file()), key, value)
        .unwrap_or_else(|e| panic!("{key}={value} in {}: {e}", ns.name()));
}

/// Runs one command inside `ns` with these arguments (words may hold
/// spaces, such as a quoted iptables comment).
pub fn run_args(ns: &Netns, program: &str, args: &[&str]) {
    let out = ns.command(program).args(args).output().expect("runs");
    assert!(out.status.success(), "{program} {args:?}: {}", all(&out));
}

/// Every string of `v`, keys too.
pub fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.iter().for_each(|(k, x)| {
            out.push(k.clone());
            strings(x, out)
        }),
        _ => {}
    }
}

/// Whether `word` appears in `text` as a whole word (not inside a longer
/// address or name).
pub fn has_word(text: &str, word: &str) -> bool {
    let part = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == ':' || c == '-';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back().is_none_or(|c| !part(c));
        let after = text[i + word.len()..]
            .chars()
            .next()
            .is_none_or(|c| !part(c) || c == '/');
        before && after
    })
}
