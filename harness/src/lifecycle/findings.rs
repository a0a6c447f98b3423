//! Findings about one call: an ADD result's shape (A1-A4), the kernel state
//! it claims (A5), a DEL and its release, a call that should have succeeded.

use super::target::Target;
use crate::netns::Netns;
use crate::runtime::{Execution, NetworkConfig, RuntimeConf, RuntimeError};
use crate::util::clip;
use crate::verdict::Finding;
use cnilab_net::spec::CniResult;
use serde_json::Value;

/// Checks the shape of an ADD result (A1-A4). `exec` is the last plugin's
/// execution; `rt` the attachment it was for.
pub fn validate_add_output(
    net: &NetworkConfig,
    rt: &RuntimeConf,
    exec: &Execution,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let stdout = exec.stdout.trim();
    let parsed: Result<Value, _> = serde_json::from_str(stdout);
    let Ok(value) = parsed else {
        out.push(
            Finding::fail(
                "A1",
                format!(
                    "expected exactly one JSON result on stdout, saw {:?}",
                    clip(stdout)
                ),
            )
            .with(exec),
        );
        return out;
    };
    if value
        .get("dns")
        .is_some_and(|d| d.as_object().is_some_and(|o| o.is_empty()))
    {
        out.push(
            Finding::warn("A1", "result has \"dns\":{} (known reference deviation)").with(exec),
        );
    } else {
        out.push(Finding::pass("A1", "exit 0 and one JSON result on stdout"));
    }
    let want = net.version.to_string();
    let seen = value
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or("<missing>");
    out.push(
        Finding::check(
            "A2",
            seen == want,
            format!("result cniVersion: expected {want}, saw {seen}"),
        )
        .with(exec),
    );
    let result: CniResult = match serde_json::from_value(value.clone()) {
        Ok(r) => r,
        Err(e) => {
            out.push(
                Finding::fail(
                    "A4",
                    format!("result does not match the CNI result schema: {e}"),
                )
                .with(exec),
            );
            return out;
        }
    };
    // A3: names and sandboxes.
    let netns = rt.netns.as_ref().map(|p| p.to_string_lossy().into_owned());
    let mut problems = Vec::new();
    if result.interfaces.iter().any(|i| i.name.is_empty()) {
        problems.push("an interface has no name".to_string());
    }
    match result.interfaces.iter().find(|i| i.name == rt.ifname) {
        None => problems.push(format!("no interface named {} (CNI_IFNAME)", rt.ifname)),
        Some(i) if i.sandbox != netns => problems.push(format!(
            "container interface {} has sandbox {:?}, expected {:?} (CNI_NETNS)",
            i.name, i.sandbox, netns
        )),
        Some(_) => {}
    }
    for i in &result.interfaces {
        if i.name != rt.ifname && i.sandbox.is_some() && i.sandbox != netns {
            problems.push(format!(
                "interface {} has unexpected sandbox {:?}",
                i.name, i.sandbox
            ));
        }
    }
    out.push(
        Finding::check(
            "A3",
            problems.is_empty(),
            if problems.is_empty() {
                "interfaces named; container interface has sandbox = CNI_NETNS".to_string()
            } else {
                problems.join("; ")
            },
        )
        .with(exec),
    );
    // A4: CIDR addresses (the schema enforces), interface indexes in range,
    // and the per-version IP shape.
    let mut problems = Vec::new();
    for (n, ip) in result.ips.iter().enumerate() {
        match ip.interface {
            Some(i) if i >= result.interfaces.len() => problems.push(format!(
                "ips[{n}].interface = {i} but there are {} interfaces",
                result.interfaces.len()
            )),
            _ => {}
        }
        let want_version = net.version.ips_carry_version();
        if want_version && ip.version.is_none() {
            problems.push(format!(
                "ips[{n}] lacks \"version\" (required before 1.0.0)"
            ));
        }
        if !want_version && ip.version.is_some() {
            problems.push(format!(
                "ips[{n}] has \"version\" (not part of 1.x results)"
            ));
        }
    }
    if result.ips.is_empty() && net.plugins.first().is_some_and(|p| p.contains_key("ipam")) {
        problems.push("config has ipam but the result has no ips".to_string());
    }
    out.push(
        Finding::check(
            "A4",
            problems.is_empty(),
            if problems.is_empty() {
                format!("{} ips, CIDR, interface indexes valid", result.ips.len())
            } else {
                problems.join("; ")
            },
        )
        .with(exec),
    );
    out
}

