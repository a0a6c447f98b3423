//! The checks, in groups that share setup. Each returns findings tagged
//! with checklist IDs; the report merges them per ID (worst verdict wins).

use super::suite::{reserved, Expect, Suite, SPY_NAME};
use super::{ConformError, Group};
use crate::lifecycle::{clip, del_finding, error_finding, Lab, Lifecycle, Pending};
use crate::netns::Netns;
use crate::runtime::{CniCommand, GcKey, RuntimeConf};
use crate::verdict::{Finding, Verdict};
use cnilab_plugin::spec::{code, Attachment, CniResult, Version};
use serde_json::{json, Map, Value};
use std::collections::HashSet;

pub(crate) const GROUPS: &[Group] = &[
    Group {
        name: "lifecycle in every supported version",
        ids: &[
            "V3", "A1", "A2", "A3", "A4", "A5", "K2", "K4", "K5", "D1", "D2", "D4", "D5", "D7",
            "S4",
        ],
        run: lifecycles,
    },
    Group {
        name: "bad environment",
        ids: &["E1", "E2", "E3", "E4", "E5"],
        run: environment,
    },
    Group {
        name: "bad or unusual config",
        ids: &["C1", "C2", "C3", "C4", "C5"],
        run: config,
    },
    Group {
        name: "existing ifname, second ifname",
        ids: &["A6", "A7", "D8"],
        run: interfaces,
    },
    Group {
        name: "chaining",
        ids: &["A8"],
        run: chaining,
    },
    Group {
        name: "IPAM delegation",
        ids: &["A9", "K6", "S3", "G3", "G4"],
        run: delegation,
    },
    Group {
        name: "failure after IPAM",
        ids: &["A10", "A11"],
        run: failed_add,
    },
    Group {
        name: "parallel ADD/DEL",
        ids: &["A12", "D7"],
        run: parallel,
    },
    Group {
        name: "DEL variants",
        ids: &["D3", "D6"],
        run: del_variants,
    },
    Group {
        name: "CHECK rules",
        ids: &["K1", "K3"],
        run: check_rules,
    },
    Group {
        name: "STATUS",
        ids: &["S1", "S2"],
        run: status,
    },
    Group {
        name: "GC",
        ids: &["G1", "G2", "G5"],
        run: gc,
    },
];

/// The addresses an IPAM result (as printed) hands out.
fn ipam_addresses(stdout: &str) -> Vec<std::net::IpAddr> {
    serde_json::from_str::<Value>(stdout.trim())
        .ok()
        .and_then(|v| v.get("ips").and_then(Value::as_array).cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip.get("address").and_then(Value::as_str))
        .filter_map(|a| a.parse::<ipnet::IpNet>().ok())
        .map(|n| n.addr())
        .collect()
}

fn to_bytes(map: &Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(map).unwrap_or_default()
}

fn set_env(env: &mut Vec<(String, String)>, key: &str, value: Option<&str>) {
    env.retain(|(k, _)| k != key);
    if let Some(v) = value {
        env.push((key.to_string(), v.to_string()));
    }
}

fn no_1_1(s: &Suite<'_>, id: &'static str) -> Finding {
    Finding::skip(id, s.why_not("1.1.0"))
}

fn no_check(s: &Suite<'_>, id: &'static str) -> Finding {
    Finding::skip(id, s.why_not("0.4.0 or later (CHECK)"))
}

// ---------------------------------------------------------------- lifecycle

