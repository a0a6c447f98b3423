//! Kernels for the microVM: a version the distribution's archive serves
//! (`6.1`, `6.12`, or a release such as `6.1.0-57-amd64`), fetched with
//! `apt-get download`, unpacked with `dpkg-deb -x`, pruned of hardware
//! drivers, indexed with `depmod` and kept in a cache
//! (`~/.cache/cnilab/kernels/<release>/`, or `$CNILAB_KERNEL_CACHE`) that
//! later runs reuse; or a `vmlinuz` by path, with its modules.

use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A kernel ready to boot.
#[derive(Clone, Debug, Serialize)]
pub struct Kernel {
    /// `6.1.0-57-amd64`: what `uname -r` says inside.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// The directory whose `lib/modules/<release>` holds its modules.
    pub modules_root: PathBuf,
    /// The package it came from, when it came from the archive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    /// Whether this run fetched it (false: the cache had it).
    pub fetched: bool,
}

impl Kernel {
    pub fn modules_dir(&self) -> PathBuf {
        self.modules_root.join("lib/modules").join(&self.release)
    }
}

/// The cache of unpacked kernels.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CNILAB_KERNEL_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    base.join("cnilab/kernels")
}

/// The record a cached kernel's directory ends with (written last: a
/// directory without it is a fetch that did not finish).
const RECORD: &str = "cnilab-kernel.json";

/// Whether `spec` names a kernel file rather than a version.
fn is_path(spec: &str) -> bool {
    spec.contains('/')
}

/// The kernel `spec` names: a path to a `vmlinuz` (its modules in
/// `modules`, or beside it as `<dir>/lib/modules/<release>`), or a version
/// of the archive, from the cache or fetched into it.
pub fn resolve(spec: &str, modules: Option<&Path>) -> Result<Kernel, String> {
    if is_path(spec) {
        return from_path(Path::new(spec), modules);
    }
    if !spec
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || ".-+~".contains(c))
        || spec.is_empty()
    {
        return Err(format!(
            "--kernel {spec:?}: not a version (6.1, 6.12, 6.1.0-57-amd64) nor a path to a vmlinuz"
        ));
    }
    let cache = cache_dir();
    match package_for(spec) {
        Ok(package) => {
            let release = package.trim_start_matches("linux-image-").to_string();
            if let Some(k) = cached(&cache, &release) {
                return Ok(k);
            }
            fetch(&cache, &package, &release)
        }
        // No archive to ask (offline, no lists): the newest cached kernel of
        // that version, if any.
        Err(e) => newest_cached(&cache, spec).ok_or(e),
    }
}

/// A release as `uname -r` prints it (`6.1.0-57-amd64`), checked before
/// it names a directory of the cache or a package: it comes from a
/// capture, a stranger's file.
fn valid_release(r: &str) -> bool {
    r.len() <= 64
        && r.starts_with(|c: char| c.is_ascii_digit())
        && r.chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-+~_".contains(c))
        && !r.contains("..")
}

/// `6.1` of `6.1.0-57-amd64`.
fn series_of(release: &str) -> Option<String> {
    let mut n = release.split(|c: char| !c.is_ascii_digit());
    let (major, minor) = (n.next()?, n.next()?);
    (!major.is_empty() && !minor.is_empty()).then(|| format!("{major}.{minor}"))
}

/// Where a capture taken on kernel `release` replays.
#[derive(Debug)]
pub enum Choice {
    /// This machine's own kernel.
    Host,
    /// A kernel for the microVM.
    Vm(Box<Kernel>),
}

