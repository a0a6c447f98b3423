//! `cnilab bench`: ADD and DEL latency of one plugin (and optionally a
//! second one beside it), sequential and parallel, driven by [`Runtime`]
//! inside a throwaway host namespace, with a bare-veth baseline; and
//! (`variants`) both against a floor, `cnilab-floor`, on ADD, ADD with
//! `ipMasq`, ADD dual-stack and DEL, as ratios from one run; with
//! `--lab`, a lab run's figures and conform's run on the reference (`lab`,
//! filled in by the CLI).

pub mod lab;
pub mod variants;

use crate::netns::{Netns, NetnsError};
use crate::runtime::session::Session;
use crate::runtime::{NetworkConfig, RuntimeConf, RuntimeError};
use crate::util::{fmt_ms, Percentiles, ScratchDir};
use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVeth};
use rtnetlink::{LinkMessageBuilder, LinkUnspec, LinkVeth};
use std::fmt;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Runtime(#[from] Box<RuntimeError>),
    #[error(
        "{plugin}: {op} of pod {pod} failed, so its latency figures would be meaningless: {source}"
    )]
    Op {
        plugin: String,
        op: &'static str,
        pod: String,
        source: Box<RuntimeError>,
    },
    #[error("scratch directory: {0}")]
    Scratch(std::io::Error),
    #[error("--pods must be at least 1 and --parallel at least 1")]
    BadCounts,
    #[error("{plugin}: cannot derive the floor comparison's configs: {reason}")]
    Variant { plugin: String, reason: String },
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Colon-separated plugin directories (CNI_PATH).
    pub plugin_dir: String,
    pub config: PathBuf,
    /// Container interface name of the measured pods.
    pub ifname: String,
    pub pods: usize,
    pub parallel: usize,
    /// A second plugin to compare with (usually the reference bridge).
    pub versus: Option<(String, PathBuf)>,
    pub timeout: Duration,
    /// Where `cnilab-floor` is; `None`: next to this program, else in
    /// `plugin_dir`.
    pub floor_dir: Option<String>,
}

/// Latencies of one plugin.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PluginBench {
    pub label: String,
    pub config_version: String,
    pub add_sequential: Percentiles,
    pub del_sequential: Percentiles,
    pub add_parallel: Percentiles,
    pub del_parallel: Percentiles,
}

/// Cost of a bare veth pair via netlink in a namespace.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Baseline {
    pub veth_create: Percentiles,
    /// Both ends in one namespace.
    pub veth_delete: Percentiles,
    /// Peer in a pod namespace, deleted there (what a plugin's DEL does).
    pub pod_veth_delete: Percentiles,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchReport {
    pub pods: usize,
    pub parallel: usize,
    pub ours: PluginBench,
    pub versus: Option<PluginBench>,
    pub baseline: Baseline,
    /// Floor, ours and versus on ADD, ADD ipMasq, ADD dual-stack and DEL;
    /// `None` when `cnilab-floor` was not found (`floor_missing` says so).
    pub floor: Option<variants::FloorComparison>,
    pub floor_missing: Option<String>,
    /// `--lab NODESxPODS`: the lab run's figures.
    pub lab: Option<lab::LabFigures>,
    /// With `--lab` and `--vs-*`: `conform`'s run on the plugin compared
    /// with (the reference).
    pub conform: Option<lab::ConformFigures>,
}

/// Runs the benchmark. Everything happens inside throwaway namespaces.
pub fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    if opts.pods == 0 || opts.parallel == 0 {
        return Err(BenchError::BadCounts);
    }
    let ours = bench_plugin(&opts.plugin_dir, &opts.config, opts)?;
    let versus = match &opts.versus {
        Some((dir, config)) => Some(bench_plugin(dir, config, opts)?),
        None => None,
    };
    let baseline = bare_veth_baseline(opts.pods)?;
    let (floor, floor_missing) = match find_floor(opts) {
        Ok(dir) => (Some(against_floor(&dir, opts)?), None),
        Err(missing) => (None, Some(missing)),
    };
    Ok(BenchReport {
        pods: opts.pods,
        parallel: opts.parallel,
        ours,
        versus,
        baseline,
        floor,
        floor_missing,
        lab: None,
        conform: None,
    })
}

