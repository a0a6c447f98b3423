//! Ctrl-C (SIGINT, SIGTERM) for every subcommand that makes namespaces: a
//! watcher thread that kills the processes a run started, removes this
//! process's namespaces (and those a filter names), and exits 130; and
//! [`hold_if_interrupted`], which keeps `main` from exiting first.
//!
//! What only a lab knows (its sandboxes, the host's neighbour tables) comes
//! in as [`Teardown`] hooks, so this floor imports nothing above it.

use nix::sys::signal::{SigSet, Signal};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Set when the Ctrl-C watcher starts removing what the run made.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Once the Ctrl-C watcher has started, never returns: the watcher exits
/// the process (130) when the lab is gone (its sandboxes removed through
/// the CRI take a while, and the command may fail meanwhile).
pub fn hold_if_interrupted() {
    while INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::park();
    }
}

/// Processes (agents) the run started, killed on Ctrl-C.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

pub fn register_child(pid: u32) {
    if let Ok(mut c) = CHILDREN.lock() {
        c.push(pid);
    }
}

/// Says which namespaces, by name, belong to what is being torn down.
pub type NamespaceFilter = Box<dyn Fn(&str) -> bool + Send>;

/// What the watcher does besides killing the registered children and
/// removing namespaces, in order.
pub struct Teardown {
    /// Before the children are killed (sandboxes go through the CRI while
    /// their nodes still stand).
    pub first: fn(),
    /// After the children are killed, before the namespaces go (the host's
    /// own settings restored).
    pub then: fn(),
    /// Namespaces to remove besides this process's own (a standing lab's,
    /// which do not carry the pid).
    pub extra: Option<NamespaceFilter>,
    /// The run's scratch directory, removed last.
    pub run_dir: PathBuf,
}

/// On SIGINT or SIGTERM: `first`, kill the children, stop making
/// namespaces, `then`, remove every namespace of this process (and the
/// `extra` ones), remove `run_dir`, and exit 130. Must be called before
/// other threads start, so that they inherit the blocked signal mask and
/// only the watcher sees it.
pub fn cleanup_on_interrupt(teardown: Teardown) {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    if set.thread_block().is_err() {
        return;
    }
    std::thread::spawn(move || {
        let Ok(sig) = set.wait() else { return };
        INTERRUPTED.store(true, Ordering::SeqCst);
        eprintln!("\ncnilab: {sig:?}: removing the lab's namespaces");
        (teardown.first)();
        if let Ok(children) = CHILDREN.lock() {
            for pid in children.iter() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid as i32),
                    Signal::SIGKILL,
                );
            }
        }
        crate::netns::stop_creating();
        (teardown.then)();
        let own = format!("{}{}-", crate::netns::PREFIX, std::process::id());
        let _ = crate::netns::remove_prefixed(&own);
        if let Some(owned) = &teardown.extra {
            let _ = crate::netns::remove_matching(owned);
        }
        remove_run_dir(&teardown.run_dir);
        std::process::exit(130);
    });
}

/// Removes the run directory. A plugin the runtime (containerd) started
/// outlives its runtime and may still write its IPAM record here: a write
/// during the removal makes it fail halfway, one just after makes the
/// directory again. So it is removed until it has stayed away for 200 ms,
/// for at most 10 s (a plugin's ADD ends long before).
fn remove_run_dir(dir: &std::path::Path) {
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut gone_since: Option<Instant> = None;
    while Instant::now() < deadline {
        if dir.exists() {
            gone_since = None;
            let _ = std::fs::remove_dir_all(dir);
        } else {
            let since = *gone_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_millis(200) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if dir.exists() {
        eprintln!("cnilab: could not remove {}", dir.display());
    }
}
