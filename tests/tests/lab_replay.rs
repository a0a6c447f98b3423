//! Replay (root): `cnilab lab up --capture FILE...` stands up captured
//! nodes as a lab. For every topology in `lab/topologies/` (direct
//! runtime), capturing each node of a standing lab, replaying the captures
//! and capturing again gives the same captures (ifindexes, lab names and
//! the peers' netnsids normalised; MACs are replayed as captured); bad
//! captures exit 2 with the file and object named and leave no namespace;
//! a fault of a scenario, captured and replayed, fails the same check
//! groups with the same diagnosis ids.

use cnilab_harness::lab::model::{identity, LabModel, Node};
use cnilab_tests::{cnilab, host_untouched, output_text, require_root};
use rstest::rstest;
use std::path::{Path, PathBuf};

/// A standing lab taken down when dropped (also after a failed assert).
struct Up(String);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = cnilab(&["lab", "down", "--name", &self.0]);
    }
}

fn up(name: &str, args: &[&str]) -> Up {
    let mut all = vec!["lab", "up", "--name", name];
    all.extend_from_slice(args);
    let out = cnilab(&all);
    let lab = Up(name.to_string());
    assert!(
        out.status.success(),
        "lab up {args:?}: {}",
        output_text(&out)
    );
    lab
}

/// `cnilab capture` of node `node` of lab `lab` into `dir/<node>.json`.
fn capture(lab: &str, node: &str, dir: &Path) -> PathBuf {
    let file = dir.join(format!("{node}.json"));
    let ns = format!("cnilab-lab-{lab}-{node}");
    let out = cnilab(&[
        "capture",
        "--netns",
        &ns,
        "--node-name",
        node,
        "-o",
        &file.display().to_string(),
    ]);
    assert!(out.status.success(), "capture {ns}: {}", output_text(&out));
    file
}

