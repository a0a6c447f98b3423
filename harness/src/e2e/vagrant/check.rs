//! The check of `cnilab e2e vagrant`: pods made in each VM through its
//! containerd (`cnilab e2e vagrant-node facts`, run by `vagrant ssh`), then
//! the groups `lab check` runs between them (pod-to-pod on one node and
//! across nodes, node-to-pod, pod-to-node, full-size packets with DF across
//! nodes), one `vagrant ssh` per source VM, reported like `lab check`
//! (table, JSON, JUnit) with the lab's node diagnoses (forwarding off, a
//! missing route, a FORWARD drop, ...), each naming the VM at fault.

use super::node::{first_ipv4, NodeReport};
use super::options::VagrantOptions;
use crate::connectivity::node_rules::{diagnose_nodes, Network, NodeFacts};
use crate::connectivity::report::{Failure, NodeView, Report};
use crate::connectivity::{Endpoint, ProbeOutcome, ProbeSpec, Proto};
use crate::e2e::plan::Cmd;
use crate::e2e::E2eError;
use crate::netns::Route;
use ipnet::IpNet;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

/// The VMs of lab/vagrant/offline.rb.
pub const NODES: [&str; 2] = ["node1", "node2"];
const PODS_PER_NODE: usize = 2;
/// The groups, in `lab check`'s names.
pub const GROUPS: [&str; 5] = [
    "pod-to-pod/same-node",
    "pod-to-pod/cross-node",
    "node-to-pod",
    "pod-to-node",
    "mtu/df-cross-node",
];
/// The conflist's MTU (the agent's default) and the VMs' NICs'.
const MTU: u32 = 1500;
const SSH: Duration = Duration::from_secs(300);

fn pod_names(node: &str) -> Vec<String> {
    (0..PODS_PER_NODE)
        .map(|i| format!("{node}-pod{i}"))
        .collect()
}

/// `vagrant ssh NODE -c 'sudo sh -s'` in the run's namespace, the script
/// on stdin (never a `-c` argument built from strings).
pub(super) fn ssh(opts: &VagrantOptions, node: &str, script: &str) -> Cmd {
    opts.vagrant()
        .args(["ssh", node, "-c", "sudo sh -s"])
        .stdin(script)
}

/// The VM's nodes file (one JSON line, `[...]`), then its pods' facts (one
/// JSON line, `{...}`): one `vagrant ssh`, since vagrant locks a machine
/// while an ssh to it runs.
fn facts_cmd(opts: &VagrantOptions, node: &str) -> Cmd {
    ssh(
        opts,
        node,
        &format!(
            "cat /etc/cnilab/nodes.json\ncnilab e2e vagrant-node facts {}",
            pod_names(node).join(" ")
        ),
    )
}

/// A probe and how its source sends it.
struct Probe {
    spec: ProbeSpec,
    /// The pause pid of a pod source (`nsenter`), `None` for the VM itself.
    pid: Option<u32>,
}

/// The shell line of probe `i`: `P i ok` or `P i fail` on stdout.
fn probe_line(i: usize, p: &Probe) -> String {
    let enter = p
        .pid
        .map(|pid| format!("nsenter --target {pid} --net "))
        .unwrap_or_default();
    let size = if p.spec.group.starts_with("mtu/") {
        format!("-M do -s {} ", MTU - 28)
    } else {
        String::new()
    };
    format!(
        "if {enter}ping -n -q -c 3 -W 3 {size}{} >/dev/null 2>&1; then echo P {i} ok; else echo P {i} fail; fi",
        p.spec.to.ip
    )
}

/// The probes' script for the VM `from` (one `vagrant ssh`): every probe
/// in the background at once, then `wait` (each prints its one short line
/// with one write, so lines never mix).
fn probe_cmd(opts: &VagrantOptions, probes: &[Probe], from: usize) -> Option<Cmd> {
    let lines: Vec<String> = probes
        .iter()
        .enumerate()
        .filter(|(_, p)| p.spec.from.node == Some(from))
        .map(|(i, p)| format!("( {} ) &", probe_line(i, p)))
        .collect();
    (!lines.is_empty()).then(|| ssh(opts, NODES[from], &format!("{}\nwait", lines.join("\n"))))
}

/// One planned command, and the script it reads on stdin as a comment.
fn shown(out: &mut String, cmd: &Cmd) {
    let _ = writeln!(out, "+ {cmd}");
    for line in cmd.stdin.iter().flat_map(|s| s.lines()) {
        let _ = writeln!(out, "#   stdin: {line}");
    }
}