/// The directory holding `cnilab-floor`: `--floor-dir`, else this
/// program's own directory, else an entry of `--plugin-dir`.
fn find_floor(opts: &BenchOptions) -> Result<String, String> {
    let has = |dir: &std::path::Path| dir.join(variants::FLOOR).is_file();
    if let Some(dir) = &opts.floor_dir {
        return if has(dir.as_ref()) {
            Ok(dir.clone())
        } else {
            Err(format!("--floor-dir {dir} has no {}", variants::FLOOR))
        };
    }
    let own = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf));
    own.into_iter()
        .chain(opts.plugin_dir.split(':').map(PathBuf::from))
        .find(|dir| has(dir))
        .map(|dir| dir.to_string_lossy().into_owned())
        .ok_or_else(|| {
            format!(
                "{} is neither next to cnilab nor in --plugin-dir: build it (cargo build --release -p cnilab-plugin) or pass --floor-dir",
                variants::FLOOR
            )
        })
}

fn against_floor(
    floor_dir: &str,
    opts: &BenchOptions,
) -> Result<variants::FloorComparison, BenchError> {
    fn side<'a>(dir: &'a str, config: &std::path::Path) -> Result<variants::Side<'a>, BenchError> {
        let net = NetworkConfig::load(config).map_err(Box::new)?;
        Ok(variants::Side {
            label: format!("{} ({dir})", net.plugin_type(0)),
            plugin_dir: dir,
            net,
        })
    }
    let mut sides = vec![side(&opts.plugin_dir, &opts.config)?];
    if let Some((dir, config)) = &opts.versus {
        sides.push(side(dir, config)?);
    }
    let pods: Vec<Netns> = (0..opts.pods)
        .map(|_| Netns::with_label("bench-fpod"))
        .collect::<Result<_, _>>()?;
    let mut figures =
        variants::measure(floor_dir, &sides, &pods, &opts.ifname, opts.timeout)?.into_iter();
    let (Some(floor), Some(bridged_floor), Some(ours)) =
        (figures.next(), figures.next(), figures.next())
    else {
        return Err(BenchError::BadCounts);
    };
    Ok(variants::FloorComparison {
        floor,
        bridged_floor,
        ours,
        versus: figures.next(),
    })
}

fn bench_plugin(
    plugin_dir: &str,
    config: &std::path::Path,
    opts: &BenchOptions,
) -> Result<PluginBench, BenchError> {
    let net = NetworkConfig::load(config).map_err(Box::new)?;
    let store = ScratchDir::new("bench-ipam").map_err(BenchError::Scratch)?;
    let Session {
        net,
        host: _host,
        runtime,
        ..
    } = Session::open::<BenchError>(plugin_dir, &net, store.path(), "bench-host", opts.timeout)?;
    // Resolve the plugins first, so a wrong --plugin-dir fails fast.
    runtime.find_plugins(&net).map_err(Box::new)?;
    let label = format!("{} ({plugin_dir})", net.plugin_type(0));
    let pods: Vec<Netns> = (0..opts.pods)
        .map(|_| Netns::with_label("bench-pod"))
        .collect::<Result<_, _>>()?;
    let op_err = |op: &'static str, pod: &str, source: RuntimeError| BenchError::Op {
        plugin: label.clone(),
        op,
        pod: pod.to_string(),
        source: Box::new(source),
    };
    let confs = |round: &str| -> Vec<RuntimeConf> {
        pods.iter()
            .enumerate()
            .map(|(i, ns)| {
                RuntimeConf::new(&format!("bench-{round}-{i}"), Some(ns.path()), &opts.ifname)
            })
            .collect()
    };

    // A warm-up pod, so that bridge creation is not counted as an ADD.
    let warm = RuntimeConf::new("bench-warmup", Some(pods[0].path()), &opts.ifname);
    runtime
        .add(&net, &warm)
        .map_err(|e| op_err("ADD", "bench-warmup", e))?;
    runtime
        .del(&net, &warm)
        .map_err(|e| op_err("DEL", "bench-warmup", e))?;

    let seq = confs("seq");
    let mut add_seq = Vec::new();
    for rt in &seq {
        let t = Instant::now();
        runtime
            .add(&net, rt)
            .map_err(|e| op_err("ADD", &rt.container_id, e))?;
        add_seq.push(t.elapsed());
    }
    let mut del_seq = Vec::new();
    for rt in &seq {
        let t = Instant::now();
        runtime
            .del(&net, rt)
            .map_err(|e| op_err("DEL", &rt.container_id, e))?;
        del_seq.push(t.elapsed());
    }

    let par = confs("par");
    let add_par = parallel(&par, opts.parallel, |rt| runtime.add(&net, rt).map(drop))
        .map_err(|(pod, e)| op_err("ADD", &pod, e))?;
    let del_par = parallel(&par, opts.parallel, |rt| runtime.del(&net, rt).map(drop))
        .map_err(|(pod, e)| op_err("DEL", &pod, e))?;

    Ok(PluginBench {
        label,
        config_version: net.version.to_string(),
        add_sequential: Percentiles::of(&add_seq),
        del_sequential: Percentiles::of(&del_seq),
        add_parallel: Percentiles::of(&add_par),
        del_parallel: Percentiles::of(&del_par),
    })
}

