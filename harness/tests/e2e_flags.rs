//! Every command line the `cnilab e2e` dry-run plans print is one the
//! pinned tools accept: checked against lab/e2e-flags.toml, the table of
//! each tool's subcommands and flags as read in its source at the pinned
//! tag. Covers kind and minikube, every IP family, with and without
//! `--config`, `--cni-manifest`, `--image-archive` and `--workers`, and
//! every step of `e2e vagrant` (the vagrant commands its plans run through
//! lab/vagrant/env.sh).
//! `e2e capture` through kind, minikube and a pod per node.

mod common;

use common::e2e::{dry_run, repo_root, FLANNEL};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tool {
    repo: String,
    versions: Vec<String>,
    global_source: Vec<String>,
    global_value: Vec<String>,
    global_bool: Vec<String>,
    command: Vec<ToolCommand>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Passthrough {
    AfterArgs(usize),
    AfterMarker(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCommand {
    path: Vec<String>,
    source: Vec<String>,
    value: Vec<String>,
    bool: Vec<String>,
    args: Option<[i64; 2]>,
    passthrough: Option<Passthrough>,
    #[serde(default)]
    values: BTreeMap<String, Vec<String>>,
}

fn table() -> BTreeMap<String, Tool> {
    let path = repo_root().join("lab/e2e-flags.toml");
    let text = std::fs::read_to_string(&path).expect("lab/e2e-flags.toml");
    let tools: BTreeMap<String, Tool> = toml::from_str(&text).expect("the flag table parses");
    for (name, tool) in &tools {
        assert!(
            !tool.repo.is_empty() && !tool.versions.is_empty(),
            "{name}: repo and versions name the source"
        );
        for c in &tool.command {
            assert!(!c.source.is_empty(), "{name} {:?}: no source", c.path);
        }
        if !tool.global_value.is_empty() || !tool.global_bool.is_empty() {
            assert!(
                !tool.global_source.is_empty(),
                "{name}: global flags without a source"
            );
        }
    }
    tools
}

/// Splits a dry-run line into words, undoing `report::quote` (single
/// quotes, `'\''` for a quote inside).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            ' ' => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

#[test]
fn words_undo_the_quoting() {
    assert_eq!(
        words(r"docker exec n sh -c 'for f in a; do echo '\''x'\''; done' > d/f.txt"),
        [
            "docker",
            "exec",
            "n",
            "sh",
            "-c",
            "for f in a; do echo 'x'; done",
            ">",
            "d/f.txt"
        ]
    );
    assert_eq!(words("a ''"), ["a", ""]);
}

/// What one command line uses: its subcommand, flags and positionals.
#[derive(Debug)]
struct Use {
    tool: String,
    path: Vec<String>,
}

/// Checks one printed command against the table; returns what it used.
fn check_line(tools: &BTreeMap<String, Tool>, line: &str) -> Result<Use, String> {
    let mut w = words(line);
    // `> file` is the driver's capture, not an argument.
    if let Some(i) = w.iter().position(|x| x == ">") {
        w.truncate(i);
    }
    check_words(tools, w)
}

/// `bash lab/vagrant/SCRIPT ...`: cnilab's own scripts, which must exist
/// and are called as their headers say; `env.sh exec NS CMD...` runs CMD
/// in the run's namespace, and CMD is checked against the table.
fn own_script(tools: &BTreeMap<String, Tool>, w: &[String]) -> Result<Use, String> {
    let script = w.first().ok_or("bash without a script")?;
    let name = script.trim_start_matches("./");
    if !repo_root().join(name).is_file() {
        return Err(format!("bash {script}: no such script in the checkout"));
    }
    let verb = w.get(1).map(String::as_str);
    let ok = match (name, verb) {
        ("lab/vagrant/env.sh", Some("exec")) if w.len() > 3 => {
            return check_words(tools, w[3..].to_vec())
        }
        ("lab/vagrant/env.sh", Some("up" | "down")) => w.len() == 3,
        ("lab/vagrant/build-box.sh", Some("--link")) => w.len() == 3,
        ("lab/vagrant/build-box.sh", None | Some("--print")) => w.len() <= 2,
        _ => false,
    };
    if !ok {
        return Err(format!(
            "bash {}: not a usage its header documents",
            w.join(" ")
        ));
    }
    Ok(Use {
        tool: "bash".into(),
        path: vec![name.to_string()],
    })
}

fn check_words(tools: &BTreeMap<String, Tool>, w: Vec<String>) -> Result<Use, String> {
    let mut rest = w.into_iter().skip_while(|x| {
        x.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_')
        })
    });
    let tool_name = rest.next().ok_or("empty command")?;
    if tool_name == "bash" {
        return own_script(tools, &rest.collect::<Vec<_>>());
    }
    let tool = tools
        .get(&tool_name)
        .ok_or_else(|| format!("{tool_name} is not in lab/e2e-flags.toml"))?;
    let rest: Vec<String> = rest.collect();
    let mut path: Vec<String> = Vec::new();
    let mut command: Option<&ToolCommand> = None;
    let mut positionals = 0i64;
    let mut i = 0;
    while i < rest.len() {
        let word = &rest[i];
        i += 1;
        if let Some(Passthrough::AfterMarker(m)) = command.and_then(|c| c.passthrough.as_ref()) {
            if word == m {
                break;
            }
        }
        if word.starts_with('-') && word.len() > 1 {
            let (name, inline) = match word.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (word.clone(), None),
            };
            let in_list = |l: &[String]| l.contains(&name);
            let takes_value =
                in_list(&tool.global_value) || command.is_some_and(|c| in_list(&c.value));
            let is_bool = in_list(&tool.global_bool) || command.is_some_and(|c| in_list(&c.bool));
            if !takes_value && !is_bool {
                return Err(format!(
                    "{tool_name} {}: flag {name} is not accepted{}",
                    path.join(" "),
                    if command.is_none() {
                        " before the subcommand"
                    } else {
                        ""
                    }
                ));
            }
            if takes_value {
                let value = match inline {
                    Some(v) => v,
                    None => {
                        let v = rest.get(i).cloned().ok_or(format!("{name} has no value"))?;
                        i += 1;
                        v
                    }
                };
                if let Some(allowed) = command.and_then(|c| c.values.get(&name)) {
                    for part in value.split(',') {
                        if !allowed.iter().any(|a| a == part) {
                            return Err(format!(
                                "{tool_name} {}: {name}={value}: {part} is not one of {allowed:?}",
                                path.join(" ")
                            ));
                        }
                    }
                }
            } else if inline.is_some() {
                return Err(format!("{name} takes no value"));
            }
            continue;
        }
        // A word: the subcommand goes on, or a positional argument.
        let mut longer = path.clone();
        longer.push(word.clone());
        let extends = command.is_none() && tool.command.iter().any(|c| c.path.starts_with(&longer));
        if extends {
            path = longer;
            command = tool.command.iter().find(|c| c.path == path);
            continue;
        }
        let c = command.ok_or_else(|| {
            format!(
                "{tool_name}: no subcommand {:?} in the table",
                longer.join(" ")
            )
        })?;
        positionals += 1;
        if let Some(Passthrough::AfterArgs(n)) = c.passthrough {
            if positionals as usize >= n {
                break;
            }
        }
    }
    let c = command.ok_or_else(|| format!("{tool_name}: incomplete subcommand {path:?}"))?;
    if let Some([min, max]) = c.args {
        if positionals < min || (max >= 0 && positionals > max) {
            return Err(format!(
                "{tool_name} {}: {positionals} positional arguments, the source allows {min}..{max}",
                path.join(" ")
            ));
        }
    }
    Ok(Use {
        tool: tool_name,
        path,
    })
}

