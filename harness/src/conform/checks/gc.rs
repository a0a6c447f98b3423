//! GC (G1, G2, G5).

use super::*;

pub(super) fn gc(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    if !s.supports(Version::V1_1_0) {
        return Ok(vec![no_1_1(s, "G1"), no_1_1(s, "G2"), no_1_1(s, "G5")]);
    }
    let mut out = Vec::new();
    let old = s.net.with_version(Version::V1_0_0);
    let env = vec![
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), s.runtime.cni_path()),
    ];
    let mut body = s.stdin_of(&old);
    body.insert("cni.dev/valid-attachments".into(), json!([]));
    out.push(s.expect_error(
        &Expect {
            id: "G5",
            what: "GC with cniVersion 1.0.0",
            codes: &[code::INCOMPATIBLE_VERSION],
            names: None,
        },
        &env,
        &to_bytes(&body),
        None,
    ));

    let net = s.net.with_version(Version::V1_1_0);
    let target = s.target_for(&net);
    let pods: Vec<Netns> = (0..3).map(|_| s.pod()).collect::<Result<_, _>>()?;
    let confs: Vec<RuntimeConf> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| RuntimeConf::new(&s.cid(&format!("gc{i}")), Some(p.path()), &s.ifname))
        .collect();
    let keep = Attachment {
        container_id: confs[0].container_id.clone(),
        ifname: s.ifname.clone(),
    };
    let layout = s.layout_applies();
    let kept = s.runtime.add(&net, &confs[0]);
    let kept_ips: std::collections::BTreeMap<std::net::IpAddr, String> = kept
        .as_ref()
        .map(|a| crate::lifecycle::ips_of(&a.result))
        .unwrap_or_default()
        .into_iter()
        .map(|ip| (ip, keep.container_id.clone()))
        .collect();
    if let Err(e) = kept {
        out.push(error_finding("G2", "setup ADD must succeed", &e));
        out.push(Finding::skip("G1", "depends on G2: its setup ADD failed"));
        let _ = s.runtime.del(&net, &confs[0]);
        return Ok(out);
    }
    for (key, stale, label) in [
        (
            GcKey::ValidAttachments,
            &confs[1],
            "cni.dev/valid-attachments",
        ),
        (GcKey::Attachments, &confs[2], "cni.dev/attachments"),
    ] {
        let added = match s.runtime.add(&net, stale) {
            Ok(a) => a,
            Err(e) => {
                out.push(error_finding("G2", "setup ADD must succeed", &e));
                continue;
            }
        };
        let veths = target.host_veths_in(&added.result);
        match s.runtime.gc(&net, std::slice::from_ref(&keep), key) {
            Ok(execs) => {
                let quiet = execs.iter().all(|e| e.stdout.trim().is_empty());
                out.push(
                    Finding::check(
                        "G1",
                        quiet,
                        format!("GC with only CNI_COMMAND/CNI_PATH and {label}: exit 0, no output"),
                    )
                    .with_all(&execs),
                );
                let mut problems = Vec::new();
                if layout && reserved(&target, &keep.container_id, &s.ifname).is_empty() {
                    problems.push(format!(
                        "kept attachment {} lost its reservation",
                        keep.container_id
                    ));
                }
                if pods[0]
                    .links()
                    .unwrap_or_default()
                    .iter()
                    .all(|l| l.name != s.ifname)
                {
                    problems.push(format!(
                        "kept attachment {} lost its interface",
                        keep.container_id
                    ));
                }
                if layout && !reserved(&target, &stale.container_id, &s.ifname).is_empty() {
                    problems.push(format!("stale {} still reserved", stale.container_id));
                }
                let links = s.host.links().unwrap_or_default();
                for v in &veths {
                    if links.iter().any(|l| &l.name == v) {
                        problems.push(format!("stale host veth {v} still exists"));
                    }
                }
                out.push(Finding::check(
                    "G2",
                    problems.is_empty(),
                    if problems.is_empty() {
                        format!("GC ({label}) removed the stale attachment and kept the listed one")
                    } else {
                        format!("GC ({label}): {}", problems.join("; "))
                    },
                ));
                if !layout {
                    // The store is not host-local's: whether GC released the
                    // stale address (and not the kept one) later ADDs show.
                    let pending: Vec<Pending> = crate::lifecycle::ips_of(&added.result)
                        .into_iter()
                        .map(|ip| Pending {
                            id: "G2",
                            ip,
                            what: format!("GC ({label}) of stale {}", stale.container_id),
                        })
                        .collect();
                    out.extend(target.judge_releases_beside(
                        &s.ifname,
                        &stale.container_id,
                        &pending,
                        &kept_ips,
                    ));
                }
            }
            Err(e) => {
                out.push(error_finding(
                    "G1",
                    &format!("GC with {label} must succeed"),
                    &e,
                ));
                out.push(Finding::skip("G2", "depends on G1: GC failed"));
            }
        }
        let _ = s.runtime.del(&net, stale);
    }
    let _ = s.runtime.del(&net, &confs[0]);
    Ok(out)
}