/// Runs `op` over `confs` with `workers` threads; returns each latency.
fn parallel<F>(
    confs: &[RuntimeConf],
    workers: usize,
    op: F,
) -> Result<Vec<Duration>, (String, RuntimeError)>
where
    F: Fn(&RuntimeConf) -> Result<(), RuntimeError> + Sync,
{
    let next = AtomicUsize::new(0);
    let samples = Mutex::new(Vec::new());
    let first_error = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..workers.min(confs.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(rt) = confs.get(i) else { break };
                let t = Instant::now();
                match op(rt) {
                    Ok(()) => {
                        if let Ok(mut s) = samples.lock() {
                            s.push(t.elapsed());
                        }
                    }
                    Err(e) => {
                        if let Ok(mut f) = first_error.lock() {
                            f.get_or_insert((rt.container_id.clone(), e));
                        }
                    }
                }
            });
        }
    });
    if let Some(err) = first_error.into_inner().ok().flatten() {
        return Err(err);
    }
    Ok(samples.into_inner().unwrap_or_default())
}

/// Creates and deletes `count` veth pairs through netlink, twice: both
/// ends in one namespace, and (what a plugin's DEL does) with the peer in a
/// pod namespace, deleted from the pod side.
fn bare_veth_baseline(count: usize) -> Result<Baseline, BenchError> {
    let host = Netns::with_label("bench-base")?;
    let pod = Netns::with_label("bench-bpod")?;
    let pod_file = pod.file();
    let (create, delete, pod_delete) = host.netlink(move |h| async move {
        let mut create = Vec::new();
        let mut delete = Vec::new();
        let mut pod_delete = Vec::new();
        for i in 0..count {
            let name = format!("cnb{i}");
            let t = Instant::now();
            h.link()
                .add(LinkVeth::new(&name, &format!("cnb{i}p")).build())
                .execute()
                .await?;
            create.push(t.elapsed());
            let Some(index) = link_index(&h, &name).await? else {
                continue;
            };
            let t = Instant::now();
            h.link().del(index).execute().await?;
            delete.push(t.elapsed());
        }
        let pod_handle = cnilab_net::netns::connect(Some(pod_file))
            .map_err(|e| rtnetlink::Error::NamespaceError(e.to_string()))?;
        for i in 0..count {
            let peer = LinkUnspec::new_with_name("eth0")
                .setns_by_fd(pod_file.as_raw_fd())
                .build();
            let msg = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
                .name(format!("cnp{i}"))
                .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
                .build();
            h.link().add(msg).execute().await?;
            let Some(index) = link_index(&pod_handle, "eth0").await? else {
                continue;
            };
            let t = Instant::now();
            pod_handle.link().del(index).execute().await?;
            pod_delete.push(t.elapsed());
        }
        Ok((create, delete, pod_delete))
    })?;
    Ok(Baseline {
        veth_create: Percentiles::of(&create),
        veth_delete: Percentiles::of(&delete),
        pod_veth_delete: Percentiles::of(&pod_delete),
    })
}