/// The `--dry-run` of the check: the commands, with the pods' pids and
/// addresses shown as placeholders.
pub fn dry_run(opts: &VagrantOptions) -> String {
    let mut out = String::new();
    for node in NODES {
        shown(&mut out, &facts_cmd(opts, node));
    }
    let _ = writeln!(
        out,
        "# probes ({}), one `vagrant ssh` per VM:",
        GROUPS.join(", ")
    );
    for node in NODES {
        shown(&mut out, &ssh(opts, node, "<probes>"));
    }
    out
}

/// A VM as the check sees it.
struct Vm {
    name: String,
    address: IpAddr,
    pod_cidr: IpNet,
    report: NodeReport,
}

fn invalid(node: &str, what: &str) -> E2eError {
    E2eError::Invalid(format!("{node}: {what}"))
}

/// The JSON line of `vagrant-node facts` (vagrant may print around it).
fn parse_report(node: &str, out: &str) -> Result<NodeReport, E2eError> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| invalid(node, "vagrant-node facts printed no JSON"))?;
    serde_json::from_str(line).map_err(|e| invalid(node, &format!("vagrant-node facts: {e}")))
}

/// The VM's address and pod CIDR from the nodes file every VM has.
fn vm(node: &str, report: NodeReport, nodes_file: &serde_json::Value) -> Result<Vm, E2eError> {
    let entry = nodes_file
        .as_array()
        .and_then(|a| a.iter().find(|n| n["name"] == node))
        .ok_or_else(|| invalid(node, "not in /etc/cnilab/nodes.json"))?;
    let address = entry["internalIP"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid(node, "no internalIP in the nodes file"))?;
    let pod_cidr = entry["podCIDRs"][0]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid(node, "no podCIDRs in the nodes file"))?;
    Ok(Vm {
        name: node.to_string(),
        address,
        pod_cidr,
        report,
    })
}

fn endpoint(vms: &[Vm], node: usize, pod: Option<usize>) -> Result<Endpoint, E2eError> {
    let vm = &vms[node];
    let (name, ip) = match pod {
        Some(k) => {
            let p = &vm.report.pods[k];
            let ip = p
                .ip
                .parse()
                .map_err(|_| invalid(&vm.name, &format!("pod {}: address {:?}", p.name, p.ip)))?;
            (format!("{}/{}", vm.name, p.name), ip)
        }
        None => (vm.name.clone(), vm.address),
    };
    Ok(Endpoint {
        name,
        node: Some(node),
        pod,
        ip,
        external: false,
    })
}

/// Every probe of the groups between the two VMs.
fn probes(vms: &[Vm]) -> Result<Vec<Probe>, E2eError> {
    let mut out = Vec::new();
    let mut push = |group: &'static str,
                    from: (usize, Option<usize>),
                    to: (usize, Option<usize>)|
     -> Result<(), E2eError> {
        let pid = from.1.map(|k| vms[from.0].report.pods[k].pid);
        out.push(Probe {
            spec: ProbeSpec {
                group,
                from: endpoint(vms, from.0, from.1)?,
                to: endpoint(vms, to.0, to.1)?,
                proto: Proto::Icmp,
                expect_source: None,
                service: None,
            },
            pid,
        });
        Ok(())
    };
    for (a, b) in [(0, 1), (1, 0)] {
        push("pod-to-pod/same-node", (a, Some(0)), (a, Some(1)))?;
        push("pod-to-pod/cross-node", (a, Some(0)), (b, Some(0)))?;
        push("pod-to-pod/cross-node", (a, Some(1)), (b, Some(1)))?;
        push("node-to-pod", (a, None), (a, Some(0)))?;
        push("node-to-pod", (a, None), (b, Some(0)))?;
        push("pod-to-node", (a, Some(0)), (a, None))?;
        push("pod-to-node", (a, Some(0)), (b, None))?;
        push("mtu/df-cross-node", (a, Some(0)), (b, Some(1)))?;
    }
    Ok(out)
}

