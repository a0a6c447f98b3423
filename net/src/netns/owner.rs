//! Who made a throwaway namespace: before its first `cnilab-<pid>-<n>`
//! namespace, a process writes `<pid> <start time>` to
//! [`OWNERS_DIR`]`/<pid>`. [`super::sweep`] removes a namespace of that
//! shape only when this record names a process that is gone (the same pid
//! with another start time is another process), so a namespace that merely
//! carries a dead pid in its name (one cnilab never made, a pid above
//! `pid_max`) is never taken for a leftover.

use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the owner records live (root only, like `/run/netns`).
pub const OWNERS_DIR: &str = "/run/cnilab/netns-owners";

/// Start time of process `pid` (field 22 of `/proc/<pid>/stat`, clock
/// ticks since boot).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    start_time_of_stat(&stat)
}

/// Field `3 + n` of a `/proc/<pid>/stat` line (`n` 0: the state, 1: the
/// parent pid, 19: the start time). The command name (field 2) is in
/// parentheses and may hold spaces or `)`, so fields are counted after the
/// last `)`. Allocation-free: it also runs between fork and exec.
pub fn stat_field(stat: &[u8], n: usize) -> Option<&[u8]> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat[close + 1..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .nth(n)
}

/// Field 22 of a `/proc/<pid>/stat` line (see [`stat_field`]).
pub fn start_time_of_stat(stat: &[u8]) -> Option<u64> {
    let field = stat_field(stat, 19)?;
    if field.is_empty() || field.len() > 19 || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(field.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Whether process `pid` runs and started at `start` (a zombie counts as
/// gone).
pub fn running(pid: u32, start: u64) -> bool {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = matches!(stat_field(&stat, 0), Some(b"Z") | Some(b"X"));
    start_time_of_stat(&stat) == Some(start) && !zombie
}

fn record_path(pid: u32) -> PathBuf {
    Path::new(OWNERS_DIR).join(pid.to_string())
}

/// Writes this process's record, once per process (later calls return the
/// first one's outcome).
pub(super) fn record_self() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(write_own_record).clone()
}

fn write_own_record() -> Result<(), String> {
    let pid = std::process::id();
    let start = start_time(pid).ok_or("cannot read this process's start time")?;
    let fail = |e: io::Error| format!("record the namespaces' owner in {OWNERS_DIR}: {e}");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(OWNERS_DIR)
        .map_err(fail)?;
    // Written aside and renamed: a sweep never reads half a record.
    let tmp = Path::new(OWNERS_DIR).join(format!(".{pid}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut file = private_file(&tmp, false).map_err(fail)?;
    file.write_all(format!("{pid} {start}\n").as_bytes())
        .map_err(fail)?;
    std::fs::rename(&tmp, record_path(pid)).map_err(fail)
}

/// A root-only file of the records, never through a symlink: a new one
/// (`append`: added to, or made).
fn private_file(path: &Path, append: bool) -> io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    match append {
        true => o.append(true).create(true),
        false => o.write(true).create_new(true),
    };
    o.mode(0o600).custom_flags(nix::libc::O_NOFOLLOW).open(path)
}

/// The `(pid, start)` of a `<pid> <start>` record at `path` (an owner
/// record, a lab's pidfile); `None` when absent, not a regular file, or
/// malformed.
pub fn read_record(path: &Path) -> Option<(u32, u64)> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > 64 {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let mut words = text.split_whitespace();
    let pid: u32 = words.next()?.parse().ok()?;
    let start: u64 = words.next()?.parse().ok()?;
    Some((pid, start))
}

/// The `(pid, start)` of `pid`'s owner record; `None` when absent,
/// malformed, or not for `pid`.
fn read(pid: u32) -> Option<(u32, u64)> {
    read_record(&record_path(pid)).filter(|(recorded, _)| *recorded == pid)
}

/// Whether a record proves that process `pid` made namespaces and is gone.
pub fn owner_gone(pid: u32) -> bool {
    read(pid).is_some_and(|(pid, start)| !running(pid, start))
}

/// Where process `pid` lists the namespaces it renamed
/// ([`super::Netns::rename`]): one name a line.
fn names_path(pid: u32) -> PathBuf {
    Path::new(OWNERS_DIR).join(format!("{pid}.names"))
}

/// Adds `name` to this process's renamed namespaces (before the name
/// exists, so a run killed right after leaves a name [`names_of_gone`]
/// finds).
pub(super) fn record_name(name: &str) -> Result<(), String> {
    let path = names_path(std::process::id());
    let mut file = private_file(&path, true)
        .map_err(|e| format!("record the name in {}: {e}", path.display()))?;
    file.write_all(format!("{name}\n").as_bytes())
        .map_err(|e| format!("record the name in {}: {e}", path.display()))
}

/// The renamed namespaces of processes that are gone (proved by their
/// owner record), as `(pid, name)`.
pub(super) fn names_of_gone() -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir(OWNERS_DIR) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".names"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let regular = std::fs::symlink_metadata(entry.path()).is_ok_and(|m| m.is_file());
        if !regular || !owner_gone(pid) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let names = text
            .lines()
            .filter(|n| !n.is_empty() && !n.contains('/') && !n.starts_with('.'));
        out.extend(names.map(|n| (pid, n.to_string())));
    }
    out
}

/// Drops the name lists of the processes in `swept` (their names are gone).
pub(super) fn forget_names(swept: &[(u32, String)]) {
    let mut pids: Vec<u32> = swept.iter().map(|(p, _)| *p).collect();
    pids.dedup();
    for pid in pids {
        let _ = std::fs::remove_file(names_path(pid));
    }
}

/// Removes the records of processes that are gone and whose namespaces
/// (named with `prefix`) are all gone too.
pub(super) fn forget_gone(prefix: &str, namespaces: &[String]) {
    let Ok(entries) = std::fs::read_dir(OWNERS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let own = format!("{prefix}{pid}-");
        let left = namespaces.iter().any(|n| n.starts_with(&own));
        if owner_gone(pid) && !left {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_even_with_odd_names() {
        let line = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        assert_eq!(start_time_of_stat(line.as_bytes()), Some(987654));
        assert_eq!(start_time_of_stat(b"garbage"), None);
    }

    #[test]
    fn a_running_process_is_running_only_with_its_own_start_time() {
        let me = std::process::id();
        let start = start_time(me).expect("own start time");
        assert!(running(me, start));
        assert!(!running(me, start + 1));
    }
}
