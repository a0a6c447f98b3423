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
}