#[test]
fn the_checker_refuses_what_the_tools_refuse() {
    let t = table();
    let bad = [
        // minikube v1.38.1 has no such flag; kind has no `create node`.
        "minikube start --profile x --cni-conf-dir=/x",
        "kind create node",
        "kind create cluster --name x extra",
        "kubectl --kubeconfig k --namespace n rollout status daemonset/x --timeout 1s --no-such",
        "KUBECONFIG=k minikube --profile p start --wait=everything",
        "helm install x",
        "docker build --file f --tag t",
        // vagrant 2.3.4: no such flag, ssh takes one machine; scripts must exist.
        "bash lab/vagrant/env.sh exec cnilab-1-vg vagrant up --no-such",
        "bash lab/vagrant/env.sh exec cnilab-1-vg vagrant ssh node1 node2 -c true",
        "bash lab/vagrant/env.sh exec cnilab-1-vg vagrant box add",
        "bash lab/vagrant/no-such.sh up x",
        "bash lab/vagrant/env.sh sideways cnilab-1-vg",
    ];
    for line in bad {
        assert!(check_line(&t, line).is_err(), "should be refused: {line}");
    }
    let good = [
        "kind create cluster --name x --config c.yaml --retain",
        "KUBECONFIG=k minikube --profile p ssh --node n -- sudo sed -n -e /x/p f",
        "docker exec n crictl inspecti -q img",
        "kubectl --kubeconfig k get pods -o wide > d/pods.txt",
        "X=1 bash ./lab/vagrant/env.sh exec cnilab-1-vg vagrant up --provider libvirt --parallel",
        "bash lab/vagrant/build-box.sh --link b.box",
    ];
    for line in good {
        assert!(
            check_line(&t, line).is_ok(),
            "{line}: {:?}",
            check_line(&t, line).err()
        );
    }
}

