//! `Lifecycle`: the whole life of one pod, each step a [`Finding`] tagged
//! with the checklist ID it proves:
//! ADD (A1-A4) → kernel state (A5) → CHECK (K5, K2) → tamper + CHECK (K4)
//! → DEL (D1) → cleanup (D7) → DEL again (D2) → DEL without netns (D4)
//! → DEL after the netns is gone (D5).

use crate::accounting::{self, Release};
use crate::host_state::{self, Reservation};
use crate::netns::{NetState, Netns, NetnsError};
use crate::runtime::{Execution, NetworkConfig, Runtime, RuntimeConf, RuntimeError};
use crate::util::{clip, wait_for};
use crate::verdict::{Finding, Verdict};
use cnilab_net::nl;
use cnilab_net::spec::{CniResult, Version};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

/// The host-side picture taken before a pod is added.
#[derive(Clone, Debug)]
pub struct HostSnapshot {
    pub net: NetState,
    pub rules: Option<Vec<String>>,
    pub reservations: Vec<Reservation>,
}

/// Everything a check needs to drive one network in one host namespace.
pub struct Lab<'a> {
    pub runtime: &'a Runtime,
    pub host: &'a Netns,
    pub net: &'a NetworkConfig,
    /// `<dataDir>/<network>` when the IPAM store is host-local style.
    pub store: Option<PathBuf>,
}

