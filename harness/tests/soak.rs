//! Root tests of `cnilab soak`: a short soak of cnilab-bridge finds nothing;
//! planted leaks are reclaimed by GC and reported without it; a plugin that
//! leaks on purpose is caught, with a replay that reproduces the leak, also
//! when it keeps its own store; every detector fires on a plugin made to
//! trigger it. Each soak is a few seconds long.

use cnilab_harness::report::Rendered;
use cnilab_harness::soak::{self, Budget, FindingKind, SoakOptions, SoakReport};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Soaks of this binary run at once, except the one that counts the
/// namespaces left behind: it runs alone (write), so it sees only its own.
static SOAKS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// What a root soak test holds until it ends: a shared hold on [`SOAKS`],
/// and the check that the machine's own network is unchanged afterwards.
struct RootTest {
    _soaks: std::sync::RwLockReadGuard<'static, ()>,
    _host: cnilab_harness::testing::HostUntouched,
}

/// The workspace's one root check (`testing::require_root`), then a shared
/// hold on [`SOAKS`] and the host guard.
fn root_soak() -> RootTest {
    cnilab_harness::testing::require_root();
    RootTest {
        _soaks: SOAKS.read().unwrap_or_else(|e| e.into_inner()),
        _host: cnilab_harness::testing::host_untouched(),
    }
}

/// `cnilab-bridge`, built next to `cnilab` by `cargo test --workspace`.
fn bridge_dir() -> PathBuf {
    let cnilab = PathBuf::from(env!("CARGO_BIN_EXE_cnilab"));
    let dir = cnilab.parent().expect("target dir").to_path_buf();
    assert!(
        dir.join("cnilab-bridge").is_file(),
        "{} is missing: build it with `cargo build --workspace` (cargo test --workspace builds it too)",
        dir.join("cnilab-bridge").display()
    );
    dir
}

fn bridge_config(dir: &Path) -> PathBuf {
    let path = dir.join("soak-test.conf");
    std::fs::write(
        &path,
        r#"{"cniVersion":"1.1.0","name":"soak-test","type":"cnilab-bridge","bridge":"soakt0",
            "isDefaultGateway":true,"ipam":{"ranges":[[{"subnet":"10.77.0.0/24"}]]}}"#,
    )
    .expect("write config");
    path
}

fn options(plugin_dir: &Path, config: &Path, cycles: u64) -> SoakOptions {
    let mut o = SoakOptions::new(&plugin_dir.to_string_lossy(), config);
    o.budget = Budget::Cycles(cycles);
    o.parallel = 4;
    o.pods = 2;
    o.seed = 20261121;
    o
}

fn explain(r: &SoakReport) -> String {
    r.table()
}

fn no_namespaces_of_this_process_left() {
    let prefix = format!("cnilab-{}-", std::process::id());
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    // Other tests of this binary may be running; only soak namespaces count.
    let soak: Vec<&String> = left.iter().filter(|n| n.contains("soak")).collect();
    assert!(soak.is_empty(), "namespaces left: {soak:?}");
}

#[test]
fn short_soak_of_cnilab_bridge_finds_no_leak() {
    drop(root_soak());
    let _alone = SOAKS.write().unwrap_or_else(|e| e.into_inner());
    let _host = cnilab_harness::testing::host_untouched();
    let tmp = tempfile::tempdir().expect("tmp");
    let mut o = options(&bridge_dir(), &bridge_config(tmp.path()), 60);
    o.kill_rate = 0.25;
    o.gc_every = 20;
    let r = soak::run(&o).expect("soak runs");
    assert!(r.passed(), "{}", explain(&r));
    assert_eq!(r.steps, 60);
    assert!(r.kills_landed > 0, "no ADD was killed:\n{}", explain(&r));
    assert!(r.gc_supported && r.gc_runs >= 3, "{}", explain(&r));
    for op in [
        "ADD",
        "CHECK",
        "DEL",
        "DEL (netns gone)",
        "DEL (no CNI_NETNS)",
        "GC",
    ] {
        assert!(
            r.operations.iter().any(|s| s.op == op && s.count > 0),
            "no {op} was run:\n{}",
            explain(&r)
        );
    }
    assert!(r.failures.is_empty(), "{}", explain(&r));
    no_namespaces_of_this_process_left();
}

