//! DEL variants (D3, D6).

use super::*;

pub(super) fn del_variants(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let target = s.target();
    let pod = s.pod()?;
    let never = RuntimeConf::new(&s.cid("d3"), Some(pod.path()), &s.ifname);
    let (f, _) = del_finding(&target, &never, "D3", "DEL of a container never added");
    out.push(f);

    // D6: DEL without prevResult, straight to each plugin in reverse.
    let cid = s.cid("d6");
    let rt = RuntimeConf::new(&cid, Some(pod.path()), &s.ifname);
    match s.runtime.add(s.net, &rt) {
        Ok(added) => {
            let veths = target.host_veths_in(&added.result);
            let layout = target.layout_applies(&cid, &added.result);
            let env = s.runtime.cni_env(CniCommand::Del, Some(&rt));
            let mut problems = Vec::new();
            let mut execs = Vec::new();
            for index in (0..s.net.plugins.len()).rev() {
                let stdin = to_bytes(&s.net.plugin_stdin(index, None, Some(&rt)));
                match s.runtime.find_plugin(s.net.plugin_type(index)) {
                    Ok(p) => match s.runtime.exec_raw(&p, &env, &stdin) {
                        Ok(e) => {
                            if !e.success() {
                                problems.push(format!(
                                    "{} DEL without prevResult: {}",
                                    p.display(),
                                    e.status_text()
                                ));
                            }
                            execs.push(e);
                        }
                        Err(e) => problems.push(e.to_string()),
                    },
                    Err(e) => problems.push(e.to_string()),
                }
            }
            if !reserved(&target, &cid, &s.ifname).is_empty() {
                problems.push("address still reserved".into());
            }
            let links = s.host.links().unwrap_or_default();
            for v in &veths {
                if links.iter().any(|l| &l.name == v) {
                    problems.push(format!("host veth {v} still exists"));
                }
            }
            out.push(
                Finding::check(
                    "D6",
                    problems.is_empty(),
                    if problems.is_empty() {
                        format!(
                            "DEL without prevResult: exit 0, {} (with prevResult: see D1)",
                            if layout {
                                "its record left the host-local store"
                            } else {
                                "address release judged by later ADDs"
                            }
                        )
                    } else {
                        problems.join("; ")
                    },
                )
                .with_all(execs.iter().filter(|e| !e.success())),
            );
            if !layout && problems.is_empty() {
                let pending: Vec<Pending> = crate::lifecycle::ips_of(&added.result)
                    .into_iter()
                    .map(|ip| Pending {
                        id: "D6",
                        ip,
                        what: format!("DEL without prevResult of {cid}"),
                    })
                    .collect();
                out.extend(target.judge_releases(&s.ifname, &cid, &pending));
            }
        }
        Err(e) => out.push(error_finding("D6", "setup ADD must succeed", &e)),
    }
    let _ = s.runtime.del(s.net, &rt);
    Ok(out)
}
