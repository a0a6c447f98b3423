//! A step as data: the commands, files and in-process actions it performs,
//! built by pure functions of the options (and of the manifests' text), so
//! that `--dry-run` and the tests see exactly what a run executes.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// An external command. Never run through a shell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cmd {
    pub env: Vec<(String, String)>,
    pub program: String,
    pub args: Vec<String>,
    /// What the command reads on stdin (a remote shell's script, so that
    /// no script is ever a `-c` argument built from strings); none: null.
    pub stdin: Option<String>,
}

impl Cmd {
    pub fn new(program: &str) -> Cmd {
        Cmd {
            env: Vec::new(),
            program: program.to_string(),
            args: Vec::new(),
            stdin: None,
        }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Cmd {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Feeds `text` to the command's stdin.
    pub fn stdin(mut self, text: impl Into<String>) -> Cmd {
        self.stdin = Some(text.into());
        self
    }

    pub fn env(mut self, name: &str, value: impl Into<String>) -> Cmd {
        self.env.push((name.to_string(), value.into()));
        self
    }

    /// Replaces `placeholder` in every argument (per-item commands of a `ForEach`).
    pub fn substitute(&self, placeholder: &str, value: &str) -> Cmd {
        Cmd {
            env: self.env.clone(),
            program: self.program.clone(),
            args: self
                .args
                .iter()
                .map(|a| a.replace(placeholder, value))
                .collect(),
            stdin: self.stdin.clone(),
        }
    }
}

/// Quotes a word for display only when a shell would need it. A run-time
/// placeholder such as `<agent-pod>` is shown as is.
pub fn quote(word: &str) -> String {
    if is_placeholder(word) {
        return word.to_string();
    }
    crate::report::quote(word)
}

fn is_placeholder(word: &str) -> bool {
    match (word.find('<'), word.find('>')) {
        (Some(open), Some(close)) if open < close => {
            let inner = &word[open + 1..close];
            !inner.is_empty()
                && inner.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                && word[..open]
                    .chars()
                    .chain(word[close + 1..].chars())
                    .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c))
        }
        _ => false,
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, value) in &self.env {
            write!(f, "{name}={} ", quote(value))?;
        }
        write!(f, "{}", quote(&self.program))?;
        for a in &self.args {
            write!(f, " {}", quote(a))?;
        }
        Ok(())
    }
}

/// A `wait` gate: its command blocks until the objects are ready or its
/// own timeout expires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    /// `daemonset kube-system/cnilab-agent`.
    pub what: String,
    pub timeout: Duration,
    /// Shows the objects that were not ready when the gate fails.
    pub on_failure: Cmd,
}

/// What a verification reads from a command's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verify {
    /// containerd's CNI config directory on `node` must be /etc/cni/net.d.
    CniConfDir { node: String },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Checks tools and host sysctls before a cluster is created.
    Preflight {
        tools: Vec<String>,
        /// `(path under /proc/sys, minimum)`: a warning when lower.
        sysctls: Vec<(String, u64)>,
    },
    Run {
        cmd: Cmd,
        timeout: Duration,
        /// Added to the error when the command fails.
        hint: Option<String>,
        gate: Option<Gate>,
    },
    /// Runs `cmd` with its stdout written to `file`.
    Capture {
        cmd: Cmd,
        file: PathBuf,
        timeout: Duration,
    },
    /// Runs `cmd` and checks what it printed.
    Verify {
        cmd: Cmd,
        verify: Verify,
        timeout: Duration,
    },
    Write {
        path: PathBuf,
        content: String,
    },
    /// Fails when a file that must exist is missing (no silent rebuild).
    RequireFile {
        path: PathBuf,
        why: String,
    },
    /// Runs `list`, then `body` once per printed name, with `placeholder`
    /// replaced. The dry run expands `predicted` instead (or shows the
    /// placeholder).
    ForEach {
        list: Cmd,
        placeholder: String,
        predicted: Option<Vec<String>>,
        body: Vec<Action>,
    },
    /// The in-cluster connectivity check, in process.
    Check(Box<super::check::CheckOptions>),
    /// A comment line in the dry run, nothing at run time.
    Note(String),
}

impl Action {
    pub fn run(cmd: Cmd, timeout: Duration) -> Action {
        Action::Run {
            cmd,
            timeout,
            hint: None,
            gate: None,
        }
    }

