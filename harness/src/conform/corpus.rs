//! X1: the plugin-agnostic part of the hostile-input corpus
//! (`tests/corpus`, cases marked `generic`): every input must get a JSON
//! error with one of the case's acceptable codes, a non-zero exit, no crash,
//! and leave the host namespace and the store unchanged.

use super::suite::Suite;
use super::ConformError;
use crate::corpus::{self, Expect, Venue};
use crate::netns::Netns;
use crate::runtime::session::Session;
use crate::verdict::Finding;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// Per case; cases with an endless stdin are bounded much shorter (see
/// [`corpus::ENDLESS_STDIN_BOUND`]).
const CASE_TIMEOUT: Duration = Duration::from_secs(20);

pub(crate) fn run(s: &Suite<'_>, dir: Option<&Path>) -> Vec<Finding> {
    let Some(dir) = dir else {
        return vec![Finding::skip(
            "X1",
            "no corpus: pass --corpus DIR (the repository's tests/corpus)",
        )];
    };
    let cases = match corpus::load_dir(dir) {
        Ok(cases) => cases.into_iter().filter(|c| c.generic).collect::<Vec<_>>(),
        Err(e) => return vec![Finding::fail("X1", format!("cannot load the corpus: {e}"))],
    };
    if cases.is_empty() {
        return vec![Finding::skip(
            "X1",
            format!("no generic case in {}", dir.display()),
        )];
    }
    // The cases run with their own working directory: absolute paths only.
    let plugin = match s.runtime.find_plugin(s.net.plugin_type(0)) {
        Ok(p) => std::fs::canonicalize(&p).unwrap_or(p),
        Err(e) => return vec![Finding::fail("X1", e.to_string())],
    };
    let cni_path: Vec<String> = s
        .plugin_dir
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| {
            std::fs::canonicalize(d)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| d.to_string())
        })
        .collect();
    let cni_path = cni_path.join(":");
    // A crash (a signal the plugin raised itself) or an error that is not
    // the spec's JSON object on stdout breaks the spec: FAIL. Other
    // mishandling (another code, an accepted input, a hang on endless stdin)
    // concerns inputs the spec does not pin down: WARN, as the reference
    // plugins show several of them.
    let mut broken = Vec::new();
    let mut mishandled = Vec::new();
    // The cases run in a few worlds of their own at once: cases whose
    // stdin never ends only wait (so their bound does not add to the run),
    // and the others are split in two. No world sees another's changes.
    let (endless, others): (Vec<&corpus::Case>, Vec<&corpus::Case>) =
        cases.iter().partition(|c| c.is_endless());
    let odd: Vec<&corpus::Case> = others.iter().skip(1).step_by(2).copied().collect();
    let even: Vec<&corpus::Case> = others.iter().step_by(2).copied().collect();
    let results: Vec<Result<Vec<Outcome<'_>>, String>> = crate::util::parallel_map(
        [&endless, &odd, &even],
        crate::util::A_THREAD_EACH,
        |part| run_world(s, part, &plugin, &cni_path),
        || Err("a corpus thread panicked".to_string()),
    );
    let mut outcomes = Vec::new();
    for r in results {
        match r {
            Ok(mut o) => outcomes.append(&mut o),
            Err(e) => return vec![Finding::fail("X1", format!("harness: {e}"))],
        }
    }
    outcomes.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    for (case, outcome) in outcomes {
        match outcome {
            Ok(run) if run.passed() => {}
            Ok(run) => {
                let crashed = run.exec.signal.is_some() && !run.exec.timed_out;
                let not_json = run.exec.exit_code.is_some_and(|c| c != 0)
                    && run.error.is_none()
                    && !run.exec.timed_out;
                let line = format!("{}: {}", case.name, run.problems.join("; "));
                if crashed || not_json {
                    broken.push(line);
                } else {
                    mishandled.push(line);
                }
            }
            Err(e) => broken.push(format!("{}: harness: {e}", case.name)),
        }
    }
    let total = cases.len();
    if !broken.is_empty() {
        let mut all = broken.clone();
        all.extend(mishandled.iter().cloned());
        return vec![Finding::fail(
            "X1",
            format!(
                "{} of {total} generic hostile inputs crashed the plugin or got a non-JSON error: {}",
                broken.len(),
                all.join(" | ")
            ),
        )];
    }
    if !mishandled.is_empty() {
        return vec![Finding::warn(
            "X1",
            format!(
                "{} of {total} generic hostile inputs got another code, were accepted, or hung: {}",
                mishandled.len(),
                mishandled.join(" | ")
            ),
        )];
    }
    vec![Finding::pass(
        "X1",
        format!(
            "{total} generic hostile inputs from {}: each refused with an accepted code, JSON error, nothing changed",
            dir.display()
        ),
    )]
}

