//! An existing ifname and a second ifname (A6, A7, D8).

use super::*;

/// An interface's MAC and addresses (`None`: it is gone).
type InterfaceState = Option<(Option<String>, Vec<String>)>;

fn interface_state(pod: &Netns, ifname: &str) -> InterfaceState {
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

/// An [`interface_state`] in plain words: `MAC …, addresses …`, or `gone`.
fn describe(state: &Option<(Option<String>, Vec<String>)>) -> String {
    match state {
        None => "gone".into(),
        Some((mac, addrs)) => format!(
            "MAC {}, {}",
            mac.as_deref().unwrap_or("none"),
            if addrs.is_empty() {
                "no addresses".to_string()
            } else {
                format!("addresses {}", addrs.join(", "))
            }
        ),
    }
}

/// Addresses as a plain list (`10.244.1.3, fd00::3`, or `none`).
fn list<T: std::fmt::Display>(ips: impl IntoIterator<Item = T>) -> String {
    let v: Vec<String> = ips.into_iter().map(|i| i.to_string()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

pub(super) fn interfaces(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
    let mut out = Vec::new();
    let target = s.target();
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
    out.extend(a6(s, &target, &pod, &cid, &intact));

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
                        "adding {second_if} changed the first attachment {}: before {}, after {}",
                        s.ifname,
                        describe(&intact),
                        describe(&interface_state(&pod, &s.ifname))
                    ),
                )
            } else if !shared.is_empty() && shared.len() == by_design.len() {
                Finding::skip(
                    "A7",
                    format!(
                        "not applicable: {second_if} got {} again, an address the config assigns by name (static IPAM): the same address is the point",
                        list(shared.iter())
                    ),
                )
            } else {
                Finding::check(
                    "A7",
                    !b.is_empty() && shared.is_empty(),
                    format!(
                        "{} (container {cid}): {}, {second_if} (same container): {}{}",
                        s.ifname,
                        list(a.iter()),
                        list(b.iter()),
                        if shared.is_empty() {
                            String::new()
                        } else {
                            format!("; {} handed to both", list(shared.iter()))
                        }
                    ),
                )
            };
            out.push(f.with_all(&second.executions));
            out.push(d8(s, &target, &pod, &cid, &rt2, second_if, &intact));
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

/// A6: ADD of an ifname that exists in the netns (the same container, then
/// another) fails with a CNI error and leaves the attachment and the
/// reservations as they were.
fn a6(
    s: &Suite<'_>,
    target: &Target<'_>,
    pod: &Netns,
    cid: &str,
    intact: &InterfaceState,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let reservations_before = target.reservations().len();
    // The same (container, ifname) again; then another container, same ifname.
    let stdin = to_bytes(&s.stdin_of(s.net));
    for (other, what) in [
        (
            cid.to_string(),
            "second ADD of the same (container, ifname)",
        ),
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
                if interface_state(pod, &s.ifname) != *intact {
                    problems.push(format!(
                        "existing {} changed: before {}, after {}",
                        s.ifname,
                        describe(intact),
                        describe(&interface_state(pod, &s.ifname))
                    ));
                }
                let now = target.reservations().len();
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

    out
}

/// D8: DEL of the second interface leaves the first, its address and its
/// reservation alone, and removes the second.
fn d8(
    s: &Suite<'_>,
    target: &Target<'_>,
    pod: &Netns,
    cid: &str,
    rt2: &RuntimeConf,
    second_if: &str,
    intact: &InterfaceState,
) -> Finding {
    let keep_before = reserved(target, cid, &s.ifname);
    let (f, ok) = del_finding(target, rt2, "D8", &format!("DEL of {second_if}"));
    if !ok {
        return f;
    }
    let mut problems = Vec::new();
    if interface_state(pod, &s.ifname) != *intact {
        problems.push(format!("{} changed", s.ifname));
    }
    if reserved(target, cid, &s.ifname) != keep_before {
        problems.push(format!("reservation of {} changed", s.ifname));
    }
    if !reserved(target, cid, second_if).is_empty() {
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
    Finding::check(
        "D8",
        problems.is_empty(),
        if problems.is_empty() {
            format!("DEL of {second_if} left {} and its address alone", s.ifname)
        } else {
            problems.join("; ")
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_states_read_as_plain_words() {
        let state = Some((
            Some("76:29:38:f5:7f:92".to_string()),
            vec!["10.244.1.3/24".to_string()],
        ));
        assert_eq!(
            describe(&state),
            "MAC 76:29:38:f5:7f:92, addresses 10.244.1.3/24"
        );
        assert_eq!(describe(&None), "gone");
        assert_eq!(
            describe(&Some((None, Vec::new()))),
            "MAC none, no addresses"
        );
        assert_eq!(list(["10.0.0.1", "fd00::1"]), "10.0.0.1, fd00::1");
        assert_eq!(list(Vec::<String>::new()), "none");
    }
}
