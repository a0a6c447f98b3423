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

/// The tests of this file one at a time: a child's peak memory starts from
/// its parent's, this process's, which a test running beside the memory
/// test would raise between two of its measurements.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

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
    let _serial = one_at_a_time();
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

/// One hostile capture of `tests/corpus/captures/`: a real capture (the
/// Calico node of `lab/scenarios/captures/calico-proxy-arp-off`) with
/// `set` (JSON pointer → value) and `patch` (RFC 7396) applied, or `text`
/// as the whole file, or a `generate`d one (`oversize`, `deep-node`,
/// `deep-kind`, `invalid-utf8`); `says`: what the error must name (the
/// field, and why).
struct CaptureCase {
    description: String,
    set: serde_json::Map<String, Value>,
    patch: Option<Value>,
    text: Option<String>,
    generate: Option<String>,
    says: Vec<String>,
}

impl CaptureCase {
    /// A case file; an unknown key is refused (a typo would test nothing).
    fn parse(v: &Value) -> Result<CaptureCase, String> {
        let known = ["description", "set", "patch", "text", "generate", "says"];
        let map = v.as_object().ok_or("not an object")?;
        if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(format!("unknown key {k}"));
        }
        let text = |k: &str| map.get(k).and_then(Value::as_str).map(String::from);
        Ok(CaptureCase {
            description: text("description").ok_or("no description")?,
            set: map
                .get("set")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            patch: map.get("patch").cloned(),
            text: text("text"),
            generate: text("generate"),
            says: map
                .get("says")
                .and_then(Value::as_array)
                .ok_or("no says")?
                .iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect(),
        })
    }
}

fn capture_base() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/scenarios/captures/calico-proxy-arp-off")
}

/// `value` at `pointer`, the last step added when missing.
fn set_at(v: &mut Value, pointer: &str, value: Value) {
    let (parent, last) = pointer.rsplit_once('/').expect("a JSON pointer");
    let last = last.replace("~1", "/").replace("~0", "~");
    match v.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.insert(last, value);
        }
        Some(Value::Array(a)) => {
            let i: usize = last.parse().expect("an index");
            a[i] = value;
        }
        other => panic!("{pointer}: no object or array at {parent}: {other:?}"),
    }
}

/// The bytes of the case's capture file.
fn capture_bytes(case: &CaptureCase) -> Vec<u8> {
    let base = std::fs::read_to_string(capture_base().join("node1.json")).expect("base capture");
    if let Some(text) = &case.text {
        return text.clone().into_bytes();
    }
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    match case.generate.as_deref() {
        Some("oversize") => return Vec::new(),
        Some("deep-node") => {
            return base
                .replacen(
                    "\"node\": {",
                    &format!("\"node\": {{\"rules\": {nested}, "),
                    1,
                )
                .into_bytes()
        }
        Some("deep-kind") => {
            return base
                .replacen("\"kind\": \"veth\"", &format!("\"kind\": {nested}"), 1)
                .into_bytes()
        }
        Some("invalid-utf8") => {
            let mut bytes = base.replacen("cali10f00d", "cali\u{1}", 1).into_bytes();
            let at = bytes.iter().position(|b| *b == 1).expect("marker");
            bytes[at] = 0xff;
            return bytes;
        }
        Some(other) => panic!("unknown generate {other}"),
        None => {}
    }
    let mut v: Value = serde_json::from_str(&base).expect("base JSON");
    for (pointer, value) in &case.set {
        set_at(&mut v, pointer, value.clone());
    }
    if let Some(p) = &case.patch {
        corpus::merge_patch(&mut v, p);
    }
    serde_json::to_vec_pretty(&v).expect("JSON")
}

/// Every hostile capture of `tests/corpus/captures/` given to `cnilab lab
/// up --capture` (beside a good second node, so that a capture let through
/// would be built): exit 2, a message naming the file and the field, no
/// control character of the file on the terminal, no namespace or run
/// directory of the lab, the host as it was.
#[test]
fn every_hostile_capture_is_refused_naming_the_field_and_changes_nothing() {
    let _serial = one_at_a_time();
    let _host = host_untouched();
    require_root();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/captures");
    let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .expect("corpus/captures")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    assert!(names.len() >= 40, "only {} hostile captures", names.len());
    let scratch = tempfile::tempdir().expect("scratch");
    let second = capture_base().join("node2.json").display().to_string();
    let lab = format!("hc{}", std::process::id() % 100_000);
    let mut failed = Vec::new();
    for path in &names {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("case"))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let case = CaptureCase::parse(&v).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!case.description.is_empty(), "{stem}: no description");
        let file = scratch.path().join(format!("{stem}.json"));
        let f = std::fs::File::create(&file).expect("create");
        if case.generate.as_deref() == Some("oversize") {
            // Sparse: one byte over the limit, nothing written.
            let limit = cnilab_harness::capture::MAX_BYTES;
            f.set_len(limit + 1).expect("set_len");
        } else {
            std::fs::write(&file, capture_bytes(&case)).expect("write");
        }
        let shown = file.display().to_string();
        let out =
            cnilab_tests::cnilab(&["lab", "up", "--name", &lab, "--capture", &shown, &second]);
        let all = cnilab_tests::output_text(&out);
        let mut problems = Vec::new();
        if out.status.code() != Some(2) {
            problems.push(format!("exit {:?}", out.status.code()));
        }
        for s in case.says.iter().chain([&shown]) {
            if !all.contains(s.as_str()) {
                problems.push(format!("does not say {s:?}"));
            }
        }
        let raw = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
        if raw.iter().any(|b| *b == 0x1b || *b == 0x07 || *b == 0) {
            problems.push("a control character reached the terminal".into());
        }
        let prefix = format!("cnilab-lab-{lab}-");
        let left: Vec<String> = std::fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default();
        if !left.is_empty() {
            problems.push(format!("left namespaces {left:?}"));
            let _ = cnilab_tests::cnilab(&["lab", "down", "--name", &lab]);
        }
        if Path::new(&format!("/run/cnilab/labs/{lab}")).exists() {
            problems.push("left its run directory".into());
        }
        if !problems.is_empty() {
            failed.push(format!("{stem}: {}\n  {}", problems.join("; "), all.trim()));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} hostile captures:\n{}",
        failed.len(),
        names.len(),
        failed.join("\n")
    );
}

