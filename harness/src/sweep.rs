//! `cnilab sweep` for labs (it reads the records `lab` leaves): the run directories of lab processes
//! that are gone (`/run/cnilab/run-<pid>/`, and `/run/cnilab/labs/<name>/`
//! of a `lab up` that died before the lab stood), and the agents those runs
//! started. An agent is stopped only when its pidfile proves it is the
//! process the run started (pid and start time, signalled through a pidfd);
//! nothing else is ever signalled.

use crate::lab::base::{AGENT_PIDFILE, OWNER_PIDFILE};
use crate::lab::cri::daemon::{self, Teardown};
use crate::lab::pidfile::{self, Identity};
use crate::lab::state;
use crate::netns::NetnsError;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where scratch runs (`run-<pid>`) and standing labs (`labs/`) keep their files.
pub const RUN_ROOT: &str = "/run/cnilab";

/// What a sweep removed.
#[derive(Debug, Default)]
pub struct Swept {
    /// Agents stopped: pid and the pidfile that proved them ours.
    pub agents: Vec<(u32, PathBuf)>,
    pub namespaces: Vec<String>,
    pub dirs: Vec<PathBuf>,
    /// `--runtime containerd`: per node cri dir, the sandboxes removed
    /// through its CRI and the processes (containerd, shims, pause) stopped.
    pub containerds: Vec<(PathBuf, Teardown)>,
    /// tracefs instances of traces whose process is gone.
    pub trace_instances: Vec<String>,
    /// nftables tables of traces whose process is gone.
    pub trace_tables: Vec<String>,
}

/// Whether the process that made run dir `dir` is gone: its owner pidfile
/// names a process that no longer runs, or (no pidfile yet) the pid in the
/// directory's name does not exist.
fn owner_gone(dir: &Path, pid_in_name: Option<u32>) -> bool {
    match pidfile::read(&dir.join(OWNER_PIDFILE)) {
        Some(owner) => !owner.alive(),
        None => pid_in_name.is_some_and(|pid| Identity::of(pid).is_none()),
    }
}

/// Stops the agents whose pidfiles sit in the node directories of `dir`;
/// waits (up to 5 s) until they are gone.
fn stop_agents_of(dir: &Path, swept: &mut Swept) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut killed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path().join(AGENT_PIDFILE);
        let Some(id) = pidfile::read(&path) else {
            continue;
        };
        if let Ok(true) = id.kill_if_ours(dir) {
            swept.agents.push((id.pid, path));
            killed.push(id);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while killed.iter().any(Identity::alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Names of the node directories in a lab's run dir.
fn node_dirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn remove_dir(dir: &Path, swept: &mut Swept) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {
            swept.dirs.push(dir.to_path_buf());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(std::io::Error::new(
            e.kind(),
            format!("remove {}: {e}", dir.display()),
        )),
    }
}

/// Whether the lab run dir `dir` (`labs/<name>`) is what a `lab up` that
/// died before its lab stood left: no state, and its owner record names a
/// process that is gone, or there is none (a run killed between making the
/// directory and writing the record; `labs/` is root's alone).
pub fn unfinished(dir: &Path) -> bool {
    !dir.join("state.json").exists()
        && pidfile::read(&dir.join(OWNER_PIDFILE)).is_none_or(|o| !o.alive())
}

/// Stops what the unfinished lab `name` in `dir` started and removes the
/// namespaces its ledger proves its own (the directory itself is left to
/// the caller).
pub fn remove_unfinished_lab(
    dir: &Path,
    name: &str,
    swept: &mut Swept,
) -> Result<(), Box<dyn std::error::Error>> {
    stop_agents_of(dir, swept);
    swept.containerds.extend(daemon::teardown_node_dirs(dir));
    let nodes = node_dirs(dir);
    swept.namespaces.extend(
        crate::netns::remove_matching(|ns| state::owns(dir, name, &nodes, ns))
            .map_err(|e: NetnsError| e.to_string())?,
    );
    Ok(())
}

/// Sweeps the lab leftovers under `root` (normally [`RUN_ROOT`]): the
/// agents of dead runs first, then the namespaces of dead processes
/// (`prefix`, normally `cnilab-`; each proved by its owner record, see
/// `cnilab_net::netns::sweep`), then the dead runs' directories.
pub fn sweep(root: &Path, prefix: &str) -> Result<Swept, Box<dyn std::error::Error>> {
    let mut swept = Swept::default();
    let mut dead_dirs = Vec::new();
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("run-") else {
            continue;
        };
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && owner_gone(&path, pid.parse().ok()) {
            stop_agents_of(&path, &mut swept);
            swept.containerds.extend(daemon::teardown_node_dirs(&path));
            dead_dirs.push(path);
        }
    }
    // A `lab up` that died before its lab stood: no state, owner gone.
    let labs = root.join("labs");
    for entry in std::fs::read_dir(&labs).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && state::check_name(&name).is_ok() && unfinished(&path) {
            remove_unfinished_lab(&path, &name, &mut swept)?;
            dead_dirs.push(path);
        }
    }
    swept.namespaces.extend(crate::netns::sweep(prefix)?);
    swept.trace_instances = crate::trace::drops::sweep(|pid| Identity::of(pid).is_some());
    swept.trace_tables = crate::trace::sweep_tables(|pid| Identity::of(pid).is_some());
    for dir in dead_dirs {
        remove_dir(&dir, &mut swept)?;
    }
    swept.namespaces.sort();
    swept.dirs.sort();
    Ok(swept)
}
