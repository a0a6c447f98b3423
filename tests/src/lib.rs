//! Helpers for the end-to-end tests: find the built binaries, require root,
//! and run a CNI plugin the way a runtime does (environment plus stdin),
//! inside a throwaway "host" namespace.

use cnilab_harness::netns::Netns;
use cnilab_harness::runtime::Collected;
pub use cnilab_harness::testing::{host_untouched, require_root};
use cnilab_net::spec::{CniResult, ErrorBody};
use serde_json::Value;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A binary built by this workspace (`target/<profile>/<name>`), next to the
/// test executable's `deps` directory. `cargo test --workspace` builds them.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it first with `cargo build --workspace` (cargo test --workspace builds it too)",
        path.display()
    );
    path
}

/// One plugin invocation's environment.
pub struct Call<'a> {
    pub command: &'a str,
    pub container_id: &'a str,
    pub netns: Option<&'a Path>,
    pub ifname: &'a str,
}

/// The command that runs `plugin` inside `host` with the `CNI_*`
/// environment of `call` (more variables can be set on it).
pub fn plugin_command(host: &Netns, plugin: &Path, call: &Call<'_>) -> Command {
    cni_env(host.command(plugin), plugin, call)
}

/// [`plugin_command`] run under `strace -f`, which writes the netlink
/// traffic (`sendto`, `recvfrom`) of the call to `trace`. Panics with what
/// to install when strace is missing.
pub fn traced_plugin_command(
    host: &Netns,
    plugin: &Path,
    call: &Call<'_>,
    trace: &Path,
) -> Command {
    traced_plugin_command_of(host, plugin, call, trace, "sendto,recvfrom")
}

/// [`traced_plugin_command`] tracing the system calls `syscalls` (strace's
/// `trace=` list, e.g. `clone3,rename,sendto`).
pub fn traced_plugin_command_of(
    host: &Netns,
    plugin: &Path,
    call: &Call<'_>,
    trace: &Path,
    syscalls: &str,
) -> Command {
    let strace = ["/usr/bin/strace", "/bin/strace"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("this test needs strace (bash lab/install-deps.sh installs it)");
    let mut cmd = host.command(strace);
    cmd.arg("-f")
        .args(["-s", "256", "-e"])
        .arg(format!("trace={syscalls}"))
        .arg("-o")
        .arg(trace)
        .arg(plugin);
    cni_env(cmd, plugin, call)
}

fn cni_env(mut cmd: Command, plugin: &Path, call: &Call<'_>) -> Command {
    cmd.env_clear()
        .env("CNI_COMMAND", call.command)
        .env("CNI_CONTAINERID", call.container_id)
        .env("CNI_IFNAME", call.ifname)
        .env("CNI_ARGS", "IgnoreUnknown=1")
        .env("CNI_PATH", plugin.parent().unwrap_or(Path::new("/")))
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    if let Some(ns) = call.netns {
        cmd.env("CNI_NETNS", ns);
    }
    cmd
}

/// Runs `plugin` inside `host` with the `CNI_*` environment and `config` on
/// stdin, through assert_cmd, as a runtime would.
pub fn invoke(host: &Netns, plugin: &Path, call: &Call<'_>, config: &Value) -> Output {
    assert_cmd::Command::from_std(plugin_command(host, plugin, call))
        .write_stdin(config.to_string())
        .output()
        .expect("plugin runs")
}

/// Runs `cmd` with `config` on stdin for at most `limit`: a plugin that
/// hangs is SIGKILLed (with its process group) and `killed` says so. The
/// address space is capped at 1 GiB, so an unbounded read fails instead of
/// eating the machine's memory.
pub fn run_limited(mut cmd: Command, config: &Value, limit: Duration) -> Collected {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let scope = cnilab_harness::runtime::scope::CallScope::new();
    scope.attach(&mut cmd);
    // SAFETY: setrlimit(2) is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let cap = nix::libc::rlimit {
                rlim_cur: 1 << 30,
                rlim_max: 1 << 30,
            };
            if nix::libc::setrlimit(nix::libc::RLIMIT_AS, &cap) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let started = Instant::now();
    let child = cmd.spawn().expect("plugin starts");
    let body = config.to_string();
    cnilab_harness::runtime::collect_child(child.into(), started, limit, &scope, move |mut pipe| {
        let _ = pipe.write_all(body.as_bytes());
    })
    .expect("collect the plugin's output")
}

