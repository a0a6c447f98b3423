//! Small helpers shared by the harness modules.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A scratch directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

/// 64 random bits from the kernel, written as a decimal number (so
/// [`sweep_scratch`] still reads `<pid>-<number>`).
fn random_suffix() -> std::io::Result<u64> {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    // The top bit set: always 19-20 digits, never a small counter.
    Ok(u64::from_le_bytes(bytes) | (1 << 63))
}

impl ScratchDir {
    /// mkdtemp-style: `<tmp>/cnilab-<label>-<pid>-<random>`, created with
    /// one mkdir(2) at mode 0700, which fails rather than reuse anything
    /// already there (a directory or a symlink someone planted); a name
    /// taken is retried with another random suffix, never removed.
    pub fn new(label: &str) -> std::io::Result<ScratchDir> {
        use std::os::unix::fs::DirBuilderExt;
        let mut last = None;
        for _ in 0..16 {
            let name = format!("cnilab-{label}-{}-{}", std::process::id(), random_suffix()?);
            let path = std::env::temp_dir().join(name);
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(ScratchDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no free scratch name")))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Removes scratch directories (`<tmp>/cnilab-<label>-<pid>-<random>`) of
/// processes that are gone. Returns the paths removed.
pub fn sweep_scratch() -> std::io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(std::env::temp_dir())?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("cnilab-") else {
            continue;
        };
        let mut parts = rest.rsplit('-');
        let (Some(n), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !numeric(n) || !numeric(pid) || parts.next().is_none() {
            continue;
        }
        if Path::new(&format!("/proc/{pid}")).exists() || !entry.path().is_dir() {
            continue;
        }
        std::fs::remove_dir_all(entry.path())?;
        removed.push(entry.path());
    }
    removed.sort();
    Ok(removed)
}

/// Whether `program` is a file in a directory of `$PATH`.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

/// Median and 95th percentile of a set of durations.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    pub count: usize,
    #[serde(serialize_with = "ms")]
    pub median: Duration,
    #[serde(serialize_with = "ms")]
    pub p95: Duration,
    #[serde(serialize_with = "ms")]
    pub max: Duration,
}

fn ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

impl Percentiles {
    /// Nearest-rank percentiles; an empty set gives zeros.
    pub fn of(samples: &[Duration]) -> Percentiles {
        let mut v = samples.to_vec();
        v.sort();
        let rank = |p: f64| -> Duration {
            if v.is_empty() {
                return Duration::ZERO;
            }
            let idx = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[idx]
        };
        Percentiles {
            count: v.len(),
            median: rank(0.5),
            p95: rank(0.95),
            max: v.last().copied().unwrap_or_default(),
        }
    }
}

/// A duration flag: `<n>ms`, `<n>s`, `<n>m` or `<n>h` (`30s`, `2m`); a bare
/// number is seconds (the older spelling). Zero is refused. Hand-written:
/// four units do not need a crate.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a duration like 500ms, 30s, 2m or 1h"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("{text:?}: the unit must be ms, s, m or h")),
    };
    if d.is_zero() {
        return Err(format!("{text:?}: must be more than zero"));
    }
    Ok(d)
}

/// `12.3 ms`.
pub fn fmt_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Trims `s` and cuts it to at most 300 bytes (on a character boundary),
/// marking the cut with `…`: evidence lines stay readable.
pub fn clip(s: &str) -> String {
    let s = s.trim();
    if s.len() > 300 {
        let mut end = 300;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s.to_string()
    }
}

/// Polls `f` until it gives a value, pausing 2 s in all (the kernel tears
/// down namespaces asynchronously), once more after the last pause. The
/// pauses start at 1 ms and double up to 50 ms: what is over a few
/// milliseconds after the first look is seen then, not a whole 50 ms pause
/// later. The time `f` takes is not counted, so a loaded machine gets as
/// long as it did with 40 pauses of 50 ms.
pub fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    use std::time::Duration;
    let mut budget = Duration::from_secs(2);
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if budget.is_zero() {
            return None;
        }
        let step = pause.min(budget);
        std::thread::sleep(step);
        budget -= step;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// `parallel_map`'s `workers` for a scoped thread of its own for every item.
