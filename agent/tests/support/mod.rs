//! Test-only helpers for the root tests: a throwaway network namespace and
//! a child-process guard, both cleaned up on drop (also when a test panics).
//! (A `Netns` type also lives in harness/src/netns.rs; the agent itself
//! does not depend on the harness, so this small copy is kept test-only.
//! The harness is only a dev-dependency, for its check that the machine's
//! own network is untouched.)

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Fails the test with a clear message when not root: these tests need
/// CAP_NET_ADMIN/CAP_SYS_ADMIN to create namespaces. They never pass silently.
pub fn require_root() {
    if !nix::unistd::geteuid().is_root() {
        panic!(
            "this test needs root (it creates network namespaces with `ip netns add`); \
             run `sudo -E cargo test -p cnilab-agent`, or skip root tests with `--skip root_`"
        );
    }
}

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

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// `ip netns add cnilab-agenttest-<pid>-<n>`, deleted on drop.
pub struct TestNetns {
    pub name: String,
}

impl TestNetns {
    pub fn new() -> TestNetns {
        let name = format!(
            "cnilab-agenttest-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        run("ip", &["netns", "add", &name]);
        let ns = TestNetns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// `ip -n <ns> args...`
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        stdout("ip", &full)
    }

    /// `ip netns exec <ns> program args...`
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", self.name.as_str(), program];
        full.extend_from_slice(args);
        Command::new("ip")
            .args(&full)
            .output()
            .unwrap_or_else(|e| panic!("cannot run ip netns exec: {e}"))
    }

    /// A "node uplink": a veth pair inside the namespace whose first end has
    /// `addr4` and `addr6`, so that neighbours in those subnets are on-link.
    pub fn uplink(&self, addr4: &str, addr6: &str) {
        self.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"]);
        self.ip(&["addr", "add", addr4, "dev", "up0"]);
        self.ip(&["addr", "add", addr6, "dev", "up0", "nodad"]);
        self.ip(&["link", "set", "up0", "up"]);
        self.ip(&["link", "set", "up1", "up"]);
    }

    /// Routes with cnilab's protocol, both families, as sorted `dst via gw`.
    pub fn own_routes(&self) -> Vec<String> {
        self.all_routes()
            .into_iter()
            .filter(|r| r.ends_with(" proto 199"))
            .collect()
    }

    /// Every route of the main table, both families.
    pub fn all_routes(&self) -> Vec<String> {
        let mut routes = self.routes(&["route", "show"]);
        routes.extend(self.routes(&["-6", "route", "show"]));
        routes.sort();
        routes
    }

    fn routes(&self, args: &[&str]) -> Vec<String> {
        let mut full = vec!["-j"];
        full.extend_from_slice(args);
        let text = self.ip(&full);
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

    pub fn nft_table(&self) -> Option<String> {
        let out = self.exec("nft", &["list", "table", "inet", "cnilab_agent"]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn sysctl(&self, key: &str) -> String {
        let out = self.exec("sysctl", &["-n", key]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
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
