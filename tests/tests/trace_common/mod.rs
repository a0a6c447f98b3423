//! What the trace tests share: a standing lab's namespaces, faults made in
//! them by hand, traces run on them, and what a died or arrived trace and
//! a failing `lab check` must say.
#![allow(dead_code)]

use cnilab_tests::{cnilab, output_text as all, StandingLab as Standing};
use serde_json::Value;
use std::process::Command;

/// The lab's namespaces, faults made in them and traces run on them.
pub trait Lab {
    fn netns(&self, role: &str) -> String;
    fn sh(&self, role: &str, program: &str, args: &[&str]) -> String;
    fn trace(&self, from: &str, to: &str, extra: &[&str]) -> (Option<i32>, Value);
    fn assert_no_trace_tables(&self);
    fn pod_veth(&self, node: &str) -> String;
}

impl Lab for Standing {
    /// The kernel's name of a namespace of this lab, by role.
    fn netns(&self, role: &str) -> String {
        format!("cnilab-lab-{}-{role}", self.0)
    }

    /// Runs `program ARGS` inside the lab's namespace `role`; it must succeed.
    fn sh(&self, role: &str, program: &str, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns(role), program])
            .args(args)
            .output()
            .expect("ip netns exec runs");
        assert!(
            out.status.success(),
            "{program} {args:?} in {role}: {}",
            all(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `cnilab lab trace … -o json`: the exit code and the document.
    fn trace(&self, from: &str, to: &str, extra: &[&str]) -> (Option<i32>, Value) {
        let mut args = vec!["lab", "trace", "--name", &self.0, from, to, "-o", "json"];
        args.extend_from_slice(extra);
        let out = cnilab(&args);
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("no JSON ({e}): {}", all(&out)));
        (out.status.code(), v)
    }

    /// No namespace of the lab holds a table of the trace's own.
    fn assert_no_trace_tables(&self) {
        let list = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        let prefix = self.netns("");
        let mut checked = 0;
        for line in String::from_utf8_lossy(&list.stdout).lines() {
            let Some(ns) = line
                .split_whitespace()
                .next()
                .filter(|n| n.starts_with(&prefix))
            else {
                continue;
            };
            let role = &ns[prefix.len()..];
            let tables = self.sh(role, "nft", &["list", "tables"]);
            assert!(
                !tables.contains("cnilab_trace_"),
                "{ns} still has a trace table:\n{tables}"
            );
            checked += 1;
        }
        assert!(
            checked >= 5,
            "only {checked} namespaces of lab {} found",
            self.0
        );
    }

    /// The host side of `node`'s only pod veth.
    fn pod_veth(&self, node: &str) -> String {
        let links = self.sh(node, "ip", &["-o", "link", "show", "master", "cnilab0"]);
        links
            .split(": ")
            .nth(1)
            .and_then(|n| n.split('@').next())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no port on cnilab0 of {node}: {links}"))
    }
}

/// Asserts a died trace: exit 1, the namespace, the cause and that the
/// object contains `object`.
pub fn assert_died(t: &(Option<i32>, Value), namespace: &str, cause: &str, object: &str) {
    let (code, v) = t;
    assert_eq!(v["verdict"], "died", "{v:#}");
    assert_eq!(*code, Some(1), "{v:#}");
    let d = &v["death"];
    assert_eq!(d["namespace"], namespace, "{v:#}");
    assert_eq!(d["cause"], cause, "{v:#}");
    let obj = d["object"].as_str().unwrap_or_default();
    assert!(
        obj.contains(object),
        "object {obj:?} lacks {object:?}: {v:#}"
    );
    let reproduce = v["reproduce"].to_string();
    assert!(reproduce.contains("cnilab lab trace"), "{v:#}");
}

pub fn assert_arrived(t: &(Option<i32>, Value), to: &str) {
    let (code, v) = t;
    assert_eq!(v["verdict"], "arrived", "{v:#}");
    assert_eq!(*code, Some(0), "{v:#}");
    let last = v["hops"]
        .as_array()
        .and_then(|h| h.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["namespace"], to, "{v:#}");
    assert_eq!(v["schemaVersion"], 3);
}

