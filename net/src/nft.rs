//! Running nftables: `nft -f -` with a ruleset on stdin (one atomic batch),
//! or `nft` with arguments, in the caller's namespace or inside another one.
//! The plugin (masquerade), the agent (its node table) and the harness (lab
//! nodes) all go through here; each words the error for its own user.
//! Every run has a deadline ([`DEADLINE`], or [`run_within`]'s): an nft that
//! hangs (reading a FIFO, say) is killed and named, never waited for
//! forever; and it dies with the process that started it (`PR_SET_PDEATHSIG`),
//! so a run killed meanwhile leaves no nft behind.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one nft run may take (a whole lab node's ruleset loads in
/// milliseconds).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Why nft did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The program could not be started (missing, not executable).
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: io::Error },
    /// Writing the ruleset to its stdin or waiting for it failed.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
    /// It had not ended at its deadline and was killed.
    #[error("{program} had not ended after {} s and was killed", .after.as_secs_f64())]
    Deadline { program: String, after: Duration },
    /// nft ran and refused (a syntax error, a missing table, ...).
    #[error("{status}: {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        /// Its stderr, trimmed.
        stderr: String,
    },
}

/// Loads `ruleset` with `program -f -` (atomically: all or nothing), inside
/// `ns` when given.
pub fn load(program: &Path, ns: Option<&File>, ruleset: &str) -> Result<(), NftError> {
    run(program, ns, &["-f", "-"], Some(ruleset)).map(|_| ())
}

/// Runs `program args...` (no shell), inside `ns` when given, with `stdin`
/// fed to it; returns its stdout. Killed after [`DEADLINE`].
pub fn run(
    program: &Path,
    ns: Option<&File>,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, NftError> {
    run_within(program, ns, args, stdin, DEADLINE)
}

/// Reads `pipe` to its end on a thread of its own.
fn drain(pipe: Option<impl io::Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// [`run`], killed (and an error naming it) once `deadline` has passed.
pub fn run_within(
    program: &Path,
    ns: Option<&File>,
    args: &[&str],
    stdin: Option<&str>,
    deadline: Duration,
) -> Result<String, NftError> {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: prctl(2) is async-signal-safe; it only sets a flag of the child.
    unsafe {
        command.pre_exec(|| {
            if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    if let Some(ns) = ns {
        crate::netns::command_in(ns, &mut command);
    }
    let mut child = command.spawn().map_err(|source| NftError::Spawn {
        program: program.display().to_string(),
        source,
    })?;
    let until = Instant::now() + deadline;
    // On threads: a program that reads no stdin, or writes much, never
    // blocks the wait for its deadline.
    let feeder = stdin.zip(child.stdin.take()).map(|(text, mut pipe)| {
        let text = text.to_string();
        std::thread::spawn(move || pipe.write_all(text.as_bytes()))
    });
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let mut pause = Duration::from_micros(50);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= until => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(NftError::Deadline {
                    program: program.display().to_string(),
                    after: deadline,
                });
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(2));
            }
            Err(source) => {
                return Err(NftError::Io {
                    what: "wait for nft",
                    source,
                })
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if !status.success() {
        return Err(NftError::Failed {
            status,
            stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
        });
    }
    if let Some(Ok(Err(source))) = feeder.map(std::thread::JoinHandle::join) {
        return Err(NftError::Io {
            what: "write the ruleset to nft",
            source,
        });
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let err = run(
            Path::new("/nonexistent/nft"),
            None,
            &["list", "ruleset"],
            None,
        )
        .expect_err("no such program");
        assert!(matches!(err, NftError::Spawn { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/nft"), "{err}");
    }

    #[test]
    fn a_refusal_carries_stderr_and_stdin_reaches_the_program() {
        // `sh -c` stands in for nft: it reads the "ruleset" and refuses it.
        let err = run(
            Path::new("sh"),
            None,
            &["-c", "read line; echo \"bad: $line\" >&2; exit 1"],
            Some("add table x\n"),
        )
        .expect_err("refused");
        match err {
            NftError::Failed { stderr, .. } => assert_eq!(stderr, "bad: add table x"),
            other => panic!("unexpected {other}"),
        }
        let out = run(Path::new("sh"), None, &["-c", "cat"], Some("table t\n")).expect("ran");
        assert_eq!(out, "table t\n");
    }

    #[test]
    fn a_program_that_blocks_is_killed_at_its_deadline_with_a_clear_error() {
        let fifo = std::env::temp_dir().join(format!("cnilab-nft-{}.fifo", std::process::id()));
        let _ = std::fs::remove_file(&fifo);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        // `cat` of a FIFO no one writes to blocks in open(2), as nft does
        // on `include "<fifo>"`.
        let path = fifo.display().to_string();
        let err = run_within(
            Path::new("cat"),
            None,
            &[&path],
            None,
            Duration::from_millis(300),
        )
        .expect_err("blocked");
        let _ = std::fs::remove_file(&fifo);
        assert!(matches!(err, NftError::Deadline { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("cat had not ended after 0.3 s and was killed"),
            "{err}"
        );
    }
}