pub const A_THREAD_EACH: usize = usize::MAX;

/// Runs `f` on every item on at most `workers` scoped threads (at most one
/// an item: [`A_THREAD_EACH`]), which take the items in their order (a
/// thousand items need not be a thousand threads), and returns the results
/// in the items' order; an item whose `f` panicked gives `panicked()` in
/// its place (the others still finish).
pub fn parallel_map<T, R>(
    items: impl IntoIterator<Item = T>,
    workers: usize,
    f: impl Fn(T) -> R + Sync,
    panicked: impl Fn() -> R,
) -> Vec<R>
where
    T: Send,
    R: Send,
{
    use std::sync::Mutex;
    let items: Vec<T> = items.into_iter().collect();
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let workers = workers.clamp(1, items.len().max(1));
    let queue = Mutex::new(items.into_iter().enumerate());
    let (f, slots_ref, queue) = (&f, &slots, &queue);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(move || loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some((i, item)) = next else { break };
                let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(item)));
                if let Ok(out) = out {
                    *slots_ref[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(&panicked)
        })
        .collect()
}

/// A file written where others may write too (a shared `/tmp`, a
/// report's directory), as root: its directory is opened once, the bytes go
/// to a fresh `.<name>.<pid>-<random>.partial` made there with
/// `O_CREAT | O_EXCL | O_NOFOLLOW` (a name someone planted, file or
/// symlink, is never opened: another random name is tried), and
/// [`Staged::commit`] renames it over `<name>` in the same directory
/// (`renameat`: a symlink at `<name>` is replaced, never written through).
/// Dropped uncommitted, the partial file is removed.
pub struct Staged {
    dir: std::os::fd::OwnedFd,
    partial: String,
    name: std::ffi::OsString,
    file: Option<std::fs::File>,
}

/// `O_CREAT | O_EXCL | O_NOFOLLOW` of `name` in `dir`, mode 0644.
fn create_new_at(dir: &std::os::fd::OwnedFd, name: &str) -> std::io::Result<std::fs::File> {
    use nix::fcntl::OFlag;
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o644);
    let fd = nix::fcntl::openat(dir, name, flags, mode)?;
    Ok(std::fs::File::from(fd))
}