/// The kernel a capture taken on `release` replays on (`--kernel auto`),
/// and, when it is not that release, which it is instead and why: the
/// release itself (this machine's, the cache's or the archive's), else
/// the newest of its series the cache or the archive has, else this
/// machine's own when it is of that series.
pub fn for_release(release: &str, host: &str) -> Result<(Choice, Option<String>), String> {
    if !valid_release(release) {
        return Err(format!(
            "the capture's kernel {release:?} is not a release (as `uname -r` prints it) to look up; \
             pass --kernel VERSION|PATH|host"
        ));
    }
    if release == host {
        return Ok((Choice::Host, None));
    }
    let cache = cache_dir();
    if let Some(k) = cached(&cache, release) {
        return Ok((Choice::Vm(Box::new(k)), None));
    }
    let package = format!("linux-image-{release}");
    if in_archive(&package) {
        let k = fetch(&cache, &package, release)?;
        return Ok((Choice::Vm(Box::new(k)), None));
    }
    let series = series_of(release).unwrap_or_else(|| release.to_string());
    let not_here = format!(
        "the capture's kernel {release} is neither this machine's, cached nor in the archive"
    );
    if let Ok(k) = resolve(&series, None) {
        let why = format!(
            "{not_here}: the newest {series} kernel there is {}",
            k.release
        );
        return Ok((Choice::Vm(Box::new(k)), Some(why)));
    }
    if series_of(host).as_deref() == Some(series.as_str()) {
        let why = format!("{not_here}: this machine's {host} is of its series");
        return Ok((Choice::Host, Some(why)));
    }
    Err(format!(
        "{not_here}, nor is any {series} kernel; pass --kernel VERSION|PATH (6.1, 6.12, a vmlinuz) \
         or --kernel host to replay on this machine's {host}"
    ))
}

/// Whether the archive's lists have `package`.
fn in_archive(package: &str) -> bool {
    Command::new("apt-cache")
        .args(["show", "--no-all-versions", package])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty())
}

