//! `cnilab e2e vagrant`: the plan its `--dry-run` prints, the refusals of
//! runs that could not be cleaned up, and (root, libvirt: run by .ci/run's
//! vagrant tier with `--ignored`) the run's private network namespace:
//! libvirt's bridges and firewall rules land there, never on the host, and
//! `down` or `cnilab sweep` (after a killed run) leave nothing behind.

mod common;

use common::e2e::{dry_run, repo_root, run_dry};
use std::path::Path;

#[test]
fn the_whole_run_is_up_check_down_in_that_order() {
    let out = dry_run(&["vagrant"]);
    let commands: Vec<&str> = out.lines().filter(|l| l.starts_with("+ ")).collect();
    let at = |needle: &str| {
        commands
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no `{needle}` in the plan:\n{out}"))
    };
    let order = [
        at("lab/vagrant/build-box.sh --link"),
        at("lab/vagrant/env.sh up cnilab-"),
        at("vagrant box add --force --name cnilab/bookworm-offline"),
        at("vagrant up --provider libvirt"),
        at("vagrant ssh node1 -c 'sudo sh -s'"),
        at("vagrant ssh node2 -c 'sudo sh -s'"),
        at("lab/vagrant/env.sh down cnilab-"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{out}");
    // The scripts go on stdin, shown under their command.
    for node in ["node1", "node2"] {
        let facts = format!("#   stdin: cnilab e2e vagrant-node facts {node}-pod0 {node}-pod1");
        assert!(out.contains(&facts), "no `{facts}` in the plan:\n{out}");
    }
    // Every vagrant command runs in the run's namespace with the offline
    // Vagrantfile; the namespace carries this run's pid.
    for line in commands.iter().filter(|l| l.contains(" vagrant ")) {
        assert!(line.contains("CNILAB_VAGRANT_MODE=offline"), "{line}");
        assert!(line.contains("lab/vagrant/env.sh exec cnilab-"), "{line}");
    }
    let ns: Vec<&str> = out
        .split_whitespace()
        .filter(|w| w.starts_with("cnilab-") && w.ends_with("-vg"))
        .collect();
    assert!(!ns.is_empty() && ns.iter().all(|n| *n == ns[0]), "{ns:?}");
}

/// `--capture DIR`: after the probes, each VM captured into DIR/<vm>.json
/// by `cnilab capture` inside it, then replayed here, before the teardown.
#[test]
fn capture_takes_each_vm_after_the_check_and_replays_it_before_down() {
    let out = dry_run(&["vagrant", "--capture", "/tmp/caps"]);
    let lines: Vec<&str> = out.lines().collect();
    let at = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no `{needle}` in the plan:\n{out}"))
    };
    let order = [
        at("# probes ("),
        at("vagrant ssh node1 -c 'sudo sh -s' > /tmp/caps/node1.json"),
        at("vagrant ssh node2 -c 'sudo sh -s' > /tmp/caps/node2.json"),
        at("# replayed here (`cnilab lab run --capture /tmp/caps/node1.json /tmp/caps/node2.json"),
        at("lab/vagrant/env.sh down cnilab-"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{out}");
    let captures = lines
        .iter()
        .filter(|l| **l == "#   stdin: cnilab capture -o json")
        .count();
    assert_eq!(captures, 2, "{out}");
    // Without --capture nothing is captured.
    assert!(!dry_run(&["vagrant"]).contains("cnilab capture"));
}

#[test]
fn retain_keeps_the_vms_and_steps_name_the_run() {
    let kept = dry_run(&["vagrant", "--retain", "--name", "keep"]);
    assert!(kept.contains("vagrant up"), "{kept}");
    assert!(!kept.contains("env.sh down"), "{kept}");
    let down = dry_run(&["vagrant", "down", "--name", "keep"]);
    assert_eq!(
        down.lines()
            .filter(|l| l.starts_with("+ "))
            .collect::<Vec<_>>(),
        ["+ bash ./lab/vagrant/env.sh down cnilab-vg-keep"]
    );
    let check = dry_run(&["vagrant", "check", "--name", "keep"]);
    assert!(
        !check.contains("vagrant up") && !check.contains("env.sh down"),
        "{check}"
    );
}

#[test]
fn a_run_nobody_could_clean_up_is_refused_with_the_fix() {
    for args in [
        &["vagrant", "up"][..],
        &["vagrant", "--retain"],
        &["vagrant", "check", "--name", "Bad Name"],
    ] {
        let out = run_dry(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--name"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed a plan");
    }
}

// ---- root, libvirt (the vagrant tier of .ci/run runs these) ----

fn env_sh(args: &[&str]) -> std::process::Output {
    std::process::Command::new("bash")
        .arg(repo_root().join("lab/vagrant/env.sh"))
        .args(args)
        .output()
        .expect("bash runs")
}

/// `virsh -c qemu:///system ARGS` against the run's libvirtd.
fn virsh(ns: &str, args: &[&str]) -> std::process::Output {
    let mut all = vec!["exec", ns, "virsh", "-c", "qemu:///system"];
    all.extend_from_slice(args);
    env_sh(&all)
}

fn ok(out: &std::process::Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what}: {text}");
    text
}

fn run_dir(ns: &str) -> std::path::PathBuf {
    Path::new(cnilab_harness::e2e::vagrant::RUN_ROOT).join(ns)
}

/// Whether `pid` still runs: a zombie (killed, its parent has not reaped
/// it yet) does not.
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Removes the namespace if a test failed half way.
struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = env_sh(&["down", &self.0]);
    }
}

