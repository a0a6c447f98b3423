//! How reconcile time grows with the node count: a print command, not a test.
//!
//! ```sh
//! cargo build --release -p cnilab-agent --examples
//! ./target/release/examples/reconcile_scale 5000 20000 100000
//! ./target/release/examples/reconcile_scale --with-agent 5000 20000
//! ```
//!
//! For each count N it prints the plan alone (in-process: first start with
//! no routes, then the steady state with all N-1 routes installed), and,
//! with `--with-agent` (root), the real agent binary next to this example run with `--once` on a
//! throwaway namespace (a veth pair holds the underlay) twice (the first pass adds N-1 routes through the
//! kernel, the second finds nothing to do). Node i has InternalIP in
//! 172.16.0.0/12 and pod CIDR a /26 of 10.0.0.0/8.
//!
//! The agent's first pass is bound by the kernel: routes via distinct
//! gateways on one device share a `fib_info` hash bucket (the hash covers
//! the device, not the gateway), so inserting them grows quadratically
//! whatever the agent does; 100k takes about 15 minutes here.

use cnilab_agent::nodes::NodeInfo;
use cnilab_agent::plan::{plan, InstalledRoute};
use cnilab_net::netns::Netns;
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn node_ip(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 1)) + i))
}

fn pod_cidr(i: u32) -> IpNet {
    let base = u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (i << 6);
    IpNet::new(IpAddr::V4(Ipv4Addr::from(base)), 26).expect("a /26 is valid")
}

fn nodes(count: u32) -> Vec<NodeInfo> {
    (0..count)
        .map(|i| NodeInfo::new(&format!("n{i}"), &[node_ip(i)], &[pod_cidr(i)]))
        .collect()
}

fn cluster() -> Vec<IpNet> {
    vec!["10.0.0.0/8".parse().expect("cluster CIDR")]
}

fn plan_only(count: u32) {
    let nodes = nodes(count);
    let started = Instant::now();
    let first = plan("n0", &nodes, &[], &cluster());
    let first_ms = started.elapsed().as_secs_f64() * 1000.0;
    let installed: Vec<InstalledRoute> = first
        .desired
        .iter()
        .map(|r| InstalledRoute {
            dst: r.dst,
            gateway: Some(r.gateway),
            priority: 0,
            ours: true,
        })
        .collect();
    let started = Instant::now();
    let steady = plan("n0", &nodes, &installed, &cluster());
    let steady_ms = started.elapsed().as_secs_f64() * 1000.0;
    println!(
        "{count:>7} nodes  plan: first start {first_ms:>9.1} ms ({} adds), steady state {steady_ms:>9.1} ms ({} changes)",
        first.actions.len(),
        steady.actions.len()
    );
}

fn agent_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let agent = profile_dir.join("cnilab-agent");
    agent.exists().then_some(agent)
}

fn run_once(agent: &Path, ns: &Netns, nodes_file: &Path, dir: &Path) -> Result<f64, String> {
    let started = Instant::now();
    let out = Command::new(agent)
        .arg("--netns")
        .arg(ns.path())
        .args([
            "--node-name",
            "n0",
            "--cluster-cidr",
            "10.0.0.0/8",
            "--once",
        ])
        .arg("--nodes-file")
        .arg(nodes_file)
        .arg("--cni-conf-dir")
        .arg(dir.join("net.d"))
        .arg("--cni-bin-dir")
        .arg(dir.join("bin"))
        .env("RUST_LOG", "warn")
        .output()
        .map_err(|e| format!("run {}: {e}", agent.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(seconds)
}

fn agent_once(agent: &Path, count: u32) -> Result<(), String> {
    let ns = Netns::with_label("scale").map_err(|e| e.to_string())?;
    for args in [
        &["link", "add", "up0", "type", "veth", "peer", "name", "up1"][..],
        &["link", "set", "up1", "up"],
        &["addr", "add", "172.16.0.1/12", "dev", "up0"],
        &["link", "set", "up0", "up"],
    ] {
        let status = Command::new("ip")
            .arg("-n")
            .arg(ns.name())
            .args(args)
            .status()
            .map_err(|e| format!("ip: {e}"))?;
        if !status.success() {
            return Err(format!("ip {args:?} failed"));
        }
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let nodes_file = dir.path().join("nodes.json");
    let list: Vec<serde_json::Value> = (0..count)
        .map(|i| {
            serde_json::json!({"name": format!("n{i}"), "internalIP": node_ip(i).to_string(), "podCIDRs": pod_cidr(i).to_string()})
        })
        .collect();
    let text = serde_json::to_vec(&list).map_err(|e| e.to_string())?;
    std::fs::write(&nodes_file, text).map_err(|e| e.to_string())?;
    let first = run_once(agent, &ns, &nodes_file, dir.path())?;
    let second = run_once(agent, &ns, &nodes_file, dir.path())?;
    println!(
        "{count:>7} nodes  agent --once: first pass {first:>7.2} s ({} routes added), second pass {second:>7.2} s",
        count - 1
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let with_agent = args.iter().any(|a| a == "--with-agent");
    let mut counts: Vec<u32> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if counts.is_empty() {
        counts = vec![5_000, 20_000, 100_000];
    }
    for &count in &counts {
        plan_only(count.max(1));
    }
    if !with_agent {
        return;
    }
    let root = nix::unistd::geteuid().is_root();
    match agent_binary() {
        Some(agent) if root => {
            for &count in &counts {
                if let Err(e) = agent_once(&agent, count.max(1)) {
                    eprintln!("{count} nodes: agent --once failed: {e}");
                    std::process::exit(1);
                }
            }
        }
        Some(_) => eprintln!("(not root: the agent --once figures need root)"),
        None => eprintln!("(no cnilab-agent next to this example: build it in the same profile)"),
    }
}