/// `cnilab ARGS`' exit code and peak resident memory in KiB (`wait4` of
/// that one child: other tests' children do not count).
// The child is reaped by wait4, which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn exit_and_peak_kib(args: &[&str]) -> (i32, i64) {
    let child = std::process::Command::new(workspace_bin("cnilab"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("cnilab runs");
    let pid = i32::try_from(child.id()).expect("pid");
    let mut status = 0;
    // SAFETY: wait4(2) fills the zeroed struct and the status it is given.
    let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { nix::libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4");
    assert!(nix::libc::WIFEXITED(status), "cnilab died: {status}");
    (nix::libc::WEXITSTATUS(status), usage.ru_maxrss)
}

/// `path` made of `head`, `item` repeated until `size` bytes, `tail`,
/// written in chunks (the test's own memory stays small: a child's peak
/// starts from its parent's).
fn write_repeated(path: &Path, (head, item, tail): (&str, &str, &str), size: usize) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    f.write_all(head.as_bytes()).expect("write");
    let chunk = item.repeat((1 << 16) / item.len().max(1));
    let mut written = head.len();
    while written + chunk.len() + tail.len() <= size {
        f.write_all(chunk.as_bytes()).expect("write");
        written += chunk.len();
    }
    while written + item.len() + tail.len() <= size {
        f.write_all(item.as_bytes()).expect("write");
        written += item.len();
    }
    f.write_all(tail.as_bytes()).expect("write");
    f.flush().expect("flush");
}

/// A junk capture is refused in little memory: one byte over the 64 MiB
/// limit (real bytes) is refused from its size, and 24 MB of small JSON
/// objects under `node` (which serde's `flatten` once buffered at ~40
/// times their size: 2 GiB for 50 MB) is skipped as it streams by. Each
/// `lab up --capture` exits 2, and its peak resident memory grows by less
/// than an eighth of the file's size over the peak of refusing a file of
/// a few bytes (`wait4`'s `ru_maxrss`, which starts from the test
/// process's own, so both figures carry the same start).
#[test]
fn a_junk_capture_is_refused_in_little_memory() {
    let _serial = one_at_a_time();
    require_root();
    let dir = tempfile::tempdir().expect("dir");
    let lab = format!("mem{}", std::process::id() % 100_000);
    let small = dir.path().join("small.json");
    std::fs::write(&small, "[]").expect("write");
    let over = dir.path().join("over.json");
    let limit = usize::try_from(cnilab_harness::capture::MAX_BYTES).expect("size");
    write_repeated(&over, ("", "x", ""), limit + 1);
    let objects = dir.path().join("objects.json");
    let parts = (
        "{\"schemaVersion\":1,\"node\":{\"name\":\"n\",\"junk\":[",
        "{\"a\":1},",
        "{}]}}",
    );
    write_repeated(&objects, parts, 24_000_000);
    let up = |file: &Path| {
        let shown = file.display().to_string();
        exit_and_peak_kib(&["lab", "up", "--name", &lab, "--capture", &shown])
    };
    let (code, base) = up(&small);
    assert_eq!(code, 2);
    for file in [&over, &objects] {
        let size_kib =
            i64::try_from(std::fs::metadata(file).expect("size").len() / 1024).expect("size");
        let (code, peak) = up(file);
        eprintln!(
            "{}: {size_kib} KiB, exit {code}, peak {peak} KiB (a 2-byte file: {base} KiB)",
            file.display()
        );
        assert_eq!(code, 2, "{}", file.display());
        assert!(
            peak - base < size_kib / 8,
            "{}: peak {peak} KiB, {base} KiB for a 2-byte file, for a {size_kib} KiB file",
            file.display()
        );
    }
}
