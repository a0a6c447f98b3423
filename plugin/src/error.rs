//! The plugin's error: a CNI code plus a message that names the object.
//! Mapped to the spec's JSON error body at the binary's edge.

use cnilab_net::spec::{code, ErrorBody};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

pub type Result<T, E = CniError> = std::result::Result<T, E>;

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    pub fn env(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_ENV, msg)
    }

    pub fn config(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_CONFIG, msg)
    }

    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(code::DECODE_FAILURE, msg)
    }

    pub fn version(msg: impl Into<String>) -> Self {
        Self::new(code::INCOMPATIBLE_VERSION, msg)
    }

    pub fn io(msg: impl Into<String>) -> Self {
        Self::new(code::IO_FAILURE, msg)
    }

    /// A kernel operation failed; `what` names the object.
    pub fn kernel(what: impl fmt::Display, err: impl fmt::Display) -> Self {
        Self::new(code::KERNEL, format!("{what}: {err}"))
    }

    /// Prefixes the message with what was being done.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.msg = format!("{what}: {}", self.msg);
        self
    }

    pub fn body(&self, cni_version: &str) -> ErrorBody {
        ErrorBody {
            cni_version: Some(cni_version.to_string()),
            code: self.code,
            msg: self.msg.clone(),
            details: self.details.clone(),
        }
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

/// Joins the errors of a best-effort teardown into one.
pub fn join(errors: Vec<CniError>) -> Result<()> {
    let mut iter = errors.into_iter();
    let Some(first) = iter.next() else {
        return Ok(());
    };
    let rest: Vec<String> = iter.map(|e| e.msg).collect();
    if rest.is_empty() {
        Err(first)
    } else {
        let code = first.code;
        Err(CniError::new(
            code,
            format!("{}; {}", first.msg, rest.join("; ")),
        ))
    }
}
