//! IPAM delegation, watched through a spy plugin (A9, K6, S3, G3, G4).

use super::*;
use crate::conform::suite::Spied;
use crate::runtime::NetworkConfig;

pub(super) fn delegation(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let Some(spied) = s.spied(s.net)? else {
        for id in ["A9", "K6", "S3", "G3", "G4"] {
            out.push(Finding::skip(
                id,
                "not applicable: the config has no ipam.type (built-in IPAM)",
            ));
        }
        return Ok(out);
    };
    let (runtime, net) = (&spied.runtime, &spied.net);
    let pod = s.pod()?;
    let cid = s.cid("a9");
    let rt = RuntimeConf::new(&cid, Some(pod.path()), &s.ifname);

    // A9: same env, whole config.
    match runtime.add(net, &rt) {
        Ok(added) => {
            let problems = a9_problems(s, &spied, &pod, &cid);
            out.push(
                Finding::check(
                    "A9",
                    problems.is_empty(),
                    if problems.is_empty() {
                        "IPAM called with the same CNI_* environment and the whole config"
                            .to_string()
                    } else {
                        problems.join("; ")
                    },
                )
                .with_all(&added.executions),
            );
            k6(s, &spied, &rt, &mut out);
        }
        Err(e) => {
            out.push(error_finding(
                "A9",
                "ADD with a delegated IPAM must succeed",
                &e,
            ));
            out.push(Finding::skip("K6", "depends on A9: ADD failed"));
        }
    }
    let _ = runtime.del(net, &rt);
    out.push(a9_missing_binary(s, &pod));

    // S3, G3, G4 need 1.1.0.
    if !s.supports(Version::V1_1_0) {
        for id in ["S3", "G3", "G4"] {
            out.push(no_1_1(s, id));
        }
        return Ok(out);
    }
    let net11 = net.with_version(Version::V1_1_0);
    s3(&spied, &net11, &mut out);
    g3_g4(s, &spied, &net11, &mut out)?;
    Ok(out)
}

/// A9: what the IPAM plugin saw of the ADD: the same CNI_* environment and
/// the whole network config (empty: nothing wrong).
fn a9_problems(s: &Suite<'_>, spied: &Spied, pod: &Netns, cid: &str) -> Vec<String> {
    let (spy, net) = (&spied.spy, &spied.net);
    let mut problems = Vec::new();
    let calls = spy.calls();
    let add = calls.iter().find(|c| c.command == "ADD");
    match add {
        None => problems.push(format!(
            "the IPAM plugin {SPY_NAME} was never called with ADD"
        )),
        Some(call) => {
            let netns = pod.path().to_string_lossy().into_owned();
            for (k, v) in [
                ("CNI_CONTAINERID", cid),
                ("CNI_NETNS", netns.as_str()),
                ("CNI_IFNAME", s.ifname.as_str()),
            ] {
                if call.var(k) != Some(v) {
                    problems.push(format!("IPAM saw {k}={:?}, expected {v:?}", call.var(k)));
                }
            }
            if call.var("CNI_PATH").is_none() {
                problems.push("IPAM saw no CNI_PATH".into());
            }
            let conf: Value = serde_json::from_str(&call.stdin).unwrap_or(Value::Null);
            if conf.get("name").and_then(Value::as_str) != Some(net.name.as_str())
                || conf.get("type").and_then(Value::as_str) != Some(net.plugin_type(0))
                || conf.get("ipam").is_none()
            {
                problems.push(format!(
                    "IPAM did not get the whole network config: {:?}",
                    clip(&call.stdin)
                ));
            }
        }
    }
    problems
}

/// K6: CHECK delegated to the IPAM plugin; an IPAM error propagates.
fn k6(s: &Suite<'_>, spied: &Spied, rt: &RuntimeConf, out: &mut Vec<Finding>) {
    let (spy, runtime, net) = (&spied.spy, &spied.runtime, &spied.net);
    if s.best_version_at_least(Version::V0_4_0).is_some() && net.version >= Version::V0_4_0 {
        let before = spy.calls().iter().filter(|c| c.command == "CHECK").count();
        match runtime.check(net, rt) {
            Ok(_) => {
                let after = spy.calls().iter().filter(|c| c.command == "CHECK").count();
                out.push(Finding::check(
                    "K6",
                    after > before,
                    "CHECK was delegated to the IPAM plugin",
                ));
            }
            Err(e) => out.push(error_finding(
                "K6",
                "CHECK with a healthy IPAM must pass",
                &e,
            )),
        }
        spy.fail("CHECK", true);
        match runtime.check(net, rt) {
            Ok(execs) => out.push(
                Finding::fail("K6", "IPAM CHECK failed but the plugin's CHECK exited 0")
                    .with_all(&execs),
            ),
            Err(e) => out.push(Finding::pass(
                "K6",
                format!("IPAM CHECK error propagated: {e}"),
            )),
        }
        spy.fail("CHECK", false);
    } else {
        out.push(no_check(s, "K6"));
    }
}

