//! Test-only helpers for the root tests: node namespaces (cnilab-net's
//! throwaway `Netns`, removed on drop, also when a test panics) driven with
//! `ip`, and a child-process guard.

#![allow(dead_code)]

pub use cnilab_net::netns::Netns;
pub use cnilab_net::testing::require_root;
use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// Runs a command (no shell) and returns its output, failing on non-zero exit.
pub fn run(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub fn stdout(program: &str, args: &[&str]) -> String {
    String::from_utf8_lossy(&run(program, args).stdout).into_owned()
}

/// A throwaway namespace standing for a node (or a pod), with `lo` up:
/// cnilab-net's fixture (it fails the test when not root).
pub fn netns() -> Netns {
    cnilab_net::testing::host_netns()
}

/// `ip`-driven helpers on a test namespace.
pub trait NetnsExt {
    /// `ip -n <ns> args...`
    fn ip(&self, args: &[&str]) -> String;
    /// `ip netns exec <ns> program args...`
    fn exec(&self, program: &str, args: &[&str]) -> Output;
    /// A "node uplink": a veth pair inside the namespace whose first end has
    /// `addr4` and `addr6`, so that neighbours in those subnets are on-link.
    fn uplink(&self, addr4: &str, addr6: &str);
    /// Routes with cnilab's protocol, both families, as sorted `dst via gw`.
    fn own_routes(&self) -> Vec<String>;
    /// Every route of the main table, both families.
    fn all_routes(&self) -> Vec<String>;
    fn nft_table(&self) -> Option<String>;
    fn sysctl(&self, key: &str) -> String;
}

impl NetnsExt for Netns {
    fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name()];
        full.extend_from_slice(args);
        stdout("ip", &full)
    }

    fn exec(&self, program: &str, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", self.name(), program];
        full.extend_from_slice(args);
        Command::new("ip")
            .args(&full)
            .output()
            .unwrap_or_else(|e| panic!("cannot run ip netns exec: {e}"))
    }

    fn uplink(&self, addr4: &str, addr6: &str) {
        self.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"]);
        self.ip(&["addr", "add", addr4, "dev", "up0"]);
        self.ip(&["addr", "add", addr6, "dev", "up0", "nodad"]);
        self.ip(&["link", "set", "up0", "up"]);
        self.ip(&["link", "set", "up1", "up"]);
    }

    fn own_routes(&self) -> Vec<String> {
        self.all_routes()
            .into_iter()
            .filter(|r| r.ends_with(" proto 199"))
            .collect()
    }

    fn all_routes(&self) -> Vec<String> {
        let mut all = ip_routes(self, &["route", "show"]);
        all.extend(ip_routes(self, &["-6", "route", "show"]));
        all.sort();
        all
    }

    fn nft_table(&self) -> Option<String> {
        let out = self.exec("nft", &["list", "table", "inet", "cnilab_agent"]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn sysctl(&self, key: &str) -> String {
        let out = self.exec("sysctl", &["-n", key]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// `ip -j <args>` in `ns`, as `dst [via gw] [proto p]` lines.
fn ip_routes(ns: &Netns, args: &[&str]) -> Vec<String> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let text = ns.ip(&full);
    let value: serde_json::Value = serde_json::from_str(&text).expect("ip -j output is JSON");
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let field = |k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            let mut s = field("dst");
            if !field("gateway").is_empty() {
                s.push_str(&format!(" via {}", field("gateway")));
            }
            if !field("protocol").is_empty() {
                s.push_str(&format!(" proto {}", field("protocol")));
            }
            s
        })
        .collect()
}

/// A running agent, killed on drop.
pub struct AgentProcess {
    pub child: Child,
    pub log: PathBuf,
}

impl AgentProcess {
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(Instant::now() < deadline, "agent did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `check` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