impl Staged {
    /// Opens `path`'s directory and makes the partial file there now, so
    /// that an unwritable place is refused before any work.
    pub fn new(path: &Path) -> std::io::Result<Staged> {
        use nix::fcntl::OFlag;
        let name = path.file_name().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name")
        })?;
        let dir_path = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let dir = nix::fcntl::open(dir_path, flags, nix::sys::stat::Mode::empty())?;
        let mut last = std::io::Error::from(std::io::ErrorKind::AlreadyExists);
        for _ in 0..16 {
            let partial = format!(
                ".{}.{}-{}.partial",
                name.to_string_lossy(),
                std::process::id(),
                random_suffix()?
            );
            match create_new_at(&dir, &partial) {
                Ok(file) => {
                    return Ok(Staged {
                        dir,
                        partial,
                        name: name.to_os_string(),
                        file: Some(file),
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Writes `bytes`, syncs and renames the partial file into place.
    pub fn commit(mut self, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let mut file = self.file.take().ok_or(std::io::ErrorKind::NotFound)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        nix::fcntl::renameat(
            &self.dir,
            self.partial.as_str(),
            &self.dir,
            self.name.as_os_str(),
        )?;
        self.partial.clear();
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.partial.is_empty() {
            let _ = nix::unistd::unlinkat(
                &self.dir,
                self.partial.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// `bytes` as the whole of `path`, through [`Staged`].
pub fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    Staged::new(path)?.commit(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symlink planted at the partial name is never opened (root would
    /// write through it), and one planted at the final name is replaced by
    /// the rename, its target untouched; nothing partial is left.
    #[test]
    fn a_planted_symlink_is_never_written_through() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep me").expect("write");
        let opened = nix::fcntl::open(
            dir.path(),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .expect("dir");
        std::os::unix::fs::symlink(&target, dir.path().join(".out.json.partial")).expect("symlink");
        let e = create_new_at(&opened, ".out.json.partial").expect_err("planted");
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
        let out = dir.path().join("out.json");
        std::os::unix::fs::symlink(&target, &out).expect("symlink");
        write_replacing(&out, b"new").expect("write");
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep me");
        assert!(!out.is_symlink());
        assert_eq!(std::fs::read_to_string(&out).expect("read"), "new");
        let staged = Staged::new(&dir.path().join("dropped.json")).expect("staged");
        drop(staged);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| !n.ends_with(".partial") || n == ".out.json.partial"),
            "{names:?}"
        );
    }

    #[test]
    fn parallel_map_keeps_order_and_reports_a_panicked_item() {
        let out = parallel_map(
            0..5,
            A_THREAD_EACH,
            |i| {
                if i == 3 {
                    panic!("item 3");
                }
                Ok(i * 10)
            },
            || Err("panicked"),
        );
        assert_eq!(out, vec![Ok(0), Ok(10), Ok(20), Err("panicked"), Ok(40)]);
    }

    #[test]
    fn bounded_map_keeps_order_reports_panics_and_never_exceeds_its_workers() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let out = parallel_map(
            0..40,
            3,
            |i| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::yield_now();
                running.fetch_sub(1, Ordering::SeqCst);
                if i == 7 {
                    panic!("item 7");
                }
                Ok(i * 10)
            },
            || Err("panicked"),
        );
        let want: Vec<Result<usize, &str>> = (0..40)
            .map(|i| if i == 7 { Err("panicked") } else { Ok(i * 10) })
            .collect();
        assert_eq!(out, want);
        let most = most.load(Ordering::SeqCst);
        assert!((1..=3).contains(&most), "{most} items ran at once");
        assert!(parallel_map(Vec::<u8>::new(), 4, |i| i, || 0).is_empty());
    }

    #[test]
    fn durations_one_way() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("3d").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<Duration> = (1..=20).map(Duration::from_millis).collect();
        let p = Percentiles::of(&samples);
        assert_eq!(p.median, Duration::from_millis(10));
        assert_eq!(p.p95, Duration::from_millis(19));
        assert_eq!(p.max, Duration::from_millis(20));
        assert_eq!(Percentiles::of(&[]).count, 0);
    }

    #[test]
    fn sweep_scratch_removes_dirs_of_dead_processes_only() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("wait");
        let stale = std::env::temp_dir().join(format!("cnilab-sweep-test-{dead}-0"));
        std::fs::create_dir_all(stale.join("ipam")).expect("mkdir");
        let live = ScratchDir::new("sweep-live").expect("scratch");
        let removed = sweep_scratch().expect("sweep");
        assert!(removed.contains(&stale), "{removed:?}");
        assert!(!stale.exists());
        assert!(live.path().exists());
    }

    /// mkdtemp-style: created atomically (never reused, never a symlink),
    /// mode 0700, and a random name nobody can plant ahead of time.
    #[test]
    fn scratch_dirs_are_private_fresh_and_unpredictable() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let a = ScratchDir::new("mode").expect("scratch dir");
        let b = ScratchDir::new("mode").expect("scratch dir");
        for dir in [&a, &b] {
            let meta = std::fs::symlink_metadata(dir.path()).expect("stat");
            assert!(meta.is_dir(), "{:?} is a real directory", dir.path());
            assert_eq!(meta.permissions().mode() & 0o777, 0o700, "{:?}", dir.path());
            assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
        }
        let tail = |d: &ScratchDir| {
            let name = d
                .path()
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            name.rsplit('-').next().expect("suffix").to_string()
        };
        let (ta, tb) = (tail(&a), tail(&b));
        assert!(
            ta.len() >= 16 && tb.len() >= 16,
            "random suffixes: {ta} {tb}"
        );
        assert_ne!(ta, tb);
    }

    #[test]
    fn scratch_dirs_are_removed_on_drop() {
        let dir = ScratchDir::new("t").expect("scratch dir");
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("f"), "x").expect("write");
        drop(dir);
        assert!(!path.exists());
    }
}
