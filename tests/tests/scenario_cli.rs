//! Root tests of `cnilab scenario run` with a plugin of one's own
//! (`--plugin-dir` + `--config TEMPLATE`, here the reference ptp): the
//! scenario replays, one that cannot apply to the plugin is SKIP with the
//! reason, a setup error is exit 2 with its reason in the table, and the
//! step lines (with the diagnoses' text) are on stdout.

use cnilab_tests::{host_untouched, require_root, workspace_bin};
use std::path::Path;
use std::process::Output;

const PTP: [&str; 4] = [
    "--plugin-dir",
    "/usr/lib/cni",
    "--config",
    "lab/configs/lab-ptp.conflist.tmpl",
];

fn scenario_run(args: &[&str]) -> Output {
    require_root();
    let _host = host_untouched();
    std::process::Command::new(workspace_bin("cnilab"))
        .args(["scenario", "run"])
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("cnilab runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn all(out: &Output) -> String {
    format!("{}{}", stdout(out), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn scenario_replays_with_your_own_plugin_and_template() {
    let out = scenario_run(&[&["missing-route"][..], &PTP].concat());
    assert_eq!(out.status.code(), Some(0), "{}", all(&out));
    let text = stdout(&out);
    // The step lines are on stdout, with what the diagnosis says.
    assert!(
        text.contains("step 3: check, expect fail with missing-route"),
        "{text}"
    );
    assert!(
        text.contains("missing-route: node1 has no route to 10.244.2.0/24"),
        "{text}"
    );
    assert!(text.contains("PASS scenario missing-route"), "{text}");
}

#[test]
fn scenario_that_cannot_apply_to_the_plugin_is_skip_with_the_reason() {
    let out = scenario_run(&[&["hairpin-off"][..], &PTP].concat());
    assert_eq!(out.status.code(), Some(3), "{}", all(&out));
    let text = stdout(&out);
    assert!(
        text.lines()
            .any(|l| l.contains("SKIP scenario hairpin-off") && l.contains("bridge port")),
        "{text}"
    );
}

#[test]
fn scenario_setup_error_is_exit_2_with_its_reason_in_the_table_and_json() {
    // The reference plugins without a template: the default template names
    // cnilab-bridge, which /usr/lib/cni does not have.
    let out = scenario_run(&["missing-route", "--plugin-dir", "/usr/lib/cni"]);
    assert_eq!(out.status.code(), Some(2), "{}", all(&out));
    let text = stdout(&out);
    assert!(
        text.lines()
            .any(|l| l.contains("ERROR scenario missing-route") && l.contains("--config TEMPLATE")),
        "{text}"
    );
    let out = scenario_run(&[
        "missing-route",
        "--plugin-dir",
        "/usr/lib/cni",
        "-o",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", all(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let s = &v["scenarios"][0];
    assert_eq!(s["outcome"], "error", "{v}");
    assert!(
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cnilab-bridge")),
        "{v}"
    );
}

/// A template that is not JSON once filled in is refused before anything is
/// built, naming the user's file and line (not the runtime copy under
/// /run/cnilab), by `lab run` and `scenario run` alike.
#[test]
fn a_malformed_template_is_named_with_its_line_before_anything_is_built() {
    require_root();
    let _host = host_untouched();
    let dir = tempfile::tempdir().expect("tmp");
    let good = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/configs/lab-ptp.conflist.tmpl"),
    )
    .expect("ptp template");
    let line = 1 + good[..good.find("\"cniVersion\"").expect("cniVersion")]
        .matches('\n')
        .count();
    let bad = dir.path().join("mine.tmpl");
    std::fs::write(&bad, good.replacen("\"cniVersion\"", "cniVersion\"", 1)).expect("write");
    let bad = bad.to_str().expect("utf8");
    for args in [
        vec![
            "lab",
            "run",
            "--plugin-dir",
            "/usr/lib/cni",
            "--config",
            bad,
        ],
        vec![
            "scenario",
            "run",
            "missing-route",
            "--plugin-dir",
            "/usr/lib/cni",
            "--config",
            bad,
        ],
    ] {
        let out = std::process::Command::new(workspace_bin("cnilab"))
            .args(&args)
            .output()
            .expect("cnilab runs");
        let text = all(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(
            text.contains(&format!("{bad}: line {line} column")),
            "{args:?}: {text}"
        );
        assert!(!text.contains("/run/cnilab/"), "{args:?}: {text}");
        assert!(!text.contains("🔭"), "nothing is built: {text}");
    }
}

/// `--keep NAME` keeps one scenario's faulted lab: given two scenarios or a
/// bad name it says what was wrong, exits 2 and makes no lab.
#[test]
fn keep_needs_one_scenario_and_a_lab_name() {
    let name = format!("kp{}", std::process::id() % 100_000);
    let cases: [(&[&str], &str); 2] = [
        (
            &["missing-route", "stale-route", "--keep", &name],
            "keeps one scenario's lab, and 2 scenarios were given",
        ),
        (&["missing-route", "--keep", "../x"], "--keep ../x"),
    ];
    for (args, says) in cases {
        let out = scenario_run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", all(&out));
        assert!(all(&out).contains(says), "{args:?}: {}", all(&out));
        assert!(
            !Path::new(&format!("/run/cnilab/labs/{name}")).exists(),
            "{args:?}: a lab was made"
        );
    }
}