/// The routes of an `ip -j route` answer (`default` is 0.0.0.0/0).
fn routes(json: &serde_json::Value) -> Vec<Route> {
    json.as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["type"].as_str().is_none_or(|t| t == "unicast"))
        .filter_map(|r| {
            let dst = match r["dst"].as_str()? {
                "default" => "0.0.0.0/0".parse().ok()?,
                d if d.contains('/') => d.parse().ok()?,
                d => format!("{d}/32").parse().ok()?,
            };
            let gateway = r["gateway"].as_str().and_then(|g| g.parse().ok());
            Some(Route::new(dst, gateway))
        })
        .collect()
}

/// The diagnoses' view of a VM.
fn node_facts(vm: &Vm) -> NodeFacts {
    let addresses: Vec<IpAddr> = vm
        .report
        .addresses
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().into_iter().flatten())
        .filter_map(|a| a["local"].as_str().and_then(|s| s.parse().ok()))
        .collect();
    let uplink_mtu = vm
        .report
        .addresses
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| first_ipv4(&serde_json::json!([l])) == Some(vm.address.to_string()))
        .and_then(|l| l["mtu"].as_u64())
        .and_then(|m| u32::try_from(m).ok());
    NodeFacts {
        name: vm.name.clone(),
        address: Some(vm.address),
        addresses,
        pod_cidr: vec![vm.pod_cidr],
        routes: routes(&vm.report.routes),
        ip_forward: vm.report.ip_forward.clone(),
        rp_filter: vm.report.rp_filter.clone(),
        uplink_mtu,
        ruleset: vm.report.ruleset.clone(),
        ..NodeFacts::default()
    }
}

/// Runs the commands at once (each a `vagrant ssh`, `None` for a VM with
/// nothing to run); their answers in order, the first failure as the error.
pub(super) fn on_each_vm(cmds: Vec<Option<Cmd>>) -> Result<Vec<Option<String>>, E2eError> {
    crate::util::parallel_map(
        cmds,
        crate::util::A_THREAD_EACH,
        |cmd| {
            cmd.map(|cmd| crate::e2e::runner::run(&cmd, None, SSH, None))
                .transpose()
        },
        || Err(E2eError::Invalid("a `vagrant ssh` thread panicked".into())),
    )
    .into_iter()
    .collect()
}

/// Sends the probes (one `vagrant ssh` per source VM, both VMs at once) and
/// reads `P i ok|fail`.
fn send(opts: &VagrantOptions, probes: &[Probe]) -> Result<Vec<ProbeOutcome>, E2eError> {
    let mut results: Vec<Option<bool>> = vec![None; probes.len()];
    let cmds = (0..NODES.len())
        .map(|from| probe_cmd(opts, probes, from))
        .collect();
    for out in on_each_vm(cmds)?.into_iter().flatten() {
        for line in out.lines() {
            let mut w = line.split_whitespace();
            if let (Some("P"), Some(i), Some(verdict)) = (w.next(), w.next(), w.next()) {
                if let Some(slot) = i.parse::<usize>().ok().and_then(|i| results.get_mut(i)) {
                    *slot = Some(verdict == "ok");
                }
            }
        }
    }
    Ok(probes
        .iter()
        .zip(results)
        .map(|(p, r)| ProbeOutcome {
            spec: p.spec.clone(),
            error: match r {
                Some(true) => None,
                Some(false) if p.spec.group.starts_with("mtu/") => Some(format!(
                    "no reply to ping with DF set and {} bytes of payload (a {MTU}-byte packet)",
                    MTU - 28
                )),
                Some(false) => Some("no reply to ping (3 tries, 3 s each)".into()),
                None => Some("the probe did not report (the VM's shell stopped early)".into()),
            },
            seen_source: None,
            rtt_ms: None,
        })
        .collect())
}

