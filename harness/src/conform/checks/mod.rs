//! The conformance checks, one file per group of checks that share setup.
//!
//! Each returns findings tagged with checklist IDs; the report merges them per ID (worst verdict wins).

mod chaining;
mod check_rules;
mod config;
mod del_variants;
mod delegation;
mod environment;
mod failed_add;
mod gc;
mod interfaces;
mod lifecycle;
mod parallel;
mod status;

use super::rules::Check;
use super::suite::{reserved, Expect, Suite, SPY_NAME};
use super::{ConformError, Group};
use crate::lifecycle::{del_finding, error_finding, Lifecycle, Pending, Target};
use crate::netns::Netns;
use crate::runtime::{CniCommand, GcKey, RuntimeConf};
use crate::util::clip;
use crate::verdict::{Finding, Verdict};
use cnilab_net::spec::{code, Attachment, CniResult, Version};
use serde_json::{json, Map, Value};
use std::collections::HashSet;

/// The groups in the order they run: name, what they report (the rules
/// that name it in `rules.rs`), the check.
pub(crate) const GROUPS: &[Group] = &[
    // The longest group, cut in [`lifecycle::PARTS`] (first, so they start
    // first); each part reports every ID of the lifecycle.
    group(
        "lifecycle in every supported version (1/3)",
        Check::Lifecycle,
        lifecycle::part::<0>,
    ),
    group(
        "lifecycle in every supported version (2/3)",
        Check::Lifecycle,
        lifecycle::part::<1>,
    ),
    group(
        "lifecycle in every supported version (3/3)",
        Check::Lifecycle,
        lifecycle::part::<2>,
    ),
    group(
        "bad environment",
        Check::Environment,
        environment::environment,
    ),
    group("bad or unusual config", Check::Config, config::config),
    group(
        "existing ifname, second ifname",
        Check::Interfaces,
        interfaces::interfaces,
    ),
    group("chaining", Check::Chaining, chaining::chaining),
    group("IPAM delegation", Check::Delegation, delegation::delegation),
    group(
        "failure after IPAM",
        Check::FailedAdd,
        failed_add::failed_add,
    ),
    group("parallel ADD/DEL", Check::Parallel, parallel::parallel),
    group(
        "DEL variants",
        Check::DelVariants,
        del_variants::del_variants,
    ),
    group("CHECK rules", Check::CheckRules, check_rules::check_rules),
    group("STATUS", Check::Status, status::status),
    group("GC", Check::Gc, gc::gc),
];

const fn group(
    name: &'static str,
    check: Check,
    run: fn(&Suite<'_>) -> Result<Vec<Finding>, ConformError>,
) -> Group {
    Group { name, check, run }
}

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

/// DEL through the first plugin, raw, ignoring the outcome (cleanup).
fn raw_del(s: &Suite<'_>, cid: &str, netns: Option<&std::path::Path>, stdin: &[u8]) {
    let env = s.env(CniCommand::Del, cid, netns, &s.ifname);
    if let Ok(p) = s.first_plugin() {
        let _ = s.runtime.exec_raw(&p, &env, stdin);
    }
}
