//! One node's containerd: started inside the node's network namespace and a
//! private mount namespace of its own (its snapshot and netns mounts never
//! reach the machine's mount table, and vanish with its last process), with
//! a pidfile (pid + start time) written by the child itself before exec.
//! Stopping goes through the CRI first (every sandbox stopped and removed:
//! CNI DEL), then containerd, then any shim still serving its socket.

use crate::cri::Cri;
use crate::lab::base::LabError;
use crate::lab::pidfile::{self, Identity};
use crate::netns::Netns;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// In a node's cri dir: containerd's pid and start time.
pub const PIDFILE: &str = "containerd.pid";
/// The CRI socket in a node's cri dir (short: unix socket paths are limited).
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("sock")
}

fn setup(msg: impl Into<String>) -> LabError {
    LabError::Setup(msg.into())
}

/// The cri dirs of the containerds this process starts and has not stopped
/// yet, for the Ctrl-C watcher (registered before the spawn: the pidfile,
/// written by the child itself, is read when it is needed).
static RUNNING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn register(dir: &Path) {
    if let Ok(mut r) = RUNNING.lock() {
        r.push(dir.to_path_buf());
    }
}

fn unregister(dir: &Path) {
    if let Ok(mut r) = RUNNING.lock() {
        r.retain(|d| d != dir);
    }
}

/// On Ctrl-C: every containerd this process started loses its sandboxes
/// (through the CRI), then stops. Called by the lab's interrupt watcher
/// before the namespaces go.
pub fn stop_all_started() {
    let running: Vec<PathBuf> = RUNNING
        .lock()
        .map(|mut r| std::mem::take(&mut *r))
        .unwrap_or_default();
    std::thread::scope(|s| {
        for dir in &running {
            s.spawn(move || teardown(dir, pidfile::read(&dir.join(PIDFILE))));
        }
    });
}

/// A node's containerd.
pub struct Containerd {
    pub dir: PathBuf,
    pub cri: Cri,
    /// The process, when this process started it (else found by pidfile).
    child: Option<Child>,
    /// Set once stopped or let go: dropping does nothing more.
    done: bool,
}

