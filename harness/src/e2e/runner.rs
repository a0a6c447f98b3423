//! Runs a `Plan`: each command without a shell, under a timeout, with a
//! progress line for long waits. In best-effort mode (`dump`) a failure is
//! recorded in `errors.txt` and the next action runs anyway.

use super::plan::{Action, Cmd, Gate, Plan, Verify};
use super::E2eError;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How often a long command reports that it is still running.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

pub struct Runner {
    /// Where best-effort failures are appended (`dump`); `None`: stop at the first.
    pub errors_file: Option<PathBuf>,
    /// Failures recorded in best-effort mode.
    pub recorded: usize,
}

impl Runner {
    pub fn strict() -> Runner {
        Runner {
            errors_file: None,
            recorded: 0,
        }
    }

    pub fn best_effort(errors_file: PathBuf) -> Runner {
        Runner {
            errors_file: Some(errors_file),
            recorded: 0,
        }
    }

    pub fn run(&mut self, plan: &Plan) -> Result<(), E2eError> {
        for action in &plan.actions {
            if let Err(e) = self.action(action) {
                self.fail(e)?;
            }
        }
        Ok(())
    }

    fn fail(&mut self, e: E2eError) -> Result<(), E2eError> {
        let Some(path) = &self.errors_file else {
            return Err(e);
        };
        eprintln!("cnilab e2e: {e} (recorded in {})", path.display());
        self.recorded += 1;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|io| E2eError::Io {
                what: format!("cannot write {}", path.display()),
                source: io,
            })?;
        writeln!(file, "{e}\n").map_err(|io| E2eError::Io {
            what: format!("cannot write {}", path.display()),
            source: io,
        })
    }

    fn action(&mut self, action: &Action) -> Result<(), E2eError> {
        match action {
            Action::Preflight { tools, sysctls } => {
                preflight(tools, sysctls)?;
                Ok(())
            }
            Action::Run {
                cmd,
                timeout,
                hint,
                gate,
            } => {
                eprintln!("+ {cmd}");
                let result = run(cmd, None, *timeout, gate.as_ref());
                match (result, gate) {
                    (Ok(_), _) => Ok(()),
                    (Err(e), Some(g)) => {
                        eprintln!(
                            "cnilab e2e: gate failed: {} (timeout {}s)",
                            g.what,
                            g.timeout.as_secs()
                        );
                        eprintln!("+ {}", g.on_failure);
                        if let Ok(out) = run(&g.on_failure, None, Duration::from_secs(60), None) {
                            eprint!("{}", crate::report::human(&out));
                        }
                        Err(E2eError::Gate {
                            what: g.what.clone(),
                            cause: Box::new(e),
                        })
                    }
                    (Err(e), None) => Err(match hint {
                        Some(h) => E2eError::Hint {
                            hint: h.clone(),
                            cause: Box::new(e),
                        },
                        None => e,
                    }),
                }
            }
            Action::Capture { cmd, file, timeout } => {
                eprintln!("+ {cmd} > {}", file.display());
                make_parent(file)?;
                run(cmd, Some(file), *timeout, None).map(|_| ())
            }
            Action::Verify {
                cmd,
                verify,
                timeout,
            } => {
                eprintln!("+ {cmd}");
                let out = run(cmd, None, *timeout, None)?;
                match verify {
                    Verify::CniConfDir { node } => check_conf_dir(node, &out),
                }
            }
            Action::Write { path, content } => {
                eprintln!("--- write {}", path.display());
                make_parent(path)?;
                std::fs::write(path, content).map_err(|e| E2eError::Io {
                    what: format!("cannot write {}", path.display()),
                    source: e,
                })
            }
            Action::RequireFile { path, why } => {
                if path.is_file() {
                    Ok(())
                } else {
                    Err(E2eError::Invalid(format!("{}: {why}", path.display())))
                }
            }
            Action::ForEach {
                list,
                placeholder,
                body,
                ..
            } => {
                eprintln!("+ {list}");
                let out = run(list, None, Duration::from_secs(60), None)?;
                for item in list_items(&out) {
                    for a in body {
                        if let Err(e) = self.action(&a.substitute(placeholder, &item)) {
                            self.fail(e)?;
                        }
                    }
                }
                Ok(())
            }
            Action::Check(opts) => {
                eprintln!("# {}", opts.command_line());
                let passed = super::check::run_blocking(opts)?;
                if passed {
                    Ok(())
                } else {
                    Err(E2eError::CheckFailed)
                }
            }
            Action::Note(_) => Ok(()),
        }
    }
}

