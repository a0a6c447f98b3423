//! The lifecycle in every version the plugin supports (V3, A1-A5, K2, K4,
//! K5, D1, D2, D4, D5, D7, S4), cut into [`PARTS`] groups of consecutive
//! versions: each group runs in a world of its own, so the parts run at
//! once instead of one version after another.

use super::*;

/// How many groups the lifecycle is cut into.
pub(super) const PARTS: usize = 3;

/// The lifecycle of part `K` of the versions (see [`share`]).
pub(super) fn part<const K: usize>(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    lifecycles(s, K)
}

/// The versions the lifecycle runs in: the plugin's, else the config's.
fn versions(s: &Suite<'_>) -> Vec<Version> {
    let mut versions: Vec<Version> = s.versions.clone();
    if versions.is_empty() {
        versions.push(s.net.version);
    }
    versions
}

/// The versions of part `part` of [`PARTS`]: consecutive runs of
/// `versions`, the full lifecycles (0.3.0 and later) spread evenly; a
/// legacy ADD (0.1.0, 0.2.0: one call) goes with the full one before it.
/// Concatenated in part order they are `versions` in order.
pub(super) fn share(versions: &[Version], part: usize) -> Vec<Version> {
    let full = versions.iter().filter(|v| **v >= Version::V0_3_0).count();
    let mut seen = 0;
    let mut owner = 0;
    let mut out = Vec::new();
    for v in versions {
        if *v >= Version::V0_3_0 {
            owner = seen * PARTS / full;
            seen += 1;
        }
        if owner == part {
            out.push(*v);
        }
    }
    out
}

fn lifecycles(s: &Suite<'_>, part: usize) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let all = versions(s);
    // What is said once about the whole run: by the first part before its
    // versions, by the last after them, so the findings keep their order.
    let (first, last) = (part == 0, part + 1 == PARTS);
    if first && s.versions.is_empty() {
        out.push(Finding::fail(
            "V3",
            "VERSION gave no usable version list; lifecycle ran at the config's version only",
        ));
    }
    if first && !s.limits.is_empty() {
        out.push(Finding::pass(
            "V3",
            format!(
                "only versions every plugin lists were exercised ({})",
                s.limits.join("; ")
            ),
        ));
    }
    for v in share(&all, part) {
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
    // S4's ADD at 1.1.0 ran in the part that holds 1.1.0.
    if last && !all.contains(&Version::V1_1_0) {
        out.push(no_1_1(s, "S4"));
    }
    if last && !s.versions.iter().any(|v| *v >= Version::V0_4_0) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).expect("version")
    }

    #[test]
    fn the_parts_hold_every_version_once_in_order_and_share_the_full_lifecycles() {
        let reference: Vec<Version> = [
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
        ]
        .into_iter()
        .map(v)
        .collect();
        let lists = [
            reference.clone(),
            vec![v("1.1.0")],
            vec![v("1.0.0"), v("1.1.0")],
            vec![v("0.1.0"), v("0.2.0")],
            vec![v("0.2.0"), v("1.0.0"), v("0.1.0")],
            Vec::new(),
        ];
        for versions in lists {
            let parts: Vec<Vec<Version>> = (0..PARTS).map(|k| share(&versions, k)).collect();
            assert_eq!(parts.concat(), versions, "{parts:?}");
            let full = versions.iter().filter(|v| **v >= Version::V0_3_0).count();
            for part in &parts {
                let mine = part.iter().filter(|v| **v >= Version::V0_3_0).count();
                assert!(mine <= full.div_ceil(PARTS), "{versions:?}: {parts:?}");
            }
        }
        // The reference's five full lifecycles: 2, 2 and 1.
        let sizes: Vec<usize> = (0..PARTS)
            .map(|k| {
                share(&reference, k)
                    .iter()
                    .filter(|v| **v >= Version::V0_3_0)
                    .count()
            })
            .collect();
        assert_eq!(sizes, [2, 2, 1]);
    }

    #[test]
    fn every_part_is_a_group_of_its_own() {
        let parts = GROUPS
            .iter()
            .filter(|g| g.check == crate::conform::rules::Check::Lifecycle)
            .count();
        assert_eq!(parts, PARTS);
    }
}
