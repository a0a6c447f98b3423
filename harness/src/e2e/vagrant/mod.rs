//! `cnilab e2e vagrant`: the offline two-VM lab (the Vagrantfile with
//! `CNILAB_VAGRANT_MODE=offline`, lab/vagrant/offline.rb) brought up, checked
//! and torn down.
//!
//! Where things happen: this file holds the options and the plans of `up`
//! (box, namespace, `vagrant up`) and `down`, run by the e2e [`Runner`];
//! [`check`] makes the pods inside the VMs and probes
//! between them; [`node`] is the side that runs inside a VM;
//! with `--capture DIR`, [`replay`] captures both VMs after
//! the check, replays them here and compares the verdicts.
//! Everything of a run (libvirtd and its networks, the VMs, vagrant's files)
//! lives in the network namespace `cnilab-<pid>-vg` (or `cnilab-vg-<name>`)
//! and its run directory, made and removed by lab/vagrant/env.sh; SIGINT and
//! SIGTERM run `down` before exiting, and `cnilab sweep` finds the namespace
//! of a killed run ([`sweep`]).

pub mod check;
pub mod node;
pub mod options;
pub mod replay;

use crate::e2e::plan::{Action, Cmd, Plan};
use crate::e2e::runner::Runner;
use crate::e2e::E2eError;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use options::{path, LONG, SHORT, SUFFIX};
pub use options::{VagrantOptions, VagrantStep, BOX_NAME, RUN_ROOT};

/// `up`: the box (built once, then cached), the namespace with its
/// libvirtd, the box added to the run's own VAGRANT_HOME, both VMs up and
/// provisioned.
pub fn up_plan(opts: &VagrantOptions) -> Plan {
    let mut plan = Plan::default();
    // build-box.sh checks the tools of a build itself (a cached box needs none).
    plan.push(Action::Preflight {
        tools: [
            "vagrant",
            "libvirtd",
            "virtlogd",
            "virsh",
            "qemu-system-x86_64",
            "ip",
            "unshare",
        ]
        .map(String::from)
        .to_vec(),
        sysctls: Vec::new(),
    });
    let link = opts.work_dir().join("cnilab.box");
    plan.push(Action::run(
        Cmd::new("bash").args([opts.script("build-box.sh"), "--link".into(), path(&link)]),
        LONG,
    ));
    plan.push(Action::run(
        Cmd::new("bash").args([opts.script("env.sh"), "up".into(), opts.namespace()]),
        SHORT,
    ));
    plan.push(Action::run(
        opts.vagrant().args([
            "box".to_string(),
            "add".into(),
            "--force".into(),
            "--name".into(),
            BOX_NAME.into(),
            path(&link),
        ]),
        SHORT,
    ));
    // vagrant's own log (what failed inside a VM) is kept: it is the only
    // trace once `down` has removed the run directory. Both VMs at once:
    // under TCG each VM's boot is one vCPU of work, and one after the other
    // leaves a core idle while a VM waits for its lease and ssh.
    plan.push(Action::Capture {
        cmd: opts
            .vagrant()
            .args(["up", "--provider", "libvirt", "--parallel"]),
        file: opts.work_dir().join("vagrant-up.log"),
        timeout: LONG,
    });
    plan
}

/// `down`: env.sh destroys the VMs, kills what is left in the namespace
/// and removes it with the run directory. Safe to repeat.
pub fn down_plan(opts: &VagrantOptions) -> Plan {
    let mut plan = Plan::default();
    plan.push(Action::run(
        Cmd::new("bash").args([opts.script("env.sh"), "down".into(), opts.namespace()]),
        Duration::from_secs(300),
    ));
    plan
}

/// The whole `--dry-run` of a step.
pub fn dry_run(opts: &VagrantOptions, step: VagrantStep) -> String {
    let mut out = String::new();
    if matches!(step, VagrantStep::All | VagrantStep::Up) {
        out.push_str(&up_plan(opts).dry_run());
    }
    if matches!(step, VagrantStep::All | VagrantStep::Check) {
        out.push_str(&check::dry_run(opts));
        if let Some(dir) = &opts.capture {
            out.push_str(&replay::dry_run(opts, dir));
        }
    }
    if step == VagrantStep::Down || (step == VagrantStep::All && !opts.retain) {
        out.push_str(&down_plan(opts).dry_run());
    }
    out
}

/// Set once a signal arrived: the watcher tears down, the main thread must not.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Tears the run down on SIGINT or SIGTERM, then exits 130. Called before
/// any other thread starts, so that only the watcher sees the signals.
fn down_on_interrupt(opts: &VagrantOptions) {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    if set.thread_block().is_err() {
        return;
    }
    let down = down_plan(opts);
    std::thread::spawn(move || {
        let Ok(sig) = set.wait() else { return };
        INTERRUPTED.store(true, Ordering::SeqCst);
        eprintln!("\ncnilab e2e vagrant: {sig:?}: tearing the run down");
        if let Err(e) = Runner::strict().run(&down) {
            eprintln!("cnilab e2e vagrant: down failed: {e}");
        }
        std::process::exit(130);
    });
}

