//! The lab's base floor: its error, the options of `lab up`, where the
//! bundled programs are, and the namespace, netlink and nft helpers every
//! builder step uses. Imports nothing else from `lab/`.

use super::topology::Topology;
use crate::model::{Link, LinkKind, Namespace};
use crate::netns::{Netns, NetnsError};
use crate::runtime::RuntimeError;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("{0}")]
    Setup(String),
    /// A fault or check that cannot apply to this plugin (a scenario SKIPs).
    #[error("{0}")]
    Unsupported(String),
}

pub(super) fn setup(msg: impl Into<String>) -> LabError {
    LabError::Setup(msg.into())
}

/// In a node's run dir: the agent's pid and start time.
pub const AGENT_PIDFILE: &str = "agent.pid";
/// In a lab's run dir: the pid and start time of the process that made it.
pub const OWNER_PIDFILE: &str = "owner.pid";

/// Makes a lab's run dir and records who made it (`owner.pid`: pid and
/// start time): what `cnilab sweep` and `lab down` go by once that process
/// is gone, compiled labs and replays alike.
pub(crate) fn make_run_dir(run_dir: &Path) -> Result<(), LabError> {
    std::fs::create_dir_all(run_dir)
        .map_err(|e| setup(format!("run dir {}: {e}", run_dir.display())))?;
    let me = super::pidfile::Identity::current()
        .ok_or_else(|| setup("cannot read this process's start time"))?;
    let path = run_dir.join(OWNER_PIDFILE);
    super::pidfile::write(&path, me).map_err(|e| setup(format!("{}: {e}", path.display())))
}

/// Options that do not belong to the topology.
#[derive(Clone, Debug, Default)]
pub struct UpOptions {
    /// Overrides the topology's plugin dir.
    pub plugin_dir: Option<String>,
    /// Names namespaces `cnilab-lab-<name>-…` and keeps them after the
    /// process exits (`cnilab lab up`).
    pub persistent: Option<String>,
    /// Where configs, IPAM stores and agent files go.
    pub run_dir: PathBuf,
    /// How pods are attached (`--runtime`).
    pub runtime: RuntimeKind,
}

/// How a lab attaches its pods.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// The harness executes the plugin itself (env + stdin), as today.
    #[default]
    Direct,
    /// A containerd per node; pods through the CRI, like kubelet.
    Containerd,
}

/// The directory of the running `cnilab` binary (where cargo puts
/// `cnilab-bridge` and `cnilab-agent` too).
pub fn own_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()?
        .parent()
        .map(Path::to_path_buf)
}

/// The directory of the bundled `cnilab-bridge`: next to this binary
/// (cargo's target dir; `cargo install` puts both in the same bin dir), else
/// the first absolute `$PATH` directory that has it. The error says how to
/// install it or point at a plugin.
pub fn bundled_plugin_dir() -> Result<PathBuf, String> {
    const NAME: &str = "cnilab-bridge";
    let path = std::env::var_os("PATH").unwrap_or_default();
    own_dir()
        .into_iter()
        .chain(std::env::split_paths(&path))
        .find(|d| d.is_absolute() && d.join(NAME).is_file())
        .ok_or_else(|| {
            format!(
                "the bundled plugin {NAME} is neither next to this binary ({}) nor on $PATH: install it next to cnilab (`cargo install --path plugin` in the repository, or `cargo build --release --workspace`), or pass --plugin-dir DIR (and --config TEMPLATE for your own plugin)",
                own_dir().unwrap_or_default().display()
            )
        })
}

/// The plugin dir a lab was given: `--plugin-dir`, else the topology's
/// `[plugin] dir`; `None` means the bundled plugin ([`plugin_dir`]).
pub fn given_plugin_dir<'a>(flag: Option<&'a str>, topo: &'a Topology) -> Option<&'a str> {
    flag.or_else(|| topo.plugin.as_ref().and_then(|p| p.dir.as_deref()))
}

/// The plugin dir a lab uses: the one given ([`given_plugin_dir`]), else
/// the bundled plugin's ([`bundled_plugin_dir`], whose error says how to
/// install it).
pub fn plugin_dir(flag: Option<&str>, topo: &Topology) -> Result<String, String> {
    match given_plugin_dir(flag, topo) {
        Some(dir) => Ok(dir.to_string()),
        None => bundled_plugin_dir().map(|d| d.display().to_string()),
    }
}

