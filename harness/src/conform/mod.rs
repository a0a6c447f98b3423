//! `cnilab conform`: every check of the CNI conformance checklist that
//! applies to a plugin, each PASS / WARN / FAIL / SKIP with evidence.
//!
//! The suite plays the runtime ([`Runtime`]) inside a throwaway host
//! namespace, with the IPAM `dataDir` pointed at a scratch directory, so
//! nothing of the real host is touched and the store can be inspected.

mod checks;
mod corpus;
pub mod report;
mod suite;

use crate::netns::{Netns, NetnsError};
use crate::runtime::{NetworkConfig, Runtime, RuntimeError};
use crate::util::ScratchDir;
use crate::verdict::{Finding, Verdict};
use cnilab_net::spec::Version;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use report::{CheckReport, ConformReport};

#[derive(Debug, thiserror::Error)]
pub enum ConformError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Runtime(#[from] Box<RuntimeError>),
    #[error(transparent)]
    Lifecycle(#[from] crate::lifecycle::LifecycleError),
    #[error("scratch directory: {0}")]
    Scratch(#[from] std::io::Error),
    #[error("unknown check ID(s) in --only: {0} (IDs look like E1, A12, G5; see the checklist)")]
    UnknownIds(String),
    #[error("--ifname {0:?} is not a valid interface name: {1}")]
    BadIfname(String, &'static str),
}

/// The checklist: ID and one-line name, in report order.
pub const CATALOG: &[(&str, &str)] = &[
    ("E1", "unknown CNI_COMMAND -> code 4"),
    ("E2", "missing CNI_* variable -> code 4 naming it"),
    ("E3", "invalid container ID -> code 4/3, no change"),
    ("E4", "invalid interface name -> error, nothing changed"),
    ("E5", "CNI_ARGS with IgnoreUnknown=1 accepted"),
    ("C1", "malformed JSON config -> code 6"),
    ("C2", "missing network name -> code 7"),
    ("C3", "unsupported cniVersion -> code 1"),
    ("C4", "unknown field tolerated or code 2 naming it"),
    ("C5", "runtime-injected keys tolerated"),
    ("V1", "VERSION prints cniVersion + supportedVersions"),
    ("V2", "VERSION echoes the input cniVersion"),
    ("V3", "ADD works in every supported version's format"),
    ("A1", "ADD exits 0 with one result on stdout"),
    ("A2", "result cniVersion equals the config's"),
    ("A3", "interfaces named, sandbox = CNI_NETNS"),
    ("A4", "ips are CIDR with valid interface index"),
    ("A5", "kernel state matches the result"),
    ("A6", "existing ifname -> ADD fails, original intact"),
    ("A7", "same container, other ifname -> distinct address"),
    ("A8", "chained plugin outputs prevResult plus changes"),
    ("A9", "IPAM delegated with same env and whole config"),
    ("A10", "failed ADD releases its IPAM allocation"),
    ("A11", "DEL after a failed ADD leaves nothing behind"),
    ("A12", "parallel ADDs succeed with unique addresses"),
    ("D1", "DEL exits 0 with no output"),
    ("D2", "second DEL succeeds"),
    ("D3", "DEL of a never-added container succeeds"),
    ("D4", "DEL without CNI_NETNS succeeds and releases"),
    ("D5", "DEL after netns is gone succeeds, releases"),
    ("D6", "DEL succeeds with and without prevResult"),
    ("D7", "DEL removes host veth, reservation, rules"),
    ("D8", "DEL releases only the given ifname"),
    ("K1", "CHECK below 0.4.0 -> code 1"),
    ("K2", "CHECK success prints nothing"),
    ("K3", "CHECK without prevResult fails"),
    ("K4", "CHECK detects flushed address / lost route"),
    ("K5", "CHECK passes right after ADD"),
    ("K6", "CHECK delegated to IPAM, errors propagate"),
    ("S1", "STATUS below 1.1.0 -> code 1"),
    ("S2", "STATUS ready -> exit 0, no output"),
    ("S3", "STATUS delegated to IPAM"),
    ("S4", "ADD works without STATUS"),
    ("G1", "GC env; both attachment keys accepted"),
    ("G2", "GC removes stale, keeps listed"),
    ("G3", "GC forwarded to IPAM"),
    ("G4", "GC continues on partial failure, reports it"),
    ("G5", "GC below 1.1.0 -> code 1"),
    ("X1", "generic hostile-input corpus refused cleanly"),
];

/// What to run.
#[derive(Clone, Debug)]
pub struct ConformOptions {
    /// Colon-separated plugin directories (CNI_PATH).
    pub plugin_dir: String,
    pub config: PathBuf,
    pub ifname: String,
    /// Only these IDs (case-insensitive); `None` runs everything.
    pub only: Option<Vec<String>>,
    pub timeout: Duration,
    /// The hostile-input corpus (`tests/corpus`); its generic cases are X1.
    pub corpus: Option<PathBuf>,
}

/// A progress event, for the live progress line.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    pub done: usize,
    pub total: usize,
    pub group: &'a str,
    pub elapsed: Option<Duration>,
}

/// A group of checks run together (they share setup).
pub(crate) struct Group {
    pub name: &'static str,
    pub ids: &'static [&'static str],
    pub run: fn(&suite::Suite<'_>) -> Result<Vec<Finding>, ConformError>,
}

/// Runs the suite. `progress` is called before and after each group.
pub fn run(
    opts: &ConformOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConformReport, ConformError> {
    if let Err(why) = cnilab_net::spec::check_ifname(&opts.ifname) {
        return Err(ConformError::BadIfname(opts.ifname.clone(), why));
    }
    let only: Option<Vec<String>> = opts
        .only
        .as_ref()
        .map(|ids| ids.iter().map(|i| i.trim().to_uppercase()).collect());
    if let Some(ids) = &only {
        let unknown: Vec<&String> = ids
            .iter()
            .filter(|i| !CATALOG.iter().any(|(c, _)| c == i))
            .collect();
        if !unknown.is_empty() {
            return Err(ConformError::UnknownIds(
                unknown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
    }
    let wanted = |id: &str| only.as_ref().is_none_or(|ids| ids.iter().any(|i| i == id));

    let mut net = NetworkConfig::load(&opts.config).map_err(Box::new)?;
    let scratch = ScratchDir::new("conform")?;
    let data_dir = scratch.path().join("ipam");
    net.set_ipam_data_dir(&data_dir);
    let host = Netns::with_label("host")?;
    host.set_lo_up()?;
    let runtime = Runtime::new(&opts.plugin_dir)
        .in_netns(&host)
        .map_err(Box::new)?
        .with_timeout(opts.timeout);
    runtime.find_plugins(&net).map_err(Box::new)?;
    let started = Instant::now();
    let suite = suite::Suite::new(&runtime, &host, &net, opts, scratch.path(), &data_dir)?;

    let groups: Vec<&Group> = checks::GROUPS
        .iter()
        .filter(|g| g.ids.iter().any(|id| wanted(id)))
        .collect();
    let mut findings: Vec<Finding> = suite.version_findings.clone();
    let mut group_times = Vec::new();
    let with_corpus = wanted("X1");
    let total = groups.len() + usize::from(with_corpus);
    for (n, group) in groups.iter().enumerate() {
        progress(Progress {
            done: n,
            total,
            group: group.name,
            elapsed: None,
        });
        let t = Instant::now();
        match (group.run)(&suite) {
            Ok(mut f) => findings.append(&mut f),
            Err(e) => {
                for id in group.ids {
                    findings.push(Finding::fail(
                        id,
                        format!("harness could not run this check: {e}"),
                    ));
                }
            }
        }
        group_times.push((group.name.to_string(), t.elapsed()));
        progress(Progress {
            done: n + 1,
            total,
            group: group.name,
            elapsed: Some(t.elapsed()),
        });
    }
    if with_corpus {
        let name = "hostile-input corpus";
        progress(Progress {
            done: groups.len(),
            total,
            group: name,
            elapsed: None,
        });
        let t = Instant::now();
        findings.extend(corpus::run(&suite, opts.corpus.as_deref()));
        group_times.push((name.to_string(), t.elapsed()));
        progress(Progress {
            done: total,
            total,
            group: name,
            elapsed: Some(t.elapsed()),
        });
    }
    let checks = CATALOG
        .iter()
        .filter(|(id, _)| wanted(id))
        .map(|(id, name)| {
            let mine: Vec<&Finding> = findings.iter().filter(|f| f.id == *id).collect();
            CheckReport::from_findings(id, name, &mine)
        })
        .collect();
    Ok(ConformReport::new(
        opts,
        &net,
        suite.plugin_versions(),
        checks,
        &runtime.timings(),
        group_times,
        started.elapsed(),
    ))
}

/// Supported-version helper: does the plugin list `v`?
pub(crate) fn lists(versions: &[Version], v: Version) -> bool {
    versions.contains(&v)
}

/// Worst verdict of a set (PASS when empty).
pub(crate) fn worst(findings: &[&Finding]) -> Verdict {
    findings
        .iter()
        .map(|f| f.verdict)
        .max()
        .unwrap_or(Verdict::Pass)
}