/// Names from `kind get nodes`, `minikube node list` (name, tab, address)
/// or `kubectl get -o name` (`pod/x`).
pub fn list_items(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|w| w.rsplit('/').next().unwrap_or(w).to_string())
        .filter(|w| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        })
        .collect()
}

/// containerd's CRI section must read CNI configs from /etc/cni/net.d.
pub fn check_conf_dir(node: &str, grep_output: &str) -> Result<(), E2eError> {
    for line in grep_output.lines() {
        let Some((_, value)) = line.split_once('=') else {
            continue;
        };
        let dir = value.trim().trim_matches(|c| c == '"' || c == '\'');
        if dir.trim_end_matches('/') != "/etc/cni/net.d" {
            return Err(E2eError::Invalid(format!(
                "node {node}: containerd reads CNI configs from {dir}, not /etc/cni/net.d, so the CNI's config is never read (older minikube releases used /etc/cni/net.mk on multi-node clusters); use a minikube that points containerd at /etc/cni/net.d (v1.38.1 does, pkg/minikube/cruntime/containerd.go) and recreate the cluster"
            )));
        }
    }
    Ok(())
}

fn make_parent(path: &Path) -> Result<(), E2eError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).map_err(|e| E2eError::Io {
                what: format!("cannot create {}", dir.display()),
                source: e,
            })
        }
        _ => Ok(()),
    }
}

fn preflight(tools: &[String], sysctls: &[(String, u64)]) -> Result<(), E2eError> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|t| !crate::util::on_path(t))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(E2eError::Invalid(format!(
            "not on PATH: {} (install them first)",
            missing.join(", ")
        )));
    }
    for (key, min) in sysctls {
        let file = Path::new("/proc/sys").join(key);
        let value = std::fs::read_to_string(&file)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok());
        match value {
            Some(v) if v >= *min => {}
            Some(v) => eprintln!(
                "cnilab e2e: warning: {} = {v}, below {min}: kubelets may fail with \"too many open files\" (sysctl -w {}={min})",
                key.replace('/', "."),
                key.replace('/', ".")
            ),
            None => eprintln!("cnilab e2e: warning: cannot read {}", file.display()),
        }
    }
    Ok(())
}

/// Reads a pipe to its end on a thread, so a chatty command never blocks.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// Runs `cmd`; stdout goes to `capture` if given, else is returned. Kills
/// the command at `timeout`. A gate prints its progress every 10 s.
pub fn run(
    cmd: &Cmd,
    capture: Option<&Path>,
    timeout: Duration,
    gate: Option<&Gate>,
) -> Result<String, E2eError> {
    let mut command = Command::new(&cmd.program);
    command
        .args(&cmd.args)
        .stdin(if cmd.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::piped());
    for (k, v) in &cmd.env {
        command.env(k, v);
    }
    match capture {
        Some(file) => {
            let f = std::fs::File::create(file).map_err(|e| E2eError::Io {
                what: format!("cannot create {}", file.display()),
                source: e,
            })?;
            command.stdout(Stdio::from(f));
        }
        None => {
            command.stdout(Stdio::piped());
        }
    }
    let mut child = command.spawn().map_err(|e| E2eError::Spawn {
        command: cmd.to_string(),
        source: e,
    })?;
    if let (Some(text), Some(mut input)) = (cmd.stdin.clone(), child.stdin.take()) {
        // A thread, so that a command that does not read cannot block us;
        // its end of the pipe closes when the text is written.
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = input.write_all(text.as_bytes());
        });
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_child(&mut child, cmd, timeout, gate);
    let out = String::from_utf8_lossy(&stdout.join().unwrap_or_default()).into_owned();
    let err = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
    match status? {
        Some(s) if s.success() => {
            if gate.is_some() && !out.is_empty() {
                eprint!("{}", crate::report::human(&out));
            }
            Ok(out)
        }
        Some(s) => Err(E2eError::Failed {
            command: cmd.to_string(),
            status: s.code(),
            stderr: tail(&err),
        }),
        None => Err(E2eError::Timeout {
            command: cmd.to_string(),
            after: timeout,
            stderr: tail(&err),
        }),
    }
}

