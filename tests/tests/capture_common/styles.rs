//! The three real node styles of `capture_styles.rs` and
//! `capture_replay.rs`, each a two-node cluster built with plain `ip`,
//! `bridge`, `iptables-nft` and sysctl writes in throwaway namespaces (not
//! by the lab), the way the CNI or kube-proxy builds them; see
//! [`flannel`], [`calico_cluster`] and [`kube_proxy`].

use super::*;
use cnilab_net::netns::Netns;
use serde_json::{json, Value};

/// Two nodes (`node1`, `node2`) and their pods.
pub struct Cluster {
    pub nodes: Vec<Netns>,
    pub pods: Vec<Vec<Netns>>,
    /// The name a capture gives each pod (`cni-<uuid>`, a Docker mount's
    /// id, `pid:<n>`), node by node.
    pub names: Vec<Vec<String>>,
    /// What keeps pods without a name alive (processes, mounts).
    pub held: Vec<Held>,
}

/// A pod namespace's process (a sandbox's pause, here a `sleep` that dies
/// with the test's thread) and, for a Docker-style pod, the mount that
/// names it; both ended on drop.
pub struct Held {
    process: std::process::Child,
    mount: Option<std::path::PathBuf>,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(m) = &self.mount {
            let _ = std::process::Command::new("umount").arg(m).status();
        }
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Cluster {
    /// Pods named under `/run/netns`: a capture names them so.
    fn named(nodes: Vec<Netns>, pods: Vec<Vec<Netns>>) -> Cluster {
        let names = pods
            .iter()
            .map(|p| p.iter().map(|p| p.name().to_string()).collect())
            .collect();
        Cluster {
            nodes,
            pods,
            names,
            held: Vec::new(),
        }
    }

    /// Every namespace of the cluster.
    pub fn all(&self) -> Vec<&Netns> {
        self.nodes
            .iter()
            .chain(self.pods.iter().flatten())
            .collect()
    }

    /// Captures node `i` (0-based), checking no namespace changes.
    pub fn capture(&self, i: usize, extra: &[&str]) -> Value {
        capture(&self.nodes[i], extra, &self.all())
    }

    /// Asserts node `i`'s capture found exactly its pods, by name, each
    /// with `eth0` at `addrs[j]`.
    pub fn assert_pods(&self, c: &Value, i: usize, addrs: &[String]) {
        let mut found: Vec<&str> = c["pods"]
            .as_array()
            .map(|p| p.iter().filter_map(|p| p["name"].as_str()).collect())
            .unwrap_or_default();
        found.sort_unstable();
        let mut want: Vec<&str> = self.names[i].iter().map(String::as_str).collect();
        want.sort_unstable();
        assert_eq!(found, want, "{}", c["pods"]);
        for (name, addr) in self.names[i].iter().zip(addrs) {
            let pod = pod_named(c, name);
            assert_eq!(link(pod, "eth0")["addresses"], json!([addr]), "{pod}");
            let source = match name.strip_prefix("pid:") {
                Some(pid) => json!({"name": name, "pid": pid.parse::<u32>().expect("pid")}),
                None if name.starts_with("cni-") => json!({"name": name, "netns": name}),
                None => json!({"name": name}),
            };
            assert!(has(&c["pods"], source), "{}", c["pods"]);
        }
    }
}

/// The MAC of `dev` in `ns`, as `ip -j link` prints it.
pub fn mac_of(ns: &Netns, dev: &str) -> String {
    let out = ns
        .command("ip")
        .args(["-j", "link", "show", dev])
        .output()
        .expect("ip runs");
    assert!(out.status.success(), "{}", all(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("ip -j JSON");
    v[0]["address"].as_str().expect("address").to_string()
}

pub fn flannel() -> Cluster {
    let mut nodes = Vec::new();
    let mut pods = Vec::new();
    for i in 1..=2 {
        let n = node(&format!("cap-fl{i}"), &format!("192.0.2.{i}/24"));
        run(
            &n,
            "ip",
            &[
                &format!("link add flannel.1 type vxlan id 1 local 192.0.2.{i} dev eth0 dstport 8472 nolearning"),
                "link set flannel.1 up",
                &format!("addr add 10.244.{i}.0/32 dev flannel.1"),
                "link add cni0 type bridge",
                "link set cni0 up",
                &format!("addr add 10.244.{i}.1/24 dev cni0"),
            ],
        );
        let node_pods: Vec<Netns> = (0..2)
            .map(|j| {
                let veth = format!("veth{i}{j}");
                let addr = format!("10.244.{i}.{}/24", j + 2);
                let gw = format!("route add default via 10.244.{i}.1");
                let p = pod(&n, &veth, &addr, &[&gw]);
                // The flannel CNI gives pods the VXLAN's MTU (1450).
                run(
                    &n,
                    "ip",
                    &[
                        &format!("link set {veth} mtu 1450"),
                        &format!("link set {veth} master cni0"),
                    ],
                );
                run(&p, "ip", &["link set eth0 mtu 1450"]);
                p
            })
            .collect();
        sysctl(&n, "net/ipv4/ip_forward", "1");
        run_args(&n, "iptables-nft", &["-P", "FORWARD", "DROP"]);
        run_args(&n, "iptables-nft", &["-N", "FLANNEL-FWD"]);
        for rule in [
            "-A FORWARD -m comment --comment flanneld_forward -j FLANNEL-FWD",
            "-A FLANNEL-FWD -s 10.244.0.0/16 -m comment --comment flanneld_forward -j ACCEPT",
            "-A FLANNEL-FWD -d 10.244.0.0/16 -m comment --comment flanneld_forward -j ACCEPT",
        ] {
            let mut args: Vec<&str> = rule.split(' ').collect();
            // flanneld's comment has a space.
            for a in &mut args {
                if *a == "flanneld_forward" {
                    *a = "flanneld forward";
                }
            }
            run_args(&n, "iptables-nft", &args);
        }
        nodes.push(n);
        pods.push(node_pods);
    }
    // What flanneld writes for each peer it learns from the API server.
    for (i, j) in [(0usize, 2u8), (1, 1)] {
        let peer_mac = mac_of(&nodes[usize::from(j) - 1], "flannel.1");
        run(
            &nodes[i],
            "ip",
            &[
                &format!("neigh add 10.244.{j}.0 lladdr {peer_mac} dev flannel.1 nud permanent"),
                &format!("route add 10.244.{j}.0/24 via 10.244.{j}.0 dev flannel.1 onlink"),
            ],
        );
        run(
            &nodes[i],
            "bridge",
            &[&format!(
                "fdb append {peer_mac} dev flannel.1 dst 192.0.2.{j}"
            )],
        );
    }
    Cluster::named(nodes, pods)
}

pub fn calico_cluster() -> Cluster {
    let mut nodes = Vec::new();
    let mut pods = Vec::new();
    for i in 1..=2u8 {
        let peer = 3 - i;
        let n = node(&format!("cap-ca{i}"), &format!("192.0.2.{i}/24"));
        run(
            &n,
            "ip",
            &[
                &format!("route add blackhole 10.65.{i}.0/26 proto bird"),
                &format!("route add 10.65.{peer}.0/26 via 192.0.2.{peer} dev eth0 proto bird"),
            ],
        );
        sysctl(&n, "net/ipv4/ip_forward", "1");
        let node_pods = (0..2)
            .map(|j| {
                calico_pod(
                    &n,
                    &format!("cali{i}{j}f00d"),
                    &format!("10.65.{i}.{}", j + 2),
                )
            })
            .collect();
        run_args(&n, "iptables-nft", &["-N", "cali-FORWARD"]);
        run_args(
            &n,
            "iptables-nft",
            &[
                "-A",
                "FORWARD",
                "-m",
                "comment",
                "--comment",
                "cali:wUHhoiAYhphO9Mso",
                "-j",
                "cali-FORWARD",
            ],
        );
        run_args(
            &n,
            "iptables-nft",
            &[
                "-A",
                "cali-FORWARD",
                "-i",
                "cali+",
                "-m",
                "comment",
                "--comment",
                "cali:from-wl-dispatch",
                "-j",
                "ACCEPT",
            ],
        );
        nodes.push(n);
        pods.push(node_pods);
    }
    Cluster::named(nodes, pods)
}

/// Two Services, the same chains on both nodes as kube-proxy writes them:
/// web (10.96.0.10:80/tcp) with an endpoint on each node (port 8080), and
/// dns (10.96.0.53:53/udp) with one, on node 2 (port 5353).
/// [`KUBE_SERVICES_DNS`] is the DNS Service's rule in KUBE-SERVICES,
/// [`KUBE_SVC_DNS_JUMP`] its Service chain's jump to its endpoint and
/// [`KUBE_SEP_DNS_DNAT`] the endpoint's DNAT rule.
pub const KUBE_SERVICES_DNS: &[&str] = &[
    "-A",
    "KUBE-SERVICES",
    "-d",
    "10.96.0.53/32",
    "-p",
    "udp",
    "-m",
    "comment",
    "--comment",
    "default/dns:dns cluster IP",
    "-m",
    "udp",
    "--dport",
    "53",
    "-j",
    "KUBE-SVC-DNS4DNS",
];

/// See [`KUBE_SERVICES_DNS`].
pub const KUBE_SVC_DNS_JUMP: &[&str] = &[
    "-A",
    "KUBE-SVC-DNS4DNS",
    "-m",
    "comment",
    "--comment",
    "default/dns:dns -> 10.244.2.2:5353",
    "-j",
    "KUBE-SEP-NODE2DNS",
];

/// See [`KUBE_SERVICES_DNS`].
pub const KUBE_SEP_DNS_DNAT: &[&str] = &[
    "-A",
    "KUBE-SEP-NODE2DNS",
    "-p",
    "udp",
    "-m",
    "comment",
    "--comment",
    "default/dns:dns",
    "-m",
    "udp",
    "-j",
    "DNAT",
    "--to-destination",
    "10.244.2.2:5353",
];

pub fn kube_proxy() -> Cluster {
    let mut nodes = Vec::new();
    let mut pods = Vec::new();
    for i in 1..=2u8 {
        let n = node(&format!("cap-kp{i}"), &format!("192.0.2.{i}/24"));
        let p = pod(
            &n,
            &format!("veth{i}web"),
            &format!("10.244.{i}.2/24"),
            &[&format!(
                "route add default via 10.244.{i}.1 dev eth0 onlink"
            )],
        );
        // The pod's gateway on its veth (as the ptp plugin does) and a
        // host-gw route to the other node's pods.
        let peer = 3 - i;
        run(
            &n,
            "ip",
            &[
                &format!("route add 10.244.{i}.2/32 dev veth{i}web scope link"),
                &format!("addr add 10.244.{i}.1/32 dev veth{i}web"),
                &format!("route add 10.244.{peer}.0/24 via 192.0.2.{peer} dev eth0"),
            ],
        );
        sysctl(&n, "net/ipv4/ip_forward", "1");
        let mut rules: Vec<Vec<String>> = [
            "-N KUBE-SERVICES",
            "-N KUBE-SVC-WEB4HTTP",
            "-N KUBE-SEP-NODE1WEB",
            "-N KUBE-SEP-NODE2WEB",
            "-N KUBE-SVC-DNS4DNS",
            "-N KUBE-SEP-NODE2DNS",
            "-N KUBE-MARK-MASQ",
            "-N KUBE-POSTROUTING",
            "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
            "-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE",
        ]
        .iter()
        .map(|r| r.split(' ').map(String::from).collect())
        .collect();
        let comment = |rule: &str, c: &str| -> Vec<String> {
            let (head, tail) = rule.split_once(" | ").expect("a | marks the comment");
            let mut args: Vec<String> = head.split(' ').map(String::from).collect();
            args.extend(["-m", "comment", "--comment", c].map(String::from));
            args.extend(tail.split(' ').map(String::from));
            args
        };
        rules.extend([
            comment("-A PREROUTING | -j KUBE-SERVICES", "kubernetes service portals"),
            comment("-A OUTPUT | -j KUBE-SERVICES", "kubernetes service portals"),
            comment("-A POSTROUTING | -j KUBE-POSTROUTING", "kubernetes postrouting rules"),
            comment(
                "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp | -m tcp --dport 80 -j KUBE-SVC-WEB4HTTP",
                "default/web:http cluster IP",
            ),
            comment(
                "-A KUBE-SVC-WEB4HTTP | -m statistic --mode random --probability 0.5 -j KUBE-SEP-NODE1WEB",
                "default/web:http -> 10.244.1.2:8080",
            ),
            comment(
                "-A KUBE-SVC-WEB4HTTP | -j KUBE-SEP-NODE2WEB",
                "default/web:http -> 10.244.2.2:8080",
            ),
            KUBE_SERVICES_DNS.iter().map(|w| w.to_string()).collect(),
            KUBE_SVC_DNS_JUMP.iter().map(|w| w.to_string()).collect(),
            comment(
                "-A KUBE-SEP-NODE2DNS -s 10.244.2.2/32 | -j KUBE-MARK-MASQ",
                "default/dns:dns",
            ),
            KUBE_SEP_DNS_DNAT.iter().map(|w| w.to_string()).collect(),
        ]);
        for (sep, ep) in [("NODE1WEB", "10.244.1.2"), ("NODE2WEB", "10.244.2.2")] {
            rules.push(comment(
                &format!("-A KUBE-SEP-{sep} -s {ep}/32 | -j KUBE-MARK-MASQ"),
                "default/web:http",
            ));
            rules.push(comment(
                &format!("-A KUBE-SEP-{sep} -p tcp | -m tcp -j DNAT --to-destination {ep}:8080"),
                "default/web:http",
            ));
        }
        for rule in &rules {
            let mut args = vec!["-t", "nat"];
            args.extend(rule.iter().map(String::as_str));
            run_args(&n, "iptables-nft", &args);
        }
        nodes.push(n);
        pods.push(vec![p]);
    }
    Cluster::named(nodes, pods)
}

/// Holds `pod` by a process only, as a runtime that never names its
/// namespaces does: a capture finds it as `pid:<n>`; with `docker`, also
/// mounts it where Docker mounts a sandbox's namespace
/// (`…/docker/netns/<12 hex>`), whose id names it. Returns the name a
/// capture gives it.
pub fn held_by_process(pod: &mut Netns, docker: bool, held: &mut Vec<Held>) -> String {
    let process = pod
        .command("setpriv")
        .args(["--pdeathsig", "KILL", "--", "sleep", "3600"])
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("a process in the pod's namespace");
    pod.unname().expect("the pod loses its /run/netns name");
    let pid = process.id();
    if !docker {
        held.push(Held {
            process,
            mount: None,
            _dir: None,
        });
        return format!("pid:{pid}");
    }
    let dir = tempfile::tempdir().expect("dir");
    let netns = dir.path().join("docker/netns");
    std::fs::create_dir_all(&netns).expect("mkdir");
    let id = &runtime_netns_name().replace('-', "")[3..15];
    let point = netns.join(id);
    std::fs::write(&point, "").expect("mount point");
    let mounted = std::process::Command::new("mount")
        .arg("--bind")
        .arg(format!("/proc/{pid}/ns/net"))
        .arg(&point)
        .status()
        .expect("mount runs");
    assert!(mounted.success(), "mount --bind the pod's namespace");
    held.push(Held {
        process,
        mount: Some(point),
        _dir: Some(dir),
    });
    id.to_string()
}

/// Two nodes as kube-router leaves them: pods on a `kube-bridge` bridge
/// (the bridge CNI plugin, host-local IPAM, `veth` + 8 hex names), routes
/// to the other node's pod subnet through its address as kube-router's BGP
/// speaker installs them (`proto 17`), and its forward chain in
/// iptables-nft. Each node's pods are held the way a dockershim-era node
/// held them: one by its sandbox process and a Docker-style mount, one by
/// its process only; neither is under `/run/netns`.
pub fn kube_router() -> Cluster {
    let mut nodes = Vec::new();
    let mut pods = Vec::new();
    let mut names = Vec::new();
    let mut held = Vec::new();
    for i in 1..=2u8 {
        let peer = 3 - i;
        let n = node(&format!("cap-kr{i}"), &format!("192.0.2.{i}/24"));
        run(
            &n,
            "ip",
            &[
                "link add kube-bridge type bridge",
                "link set kube-bridge up",
                &format!("addr add 10.244.{i}.1/24 dev kube-bridge"),
                &format!("route add 10.244.{peer}.0/24 via 192.0.2.{peer} dev eth0 proto 17"),
            ],
        );
        sysctl(&n, "net/ipv4/ip_forward", "1");
        run_args(&n, "iptables-nft", &["-N", "KUBE-ROUTER-FORWARD"]);
        for rule in [
            vec![
                "-I",
                "FORWARD",
                "1",
                "-m",
                "comment",
                "--comment",
                "kube-router netpol - TEMCG2JMHZYE7H7T",
                "-j",
                "KUBE-ROUTER-FORWARD",
            ],
            vec![
                "-A",
                "KUBE-ROUTER-FORWARD",
                "-s",
                "10.244.0.0/16",
                "-m",
                "comment",
                "--comment",
                "allow traffic from the pod CIDR",
                "-j",
                "ACCEPT",
            ],
            vec![
                "-A",
                "KUBE-ROUTER-FORWARD",
                "-d",
                "10.244.0.0/16",
                "-m",
                "comment",
                "--comment",
                "allow traffic to the pod CIDR",
                "-j",
                "ACCEPT",
            ],
        ] {
            run_args(&n, "iptables-nft", &rule);
        }
        let mut node_pods = Vec::new();
        let mut node_names = Vec::new();
        for j in 0..2u8 {
            let veth = format!("veth{i}{j}a5e1f0");
            let addr = format!("10.244.{i}.{}/24", j + 2);
            let gw = format!("route add default via 10.244.{i}.1");
            let mut p = pod(&n, &veth, &addr, &[&gw]);
            run(&n, "ip", &[&format!("link set {veth} master kube-bridge")]);
            node_names.push(held_by_process(&mut p, j == 0, &mut held));
            node_pods.push(p);
        }
        nodes.push(n);
        pods.push(node_pods);
        names.push(node_names);
    }
    Cluster {
        nodes,
        pods,
        names,
        held,
    }
}
