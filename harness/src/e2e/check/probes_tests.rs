//! Unit tests of the probes: the plan is the catalogue's, the DF sizes,
//! the client address parsed from `/clientip`.

use super::*;

/// Two nodes of two probe pods each (MTU read on all but one), a
/// hostNetwork pod on each, an echo Service and a self Service a node.
fn two_by_two() -> Cluster {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let nodes = (0..2)
        .map(|n| ClusterNode {
            name: format!("worker{n}"),
            internal_ips: vec![ip(&format!("172.18.0.{}", n + 2))],
            pod_cidrs: Vec::new(),
            bad_cidrs: Vec::new(),
            ready: true,
        })
        .collect();
    let pod = |name: String, node: usize, host: bool, addr: String, mtu| ProbePod {
        name,
        node,
        host,
        ips: vec![ip(&addr)],
        mtu,
    };
    let pods = (0..4)
        .map(|k| {
            let mtu = (k != 3).then_some(1450);
            let addr = format!("10.244.{}.{}", k / 2, 10 + k % 2);
            pod(format!("probe-{k}"), k / 2, false, addr, mtu)
        })
        .collect();
    let hosts = (0..2)
        .map(|n| {
            pod(
                format!("host-{n}"),
                n,
                true,
                format!("172.18.0.{}", n + 2),
                None,
            )
        })
        .collect();
    Cluster {
        namespace: "cnilab-e2e".into(),
        nodes,
        pods,
        hosts,
        echo_ips: vec![ip("10.96.0.10")],
        self_ips: vec![vec![ip("10.96.0.20")], vec![ip("10.96.0.21")]],
    }
}

/// The pod and node probes of a cluster are the catalogue's, probe for
/// probe, run in the source pod (the source node's hostNetwork pod for
/// node-to-pod); only what a command cannot judge differs: the UDP
/// dial's source, and a DF probe without the pod's MTU.
#[test]
fn the_pod_and_node_probes_are_the_catalogues() {
    let c = two_by_two();
    let probes = plan(&c, true, false);
    let wanted = |g: &str| GROUPS.contains(&g);
    let from_catalogue: Vec<ProbeSpec> = catalogue::plan(&c, &wanted, false)
        .into_iter()
        .filter(|s| !(s.proto == Proto::Df && s.from.pod == Some(3)))
        .map(|mut s| {
            if s.proto == Proto::Udp {
                s.expect_source = None;
            }
            s
        })
        .collect();
    let key = |s: &ProbeSpec| {
        let ends = [&s.from, &s.to].map(|e| (e.name.clone(), e.ip, e.node, e.pod));
        (s.group, ends, s.proto, s.expect_source)
    };
    let planned: Vec<_> = probes
        .iter()
        .map(|p| &p.spec)
        .filter(|s| catalogue::entry(s.group).is_some())
        .map(key)
        .collect();
    assert_eq!(planned, from_catalogue.iter().map(key).collect::<Vec<_>>());
    for p in probes
        .iter()
        .filter(|p| catalogue::entry(p.spec.group).is_some())
    {
        let runs_in = if p.spec.group == groups::NODE_TO_POD {
            c.hosts.iter().find(|h| Some(h.node) == p.spec.from.node)
        } else {
            p.spec.from.pod.and_then(|i| c.pods.get(i))
        };
        assert_eq!(Some(&p.exec_pod), runs_in.map(|x| &x.name), "{p:?}");
    }
    // The Service groups follow: each pod to the echo Service and its
    // DNS name, the first pod of each node to itself.
    let services = probes.len() - planned.len();
    assert_eq!(services, 4 + 4 + 2);
}

#[test]
fn client_ip_forms() {
    assert_eq!(
        parse_client_ip("10.244.1.5:43210"),
        "10.244.1.5".parse().ok()
    );
    assert_eq!(
        parse_client_ip("[fd00:10:244:1::5]:43210\n"),
        "fd00:10:244:1::5".parse().ok()
    );
    assert_eq!(parse_client_ip("nonsense"), None);
}

#[test]
fn df_sizes() {
    assert_eq!(
        df_ping(
            "10.0.0.1".parse().unwrap_or(IpAddr::from([0, 0, 0, 0])),
            1500
        )[6],
        "1472"
    );
    assert_eq!(
        df_ping("fd00::1".parse().unwrap_or(IpAddr::from([0u16; 8])), 1500)[6],
        "1452"
    );
}
