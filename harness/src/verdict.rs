//! Verdicts with evidence: what every lifecycle step and conformance check
//! produces.

use crate::runtime::Execution;
use std::fmt;

/// Ordered from best to worst, so `max()` picks the overall verdict.
/// JSON: `"pass"`, `"skip"`, `"warn"`, `"fail"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Skip,
    Warn,
    Fail,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Skip => "SKIP",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One observation about one rule (a checklist ID such as `A5`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Finding {
    pub id: &'static str,
    pub verdict: Verdict,
    /// What was expected and what was seen (or why it passed/was skipped).
    pub detail: String,
    /// The plugin calls behind the finding (command, env, stdin, output).
    pub executions: Vec<Execution>,
}

impl Finding {
    pub fn new(id: &'static str, verdict: Verdict, detail: impl Into<String>) -> Finding {
        Finding {
            id,
            verdict,
            detail: detail.into(),
            executions: Vec::new(),
        }
    }

    pub fn pass(id: &'static str, detail: impl Into<String>) -> Finding {
        Finding::new(id, Verdict::Pass, detail)
    }

    pub fn fail(id: &'static str, detail: impl Into<String>) -> Finding {
        Finding::new(id, Verdict::Fail, detail)
    }

    pub fn warn(id: &'static str, detail: impl Into<String>) -> Finding {
        Finding::new(id, Verdict::Warn, detail)
    }

    pub fn skip(id: &'static str, detail: impl Into<String>) -> Finding {
        Finding::new(id, Verdict::Skip, detail)
    }

    /// PASS when `ok`, else FAIL, with the same detail.
    pub fn check(id: &'static str, ok: bool, detail: impl Into<String>) -> Finding {
        Finding::new(id, if ok { Verdict::Pass } else { Verdict::Fail }, detail)
    }

    pub fn with(mut self, exec: &Execution) -> Finding {
        self.executions.push(exec.clone());
        self
    }

    pub fn with_all<'a>(mut self, execs: impl IntoIterator<Item = &'a Execution>) -> Finding {
        self.executions.extend(execs.into_iter().cloned());
        self
    }
}