/// Digits after `marker` become `N` (ifindexes, netnsids).
fn forget_numbers(text: &str, marker: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(marker) {
        out.push_str(&rest[..i + marker.len()]);
        rest = rest[i + marker.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
        out.push('N');
    }
    out.push_str(rest);
    out
}

/// A captured node as comparable text: nftables tables as nft prints them
/// after loading, the lab's name, ifindexes and netnsids forgotten.
fn normalised(file: &Path, lab: &str) -> String {
    let text = std::fs::read_to_string(file).expect("capture file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let node: Node = serde_json::from_value(v["node"].clone()).expect("node");
    let model = LabModel {
        schema_version: 1,
        name: lab.into(),
        underlay: Vec::new(),
        nodes: vec![node],
    };
    let canonical = identity::expected(&model, &model).expect("nft canonical");
    let text = serde_json::to_string_pretty(&canonical.nodes[0]).expect("json");
    let text = text.replace(&format!("cnilab-lab-{lab}-"), "");
    forget_numbers(&forget_numbers(&text, "netnsid "), "\"#")
}

fn name_for(path: &Path, role: &str) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let h: u32 = stem.bytes().map(u32::from).sum::<u32>() % 10_000;
    format!("{role}{h}-{}", std::process::id() % 100_000)
}

#[rstest]
fn a_replayed_lab_captures_as_the_captured_one(#[files("../lab/topologies/*.toml")] path: PathBuf) {
    let _host = host_untouched();
    require_root();
    let topo = cnilab_harness::lab::Topology::load(&path).expect("topology");
    let (src, rep) = (name_for(&path, "rs"), name_for(&path, "rr"));
    let _src = up(&src, &["--topology", &path.display().to_string()]);
    let dir = tempfile::tempdir().expect("dir");
    let first = dir.path().join("first");
    let again = dir.path().join("again");
    std::fs::create_dir_all(&first).expect("dir");
    std::fs::create_dir_all(&again).expect("dir");
    let files: Vec<PathBuf> = topo
        .nodes
        .iter()
        .map(|n| capture(&src, &n.name, &first))
        .collect();
    let mut args: Vec<String> = vec!["--capture".into()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _rep = up(&rep, &args);
    for (n, f) in topo.nodes.iter().zip(&files) {
        let back = capture(&rep, &n.name, &again);
        let (a, b) = (normalised(f, &src), normalised(&back, &rep));
        if a != b {
            let (al, bl): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
            let diff: Vec<String> = al
                .iter()
                .filter(|l| !bl.contains(l))
                .map(|l| format!("- {l}"))
                .chain(
                    bl.iter()
                        .filter(|l| !al.contains(l))
                        .map(|l| format!("+ {l}")),
                )
                .take(30)
                .collect();
            panic!(
                "{}: node {}: the replay captures differently:\n{}",
                path.display(),
                n.name,
                diff.join("\n")
            );
        }
    }
}

/// The namespaces of lab `name`.
fn namespaces_of(name: &str) -> Vec<String> {
    let prefix = format!("cnilab-lab-{name}-");
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Each bad capture: exit 2, a message naming the file and the object,
/// and no namespace of the replayed lab left.
#[test]
fn bad_captures_are_refused_naming_the_file_and_object() {
    let _host = host_untouched();
    require_root();
    let src = format!("rbad{}", std::process::id() % 100_000);
    let rep = format!("rbr{}", std::process::id() % 100_000);
    let _src = up(&src, &["--nodes", "2", "--pods-per-node", "1"]);
    let dir = tempfile::tempdir().expect("dir");
    let n1 = capture(&src, "node1", dir.path());
    let n2 = capture(&src, "node2", dir.path());
    let text = std::fs::read_to_string(&n1).expect("read");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let write = |name: &str, v: &serde_json::Value| {
        let p = dir.path().join(name);
        std::fs::write(&p, serde_json::to_string(v).expect("json")).expect("write");
        p
    };
    let mut newer = v.clone();
    newer["schemaVersion"] = 99.into();
    let newer = write("newer.json", &newer);
    let truncated = dir.path().join("truncated.json");
    std::fs::write(&truncated, &text[..text.len() / 2]).expect("write");
    let mut same_address = v.clone();
    same_address["node"]["name"] = "node9".into();
    let same_address = write("same-address.json", &same_address);
    let mut bad_name = v.clone();
    bad_name["node"]["name"] = "../evil".into();
    let bad_name = write("bad-name.json", &bad_name);
    let mut no_dev = v.clone();
    let routes = no_dev["node"]["routes"].as_array_mut().expect("routes");
    routes[0]["dev"] = "eth9".into();
    let no_dev = write("no-dev.json", &no_dev);
    let mut bad_nft = v.clone();
    bad_nft["node"]["nftables"] = serde_json::json!([{"family": "inet", "name": "broken", "text": "table inet broken {\nchain c {\nnot a rule\n}\n}"}]);
    let bad_nft = write("bad-nft.json", &bad_nft);
    let p = |f: &Path| f.display().to_string();
    let cases: Vec<(Vec<String>, Vec<String>)> = vec![
        (
            vec![p(&newer), p(&n2)],
            vec![p(&newer), "schemaVersion 99 is newer".into()],
        ),
        (
            vec![p(&truncated)],
            vec![p(&truncated), "line".into(), "column".into()],
        ),
        (
            vec![p(&n1), p(&n1)],
            vec![p(&n1), "node node1 is also the node of".into()],
        ),
        (
            vec![p(&n1), p(&same_address)],
            vec![p(&same_address), "10.250.0.1 is also node node1's".into()],
        ),
        (
            vec![p(&bad_name), p(&n2)],
            vec![p(&bad_name), "node name \"../evil\"".into()],
        ),
        (
            vec![p(&no_dev), p(&n2)],
            vec![p(&no_dev), "node1: route".into(), "eth9".into()],
        ),
        (
            vec![p(&bad_nft), p(&n2)],
            vec![
                p(&bad_nft),
                "node1: nftables table inet broken: nft refused it".into(),
            ],
        ),
    ];
    for (files, says) in cases {
        let mut args = vec!["lab", "up", "--name", &rep, "--capture"];
        args.extend(files.iter().map(String::as_str));
        let out = cnilab(&args);
        let all = output_text(&out);
        assert_eq!(out.status.code(), Some(2), "{files:?}: {all}");
        for s in &says {
            assert!(all.contains(s.as_str()), "{files:?}: no {s:?} in: {all}");
        }
        assert_eq!(
            namespaces_of(&rep),
            Vec::<String>::new(),
            "{files:?}: left behind"
        );
        assert!(
            !Path::new(&format!("/run/cnilab/labs/{rep}")).exists(),
            "{files:?}: the run dir is left"
        );
    }
}

/// Failing groups and diagnosis ids of `lab check --name NAME`.
fn verdict(name: &str) -> (Vec<String>, Vec<String>) {
    let out = cnilab(&[
        "lab",
        "check",
        "--name",
        name,
        "--only",
        "pod-to-pod,node-to-pod,pod-to-node",
        "-o",
        "json",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", output_text(&out)));
    let mut failing: Vec<String> = r["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["passed"] != g["probes"])
        .filter_map(|g| g["name"].as_str().map(str::to_string))
        .collect();
    let mut ids: Vec<String> = r["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_str().map(str::to_string))
        .collect();
    failing.sort();
    ids.sort();
    ids.dedup();
    (failing, ids)
}

/// Two scenarios' faults (`ip-forward-off` on node2, `delete-route` of
/// node2's pods on node1), made in a standing lab, captured and replayed:
/// the replay fails the same groups with the same diagnosis ids.
#[rstest]
#[case::ip_forward_off("node2", &["sysctl", "-qw", "net.ipv4.ip_forward=0"], "ip-forward-off")]
#[case::missing_route("node1", &["ip", "route", "del", "10.244.2.0/24"], "missing-route")]
fn a_replayed_fault_gets_the_same_verdict(
    #[case] node: &str,
    #[case] fault: &[&str],
    #[case] id: &str,
) {
    let _host = host_untouched();
    require_root();
    let tag: String = id.chars().take(3).collect();
    let src = format!("rfs{tag}-{}", std::process::id() % 100_000);
    let rep = format!("rfr{tag}-{}", std::process::id() % 100_000);
    let _src = up(&src, &["--nodes", "2", "--pods-per-node", "1"]);
    let ns = format!("cnilab-lab-{src}-{node}");
    let mut cmd = vec!["netns", "exec", ns.as_str()];
    cmd.extend_from_slice(fault);
    let made = std::process::Command::new("ip")
        .args(&cmd)
        .output()
        .expect("ip");
    assert!(made.status.success(), "{}", output_text(&made));
    let live = verdict(&src);
    assert!(live.1.contains(&id.to_string()), "the live lab: {live:?}");
    let dir = tempfile::tempdir().expect("dir");
    let files = [
        capture(&src, "node1", dir.path()),
        capture(&src, "node2", dir.path()),
    ];
    let (f1, f2) = (
        files[0].display().to_string(),
        files[1].display().to_string(),
    );
    let _rep = up(&rep, &["--capture", &f1, &f2]);
    assert_eq!(
        verdict(&rep),
        live,
        "replayed vs live (failing groups, diagnosis ids)"
    );
}

/// The figure (not a timed test): `lab up --capture` of 3 nodes with 110
/// pods each, captured from a standing lab. `cargo test -p cnilab-tests
/// --test lab_replay bench_replay_of_3_nodes_by_110_pods -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_replay_of_3_nodes_by_110_pods() {
    let _host = host_untouched();
    require_root();
    let src = format!("rbs{}", std::process::id() % 100_000);
    let rep = format!("rbr{}", std::process::id() % 100_000);
    let _src = up(&src, &["--nodes", "3", "--pods-per-node", "110"]);
    let dir = tempfile::tempdir().expect("dir");
    let files: Vec<String> = ["node1", "node2", "node3"]
        .iter()
        .map(|n| capture(&src, n, dir.path()).display().to_string())
        .collect();
    let mut args = vec!["lab", "up", "--name", &rep, "--capture"];
    args.extend(files.iter().map(String::as_str));
    let started = std::time::Instant::now();
    let out = cnilab(&args);
    let took = started.elapsed();
    let _rep = Up(rep.clone());
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("3 nodes, 330 pods"),
        "{}",
        output_text(&out)
    );
    println!(
        "lab up --capture of 3 nodes x 110 pods: {:.2} s",
        took.as_secs_f64()
    );
}