/// `env.sh up NS`: the guard that takes it down, and libvirtd's pid.
fn up(ns: &str) -> (Down, i32) {
    let down = Down(ns.to_string());
    ok(&env_sh(&["up", ns]), "env.sh up");
    let libvirtd = std::fs::read_to_string(run_dir(ns).join("libvirtd.pid"))
        .expect("libvirtd.pid")
        .trim()
        .parse()
        .expect("a pid");
    (down, libvirtd)
}

#[test]
#[ignore = "root and libvirt (bash lab/install-deps.sh --vagrant); run by .ci/run's vagrant tier"]
fn libvirt_runs_in_the_runs_namespace_and_down_removes_everything() {
    let _host = cnilab_net::testing::host_untouched();
    let ns = format!("cnilab-{}-vg", std::process::id());
    let (_down, libvirtd) = up(&ns);
    // A NAT network: libvirt makes a bridge, dnsmasq and firewall rules.
    ok(&virsh(&ns, &["net-start", "default"]), "net-start");
    let links = ok(&env_sh(&["exec", &ns, "ip", "-o", "link"]), "ip link");
    assert!(
        links.contains("virbr0"),
        "libvirt's bridge is in {ns}: {links}"
    );
    ok(&env_sh(&["down", &ns]), "env.sh down");
    assert!(!Path::new("/run/netns").join(&ns).exists(), "{ns} is gone");
    assert!(!run_dir(&ns).exists(), "its run directory is gone");
    assert!(!running(libvirtd), "libvirtd ({libvirtd}) is stopped");
    // The second down finds nothing and says so without failing.
    ok(&env_sh(&["down", &ns]), "env.sh down again");
}

#[test]
#[ignore = "root and libvirt (bash lab/install-deps.sh --vagrant); run by .ci/run's vagrant tier"]
fn sweep_finds_what_a_killed_run_left() {
    let _host = cnilab_net::testing::host_untouched();
    // The run's owner: a process that dies without cleaning up.
    let mut owner = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep");
    let ns = format!("cnilab-{}-vg", owner.id());
    let (_down, libvirtd) = up(&ns);
    assert!(
        !cnilab_harness::e2e::vagrant::sweep().contains(&ns),
        "a live run is not swept"
    );
    assert!(
        running(libvirtd),
        "libvirtd ({libvirtd}) runs before the sweep"
    );
    owner.kill().expect("kill");
    owner.wait().expect("reap");
    let emptied = cnilab_harness::e2e::vagrant::sweep();
    assert!(emptied.contains(&ns), "{emptied:?}");
    assert!(!running(libvirtd), "libvirtd ({libvirtd}) stopped");
    assert!(!run_dir(&ns).exists(), "run directory removed");
    // The run directory proved the namespace the run's own: it goes too.
    assert!(!Path::new("/run/netns").join(&ns).exists(), "{ns} removed");
}