async fn link_index(h: &rtnetlink::Handle, name: &str) -> Result<Option<u32>, rtnetlink::Error> {
    let mut links = h.link().get().match_name(name.to_string()).execute();
    Ok(futures_util::TryStreamExt::try_next(&mut links)
        .await?
        .map(|m| m.header.index))
}

fn ratio(reference: Duration, ours: Duration) -> String {
    if ours.is_zero() {
        return "-".into();
    }
    format!("{:.2}x", reference.as_secs_f64() / ours.as_secs_f64())
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "cnilab bench: {} pods, sequential and {}-way parallel; latency per call incl. process start",
            self.pods, self.parallel
        )?;
        writeln!(
            f,
            "A: {} [config {}]",
            self.ours.label, self.ours.config_version
        )?;
        if let Some(v) = &self.versus {
            writeln!(f, "B: {} [config {}]", v.label, v.config_version)?;
        }
        writeln!(f)?;
        let mut header = format!("{:<18} {:>10} {:>10}", "", "A median", "A p95");
        if self.versus.is_some() {
            header.push_str(&format!(
                " {:>10} {:>10} {:>14} {:>11}",
                "B median", "B p95", "B/A median", "B/A p95"
            ));
        }
        writeln!(f, "{header}")?;
        let par = format!("({})", self.parallel);
        type Pick = fn(&PluginBench) -> Percentiles;
        let rows: [(String, Pick); 4] = [
            ("ADD sequential".into(), |b| b.add_sequential),
            ("DEL sequential".into(), |b| b.del_sequential),
            (format!("ADD parallel {par}"), |b| b.add_parallel),
            (format!("DEL parallel {par}"), |b| b.del_parallel),
        ];
        for (name, pick) in rows {
            let a = pick(&self.ours);
            let mut line = format!("{name:<18} {:>10} {:>10}", fmt_ms(a.median), fmt_ms(a.p95));
            if let Some(v) = &self.versus {
                let b = pick(v);
                line.push_str(&format!(
                    " {:>10} {:>10} {:>14} {:>11}",
                    fmt_ms(b.median),
                    fmt_ms(b.p95),
                    ratio(b.median, a.median),
                    ratio(b.p95, a.p95)
                ));
            }
            writeln!(f, "{line}")?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "baseline, bare netlink in throwaway namespaces (like `ip link add/del`):"
        )?;
        let b = &self.baseline;
        writeln!(
            f,
            "  veth create              median {:>9}  p95 {:>9}",
            fmt_ms(b.veth_create.median),
            fmt_ms(b.veth_create.p95)
        )?;
        writeln!(
            f,
            "  veth delete, one netns   median {:>9}  p95 {:>9}",
            fmt_ms(b.veth_delete.median),
            fmt_ms(b.veth_delete.p95)
        )?;
        writeln!(
            f,
            "  veth delete in pod netns median {:>9}  p95 {:>9}   (peer in the host netns: what DEL does)",
            fmt_ms(b.pod_veth_delete.median),
            fmt_ms(b.pod_veth_delete.p95)
        )?;
        let over = |p: &PluginBench| {
            let d = p.del_sequential.median.as_secs_f64() - b.pod_veth_delete.median.as_secs_f64();
            format!("{:+.1} ms", d * 1000.0)
        };
        write!(
            f,
            "DEL sequential median minus bare pod veth delete: A {}",
            over(&self.ours)
        )?;
        if let Some(v) = &self.versus {
            write!(f, ", B {}", over(v))?;
        }
        writeln!(f)?;
        writeln!(f)?;
        match (&self.floor, &self.floor_missing) {
            (Some(floor), _) => write!(f, "{floor}"),
            (None, Some(missing)) => writeln!(f, "no floor comparison: {missing}"),
            (None, None) => Ok(()),
        }?;
        match &self.lab {
            Some(lab) => write!(f, "\n{lab}"),
            None => Ok(()),
        }?;
        match &self.conform {
            Some(conform) => write!(f, "{conform}"),
            None => Ok(()),
        }
    }
}
