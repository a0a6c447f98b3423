//! Parallel ADD/DEL (A12, D7).

use super::*;

pub(super) fn parallel(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    const PODS: usize = 8;
    let target = s.target();
    let pods: Vec<Netns> = (0..PODS).map(|_| s.pod()).collect::<Result<_, _>>()?;
    // Warm up (the bridge may not exist yet) so the snapshot includes it.
    let before = target.snapshot()?;
    let confs: Vec<RuntimeConf> = pods
        .iter()
        .map(|p| RuntimeConf::new(&s.cid("a12"), Some(p.path()), &s.ifname))
        .collect();
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = confs
            .iter()
            .map(|rt| scope.spawn(move || s.runtime.add(s.net, rt)))
            .collect();
        handles.into_iter().map(|h| h.join().ok()).collect()
    });
    let mut out = Vec::new();
    let mut addrs = Vec::new();
    let mut holders: std::collections::BTreeMap<std::net::IpAddr, Vec<String>> =
        std::collections::BTreeMap::new();
    let mut failed = Vec::new();
    let mut keep = Vec::new();
    let mut execs = Vec::new();
    for (rt, r) in confs.iter().zip(results) {
        match r {
            Some(Ok(a)) => {
                keep.extend(target.bridges_in(&a.result));
                for ip in a.result.ips.iter().map(|i| i.address.addr()) {
                    addrs.push(ip);
                    holders.entry(ip).or_default().push(rt.container_id.clone());
                }
                execs.extend(a.executions);
            }
            Some(Err(e)) => {
                failed.push(format!("{}: {e}", rt.container_id));
                if let Some(x) = e.execution() {
                    execs.push(x.clone());
                }
            }
            None => failed.push(format!("{}: thread panicked", rt.container_id)),
        }
    }
    let clashes: Vec<String> = holders
        .iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|(ip, pods)| format!("{ip} handed to {}", pods.join(" and ")))
        .collect();
    let by_design = !clashes.is_empty()
        && holders
            .iter()
            .filter(|(_, pods)| pods.len() > 1)
            .all(|(ip, _)| s.configured_address(*ip));
    let f = if failed.is_empty() && by_design {
        Finding::skip(
            "A12",
            format!(
                "not applicable: every pod gets the address the config assigns by name (static IPAM): {}",
                clashes.join("; ")
            ),
        )
    } else if failed.is_empty() && clashes.is_empty() {
        Finding::pass(
            "A12",
            format!(
                "{PODS} parallel ADDs succeeded with {} unique addresses",
                addrs.len()
            ),
        )
    } else {
        let mut problems = Vec::new();
        if !failed.is_empty() {
            problems.push(format!("failed ADDs: {}", failed.join("; ")));
        }
        if !clashes.is_empty() {
            problems.push(format!(
                "one address for two live pods: {}",
                clashes.join("; ")
            ));
        }
        Finding::fail(
            "A12",
            format!(
                "expected {PODS} parallel ADDs to succeed with unique addresses; {}",
                problems.join("; ")
            ),
        )
    };
    out.push(f.with_all(execs.iter().filter(|e| !e.success())));
    let dels: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = confs
            .iter()
            .map(|rt| scope.spawn(move || s.runtime.del(s.net, rt)))
            .collect();
        handles.into_iter().map(|h| h.join().ok()).collect()
    });
    let del_failed: Vec<String> = confs
        .iter()
        .zip(dels)
        .filter_map(|(rt, r)| match r {
            Some(Ok(_)) => None,
            Some(Err(e)) => Some(format!("{}: {e}", rt.container_id)),
            None => Some(format!("{}: thread panicked", rt.container_id)),
        })
        .collect();
    keep.sort();
    keep.dedup();
    let mut problems = del_failed;
    problems.extend(target.leaks_since(&before, &keep)?);
    for p in &pods {
        if p.links()
            .unwrap_or_default()
            .iter()
            .any(|l| l.name == s.ifname)
        {
            problems.push(format!("{} still in {}", s.ifname, p.name()));
        }
    }
    out.push(Finding::check(
        "D7",
        problems.is_empty(),
        if problems.is_empty() {
            format!("{PODS} parallel DELs left nothing behind")
        } else {
            format!("after {PODS} parallel DELs: {}", problems.join("; "))
        },
    ));
    Ok(out)
}