/// The image package of version `spec`: `linux-image-<spec>` for a full
/// release, else the one the `linux-image-amd64` metapackage of that
/// version depends on (the archive's newest of the series).
fn package_for(spec: &str) -> Result<String, String> {
    let looks_full = spec.matches('.').count() >= 2 || spec.contains('-');
    if looks_full {
        return Ok(format!("linux-image-{spec}"));
    }
    let apt = |args: &[&str]| -> Result<String, String> {
        let out = Command::new("apt-cache").args(args).output().map_err(|e| {
            format!("apt-cache: {e} (kernels by version come from Debian's archive)")
        })?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let madison = apt(&["madison", "linux-image-amd64"])?;
    let versions: Vec<&str> = madison
        .lines()
        .filter_map(|l| l.split('|').nth(1).map(str::trim))
        .filter(|v| v.starts_with(&format!("{spec}.")))
        .collect();
    let version = versions.first().ok_or_else(|| {
        format!(
            "no kernel {spec} in the archive's lists (apt-cache madison linux-image-amd64 offers: {}); \
             run apt-get update, add the suite that has it (6.12: bookworm-backports), or pass a path",
            madison
                .lines()
                .filter_map(|l| l.split('|').nth(1).map(str::trim))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let depends = apt(&["depends", &format!("linux-image-amd64={version}")])?;
    depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && !p.contains('<'))
        .map(str::to_string)
        .ok_or_else(|| format!("linux-image-amd64={version} names no image package"))
}

fn cached(cache: &Path, release: &str) -> Option<Kernel> {
    let dir = cache.join(release);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(RECORD)).ok()?).ok()?;
    let vmlinuz = dir.join("boot").join(format!("vmlinuz-{release}"));
    vmlinuz.is_file().then(|| Kernel {
        release: release.to_string(),
        vmlinuz,
        modules_root: dir.clone(),
        package: record["package"].as_str().map(str::to_string),
        fetched: false,
    })
}

/// The cached kernel of series `spec` (`6.1`: `6.1.0-57-amd64`, …) with
/// the highest release, compared number by number.
fn newest_cached(cache: &Path, spec: &str) -> Option<Kernel> {
    let key = |r: &str| -> Vec<u64> {
        r.split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    let mut releases: Vec<String> = std::fs::read_dir(cache)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{spec}.")) || n == spec)
        .collect();
    releases.sort_by_key(|r| key(r));
    releases.iter().rev().find_map(|r| cached(cache, r))
}

/// Hardware drivers a microVM never loads: left out of the cache.
const PRUNED: &[&str] = &[
    "kernel/sound",
    "kernel/drivers/gpu",
    "kernel/drivers/media",
    "kernel/drivers/infiniband",
    "kernel/drivers/net/wireless",
    "kernel/drivers/net/ethernet",
    "kernel/drivers/scsi",
    "kernel/drivers/usb",
    "kernel/drivers/staging",
    "kernel/drivers/hid",
    "kernel/drivers/iio",
    "kernel/drivers/bluetooth",
    "kernel/drivers/input",
    "kernel/drivers/mtd",
    "kernel/drivers/isdn",
    "kernel/net/bluetooth",
    "kernel/net/wireless",
    "kernel/net/mac80211",
];

/// `apt-get download` of `package` into the cache, unpacked, pruned and
/// indexed; the directory is renamed into place only when complete.
fn fetch(cache: &Path, package: &str, release: &str) -> Result<Kernel, String> {
    std::fs::create_dir_all(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let partial = cache.join(format!(".partial-{release}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    let result = unpack_into(&partial, package, release);
    let done = result.and_then(|()| {
        let dir = cache.join(release);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(partial.join("root"), &dir).map_err(|e| format!("{}: {e}", dir.display()))
    });
    let _ = std::fs::remove_dir_all(&partial);
    done?;
    let mut k = cached(cache, release).ok_or("the fetched kernel is incomplete")?;
    k.fetched = true;
    Ok(k)
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

fn unpack_into(partial: &Path, package: &str, release: &str) -> Result<(), String> {
    eprintln!("cnilab: fetching kernel {release} ({package}) from the archive");
    run(
        Command::new("apt-get")
            .args(["download", "-qq", "-o", "APT::Sandbox::User=root", package])
            .current_dir(partial),
        &format!("apt-get download {package}"),
    )?;
    let deb = std::fs::read_dir(partial)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| format!("apt-get download {package} left no .deb"))?;
    let root = partial.join("root");
    run(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
        &format!("dpkg-deb -x {}", deb.display()),
    )?;
    let _ = std::fs::remove_file(&deb);
    let _ = std::fs::remove_dir_all(root.join("usr"));
    let modules = root.join("lib/modules").join(release);
    for p in PRUNED {
        let _ = std::fs::remove_dir_all(modules.join(p));
    }
    run(
        Command::new("depmod").arg("-b").arg(&root).arg(release),
        "depmod",
    )?;
    let record = serde_json::json!({ "package": package, "release": release });
    std::fs::write(root.join(RECORD), record.to_string()).map_err(|e| e.to_string())
}

/// A `vmlinuz` by path: its release read from the image's own header
/// (the x86 boot protocol's kernel_version string).
fn from_path(vmlinuz: &Path, modules: Option<&Path>) -> Result<Kernel, String> {
    let bytes =
        std::fs::read(vmlinuz).map_err(|e| format!("--kernel {}: {e}", vmlinuz.display()))?;
    let release = bzimage_release(&bytes).ok_or_else(|| {
        format!(
            "--kernel {}: not an x86 bzImage (no kernel version in its boot header)",
            vmlinuz.display()
        )
    })?;
    let modules_root = match modules {
        Some(m) => m.to_path_buf(),
        None => vmlinuz
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    let k = Kernel {
        release: release.clone(),
        vmlinuz: vmlinuz.to_path_buf(),
        modules_root,
        package: None,
        fetched: false,
    };
    if !k.modules_dir().join("modules.dep").is_file() {
        return Err(format!(
            "no modules for {release} at {} (modules.dep missing): pass --modules DIR where \
             DIR/lib/modules/{release} holds them, indexed by `depmod -b DIR {release}`",
            k.modules_dir().display()
        ));
    }
    Ok(k)
}

/// The release (`6.1.0-57-amd64`) in a bzImage's boot header: at 0x202
/// the magic `HdrS`, at 0x20E the offset (from 0x200) of the version string.
pub fn bzimage_release(bytes: &[u8]) -> Option<String> {
    if bytes.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let at = u16::from_le_bytes([*bytes.get(0x20E)?, *bytes.get(0x20F)?]) as usize + 0x200;
    let rest = bytes.get(at..at.checked_add(256)?.min(bytes.len()))?;
    let end = rest.iter().position(|b| *b == 0 || *b == b' ')?;
    let release = std::str::from_utf8(&rest[..end]).ok()?;
    (!release.is_empty()).then(|| release.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_captured_release_is_checked_before_it_names_anything() {
        for good in [
            "6.1.0-57-amd64",
            "6.12.95+deb12-amd64",
            "5.15.0-1034-azure",
            "6.18.44-fc-v657",
        ] {
            assert!(valid_release(good), "{good}");
        }
        for bad in [
            "",
            "../../etc",
            "6.1/../x",
            "-o",
            "6.1 0",
            "6.1;reboot",
            "x6.1",
            "6..1",
        ] {
            assert!(!valid_release(bad), "{bad}");
            let err = for_release(bad, "6.18.44-fc-v657").expect_err("refused");
            assert!(err.contains("not a release"), "{err}");
        }
        assert_eq!(series_of("6.1.0-57-amd64").as_deref(), Some("6.1"));
        assert_eq!(series_of("5.15.0-1034-azure").as_deref(), Some("5.15"));
        assert_eq!(series_of("6").as_deref(), None);
        let (choice, why) = for_release("6.18.44-fc-v657", "6.18.44-fc-v657").expect("the host");
        assert!(matches!(choice, Choice::Host) && why.is_none());
    }

    #[test]
    fn a_bzimage_header_gives_its_release() {
        let mut image = vec![0u8; 0x1000];
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x20E..0x210].copy_from_slice(&0x0C00u16.to_le_bytes());
        let text = b"6.1.0-57-amd64 (debian-kernel@lists.debian.org) #1 SMP";
        image[0xE00..0xE00 + text.len()].copy_from_slice(text);
        assert_eq!(bzimage_release(&image).as_deref(), Some("6.1.0-57-amd64"));
        image[0x202] = b'X';
        assert_eq!(bzimage_release(&image), None);
        assert_eq!(bzimage_release(b"short"), None);
    }

    #[test]
    fn a_version_that_is_no_version_is_refused_before_anything_runs() {
        let e = resolve("6.1;reboot", None).expect_err("refused");
        assert!(e.contains("not a version"), "{e}");
        let e = resolve("/nonexistent/vmlinuz", None).expect_err("refused");
        assert!(e.contains("/nonexistent/vmlinuz"), "{e}");
    }

    #[test]
    fn the_newest_cached_release_of_a_series_is_found() {
        let cache = tempfile::tempdir().expect("tempdir");
        for r in ["6.1.0-9-amd64", "6.1.0-57-amd64", "6.12.57+deb12-amd64"] {
            let dir = cache.path().join(r);
            std::fs::create_dir_all(dir.join("boot")).expect("mkdir");
            std::fs::write(dir.join("boot").join(format!("vmlinuz-{r}")), b"").expect("write");
            std::fs::write(dir.join(RECORD), b"{}").expect("write");
        }
        let k = newest_cached(cache.path(), "6.1").expect("a 6.1");
        assert_eq!(k.release, "6.1.0-57-amd64");
        let k = newest_cached(cache.path(), "6.12").expect("a 6.12");
        assert_eq!(k.release, "6.12.57+deb12-amd64");
        assert!(newest_cached(cache.path(), "5.10").is_none());
    }
}
