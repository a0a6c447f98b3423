//! Failure after IPAM: what a failed ADD leaves behind (A10, A11).

use super::*;

pub(super) fn failed_add(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    if !s.net.plugins[0].contains_key("ipam") {
        for id in ["A10", "A11"] {
            out.push(Finding::skip(
                id,
                "not applicable: the config has no ipam section",
            ));
        }
        return Ok(out);
    }
    // A route via an unreachable gateway: IPAM allocates, then applying the
    // route must fail, after the allocation.
    let mut net = s.net.clone();
    if let Some(Value::Object(ipam)) = net.plugins[0].get_mut("ipam") {
        let routes = ipam.entry("routes").or_insert_with(|| json!([]));
        if let Value::Array(list) = routes {
            list.push(json!({"dst": "198.51.100.0/24", "gw": "203.0.113.1"}));
        }
    }
    // A delegated IPAM runs behind a spy, which shows what it handed out.
    let spied = s.spied(&net)?;
    let (runtime, net) = match &spied {
        Some(sp) => (&sp.runtime, sp.net.clone()),
        None => (s.runtime, net),
    };
    let target = Target::new(runtime, s.host, &net);
    let pod = s.pod()?;
    let cid = s.cid("a10");
    let rt = RuntimeConf::new(&cid, Some(pod.path()), &s.ifname);
    let before = target.snapshot()?;
    match runtime.add(&net, &rt) {
        Ok(added) => {
            out.push(Finding::warn("A10", "could not provoke a failure after IPAM: ADD with an unreachable route gateway (203.0.113.1) succeeded").with_all(&added.executions));
            out.push(Finding::warn("A11", "not exercised: ADD did not fail"));
            let _ = runtime.del(&net, &rt);
            return Ok(out);
        }
        Err(e) => {
            let allocated: Vec<std::net::IpAddr> = spied
                .as_ref()
                .map(|sp| {
                    sp.spy
                        .calls()
                        .iter()
                        .filter(|c| c.command == "ADD")
                        .flat_map(|c| ipam_addresses(&c.stdout))
                        .collect()
                })
                .unwrap_or_default();
            let left = reserved(&target, &cid, &s.ifname);
            let mut fs = if !left.is_empty() {
                vec![Finding::fail(
                    "A10",
                    format!(
                        "ADD failed ({e}) but {} stays reserved for {cid}",
                        left[0].ip
                    ),
                )]
            } else if s.layout_applies() {
                vec![Finding::pass(
                    "A10",
                    format!("ADD failed after IPAM ({e}); no address left reserved in the host-local store"),
                )]
            } else if !allocated.is_empty() {
                let pending: Vec<Pending> = allocated
                    .iter()
                    .map(|ip| Pending {
                        id: "A10",
                        ip: *ip,
                        what: format!("the failed ADD of {cid} ({e})"),
                    })
                    .collect();
                // Probes use the network without the failing route (same
                // store, same name).
                s.target().judge_releases(&s.ifname, &cid, &pending)
            } else {
                vec![Finding::skip(
                    "A10",
                    format!("inconclusive: ADD failed ({e}), but which address its IPAM allocated is not visible (IPAM built in, store not in host-local's layout)"),
                )]
            };
            if let (Some(f), Some(x)) = (fs.first_mut(), e.execution()) {
                f.executions.push(x.clone());
            }
            out.append(&mut fs);
        }
    }
    // A11: the runtime's DEL after the failed ADD cleans up everything.
    let (f, ok) = del_finding(&target, &rt, "A11", "DEL after the failed ADD");
    if !ok {
        out.push(f);
        return Ok(out);
    }
    let keep = target
        .host
        .links()
        .unwrap_or_default()
        .into_iter()
        .filter(|l| l.kind.as_deref() == Some("bridge"))
        .map(|l| l.name)
        .collect::<Vec<_>>();
    let mut problems = target.leaks_since(&before, &keep)?;
    if pod.links()?.iter().any(|l| l.name == s.ifname) {
        problems.push(format!("{} still exists in the pod", s.ifname));
    }
    out.push(Finding::check(
        "A11",
        problems.is_empty(),
        if problems.is_empty() {
            "after the failed ADD and its DEL: nothing left".to_string()
        } else {
            problems.join("; ")
        },
    ));
    Ok(out)
}