/// `lab check` on the lab FAILs (exit 1) and names the cause: its id, the
/// namespace it died at (`died at node2`, or `died at node2-pod0 (node
/// node2)`) and the object; nothing of the trace is left behind.
pub fn assert_check_names(lab: &Standing, cause: &str, at: &str, object: &str) {
    let v = failing_check(lab);
    let named = diagnoses(&v).any(|d| {
        let msg = d["message"].as_str().unwrap_or_default();
        d["id"] == cause
            && msg.contains(&format!("died at {at}"))
            && msg.contains(object)
            && msg.contains("cnilab lab trace --name")
    });
    assert!(named, "no failure names {cause} at {at} ({object}): {v:#}");
    lab.assert_no_trace_tables();
}

/// `lab check` FAILs and one diagnosis (a rule's, or the trace's) says
/// every one of `words` (the node, the object).
pub fn assert_check_says(lab: &Standing, words: &[&str]) {
    let v = failing_check(lab);
    let said = diagnoses(&v).any(|d| {
        let msg = d["message"].as_str().unwrap_or_default();
        words.iter().all(|w| msg.contains(w))
    });
    assert!(said, "no diagnosis says all of {words:?}: {v:#}");
    lab.assert_no_trace_tables();
}

/// `lab check -o json` on the lab, which must exit 1.
fn failing_check(lab: &Standing) -> Value {
    let (code, v) = check(lab);
    assert_eq!(code, Some(1), "{v:#}");
    v
}

