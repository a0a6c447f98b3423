//! The checks behind SECURITY.md that are not already somewhere else:
//! store permissions, the store lock surviving a
//! SIGKILLed holder, no shell anywhere in cnilab's code, and masquerade
//! batches that carry no input strings. (Path traversal and hostile input
//! are `corpus.rs`; RBAC and the DaemonSet are `agent/tests/manifests.rs`.)

use cnilab_harness::netns::Netns;
use cnilab_net::spec::{code, CniResult, ErrorBody};
use cnilab_plugin::ipam::{Store, LOCK_TIMEOUT};
use cnilab_tests::{
    host_untouched, invoke, require_root, spawn_lock_holder, store_records, workspace_bin, Call,
};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NET: &str = "sectest";

fn config(data_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.1.0",
        "name": NET,
        "type": "cnilab-bridge",
        "bridge": "sectest0",
        "isDefaultGateway": true,
        "ipMasq": true,
        "ipam": {"ranges": [[{"subnet": "10.67.0.0/24"}], [{"subnet": "fd00:67::/64"}]], "dataDir": data_dir},
    })
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn store_files_are_0600_and_directories_0700() {
    let _host = host_untouched();
    require_root();
    let plugin = workspace_bin("cnilab-bridge");
    let host = Netns::with_label("host").expect("host netns");
    let pod = Netns::with_label("pod").expect("pod netns");
    let tmp = tempfile::tempdir().expect("tmp");
    // Directories the plugin has to create itself, several levels deep.
    let data_dir = tmp.path().join("var").join("lib").join("ipam");
    let conf = config(&data_dir);
    // With the usual umask 022, a file or directory created with default
    // permissions would show up as 0644 / 0755.
    let out = invoke(
        &host,
        &plugin,
        &Call {
            command: "ADD",
            container_id: "perm-test",
            netns: Some(pod.path()),
            ifname: "eth0",
        },
        &conf,
    );
    assert!(
        out.status.success(),
        "ADD: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mut dirs = vec![
        tmp.path().join("var"),
        tmp.path().join("var/lib"),
        data_dir.clone(),
    ];
    let mut files = Vec::new();
    let store = data_dir.join(NET);
    dirs.push(store.clone());
    for entry in std::fs::read_dir(&store).expect("store") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            dirs.push(path);
        } else {
            files.push(path);
        }
    }
    assert_eq!(store_records(&store).len(), 2, "one record per family");
    assert!(files.iter().any(|f| f.ends_with("lock")));
    assert!(files
        .iter()
        .any(|f| f.to_string_lossy().contains("last_reserved_ip")));
    for d in &dirs {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    let del = invoke(
        &host,
        &plugin,
        &Call {
            command: "DEL",
            container_id: "perm-test",
            netns: Some(pod.path()),
            ifname: "eth0",
        },
        &conf,
    );
    assert!(del.status.success());
}

fn add_in_background(
    host: &Netns,
    plugin: &Path,
    pod: &Path,
    id: &'static str,
    conf: &Value,
) -> mpsc::Receiver<(Output, Duration)> {
    let (tx, rx) = mpsc::channel();
    let mut cmd = host.command(plugin);
    cmd.env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", pod)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", plugin.parent().unwrap_or(Path::new("/")))
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    let body = conf.to_string();
    std::thread::spawn(move || {
        let t = Instant::now();
        let out = assert_cmd::Command::from_std(cmd)
            .write_stdin(body)
            .output()
            .expect("plugin runs");
        let _ = tx.send((out, t.elapsed()));
    });
    rx
}