fn wait_child(
    child: &mut Child,
    cmd: &Cmd,
    timeout: Duration,
    gate: Option<&Gate>,
) -> Result<Option<std::process::ExitStatus>, E2eError> {
    let start = Instant::now();
    let mut next_progress = PROGRESS_EVERY;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) => {}
            Err(e) => {
                return Err(E2eError::Spawn {
                    command: cmd.to_string(),
                    source: e,
                })
            }
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        if elapsed >= next_progress {
            match gate {
                Some(g) => eprintln!(
                    "waiting for {}: {}s/{}s",
                    g.what,
                    elapsed.as_secs(),
                    g.timeout.as_secs()
                ),
                None => eprintln!("  … {} still running ({}s)", cmd.program, elapsed.as_secs()),
            }
            next_progress += PROGRESS_EVERY;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last lines of a command's stderr, for error messages.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let start = lines.len().saturating_sub(15);
    lines[start..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_from_each_lister() {
        assert_eq!(
            list_items("c-control-plane\nc-worker\n"),
            ["c-control-plane", "c-worker"]
        );
        assert_eq!(
            list_items("m\t192.168.49.2\nm-m02\t192.168.49.3\n"),
            ["m", "m-m02"]
        );
        assert_eq!(
            list_items("pod/cnilab-agent-x1\npod/cnilab-agent-y2\n"),
            ["cnilab-agent-x1", "cnilab-agent-y2"]
        );
        assert!(list_items("$(evil)\n\n").is_empty());
    }

    #[test]
    fn conf_dir() {
        assert!(check_conf_dir("n", "").is_ok());
        assert!(check_conf_dir("n", "    conf_dir = \"/etc/cni/net.d\"\n").is_ok());
        let err = check_conf_dir("m-m02", "    conf_dir = \"/etc/cni/net.mk\"\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("m-m02") && err.contains("/etc/cni/net.mk"),
            "{err}"
        );
    }

    #[test]
    fn runs_without_a_shell_and_times_out() {
        let out = run(
            &Cmd::new("echo").arg("a;b $(x)"),
            None,
            Duration::from_secs(5),
            None,
        );
        assert_eq!(out.ok().as_deref(), Some("a;b $(x)\n"));
        let slow = run(
            &Cmd::new("sleep").arg("5"),
            None,
            Duration::from_millis(300),
            None,
        );
        assert!(matches!(slow, Err(E2eError::Timeout { .. })), "{slow:?}");
        let failed = run(&Cmd::new("false"), None, Duration::from_secs(5), None);
        assert!(
            matches!(
                failed,
                Err(E2eError::Failed {
                    status: Some(1),
                    ..
                })
            ),
            "{failed:?}"
        );
    }

    #[test]
    fn best_effort_records_and_continues() {
        let dir = std::env::temp_dir().join(format!("cnilab-e2e-runner-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let errors = dir.join("errors.txt");
        let plan = Plan {
            actions: vec![
                Action::Capture {
                    cmd: Cmd::new("false"),
                    file: dir.join("a.txt"),
                    timeout: Duration::from_secs(5),
                },
                Action::Capture {
                    cmd: Cmd::new("echo").arg("hello"),
                    file: dir.join("sub/b.txt"),
                    timeout: Duration::from_secs(5),
                },
            ],
        };
        let mut runner = Runner::best_effort(errors.clone());
        assert!(runner.run(&plan).is_ok());
        assert_eq!(runner.recorded, 1);
        let recorded = std::fs::read_to_string(&errors).unwrap_or_default();
        assert!(recorded.contains("false"), "{recorded}");
        assert_eq!(
            std::fs::read_to_string(dir.join("sub/b.txt")).unwrap_or_default(),
            "hello\n"
        );
        let mut strict = Runner::strict();
        assert!(strict.run(&plan).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
