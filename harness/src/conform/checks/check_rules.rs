//! CHECK rules (K1, K3).

use super::*;

pub(super) fn check_rules(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let Some(v) = s.best_version_at_least(Version::V0_4_0) else {
        return Ok(vec![no_check(s, "K1"), no_check(s, "K3")]);
    };
    let pod = s.pod()?;
    // K1: CHECK with a 0.3.1 config.
    let old = s.net.with_version(Version::new(0, 3, 1));
    let env = s.env(CniCommand::Check, &s.cid("k1"), Some(pod.path()), &s.ifname);
    out.push(s.expect_error(
        &Expect {
            id: "K1",
            what: "CHECK with cniVersion 0.3.1",
            codes: &[code::INCOMPATIBLE_VERSION],
            names: None,
        },
        &env,
        &to_bytes(&s.stdin_of(&old)),
        Some(&pod),
    ));
    // K3: CHECK without prevResult after a real ADD.
    let net = s.net.with_version(v);
    let cid = s.cid("k3");
    let rt = RuntimeConf::new(&cid, Some(pod.path()), &s.ifname);
    match s.runtime.add(&net, &rt) {
        Ok(_) => {
            let env = s.runtime.cni_env(CniCommand::Check, Some(&rt));
            let stdin = to_bytes(&net.plugin_stdin(0, None, Some(&rt)));
            match s.first_plugin().map(|p| s.runtime.exec_raw(&p, &env, &stdin)) {
                Ok(Ok(exec)) => out.push(
                    Finding::check(
                        "K3",
                        !exec.success() && exec.error_body().is_some(),
                        if exec.success() {
                            "CHECK without prevResult exited 0: the plugin cannot have verified its interface".to_string()
                        } else {
                            format!("CHECK without prevResult failed: {}", exec.error_body().map(|b| b.msg).unwrap_or_else(|| "no error body".into()))
                        },
                    )
                    .with(&exec),
                ),
                Ok(Err(e)) => out.push(Finding::fail("K3", format!("could not run: {e}"))),
                Err(e) => out.push(Finding::fail("K3", e.to_string())),
            }
        }
        Err(e) => out.push(error_finding("K3", "setup ADD must succeed", &e)),
    }
    let _ = s.runtime.del(&net, &rt);
    Ok(out)
}