#[test]
fn a_held_lock_times_out_with_code_11_and_a_killed_holder_releases_it() {
    let _host = host_untouched();
    require_root();
    let plugin = workspace_bin("cnilab-bridge");
    let host = Netns::with_label("host").expect("host netns");
    let pod_a = Netns::with_label("pod").expect("pod netns");
    let pod_b = Netns::with_label("pod").expect("pod netns");
    let tmp = tempfile::tempdir().expect("tmp");
    let data_dir: PathBuf = tmp.path().join("ipam");
    let conf = config(&data_dir);
    let store = data_dir.join(NET);
    std::fs::create_dir_all(&store).expect("store dir");
    let mut holder = spawn_lock_holder(&store);

    // While a live process holds the lock: no deadlock, code 11 after the
    // lock timeout, and nothing reserved.
    let a = add_in_background(&host, &plugin, pod_a.path(), "lock-a", &conf);
    let (out, took) = a
        .recv_timeout(LOCK_TIMEOUT + Duration::from_secs(20))
        .expect("ADD answers while the lock is held");
    let err: ErrorBody = serde_json::from_slice(&out.stdout).expect("error body");
    assert_eq!(err.code, code::TRY_AGAIN_LATER, "{}", err.msg);
    assert!(
        took >= LOCK_TIMEOUT - Duration::from_millis(500),
        "gave up after {took:?}"
    );
    assert!(store_records(&store).is_empty());

    // A second ADD waits; SIGKILL the holder; the kernel drops its flock
    // and the waiting ADD goes through. Where the kill lands relative to
    // that ADD's own lock timeout depends on the machine's load, so what is
    // asserted holds for every landing: the waiting ADD either succeeds, or
    // gave up with code 11 after the full timeout; either way, once the
    // holder is reaped, the lock is free and the same ADD succeeds.
    let add_b = Call {
        command: "ADD",
        container_id: "lock-b",
        netns: Some(pod_b.path()),
        ifname: "eth0",
    };
    let b = add_in_background(&host, &plugin, pod_b.path(), "lock-b", &conf);
    assert!(
        b.recv_timeout(Duration::from_secs(2)).is_err(),
        "ADD went through although the lock is held"
    );
    holder.kill().expect("SIGKILL the holder");
    let status = holder.wait().expect("reap the holder");
    assert!(status.code().is_none(), "the holder died of a signal");
    let (mut out, took) = b
        .recv_timeout(LOCK_TIMEOUT + Duration::from_secs(20))
        .expect("the waiting ADD answers");
    if !out.status.success() {
        let err: ErrorBody = serde_json::from_slice(&out.stdout).expect("error body");
        assert_eq!(err.code, code::TRY_AGAIN_LATER, "{}", err.msg);
        assert!(
            took >= LOCK_TIMEOUT - Duration::from_millis(500),
            "gave up after {took:?} (before its lock timeout)"
        );
        assert!(store_records(&store).is_empty());
        out = invoke(&host, &plugin, &add_b, &conf);
    }
    assert!(
        out.status.success(),
        "ADD after the kill: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let res: CniResult = serde_json::from_slice(&out.stdout).expect("result");
    assert_eq!(res.ips.len(), 2);
    assert_eq!(store_records(&store).len(), 2);
    let del = invoke(
        &host,
        &plugin,
        &Call {
            command: "DEL",
            ..add_b
        },
        &conf,
    );
    assert!(del.status.success());
    assert!(store_records(&store).is_empty());
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// What follows `"-c"` in a source file: the script, which must be a string
/// literal (a fixed script), never an expression that could carry input.
fn script_after_dash_c(text: &str, at: usize) -> &str {
    text[at + "\"-c\"".len()..].trim_start_matches(|c: char| c == ',' || c.is_whitespace())
}

/// Whether the script after `-c` is fixed text: a literal, or the capture
/// script (`node.sh` from the repository, with the model's constant sysctl
/// lists filled in; nothing from the outside reaches it).
fn is_fixed_script(script: &str) -> bool {
    script.starts_with("r#\"")
        || script.starts_with('"')
        || ["script::script()", "&script::script()"]
            .iter()
            .any(|fixed| script.starts_with(fixed))
}

#[test]
fn the_shell_scan_tells_literal_scripts_from_expressions() {
    let is_literal = |text: &str| {
        let at = text.find("\"-c\"").expect("has -c");
        is_fixed_script(script_after_dash_c(text, at))
    };
    assert!(is_literal(r#"["sh", "-c", "ls /etc"]"#));
    assert!(is_literal(
        "[\"sh\",\n  \"-c\",\n  r#\"for f in *; do cat $f; done\"#]"
    ));
    assert!(!is_literal(
        r#"["sh", "-c", &format!("ip link del {name}")]"#
    ));
    assert!(!is_literal(r#".args(["-c", script.as_str()])"#));
    assert!(is_literal(r#"["sh", "-c", &script::script()]"#));
    assert!(!is_literal(r#"["sh", "-c", &script::script_for(name)]"#));
    assert!(!is_literal(r#"["sh", "-c"].into_iter().chain(once(s))"#));
}

#[test]
fn no_cnilab_code_runs_a_shell_with_input_strings() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for crate_dir in ["plugin/src", "agent/src", "harness/src"] {
        rust_sources(&root.join(crate_dir), &mut files);
    }
    assert!(files.len() > 20, "found only {} sources", files.len());
    const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "busybox"];
    let mut offences = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read source");
        let line_of = |at: usize| text[..at].lines().count();
        // A shell as the program: `Command::new("sh")` and the like.
        for (at, _) in text.match_indices("Command::new(") {
            let arg = text[at + "Command::new(".len()..]
                .trim_start()
                .trim_start_matches('"');
            let program: String = arg
                .chars()
                .take_while(|c| !matches!(c, '"' | ')' | ','))
                .collect();
            if SHELLS.contains(&program.rsplit('/').next().unwrap_or("")) {
                offences.push(format!("{}:{}: shell program", file.display(), line_of(at)));
            }
        }
        // `-c SCRIPT` (also handed to docker exec, kubectl exec, ssh): the
        // script must be a literal.
        for (at, _) in text.match_indices("\"-c\"") {
            let script = script_after_dash_c(&text, at);
            let literal = is_fixed_script(script);
            let line = text[..at].lines().last().unwrap_or("");
            if !literal && !line.trim_start().starts_with("//") {
                offences.push(format!(
                    "{}:{}: -c followed by {:?}",
                    file.display(),
                    line_of(at),
                    script.chars().take(40).collect::<String>()
                ));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "shell invocations with a non-literal script: {offences:#?}"
    );
}

#[test]
fn masquerade_batches_carry_no_input_strings() {
    let hostile = "evil\"; flush ruleset; add table x #";
    let ips = [
        "10.1.0.5".parse().expect("ip"),
        "fd00::5".parse().expect("ip"),
    ];
    let subnets = ["10.1.0.0/24".parse().expect("net")];
    // (DEL has no nft text any more: it names the table, a hash, over netlink.)
    for batch in [
        cnilab_plugin::masq::add_batch(hostile, &subnets, &ips),
        cnilab_plugin::masq::rules_marker(hostile, &subnets),
    ] {
        for piece in ["evil", "ruleset", "add table x", "#", "\""] {
            assert!(!batch.contains(piece), "{piece:?} in {batch}");
        }
    }
    let batch = cnilab_plugin::masq::add_batch(hostile, &subnets, &ips);
    assert!(batch.contains(&cnilab_plugin::masq::table_name(hostile)));
}

/// The plugin, a host and a pod namespace, and an existing, empty store.
struct StoreLab {
    plugin: PathBuf,
    host: Netns,
    pod: Netns,
    tmp: tempfile::TempDir,
    data_dir: PathBuf,
    store: PathBuf,
}

impl StoreLab {
    fn new() -> StoreLab {
        require_root();
        let tmp = tempfile::tempdir().expect("tmp");
        let data_dir = tmp.path().join("ipam");
        let store = data_dir.join(NET);
        std::fs::create_dir_all(&store).expect("store");
        StoreLab {
            plugin: workspace_bin("cnilab-bridge"),
            host: Netns::with_label("host").expect("host netns"),
            pod: Netns::with_label("pod").expect("pod netns"),
            tmp,
            data_dir,
            store,
        }
    }

    /// `command` for the pod's `eth0` (container `container_id`).
    fn call<'a>(&'a self, command: &'a str, container_id: &'a str) -> Call<'a> {
        Call {
            command,
            container_id,
            netns: Some(self.pod.path()),
            ifname: "eth0",
        }
    }
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Symlinks planted in the store (the record temp file,
/// the cursor's temp file, the lock) are never written through: their
/// targets stay as they were.
#[test]
fn the_store_never_writes_through_a_planted_symlink() {
    let lab = StoreLab::new();
    let store = &lab.store;
    let victim = lab.tmp.path().join("victim");
    std::fs::write(&victim, "precious\n").expect("victim");
    // This test process's pid: the record temp file the store API below
    // will use; the plugin process's cursor temp files.
    let links = [
        format!(".record.{}", std::process::id()),
        "last_reserved_ip.0.tmp".into(),
        "last_reserved_ip.1.tmp".into(),
        "last_reserved_ip.tmp".into(),
    ];
    for name in &links {
        std::os::unix::fs::symlink(&victim, store.join(name)).expect("plant symlink");
    }
    let conf = config(&lab.data_dir);
    let call = |command| {
        invoke(
            &lab.host,
            &lab.plugin,
            &lab.call(command, "symlinks"),
            &conf,
        )
    };
    let out = call("ADD");
    assert!(
        out.status.success(),
        "ADD: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious\n"
    );
    assert!(call("DEL").status.success());

    // The store API with this process's pid (the plugin's own record temp file).
    std::os::unix::fs::symlink(&victim, store.join(&links[0])).ok();
    let set = match cnilab_plugin::config::parse(conf.to_string().as_bytes())
        .expect("config")
        .ipam
    {
        cnilab_plugin::config::IpamPlan::Builtin(b) => b.range_sets[0].clone(),
        _ => panic!("builtin IPAM expected"),
    };
    let s = Store::open_locked(store, Duration::from_secs(5)).expect("lock");
    let (ip, _) = s.reserve(0, &set, "api", "eth0").expect("reserve");
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious\n"
    );
    let record = store.join(ip.to_string());
    assert!(std::fs::symlink_metadata(&record)
        .expect("record")
        .is_file());
    drop(s);

    // A lock that is a symlink is refused (code 5), not followed.
    std::fs::remove_file(store.join("lock")).expect("remove lock");
    std::os::unix::fs::symlink(&victim, store.join("lock")).expect("plant lock symlink");
    let err = Store::open_locked(store, Duration::from_secs(1))
        .err()
        .expect("a symlinked lock is refused");
    assert_eq!(err.code, code::IO_FAILURE, "{}", err.msg);
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious\n"
    );
}

/// Odd files never hang the plugin nor fail DEL and GC
/// for good. Records that are a directory, a symlink to a FIFO or to
/// `/dev/zero` are skipped and logged; a FIFO as the lock file is refused
/// at once (code 5) and leaves no veth. Each run is limited: a hang is
/// SIGKILLed and fails the test.
#[test]
fn odd_files_in_the_store_never_hang_nor_block_del_and_gc() {
    let lab = StoreLab::new();
    let (host, pod, store) = (&lab.host, &lab.pod, &lab.store);
    let fifo = lab.tmp.path().join("fifo");
    mkfifo(&fifo);
    std::fs::create_dir(store.join("10.67.0.50")).expect("directory record");
    std::os::unix::fs::symlink(&fifo, store.join("10.67.0.51")).expect("fifo record");
    std::os::unix::fs::symlink("/dev/zero", store.join("10.67.0.52")).expect("zero record");
    let conf = config(&lab.data_dir);
    let limit = LOCK_TIMEOUT + Duration::from_secs(10);
    let run = |command: &str, conf: &Value| {
        let call = lab.call(command, "odd");
        cnilab_tests::run_limited(
            cnilab_tests::plugin_command(&lab.host, &lab.plugin, &call),
            conf,
            limit,
        )
    };
    for command in ["ADD", "DEL", "DEL"] {
        let out = run(command, &conf);
        assert!(!out.killed, "{command} hung");
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        if command == "DEL" {
            let log = String::from_utf8_lossy(&out.stderr);
            assert!(log.contains("skipped malformed record"), "logged: {log}");
        }
    }
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    let out = run("GC", &gc);
    assert!(!out.killed, "GC hung");
    assert!(
        out.status.success(),
        "GC: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        std::fs::symlink_metadata(store.join("10.67.0.50")).is_ok(),
        "skipped, not removed"
    );

    // A FIFO as the lock: refused at once, nothing left behind.
    std::fs::remove_file(store.join("lock")).expect("remove lock");
    mkfifo(&store.join("lock"));
    let before = host.snapshot().expect("host");
    let out = run("ADD", &conf);
    assert!(!out.killed, "ADD hung on a FIFO lock");
    let err: ErrorBody = serde_json::from_slice(&out.stdout).expect("error body");
    assert_eq!(err.code, code::IO_FAILURE, "{}", err.msg);
    assert!(err.msg.contains("lock"), "{}", err.msg);
    let after = host.snapshot().expect("host");
    let added = after.added_since(&before, &[]);
    assert!(added.is_empty(), "left behind: {added:?}");
    assert!(pod.links().expect("links").iter().all(|l| l.name != "eth0"));
}

/// A relative `CNI_PATH` entry is never searched, so
/// a delegated IPAM plugin is never run from the current directory; the
/// log says the entry was ignored.
#[test]
fn relative_cni_path_entries_never_run_a_binary() {
    use std::os::unix::fs::PermissionsExt;
    let plugin = workspace_bin("cnilab-bridge");
    let cwd = tempfile::tempdir().expect("tmp");
    let marker = cwd.path().join("ran");
    let evil = cwd.path().join("evil-ipam");
    std::fs::write(
        &evil,
        format!("#!/bin/sh\ntouch {}\nexit 0\n", marker.display()),
    )
    .expect("write");
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": NET,
        "type": "cnilab-bridge",
        "ipam": {"type": "evil-ipam"},
    });
    let out = assert_cmd::Command::new(&plugin)
        .current_dir(cwd.path())
        .env_clear()
        .env("CNI_COMMAND", "STATUS")
        .env("CNI_PATH", ".:evil")
        .write_stdin(conf.to_string())
        .output()
        .expect("plugin runs");
    assert!(!marker.exists(), "the binary in the current directory ran");
    let err: ErrorBody = serde_json::from_slice(&out.stdout).expect("error body");
    assert_eq!(err.code, code::IPAM_DELEGATE, "{}", err.msg);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("CNI_PATH entry \".\" ignored"),
        "logged: {log}"
    );
}

/// A named FIFO as `CNI_NETNS` (a plain open would block
/// forever) is refused with code 4 at once by ADD, DEL and CHECK; nothing
/// is left behind.
#[test]
fn a_fifo_as_cni_netns_is_refused_without_blocking() {
    let lab = StoreLab::new();
    let fifo = lab.tmp.path().join("netns-fifo");
    mkfifo(&fifo);
    let mut conf = config(&lab.data_dir);
    let before = lab.host.snapshot().expect("host");
    for command in ["ADD", "DEL", "CHECK"] {
        if command == "CHECK" {
            conf["prevResult"] = json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "sandbox": fifo}],
            });
        }
        let out = cnilab_tests::run_limited(
            cnilab_tests::plugin_command(
                &lab.host,
                &lab.plugin,
                &Call {
                    command,
                    container_id: "fifo",
                    netns: Some(&fifo),
                    ifname: "eth0",
                },
            ),
            &conf,
            Duration::from_secs(20),
        );
        assert!(!out.killed, "{command} hung on a FIFO as CNI_NETNS");
        let err: ErrorBody = serde_json::from_slice(&out.stdout).expect("error body");
        assert_eq!(err.code, code::INVALID_ENV, "{command}: {}", err.msg);
        assert!(err.msg.contains("FIFO"), "{command}: {}", err.msg);
    }
    let after = lab.host.snapshot().expect("host");
    assert!(after.added_since(&before, &[]).is_empty());
    assert!(store_records(&lab.store).is_empty());
}