    /// The action with `placeholder` replaced by `value` everywhere.
    pub fn substitute(&self, placeholder: &str, value: &str) -> Action {
        let path = |p: &PathBuf| PathBuf::from(p.to_string_lossy().replace(placeholder, value));
        match self {
            Action::Run {
                cmd,
                timeout,
                hint,
                gate,
            } => Action::Run {
                cmd: cmd.substitute(placeholder, value),
                timeout: *timeout,
                hint: hint.as_ref().map(|h| h.replace(placeholder, value)),
                gate: gate.clone(),
            },
            Action::Capture { cmd, file, timeout } => Action::Capture {
                cmd: cmd.substitute(placeholder, value),
                file: path(file),
                timeout: *timeout,
            },
            Action::Verify {
                cmd,
                verify,
                timeout,
            } => Action::Verify {
                cmd: cmd.substitute(placeholder, value),
                verify: match verify {
                    Verify::CniConfDir { node } => Verify::CniConfDir {
                        node: node.replace(placeholder, value),
                    },
                },
                timeout: *timeout,
            },
            Action::Write { path: p, content } => Action::Write {
                path: path(p),
                content: content.replace(placeholder, value),
            },
            other => other.clone(),
        }
    }
}

/// The actions of one step (or of the whole run), in execution order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub actions: Vec<Action>,
}

impl Plan {
    pub fn push(&mut self, action: Action) {
        self.actions.push(action);
    }

    /// The `--dry-run` text (lab/e2e-plan.md, "Dry-run output format").
    pub fn dry_run(&self) -> String {
        let mut out = String::new();
        for a in &self.actions {
            render(a, &mut out);
        }
        out
    }
}

fn render(action: &Action, out: &mut String) {
    use std::fmt::Write as _;
    match action {
        Action::Preflight { tools, sysctls } => {
            let limits: Vec<String> = sysctls
                .iter()
                .map(|(k, v)| format!("{} >= {v}", k.replace('/', ".")))
                .collect();
            let _ = write!(out, "# preflight: {} on PATH", tools.join(", "));
            if !limits.is_empty() {
                let _ = write!(out, "; {}", limits.join(", "));
            }
            out.push('\n');
        }
        Action::Run { cmd, .. } | Action::Verify { cmd, .. } => {
            let _ = writeln!(out, "+ {cmd}");
        }
        Action::Capture { cmd, file, .. } => {
            let _ = writeln!(out, "+ {cmd} > {}", file.display());
        }
        Action::Write { path, content } => {
            let _ = writeln!(out, "--- write {}", path.display());
            out.push_str(content);
            if !content.ends_with('\n') {
                out.push('\n');
            }
            out.push_str("--- end\n");
        }
        Action::RequireFile { path, .. } => {
            let _ = writeln!(out, "# require {}", path.display());
        }
        Action::ForEach {
            list,
            placeholder,
            predicted,
            body,
        } => {
            let _ = writeln!(out, "+ {list}");
            match predicted {
                Some(items) => {
                    for item in items {
                        for a in body {
                            render(&a.substitute(placeholder, item), out);
                        }
                    }
                }
                None => {
                    for a in body {
                        render(a, out);
                    }
                }
            }
        }
        Action::Check(opts) => {
            let _ = writeln!(out, "# {}", opts.command_line());
            out.push_str(&super::check::dry_run(opts));
        }
        Action::Note(text) => {
            let _ = writeln!(out, "# {text}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("--timeout=180s"), "--timeout=180s");
        assert_eq!(quote("<agent-pod>"), "<agent-pod>");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("$(rm)"), "'$(rm)'");
        assert_eq!(quote("<x>;rm"), "'<x>;rm'");
    }

    #[test]
    fn for_each_expands_predicted_names() {
        let plan = Plan {
            actions: vec![Action::ForEach {
                list: Cmd::new("kind").args(["get", "nodes"]),
                placeholder: "<node>".into(),
                predicted: Some(vec!["a".into(), "b".into()]),
                body: vec![Action::Capture {
                    cmd: Cmd::new("docker").args(["exec", "<node>", "ip", "rule"]),
                    file: PathBuf::from("d/<node>/rules.txt"),
                    timeout: Duration::from_secs(1),
                }],
            }],
        };
        assert_eq!(
            plan.dry_run(),
            "+ kind get nodes\n+ docker exec a ip rule > d/a/rules.txt\n+ docker exec b ip rule > d/b/rules.txt\n"
        );
    }
}
