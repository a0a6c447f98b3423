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

use super::suite::{reserved, Expect, Suite, SPY_NAME};
use super::{ConformError, Group};
use crate::lifecycle::{del_finding, error_finding, Lab, Lifecycle, Pending};
use crate::netns::Netns;
use crate::runtime::{CniCommand, GcKey, RuntimeConf};
use crate::util::clip;
use crate::verdict::{Finding, Verdict};
use cnilab_net::spec::{code, Attachment, CniResult, Version};
use serde_json::{json, Map, Value};
use std::collections::HashSet;

pub(crate) const GROUPS: &[Group] = &[
    Group {
        name: "lifecycle in every supported version",
        ids: &[
            "V3", "A1", "A2", "A3", "A4", "A5", "K2", "K4", "K5", "D1", "D2", "D4", "D5", "D7",
            "S4",
        ],
        run: lifecycle::lifecycles,
    },
    Group {
        name: "bad environment",
        ids: &["E1", "E2", "E3", "E4", "E5"],
        run: environment::environment,
    },
    Group {
        name: "bad or unusual config",
        ids: &["C1", "C2", "C3", "C4", "C5"],
        run: config::config,
    },
    Group {
        name: "existing ifname, second ifname",
        ids: &["A6", "A7", "D8"],
        run: interfaces::interfaces,
    },
    Group {
        name: "chaining",
        ids: &["A8"],
        run: chaining::chaining,
    },
    Group {
        name: "IPAM delegation",
        ids: &["A9", "K6", "S3", "G3", "G4"],
        run: delegation::delegation,
    },
    Group {
        name: "failure after IPAM",
        ids: &["A10", "A11"],
        run: failed_add::failed_add,
    },
    Group {
        name: "parallel ADD/DEL",
        ids: &["A12", "D7"],
        run: parallel::parallel,
    },
    Group {
        name: "DEL variants",
        ids: &["D3", "D6"],
        run: del_variants::del_variants,
    },
    Group {
        name: "CHECK rules",
        ids: &["K1", "K3"],
        run: check_rules::check_rules,
    },
    Group {
        name: "STATUS",
        ids: &["S1", "S2"],
        run: status::status,
    },
    Group {
        name: "GC",
        ids: &["G1", "G2", "G5"],
        run: gc::gc,
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

/// DEL through the first plugin, raw, ignoring the outcome (cleanup).
fn raw_del(s: &Suite<'_>, cid: &str, netns: Option<&std::path::Path>, stdin: &[u8]) {
    let env = s.env(CniCommand::Del, cid, netns, &s.ifname);
    if let Ok(p) = s.first_plugin() {
        let _ = s.runtime.exec_raw(&p, &env, stdin);
    }
}