#[test]
fn gc_reclaims_planted_leaks() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    let mut o = options(&bridge_dir(), &bridge_config(tmp.path()), 24);
    o.inject_leaks = 3;
    o.gc_every = 12;
    let r = soak::run(&o).expect("soak runs");
    let injected = r.injected.clone().expect("leaks were planted");
    assert_eq!((injected.records, injected.links), (3, 2));
    assert_eq!(
        (injected.records_reclaimed, injected.links_reclaimed),
        (3, 2),
        "{}",
        explain(&r)
    );
    assert!(r.passed(), "{}", explain(&r));
}

#[test]
fn planted_leaks_without_gc_fail_the_run_from_the_cli() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    let config = bridge_config(tmp.path());
    let out = assert_cmd::Command::new(env!("CARGO_BIN_EXE_cnilab"))
        .args(["soak", "--plugin-dir"])
        .arg(bridge_dir())
        .arg("--config")
        .arg(&config)
        .args([
            "--cycles",
            "6",
            "--parallel",
            "2",
            "--pods",
            "1",
            "--seed",
            "5",
            "--gc-every",
            "0",
            "--inject-leaks",
            "2",
            "--format",
            "json",
        ])
        .output()
        .expect("cnilab runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout={stdout} stderr={}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    let kinds: Vec<&str> = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "leaked_address").count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "leaked_link").count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(report["injected"]["records_reclaimed"], 0);
}