/// A `cnilab-<deadpid>-vg` namespace that env.sh never made (no run
/// directory): the vagrant sweep neither empties nor removes it.
#[test]
fn sweep_leaves_a_vg_namespace_without_its_run_directory() {
    let _host = cnilab_net::testing::host_untouched();
    cnilab_net::testing::require_root();
    let mut gone = std::process::Command::new("true").spawn().expect("true");
    let ns = format!("cnilab-{}-vg", gone.id());
    gone.wait().expect("reap");
    let added = std::process::Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .expect("ip netns add");
    assert!(added.success());
    let emptied = cnilab_harness::e2e::vagrant::sweep();
    let kept = Path::new("/run/netns").join(&ns).exists();
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &ns])
        .output();
    assert!(!emptied.contains(&ns), "{emptied:?}");
    assert!(kept, "{ns} was removed by its name");
}

/// How often the run's libvirtd has started QEMU to probe its
/// capabilities, by its log (debug level for that module only).
fn probes_logged(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("Try to probe capabilities of")
        .count()
}

#[test]
#[ignore = "root and libvirt (bash lab/install-deps.sh --vagrant); run by .ci/run's vagrant tier"]
fn the_runs_libvirt_probes_qemu_once_and_keeps_what_it_found() {
    let _host = cnilab_net::testing::host_untouched();
    // The host's /dev/kvm (owner, group, mode), as the run must leave it.
    let kvm = || {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/dev/kvm")
            .ok()
            .map(|m| (m.uid(), m.gid(), m.mode()))
    };
    let host_kvm = kvm();
    let ns = format!("cnilab-vg-c{}", std::process::id() % 10_000_000);
    let (_down, _) = up(&ns);
    let log = run_dir(&ns).join("log/caps-test.log");
    let admin = |args: &[&str]| {
        let mut all = vec!["exec", &ns, "virt-admin", "-c", "libvirtd:///system"];
        all.extend_from_slice(args);
        ok(&env_sh(&all), "virt-admin");
    };
    admin(&[
        "daemon-log-filters",
        "1:qemu.qemu_capabilities 1:qemu.qemu_process 3:*",
    ]);
    // libvirtd writes the file inside the run's mount namespace, where the
    // run's log directory is /var/log/libvirt.
    admin(&[
        "daemon-log-outputs",
        "1:file:/var/log/libvirt/caps-test.log",
    ]);
    let lookup = || {
        ok(
            &virsh(&ns, &["domcapabilities", "--virttype", "qemu"]),
            "virsh domcapabilities",
        )
    };
    lookup();
    let first = probes_logged(&log);
    assert!(
        first >= 1,
        "the first lookup probes QEMU (or the log changed its words): {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    lookup();
    lookup();
    // Each probe costs seconds of CPU; probing again on every lookup (the
    // cache judged stale because root may open /dev/kvm and libvirt's qemu
    // user may not) made defining and starting one VM take minutes.
    assert_eq!(
        probes_logged(&log),
        first,
        "later lookups probed QEMU again: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(kvm(), host_kvm, "the host's /dev/kvm is as it was");
}

/// The run the fault test uses: `CNILAB_VAGRANT_RUN` names a standing run
/// of the same checkout (the vagrant tier's: up and healthy-checked, torn
/// down by the tier), else the test's own `fault`, brought up and torn
/// down here.
fn run_name() -> Option<String> {
    std::env::var("CNILAB_VAGRANT_RUN")
        .ok()
        .filter(|n| !n.is_empty())
}

/// `cnilab e2e vagrant STEP --name RUN` from the checkout.
fn e2e_vagrant(args: &[&str]) -> std::process::Output {
    let cnilab = assert_cmd::cargo::cargo_bin("cnilab");
    let bin = std::env::var_os("CNILAB_VAGRANT_BIN")
        .map(std::path::PathBuf::from)
        .or_else(|| cnilab.parent().map(Path::to_path_buf))
        .expect("the binaries' directory");
    let name = run_name().unwrap_or_else(|| "fault".into());
    std::process::Command::new(&cnilab)
        .current_dir(repo_root())
        .args(["e2e", "vagrant"])
        .args(args)
        .args(["--name", &name])
        .arg("--bin")
        .arg(bin)
        .output()
        .expect("cnilab runs")
}

/// `vagrant ssh NODE -c SCRIPT` in the fault run's namespace, with the
/// checkout's offline Vagrantfile (what `e2e vagrant` itself sets).
fn vagrant_ssh(node: &str, script: &str) -> std::process::Output {
    let ns = format!("cnilab-vg-{}", run_name().unwrap_or_else(|| "fault".into()));
    std::process::Command::new("bash")
        .arg(repo_root().join("lab/vagrant/env.sh"))
        .args(["exec", &ns, "vagrant", "ssh", node, "-c", script])
        .env("VAGRANT_CWD", repo_root())
        .env("CNILAB_VAGRANT_MODE", "offline")
        .output()
        .expect("bash runs")
}

/// Tears the fault test's own VMs down whatever happens (a run named by
/// `CNILAB_VAGRANT_RUN` is its owner's to remove).
struct VagrantDown(bool);

impl Drop for VagrantDown {
    fn drop(&mut self) {
        if self.0 {
            let _ = e2e_vagrant(&["down"]);
        }
    }
}

/// What `check --capture` says of the replay of the VMs' captures: the
/// replay on this host got the same verdict as the VMs, `verdict`.
fn assert_replay_agrees(out: &std::process::Output, dir: &Path, verdict: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the same verdict as the VMs, {verdict} (5 groups)"
        )),
        "the replay of the VMs' captures: {stderr}"
    );
    for node in ["node1", "node2"] {
        let text = std::fs::read_to_string(dir.join(format!("{node}.json")))
            .unwrap_or_else(|e| panic!("{node}'s capture: {e}"));
        let c: serde_json::Value = serde_json::from_str(&text).expect("the capture is JSON");
        assert_eq!(c["node"]["name"], node, "{node}'s capture names it");
    }
}

