//! `cnilab sweep` (root, through the real CLI) removes and signals only
//! what a record cnilab wrote proves its own: a namespace named like
//! cnilab's but without its record survives, and its processes are not
//! signalled; a replay (`lab up --capture`) killed at any moment leaves
//! records that `sweep` and `lab down` go by, so its name can be used again;
//! one SIGTERMed while its `nft` hangs leaves neither the `nft` nor its run
//! directory.

use cnilab_tests::{
    cnilab, host_untouched, lab_namespaces as namespaces_of, output_text, require_root,
    workspace_bin, StandingLab,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A namespace made by hand with `ip netns add`, deleted on drop (with
/// whatever was started in it).
struct ByHand(String, Option<std::process::Child>);

impl Drop for ByHand {
    fn drop(&mut self) {
        if let Some(child) = &mut self.1 {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn by_hand(name: &str) -> ByHand {
    let status = Command::new("ip")
        .args(["netns", "add", name])
        .status()
        .expect("ip netns add");
    assert!(status.success(), "ip netns add {name}");
    ByHand(name.to_string(), None)
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// One test at a time that leaves something of a dead process and sweeps:
/// a sweep of another test, running beside it, would remove what this one
/// left before its own sweep could show it did.
fn one_sweeper() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pid of a process that has just exited.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().expect("true");
    let pid = child.id();
    child.wait().expect("reap");
    pid
}

/// Namespaces of cnilab's shapes whose pid is dead (or above `pid_max`),
/// one with a process in it, none with a record cnilab wrote: `cnilab
/// sweep` removes none of them and signals nothing.
#[test]
fn sweep_leaves_namespaces_without_cnilabs_record_and_their_processes() {
    let _host = host_untouched();
    let _alone = one_sweeper();
    require_root();
    let dead = dead_pid();
    let shapes = [
        "cnilab-99999999-0".to_string(),
        "cnilab-99999999-x".to_string(),
        format!("cnilab-{dead}-0-decoy"),
    ];
    let _guards: Vec<ByHand> = shapes.iter().map(|n| by_hand(n)).collect();
    let vg = format!("cnilab-{dead}-vg");
    let mut guard = by_hand(&vg);
    let sleeper = Command::new("ip")
        .args(["netns", "exec", &vg, "sleep", "3604"])
        .stdout(Stdio::null())
        .spawn()
        .expect("sleep in the namespace");
    guard.1 = Some(sleeper);

    let sweep = cnilab(&["sweep"]);
    assert!(sweep.status.success(), "{}", output_text(&sweep));
    let still = guard
        .1
        .as_mut()
        .map(|c| c.try_wait().expect("try_wait").is_none());
    assert_eq!(
        still,
        Some(true),
        "the process in {vg} was signalled: {}",
        output_text(&sweep)
    );
    for name in shapes.iter().chain([&vg]) {
        assert!(
            netns_exists(name),
            "{name} was removed by its name: {}",
            output_text(&sweep)
        );
    }
}

/// A fixture namespace renamed as a runtime names it (`cni-<uuid>`, the
/// name recorded with its owner's record) by a run that was then killed:
/// `cnilab sweep` removes it; one of the same shape that no record lists
/// survives.
#[test]
fn a_renamed_namespace_of_a_killed_run_is_swept_by_its_record() {
    let _host = host_untouched();
    let _alone = one_sweeper();
    require_root();
    let dead = dead_pid();
    let listed = format!("cni-5e1f0c2a-7d3b-4a9e-8c6f-{:012x}", dead);
    let unlisted = format!(
        "cni-5e1f0c2a-7d3b-4a9e-8c6f-{:012x}",
        u64::from(dead) + (1 << 40)
    );
    let _guards = [by_hand(&listed), by_hand(&unlisted)];
    let owners = Path::new(cnilab_net::netns::owner::OWNERS_DIR);
    std::fs::create_dir_all(owners).expect("owners dir");
    // What the killed run wrote: its record, then the name it renamed to.
    let record = owners.join(dead.to_string());
    let names = owners.join(format!("{dead}.names"));
    std::fs::write(&record, format!("{dead} 1\n")).expect("record");
    std::fs::write(&names, format!("{listed}\n")).expect("names");
    let sweep = cnilab(&["sweep"]);
    let (listed_left, unlisted_left) = (netns_exists(&listed), netns_exists(&unlisted));
    let names_left = names.exists();
    let _ = std::fs::remove_file(&record);
    let _ = std::fs::remove_file(&names);
    assert!(sweep.status.success(), "{}", output_text(&sweep));
    assert!(
        !listed_left,
        "{listed} was not swept: {}",
        output_text(&sweep)
    );
    assert!(unlisted_left, "{unlisted} was removed without a record");
    assert!(!names_left, "the swept names stay listed");
}

/// Two captured nodes (one pod each) of a lab that is gone again.
fn two_captures(tag: &str, dir: &Path) -> Vec<String> {
    let src = format!("{tag}{}", std::process::id() % 100_000);
    let lab = StandingLab(src.clone());
    let up = cnilab(&[
        "lab",
        "up",
        "--name",
        &src,
        "--nodes",
        "2",
        "--pods-per-node",
        "1",
    ]);
    assert!(up.status.success(), "{}", output_text(&up));
    let files: Vec<String> = ["node1", "node2"]
        .iter()
        .map(|node| {
            let file = dir.join(format!("{node}.json")).display().to_string();
            let ns = format!("cnilab-lab-{src}-{node}");
            let out = cnilab(&["capture", "--netns", &ns, "--node-name", node, "-o", &file]);
            assert!(out.status.success(), "capture {ns}: {}", output_text(&out));
            file
        })
        .collect();
    drop(lab);
    files
}

/// `lab up --capture --name NAME` SIGKILLed when `ready` says so (or when
/// it ends first); then `cnilab sweep`, and `lab down` if the lab had
/// stood. Whatever moment the kill landed: nothing of NAME remains, and
/// the same `lab up --capture --name NAME` works again.
fn kill_replay_and_sweep(name: &str, files: &[String], ready: impl Fn(&Path) -> bool) {
    let _lab = StandingLab(name.to_string());
    let mut args = vec!["lab", "up", "--name", name, "--capture"];
    args.extend(files.iter().map(String::as_str));
    let mut child = Command::new(workspace_bin("cnilab"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs");
    let dir = PathBuf::from(format!("/run/cnilab/labs/{name}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(&dir) && Instant::now() < deadline {
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = child.kill();
    child.wait().expect("reap");

    let sweep = cnilab(&["sweep"]);
    assert!(sweep.status.success(), "{}", output_text(&sweep));
    if dir.join("state.json").exists() {
        // The kill came after the lab stood: it is a lab like any other.
        let down = cnilab(&["lab", "down", "--name", name]);
        assert!(down.status.success(), "{}", output_text(&down));
    }
    assert!(
        !dir.exists(),
        "{} left: {}",
        dir.display(),
        output_text(&sweep)
    );
    let left = namespaces_of(name);
    assert!(
        left.is_empty(),
        "namespaces left: {left:?}: {}",
        output_text(&sweep)
    );
    let again = cnilab(&args);
    assert!(
        again.status.success(),
        "lab up again: {}",
        output_text(&again)
    );
}

/// Killed once the replay's namespaces are being made (its ledger has a
/// line), and then at moments spread over the whole `lab up`.
#[test]
fn a_sigkilled_replay_is_swept_wherever_the_kill_lands() {
    let _host = host_untouched();
    let _alone = one_sweeper();
    require_root();
    let tmp = tempfile::tempdir().expect("tmp");
    let files = two_captures("ks", tmp.path());
    let name = format!("kr{}", std::process::id() % 100_000);
    kill_replay_and_sweep(&name, &files, |dir| {
        std::fs::read_to_string(dir.join("namespaces")).is_ok_and(|l| l.lines().count() >= 3)
    });
    for delay_ms in [0u64, 20, 80, 200, 600] {
        let started = Instant::now();
        kill_replay_and_sweep(&name, &files, |_| {
            started.elapsed() >= Duration::from_millis(delay_ms)
        });
    }
}

/// Pids of the processes running `sleep 3606` (the hung `nft` below).
fn hung_nfts() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"sleep\x003606\x00")
        })
        .collect()
}

/// Kills the hung `nft`s when dropped (also after a failed assert).
struct HungNfts;

impl Drop for HungNfts {
    fn drop(&mut self) {
        for pid in hung_nfts() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// `lab up --capture` whose `nft` hangs (an `nft` first on PATH that never
/// ends, as one reading a FIFO would), then SIGTERMed: it exits, and leaves
/// no `nft`, no run directory and no namespace of the lab behind.
#[test]
fn a_sigterm_while_nft_hangs_leaves_no_nft_and_no_run_dir() {
    let _host = host_untouched();
    require_root();
    let _hung = HungNfts;
    let tmp = tempfile::tempdir().expect("tmp");
    let files = two_captures("ts", tmp.path());
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).expect("bin dir");
    let mark = tmp.path().join("nft-started");
    let fake = bin.join("nft");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho $$ > \"$CNILAB_TEST_NFT_MARK\"\nexec sleep 3606\n",
    )
    .expect("fake nft");
    let exec = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
    std::fs::set_permissions(&fake, exec).expect("chmod");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let name = format!("tr{}", std::process::id() % 100_000);
    let _lab = StandingLab(name.clone());
    let mut args = vec!["lab", "up", "--name", &name, "--capture"];
    args.extend(files.iter().map(String::as_str));
    let mut child = Command::new(workspace_bin("cnilab"))
        .args(&args)
        .env("PATH", &path)
        .env("CNILAB_TEST_NFT_MARK", &mark)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !mark.exists() && Instant::now() < deadline {
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "lab up --capture ended before it ran nft"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(mark.exists(), "the replay never ran nft");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lab up --capture had not ended 60 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "a SIGTERMed lab up succeeded");
    // A SIGKILLed process may still be on its way out.
    let until = Instant::now() + Duration::from_secs(10);
    while !hung_nfts().is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(hung_nfts().is_empty(), "the hung nft outlived lab up");
    let dir = PathBuf::from(format!("/run/cnilab/labs/{name}"));
    assert!(!dir.exists(), "{} left", dir.display());
    let left = namespaces_of(&name);
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

/// The tables in `ns` (`nft list tables`).
fn tables_in(ns: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "list", "tables"])
        .output()
        .expect("nft runs");
    assert!(out.status.success(), "{}", output_text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A trace killed with SIGKILL on a live node leaves its nftables table in
/// the namespaces it crossed: `cnilab sweep` removes the table of a dead
/// trace process, in a namespace named as a runtime names a pod's, and
/// keeps a live process's and any table not of a trace's shape.
#[test]
fn trace_tables_of_dead_processes_are_swept() {
    let _host = host_untouched();
    let _alone = one_sweeper();
    require_root();
    let dead = dead_pid();
    let ns = format!(
        "cni-{:08x}-5b1e-4c7a-9d2f-{:012x}",
        std::process::id(),
        dead
    );
    let _guard = by_hand(&ns);
    let tables = [
        format!("cnilab_trace_{dead}_1"),
        format!("cnilab_trace_{}_1", std::process::id()),
        "cnilab_trace_x".to_string(),
    ];
    for t in &tables {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "nft", "add", "table", "inet", t])
            .output()
            .expect("nft runs");
        assert!(out.status.success(), "{}", output_text(&out));
    }
    let sweep = cnilab(&["sweep", "-o", "json"]);
    assert!(sweep.status.success(), "{}", output_text(&sweep));
    let report: serde_json::Value = serde_json::from_slice(&sweep.stdout).expect("JSON");
    let listed = report["trace_tables"].to_string();
    assert!(
        listed.contains(&format!("{ns}: inet {}", tables[0])),
        "{listed}"
    );
    let left = tables_in(&ns);
    assert!(!left.contains(&tables[0]), "{left}");
    assert!(
        left.contains(&tables[1]) && left.contains(&tables[2]),
        "{left}"
    );
}