fn kind_config(dir: &Path, family: &str) -> PathBuf {
    let path = dir.join(format!("kind-{family}.yaml"));
    std::fs::write(
        &path,
        format!(
            "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnetworking:\n  ipFamily: {family}\n  disableDefaultCNI: true\n  kubeProxyMode: nftables\nnodes:\n- role: control-plane\n- role: worker\n"
        ),
    )
    .expect("write the kind config");
    path
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Every variant of both providers' full plans (`all` prints every step,
/// the dump and the delete).
fn every_plan(dir: &Path) -> Vec<(Vec<String>, String)> {
    let flannel = dir.join("kube-flannel.yml");
    std::fs::write(&flannel, FLANNEL).expect("write flannel");
    let flannel = flannel.to_string_lossy().into_owned();
    let cnis: [Vec<String>; 2] = [vec![], s(&["--cni-manifest", &flannel])];
    let archives: [Vec<String>; 2] = [
        vec![],
        s(&["--image-archive", "e2e-inputs/cnilab-image.tar"]),
    ];
    let mut variants = Vec::new();
    for family in ["ipv4", "ipv6", "dual"] {
        let own = kind_config(dir, family).to_string_lossy().into_owned();
        let configs: [Vec<String>; 3] = [
            s(&["--ip-family", family]),
            s(&["--config", &own]),
            s(&[
                "--ip-family",
                family,
                "--workers",
                "3",
                "--k8s-version",
                "v1.35.0",
            ]),
        ];
        for config in &configs {
            for cni in &cnis {
                for archive in &archives {
                    let mut args = s(&["kind", "all", "--name", "flags"]);
                    args.extend(config.iter().cloned());
                    args.extend(cni.iter().cloned());
                    args.extend(archive.iter().cloned());
                    variants.push(args);
                }
            }
        }
    }
    for workers in [vec![], s(&["--workers", "2"])] {
        for cni in &cnis {
            for archive in &archives {
                let mut args = s(&["minikube", "all", "--name", "flags"]);
                args.extend(workers.iter().cloned());
                args.extend(cni.iter().cloned());
                args.extend(archive.iter().cloned());
                variants.push(args);
            }
        }
    }
    // `e2e vagrant`: every step, a whole run with and without --retain.
    for step in [
        s(&["vagrant", "all"]),
        s(&["vagrant", "all", "--retain", "--name", "flags"]),
        s(&["vagrant", "up", "--name", "flags"]),
        s(&["vagrant", "check", "--name", "flags"]),
        s(&["vagrant", "down", "--name", "flags"]),
    ] {
        variants.push(step);
    }
    // `e2e capture`: every way onto the nodes.
    for capture in [
        &["kind", "--name", "flags"][..],
        &[
            "kind",
            "--workers",
            "3",
            "--out",
            "caps",
            "--binary",
            "b/cnilab",
        ],
        &["minikube", "--name", "flags", "--workers", "2"],
        &["pod"],
        &[
            "pod",
            "--kubeconfig",
            "k",
            "--context",
            "c",
            "--namespace",
            "n",
        ],
    ] {
        let mut args = s(&["capture"]);
        args.extend(s(capture));
        variants.push(args);
    }
    variants
        .into_iter()
        .map(|args| {
            let out = dry_run(&args.iter().map(String::as_str).collect::<Vec<_>>());
            (args, out)
        })
        .collect()
}

#[test]
fn every_planned_command_is_accepted_by_the_pinned_tools() {
    let tools = table();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut checked = 0;
    let mut used: BTreeSet<(String, Vec<String>)> = BTreeSet::new();
    let mut errors = Vec::new();
    for (args, out) in every_plan(dir.path()) {
        for line in out.lines().filter_map(|l| l.strip_prefix("+ ")) {
            checked += 1;
            match check_line(&tools, line) {
                Ok(u) => {
                    used.insert((u.tool, u.path));
                }
                Err(e) => errors.push(format!("{args:?}\n  {line}\n  {e}")),
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    assert!(checked > 1000, "only {checked} command lines");
    // Every entry of the table is used by some plan: no stale entries.
    for (name, tool) in &tools {
        for c in &tool.command {
            assert!(
                used.contains(&(name.clone(), c.path.clone())),
                "{name} {:?} is in the table but no plan runs it",
                c.path
            );
        }
    }
}