fn diagnoses(v: &Value) -> impl Iterator<Item = &Value> {
    v["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| f["diagnoses"].as_array().into_iter().flatten())
}

/// The first global address of `role`/`dev` in `family` (`-4`, `-6`).
pub fn address(lab: &Standing, role: &str, family: &str, dev: &str) -> String {
    let cidr = address_cidr(lab, role, family, dev);
    cidr.split('/').next().unwrap_or_default().to_string()
}

/// [`address`] with its prefix length (`10.244.2.1/24`).
pub fn address_cidr(lab: &Standing, role: &str, family: &str, dev: &str) -> String {
    let out = lab.sh(
        role,
        "ip",
        &[family, "-o", "addr", "show", "dev", dev, "scope", "global"],
    );
    out.split_whitespace()
        .nth(3)
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no {family} address on {role}/{dev}: {out}"))
}

/// One `lab check` on the lab FAILs (exit 1) and, on each path of `paths`
/// (a check group's name starts with it: `pod-to-pod`, `node-to-pod`,
/// `pod-to-node`, `service`), a failing probe's diagnosis names the cause,
/// where it died and the object.
pub fn assert_check_names_on(lab: &Standing, cause: &str, at: &str, object: &str, paths: &[&str]) {
    let v = failing_check(lab);
    for path in paths {
        let named = v["failures"].as_array().into_iter().flatten().any(|f| {
            let group = f["outcome"]["spec"]["group"].as_str().unwrap_or_default();
            group.starts_with(path)
                && f["diagnoses"].as_array().into_iter().flatten().any(|d| {
                    let msg = d["message"].as_str().unwrap_or_default();
                    d["id"] == cause
                        && msg.contains(&format!("died at {at}"))
                        && msg.contains(object)
                })
        });
        assert!(
            named,
            "no {path} failure names {cause} at {at} ({object}): {v:#}"
        );
    }
    lab.assert_no_trace_tables();
}

/// Stands up lab `label` from a topology file of the repository.
pub fn up_topology(label: &str, file: &str) -> Standing {
    let name = format!("{label}{}", std::process::id());
    let lab = Standing(name.clone());
    let out = cnilab(&[
        "lab",
        "up",
        "--name",
        &name,
        "--topology",
        file,
        "--runtime",
        "direct",
    ]);
    assert!(out.status.success(), "{file}: {}", all(&out));
    lab
}

/// The kernel's drop in a trace: reason, namespace and device; the devices
/// the probe crossed end where it was dropped.
pub fn assert_kernel_drop(v: &Value, reason: &str, namespace: &str, device: &str) {
    let k = &v["kernelDrop"];
    assert_eq!(k["reason"], reason, "{v:#}");
    assert_eq!(k["namespace"], namespace, "{v:#}");
    assert_eq!(k["device"], device, "{v:#}");
    assert!(
        k["function"].as_str().is_some_and(|f| !f.is_empty()),
        "{v:#}"
    );
    let last = v["devices"]
        .as_array()
        .and_then(|d| d.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["namespace"], namespace, "{v:#}");
    assert_eq!(last["device"], device, "{v:#}");
    assert_eq!(v["schemaVersion"], 3);
}

/// `lab check -o json`: its exit code and document.
pub fn check(lab: &Standing) -> (Option<i32>, Value) {
    // One check at a time in this test process: a check's probes time out
    // after 1 s and its traces read counters around a probe, so the checks
    // of the other tests' labs beside it on a 2-core machine starved a
    // Service probe's trace into a diagnosis no fault made.
    static ONE_CHECK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_CHECK.lock().unwrap_or_else(|e| e.into_inner());
    let out = cnilab(&["lab", "check", "--name", &lab.0, "-o", "json"]);
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", all(&out)));
    (out.status.code(), v)
}

/// `lab check` FAILs and every failing probe has the one cause, named at
/// `node` with `object`; no probe is left `undiagnosed`.
pub fn assert_every_failure_is(lab: &Standing, cause: &str, node: &str, object: &str) {
    let (code, v) = check(lab);
    assert_eq!(code, Some(1), "{v:#}");
    let failures = v["failures"].as_array().cloned().unwrap_or_default();
    assert!(!failures.is_empty(), "{v:#}");
    for f in &failures {
        let ids: Vec<&str> = f["diagnoses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["id"].as_str())
            .collect();
        assert_eq!(ids, [cause], "{f:#}");
        let msg = f["diagnoses"][0]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(&format!("died at {node}")), "{msg}");
        assert!(msg.contains(object), "{msg}");
    }
    let causes: Vec<&str> = v["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(causes, [cause], "one root cause, one entry: {v:#}");
    lab.assert_no_trace_tables();
}

/// The fix the registry of causes gives for `cause` (`cnilab lab causes
/// CAUSE`) was just applied by hand: `cause` is declared, and `lab check`
/// passes again. The registry names the tests that call this as the proof
/// of its fix.
pub fn assert_fixed(lab: &Standing, cause: &str) {
    assert_declared(cause);
    cnilab_tests::settle_neighbours(&cnilab_tests::lab_namespaces(&lab.0));
    let (code, v) = check(lab);
    assert_eq!(code, Some(0), "after the fix of {cause}: {v:#}");
}

/// [`assert_fixed`] for a fault that only a trace shows (no probe of `lab
/// check` crosses it): the trace `from` → `to` arrives again, and `lab
/// check` passes.
pub fn assert_fixed_on(lab: &Standing, cause: &str, from: &str, to: &str, extra: &[&str]) {
    assert_declared(cause);
    cnilab_tests::settle_neighbours(&cnilab_tests::lab_namespaces(&lab.0));
    let t = lab.trace(from, to, extra);
    assert_eq!(
        t.1["verdict"], "arrived",
        "after the fix of {cause}: {:#}",
        t.1
    );
    let (code, v) = check(lab);
    assert_eq!(code, Some(0), "after the fix of {cause}: {v:#}");
}

/// `cause` is in the registry of causes.
fn assert_declared(cause: &str) {
    let out = cnilab(&["lab", "causes", cause, "-o", "json"]);
    assert!(
        out.status.success(),
        "{cause} is not a declared cause: {}",
        all(&out)
    );
}

/// The neighbour entries of node2's bridge and of its two pods flushed:
/// what a fix that gives back an address or a MAC must do too.
pub fn flush_neighbours(lab: &Standing) {
    lab.sh("node2", "ip", &["neigh", "flush", "dev", "cnilab0"]);
    for pod in ["node2-pod0", "node2-pod1"] {
        lab.sh(pod, "ip", &["neigh", "flush", "dev", "eth0"]);
    }
}

/// `role`'s route to `prefix` as `ip route replace` takes it back: its
/// words up to the kernel's own (`proto`, `scope`, `src`), with the family
/// (`-6`) first for an IPv6 prefix.
pub fn route_of(lab: &Standing, role: &str, prefix: &str) -> Vec<String> {
    let family = if prefix.contains(':') { "-6" } else { "-4" };
    let route = lab.sh(role, "ip", &[family, "route", "show", prefix]);
    let words: Vec<String> = route
        .split_whitespace()
        .take_while(|w| !matches!(*w, "proto" | "scope" | "src" | "metric"))
        .map(str::to_string)
        .collect();
    assert!(words.len() > 1, "no route to {prefix} in {role}: {route}");
    words
}
