//! Progress of long work on stderr: a line that rewrites itself on a TTY,
//! nothing when stderr is piped (except lines marked permanent). Hand-written
//! (one escape sequence) rather than `indicatif`, which would add `console`,
//! `unicode-width` and friends for the same single line.

use std::io::{IsTerminal, Write};

#[derive(Clone, Copy, Debug)]
pub struct Progress {
    tty: bool,
}

impl Progress {
    /// Progress on stderr, shown only when stderr is a terminal.
    pub fn stderr() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// No progress at all.
    pub fn quiet() -> Progress {
        Progress { tty: false }
    }

    pub fn is_tty(&self) -> bool {
        self.tty
    }

    /// Replaces the status line (TTY only).
    pub fn status(&self, text: &str) {
        if self.tty {
            let mut err = std::io::stderr();
            let _ = write!(err, "\r\x1b[2K{text}");
            let _ = err.flush();
        }
    }

    /// Clears the status line (TTY only).
    pub fn clear(&self) {
        self.status("");
    }

    /// A line that stays (a finished step), on a TTY or not; clears the
    /// status line first.
    pub fn line(&self, text: &str) {
        self.clear();
        eprintln!("{text}");
    }
}
