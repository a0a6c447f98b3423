//! Bad environment: missing or wrong CNI_* variables (E1-E5).

use super::*;

pub(super) fn environment(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let pod = s.pod()?;
    let stdin = to_bytes(&s.stdin_of(s.net));
    let base = |cmd: CniCommand, cid: &str| s.env(cmd, cid, Some(pod.path()), &s.ifname);

    // E1
    let mut env = base(CniCommand::Add, &s.cid("e1"));
    set_env(&mut env, "CNI_COMMAND", Some("NOTACOMMAND"));
    out.push(s.expect_error(
        &Expect {
            id: "E1",
            what: "CNI_COMMAND=NOTACOMMAND",
            codes: &[code::INVALID_ENV],
            names: None,
        },
        &env,
        &stdin,
        Some(&pod),
    ));

    // E2
    let mut commands = vec![CniCommand::Add];
    let check_net = s
        .best_version_at_least(Version::V0_4_0)
        .map(|v| s.net.with_version(v));
    if check_net.is_some() {
        commands.push(CniCommand::Check);
    }
    for cmd in commands {
        let body = match (cmd, &check_net) {
            (CniCommand::Check, Some(n)) => to_bytes(&s.stdin_of(n)),
            _ => stdin.clone(),
        };
        for var in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
            let mut env = base(cmd, &s.cid("e2"));
            set_env(&mut env, var, None);
            out.push(s.expect_error(
                &Expect {
                    id: "E2",
                    what: &format!("{cmd} without {var}"),
                    codes: &[code::INVALID_ENV],
                    names: Some(var),
                },
                &env,
                &body,
                Some(&pod),
            ));
        }
    }
    for var in ["CNI_CONTAINERID", "CNI_IFNAME"] {
        let mut env = base(CniCommand::Del, &s.cid("e2"));
        set_env(&mut env, var, None);
        out.push(s.expect_error(
            &Expect {
                id: "E2",
                what: &format!("DEL without {var}"),
                codes: &[code::INVALID_ENV],
                names: Some(var),
            },
            &env,
            &stdin,
            Some(&pod),
        ));
    }
    let mut env = base(CniCommand::Del, &s.cid("e2"));
    set_env(&mut env, "CNI_NETNS", None);
    out.push(
        match s.expect_success(
            "E2",
            "DEL without CNI_NETNS (optional for DEL)",
            &env,
            &stdin,
        ) {
            Ok(_) => Finding::pass("E2", "DEL without CNI_NETNS accepted"),
            Err(f) => f,
        },
    );

    // E3
    for bad in [
        "../../etc",
        "-leading-dash",
        "a/b",
        "has space",
        "semi;colon",
    ] {
        let env = base(CniCommand::Add, bad);
        out.push(s.expect_error(
            &Expect {
                id: "E3",
                what: &format!("ADD with CNI_CONTAINERID={bad:?}"),
                codes: &[code::INVALID_ENV, code::UNKNOWN_CONTAINER],
                names: None,
            },
            &env,
            &stdin,
            Some(&pod),
        ));
    }

    // E4
    for bad in ["", "abcdefghijklmnop", ".", "..", "a/b", "a:b", "a b"] {
        let env = s.env(CniCommand::Add, &s.cid("e4"), Some(pod.path()), bad);
        out.push(s.expect_error(
            &Expect {
                id: "E4",
                what: &format!("ADD with CNI_IFNAME={bad:?}"),
                codes: &[],
                names: None,
            },
            &env,
            &stdin,
            Some(&pod),
        ));
    }

    out.extend(e5(s, &stdin)?);
    Ok(out)
}

/// E5: unknown CNI_ARGS keys, with IgnoreUnknown=1 (accepted) and without
/// (either answer is allowed). Each ADD that may succeed gets a fresh pod,
/// so a plugin whose DEL leaves the interface behind fails D7, not this.
fn e5(s: &Suite<'_>, stdin: &[u8]) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let pod = s.pod()?;
    let base = |cmd: CniCommand, cid: &str| s.env(cmd, cid, Some(pod.path()), &s.ifname);
    let cid = s.cid("e5");
    let mut env = base(CniCommand::Add, &cid);
    set_env(&mut env, "CNI_ARGS", Some("IgnoreUnknown=1;CNILAB_PROBE=x"));
    out.push(
        match s.expect_success(
            "E5",
            "ADD with CNI_ARGS=IgnoreUnknown=1;CNILAB_PROBE=x",
            &env,
            stdin,
        ) {
            Ok(_) => Finding::pass("E5", "unknown CNI_ARGS key accepted with IgnoreUnknown=1"),
            Err(f) => f,
        },
    );
    raw_del(s, &cid, Some(pod.path()), stdin);
    let pod = s.pod()?;
    let base = |cmd: CniCommand, cid: &str| s.env(cmd, cid, Some(pod.path()), &s.ifname);
    let cid = s.cid("e5");
    let mut env = base(CniCommand::Add, &cid);
    set_env(&mut env, "CNI_ARGS", Some("CNILAB_PROBE=x"));
    if let Ok(plugin) = s.first_plugin() {
        if let Ok(exec) = s.runtime.exec_raw(&plugin, &env, stdin) {
            let detail = if exec.success() {
                "unknown CNI_ARGS key without IgnoreUnknown: accepted (allowed)".to_string()
            } else {
                format!(
                    "unknown CNI_ARGS key without IgnoreUnknown: rejected (allowed): {}",
                    exec.error_body().map(|b| b.msg).unwrap_or_default()
                )
            };
            out.push(Finding::pass("E5", detail));
        }
    }
    raw_del(s, &cid, Some(pod.path()), stdin);
    Ok(out)
}
