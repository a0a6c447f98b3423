//! The account at the end: what the plugin left behind (host links, and
//! addresses when the store cannot be read).

use super::engine::Soak;
use super::*;

/// Links in `host` that are not in `baseline`, after giving the kernel time
/// to finish destroying deleted namespaces (their veth peers go with them,
/// asynchronously).
pub(super) fn settled_leftovers(
    host: &Netns,
    baseline: &[crate::netns::Link],
) -> Result<Vec<crate::netns::Link>, SoakError> {
    let known: BTreeSet<(&str, Option<&str>)> = baseline
        .iter()
        .map(|l| (l.name.as_str(), l.kind.as_deref()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let extra: Vec<crate::netns::Link> = host
            .links()?
            .into_iter()
            .filter(|l| !known.contains(&(l.name.as_str(), l.kind.as_deref())))
            .collect();
        if extra.is_empty() || Instant::now() >= deadline {
            return Ok(extra);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Soak<'_> {
    /// After the final cleanup (no pod is live): ADD probe pods until every
    /// address the run handed out comes back. One the range ran out
    /// without is leaked, and attributed to its last owner.
    pub(super) fn account_by_probing(&self, findings: &mut Vec<Finding>, notes: &mut Vec<String>) {
        let mut owner: BTreeMap<IpAddr, String> = BTreeMap::new();
        if let Ok(log) = self.log.lock() {
            for r in log.iter().filter(|r| r.op.starts_with("ADD")) {
                for ip in &r.ips {
                    owner.insert(ip.addr(), r.container_id.clone());
                }
            }
        }
        let wanted: BTreeSet<IpAddr> = owner.keys().copied().collect();
        let budget = match self.capacity {
            Some(c) => (c.min(1024) as usize) + 1,
            None => 64,
        };
        let probe = accounting::Probe {
            runtime: self.runtime,
            net: self.net,
            ifname: &self.opts.ifname,
            prefix: "soak-probe".into(),
            budget,
        };
        let outcome = probe.run(&wanted, &BTreeMap::new());
        for (ip, holder, second) in &outcome.duplicates {
            findings.push(Finding::new(
                FindingKind::DuplicateAddress,
                format!("{ip} was handed to probe pod {second} while probe pod {holder} still held it (after the cleanup)"),
                Vec::new(),
            ));
        }
        let mut unknown = Vec::new();
        for ip in &wanted {
            let id = owner.get(ip).cloned().unwrap_or_default();
            match outcome.release_of(*ip) {
                accounting::Release::Released(_) => {}
                accounting::Release::Held(why) => {
                    let lost = self.lost.lock().is_ok_and(|l| l.contains(&id));
                    findings.push(Finding::new(
                        FindingKind::LeakedAddress,
                        format!(
                            "{ip}, last handed to {id}, is still held after every pod was deleted: {why}{}",
                            if lost {
                                " — the runtime lost this pod after its ADD was killed: only GC could reclaim it"
                            } else {
                                ""
                            }
                        ),
                        vec![id],
                    ));
                }
                accounting::Release::Unknown(why) => unknown.push(why),
            }
        }
        if !unknown.is_empty() {
            notes.push(format!(
                "cannot tell whether {} address(es) were released: {}",
                unknown.len(),
                unknown[0]
            ));
        }
    }

    /// Findings for the links left in `host` beyond `baseline` (naming the
    /// pod whose host veth it is, and whether it was planted); returns them.
    pub(super) fn leaked_links(
        &self,
        host: &Netns,
        baseline: &[crate::netns::Link],
        injected: Option<&inject::Planted>,
        findings: &mut Vec<Finding>,
    ) -> Result<Vec<crate::netns::Link>, SoakError> {
        let leftover_links = settled_leftovers(host, baseline)?;
        let ids_seen: BTreeSet<String> = self
            .log
            .lock()
            .map(|l| l.iter().map(|r| r.container_id.clone()).collect())
            .unwrap_or_default();
        let veth_owner: HashMap<String, String> = ids_seen
            .iter()
            .chain(injected.iter().flat_map(|i| i.container_ids.iter()))
            .map(|id| {
                (
                    cnilab_net::naming::host_veth_name(id, &self.opts.ifname),
                    id.clone(),
                )
            })
            .collect();
        for link in &leftover_links {
            let owner = veth_owner.get(&link.name).cloned();
            let injected_here = injected
                .as_ref()
                .is_some_and(|i| i.links.contains(&link.name));
            findings.push(Finding::new(
                FindingKind::LeakedLink,
                format!(
                    "{} {} is left in the host namespace{}{}",
                    link.kind.as_deref().unwrap_or("link"),
                    link.name,
                    match &owner {
                        Some(id) => format!(" (host side of {id})"),
                        None => String::new(),
                    },
                    if injected_here {
                        " — planted on purpose, GC did not reclaim it"
                    } else {
                        ""
                    }
                ),
                owner.into_iter().collect(),
            ));
        }
        Ok(leftover_links)
    }

    /// Findings for every address still reserved in `store_dir` (a
    /// host-local-layout store), each with its owner or why it has none.
    /// Returns whether the store was read, and the addresses it holds.
    pub(super) fn leaked_records(
        &self,
        store_dir: Option<&Path>,
        injected: Option<&inject::Planted>,
        findings: &mut Vec<Finding>,
    ) -> Result<(bool, BTreeSet<IpAddr>), SoakError> {
        let mut store_readable = false;
        let mut leftover_ips: BTreeSet<IpAddr> = BTreeSet::new();
        if let Some(dir) = store_dir {
            if dir.is_dir() {
                store_readable = true;
                let records = host_state::reservations(dir).map_err(SoakError::Scratch)?;
                for r in records {
                    leftover_ips.insert(r.ip);
                    let planted = injected.as_ref().is_some_and(|i| i.records.contains(&r.ip));
                    let lost_pod = self
                        .lost
                        .lock()
                        .map(|l| l.contains(&r.container_id))
                        .unwrap_or(false);
                    let mut owners = Vec::new();
                    let why = if planted {
                        " — planted on purpose, GC did not reclaim it".to_string()
                    } else if lost_pod {
                        " — the runtime lost this pod after its ADD was killed: only GC could reclaim it"
                            .to_string()
                    } else if r.container_id.is_empty() {
                        // Its writer died between creating the file and filling
                        // it: the ADDs killed while the file was made are the
                        // suspects (a DEL matches records by owner, so it never
                        // releases this one, and GC skips what it cannot parse).
                        let suspects = self.killed_adds_around(&dir.join(r.ip.to_string()));
                        owners.extend(suspects.iter().cloned());
                        format!(
                            " — an empty record, left by an ADD killed between creating and writing it ({})",
                            if suspects.is_empty() {
                                "no killed ADD ran when the file was made".to_string()
                            } else {
                                format!("made during the killed ADD of {}", suspects.join(", "))
                            }
                        )
                    } else {
                        String::new()
                    };
                    if !r.container_id.is_empty() {
                        owners.insert(0, r.container_id.clone());
                    }
                    findings.push(Finding::new(
                        FindingKind::LeakedAddress,
                        format!(
                            "{} is still reserved in {} for container {:?} ifname {:?}{why}",
                            r.ip,
                            dir.display(),
                            r.container_id,
                            r.ifname,
                        ),
                        owners,
                    ));
                }
            }
        }
        Ok((store_readable, leftover_ips))
    }
}

/// What the host held before the churn: the account compares against it.
pub(super) struct Baseline<'a> {
    pub links: &'a [crate::netns::Link],
    /// `None` when no firewall tool could read the rules.
    pub rules: Option<&'a [String]>,
    pub store_dir: Option<&'a Path>,
    /// Whether the warm-up found the store in host-local's layout.
    pub layout: bool,
}

/// The account's result: every finding, and how the planted leaks fared.
pub(super) struct Account {
    pub findings: Vec<Finding>,
    pub injected: Option<report::Injected>,
}

impl Soak<'_> {
    /// After the teardown: links, firewall rules and addresses left behind,
    /// by reading the store when it has host-local's layout and by probing
    /// otherwise; notes say which way and why.
    pub(super) fn account(
        &self,
        host: &Netns,
        baseline: Baseline<'_>,
        injected: Option<&inject::Planted>,
        notes: &mut Vec<String>,
    ) -> Result<Account, SoakError> {
        let mut findings = self.findings.lock().map(|f| f.clone()).unwrap_or_default();
        let leftover_links = self.leaked_links(host, baseline.links, injected, &mut findings)?;
        if let (Some(before), Some(after)) = (baseline.rules, host_state::firewall_rules(host)) {
            for rule in host_state::new_lines(before, &after) {
                findings.push(Finding::new(
                    FindingKind::LeakedRule,
                    format!("firewall rule left: {rule}"),
                    Vec::new(),
                ));
            }
        }
        let (store_readable, leftover_ips) = self.leaked_records(
            baseline.store_dir.filter(|_| baseline.layout),
            injected,
            &mut findings,
        )?;
        if !store_readable {
            match baseline.store_dir {
                Some(dir) => {
                    notes.push(format!(
                        "the store at {} is not in host-local's layout: addresses are accounted by probing (ADDs after the cleanup until every address handed out came back, or the range ran out)",
                        dir.display()
                    ));
                    self.account_by_probing(&mut findings, notes);
                }
                None => {
                    notes.push("the config has no ipam section: no address store to account".into())
                }
            }
        }
        let without_netns = self.left_without_netns.load(Ordering::Relaxed);
        if without_netns > 0 {
            notes.push(format!(
                "{without_netns} pod namespace(s) still had the pod interface after a DEL without CNI_NETNS (allowed: the plugin cannot reach it, the runtime deletes the namespace next)"
            ));
        }
        let injected = injected.map(|i| {
            let kept_records = i
                .records
                .iter()
                .filter(|ip| leftover_ips.contains(ip))
                .count();
            let kept_links = i
                .links
                .iter()
                .filter(|n| leftover_links.iter().any(|l| &l.name == *n))
                .count();
            report::Injected {
                records: i.records.len(),
                links: i.links.len(),
                records_reclaimed: i.records.len() - kept_records,
                links_reclaimed: i.links.len() - kept_links,
            }
        });
        Ok(Account { findings, injected })
    }
}