/// The reference bridge with a host-local that never releases on DEL.
fn leaky_plugin_dir(dir: &Path) -> PathBuf {
    assert!(
        Path::new("/usr/lib/cni/bridge").is_file()
            && Path::new("/usr/lib/cni/host-local").is_file(),
        "the reference plugins are missing: apt-get install containernetworking-plugins"
    );
    let bin = dir.join("leaky");
    std::fs::create_dir_all(&bin).expect("mkdir");
    // Fixed scripts: the only input they look at is CNI_COMMAND, compared
    // as a string, never evaluated.
    let scripts = [
        ("bridge", "#!/bin/sh\nexec /usr/lib/cni/bridge\n"),
        (
            "host-local",
            "#!/bin/sh\nif [ \"$CNI_COMMAND\" = DEL ]; then exit 0; fi\nexec /usr/lib/cni/host-local\n",
        ),
    ];
    for (name, text) in scripts {
        let path = bin.join(name);
        std::fs::write(&path, text).expect("write script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let conf = dir.join("leaky.conf");
    std::fs::write(
        &conf,
        r#"{"cniVersion":"1.0.0","name":"leaky","type":"bridge","bridge":"leaky0",
            "isDefaultGateway":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.78.0.0/24"}]]}}"#,
    )
    .expect("write config");
    bin
}

#[test]
fn a_plugin_that_leaks_is_caught_and_the_replay_reproduces_it() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    let bin = leaky_plugin_dir(tmp.path());
    let mut o = options(&bin, &tmp.path().join("leaky.conf"), 8);
    o.kill_rate = 0.0;
    let r = soak::run(&o).expect("soak runs");
    assert!(!r.passed());
    assert!(!r.gc_supported, "config 1.0.0: no GC");
    // Every pod leaks its address: 3 warm-ups, 2 residents, 8 steps.
    assert_eq!(r.count(FindingKind::LeakedAddress), 13, "{}", explain(&r));
    let step_finding = r
        .findings
        .iter()
        .find(|f| f.steps == [5])
        .expect("a finding names step 5");
    assert!(
        step_finding.replay[0].contains("--seed 20261121")
            && step_finding.replay[0].ends_with("--replay 5")
    );
    assert!(step_finding.log.iter().any(|op| op.op.starts_with("DEL")));
    assert_eq!(step_finding.plans[0].step, 5);

    let mut replay = o.clone();
    replay.replay = Some(5);
    replay.pods = 0;
    let again = soak::run(&replay).expect("replay runs");
    assert_eq!(again.steps, 1);
    let replayed = again
        .findings
        .iter()
        .find(|f| f.steps == [5])
        .expect("the replay shows step 5's leak again");
    assert_eq!(replayed.kind, FindingKind::LeakedAddress);
    assert_eq!(replayed.plans, step_finding.plans, "same plan on replay");
}

#[test]
fn reference_bridge_and_host_local_survive_a_short_soak_without_duplicates() {
    let _soaks = root_soak();
    assert!(
        Path::new("/usr/lib/cni/bridge").is_file(),
        "the reference plugins are missing: apt-get install containernetworking-plugins"
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let conf = tmp.path().join("reference.conf");
    std::fs::write(
        &conf,
        r#"{"cniVersion":"1.0.0","name":"soak-ref","type":"bridge","bridge":"soakref0",
            "isDefaultGateway":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.79.0.0/24"}]]}}"#,
    )
    .expect("write config");
    let mut o = options(Path::new("/usr/lib/cni"), &conf, 24);
    o.kill_rate = 0.3;
    let r = soak::run(&o).expect("soak runs");
    // What the reference leaks is reported, not asserted (docs/src/cli/soak.md);
    // two live pods with one address would be a defect of either side.
    eprintln!("{}", r.table());
    assert_eq!(r.steps, 24);
    assert!(r.kills_landed > 0, "{}", explain(&r));
    assert!(!r.gc_supported, "host-local 1.1.1 has no GC");
    assert_eq!(r.count(FindingKind::DuplicateAddress), 0, "{}", explain(&r));
    assert_eq!(r.count(FindingKind::LeftInPodNetns), 0, "{}", explain(&r));
}

#[test]
fn pods_lost_after_killed_adds_leak_without_gc_and_not_with_it() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    // cnilab-bridge: GC (periodic, and a last one before the cleanup)
    // reclaims what the lost pods' killed ADDs left.
    let mut o = options(&bridge_dir(), &bridge_config(tmp.path()), 20);
    o.kill_rate = 1.0;
    o.lose_rate = 1.0;
    o.gc_every = 10;
    let r = soak::run(&o).expect("soak runs");
    assert!(r.lost_pods > 0, "{}", explain(&r));
    assert!(r.passed(), "{}", explain(&r));

    // The reference host-local has no GC: a killed ADD that got as far as
    // reserving an address leaks it. The reference bridge, made to linger
    // 300 ms after its work, is killed after the reservation nearly always.
    let bin = tmp.path().join("slow-add");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let script = bin.join("bridge");
    std::fs::write(
        &script,
        "#!/bin/sh\n/usr/lib/cni/bridge\nstatus=$?\nif [ \"$CNI_COMMAND\" = ADD ]; then sleep 0.3; fi\nexit $status\n",
    )
    .expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::symlink("/usr/lib/cni/host-local", bin.join("host-local")).expect("symlink");
    let conf = tmp.path().join("reference.conf");
    std::fs::write(
        &conf,
        r#"{"cniVersion":"1.0.0","name":"soak-lost","type":"bridge","bridge":"soaklost0",
            "ipam":{"type":"host-local","ranges":[[{"subnet":"10.76.0.0/24"}]]}}"#,
    )
    .expect("write config");
    let mut o = options(&bin, &conf, 8);
    o.kill_rate = 1.0;
    o.lose_rate = 1.0;
    let r = soak::run(&o).expect("soak runs");
    assert!(r.lost_pods > 0, "{}", explain(&r));
    let leaks: Vec<_> = r.of_kind(FindingKind::LeakedAddress).collect();
    // Where each kill lands decides which leak a lost pod leaves: a record
    // naming it (killed after host-local wrote it) or an empty record
    // (killed between creating and writing it). What holds for every
    // landing: a leak is found, and each is attributed to a lost pod's
    // killed ADD.
    assert!(!leaks.is_empty(), "{}", explain(&r));
    for f in leaks {
        assert!(
            f.detail.contains("the runtime lost this pod")
                || f.detail.contains("an empty record, left by an ADD killed"),
            "{}",
            f.detail
        );
        assert!(!f.steps.is_empty(), "not attributed: {}", f.detail);
        assert!(
            f.plans.iter().all(|p| p.lost && p.kill_at.is_some()),
            "{}",
            f.detail
        );
    }
}