/// Pods, probes and the report (emitted, and returned).
pub fn run(opts: &VagrantOptions) -> Result<Report, E2eError> {
    let started = std::time::Instant::now();
    // The pods of both VMs at once.
    let outs: Vec<String> = on_each_vm(
        NODES
            .iter()
            .map(|node| Some(facts_cmd(opts, node)))
            .collect(),
    )?
    .into_iter()
    .flatten()
    .collect();
    let reports = NODES
        .iter()
        .zip(&outs)
        .map(|(node, out)| parse_report(node, out))
        .collect::<Result<Vec<_>, _>>()?;
    let nodes_file = outs
        .first()
        .and_then(|out| out.lines().rev().find(|l| l.trim_start().starts_with('[')))
        .unwrap_or_default();
    let nodes_file: serde_json::Value = serde_json::from_str(nodes_file.trim())
        .map_err(|e| invalid(NODES[0], &format!("/etc/cnilab/nodes.json: {e}")))?;
    let vms = NODES
        .iter()
        .zip(reports)
        .map(|(node, report)| vm(node, report, &nodes_file))
        .collect::<Result<Vec<Vm>, E2eError>>()?;
    let pods_made = started.elapsed();
    let probes = probes(&vms)?;
    let outcomes = send(opts, &probes)?;
    let facts: Vec<NodeFacts> = vms.iter().map(node_facts).collect();
    let cluster = [crate::e2e::options::IpFamily::Ipv4
        .pod_subnet()
        .parse::<IpNet>()
        .map_err(|e| E2eError::Invalid(e.to_string()))?];
    let network = Network {
        routes_in_router: false,
        mtu: MTU,
        cluster_cidr: &cluster,
        pods: vms
            .iter()
            .flat_map(|vm| {
                vm.report.pods.iter().map(move |p| {
                    (
                        format!("{}/{}", vm.name, p.name),
                        p.ip.parse().into_iter().collect(),
                    )
                })
            })
            .collect(),
    };
    let failures: Vec<Failure> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.passed())
        .map(|(index, o)| Failure::new(index, o, diagnose_nodes(&network, &facts, o)))
        .collect();
    let views = vms
        .iter()
        .map(|vm| NodeView {
            name: vm.name.clone(),
            address: vm.address.to_string(),
            pod_cidr: vec![vm.pod_cidr.to_string()],
            pods: vm
                .report
                .pods
                .iter()
                .map(|p| (p.name.clone(), vec![p.ip.clone()]))
                .collect(),
        })
        .collect();
    let mut report = Report::from_parts(
        "e2e-vagrant",
        "cnilab-bridge in two VMs (vagrant, libvirt)",
        "routes via the private network",
        views,
        &GROUPS,
        outcomes,
        failures,
    );
    report.add_phase("pods", pods_made);
    report.add_phase("probes", started.elapsed() - pods_made);
    let mut check = crate::e2e::check::CheckOptions::new(Default::default());
    check.format = opts.format;
    check.junit = opts.junit.clone();
    check.json = opts.json.clone();
    crate::e2e::check::emit(&report, &check)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectivity::Diagnosis;
    use crate::e2e::vagrant::node::PodFacts;
    use serde_json::json;

    /// node1 and node2 as `vagrant-node facts` reports them: each with a
    /// route to the other's pods, forwarding on.
    fn vms() -> Vec<Vm> {
        let vm = |i: u8, other: u8| {
            let name = format!("node{i}");
            Vm {
                name: name.clone(),
                address: format!("192.168.56.{}", 10 + i).parse().expect("ip"),
                pod_cidr: format!("10.244.{i}.0/24").parse().expect("cidr"),
                report: NodeReport {
                    hostname: name.clone(),
                    routes: json!([
                        {"dst": "default", "gateway": "192.168.121.1", "dev": "eth0"},
                        {"dst": format!("10.244.{i}.0/24"), "dev": "cnilab0"},
                        {"dst": format!("10.244.{other}.0/24"), "gateway": format!("192.168.56.{}", 10 + other), "dev": "eth1"},
                    ]),
                    addresses: json!([{"ifname": "eth1", "mtu": 1500, "addr_info": [
                        {"family": "inet", "local": format!("192.168.56.{}", 10 + i), "scope": "global"}]}]),
                    ip_forward: "1".into(),
                    rp_filter: "0".into(),
                    ruleset: String::new(),
                    pods: (0..2)
                        .map(|k| PodFacts {
                            name: format!("{name}-pod{k}"),
                            pid: 100 + k,
                            ip: format!("10.244.{i}.{}", 2 + k),
                        })
                        .collect(),
                },
            }
        };
        vec![vm(1, 2), vm(2, 1)]
    }

    fn diagnoses(vms: &[Vm], failed: &str) -> Vec<Diagnosis> {
        let facts: Vec<NodeFacts> = vms.iter().map(node_facts).collect();
        let network = Network {
            routes_in_router: false,
            mtu: MTU,
            cluster_cidr: &[],
            pods: Vec::new(),
        };
        let probe = probes(vms)
            .expect("probes")
            .into_iter()
            .find(|p| p.spec.group == failed)
            .expect("a probe of the group");
        let outcome = ProbeOutcome {
            spec: probe.spec,
            error: Some("no reply".into()),
            seen_source: None,
            rtt_ms: None,
        };
        diagnose_nodes(&network, &facts, &outcome)
    }

    #[test]
    fn every_group_is_probed_both_ways() {
        let vms = vms();
        let probes = probes(&vms).expect("probes");
        for group in GROUPS {
            for node in [0, 1] {
                assert!(
                    probes
                        .iter()
                        .any(|p| p.spec.group == group && p.spec.from.node == Some(node)),
                    "{group} from node{}",
                    node + 1
                );
            }
        }
        let line = probe_line(0, &probes[0]);
        assert_eq!(
            line,
            "if nsenter --target 100 --net ping -n -q -c 3 -W 3 10.244.1.3 >/dev/null 2>&1; then echo P 0 ok; else echo P 0 fail; fi"
        );
        let mtu = probes
            .iter()
            .position(|p| p.spec.group.starts_with("mtu/"))
            .expect("mtu");
        assert!(probe_line(mtu, &probes[mtu]).contains("-M do -s 1472 "));
    }

    #[test]
    fn a_vms_probes_run_at_once_and_its_shell_waits_for_all() {
        let opts = VagrantOptions {
            repo: "/repo".into(),
            name: Some("t".into()),
            bin: "/bin".into(),
            retain: false,
            dry_run: true,
            format: crate::report::Format::Table,
            junit: None,
            json: None,
            capture: None,
        };
        let probes = probes(&vms()).expect("probes");
        let cmd = probe_cmd(&opts, &probes, 1).expect("node2 sends probes");
        assert!(cmd.args.iter().any(|a| a == "node2"), "{cmd}");
        let script = cmd.stdin.expect("the script on stdin");
        let lines: Vec<&str> = script.lines().collect();
        let from_node2: Vec<usize> = (0..probes.len())
            .filter(|&i| probes[i].spec.from.node == Some(1))
            .collect();
        assert_eq!(lines.len(), from_node2.len() + 1, "{script}");
        for (line, &i) in lines.iter().zip(&from_node2) {
            assert_eq!(*line, format!("( {} ) &", probe_line(i, &probes[i])));
        }
        assert_eq!(lines.last(), Some(&"wait"), "{script}");
    }

    #[test]
    fn a_healthy_pair_of_vms_has_no_diagnosis() {
        assert_eq!(diagnoses(&vms(), "pod-to-pod/cross-node"), vec![]);
    }

    #[test]
    fn forwarding_off_in_one_vm_is_diagnosed_on_that_vm() {
        let mut vms = vms();
        vms[1].report.ip_forward = "0".into();
        let found = diagnoses(&vms, "pod-to-pod/cross-node");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].id, "ip-forward-off");
        assert!(found[0].message.contains("node2"), "{}", found[0].message);
        assert!(!found[0].message.contains("node1"), "{}", found[0].message);
    }

    #[test]
    fn a_deleted_route_in_one_vm_is_diagnosed_on_that_vm() {
        let mut vms = vms();
        vms[0].report.routes = json!([{"dst": "default", "gateway": "192.168.121.1"}]);
        let found = diagnoses(&vms, "pod-to-pod/cross-node");
        let missing: Vec<&Diagnosis> = found.iter().filter(|d| d.id == "missing-route").collect();
        assert_eq!(missing.len(), 1, "{found:?}");
        assert!(
            missing[0]
                .message
                .starts_with("node1 has no route to 10.244.2.0/24"),
            "{}",
            missing[0].message
        );
    }

    #[test]
    fn routes_read_from_ip_json() {
        let r = routes(&json!([
            {"dst": "default", "gateway": "10.0.0.1"},
            {"dst": "10.244.2.0/24", "gateway": "192.168.56.12"},
            {"dst": "192.168.56.1"},
            {"type": "blackhole", "dst": "10.9.0.0/16"},
        ]));
        let shown: Vec<String> = r.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            shown,
            [
                "0.0.0.0/0 via 10.0.0.1 table 254",
                "10.244.2.0/24 via 192.168.56.12 table 254",
                "192.168.56.1/32 table 254"
            ]
        );
    }

    #[test]
    fn the_facts_line_is_found_among_vagrants_output() {
        let report = serde_json::to_string(&vms().remove(0).report).expect("json");
        let out = format!("some banner\n{report}\n");
        assert_eq!(parse_report("node1", &out).expect("parses").pods.len(), 2);
        assert!(parse_report("node1", "Connection closed.\n").is_err());
    }
}
