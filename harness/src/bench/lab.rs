//! The lab figures `cnilab bench --lab NODESxPODS` prints beside the plugin
//! figures: one throwaway `cnilab lab run` of that size, its verdict, its
//! phases, attach time per pod and the peak memory; and, with `--vs-*`,
//! `cnilab conform`'s wall time on that plugin (the reference). Pure data:
//! the CLI runs the lab and conform (a subcommand never imports another)
//! and fills this in.

use std::fmt;
use std::time::Duration;

/// `NODESxPODS` (`10x100`).
pub fn parse_size(text: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{text:?}: expected NODESxPODS, like 10x100 (both at least 1)");
    let (n, p) = text.split_once(['x', 'X']).ok_or_else(bad)?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    let p: usize = p.trim().parse().map_err(|_| bad())?;
    if n == 0 || p == 0 {
        return Err(bad());
    }
    Ok((n, p))
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Phase {
    pub phase: String,
    pub ms: f64,
}

/// One lab run's figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LabFigures {
    pub nodes: usize,
    pub pods_per_node: usize,
    pub passed: bool,
    /// "pass", "fail" or "inconclusive".
    pub verdict: String,
    pub probes: usize,
    pub phases: Vec<Phase>,
    /// The attach phase divided by the pods.
    pub attach_ms_per_pod: f64,
    /// Wall time of the whole run.
    pub total_ms: f64,
    /// Peak resident memory of cnilab itself and of its largest child.
    pub max_rss_kib: u64,
    pub max_rss_children_kib: u64,
}

impl LabFigures {
    pub fn new(
        (nodes, pods_per_node): (usize, usize),
        verdict: &str,
        probes: usize,
        phases_ms: &[(String, f64)],
        total: Duration,
    ) -> LabFigures {
        let attach = phases_ms
            .iter()
            .find(|(p, _)| p == "attach")
            .map_or(0.0, |(_, ms)| *ms);
        let rss = |who| {
            // SAFETY: getrusage(2) fills the zeroed struct it is given.
            let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
            match unsafe { nix::libc::getrusage(who, &mut usage) } {
                0 => u64::try_from(usage.ru_maxrss).unwrap_or(0),
                _ => 0,
            }
        };
        LabFigures {
            nodes,
            pods_per_node,
            passed: verdict == "pass",
            verdict: verdict.to_string(),
            probes,
            phases: phases_ms
                .iter()
                .map(|(phase, ms)| Phase {
                    phase: phase.clone(),
                    ms: *ms,
                })
                .collect(),
            attach_ms_per_pod: attach / (nodes * pods_per_node) as f64,
            total_ms: total.as_secs_f64() * 1000.0,
            max_rss_kib: rss(nix::libc::RUSAGE_SELF),
            max_rss_children_kib: rss(nix::libc::RUSAGE_CHILDREN),
        }
    }
}

impl fmt::Display for LabFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|p| format!("{} {:.0} ms", p.phase, p.ms))
            .collect();
        writeln!(
            f,
            "lab {}x{} ({} pods): {} ({} probes) in {:.1} s; {}; attach {:.2} ms per pod; peak RSS cnilab {} MiB, largest child {} MiB",
            self.nodes,
            self.pods_per_node,
            self.nodes * self.pods_per_node,
            self.verdict,
            self.probes,
            self.total_ms / 1000.0,
            phases.join(", "),
            self.attach_ms_per_pod,
            self.max_rss_kib / 1024,
            self.max_rss_children_kib / 1024,
        )
    }
}

/// One `cnilab conform` run: on which plugin, its wall time and verdicts.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConformFigures {
    pub plugin_dir: String,
    pub config: String,
    pub checks: usize,
    pub failed: usize,
    pub wall_ms: f64,
}

impl fmt::Display for ConformFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "conform --plugin-dir {} --config {}: {} checks, {} failed, in {:.2} s",
            self.plugin_dir,
            self.config,
            self.checks,
            self.failed,
            self.wall_ms / 1000.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_refuse() {
        assert_eq!(parse_size("10x100"), Ok((10, 100)));
        assert_eq!(parse_size("2X3"), Ok((2, 3)));
        for bad in ["10", "0x5", "5x0", "ax1", "1x", "-1x2"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn attach_per_pod_divides_the_attach_phase() {
        let phases = vec![("up".to_string(), 50.0), ("attach".to_string(), 400.0)];
        let fig = LabFigures::new((2, 100), "pass", 10, &phases, Duration::from_secs(1));
        assert!((fig.attach_ms_per_pod - 2.0).abs() < 1e-9);
        assert!(fig.passed && fig.total_ms == 1000.0);
        let text = fig.to_string();
        assert!(
            text.contains("lab 2x100 (200 pods): pass (10 probes)"),
            "{text}"
        );
        assert!(text.contains("attach 2.00 ms per pod"), "{text}");
        assert!(!LabFigures::new((1, 1), "fail", 0, &[], Duration::ZERO).passed);
    }

    #[test]
    fn conform_figures_name_the_plugin_and_the_wall_time() {
        let fig = ConformFigures {
            plugin_dir: "/usr/lib/cni".into(),
            config: "ref.conflist".into(),
            checks: 50,
            failed: 0,
            wall_ms: 1234.0,
        };
        assert_eq!(
            fig.to_string(),
            "conform --plugin-dir /usr/lib/cni --config ref.conflist: 50 checks, 0 failed, in 1.23 s\n"
        );
    }
}
