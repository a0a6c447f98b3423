//! Chaining: prevResult handed down a conflist (A8).

use super::*;

pub(super) fn chaining(s: &Suite<'_>) -> Result<Vec<Finding>, ConformError> {
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
