//! Running nftables: `nft -f -` with a ruleset on stdin (one atomic batch),
//! or `nft` with arguments, in the caller's namespace or inside another one.
//! The plugin (masquerade), the agent (its node table) and the harness (lab
//! nodes) all go through here; each words the error for its own user.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, Stdio};

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
/// fed to it; returns its stdout.
pub fn run(
    program: &Path,
    ns: Option<&File>,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, NftError> {
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
    if let Some(ns) = ns {
        crate::netns::command_in(ns, &mut command);
    }
    let mut child = command.spawn().map_err(|source| NftError::Spawn {
        program: program.display().to_string(),
        source,
    })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|source| NftError::Io {
                what: "write the ruleset to nft",
                source,
            })?;
    }
    let output = child.wait_with_output().map_err(|source| NftError::Io {
        what: "wait for nft",
        source,
    })?;
    if !output.status.success() {
        return Err(NftError::Failed {
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
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
}
