//! Pod placeholders: a model's nftables text may name a pod's address
//! (`{{pod:<pod>:ipv4}}`) that the plugin's IPAM chooses only when the pod
//! is attached (a Service's backends); they are bound once the pods have
//! their addresses.

use super::{LabModel, NftTable};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// `{{pod:<pod>:ipv4}}`: a pod's IPv4 address, which the plugin's IPAM
/// chooses; [`super::identity::bind_pod_addresses`] fills it in.
pub fn pod_placeholder(pod: &str) -> String {
    format!("{POD_PLACEHOLDER}{pod}:ipv4}}}}")
}

/// How every pod placeholder ([`pod_placeholder`]) begins.
pub const POD_PLACEHOLDER: &str = "{{pod:";

/// `text` with every [`pod_placeholder`] filled from `addresses` (a pod's
/// IPv4 address by pod name).
pub fn bind_pod_placeholders(
    text: &str,
    addresses: &BTreeMap<String, IpAddr>,
) -> Result<String, String> {
    let mut text = text.to_string();
    while let Some(start) = text.find(POD_PLACEHOLDER) {
        let end = text[start..]
            .find("}}")
            .map(|e| start + e + 2)
            .ok_or("an unclosed placeholder")?;
        let inner = &text[start + POD_PLACEHOLDER.len()..end - 2];
        let pod = inner.trim_end_matches(":ipv4");
        let ip = addresses
            .get(pod)
            .ok_or_else(|| format!("pod {pod} has no IPv4 address on eth0"))?;
        text.replace_range(start..end, &ip.to_string());
    }
    Ok(text)
}

/// The tables of `model` bound to pod addresses (the Services, which
/// [`infrastructure`] leaves to the steps after apply), by namespace, their
/// placeholders filled from `addresses`.
pub fn pod_bound_tables(
    model: &LabModel,
    addresses: &BTreeMap<String, IpAddr>,
) -> Result<Vec<(String, NftTable)>, String> {
    let mut out = Vec::new();
    for ns in model.namespaces() {
        for table in ns
            .nftables
            .iter()
            .filter(|t| t.text.contains(POD_PLACEHOLDER))
        {
            let text = bind_pod_placeholders(&table.text, addresses)
                .map_err(|e| format!("{}: {e}", ns.name))?;
            out.push((
                ns.name.clone(),
                NftTable {
                    text,
                    ..table.clone()
                },
            ));
        }
    }
    Ok(out)
}
