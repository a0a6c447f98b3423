//! `cnilab conform`: a plugin against the CNI conformance checklist.
//!
//! Every check of the CNI conformance checklist that
//! applies to a plugin, each PASS / WARN / FAIL / SKIP with evidence.
//!
//! The suite plays the runtime ([`Runtime`]) inside a throwaway host
//! namespace, with the IPAM `dataDir` pointed at a scratch directory, so
//! nothing of the real host is touched and the store can be inspected.
//! `rules` is the checklist, one record a rule (ID, name, the group that
//! reports it, its fix); `advice` says which root cause explains several
//! failed rules (the report's "fix first" list).

pub mod advice;
mod checks;
mod corpus;
pub mod report;
pub mod rules;
mod suite;

use crate::netns::{Netns, NetnsError};
use crate::runtime::session::Session;
use crate::runtime::{NetworkConfig, RuntimeError};
use crate::util::ScratchDir;
use crate::verdict::{Finding, Verdict};
use cnilab_net::snapshot::HostNetwork;
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
    #[error("--host-setup {path}: {reason}")]
    HostSetup { path: PathBuf, reason: String },
    /// A plugin the config names cannot be run at all (missing, not
    /// executable, VERSION does not start or never ends).
    #[error("the plugin cannot be run, so nothing was checked: {0}")]
    Precheck(String),
    /// The first ADD failed for a reason of the machine, not the plugin.
    #[error("the environment cannot run this config, so nothing was checked: {0}")]
    Environment(String),
}

/// Groups (and the corpus) run this many at once by default, each in its
/// own world.
pub const DEFAULT_JOBS: usize = 4;

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
    /// A shell script run (`sh FILE`) inside each fresh host namespace
    /// before its group, e.g. to create the master link macvlan needs.
    pub host_setup: Option<PathBuf>,
    /// Check groups run at once (each in its own namespaces and store); 1
    /// for a plugin that keeps state outside `ipam.dataDir`.
    pub jobs: usize,
    /// Seeds the container IDs (64 hex characters, like a runtime's);
    /// `None`: a new seed per run.
    pub seed: Option<u64>,
}

impl ConformOptions {
    /// Defaults for everything but the plugin and its config.
    pub fn new(plugin_dir: &str, config: &std::path::Path) -> ConformOptions {
        ConformOptions {
            plugin_dir: plugin_dir.to_string(),
            config: config.to_path_buf(),
            ifname: "eth0".into(),
            only: None,
            timeout: crate::runtime::DEFAULT_TIMEOUT,
            corpus: None,
            host_setup: None,
            jobs: DEFAULT_JOBS,
            seed: None,
        }
    }
}

/// One group's own world: a fresh host namespace (set up by
/// `--host-setup`), a runtime in it and a fresh IPAM `dataDir`, so that
/// what one check leaves behind cannot fail another.
type World = Session;

