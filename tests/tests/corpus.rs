//! Every hostile input of `tests/corpus/` against the built `cnilab-bridge`,
//! inside throwaway namespaces: each gets its documented code as a JSON
//! error body on stdout, a non-zero exit, no panic, no signal, no timeout,
//! and leaves the host namespace (links, addresses, routes, firewall), the
//! pod namespace and the whole scratch tree (the IPAM store included)
//! exactly as they were.
//!
//! Cases marked `known_defect` are reported, not failed; once the plugin
//! handles one as documented, the test fails so that the marker goes.

use cnilab_harness::netns::Netns;
use cnilab_harness::soak::corpus::{self, CaseRun, Expect, Venue};
use cnilab_tests::{host_untouched, invoke, require_root, workspace_bin, Call};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

fn base_config(data_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.1.0",
        "name": "corpus",
        "type": "cnilab-bridge",
        "bridge": "corpus0",
        "isDefaultGateway": true,
        "ipMasq": true,
        "ipam": {"ranges": [[{"subnet": "10.66.0.0/24"}]], "dataDir": data_dir},
    })
}

fn first<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn every_corpus_input_is_refused_with_its_code_and_changes_nothing() {
    let _host = host_untouched();
    require_root();
    let plugin = workspace_bin("cnilab-bridge");
    let cases = corpus::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"))
        .expect("corpus loads");
    assert!(
        cases.len() >= 60,
        "the corpus has only {} cases",
        cases.len()
    );

    let scratch = tempfile::tempdir().expect("scratch");
    let data_dir = scratch.path().join("state").join("ipam");
    let a_file = scratch.path().join("a-regular-file");
    std::fs::write(&a_file, "not a directory, not a namespace\n").expect("write");
    let host = Netns::with_label("host").expect("host netns");
    let pod = Netns::with_label("pod").expect("pod netns");
    let base = base_config(&data_dir);
    // One good ADD/DEL first: the bridge, the store directory and the
    // masquerade table exist on any node where the plugin ever ran, and a
    // bad input must not change them either.
    let call = |command: &'static str, conf: &Value| {
        invoke(
            &host,
            &plugin,
            &Call {
                command,
                container_id: "corpus-warmup",
                netns: Some(pod.path()),
                ifname: "eth0",
            },
            conf,
        )
    };
    let added = call("ADD", &base);
    assert!(
        added.status.success(),
        "warm-up ADD: {}",
        String::from_utf8_lossy(&added.stdout)
    );
    let deleted = call("DEL", &base);
    assert!(
        deleted.status.success(),
        "warm-up DEL: {}",
        String::from_utf8_lossy(&deleted.stdout)
    );

    let cni_path = plugin
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let venue = Venue {
        host: &host,
        pod: &pod,
        plugin: &plugin,
        cni_path,
        base: &base,
        data_dir: &data_dir,
        a_file: &a_file,
        watched: scratch.path(),
        timeout: Duration::from_secs(20),
    };

    let mut failed: Vec<(String, CaseRun)> = Vec::new();
    let mut still_defective = Vec::new();
    let mut fixed = Vec::new();
    for case in &cases {
        let run = corpus::run_case(case, &venue, Expect::Documented).expect("case runs");
        if run.exec.exit_code == Some(0) && case.command == "ADD" {
            // Accepted by mistake: undo it so the next cases start clean.
            let id = first(&run.exec.env, "CNI_CONTAINERID")
                .unwrap_or("corpus-case")
                .to_string();
            let ifname = first(&run.exec.env, "CNI_IFNAME")
                .unwrap_or("eth0")
                .to_string();
            let _ = invoke(
                &host,
                &plugin,
                &Call {
                    command: "DEL",
                    container_id: &id,
                    netns: Some(pod.path()),
                    ifname: &ifname,
                },
                &base,
            );
        }
        match (&case.known_defect, run.passed()) {
            (None, true) => {}
            (None, false) => failed.push((case.name.clone(), run)),
            (Some(why), false) => still_defective.push(format!("{}: {why}", case.name)),
            (Some(_), true) => fixed.push(case.name.clone()),
        }
    }
    for d in &still_defective {
        eprintln!("KNOWN DEFECT (not failed): {d}");
    }
    let mut report = String::new();
    for (name, run) in &failed {
        report.push_str(&format!(
            "\n{name}: {}\n  exit {:?} signal {:?} stdout {:?}\n  stderr {:?}\n",
            run.problems.join("; "),
            run.exec.exit_code,
            run.exec.signal,
            run.exec.stdout.chars().take(400).collect::<String>(),
            run.exec.stderr.chars().take(400).collect::<String>()
        ));
    }
    assert!(
        failed.is_empty(),
        "{} of {} corpus cases failed:{report}",
        failed.len(),
        cases.len()
    );
    assert!(
        fixed.is_empty(),
        "these cases are marked known_defect but now pass: remove the marker from {fixed:?}"
    );
}