/// `name` next to the running binary if it is there, else as given (PATH).
pub fn resolve_program(name: &str) -> PathBuf {
    if !name.contains('/') {
        if let Some(dir) = own_dir() {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    PathBuf::from(name)
}

/// The lab's own record of the namespaces it created, one name a line,
/// appended right after each creation succeeds (a name that already existed
/// — another lab's — is never recorded).
pub(super) const LEDGER: &str = "namespaces";

/// Records that the lab whose run dir is `run_dir` created namespace `ns`.
pub fn record_namespace(run_dir: &Path, ns: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(run_dir)?;
    let mut ledger = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(run_dir.join(LEDGER))?;
    // One write(2) of one line: appends never interleave.
    ledger.write_all(format!("{ns}\n").as_bytes())
}

pub(super) fn make_ns(opts: &UpOptions, role: &str) -> Result<Netns, NetnsError> {
    make_ns_from(opts, role, None)
}

/// [`make_ns`] as `model::apply` calls it for each role: a closure that
/// owns its options (`apply::MakeNs` is `'static`).
pub(crate) fn ns_maker(
    opts: &UpOptions,
) -> impl Fn(&str) -> Result<Netns, NetnsError> + Sync + 'static {
    let opts = opts.clone();
    move |role: &str| make_ns(&opts, role)
}

/// [`make_ns`]; with `from`, names an existing namespace (a CRI pod's).
pub(crate) fn make_ns_from(
    opts: &UpOptions,
    role: &str,
    from: Option<&Path>,
) -> Result<Netns, NetnsError> {
    made_ns(
        opts,
        role,
        |name| Netns::persistent_from(name, from),
        |label| Netns::with_label_from(label, from),
    )
}

/// [`make_ns`] with `setup` run inside the fresh namespace on the thread
/// that made it (a pod's `lo` up and sysctls: one thread a pod, no
/// `setns`; see `Netns::with_label_setup`).
pub(super) fn make_ns_setup(
    opts: &UpOptions,
    role: &str,
    setup: crate::netns::Setup<'_>,
) -> Result<Netns, NetnsError> {
    made_ns(
        opts,
        role,
        |name| Netns::persistent_setup(name, setup),
        |label| Netns::with_label_setup(label, setup),
    )
}

/// A lab's namespace for `role`: a standing lab's by `persistent` under its
/// lab's name (and recorded in its ledger), a throwaway lab's by
/// `throwaway` under a label of the role.
fn made_ns(
    opts: &UpOptions,
    role: &str,
    persistent: impl FnOnce(&str) -> Result<Netns, NetnsError>,
    throwaway: impl FnOnce(&str) -> Result<Netns, NetnsError>,
) -> Result<Netns, NetnsError> {
    match &opts.persistent {
        Some(lab) => {
            let name = format!("{}lab-{lab}-{role}", crate::netns::PREFIX);
            // Recorded before it is made: a `lab up` killed right after the
            // mount leaves a namespace its ledger proves its own. A failed
            // creation takes the line back (`!name`): the name may be
            // another's.
            record_namespace(&opts.run_dir, &name).map_err(|e| NetnsError::Create {
                name: name.clone(),
                reason: format!("record it in {}: {e}", opts.run_dir.display()),
            })?;
            persistent(&name).inspect_err(|_| {
                let _ = record_namespace(&opts.run_dir, &format!("!{name}"));
            })
        }
        None => {
            let label: String = role.chars().take(12).collect();
            throwaway(&label)
        }
    }
}

/// Runs one netlink job in `ns`, mapping errors to a message naming `what`.
pub(super) fn netlink<F, Fut, R>(ns: &Netns, what: &str, job: F) -> Result<R, LabError>
where
    F: FnOnce(rtnetlink::Handle) -> Fut + Send,
    Fut: std::future::Future<Output = Result<R, rtnetlink::Error>>,
    R: Send,
{
    ns.netlink(job).map_err(|e| setup(format!("{what}: {e}")))
}

/// Feeds a ruleset to `nft -f -` inside `ns`.
pub fn nft(ns: &Netns, ruleset: &str) -> Result<(), LabError> {
    use cnilab_net::nft::NftError;
    let program = std::path::Path::new("nft");
    cnilab_net::nft::load(program, Some(ns.file()), ruleset).map_err(|e| match e {
        NftError::Spawn { source, .. } => setup(format!(
            "run nft in {}: {source} (is nftables installed?)",
            ns.name()
        )),
        NftError::Io { what, source } => setup(format!("{what}: {source}")),
        e @ NftError::Deadline { .. } => setup(format!("nft in {}: {e}", ns.name())),
        NftError::Failed { stderr, .. } => {
            setup(format!("nft in {}: {stderr}\n{ruleset}", ns.name()))
        }
    })
}

/// File descriptors a lab of `namespaces` namespaces holds open at once
/// (one a namespace, the runtimes' duplicates of the nodes', and room for
/// the plugin calls, probes and sockets under way).
pub(super) fn fds_needed(namespaces: usize, nodes: usize) -> u64 {
    (namespaces + nodes) as u64 + 1024
}

/// Raises this process's soft `RLIMIT_NOFILE` to `need` (never above the
/// hard limit, never lowered): a 5,000-pod lab holds a descriptor per
/// namespace, past the usual soft limit of 1,024. When even the hard limit
/// is too low, says so before anything is made.
pub(super) fn ensure_fd_limit(need: u64) -> Result<(), LabError> {
    use nix::libc;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(setup(format!(
            "getrlimit(RLIMIT_NOFILE): {}",
            std::io::Error::last_os_error()
        )));
    }
    if limit.rlim_cur >= need {
        return Ok(());
    }
    if limit.rlim_max < need {
        return Err(setup(format!(
            "this lab holds about {need} open files (one a namespace) but the hard limit is {} (ulimit -Hn): raise it (ulimit -n {need} as root) or use fewer pods",
            limit.rlim_max
        )));
    }
    limit.rlim_cur = need;
    // SAFETY: setrlimit(2) reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(setup(format!(
            "setrlimit(RLIMIT_NOFILE, {need}): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Waits until each `(namespace, link)` is operationally up (5 s at
/// most): the kernel's link watcher activates a link's queue when it notes
/// its carrier, on a busy machine noticeably later than the link was set
/// up, and until then the link drops what it sends (a lab checked at once
/// would lose its first probes).
pub(crate) fn wait_oper_up(links: &[(&Netns, &str)], what: &str) -> Result<(), LabError> {
    let limit = std::time::Duration::from_secs(5);
    let deadline = std::time::Instant::now() + limit;
    for (ns, link) in links {
        while !ns.oper_up(link)? {
            if std::time::Instant::now() >= deadline {
                return Err(setup(format!(
                    "{what}: {link} in {} did not come up within {limit:?}",
                    ns.name()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    Ok(())
}

/// Every veth of `namespaces` that is up and whose peer is not held down,
/// in its namespace (pods' veths are the plugin's), for [`wait_oper_up`].
pub(crate) fn veths_of<'a, 'n>(
    namespaces: impl Iterator<Item = &'a Namespace>,
    netns: impl Fn(&str) -> Option<&'n Netns>,
) -> Vec<(&'n Netns, &'a str)> {
    let namespaces: Vec<&Namespace> = namespaces.collect();
    // A veth whose peer the model holds down (a replayed fault) never
    // gets its carrier: not waited for. A peer outside `namespaces` (a
    // standing one) is up.
    let peer_down = |ns: &Namespace, l: &Link| {
        let Some(peer) = &l.veth else { return false };
        let role = peer.namespace.as_deref().unwrap_or(&ns.name);
        namespaces
            .iter()
            .find(|m| m.name == role)
            .and_then(|m| m.links.iter().find(|p| p.name == peer.name))
            .is_some_and(|p| !p.up)
    };
    namespaces
        .iter()
        .flat_map(|m| {
            let ns = netns(&m.name);
            m.links
                .iter()
                .filter(|l| l.kind == LinkKind::Veth && l.up && !peer_down(m, l))
                .filter_map(move |l| Some((ns?, l.name.as_str())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::topology::PluginSpec;

    fn fd_limits() -> (u64, u64) {
        let mut limit = nix::libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit(2) fills the struct it is given.
        let rc = unsafe { nix::libc::getrlimit(nix::libc::RLIMIT_NOFILE, &mut limit) };
        assert_eq!(rc, 0, "getrlimit");
        (limit.rlim_cur, limit.rlim_max)
    }

    /// A lab's descriptors fit: the soft limit is raised to the need (never
    /// lowered), and a need above the hard limit is refused with the remedy.
    #[test]
    fn the_fd_limit_is_raised_to_the_need_and_refused_above_the_hard_one() {
        let (soft, hard) = fd_limits();
        ensure_fd_limit(soft / 2).expect("below the soft limit");
        assert_eq!(fd_limits().0, soft, "never lowered");
        assert!(fds_needed(5_050, 50) > 5_050);
        if soft < hard {
            ensure_fd_limit(soft + 1).expect("up to the hard limit");
            assert_eq!(fd_limits().0, soft + 1);
        }
        if hard != nix::libc::RLIM_INFINITY {
            let err = ensure_fd_limit(hard + 1).expect_err("above the hard limit");
            assert!(err.to_string().contains("ulimit -Hn"), "{err}");
        }
    }

    /// `--plugin-dir`, then the topology's `[plugin] dir`, then the bundled
    /// plugin: one rule for `lab run`, `lab up`, `scenario run` and the
    /// builder.
    #[test]
    fn the_plugin_dir_is_the_flag_then_the_topology_then_the_bundled_one() {
        let mut topo = Topology::generated(1, 1).expect("topology");
        assert_eq!(given_plugin_dir(None, &topo), None);
        assert_eq!(
            plugin_dir(None, &topo),
            bundled_plugin_dir().map(|d| d.display().to_string()),
            "nothing given: the bundled one (or why it is missing)"
        );
        topo.plugin = Some(PluginSpec {
            dir: Some("/from/topology".into()),
            config: None,
        });
        assert_eq!(given_plugin_dir(None, &topo), Some("/from/topology"));
        assert_eq!(plugin_dir(None, &topo).as_deref(), Ok("/from/topology"));
        assert_eq!(
            plugin_dir(Some("/from/flag"), &topo).as_deref(),
            Ok("/from/flag")
        );
    }
}
