//! STATUS (S1, S2).

use super::*;

pub(super) fn status(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    if !s.supports(Version::V1_1_0) {
        return Ok(vec![no_1_1(s, "S1"), no_1_1(s, "S2")]);
    }
    let mut out = Vec::new();
    let old = s.net.with_version(Version::V1_0_0);
    let env = vec![
        ("CNI_COMMAND".to_string(), "STATUS".to_string()),
        ("CNI_PATH".to_string(), s.runtime.cni_path()),
    ];
    out.push(s.expect_error(
        &Expect {
            id: "S1",
            what: "STATUS with cniVersion 1.0.0",
            codes: &[code::INCOMPATIBLE_VERSION],
            names: None,
        },
        &env,
        &to_bytes(&s.stdin_of(&old)),
        None,
    ));
    let net = s.net.with_version(Version::V1_1_0);
    match s.runtime.status(&net) {
        Ok(execs) => {
            let quiet = execs.iter().all(|e| e.stdout.trim().is_empty());
            out.push(
                Finding::check("S2", quiet, "STATUS ready: exit 0, no output")
                    .with_all(execs.iter().filter(|e| !e.stdout.trim().is_empty())),
            );
        }
        Err(e) => out.push(error_finding(
            "S2",
            "STATUS with a usable config must report ready",
            &e,
        )),
    }
    // Not ready: the IPAM store is a regular file, so nothing can be written.
    if s.net.plugins[0].contains_key("ipam") {
        let blocker = s.scratch.join("not-a-directory");
        std::fs::write(&blocker, "")?;
        let mut broken = net.clone();
        broken.set_ipam_data_dir(&blocker.join("store"));
        match s.runtime.status(&broken) {
            Ok(execs) => out.push(
                Finding::warn(
                    "S2",
                    "STATUS reports ready although the IPAM dataDir cannot be created",
                )
                .with_all(&execs),
            ),
            Err(e) => {
                let code = e.error_body().map(|b| b.code);
                let f = Finding::check(
                    "S2",
                    matches!(
                        code,
                        Some(code::NOT_AVAILABLE) | Some(code::NOT_AVAILABLE_DEGRADED)
                    ),
                    format!("unusable store: expected code 50 or 51, saw {code:?} ({e})"),
                );
                out.push(match e.execution() {
                    Some(x) => f.with(x),
                    None => f,
                });
            }
        }
    }
    Ok(out)
}