/// The last lines of containerd's log, for errors.
fn log_tail(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(6).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

impl Containerd {
    /// Starts containerd for the node in `node_ns`, with its files in `dir`
    /// (config from [`super::config_toml`]), waits until its CRI is ready
    /// and imports the sandbox image from `image_tar`. A standing lab's
    /// containerd survives the terminal's Ctrl-C (own process group).
    pub fn start(
        node_ns: &Netns,
        dir: &Path,
        config: &str,
        image_tar: &Path,
    ) -> Result<Containerd, LabError> {
        std::fs::create_dir_all(dir).map_err(|e| setup(format!("{}: {e}", dir.display())))?;
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config)
            .map_err(|e| setup(format!("{}: {e}", config_path.display())))?;
        let log_path = dir.join("containerd.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| setup(format!("{}: {e}", log_path.display())))?;
        let log2 = log.try_clone().map_err(|e| setup(e.to_string()))?;
        let pidfile_path = dir.join(PIDFILE);
        let pidfile = pidfile::prepare(&pidfile_path)
            .map_err(|e| setup(format!("{}: {e}", pidfile_path.display())))?;
        let pidfile_fd = pidfile.as_raw_fd();
        let netns = node_ns
            .file()
            .try_clone()
            .map_err(|e| setup(e.to_string()))?;
        let netns_fd = netns.as_raw_fd();
        let mut command = Command::new("containerd");
        command
            .arg("--config")
            .arg(&config_path)
            .env(pidfile::RUN_DIR_ENV, dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        // Its own process group: Ctrl-C in the terminal reaches only cnilab,
        // which then removes the sandboxes through the CRI before stopping it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        // SAFETY: between fork and exec only async-signal-safe calls:
        // open/read/write/close (write_own_identity), sigprocmask,
        // unshare(2), mount(2) and setns(2) on descriptors opened before the
        // fork; nothing is allocated.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(move || {
                pidfile::write_own_identity(pidfile_fd)?;
                let mut set = nix::sys::signal::SigSet::empty();
                set.add(nix::sys::signal::Signal::SIGINT);
                set.add(nix::sys::signal::Signal::SIGTERM);
                set.thread_unblock().map_err(std::io::Error::from)?;
                // A private mount namespace whose mounts never propagate back
                // (what `unshare --mount --propagation slave` does). /sys stays
                // the machine's: containerd finds its cgroup mount there.
                if nix::libc::unshare(nix::libc::CLONE_NEWNS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let flags = nix::libc::MS_REC | nix::libc::MS_SLAVE;
                if nix::libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    flags,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if nix::libc::setns(netns_fd, nix::libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        register(dir);
        let child = command.spawn().map_err(|e| {
            unregister(dir);
            setup(format!("start containerd: {e}"))
        })?;
        drop(pidfile);
        drop(netns);
        let cri = Cri::new(&socket_path(dir)).map_err(setup)?;
        let mut me = Containerd {
            dir: dir.to_path_buf(),
            cri,
            child: Some(child),
            done: false,
        };
        me.wait_ready()?;
        me.import(image_tar)?;
        Ok(me)
    }

    /// A standing lab's containerd, found again by its cri dir.
    pub fn adopt(dir: &Path) -> Result<Containerd, LabError> {
        let alive = pidfile::read(&dir.join(PIDFILE)).is_some_and(|id| id.alive());
        if !alive {
            return Err(setup(format!(
                "the lab's containerd is not running (pidfile {}); `cnilab lab down` removes what is left",
                dir.join(PIDFILE).display()
            )));
        }
        Ok(Containerd {
            dir: dir.to_path_buf(),
            cri: Cri::new(&socket_path(dir)).map_err(setup)?,
            child: None,
            done: false,
        })
    }

    fn exited(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        Some(format!(
            "containerd exited ({status}); its log {} ends with:\n{}",
            self.dir.join("containerd.log").display(),
            log_tail(&self.dir)
        ))
    }

    /// Waits (up to 20 s) until the CRI answers and RuntimeReady holds.
    fn wait_ready(&mut self) -> Result<(), LabError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let sock = socket_path(&self.dir);
        loop {
            if let Some(e) = self.exited() {
                return Err(setup(e));
            }
            let last = if sock.exists() {
                match self.cri.conditions() {
                    Ok(c) if c.iter().any(|(t, ok, _)| t == "RuntimeReady" && *ok) => return Ok(()),
                    Ok(c) => format!("{c:?}"),
                    Err(e) => e,
                }
            } else {
                format!("no socket {}", sock.display())
            };
            if Instant::now() >= deadline {
                return Err(setup(format!(
                    "containerd in {} not ready within 20 s: {last}; log:\n{}",
                    self.dir.display(),
                    log_tail(&self.dir)
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the CRI reports NetworkReady (a conflist in its conf
    /// dir: in agent routing, written by the agent).
    pub fn wait_network_ready(&mut self, limit: Duration) -> Result<(), LabError> {
        let deadline = Instant::now() + limit;
        loop {
            let c = self.cri.conditions().map_err(setup)?;
            if c.iter().any(|(t, ok, _)| t == "NetworkReady" && *ok) {
                return Ok(());
            }
            if let Some(e) = self.exited() {
                return Err(setup(e));
            }
            if Instant::now() >= deadline {
                let why: Vec<String> = c
                    .iter()
                    .filter(|(_, ok, _)| !ok)
                    .map(|(t, _, r)| format!("{t}: {r}"))
                    .collect();
                return Err(setup(format!(
                    "containerd in {}: the CNI network is not ready within {limit:?}: {}",
                    self.dir.display(),
                    why.join("; ")
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `ctr images import` of the sandbox image into the CRI's namespace.
    fn import(&self, image_tar: &Path) -> Result<(), LabError> {
        let mut ctr = Command::new("ctr");
        // ctr waits for a containerd that died: it dies with the lab (and
        // teardown kills any ctr still using the socket).
        let parent = std::process::id() as nix::libc::pid_t;
        // SAFETY: prctl(2) and getppid(2) only, async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            ctr.pre_exec(move || {
                if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if nix::libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
                }
                Ok(())
            });
        }
        let out = ctr
            .arg("--timeout")
            .arg("60s")
            .arg("--address")
            .arg(socket_path(&self.dir))
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(image_tar)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| setup(format!("run ctr: {e}")))?;
        if !out.status.success() {
            return Err(setup(format!(
                "ctr images import {}: {}",
                image_tar.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Makes pod `name` through the CRI; returns its sandbox id and the
    /// pause pid. After a failed ADD containerd itself calls DEL and
    /// removes the sandbox.
    pub fn run_pod(&self, name: &str) -> Result<(String, u32), String> {
        let logs = self.dir.join("pods").join(name);
        let id = self.cri.run_pod(name, name, &logs)?;
        match self.cri.sandbox_pid(&id) {
            Ok(pid) => Ok((id, pid)),
            Err(e) => {
                let _ = self.cri.remove_pod(&id);
                Err(e)
            }
        }
    }

    /// Removes every sandbox, then stops containerd and its shims.
    pub fn stop(mut self) {
        self.done = true;
        unregister(&self.dir);
        teardown(&self.dir, pidfile::read(&self.dir.join(PIDFILE)));
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Leaves containerd running (a standing lab).
    pub fn release(mut self) {
        self.done = true;
        unregister(&self.dir);
    }
}

impl Drop for Containerd {
    /// While unwinding from a panic: clean up like `stop`.
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            unregister(&self.dir);
            teardown(&self.dir, pidfile::read(&self.dir.join(PIDFILE)));
            if let Some(mut c) = self.child.take() {
                let _ = c.wait();
            }
        }
    }
}

/// What stopping one containerd did.
#[derive(Debug, Default, Clone)]
pub struct Teardown {
    /// Sandboxes removed through the CRI.
    pub sandboxes: usize,
    /// Processes killed: containerd (when proved by its pidfile), shims
    /// serving its socket and their children.
    pub killed: Vec<u32>,
}

/// Stops the containerd whose files are in `dir`: through its CRI every
/// sandbox is stopped and removed (CNI DEL), then containerd is killed (only
/// if `id` still names it), then every shim whose `-address` is this
/// socket, and the shim's children (pause processes).
pub fn teardown(dir: &Path, id: Option<Identity>) -> Teardown {
    let mut done = Teardown::default();
    let alive = id.is_some_and(|i| i.alive());
    if alive {
        if let Ok(cri) = Cri::new(&socket_path(dir)) {
            let sandboxes = cri.sandboxes().unwrap_or_default();
            std::thread::scope(|s| {
                let jobs: Vec<_> = sandboxes
                    .iter()
                    .map(|sb| {
                        let cri = &cri;
                        s.spawn(move || cri.remove_pod(&sb.id).is_ok())
                    })
                    .collect();
                done.sandboxes = jobs
                    .into_iter()
                    .filter_map(|j| j.join().ok())
                    .filter(|removed| *removed)
                    .count();
            });
        }
    }
    if let Some(id) = id {
        // containerd is its shims' subreaper: they, their containers and
        // any plugin it runs are under it, and go with it.
        if let Ok(true) = id.stop_if_ours(dir) {
            done.killed.extend(kill_tree(id));
        }
    }
    done.killed.extend(kill_shims(&socket_path(dir)));
    if !id.is_some_and(|i| i.alive()) {
        forget_cached_results(dir, Path::new(CNI_CACHE));
    }
    done
}

/// libcni's cache of ADD results, where containerd's CNI calls keep them
/// (its default): one file a network, sandbox and interface,
/// `<network>-<sandbox id>-<ifname>`, which the sandbox's CNI DEL removes.
const CNI_CACHE: &str = "/var/lib/cni/results";

/// The ids of the sandboxes the containerd of `dir` made: a directory each
/// under its CRI plugin's root and state.
fn sandbox_ids(dir: &Path) -> std::collections::BTreeSet<String> {
    ["root", "state"]
        .iter()
        .map(|d| dir.join(d).join("io.containerd.grpc.v1.cri/sandboxes"))
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect()
}

/// Removes from `cache` the results of the sandboxes the (gone) containerd
/// of `dir` made, which no CNI DEL will remove now: left when containerd
/// went before its sandboxes did (a sandbox still being made when the run
/// was interrupted). Only names that carry one of those ids are touched.
/// Returns how many went.
fn forget_cached_results(dir: &Path, cache: &Path) -> usize {
    let ids = sandbox_ids(dir);
    if ids.is_empty() {
        return 0;
    }
    let ours = |name: &str| ids.iter().any(|id| name.contains(&format!("-{id}-")));
    std::fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(ours))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Kills `root`, already stopped, and every process under it (each stopped
/// before its children are listed: see [`stop_below`]), children first;
/// waits until they are gone. Returns the pids killed.
fn kill_tree(root: Identity) -> Vec<u32> {
    let mut tree = vec![root];
    stop_below(&root, &mut tree);
    let mut killed = Vec::new();
    let mut ids = Vec::new();
    for p in tree.into_iter().rev() {
        if let Ok(true) = p.kill_if_same() {
            killed.push(p.pid);
            ids.push(p);
        }
    }
    wait_gone(&ids);
    killed
}

/// Every process under `parent` (stopped), each stopped (SIGSTOP) before
/// its own children are listed: a stopped process forks no more, so what
/// is listed is the whole tree, whenever this runs. Parents first.
fn stop_below(parent: &Identity, tree: &mut Vec<Identity>) {
    for kid in children_of(parent.pid).into_iter().filter_map(Identity::of) {
        if let Ok(true) = kid.stop_if_same() {
            tree.push(kid);
            stop_below(&kid, tree);
        }
    }
}

fn wait_gone(ids: &[Identity]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while ids.iter().any(Identity::alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The pids of containerd shims serving `socket` (their command line has
/// `-address <socket>`): each was started by that containerd only; and of
/// `ctr` clients of it (`--address <socket>`, the lab's image import).
pub fn shims_of(socket: &Path) -> Vec<u32> {
    let want = socket.as_os_str().as_encoded_bytes();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let program = args
            .first()
            .map(|a| a.rsplit(|&b| b == b'/').next().unwrap_or(a))
            .unwrap_or_default();
        let is_shim = program.starts_with(b"containerd-shim") || program == b"ctr";
        let serves = args
            .windows(2)
            .any(|w| (w[0] == b"-address" || w[0] == b"--address") && w[1] == want);
        if is_shim && serves {
            pids.push(pid);
        }
    }
    pids
}

/// The children of process `pid` (all its threads').
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut kids = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        kids.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    kids
}

/// Kills the shims serving `socket` and every process under them (their
/// containers' init processes, and for a container being created, runc
/// and its `runc init`, which outlives a killed runc); returns the pids
/// killed.
pub fn kill_shims(socket: &Path) -> Vec<u32> {
    let mut killed = Vec::new();
    for shim in shims_of(socket) {
        let Some(shim_id) = Identity::of(shim) else {
            continue;
        };
        if let Ok(true) = shim_id.stop_if_same() {
            killed.extend(kill_tree(shim_id));
        }
    }
    killed
}

/// Tears down the containerd of every node directory in a lab's run dir
/// (`<run dir>/<node>/cri/`, or one level deeper for a scenario's lab):
/// what a dead run, or a standing lab whose state is gone, left running.
/// Returns (cri dir, what was done) for each that had anything to stop.
pub fn teardown_node_dirs(run_dir: &Path) -> Vec<(PathBuf, Teardown)> {
    let mut out = Vec::new();
    let mut dirs = vec![(run_dir.to_path_buf(), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let cri = super::node_cri_dir(&entry.path());
            if cri.join(PIDFILE).is_file() {
                let t = teardown(&cri, pidfile::read(&cri.join(PIDFILE)));
                if t.sandboxes > 0 || !t.killed.is_empty() {
                    out.push((cri, t));
                }
            } else if depth == 0 {
                dirs.push((entry.path(), depth + 1));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the cache entries named by the sandbox ids of this containerd
    /// go: another containerd's (a real node's) stay.
    #[test]
    fn only_the_cached_results_of_its_own_sandboxes_are_forgotten() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (dir, cache) = (tmp.path().join("cri"), tmp.path().join("results"));
        let ours = "a".repeat(64);
        let theirs = "b".repeat(64);
        for d in ["root", "state"] {
            let sandbox = dir
                .join(d)
                .join("io.containerd.grpc.v1.cri/sandboxes")
                .join(&ours);
            std::fs::create_dir_all(sandbox).expect("sandbox dir");
        }
        std::fs::create_dir_all(&cache).expect("cache");
        let names = [
            format!("cnilab-{ours}-eth0"),
            format!("cni-loopback-{ours}-lo"),
            format!("cnilab-{theirs}-eth0"),
            format!("k8s-pod-network-{theirs}-eth0"),
        ];
        for n in &names {
            std::fs::write(cache.join(n), "{}").expect("entry");
        }
        assert_eq!(forget_cached_results(&dir, &cache), 2);
        let mut left: Vec<String> = std::fs::read_dir(&cache)
            .expect("cache")
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        left.sort();
        assert_eq!(left, [names[2].clone(), names[3].clone()]);
        // No sandbox of its own: nothing is touched.
        assert_eq!(forget_cached_results(&tmp.path().join("none"), &cache), 0);
    }
}