fn lifecycles(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    if s.versions.is_empty() {
        out.push(Finding::fail(
            "V3",
            "VERSION gave no usable version list; lifecycle ran at the config's version only",
        ));
    }
    let mut versions: Vec<Version> = s.versions.clone();
    if versions.is_empty() {
        versions.push(s.net.version);
    }
    if !s.limits.is_empty() {
        out.push(Finding::pass(
            "V3",
            format!(
                "only versions every plugin lists were exercised ({})",
                s.limits.join("; ")
            ),
        ));
    }
    let mut status_seen_add = false;
    for v in versions {
        if v < Version::V0_3_0 {
            out.push(legacy_add(s, v));
            continue;
        }
        if !cnilab_plugin::spec::is_supported(&v.to_string()) {
            out.push(Finding::pass(
                "V3",
                format!("{v}: newer than the harness speaks; not exercised"),
            ));
            continue;
        }
        // Each version in its own store: a leak at one version cannot
        // exhaust the range of the next.
        let mut net = s.net.with_version(v);
        net.set_ipam_data_dir(&s.data_dir.join(format!("v{v}")));
        let lab = s.lab_for(&net);
        let findings = Lifecycle::new(&lab)
            .ifname(&s.ifname)
            .id_prefix(&format!("cnilab-lc-{}", v.to_string().replace('.', "-")))
            .run()?;
        let shape: Vec<&Finding> = findings
            .iter()
            .filter(|f| {
                ["A1", "A2", "A3", "A4", "A5"].contains(&f.id) && f.verdict == Verdict::Fail
            })
            .collect();
        out.push(if shape.is_empty() {
            Finding::pass(
                "V3",
                format!("{v}: ADD result in the {v} format, lifecycle ran"),
            )
        } else {
            Finding::fail(
                "V3",
                format!(
                    "{v}: {}",
                    shape
                        .iter()
                        .map(|f| format!("{} {}", f.id, f.detail))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            )
        });
        if v == Version::V1_1_0 {
            let add_ok = findings
                .iter()
                .any(|f| f.id == "A1" && f.verdict != Verdict::Fail);
            status_seen_add = true;
            out.push(Finding::check(
                "S4",
                add_ok,
                "ADD at 1.1.0 ran before any STATUS call in this run",
            ));
        }
        for mut f in findings {
            f.detail = format!("[{v}] {}", f.detail);
            out.push(f);
        }
    }
    if !status_seen_add {
        out.push(no_1_1(s, "S4"));
    }
    if !s.versions.iter().any(|v| *v >= Version::V0_4_0) {
        for id in ["K2", "K4", "K5"] {
            out.push(no_check(s, id));
        }
    }
    Ok(out)
}

/// V3 for 0.1.0/0.2.0: ADD must print the old `ip4`/`ip6` shape.
fn legacy_add(s: &Suite<'_>, v: Version) -> Finding {
    let Ok(pod) = s.pod() else {
        return Finding::fail("V3", "cannot create a pod namespace");
    };
    let net = s.net.with_version(v);
    let cid = s.cid("legacy");
    let env = s.env(CniCommand::Add, &cid, Some(pod.path()), &s.ifname);
    let stdin = to_bytes(&s.stdin_of(&net));
    let f = match s.expect_success("V3", &format!("{v}: ADD"), &env, &stdin) {
        Ok(exec) => {
            let value: Value = serde_json::from_str(exec.stdout.trim()).unwrap_or(Value::Null);
            let ok = value.get("cniVersion").and_then(Value::as_str)
                == Some(v.to_string().as_str())
                && (value.get("ip4").is_some() || value.get("ip6").is_some());
            Finding::check(
                "V3",
                ok,
                format!("{v}: result with cniVersion {v} and ip4/ip6"),
            )
            .with(&exec)
        }
        Err(f) => f,
    };
    let del = s.env(CniCommand::Del, &cid, Some(pod.path()), &s.ifname);
    let _ = s
        .first_plugin()
        .map(|p| s.runtime.exec_raw(&p, &del, &stdin));
    f
}

// -------------------------------------------------------------- environment

fn environment(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
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

    // E5: each ADD that may succeed gets a fresh pod, so a plugin whose
    // DEL leaves the interface behind fails D7, not this.
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
            &stdin,
        ) {
            Ok(_) => Finding::pass("E5", "unknown CNI_ARGS key accepted with IgnoreUnknown=1"),
            Err(f) => f,
        },
    );
    raw_del(s, &cid, Some(pod.path()), &stdin);
    let pod = s.pod()?;
    let base = |cmd: CniCommand, cid: &str| s.env(cmd, cid, Some(pod.path()), &s.ifname);
    let cid = s.cid("e5");
    let mut env = base(CniCommand::Add, &cid);
    set_env(&mut env, "CNI_ARGS", Some("CNILAB_PROBE=x"));
    if let Ok(plugin) = s.first_plugin() {
        if let Ok(exec) = s.runtime.exec_raw(&plugin, &env, &stdin) {
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
    raw_del(s, &cid, Some(pod.path()), &stdin);
    Ok(out)
}

/// DEL through the first plugin, raw, ignoring the outcome (cleanup).
fn raw_del(s: &Suite<'_>, cid: &str, netns: Option<&std::path::Path>, stdin: &[u8]) {
    let env = s.env(CniCommand::Del, cid, netns, &s.ifname);
    if let Ok(p) = s.first_plugin() {
        let _ = s.runtime.exec_raw(&p, &env, stdin);
    }
}

// ------------------------------------------------------------------- config

fn config(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
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

// --------------------------------------------------------------- interfaces

fn interface_state(pod: &Netns, ifname: &str) -> Option<(Option<String>, Vec<String>)> {
    let state = pod.snapshot().ok()?;
    let link = state.link(ifname)?;
    // IPv6 link-local addresses come from the kernel itself, some time after
    // the link is up; they are not the plugin's doing.
    let mut addrs: Vec<String> = state
        .addresses_of(link.index)
        .iter()
        .filter(|a| !matches!(a.addr(), std::net::IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
        .map(ToString::to_string)
        .collect();
    addrs.sort();
    Some((link.mac.clone(), addrs))
}

fn interfaces(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let lab = s.lab();
    let pod = s.pod()?;
    let cid = s.cid("a6");
    let rt = RuntimeConf::new(&cid, Some(pod.path()), &s.ifname);
    let first = match s.runtime.add(s.net, &rt) {
        Ok(a) => a,
        Err(e) => {
            let _ = s.runtime.del(s.net, &rt);
            out.push(error_finding("A6", "setup ADD must succeed", &e));
            for id in ["A7", "D8"] {
                out.push(Finding::skip(id, "depends on A6: its setup ADD failed"));
            }
            return Ok(out);
        }
    };
    let intact = interface_state(&pod, &s.ifname);
    let reservations_before = lab.reservations().len();
    // The same (container, ifname) again; then another container, same ifname.
    let stdin = to_bytes(&s.stdin_of(s.net));
    for (other, what) in [
        (cid.clone(), "second ADD of the same (container, ifname)"),
        (
            s.cid("a6-other"),
            "ADD of another container with an ifname that exists in the netns",
        ),
    ] {
        let env = s.env(CniCommand::Add, &other, Some(pod.path()), &s.ifname);
        let Ok(plugin) = s.first_plugin() else {
            continue;
        };
        match s.runtime.exec_raw(&plugin, &env, &stdin) {
            Ok(exec) => {
                let mut problems = Vec::new();
                if exec.success() {
                    problems.push("ADD exited 0".to_string());
                } else if exec.error_body().is_none() {
                    problems.push(format!(
                        "no CNI error body on stdout: {:?}",
                        clip(&exec.stdout)
                    ));
                }
                if interface_state(&pod, &s.ifname) != intact {
                    problems.push(format!(
                        "existing {} changed: before {:?}, after {:?}",
                        s.ifname,
                        intact,
                        interface_state(&pod, &s.ifname)
                    ));
                }
                let now = lab.reservations().len();
                if now != reservations_before {
                    problems.push(format!(
                        "reservations went from {reservations_before} to {now}"
                    ));
                }
                out.push(
                    Finding::check(
                        "A6",
                        problems.is_empty(),
                        if problems.is_empty() {
                            format!("{what}: failed, existing attachment intact")
                        } else {
                            format!("{what}: {}", problems.join("; "))
                        },
                    )
                    .with(&exec),
                );
            }
            Err(e) => out.push(Finding::fail("A6", format!("could not run: {e}"))),
        }
    }

    // A7: same container, second interface.
    let second_if = if s.ifname == "cnilab1" {
        "cnilab2"
    } else {
        "cnilab1"
    };
    let rt2 = RuntimeConf::new(&cid, Some(pod.path()), second_if);
    match s.runtime.add(s.net, &rt2) {
        Ok(second) => {
            let a: HashSet<_> = first.result.ips.iter().map(|i| i.address.addr()).collect();
            let b: Vec<_> = second.result.ips.iter().map(|i| i.address.addr()).collect();
            let shared: Vec<_> = b.iter().filter(|ip| a.contains(ip)).collect();
            let by_design: Vec<_> = shared
                .iter()
                .filter(|ip| s.configured_address(***ip))
                .collect();
            let broken = interface_state(&pod, &s.ifname) != intact;
            let f = if broken {
                Finding::fail(
                    "A7",
                    format!(
                        "adding {second_if} changed the first attachment {}: before {:?}, after {:?}",
                        s.ifname,
                        intact,
                        interface_state(&pod, &s.ifname)
                    ),
                )
            } else if !shared.is_empty() && shared.len() == by_design.len() {
                Finding::skip(
                    "A7",
                    format!(
                        "not applicable: {second_if} got {shared:?} again, an address the config assigns by name (static IPAM): the same address is the point"
                    ),
                )
            } else {
                Finding::check(
                    "A7",
                    !b.is_empty() && shared.is_empty(),
                    format!(
                        "{} (container {cid}): {:?}, {second_if} (same container): {:?}{}",
                        s.ifname,
                        a,
                        b,
                        if shared.is_empty() {
                            String::new()
                        } else {
                            format!("; {shared:?} handed to both")
                        }
                    ),
                )
            };
            out.push(f.with_all(&second.executions));
            // D8: DEL the second only.
            let keep_before = reserved(&lab, &cid, &s.ifname);
            let (f, ok) = del_finding(&lab, &rt2, "D8", &format!("DEL of {second_if}"));
            if !ok {
                out.push(f);
            } else {
                let mut problems = Vec::new();
                if interface_state(&pod, &s.ifname) != intact {
                    problems.push(format!("{} changed", s.ifname));
                }
                if reserved(&lab, &cid, &s.ifname) != keep_before {
                    problems.push(format!("reservation of {} changed", s.ifname));
                }
                if !reserved(&lab, &cid, second_if).is_empty() {
                    problems.push(format!("{second_if} still reserved"));
                }
                if pod
                    .links()
                    .unwrap_or_default()
                    .iter()
                    .any(|l| l.name == second_if)
                {
                    problems.push(format!("{second_if} still exists"));
                }
                out.push(Finding::check(
                    "D8",
                    problems.is_empty(),
                    if problems.is_empty() {
                        format!("DEL of {second_if} left {} and its address alone", s.ifname)
                    } else {
                        problems.join("; ")
                    },
                ));
            }
        }
        Err(e) => {
            let _ = s.runtime.del(s.net, &rt2);
            // A runtime may add a second interface to a container; a
            // plugin may decline. Declining cleanly is a WARN; breaking the
            // first attachment on the way is a FAIL.
            let now = interface_state(&pod, &s.ifname);
            let f = if now != intact {
                Finding::fail(
                    "A7",
                    format!(
                        "ADD of {second_if} in the same container failed ({e}) and changed the first attachment {}: before {intact:?}, after {now:?}",
                        s.ifname
                    ),
                )
            } else if e.error_body().is_some() {
                Finding::warn(
                    "A7",
                    format!(
                        "the plugin refuses a second interface ({second_if}) in the same container, cleanly, with the first intact: {e} (a runtime may ask for this)"
                    ),
                )
            } else {
                error_finding(
                    "A7",
                    &format!("ADD of the same container with ifname {second_if} must succeed or fail with a CNI error"),
                    &e,
                )
            };
            out.push(match e.execution() {
                Some(x) if f.executions.is_empty() => f.with(x),
                _ => f,
            });
            out.push(Finding::skip(
                "D8",
                "depends on A7: the second interface could not be added",
            ));
        }
    }
    let _ = s.runtime.del(s.net, &rt);
    Ok(out)
}

// ----------------------------------------------------------------- chaining

fn chaining(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    if s.net.plugins.len() < 2 {
        return Ok(vec![Finding::skip(
            "A8",
            "not applicable: the config has a single plugin, so no plugin receives a prevResult",
        )]);
    }
    let pod = s.pod()?;
    let rt = RuntimeConf::new(&s.cid("a8"), Some(pod.path()), &s.ifname);
    let mut out = Vec::new();
    match s.runtime.add(s.net, &rt) {
        Ok(added) => {
            for pair in added.executions.windows(2) {
                let prev: CniResult =
                    serde_json::from_str(pair[0].stdout.trim()).unwrap_or_default();
                let next: CniResult =
                    serde_json::from_str(pair[1].stdout.trim()).unwrap_or_default();
                let lost_if: Vec<&str> = prev
                    .interfaces
                    .iter()
                    .filter(|i| !next.interfaces.iter().any(|j| j.name == i.name))
                    .map(|i| i.name.as_str())
                    .collect();
                let lost_ip: Vec<String> = prev
                    .ips
                    .iter()
                    .filter(|i| !next.ips.iter().any(|j| j.address == i.address))
                    .map(|i| i.address.to_string())
                    .collect();
                out.push(
                    Finding::check(
                        "A8",
                        lost_if.is_empty() && lost_ip.is_empty(),
                        format!(
                            "{} after {}: lost interfaces {lost_if:?}, lost ips {lost_ip:?}",
                            pair[1].plugin.display(),
                            pair[0].plugin.display()
                        ),
                    )
                    .with(&pair[1]),
                );
            }
        }
        Err(e) => out.push(error_finding("A8", "chained ADD must succeed", &e)),
    }
    let _ = s.runtime.del(s.net, &rt);
    Ok(out)
}

// --------------------------------------------------------------- delegation

fn delegation(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
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
    let (spy, runtime, net) = (&spied.spy, &spied.runtime, &spied.net);
    let pod = s.pod()?;
    let cid = s.cid("a9");
    let rt = RuntimeConf::new(&cid, Some(pod.path()), &s.ifname);

    // A9: same env, whole config.
    match runtime.add(net, &rt) {
        Ok(added) => {
            let calls = spy.calls();
            let add = calls.iter().find(|c| c.command == "ADD");
            let mut problems = Vec::new();
            match add {
                None => problems.push(format!(
                    "the IPAM plugin {SPY_NAME} was never called with ADD"
                )),
                Some(call) => {
                    let netns = pod.path().to_string_lossy().into_owned();
                    for (k, v) in [
                        ("CNI_CONTAINERID", cid.as_str()),
                        ("CNI_NETNS", netns.as_str()),
                        ("CNI_IFNAME", s.ifname.as_str()),
                    ] {
                        if call.var(k) != Some(v) {
                            problems
                                .push(format!("IPAM saw {k}={:?}, expected {v:?}", call.var(k)));
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

            // K6: CHECK delegated; an IPAM error propagates.
            if s.best_version_at_least(Version::V0_4_0).is_some() && net.version >= Version::V0_4_0
            {
                let before = spy.calls().iter().filter(|c| c.command == "CHECK").count();
                match runtime.check(net, &rt) {
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
                match runtime.check(net, &rt) {
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

    // A9: a missing IPAM binary makes ADD fail.
    let mut missing = s.net.clone();
    if let Some(Value::Object(ipam)) = missing.plugins[0].get_mut("ipam") {
        ipam.insert("type".into(), json!("cnilab-no-such-ipam"));
    }
    let rt_missing = RuntimeConf::new(&s.cid("a9-missing"), Some(pod.path()), &s.ifname);
    match s.runtime.add(&missing, &rt_missing) {
        Ok(a) => out.push(
            Finding::fail(
                "A9",
                "ADD succeeded although the IPAM binary does not exist",
            )
            .with_all(&a.executions),
        ),
        Err(e) => out.push(Finding::pass(
            "A9",
            format!("missing IPAM binary: ADD failed ({e})"),
        )),
    }
    let _ = s.runtime.del(&missing, &rt_missing);
    let _ = s.runtime.del(s.net, &rt_missing);

    // S3, G3, G4 need 1.1.0.
    if !s.supports(Version::V1_1_0) {
        for id in ["S3", "G3", "G4"] {
            out.push(no_1_1(s, id));
        }
        return Ok(out);
    }
    let net11 = net.with_version(Version::V1_1_0);
    match runtime.status(&net11) {
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
    match runtime.status(&net11) {
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

    // G3: GC reaches IPAM. G4: an IPAM GC failure is reported, and the
    // plugin still removed its own stale host resources.
    let lab11 = Lab::new(runtime, s.host, &net11);
    let stale_pod = s.pod()?;
    let stale = RuntimeConf::new(&s.cid("g4"), Some(stale_pod.path()), &s.ifname);
    let added = runtime.add(&net11, &stale);
    match runtime.gc(&net11, &[], GcKey::Both) {
        Ok(_) => out.push(Finding::check(
            "G3",
            spy.calls().iter().any(|c| c.command == "GC"),
            "GC was forwarded to the IPAM plugin",
        )),
        Err(e) => out.push(error_finding("G3", "GC with a healthy IPAM must pass", &e)),
    }
    match added {
        Ok(added) => {
            let _ = runtime.del(&net11, &stale);
            let again = runtime.add(&net11, &stale);
            let veths = again
                .as_ref()
                .map(|a| lab11.host_veths_in(&a.result))
                .unwrap_or_default();
            spy.fail("GC", true);
            let gc = runtime.gc(&net11, &[], GcKey::Both);
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
    let _ = runtime.del(&net11, &stale);
    Ok(out)
}

// ------------------------------------------------------- failure after IPAM

fn failed_add(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
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
    let lab = Lab::new(runtime, s.host, &net);
    let pod = s.pod()?;
    let cid = s.cid("a10");
    let rt = RuntimeConf::new(&cid, Some(pod.path()), &s.ifname);
    let before = lab.snapshot()?;
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
            let left = reserved(&lab, &cid, &s.ifname);
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
                s.lab().judge_releases(&s.ifname, &cid, &pending)
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
    let (f, ok) = del_finding(&lab, &rt, "A11", "DEL after the failed ADD");
    if !ok {
        out.push(f);
        return Ok(out);
    }
    let keep = lab
        .host
        .links()
        .unwrap_or_default()
        .into_iter()
        .filter(|l| l.kind.as_deref() == Some("bridge"))
        .map(|l| l.name)
        .collect::<Vec<_>>();
    let mut problems = lab.leaks_since(&before, &keep)?;
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

// ----------------------------------------------------------------- parallel

fn parallel(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    const PODS: usize = 8;
    let lab = s.lab();
    let pods: Vec<Netns> = (0..PODS).map(|_| s.pod()).collect::<Result<_, _>>()?;
    // Warm up (the bridge may not exist yet) so the snapshot includes it.
    let before = lab.snapshot()?;
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
                keep.extend(lab.bridges_in(&a.result));
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
    problems.extend(lab.leaks_since(&before, &keep)?);
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

// ------------------------------------------------------------- DEL variants

fn del_variants(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let lab = s.lab();
    let pod = s.pod()?;
    let never = RuntimeConf::new(&s.cid("d3"), Some(pod.path()), &s.ifname);
    let (f, _) = del_finding(&lab, &never, "D3", "DEL of a container never added");
    out.push(f);

    // D6: DEL without prevResult, straight to each plugin in reverse.
    let cid = s.cid("d6");
    let rt = RuntimeConf::new(&cid, Some(pod.path()), &s.ifname);
    match s.runtime.add(s.net, &rt) {
        Ok(added) => {
            let veths = lab.host_veths_in(&added.result);
            let layout = lab.layout_applies(&cid, &added.result);
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
            if !reserved(&lab, &cid, &s.ifname).is_empty() {
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
                out.extend(lab.judge_releases(&s.ifname, &cid, &pending));
            }
        }
        Err(e) => out.push(error_finding("D6", "setup ADD must succeed", &e)),
    }
    let _ = s.runtime.del(s.net, &rt);
    Ok(out)
}

// --------------------------------------------------------------------- CHECK

fn check_rules(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
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

// -------------------------------------------------------------------- STATUS

fn status(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
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

// ------------------------------------------------------------------------ GC

fn gc(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
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
    let lab = s.lab_for(&net);
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
        let veths = lab.host_veths_in(&added.result);
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
                if layout && reserved(&lab, &keep.container_id, &s.ifname).is_empty() {
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
                if layout && !reserved(&lab, &stale.container_id, &s.ifname).is_empty() {
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
                    out.extend(lab.judge_releases_beside(
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
