//! The lifecycle in every version the plugin supports (V3, A1-A5, K2, K4, K5, D1, D2, D4, D5, D7, S4).

use super::*;

pub(super) fn lifecycles(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    if s.versions.is_empty() {
        out.push(Finding::fail(
            "V3",
            "VERSION gave no usable version list; lifecycle ran at the config's version only",
        ));
    }
    let mut versions: Vec<Version> = s.versions.clone();
    if versions.is_empty() {
        versions.push(s.net.version);
    }
    if !s.limits.is_empty() {
        out.push(Finding::pass(
            "V3",
            format!(
                "only versions every plugin lists were exercised ({})",
                s.limits.join("; ")
            ),
        ));
    }
    let mut status_seen_add = false;
    for v in versions {
        if v < Version::V0_3_0 {
            out.push(legacy_add(s, v));
            continue;
        }
        if !cnilab_net::spec::is_supported(&v.to_string()) {
            out.push(Finding::pass(
                "V3",
                format!("{v}: newer than the harness speaks; not exercised"),
            ));
            continue;
        }
        // Each version in its own store: a leak at one version cannot
        // exhaust the range of the next.
        let mut net = s.net.with_version(v);
        net.set_ipam_data_dir(&s.data_dir.join(format!("v{v}")));
        let target = s.target_for(&net);
        let findings = Lifecycle::new(&target)
            .ifname(&s.ifname)
            .id_prefix(&format!("cnilab-lc-{}", v.to_string().replace('.', "-")))
            .run()?;
        let shape: Vec<&Finding> = findings
            .iter()
            .filter(|f| {
                ["A1", "A2", "A3", "A4", "A5"].contains(&f.id) && f.verdict == Verdict::Fail
            })
            .collect();
        out.push(if shape.is_empty() {
            Finding::pass(
                "V3",
                format!("{v}: ADD result in the {v} format, lifecycle ran"),
            )
        } else {
            Finding::fail(
                "V3",
                format!(
                    "{v}: {}",
                    shape
                        .iter()
                        .map(|f| format!("{} {}", f.id, f.detail))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            )
        });
        if v == Version::V1_1_0 {
            let add_ok = findings
                .iter()
                .any(|f| f.id == "A1" && f.verdict != Verdict::Fail);
            status_seen_add = true;
            out.push(Finding::check(
                "S4",
                add_ok,
                "ADD at 1.1.0 ran before any STATUS call in this run",
            ));
        }
        for mut f in findings {
            f.detail = format!("[{v}] {}", f.detail);
            out.push(f);
        }
    }
    if !status_seen_add {
        out.push(no_1_1(s, "S4"));
    }
    if !s.versions.iter().any(|v| *v >= Version::V0_4_0) {
        for id in ["K2", "K4", "K5"] {
            out.push(no_check(s, id));
        }
    }
    Ok(out)
}

/// V3 for 0.1.0/0.2.0: ADD must print the old `ip4`/`ip6` shape.
fn legacy_add(s: &Suite<'_>, v: Version) -> Finding {
    let Ok(pod) = s.pod() else {
        return Finding::fail("V3", "cannot create a pod namespace");
    };
    let net = s.net.with_version(v);
    let cid = s.cid("legacy");
    let env = s.env(CniCommand::Add, &cid, Some(pod.path()), &s.ifname);
    let stdin = to_bytes(&s.stdin_of(&net));
    let f = match s.expect_success("V3", &format!("{v}: ADD"), &env, &stdin) {
        Ok(exec) => {
            let value: Value = serde_json::from_str(exec.stdout.trim()).unwrap_or(Value::Null);
            let ok = value.get("cniVersion").and_then(Value::as_str)
                == Some(v.to_string().as_str())
                && (value.get("ip4").is_some() || value.get("ip6").is_some());
            Finding::check(
                "V3",
                ok,
                format!("{v}: result with cniVersion {v} and ip4/ip6"),
            )
            .with(&exec)
        }
        Err(f) => f,
    };
    let del = s.env(CniCommand::Del, &cid, Some(pod.path()), &s.ifname);
    let _ = s
        .first_plugin()
        .map(|p| s.runtime.exec_raw(&p, &del, &stdin));
    f
}
