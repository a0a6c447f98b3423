//! `Lifecycle`: the whole life of one pod, each step a [`Finding`] tagged
//! with the checklist ID it proves:
//! ADD (A1-A4) → kernel state (A5) → CHECK (K5, K2) → tamper + CHECK (K4)
//! → DEL (D1) → cleanup (D7) → DEL again (D2) → DEL without netns (D4)
//! → DEL after the netns is gone (D5).
//!
//! Where things happen: the steps in order here ([`Lifecycle::run`]); what
//! each call's outcome means in [`findings`]; the network under test, the
//! host before and after, and released addresses in [`target`].

pub mod findings;
pub mod target;

pub use findings::{del_finding, error_finding, validate_add_output, verify_kernel};
pub use target::{ips_of, release_finding, HostSnapshot, Pending, Target};

use crate::netns::{Netns, NetnsError};
use crate::runtime::RuntimeConf;
use crate::util::wait_for;
use crate::verdict::{Finding, Verdict};
use cnilab_net::nl;
use cnilab_net::spec::{CniResult, Version};

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

/// The full lifecycle of one pod.
pub struct Lifecycle<'a> {
    target: &'a Target<'a>,
    ifname: String,
    id_prefix: String,
}

impl<'a> Lifecycle<'a> {
    pub fn new(target: &'a Target<'a>) -> Lifecycle<'a> {
        Lifecycle {
            target,
            ifname: "eth0".into(),
            id_prefix: format!("cnilab-lc-{}", target.net.version).replace('.', "-"),
        }
    }

    pub fn ifname(mut self, ifname: &str) -> Self {
        self.ifname = ifname.to_string();
        self
    }

    /// Container IDs used are `<prefix>`, `<prefix>-nonetns`, `<prefix>-gone`.
    pub fn id_prefix(mut self, prefix: &str) -> Self {
        self.id_prefix = prefix.to_string();
        self
    }

    /// Runs every step; an infrastructure failure (cannot make a namespace)
    /// is an `Err`, everything the plugin does wrong is a FAIL finding.
    pub fn run(&self) -> Result<Vec<Finding>, LifecycleError> {
        let target = self.target;
        let mut out = Vec::new();
        let pod = Netns::with_label("pod")?;
        let rt = RuntimeConf::new(&self.id_prefix, Some(pod.path()), &self.ifname);
        // A warm-up pod first, so that what a plugin keeps per network (its
        // bridge, a masquerade rule for the whole range) is in the baseline
        // and only per-pod leftovers count as leaks.
        {
            let warm_pod = Netns::with_label("pod")?;
            let warm = RuntimeConf::new(
                &format!("{}-warmup", self.id_prefix),
                Some(warm_pod.path()),
                &self.ifname,
            );
            if target.runtime.add(target.net, &warm).is_ok() {
                let _ = target.runtime.del(target.net, &warm);
            }
        }
        let before = target.snapshot()?;

        // 1. ADD
        let added = match target.runtime.add(target.net, &rt) {
            Ok(a) => a,
            Err(e) => {
                out.push(error_finding("A1", "ADD must exit 0 with a result", &e));
                for id in [
                    "A2", "A3", "A4", "A5", "K2", "K4", "K5", "D1", "D2", "D4", "D5", "D7",
                ] {
                    out.push(Finding::skip(id, "depends on A1: ADD failed"));
                }
                // Like a runtime: DEL after a failed ADD.
                let _ = target.runtime.del(target.net, &rt);
                return Ok(out);
            }
        };
        if let Some(last) = added.executions.last() {
            out.extend(validate_add_output(target.net, &rt, last));
        }
        let result = added.result.clone();
        let keep = target.bridges_in(&result);
        let host_veths = target.host_veths_in(&result);
        let layout = target.layout_applies(&rt.container_id, &result);
        let mut pending = Vec::new();

        // 2. kernel state
        out.push(verify_kernel(target, &pod, &rt, &result).with_all(&added.executions));

        // 3. CHECK, 4. tamper
        if target.net.version >= Version::V0_4_0 && !target.net.disable_check {
            out.extend(self.check_and_tamper(&pod, &rt, &result));
        }

        // 5. DEL
        let (f, _) = del_finding(target, &rt, "D1", "DEL after ADD");
        out.push(f);

        // 6. cleanup
        out.push(self.cleanup_finding(&pod, &rt, &before, &keep, &host_veths, layout)?);
        if !layout {
            pending.extend(ips_of(&result).into_iter().map(|ip| Pending {
                id: "D7",
                ip,
                what: format!("DEL of {}", rt.container_id),
            }));
        }

        // 7. DEL again
        let (f, _) = del_finding(target, &rt, "D2", "second DEL of the same attachment");
        out.push(f);

        out.push(self.del_without_netns(&mut pending)?);
        out.push(self.del_after_netns_gone(&mut pending)?);
        // Releases the store could not show: what later ADDs hand out.
        out.extend(target.judge_releases(&self.ifname, &self.id_prefix, &pending));
        Ok(out)
    }

    fn check_and_tamper(&self, pod: &Netns, rt: &RuntimeConf, result: &CniResult) -> Vec<Finding> {
        let target = self.target;
        let mut out = Vec::new();
        match target.runtime.check(target.net, rt) {
            Ok(execs) => {
                let quiet = execs.iter().all(|e| e.stdout.trim().is_empty());
                out.push(Finding::pass("K5", "CHECK right after ADD: exit 0").with_all(&execs));
                out.push(
                    Finding::check(
                        "K2",
                        quiet,
                        if quiet {
                            "CHECK printed nothing"
                        } else {
                            "CHECK printed output on success"
                        },
                    )
                    .with_all(execs.iter().filter(|e| !e.stdout.trim().is_empty())),
                );
            }
            Err(e) => {
                let known = e
                    .error_body()
                    .is_some_and(|b| b.msg.contains("no plugin name provided"));
                if known {
                    let f = Finding::warn(
                        "K5",
                        format!("CHECK failed with the known reference deviation: {e}"),
                    );
                    out.push(match e.execution() {
                        Some(x) => f.with(x),
                        None => f,
                    });
                } else {
                    out.push(error_finding("K5", "CHECK right after ADD must pass", &e));
                    out.push(Finding::skip("K2", "depends on K5: CHECK after ADD failed"));
                    out.push(Finding::skip("K4", "depends on K5: CHECK after ADD failed"));
                }
                return out;
            }
        }
        // Tamper 1: remove an address of the container interface.
        let Some(ip) = result.ips.first().map(|ip| ip.address) else {
            out.push(Finding::skip("K4", "result has no ips to tamper with"));
            return out;
        };
        let ifname = rt.ifname.clone();
        let tampered = pod.netlink(move |h| async move {
            let routes = nl::main_routes(&h).await?;
            let mut links = h.link().get().match_name(ifname).execute();
            let Some(link) = futures_util::TryStreamExt::try_next(&mut links).await? else {
                return Ok(None);
            };
            let index = link.header.index;
            nl::delete_address(&h, index, ip).await?;
            Ok(Some((index, routes)))
        });
        match tampered {
            Ok(Some((index, routes))) => {
                let verdict = target.runtime.check(target.net, rt);
                out.push(match &verdict {
                    Err(e) => Finding::pass(
                        "K4",
                        format!("address {ip} flushed: CHECK failed as it must ({e})"),
                    ),
                    Ok(execs) => Finding::fail(
                        "K4",
                        format!(
                            "address {ip} flushed from {}, yet CHECK exited 0",
                            rt.ifname
                        ),
                    )
                    .with_all(execs),
                });
                let restored = pod.netlink(move |h| async move {
                    nl::add_address(&h, index, ip).await?;
                    nl::restore_routes(&h, routes).await
                });
                if let Err(e) = restored {
                    out.push(Finding::fail(
                        "K4",
                        format!("harness could not restore {ip}: {e}"),
                    ));
                    return out;
                }
            }
            Ok(None) => {
                out.push(Finding::fail(
                    "K4",
                    format!("{} vanished before tampering", rt.ifname),
                ));
                return out;
            }
            Err(e) => {
                out.push(Finding::fail(
                    "K4",
                    format!("harness could not flush {ip}: {e}"),
                ));
                return out;
            }
        }
        // Tamper 2: remove a route the result lists.
        if let Some(route) = result.routes.first() {
            let dst = route.dst;
            let removed = pod.netlink(move |h| async move {
                let all = nl::main_routes(&h).await?;
                let n = nl::delete_routes(&h, dst).await?;
                Ok((n, all))
            });
            match removed {
                Ok((n, all)) if n > 0 => {
                    match target.runtime.check(target.net, rt) {
                        Err(e) => out.push(Finding::pass(
                            "K4",
                            format!("route {dst} deleted: CHECK failed as it must ({e})"),
                        )),
                        Ok(execs) => out.push(
                            Finding::fail("K4", format!("route {dst} deleted, yet CHECK exited 0"))
                                .with_all(&execs),
                        ),
                    }
                    let _ = pod.netlink(move |h| async move { nl::restore_routes(&h, all).await });
                }
                Ok(_) => out.push(Finding::fail(
                    "K4",
                    format!("route {dst} from the result is not in the kernel"),
                )),
                Err(e) => out.push(Finding::fail(
                    "K4",
                    format!("harness could not delete route {dst}: {e}"),
                )),
            }
        }
        out
    }

    fn cleanup_finding(
        &self,
        pod: &Netns,
        rt: &RuntimeConf,
        before: &HostSnapshot,
        keep: &[String],
        host_veths: &[String],
        layout: bool,
    ) -> Result<Finding, LifecycleError> {
        let target = self.target;
        let mut problems = Vec::new();
        if pod.links()?.iter().any(|l| l.name == rt.ifname) {
            problems.push(format!("{} still exists in the pod namespace", rt.ifname));
        }
        let host_links = target.host.links()?;
        for v in host_veths {
            if host_links.iter().any(|l| &l.name == v) {
                problems.push(format!("host veth {v} still exists"));
            }
        }
        for r in target.reservations_of(&rt.container_id, &rt.ifname) {
            problems.push(format!(
                "address {} still reserved for {}",
                r.ip, r.container_id
            ));
        }
        for leak in target.leaks_since(before, keep)? {
            if !problems.iter().any(|p| leak.contains(p.as_str())) {
                problems.push(leak);
            }
        }
        Ok(Finding::check(
            "D7",
            problems.is_empty(),
            if problems.is_empty() {
                format!(
                    "after DEL: no container interface, no host veth, {}, no new host links/routes/rules",
                    if layout {
                        "no record left in the host-local store"
                    } else {
                        "(address release judged by later ADDs)"
                    }
                )
            } else {
                problems.join("; ")
            },
        ))
    }

    /// D4: ADD, then DEL with CNI_NETNS unset; the address must be released.
    fn del_without_netns(&self, pending: &mut Vec<Pending>) -> Result<Finding, LifecycleError> {
        let target = self.target;
        let pod = Netns::with_label("pod")?;
        let id = format!("{}-nonetns", self.id_prefix);
        let rt = RuntimeConf::new(&id, Some(pod.path()), &self.ifname);
        let added = match target.runtime.add(target.net, &rt) {
            Ok(a) => a,
            Err(e) => {
                let _ = target.runtime.del(target.net, &rt);
                return Ok(error_finding("D4", "setup ADD must succeed", &e));
            }
        };
        let layout = target.layout_applies(&id, &added.result);
        let rt_no_netns = RuntimeConf::new(&id, None, &self.ifname);
        let (f, ok) = del_finding(target, &rt_no_netns, "D4", "DEL with CNI_NETNS unset");
        if !ok {
            let _ = target.runtime.del(target.net, &rt);
            return Ok(f);
        }
        let left = target.reservations_of(&id, &self.ifname);
        if !layout {
            // The pod's namespace and interface are dropped below, as a
            // runtime would; whether the address came back, later ADDs show.
            drop(pod);
            pending.extend(ips_of(&added.result).into_iter().map(|ip| Pending {
                id: "D4",
                ip,
                what: format!("DEL with CNI_NETNS unset of {id}"),
            }));
            return Ok(Finding::pass(
                "D4",
                "DEL with CNI_NETNS unset: exit 0 (address release judged by later ADDs)",
            ));
        }
        let _ = target.runtime.del(target.net, &rt);
        Ok(if left.is_empty() {
            Finding::pass(
                "D4",
                "DEL with CNI_NETNS unset: exit 0 and the address was released",
            )
        } else {
            Finding::fail(
                "D4",
                format!(
                    "DEL with CNI_NETNS unset exited 0 but left {} reserved",
                    left[0].ip
                ),
            )
        })
    }

    /// D5: ADD, delete the pod namespace, then DEL with the stale path.
    fn del_after_netns_gone(&self, pending: &mut Vec<Pending>) -> Result<Finding, LifecycleError> {
        let target = self.target;
        let pod = Netns::with_label("pod")?;
        let id = format!("{}-gone", self.id_prefix);
        let rt = RuntimeConf::new(&id, Some(pod.path()), &self.ifname);
        let added = match target.runtime.add(target.net, &rt) {
            Ok(a) => a,
            Err(e) => {
                let _ = target.runtime.del(target.net, &rt);
                return Ok(error_finding("D5", "setup ADD must succeed", &e));
            }
        };
        let host_veths = target.host_veths_in(&added.result);
        let layout = target.layout_applies(&id, &added.result);
        pod.delete()?;
        let (f, ok) = del_finding(target, &rt, "D5", "DEL after the netns was deleted");
        if !ok {
            return Ok(f);
        }
        let mut problems = Vec::new();
        for r in target.reservations_of(&id, &self.ifname) {
            problems.push(format!("address {} still reserved", r.ip));
        }
        if !layout {
            pending.extend(ips_of(&added.result).into_iter().map(|ip| Pending {
                id: "D5",
                ip,
                what: format!("DEL after the netns of {id} was deleted"),
            }));
        }
        // The kernel removes a veth pair with its namespace; give it a moment.
        let links = wait_for(|| {
            let links = target.host.links().unwrap_or_default();
            let gone = host_veths
                .iter()
                .all(|v| !links.iter().any(|l| &l.name == v));
            gone.then_some(links)
        });
        if links.is_none() {
            problems.push(format!("host veth(s) {host_veths:?} still exist"));
        }
        Ok(Finding::check(
            "D5",
            problems.is_empty(),
            if problems.is_empty() {
                if layout {
                    "DEL after the netns was deleted: exit 0, address released (its record left the host-local store), host veth gone".to_string()
                } else {
                    "DEL after the netns was deleted: exit 0, host veth gone (address release judged by later ADDs)".to_string()
                }
            } else {
                problems.join("; ")
            },
        ))
    }
}

/// Whether every finding passed or only warned/skipped.
pub fn all_ok(findings: &[Finding]) -> bool {
    findings.iter().all(|f| f.verdict != Verdict::Fail)
}