/// Parses a successful ADD's stdout, with the plugin's stderr in the panic message.
pub fn result_of(out: &Output) -> CniResult {
    assert!(
        out.status.success(),
        "plugin failed: stdout={} stderr={}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "result is not a CNI result ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Parses a failed invocation's error body.
pub fn error_of(out: &Output) -> ErrorBody {
    assert!(
        !out.status.success(),
        "plugin should have failed: stdout={}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "error is not a CNI error body ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Files in an IPAM store directory that are address records.
pub fn store_records(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Starts `cnilab-lock-holder` (a helper binary of this crate, not a test):
/// it takes the IPAM store lock of `store` with the plugin's own code and
/// holds it until it is killed. Returns once the lock is held.
pub fn spawn_lock_holder(store: &Path) -> std::process::Child {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(workspace_bin("cnilab-lock-holder"))
        .arg(store)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("holder starts");
    let stdout = child.stdout.take().expect("holder stdout");
    let mut lines = BufReader::new(stdout).lines();
    let locked = lines.any(|l| l.map(|l| l == "store-locked").unwrap_or(false));
    assert!(locked, "the holder never took the lock");
    // Keep draining its output so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    child
}

/// `config` with `prevResult` set, as a runtime sends it to CHECK and DEL.
pub fn with_prev(config: &Value, prev: &CniResult) -> Value {
    let mut c = config.clone();
    c["prevResult"] = serde_json::to_value(prev).expect("result serializes");
    c
}

/// Runs `cnilab ARGS` from the repository root (root only).
pub fn cnilab(args: &[&str]) -> Output {
    require_root();
    Command::new(workspace_bin("cnilab"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("cnilab runs")
}

/// A command's stdout and stderr, for an assertion's message.
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Where two texts differ, line by line (`- ` lines only in `a`, `+ `
/// lines only in `b`, at most `max`), or `None` when they are equal.
pub fn line_diff(a: &str, b: &str, max: usize) -> Option<String> {
    if a == b {
        return None;
    }
    let (al, bl): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let diff: Vec<String> = al
        .iter()
        .filter(|l| !bl.contains(l))
        .map(|l| format!("- {l}"))
        .chain(
            bl.iter()
                .filter(|l| !al.contains(l))
                .map(|l| format!("+ {l}")),
        )
        .take(max)
        .collect();
    Some(diff.join("\n"))
}

/// The namespaces of standing lab `name` that exist (`cnilab-lab-<name>-…`).
pub fn lab_namespaces(name: &str) -> Vec<String> {
    let prefix = format!("cnilab-lab-{name}-");
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (at most 5 s) until no neighbour entry in `namespaces` is still
/// resolving (INCOMPLETE). A packet sent to an INCOMPLETE entry waits for
/// its next ARP/NDP retry, up to a second away, while one sent to a FAILED
/// entry starts a new resolution at once: after a fix, a probe must not
/// depend on where in that second it was sent. An entry stays INCOMPLETE
/// for at most its probes' worth of retries (3 s by default), so the wait
/// ends whatever the timing.
pub fn settle_neighbours(namespaces: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resolving = namespaces.iter().any(|ns| {
            std::process::Command::new("ip")
                .args(["-n", ns, "neigh", "show", "nud", "incomplete"])
                .output()
                .is_ok_and(|o| !o.stdout.trim_ascii().is_empty())
        });
        if !resolving || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A standing lab, by default of 2 nodes with a pod each (`cnilab lab up`, plus
/// `extra` flags), named `<label><pid>`, taken down when dropped (also
/// after a failed assert). `StandingLab(name)` guards a lab made otherwise.
pub struct StandingLab(pub String);

impl StandingLab {
    pub fn up(label: &str, extra: &[&str]) -> StandingLab {
        StandingLab::sized(label, 2, 1, extra)
    }

    /// [`StandingLab::up`] with `nodes` nodes of `pods` pods each.
    pub fn sized(label: &str, nodes: usize, pods: usize, extra: &[&str]) -> StandingLab {
        let name = format!("{label}{}", std::process::id());
        let lab = StandingLab(name.clone());
        let (nodes, pods) = (nodes.to_string(), pods.to_string());
        let mut args = vec![
            "lab",
            "up",
            "--name",
            &name,
            "--nodes",
            &nodes,
            "--pods-per-node",
            &pods,
        ];
        args.extend_from_slice(extra);
        let up = cnilab(&args);
        assert!(up.status.success(), "{}", output_text(&up));
        lab
    }
}

impl Drop for StandingLab {
    fn drop(&mut self) {
        let _ = cnilab(&["lab", "down", "--name", &self.0]);
    }
}

/// Runs `program ARGS` inside `ns` and fails the test if it fails (how
/// tests make a real node's objects with `ip`, `bridge`, `tc`, `nft`).
pub fn run_in(ns: &Netns, program: &str, args: &[&str]) {
    let out = ns.command(program).args(args).output().expect("runs");
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