/// A9: a missing IPAM binary makes ADD fail.
fn a9_missing_binary(s: &Suite<'_>, pod: &Netns) -> Finding {
    let mut missing = s.net.clone();
    if let Some(Value::Object(ipam)) = missing.plugins[0].get_mut("ipam") {
        ipam.insert("type".into(), json!("cnilab-no-such-ipam"));
    }
    let rt_missing = RuntimeConf::new(&s.cid("a9-missing"), Some(pod.path()), &s.ifname);
    let finding = match s.runtime.add(&missing, &rt_missing) {
        Ok(a) => Finding::fail(
            "A9",
            "ADD succeeded although the IPAM binary does not exist",
        )
        .with_all(&a.executions),
        Err(e) => Finding::pass("A9", format!("missing IPAM binary: ADD failed ({e})")),
    };
    let _ = s.runtime.del(&missing, &rt_missing);
    let _ = s.runtime.del(s.net, &rt_missing);
    finding
}

/// S3: STATUS delegated to the IPAM plugin; an IPAM error propagates.
fn s3(spied: &Spied, net11: &NetworkConfig, out: &mut Vec<Finding>) {
    let (spy, runtime) = (&spied.spy, &spied.runtime);
    match runtime.status(net11) {
        Ok(_) => {
            let called = spy.calls().iter().any(|c| c.command == "STATUS");
            out.push(Finding::check(
                "S3",
                called,
                "STATUS was delegated to the IPAM plugin",
            ));
        }
        Err(e) => out.push(error_finding(
            "S3",
            "STATUS with a healthy IPAM must pass",
            &e,
        )),
    }
    spy.fail("STATUS", true);
    match runtime.status(net11) {
        Ok(execs) => out.push(
            Finding::fail("S3", "IPAM STATUS failed but the plugin's STATUS exited 0")
                .with_all(&execs),
        ),
        Err(e) => out.push(Finding::pass(
            "S3",
            format!("IPAM STATUS error propagated: {e}"),
        )),
    }
    spy.fail("STATUS", false);
}

/// G3: GC reaches IPAM. G4: an IPAM GC failure is reported, and the plugin
/// still removed its own stale host resources.
fn g3_g4(
    s: &Suite<'_>,
    spied: &Spied,
    net11: &NetworkConfig,
    out: &mut Vec<Finding>,
) -> Result<(), ConformError> {
    let (spy, runtime) = (&spied.spy, &spied.runtime);
    let target11 = Target::new(runtime, s.host, net11);
    let stale_pod = s.pod()?;
    let stale = RuntimeConf::new(&s.cid("g4"), Some(stale_pod.path()), &s.ifname);
    let added = runtime.add(net11, &stale);
    match runtime.gc(net11, &[], GcKey::Both) {
        Ok(_) => out.push(Finding::check(
            "G3",
            spy.calls().iter().any(|c| c.command == "GC"),
            "GC was forwarded to the IPAM plugin",
        )),
        Err(e) => out.push(error_finding("G3", "GC with a healthy IPAM must pass", &e)),
    }
    match added {
        Ok(added) => {
            let _ = runtime.del(net11, &stale);
            let again = runtime.add(net11, &stale);
            let veths = again
                .as_ref()
                .map(|a| target11.host_veths_in(&a.result))
                .unwrap_or_default();
            spy.fail("GC", true);
            let gc = runtime.gc(net11, &[], GcKey::Both);
            spy.fail("GC", false);
            let left: Vec<String> = veths
                .iter()
                .filter(|v| {
                    s.host
                        .links()
                        .unwrap_or_default()
                        .iter()
                        .any(|l| &l.name == *v)
                })
                .cloned()
                .collect();
            out.push(match gc {
                Ok(execs) => Finding::fail("G4", "IPAM GC failed but the plugin's GC exited 0")
                    .with_all(&execs),
                Err(e) if left.is_empty() => Finding::pass(
                    "G4",
                    format!("IPAM GC failure reported ({e}); stale host veths still removed"),
                ),
                Err(e) => Finding::fail(
                    "G4",
                    format!("GC stopped at the IPAM failure ({e}) and left host veths {left:?}"),
                ),
            });
            let _ = added;
        }
        Err(e) => out.push(error_finding("G4", "setup ADD must succeed", &e)),
    }
    let _ = runtime.del(net11, &stale);
    Ok(())
}