impl<'a> Lab<'a> {
    pub fn new(runtime: &'a Runtime, host: &'a Netns, net: &'a NetworkConfig) -> Lab<'a> {
        Lab {
            runtime,
            host,
            net,
            store: net.ipam_store_dir(),
        }
    }

    pub fn reservations(&self) -> Vec<Reservation> {
        self.store
            .as_deref()
            .and_then(|d| host_state::reservations(d).ok())
            .unwrap_or_default()
    }

    pub fn reservations_of(&self, container_id: &str, ifname: &str) -> Vec<Reservation> {
        self.reservations()
            .into_iter()
            .filter(|r| {
                r.container_id == container_id && (r.ifname.is_empty() || r.ifname == ifname)
            })
            .collect()
    }

    /// Whether host-local's layout applies to this pod's store records.
    pub fn layout_applies(&self, container_id: &str, result: &CniResult) -> bool {
        let ips: Vec<IpAddr> = result.ips.iter().map(|i| i.address.addr()).collect();
        accounting::layout_applies(self.store.as_deref(), container_id, &ips)
    }

    /// Probes the network for `pending` released addresses and turns what
    /// comes back into findings (PASS released, FAIL held, SKIP when
    /// nothing can tell). Two probe pods with one address is an A12 FAIL.
    pub fn judge_releases(&self, ifname: &str, prefix: &str, pending: &[Pending]) -> Vec<Finding> {
        self.judge_releases_beside(ifname, prefix, pending, &BTreeMap::new())
    }

    /// [`Lab::judge_releases`] while other pods are live (`live`: their
    /// addresses and IDs): handing one of those to a probe is an A12 FAIL.
    pub fn judge_releases_beside(
        &self,
        ifname: &str,
        prefix: &str,
        pending: &[Pending],
        live: &BTreeMap<IpAddr, String>,
    ) -> Vec<Finding> {
        // An address the config assigns by name (static IPAM) has no
        // allocation to release: nothing to judge.
        let (fixed, pending): (Vec<&Pending>, Vec<&Pending>) = pending
            .iter()
            .partition(|p| accounting::configured(self.net, p.ip));
        let mut out: Vec<Finding> = fixed
            .iter()
            .map(|p| {
                Finding::skip(
                    p.id,
                    format!(
                        "{}: not applicable: {} is assigned by the config (static IPAM), there is no allocation to release",
                        p.what, p.ip
                    ),
                )
            })
            .collect();
        if pending.is_empty() {
            return out;
        }
        let wanted: BTreeSet<IpAddr> = pending.iter().map(|p| p.ip).collect();
        let budget = accounting::capacity(self.net)
            .map(|c| c.min(64) as usize + 1)
            .unwrap_or(16);
        let probe = accounting::Probe {
            runtime: self.runtime,
            net: self.net,
            ifname,
            prefix: format!("{prefix}-probe"),
            budget,
        };
        let outcome = probe.run(&wanted, live);
        out.extend(outcome.duplicates.iter().map(|(ip, a, b)| {
            Finding::fail(
                "A12",
                format!("{ip} was handed to probe pod {b} while pod {a} still held it"),
            )
        }));
        for p in pending {
            out.push(release_finding(p, outcome.release_of(p.ip)));
        }
        out
    }

    pub fn snapshot(&self) -> Result<HostSnapshot, NetnsError> {
        Ok(HostSnapshot {
            net: self.host.snapshot()?,
            rules: host_state::firewall_rules(self.host),
            reservations: self.reservations(),
        })
    }

    /// What changed in the host namespace since `before`, ignoring the
    /// bridges a plugin keeps for later pods. Empty when nothing leaked.
    pub fn leaks_since(
        &self,
        before: &HostSnapshot,
        keep: &[String],
    ) -> Result<Vec<String>, NetnsError> {
        let now = self.snapshot()?;
        let mut out = now.net.added_since(&before.net, keep);
        if let (Some(b), Some(a)) = (&before.rules, &now.rules) {
            for rule in host_state::new_lines(b, a) {
                out.push(format!("new firewall rule: {rule}"));
            }
        }
        for r in &now.reservations {
            if !before.reservations.contains(r) {
                out.push(format!(
                    "new reservation {} for container {} ifname {}",
                    r.ip, r.container_id, r.ifname
                ));
            }
        }
        Ok(out)
    }

    /// Names of bridges (kind `bridge`) in the host that a result lists.
    pub fn bridges_in(&self, result: &CniResult) -> Vec<String> {
        let Ok(links) = self.host.links() else {
            return Vec::new();
        };
        links
            .into_iter()
            .filter(|l| l.kind.as_deref() == Some("bridge"))
            .filter(|l| {
                result
                    .interfaces
                    .iter()
                    .any(|i| i.sandbox.is_none() && i.name == l.name)
            })
            .map(|l| l.name)
            .collect()
    }

    /// Host-side veths a result lists (no sandbox, kind `veth` in the host).
    pub fn host_veths_in(&self, result: &CniResult) -> Vec<String> {
        let Ok(links) = self.host.links() else {
            return Vec::new();
        };
        result
            .interfaces
            .iter()
            .filter(|i| i.sandbox.is_none())
            .filter(|i| {
                links
                    .iter()
                    .any(|l| l.name == i.name && l.kind.as_deref() == Some("veth"))
            })
            .map(|i| i.name.clone())
            .collect()
    }
}

/// An address whose DEL exited 0 and whose release is still to be judged
/// (the store is not host-local's layout).
#[derive(Clone, Debug)]
pub struct Pending {
    pub id: &'static str,
    pub ip: IpAddr,
    /// What was deleted, e.g. "DEL with CNI_NETNS unset of cnilab-lc-nonetns".
    pub what: String,
}

/// The finding for a judged release.
pub fn release_finding(p: &Pending, release: Release) -> Finding {
    match release {
        Release::Released(why) => Finding::pass(
            p.id,
            format!("{}: address {} released ({why})", p.what, p.ip),
        ),
        Release::Held(why) => Finding::fail(
            p.id,
            format!(
                "{}: exited 0 but address {} was not released: {why}",
                p.what, p.ip
            ),
        ),
        Release::Unknown(why) => Finding::skip(
            p.id,
            format!(
                "{}: inconclusive whether address {} was released: {why}",
                p.what, p.ip
            ),
        ),
    }
}

/// The addresses of a result.
pub fn ips_of(result: &CniResult) -> Vec<IpAddr> {
    result.ips.iter().map(|i| i.address.addr()).collect()
}

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
pub fn verify_kernel(lab: &Lab<'_>, pod: &Netns, rt: &RuntimeConf, result: &CniResult) -> Finding {
    let mut problems = Vec::new();
    let state = match pod.snapshot() {
        Ok(s) => s,
        Err(e) => return Finding::fail("A5", format!("cannot read the pod namespace: {e}")),
    };
    let host = lab.host.snapshot().unwrap_or_default();
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
    lab: &Lab<'_>,
    rt: &RuntimeConf,
    id: &'static str,
    what: &str,
) -> (Finding, bool) {
    match lab.runtime.del(lab.net, rt) {
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

/// The full lifecycle of one pod.
pub struct Lifecycle<'a> {
    lab: &'a Lab<'a>,
    ifname: String,
    id_prefix: String,
}

impl<'a> Lifecycle<'a> {
    pub fn new(lab: &'a Lab<'a>) -> Lifecycle<'a> {
        Lifecycle {
            lab,
            ifname: "eth0".into(),
            id_prefix: format!("cnilab-lc-{}", lab.net.version).replace('.', "-"),
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
        let lab = self.lab;
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
            if lab.runtime.add(lab.net, &warm).is_ok() {
                let _ = lab.runtime.del(lab.net, &warm);
            }
        }
        let before = lab.snapshot()?;

        // 1. ADD
        let added = match lab.runtime.add(lab.net, &rt) {
            Ok(a) => a,
            Err(e) => {
                out.push(error_finding("A1", "ADD must exit 0 with a result", &e));
                for id in [
                    "A2", "A3", "A4", "A5", "K2", "K4", "K5", "D1", "D2", "D4", "D5", "D7",
                ] {
                    out.push(Finding::skip(id, "depends on A1: ADD failed"));
                }
                // Like a runtime: DEL after a failed ADD.
                let _ = lab.runtime.del(lab.net, &rt);
                return Ok(out);
            }
        };
        if let Some(last) = added.executions.last() {
            out.extend(validate_add_output(lab.net, &rt, last));
        }
        let result = added.result.clone();
        let keep = lab.bridges_in(&result);
        let host_veths = lab.host_veths_in(&result);
        let layout = lab.layout_applies(&rt.container_id, &result);
        let mut pending = Vec::new();

        // 2. kernel state
        out.push(verify_kernel(lab, &pod, &rt, &result).with_all(&added.executions));

        // 3. CHECK, 4. tamper
        if lab.net.version >= Version::V0_4_0 && !lab.net.disable_check {
            out.extend(self.check_and_tamper(&pod, &rt, &result));
        }

        // 5. DEL
        let (f, _) = del_finding(lab, &rt, "D1", "DEL after ADD");
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
        let (f, _) = del_finding(lab, &rt, "D2", "second DEL of the same attachment");
        out.push(f);

        out.push(self.del_without_netns(&mut pending)?);
        out.push(self.del_after_netns_gone(&mut pending)?);
        // Releases the store could not show: what later ADDs hand out.
        out.extend(lab.judge_releases(&self.ifname, &self.id_prefix, &pending));
        Ok(out)
    }

    fn check_and_tamper(&self, pod: &Netns, rt: &RuntimeConf, result: &CniResult) -> Vec<Finding> {
        let lab = self.lab;
        let mut out = Vec::new();
        match lab.runtime.check(lab.net, rt) {
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
                let verdict = lab.runtime.check(lab.net, rt);
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
                    match lab.runtime.check(lab.net, rt) {
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
        let lab = self.lab;
        let mut problems = Vec::new();
        if pod.links()?.iter().any(|l| l.name == rt.ifname) {
            problems.push(format!("{} still exists in the pod namespace", rt.ifname));
        }
        let host_links = lab.host.links()?;
        for v in host_veths {
            if host_links.iter().any(|l| &l.name == v) {
                problems.push(format!("host veth {v} still exists"));
            }
        }
        for r in lab.reservations_of(&rt.container_id, &rt.ifname) {
            problems.push(format!(
                "address {} still reserved for {}",
                r.ip, r.container_id
            ));
        }
        for leak in lab.leaks_since(before, keep)? {
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
        let lab = self.lab;
        let pod = Netns::with_label("pod")?;
        let id = format!("{}-nonetns", self.id_prefix);
        let rt = RuntimeConf::new(&id, Some(pod.path()), &self.ifname);
        let added = match lab.runtime.add(lab.net, &rt) {
            Ok(a) => a,
            Err(e) => {
                let _ = lab.runtime.del(lab.net, &rt);
                return Ok(error_finding("D4", "setup ADD must succeed", &e));
            }
        };
        let layout = lab.layout_applies(&id, &added.result);
        let rt_no_netns = RuntimeConf::new(&id, None, &self.ifname);
        let (f, ok) = del_finding(lab, &rt_no_netns, "D4", "DEL with CNI_NETNS unset");
        if !ok {
            let _ = lab.runtime.del(lab.net, &rt);
            return Ok(f);
        }
        let left = lab.reservations_of(&id, &self.ifname);
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
        let _ = lab.runtime.del(lab.net, &rt);
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
        let lab = self.lab;
        let pod = Netns::with_label("pod")?;
        let id = format!("{}-gone", self.id_prefix);
        let rt = RuntimeConf::new(&id, Some(pod.path()), &self.ifname);
        let added = match lab.runtime.add(lab.net, &rt) {
            Ok(a) => a,
            Err(e) => {
                let _ = lab.runtime.del(lab.net, &rt);
                return Ok(error_finding("D5", "setup ADD must succeed", &e));
            }
        };
        let host_veths = lab.host_veths_in(&added.result);
        let layout = lab.layout_applies(&id, &added.result);
        pod.delete()?;
        let (f, ok) = del_finding(lab, &rt, "D5", "DEL after the netns was deleted");
        if !ok {
            return Ok(f);
        }
        let mut problems = Vec::new();
        for r in lab.reservations_of(&id, &self.ifname) {
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
            let links = lab.host.links().unwrap_or_default();
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
