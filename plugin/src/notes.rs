//! What the command's log line must say besides its outcome: a link left
//! alone and why, a malformed store entry skipped. Anything may record a
//! note (the store, the attachment cache, each command); the dispatch in
//! `commands` appends them to the log line, escaped. A base module: it
//! uses nothing of the crate.

/// Process-wide: DEL records notes from its address-release thread too.
static NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Records something the log line must say.
pub fn note(msg: impl Into<String>) {
    let msg = msg.into();
    if let Ok(mut notes) = NOTES.lock() {
        notes.push(msg);
    }
}

/// The notes recorded so far, in order; the list is empty afterwards.
pub fn take_notes() -> Vec<String> {
    NOTES
        .lock()
        .map(|mut n| std::mem::take(&mut *n))
        .unwrap_or_default()
}