#[test]
#[ignore = "boots two VMs (minutes; root, libvirt, the offline box, cnilab-agent and cnilab-bridge built next to cnilab or in CNILAB_VAGRANT_BIN): run it by hand, or by the vagrant tier with CNILAB_VAGRANT_RUN"]
fn a_fault_in_one_vm_fails_the_check_and_names_the_vm() {
    let _host = cnilab_net::testing::host_untouched();
    let own = run_name().is_none();
    let _down = VagrantDown(own);
    let dir = tempfile::tempdir().expect("dir");
    let healthy_dir = dir.path().join("healthy");
    let healthy_arg = healthy_dir.display().to_string();
    // Healthy first: what fails below fails because of the fault. The
    // VMs' captures replayed here pass as the VMs do. (A run named by
    // CNILAB_VAGRANT_RUN was just checked so by its owner, the vagrant
    // tier, whose check with --capture exits 1 unless both hold.)
    if own {
        ok(&e2e_vagrant(&["up"]), "e2e vagrant up");
        let out = e2e_vagrant(&["check", "--capture", &healthy_arg]);
        let healthy = ok(&out, "e2e vagrant check --capture (healthy)");
        eprintln!("healthy check:\n{healthy}");
        assert_replay_agrees(&out, &healthy_dir, "PASS");
    }
    // The agent stopped (it would put the route back), then node2's route to
    // node1's pods deleted. (Forwarding off is no fault that lasts here: the
    // check makes its pods again, and the plugin's ADD turns forwarding on.)
    ok(
        &vagrant_ssh(
            "node2",
            "sudo systemctl stop cnilab-agent && ip -4 route show \
             | awk '$1 != \"default\" && $2 == \"via\" {print $1}' \
             | xargs -r -n1 sudo ip route del",
        ),
        "the fault",
    );
    let faulty_dir = dir.path().join("faulty");
    let faulty_arg = faulty_dir.display().to_string();
    let out = e2e_vagrant(&["check", "-o", "json", "--capture", &faulty_arg]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The captures of the faulty VMs fail the same groups in the replay.
    assert_replay_agrees(&out, &faulty_dir, "FAIL");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let diagnoses: Vec<String> = report["failures"]
        .as_array()
        .expect("failures")
        .iter()
        .flat_map(|f| f["diagnoses"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["id"] == "missing-route")
        .filter_map(|d| d["message"].as_str().map(str::to_string))
        .collect();
    assert!(
        !diagnoses.is_empty(),
        "no missing-route diagnosis: {report}"
    );
    assert!(
        diagnoses
            .iter()
            .all(|m| m.starts_with("node2 has no route to")),
        "{diagnoses:?}"
    );
}
