//! Bad or unusual config (C1-C5).

use super::*;

pub(super) fn config(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let pod = s.pod()?;
    let good = s.stdin_of(s.net);
    let add_env = |cid: &str| s.env(CniCommand::Add, cid, Some(pod.path()), &s.ifname);

    out.push(s.expect_error(
        &Expect {
            id: "C1",
            what: "ADD with malformed JSON",
            codes: &[code::DECODE_FAILURE],
            names: None,
        },
        &add_env(&s.cid("c1")),
        b"{\"cniVersion\": \"1.0.0\", \"name\": ",
        Some(&pod),
    ));

    let mut no_name = good.clone();
    no_name.remove("name");
    out.push(s.expect_error(
        &Expect {
            id: "C2",
            what: "ADD without network name",
            codes: &[code::INVALID_CONFIG],
            names: None,
        },
        &add_env(&s.cid("c2")),
        &to_bytes(&no_name),
        Some(&pod),
    ));

    let mut future = good.clone();
    future.insert("cniVersion".into(), json!("99.0.0"));
    out.push(s.expect_error(
        &Expect {
            id: "C3",
            what: "ADD with cniVersion 99.0.0",
            codes: &[code::INCOMPATIBLE_VERSION],
            names: None,
        },
        &add_env(&s.cid("c3")),
        &to_bytes(&future),
        Some(&pod),
    ));
    let mut missing = good.clone();
    missing.remove("cniVersion");
    // A call of the first plugin alone: held to its own version list (and
    // its delegated IPAM's), not to what the chain narrows it to.
    if s.single_versions.contains(&Version::new(0, 1, 0)) {
        let pod = s.pod()?;
        let add_env = |cid: &str| s.env(CniCommand::Add, cid, Some(pod.path()), &s.ifname);
        let cid = s.cid("c3");
        out.push(
            match s.expect_success(
                "C3",
                "ADD without cniVersion (means 0.1.0, which VERSION lists)",
                &add_env(&cid),
                &to_bytes(&missing),
            ) {
                Ok(_) => Finding::pass(
                    "C3",
                    "missing cniVersion treated as 0.1.0 (listed): accepted",
                ),
                Err(f) => f,
            },
        );
        raw_del(s, &cid, Some(pod.path()), &to_bytes(&missing));
    } else {
        out.push(s.expect_error(
            &Expect {
                id: "C3",
                what: "ADD without cniVersion (0.1.0, not listed)",
                codes: &[code::INCOMPATIBLE_VERSION],
                names: None,
            },
            &add_env(&s.cid("c3")),
            &to_bytes(&missing),
            Some(&pod),
        ));
    }

    // C4: an unknown field is tolerated, or refused with code 2 naming it.
    let pod = s.pod()?;
    let add_env = |cid: &str| s.env(CniCommand::Add, cid, Some(pod.path()), &s.ifname);
    let mut unknown = good.clone();
    unknown.insert("cnilabUnknownField".into(), json!("cnilab-probe-value"));
    let cid = s.cid("c4");
    if let Ok(plugin) = s.first_plugin() {
        match s
            .runtime
            .exec_raw(&plugin, &add_env(&cid), &to_bytes(&unknown))
        {
            Ok(exec) if exec.success() => out.push(Finding::pass("C4", "unknown field tolerated")),
            Ok(exec) => {
                let body = exec.error_body();
                let ok = body.as_ref().is_some_and(|b| {
                    let text = format!("{} {}", b.msg, b.details);
                    b.code == code::UNSUPPORTED_FIELD
                        && text.contains("cnilabUnknownField")
                        && text.contains("cnilab-probe-value")
                });
                out.push(
                    Finding::check(
                        "C4",
                        ok,
                        format!(
                            "unknown field refused: expected code 2 naming key and value, saw {:?}",
                            body.map(|b| (b.code, b.msg))
                        ),
                    )
                    .with(&exec),
                );
            }
            Err(e) => out.push(Finding::fail("C4", format!("could not run: {e}"))),
        }
    }
    raw_del(s, &cid, Some(pod.path()), &to_bytes(&unknown));

    // C5: runtime-injected keys.
    let pod = s.pod()?;
    let add_env = |cid: &str| s.env(CniCommand::Add, cid, Some(pod.path()), &s.ifname);
    let mut injected = good.clone();
    injected.insert("runtimeConfig".into(), json!({"cnilabProbe": true}));
    injected.insert(
        "args".into(),
        json!({"cni": {"labels": [{"key": "k", "value": "v"}]}}),
    );
    injected.insert("cni.dev/cnilab-probe".into(), json!("x"));
    let cid = s.cid("c5");
    out.push(
        match s.expect_success(
            "C5",
            "ADD with runtimeConfig, args and cni.dev/* keys",
            &add_env(&cid),
            &to_bytes(&injected),
        ) {
            Ok(_) => Finding::pass("C5", "runtimeConfig, args and cni.dev/* tolerated"),
            Err(f) => f,
        },
    );
    raw_del(s, &cid, Some(pod.path()), &to_bytes(&injected));
    Ok(out)
}