/// A config of the reference bridge with one of the bash plugins of
/// `tests/broken-plugins` as IPAM, in a /28.
fn own_store(dir: &Path, ipam: &str, net: &str) -> (PathBuf, PathBuf) {
    let conf = dir.join(format!("{net}.conf"));
    std::fs::write(
        &conf,
        serde_json::json!({
            "cniVersion": "1.0.0", "name": net, "type": "bridge", "bridge": format!("{net}0"),
            "isGateway": true,
            "ipam": {"type": ipam, "subnet": "10.97.0.0/28", "routes": [{"dst": "0.0.0.0/0"}]}
        })
        .to_string(),
    )
    .expect("write config");
    (broken_dir_with_reference(), conf)
}

fn broken_dir_with_reference() -> PathBuf {
    assert!(
        Path::new("/usr/lib/cni/bridge").is_file(),
        "the reference plugins are missing: apt-get install containernetworking-plugins"
    );
    PathBuf::from(format!(
        "{}/tests/broken-plugins:/usr/lib/cni",
        env!("CARGO_MANIFEST_DIR")
    ))
}

#[test]
fn a_plugin_with_its_own_store_that_leaks_fails_the_soak() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    let (dir, conf) = own_store(tmp.path(), "leasefile-ipam-forgets", "soakfgt");
    let mut o = options(&dir, &conf, 10);
    o.kill_rate = 0.0;
    let r = soak::run(&o).expect("soak runs");
    assert!(!r.passed(), "{}", explain(&r));
    assert!(r.table().contains("verdict: FAIL"), "{}", explain(&r));
    let leaks: Vec<_> = r.of_kind(FindingKind::LeakedAddress).collect();
    assert!(!leaks.is_empty(), "{}", explain(&r));
    // The /28 holds 13; 3 warm-ups, 2 residents and 10 steps exhaust it
    // although at most 2 + 4 pods are live: the exhaustion is a leak, and
    // each leaked address names the pod that had it.
    assert!(
        leaks.iter().any(|f| f.detail.contains("the range ran out")),
        "{}",
        explain(&r)
    );
    for f in &leaks {
        assert!(!f.container_ids.is_empty(), "unattributed: {}", f.detail);
    }
}

#[test]
fn a_plugin_with_its_own_store_that_releases_passes_the_soak() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    let (dir, conf) = own_store(tmp.path(), "leasefile-ipam", "soakok");
    let mut o = options(&dir, &conf, 10);
    o.kill_rate = 0.0;
    let r = soak::run(&o).expect("soak runs");
    assert!(r.passed(), "{}", explain(&r));
    // Releases were proven by probing, not assumed.
    assert!(
        r.notes.iter().any(|n| n.contains("accounted by probing")),
        "{}",
        explain(&r)
    );
}

#[test]
fn the_duplicate_address_detector_fires() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    let (dir, conf) = own_store(tmp.path(), "same-address-ipam", "soakdup");
    let mut o = options(&dir, &conf, 4);
    o.kill_rate = 0.0;
    let r = soak::run(&o).expect("soak runs");
    assert!(
        r.count(FindingKind::DuplicateAddress) > 0,
        "{}",
        explain(&r)
    );
    let dup = r
        .of_kind(FindingKind::DuplicateAddress)
        .next()
        .expect("duplicate");
    assert!(dup.detail.contains("10.95.0.5"), "{}", dup.detail);
    assert_eq!(
        dup.container_ids.len(),
        2,
        "both pods named: {}",
        dup.detail
    );
}