type Outcome<'c> = (
    &'c corpus::Case,
    Result<corpus::CaseRun, corpus::CorpusError>,
);

/// Runs `cases` one after another in a world of their own (host namespace
/// with a runtime in it, store, watched tree), each in a fresh pod
/// namespace. An accepted input is undone as a runtime would (DEL) and the
/// host settles before the next case, so no case inherits another's
/// leftovers.
fn run_world<'c>(
    s: &Suite<'_>,
    cases: &[&'c corpus::Case],
    plugin: &Path,
    cni_path: &str,
) -> Result<Vec<Outcome<'c>>, String> {
    if cases.is_empty() {
        return Ok(Vec::new());
    }
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let watched = crate::util::ScratchDir::new("corpus").map_err(|e| err(&e))?;
    let Session {
        net,
        data_dir,
        host,
        runtime,
    } = Session::open::<ConformError>(
        &s.plugin_dir,
        s.net,
        &watched.path().join("ipam"),
        "corpus-host",
        s.runtime.timeout(),
    )
    .map_err(|e| err(&e))?;
    let a_file = watched.path().join("corpus-regular-file");
    std::fs::write(&a_file, b"not a namespace").map_err(|e| err(&e))?;
    let base = Value::Object(net.plugin_stdin(0, None, None));
    // Veths go with their pod namespace, asynchronously: after each case
    // the host's veths are back to these (read again only when they did
    // not come back).
    let veths = |l: &[crate::netns::Link]| {
        let mut n: Vec<String> = l
            .iter()
            .filter(|l| l.kind.as_deref() == Some("veth"))
            .map(|l| l.name.clone())
            .collect();
        n.sort();
        n
    };
    let mut want = veths(&host.links().unwrap_or_default());
    let mut out = Vec::new();
    for case in cases {
        let pod = Netns::with_label("corpus").map_err(|e| err(&e))?;
        let venue = Venue {
            host: &host,
            pod: &pod,
            plugin,
            cni_path: cni_path.to_string(),
            base: &base,
            data_dir: &data_dir,
            a_file: &a_file,
            watched: watched.path(),
            timeout: CASE_TIMEOUT,
        };
        let outcome = corpus::run_case(case, &venue, Expect::Generic);
        if let Ok(run) = &outcome {
            if run.exec.exit_code == Some(0) {
                // A doubled variable: whichever the plugin read, one DEL
                // names the same attachment.
                for last_wins in [false, true] {
                    let mut env: Vec<(String, String)> = Vec::new();
                    for (k, v) in &run.exec.env {
                        let v = if k == "CNI_COMMAND" { "DEL" } else { v };
                        match env.iter_mut().find(|(key, _)| key == k) {
                            Some(slot) if last_wins => slot.1 = v.to_string(),
                            Some(_) => {}
                            None => env.push((k.clone(), v.to_string())),
                        }
                    }
                    let _ = runtime.exec_raw(plugin, &env, run.exec.stdin.as_bytes());
                }
            }
        }
        drop(venue);
        drop(pod);
        // A refused input that left the host as it was cannot have made a
        // veth whose pod end just went: nothing to wait for.
        let host_untouched = outcome.as_ref().is_ok_and(|run| {
            run.exec.exit_code != Some(0)
                && !run
                    .problems
                    .iter()
                    .any(|p| p.starts_with(corpus::HOST_NETNS))
        });
        if !host_untouched
            && crate::util::wait_for(|| {
                (veths(&host.links().unwrap_or_default()) == want).then_some(())
            })
            .is_none()
        {
            want = veths(&host.links().unwrap_or_default());
        }
        out.push((*case, outcome));
    }
    Ok(out)
}
