//! `cnilab e2e vagrant --capture DIR`: after the check, each VM captured
//! (`cnilab capture`, run inside it by `vagrant ssh`) into `DIR/<vm>.json`,
//! the captures replayed on this host as a lab and checked with the VMs'
//! groups (the caller's [`ReplayCheck`]: the CLI passes `lab`'s, which
//! removes its throwaway namespaces after), and the two
//! verdicts compared group by group: the capture's test against kernels and
//! NICs the lab did not build. A killed run leaves the replay's namespaces
//! to `cnilab sweep` (their pid is gone).

use super::check::{on_each_vm, ssh, GROUPS, NODES};
use super::options::VagrantOptions;
use crate::connectivity::report::Report;
use crate::e2e::E2eError;
use crate::report::Rendered;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Replays capture files as a throwaway lab and checks the given groups on
/// it (`lab::check_replayed`, passed in by the CLI: e2e does not import
/// another subcommand).
pub type ReplayCheck = fn(&[PathBuf], &[String]) -> Result<Report, String>;

/// The script that captures a VM (its JSON on stdout).
const CAPTURE: &str = "cnilab capture -o json";

/// The `--dry-run` of the capture and the replay.
pub fn dry_run(opts: &VagrantOptions, dir: &Path) -> String {
    let mut out = String::new();
    for node in NODES {
        let cmd = ssh(opts, node, CAPTURE);
        let _ = writeln!(out, "+ {cmd} > {}", file_of(dir, node).display());
        let _ = writeln!(out, "#   stdin: {CAPTURE}");
    }
    let files: Vec<String> = NODES
        .iter()
        .map(|n| file_of(dir, n).display().to_string())
        .collect();
    let _ = writeln!(
        out,
        "# replayed here (`cnilab lab run --capture {} --only {}`), verdicts compared group by group",
        files.join(" "),
        GROUPS.join(",")
    );
    out
}

fn file_of(dir: &Path, node: &str) -> PathBuf {
    dir.join(format!("{node}.json"))
}

/// The capture in what `vagrant ssh` printed: from the first line that
/// opens a JSON object (vagrant may print before it), checked to parse.
fn capture_text(node: &str, out: &str) -> Result<String, E2eError> {
    let start = out
        .lines()
        .position(|l| l.starts_with('{'))
        .ok_or_else(|| E2eError::Invalid(format!("{node}: `{CAPTURE}` printed no JSON")))?;
    let text: String = out.lines().skip(start).collect::<Vec<_>>().join("\n") + "\n";
    serde_json::from_str::<serde_json::Value>(&text)
        .map_err(|e| E2eError::Invalid(format!("{node}: `{CAPTURE}`: {e}")))?;
    Ok(text)
}

/// Each group's verdict: passed (every probe answered) or not, `None`
/// when the report has no probe of it.
fn verdicts(report: &Report) -> Vec<(&'static str, Option<bool>)> {
    GROUPS
        .iter()
        .map(|g| {
            let found = report.groups.iter().find(|r| r.name == *g && r.probes > 0);
            (*g, found.map(|r| r.passed == r.probes))
        })
        .collect()
}

fn word(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "not run",
    }
}

/// The groups whose verdicts differ, as `group: VMs X, replay Y`.
fn differences(vms: &Report, replay: &Report) -> Vec<String> {
    verdicts(vms)
        .into_iter()
        .zip(verdicts(replay))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((g, a), (_, b))| format!("{g}: VMs {}, replay {}", word(a), word(b)))
        .collect()
}

/// Captures both VMs into `dir`, replays them, checks the replay and
/// compares it with `vms` (the VMs' report); `Ok(true)` when every group
/// has the same verdict. Prints what it found on stderr.
pub fn run(
    opts: &VagrantOptions,
    dir: &Path,
    vms: &Report,
    replay_check: ReplayCheck,
) -> Result<bool, E2eError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| E2eError::Invalid(format!("--capture {}: {e}", dir.display())))?;
    let cmds = NODES
        .iter()
        .map(|node| Some(ssh(opts, node, CAPTURE)))
        .collect();
    let mut files = Vec::new();
    for (node, out) in NODES.iter().zip(on_each_vm(cmds)?) {
        let text = capture_text(node, &out.unwrap_or_default())?;
        let file = file_of(dir, node);
        std::fs::write(&file, text)
            .map_err(|e| E2eError::Invalid(format!("{}: {e}", file.display())))?;
        files.push(file);
    }
    let groups: Vec<String> = GROUPS.iter().map(|g| g.to_string()).collect();
    let report = replay_check(&files, &groups)
        .map_err(|e| E2eError::Invalid(format!("replay of {}: {e}", dir.display())))?;
    let differ = differences(vms, &report);
    let verdict = word(Some(vms.passed()));
    if differ.is_empty() {
        eprintln!(
            "✅ the VMs' captures ({}) replayed here: the same verdict as the VMs, {verdict} ({} groups)",
            dir.display(),
            GROUPS.len()
        );
    } else {
        eprintln!(
            "❌ the VMs' captures ({}) replayed here give another verdict than the VMs: {}",
            dir.display(),
            differ.join("; ")
        );
        eprint!("{}", report.table());
    }
    Ok(differ.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectivity::report::GroupResult;

    fn report(groups: &[(&str, usize, usize)]) -> Report {
        let mut r = Report::from_parts("t", "", "", Vec::new(), &GROUPS, Vec::new(), Vec::new());
        r.groups = groups
            .iter()
            .map(|(name, probes, passed)| GroupResult {
                name: name.to_string(),
                probes: *probes,
                passed: *passed,
                families: Vec::new(),
            })
            .collect();
        r
    }

    #[test]
    fn verdicts_differ_only_where_a_group_passes_on_one_side() {
        let vms = report(&[("pod-to-pod/cross-node", 4, 4), ("node-to-pod", 4, 2)]);
        // More probes in the replay (a lab probes every pair) is the same verdict.
        let same = report(&[("pod-to-pod/cross-node", 12, 12), ("node-to-pod", 16, 8)]);
        assert_eq!(differences(&vms, &same), Vec::<String>::new());
        let other = report(&[("pod-to-pod/cross-node", 12, 11), ("node-to-pod", 16, 8)]);
        assert_eq!(
            differences(&vms, &other),
            ["pod-to-pod/cross-node: VMs PASS, replay FAIL"]
        );
        let missing = report(&[("node-to-pod", 16, 8)]);
        assert_eq!(
            differences(&vms, &missing),
            ["pod-to-pod/cross-node: VMs PASS, replay not run"]
        );
    }

    #[test]
    fn the_capture_is_found_after_what_vagrant_prints() {
        let out = "a banner\n{\n  \"schemaVersion\": 1\n}\n";
        assert_eq!(
            capture_text("node1", out).expect("found"),
            "{\n  \"schemaVersion\": 1\n}\n"
        );
        assert!(capture_text("node1", "Connection closed.\n").is_err());
        assert!(capture_text("node1", "{\n  \"cut\": \n").is_err());
    }
}