/// `cnilab e2e vagrant [STEP]`: exit 0 iff the check passed (or the step
/// ran), 1 on a failed probe or step.
pub fn command(
    opts: &VagrantOptions,
    step: VagrantStep,
    replay_check: replay::ReplayCheck,
) -> Result<ExitCode, E2eError> {
    opts.validate(step)?;
    if opts.dry_run {
        print!("{}", dry_run(opts, step));
        return Ok(ExitCode::SUCCESS);
    }
    crate::netns::require_root().map_err(|e| E2eError::Invalid(e.to_string()))?;
    let tears_down = step == VagrantStep::Down || (step == VagrantStep::All && !opts.retain);
    if tears_down || step == VagrantStep::Up {
        down_on_interrupt(opts);
    }
    let mut code = ExitCode::SUCCESS;
    let mut failure = None;
    if matches!(step, VagrantStep::All | VagrantStep::Up) {
        eprintln!("== cnilab e2e vagrant up ({})", opts.namespace());
        if let Err(e) = Runner::strict().run(&up_plan(opts)) {
            failure = Some(e);
        }
    }
    if failure.is_none() && matches!(step, VagrantStep::All | VagrantStep::Check) {
        eprintln!("== cnilab e2e vagrant check ({})", opts.namespace());
        match check::run(opts) {
            Ok(report) => {
                if !report.passed() {
                    code = ExitCode::FAILURE;
                }
                if let Some(dir) = &opts.capture {
                    eprintln!(
                        "== cnilab e2e vagrant capture and replay ({})",
                        dir.display()
                    );
                    match replay::run(opts, dir, &report, replay_check) {
                        Ok(true) => {}
                        Ok(false) => code = ExitCode::FAILURE,
                        Err(e) => failure = Some(e),
                    }
                }
            }
            Err(e) => failure = Some(e),
        }
    }
    // The commands died of the signal: the watcher is tearing down and exits.
    while INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_secs(1));
    }
    // A failed `up` leaves nothing behind unless asked to.
    let down = tears_down || (step == VagrantStep::Up && failure.is_some() && !opts.retain);
    if down {
        eprintln!("== cnilab e2e vagrant down ({})", opts.namespace());
        if let Err(e) = Runner::strict().run(&down_plan(opts)) {
            eprintln!("cnilab e2e vagrant: down failed: {e}");
            code = ExitCode::FAILURE;
        }
    } else if step != VagrantStep::Check {
        eprintln!(
            "cnilab e2e vagrant: kept (--retain); remove with `cnilab e2e vagrant down --name {}`",
            opts.name.as_deref().unwrap_or("?")
        );
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(code),
    }
}

/// Processes whose network namespace is the one mounted at `ns_path`
/// (what `ip netns pids` reads).
fn pids_in(ns_path: &Path) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(ns) = std::fs::metadata(ns_path) else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Ok(m) = std::fs::metadata(entry.path().join("ns/net")) {
            if m.dev() == ns.dev() && m.ino() == ns.ino() {
                pids.push(pid);
            }
        }
    }
    pids
}

/// `cnilab sweep`'s part: for every `cnilab-<pid>-vg` namespace whose pid
/// is gone and whose run directory env.sh made ([`run_dir_proves`]: the
/// name alone proves nothing), kills what runs in it (libvirtd, virtlogd,
/// QEMU, dnsmasq: only a run's own processes live there), removes its run
/// directory and the namespace. Returns the namespaces it emptied.
pub fn sweep() -> Vec<String> {
    use nix::sys::signal::{kill, Signal};
    let mut emptied = Vec::new();
    let dir = Path::new(crate::netns::NETNS_DIR);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(crate::netns::PREFIX)
            .and_then(|rest| rest.strip_suffix(SUFFIX))
            .and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        let run = Path::new(RUN_ROOT).join(&name);
        if Path::new(&format!("/proc/{pid}")).exists() || !run_dir_proves(&run) {
            continue;
        }
        for signal in [Signal::SIGTERM, Signal::SIGKILL] {
            for p in pids_in(&entry.path()) {
                let _ = kill(nix::unistd::Pid::from_raw(p), signal);
            }
            for _ in 0..50 {
                if pids_in(&entry.path()).is_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = std::fs::remove_dir_all(&run);
        let _ = crate::netns::remove_matching(|n| n == name);
        emptied.push(name);
    }
    emptied
}

/// Whether `run` is a run directory env.sh made as root: a directory (no
/// symlink) owned by root, in a [`RUN_ROOT`] that is root's and that no one
/// else may write to.
fn run_dir_proves(run: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let root_only = |p: &Path, writable_by_others: bool| {
        std::fs::symlink_metadata(p).is_ok_and(|m| {
            m.is_dir() && m.uid() == 0 && (writable_by_others || m.mode() & 0o022 == 0)
        })
    };
    root_only(Path::new(RUN_ROOT), false) && root_only(run, true)
}