/// A bridge-style config of a broken plugin of `tests/broken-plugins`, with
/// host-local (or built-in) IPAM in `subnet`.
fn detector_config(
    dir: &Path,
    version: &str,
    plugin: &str,
    subnet: &str,
    host_local: bool,
) -> PathBuf {
    let mut ipam = serde_json::json!({"ranges": [[{"subnet": subnet}]]});
    if host_local {
        ipam["type"] = "host-local".into();
    }
    let conf = dir.join(format!("{plugin}.conf"));
    let text = serde_json::json!({
        "cniVersion": version, "name": format!("soak-{plugin}"), "type": plugin,
        "bridge": format!("sk-{}", &plugin[..plugin.len().min(12)]), "ipam": ipam
    });
    std::fs::write(&conf, text.to_string()).expect("write config");
    conf
}

#[test]
fn the_left_in_pod_netns_detector_fires() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    let conf = detector_config(tmp.path(), "1.0.0", "leaky-del", "10.98.0.0/24", true);
    let mut o = options(&broken_dir_with_reference(), &conf, 12);
    o.kill_rate = 0.0;
    let r = soak::run(&o).expect("soak runs");
    // The seed's plans include plain DELs (with CNI_NETNS); each leaves eth0.
    assert!(r.count(FindingKind::LeftInPodNetns) > 0, "{}", explain(&r));
    assert!(!r.passed());
}

#[test]
fn the_leaked_rule_detector_fires() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    let conf = detector_config(tmp.path(), "1.0.0", "rule-leak", "10.99.0.0/24", true);
    let mut o = options(&broken_dir_with_reference(), &conf, 4);
    o.kill_rate = 0.0;
    let r = soak::run(&o).expect("soak runs");
    // 2 residents + 4 steps each left one rule (the warm-ups' are baseline).
    assert_eq!(r.count(FindingKind::LeakedRule), 6, "{}", explain(&r));
    assert!(!r.passed());
}

#[test]
fn the_live_attachment_broken_detector_fires() {
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    // cnilab-bridge's built-in IPAM (no ipam.type): it speaks 1.1.0 (GC).
    let conf = detector_config(
        tmp.path(),
        "1.1.0",
        "gc-ignores-list",
        "10.100.0.0/24",
        false,
    );
    let dir = format!(
        "{}/tests/broken-plugins:{}",
        env!("CARGO_MANIFEST_DIR"),
        bridge_dir().display()
    );
    let mut o = options(Path::new(&dir), &conf, 6);
    o.kill_rate = 0.0;
    o.gc_every = 3;
    let r = soak::run(&o).expect("soak runs");
    assert!(r.gc_supported && r.gc_runs > 0, "{}", explain(&r));
    assert!(
        r.count(FindingKind::LiveAttachmentBroken) > 0,
        "{}",
        explain(&r)
    );
}

/// Regression test of the defect the soak found: an empty record in the
/// store (what an ADD killed between creating and writing it used to leave)
/// must not hold its address for ever. Records are now written atomically,
/// and an ownerless record is removed under the store lock.
#[test]
fn an_empty_record_is_released() {
    use cnilab_harness::netns::Netns;
    use cnilab_harness::runtime::{GcKey, NetworkConfig, Runtime, RuntimeConf};
    let _soaks = root_soak();
    let tmp = tempfile::tempdir().expect("tmp");
    let mut net = NetworkConfig::load(&bridge_config(tmp.path())).expect("config");
    let data = tmp.path().join("ipam");
    net.set_ipam_data_dir(&data);
    let host = Netns::with_label("host").expect("host netns");
    let pod = Netns::with_label("pod").expect("pod netns");
    let runtime = Runtime::new(&bridge_dir().to_string_lossy())
        .in_netns(&host)
        .expect("runtime");
    let conf = RuntimeConf::new("empty-record", Some(pod.path()), "eth0");
    runtime.add(&net, &conf).expect("ADD");
    let store = net.ipam_store_dir().expect("store dir");
    let empty = store.join("10.77.0.200");
    std::fs::write(&empty, "").expect("plant an empty record");
    runtime.del(&net, &conf).expect("DEL");
    runtime.gc(&net, &[], GcKey::Both).expect("GC");
    assert!(
        !empty.exists(),
        "{} survived DEL and GC: ownerless records must be released",
        empty.display()
    );
}