fn world(
    opts: &ConformOptions,
    net: &NetworkConfig,
    scratch: &std::path::Path,
    n: usize,
) -> Result<World, ConformError> {
    let w = Session::open::<ConformError>(
        &opts.plugin_dir,
        net,
        &scratch.join(format!("ipam-{n}")),
        "host",
        opts.timeout,
    )?;
    if let Some(script) = &opts.host_setup {
        let bad = |reason: String| ConformError::HostSetup {
            path: script.clone(),
            reason,
        };
        let out = w
            .host
            .command("sh")
            .arg(script)
            .output()
            .map_err(|e| bad(format!("cannot run: {e}")))?;
        if !out.status.success() {
            return Err(bad(format!(
                "exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    // A warm-up pod, so that what a plugin keeps per network (its bridge)
    // exists before the checks and is not counted as their doing.
    let pod = Netns::with_label("pod")?;
    let rt = crate::runtime::RuntimeConf::new(
        &crate::rng::container_id(crate::rng::seed_from_clock(), n as u64),
        Some(pod.path()),
        &opts.ifname,
    );
    if w.runtime.add(&w.net, &rt).is_ok() {
        let _ = w.runtime.del(&w.net, &rt);
    }
    Ok(w)
}

/// Why an ADD error is the machine's, not the plugin's: the text to show
/// and what to provide. `None` when it may well be the plugin's.
pub fn environment_reason(msg: &str) -> Option<&'static str> {
    let m = msg.to_lowercase();
    if m.contains("operation not supported") || m.contains("not supported by the kernel") {
        Some("a kernel feature or module the plugin needs is missing (load the module, e.g. `modprobe ipvlan`, or use a kernel that has it)")
    } else if m.contains("link not found") || m.contains("failed to lookup master") {
        Some("a link the config names (e.g. the macvlan/ipvlan \"master\") does not exist in the harness's host namespace: create it with --host-setup FILE (see harness/examples/macvlan-host-setup.sh)")
    } else if m.contains("failed to find plugin") || m.contains("not found in cni_path") {
        Some("a plugin binary the config names is missing from --plugin-dir")
    } else {
        None
    }
}

/// Before any rule: every plugin the config names is on `--plugin-dir`, is
/// executable, and a VERSION call starts and ends (what it answers is V1's
/// business). Each failure says how to fix it.
fn precheck(w: &World, opts: &ConformOptions) -> Result<(), ConformError> {
    use std::os::unix::fs::PermissionsExt;
    for index in 0..w.net.plugins.len() {
        let name = w.net.plugin_type(index);
        let path = w.runtime.find_plugin(name).map_err(|e| {
            ConformError::Precheck(format!(
                "{e}: put the plugin binary in --plugin-dir {}, or fix \"type\" in --config {}",
                opts.plugin_dir,
                opts.config.display()
            ))
        })?;
        let mode = std::fs::metadata(&path)
            .map(|m| m.permissions().mode())
            .unwrap_or(0);
        if mode & 0o111 == 0 {
            return Err(ConformError::Precheck(format!(
                "{} is not executable (mode {:o}): chmod +x {}",
                path.display(),
                mode & 0o7777,
                path.display()
            )));
        }
        let version = w.net.version.to_string();
        let broken = match w.runtime.version(name, &version) {
            Err(RuntimeError::Spawn { reason, .. }) => Some(reason),
            Err(RuntimeError::Timeout(e)) => Some(format!(
                "VERSION did not finish within {:?} (--timeout)",
                e.duration
            )),
            // 126/127: the shell could not run it (bad interpreter line).
            Err(RuntimeError::Crashed(e)) if matches!(e.exit_code, Some(126 | 127)) => {
                Some(format!("{}: {}", e.status_text(), e.stderr.trim()))
            }
            _ => None,
        };
        if let Some(why) = broken {
            return Err(ConformError::Precheck(format!(
                "{} does not answer VERSION: {why}; run `CNI_COMMAND=VERSION {} </dev/null` to see why (a plugin must start and print {{\"cniVersion\", \"supportedVersions\"}})",
                path.display(),
                path.display()
            )));
        }
    }
    Ok(())
}

/// The first ADD of the run: when it fails for a reason of the machine,
/// nothing else can be judged.
fn preflight(w: &World, ifname: &str) -> Result<(), ConformError> {
    let pod = Netns::with_label("pod")?;
    let id = crate::rng::container_id(crate::rng::seed_from_clock(), u64::MAX);
    let rt = crate::runtime::RuntimeConf::new(&id, Some(pod.path()), ifname);
    let added = w.runtime.add(&w.net, &rt);
    let _ = w.runtime.del(&w.net, &rt);
    match added {
        Err(e) => {
            let text = crate::accounting::error_text(&e);
            match environment_reason(&text) {
                Some(what) => Err(ConformError::Environment(format!(
                    "the first ADD failed with \"{text}\": {what}"
                ))),
                None => Ok(()),
            }
        }
        Ok(_) => Ok(()),
    }
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
    /// The rules it reports are those of [`rules::RULES`] that name it.
    pub check: rules::Check,
    pub run: fn(&suite::Suite<'_>) -> Result<Vec<Finding>, ConformError>,
}

/// The rule IDs `--only` names, upper-cased (`None`: every rule); an ID
/// the catalog does not know is an error naming it.
fn only_ids(opts: &ConformOptions) -> Result<Option<Vec<String>>, ConformError> {
    let only: Option<Vec<String>> = opts
        .only
        .as_ref()
        .map(|ids| ids.iter().map(|i| i.trim().to_uppercase()).collect());
    if let Some(ids) = &only {
        let unknown: Vec<&String> = ids.iter().filter(|i| rules::rule_of(i).is_none()).collect();
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
    Ok(only)
}

/// Runs the suite. `progress` is called before and after each group.
pub fn run(
    opts: &ConformOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConformReport, ConformError> {
    if let Err(why) = cnilab_net::spec::check_ifname(&opts.ifname) {
        return Err(ConformError::BadIfname(opts.ifname.clone(), why));
    }
    let only = only_ids(opts)?;
    let wanted = |id: &str| only.as_ref().is_none_or(|ids| ids.iter().any(|i| i == id));

    let net = NetworkConfig::load(&opts.config).map_err(Box::new)?;
    // The plugins run in throwaway namespaces; one that reaches into the
    // namespace conform itself runs in must not go unseen.
    let own_before = own_network();
    let scratch = ScratchDir::new("conform")?;
    let first = world(opts, &net, scratch.path(), 0)?;
    precheck(&first, opts)?;
    let started = Instant::now();
    let suite = suite::Suite::new(
        &first.runtime,
        &first.host,
        &first.net,
        opts,
        scratch.path(),
        &first.data_dir,
    )?;
    preflight(&first, &opts.ifname)?;

    let groups: Vec<&Group> = checks::GROUPS
        .iter()
        .filter(|g| rules::ids_of(g.check).iter().any(|id| wanted(id)))
        .collect();
    let mut findings: Vec<Finding> = suite.version_findings.clone();
    let mut timings = first.runtime.timings();
    let with_corpus = wanted("X1");
    // Every group runs in a world of its own, so groups are independent:
    // a few run at once. Results come back in any order; the report
    // merges per check ID, and group times keep the catalog's order.
    let mut tasks: Vec<(&'static str, Option<&Group>)> =
        groups.iter().map(|g| (g.name, Some(*g))).collect();
    if with_corpus {
        tasks.push(("hostile-input corpus", None));
    }
    let total = tasks.len();
    // Workers take the longest tasks first (the corpus, then the lifecycle
    // parts, which lead the catalog), so no long task starts last; the
    // report keeps the catalog's order.
    let mut picks: Vec<usize> = (0..total).collect();
    picks.rotate_right(usize::from(with_corpus));
    progress(Progress {
        done: 0,
        total,
        group: picks
            .first()
            .and_then(|&n| tasks.get(n))
            .map_or("", |t| t.0),
        elapsed: None,
    });
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut done: Vec<Option<(Duration, Vec<Finding>)>> = vec![None; total];
    let mut setup_error = None;
    std::thread::scope(|scope| {
        for _ in 0..opts.jobs.clamp(1, total.max(1)) {
            let tx = tx.clone();
            let (tasks, picks, next, suite, net) = (&tasks, &picks, &next, &suite, &net);
            let scratch = scratch.path();
            scope.spawn(move || loop {
                let pick = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&n) = picks.get(pick) else {
                    break;
                };
                let Some((_, group)) = tasks.get(n) else {
                    break;
                };
                let t = Instant::now();
                let result = world(opts, net, scratch, n + 1).map(|w| {
                    let gsuite = suite.for_world(&w.runtime, &w.host, &w.net, &w.data_dir);
                    (run_task(*group, &gsuite, opts), w.runtime.timings())
                });
                if tx.send((n, t.elapsed(), result)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (finished, (n, took, result)) in (1..).zip(rx) {
            match result {
                Ok((found, t)) => {
                    done[n] = Some((took, found));
                    timings.extend(t);
                }
                Err(e) => {
                    setup_error.get_or_insert(e);
                }
            }
            progress(Progress {
                done: finished,
                total,
                group: tasks[n].0,
                elapsed: Some(took),
            });
        }
    });
    if let Some(e) = setup_error {
        return Err(e);
    }
    let mut group_times = Vec::new();
    for ((name, _), slot) in tasks.iter().zip(done) {
        if let Some((took, mut found)) = slot {
            findings.append(&mut found);
            group_times.push((name.to_string(), took));
        }
    }
    let own = own_namespace_finding(own_before);
    let own_failed = own.verdict == Verdict::Fail;
    findings.push(own);
    let checks = rules::RULES
        .iter()
        // H1 is reported when asked for, and always when it fails.
        .filter(|r| wanted(r.id) || (r.id == "H1" && own_failed))
        .map(|r| {
            let mine: Vec<&Finding> = findings.iter().filter(|f| f.id == r.id).collect();
            CheckReport::from_findings(r.id, r.name, &mine)
        })
        .collect();
    Ok(ConformReport::new(
        opts,
        &net,
        suite.plugin_versions(),
        checks,
        &timings,
        group_times,
        started.elapsed(),
    ))
}

/// One task of [`run`] in its world: a group's checks (a group that could
/// not run fails each of its IDs), or the hostile-input corpus.
fn run_task(group: Option<&Group>, gsuite: &suite::Suite, opts: &ConformOptions) -> Vec<Finding> {
    match group {
        Some(g) => match (g.run)(gsuite) {
            Ok(f) => f,
            Err(e) => rules::ids_of(g.check)
                .iter()
                .map(|id| Finding::fail(id, format!("harness could not run this check: {e}")))
                .collect(),
        },
        None => corpus::run(gsuite, opts.corpus.as_deref()),
    }
}

/// The namespace this process runs in (the machine's own, or the one
/// `ip netns exec` put it in), as a snapshot.
fn own_network() -> Result<HostNetwork, String> {
    crate::netns::Netns::machine()
        .and_then(|ns| HostNetwork::of(&ns))
        .map_err(|e| e.to_string())
}

/// H1: what changed in conform's own namespace while the plugins ran.
fn own_namespace_finding(before: Result<HostNetwork, String>) -> Finding {
    let after = own_network();
    let (before, after) = match (before, after) {
        (Ok(b), Ok(a)) => (b, a),
        (Err(e), _) | (_, Err(e)) => {
            return Finding::warn(
                "H1",
                format!("could not snapshot conform's own namespace: {e}"),
            )
        }
    };
    let changes = after.changes_since(&before);
    if changes.is_empty() {
        return Finding::pass(
            "H1",
            "links, addresses, routes, firewall and sysctls unchanged",
        );
    }
    Finding::fail(
        "H1",
        format!(
            "the namespace conform runs in changed while the plugins ran (a plugin reached out of its namespaces): {}",
            changes.join("; ")
        ),
    )
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

#[cfg(test)]
mod tests {
    use super::environment_reason;

    #[test]
    fn environment_failures_are_told_from_plugin_failures() {
        let link = environment_reason("code 999: Link not found").expect("missing master");
        assert!(link.contains("--host-setup"), "{link}");
        let module = environment_reason("failed to create ipvlan: operation not supported")
            .expect("missing kernel feature");
        assert!(module.contains("module"), "{module}");
        assert!(environment_reason("failed to find plugin \"x\" in path [/opt]").is_some());
        assert!(environment_reason("no IP addresses available in range set").is_none());
        assert!(environment_reason("code 7: missing network name").is_none());
    }
}