/// A5: the kernel matches the result (container interface with MAC, up,
/// addresses, routes; host-side interfaces exist).
pub fn verify_kernel(
    target: &Target<'_>,
    pod: &Netns,
    rt: &RuntimeConf,
    result: &CniResult,
) -> Finding {
    let mut problems = Vec::new();
    let state = match pod.snapshot() {
        Ok(s) => s,
        Err(e) => return Finding::fail("A5", format!("cannot read the pod namespace: {e}")),
    };
    let host = target.host.snapshot().unwrap_or_default();
    match state.link(&rt.ifname) {
        None => problems.push(format!(
            "{} does not exist in {}",
            rt.ifname,
            pod.path().display()
        )),
        Some(link) => {
            if !link.up {
                problems.push(format!("{} is down", rt.ifname));
            }
            let idx = result
                .interfaces
                .iter()
                .position(|i| i.name == rt.ifname && i.sandbox.is_some());
            if let Some(idx) = idx {
                let want = result.interfaces[idx].mac.to_lowercase();
                let seen = link.mac.clone().unwrap_or_default();
                if !want.is_empty() && want != seen {
                    problems.push(format!("MAC: result says {want}, kernel has {seen}"));
                }
                let have = state.addresses_of(link.index);
                for ip in result
                    .ips
                    .iter()
                    .filter(|ip| ip.interface.is_none_or(|i| i == idx))
                {
                    if !have.contains(&ip.address) {
                        problems.push(format!(
                            "address {} missing on {} (kernel has {:?})",
                            ip.address,
                            rt.ifname,
                            have.iter().map(ToString::to_string).collect::<Vec<_>>()
                        ));
                    }
                }
            }
        }
    }
    for route in &result.routes {
        let found = state.routes.iter().any(|r| {
            r.dst == route.dst && r.table == 254 && route.gw.is_none_or(|gw| r.gateway == Some(gw))
        });
        if !found {
            problems.push(format!(
                "route {}{} missing in the pod namespace",
                route.dst,
                route.gw.map(|g| format!(" via {g}")).unwrap_or_default()
            ));
        }
    }
    for iface in result.interfaces.iter().filter(|i| i.sandbox.is_none()) {
        if host.link(&iface.name).is_none() {
            problems.push(format!(
                "host interface {} missing in the host namespace",
                iface.name
            ));
        }
    }
    Finding::check(
        "A5",
        problems.is_empty(),
        if problems.is_empty() {
            format!(
                "{} up with the reported MAC, {} addresses and {} routes in place",
                rt.ifname,
                result.ips.len(),
                result.routes.len()
            )
        } else {
            problems.join("; ")
        },
    )
}

/// Runs a DEL and checks D1 (exit 0, no output). Returns the finding with
/// `id` and whether DEL succeeded.
pub fn del_finding(
    target: &Target<'_>,
    rt: &RuntimeConf,
    id: &'static str,
    what: &str,
) -> (Finding, bool) {
    match target.runtime.del(target.net, rt) {
        Ok(execs) => {
            let noisy: Vec<&Execution> = execs
                .iter()
                .filter(|e| !e.stdout.trim().is_empty())
                .collect();
            if noisy.is_empty() {
                (
                    Finding::pass(id, format!("{what}: exit 0, no output")),
                    true,
                )
            } else {
                (
                    Finding::fail(
                        id,
                        format!(
                            "{what}: exit 0 but stdout is not empty: {:?}",
                            clip(&noisy[0].stdout)
                        ),
                    )
                    .with_all(noisy),
                    true,
                )
            }
        }
        Err(e) => (
            error_finding(id, &format!("{what} must succeed"), &e),
            false,
        ),
    }
}

/// A FAIL for an operation that should have succeeded, with its evidence.
pub fn error_finding(id: &'static str, expected: &str, err: &RuntimeError) -> Finding {
    let f = Finding::fail(id, format!("{expected}; saw: {err}"));
    match err.execution() {
        Some(exec) => f.with(exec),
        None => f,
    }
}
