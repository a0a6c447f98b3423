//! The microVM's initramfs: an uncompressed `newc` cpio archive holding
//! the host's busybox (with the libraries it links), the kernel's own
//! modules that mounting the host's root needs (virtio PCI, 9p, overlay;
//! decompressed, busybox's insmod reads plain ELF), a console node and
//! `/init`, which mounts the host's root read-only under a tmpfs overlay
//! and hands over to the run's second stage ([`super::STAGE2`]).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The modules mounting the root needs, in the order they are asked for;
/// each comes with what it depends on (`modprobe --show-depends`).
const WANTED: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// An archive being written.
#[derive(Default)]
pub struct Cpio {
    bytes: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let name = name.trim_start_matches('/');
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.bytes.extend_from_slice(b"070701");
        for f in fields {
            self.bytes.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }

    pub fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100000 | mode, (0, 0), data);
    }

    pub fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020600, (major, minor), &[]);
    }

    /// Every parent directory of `path`, then `path` itself as a file.
    pub fn file_with_parents(
        &mut self,
        path: &str,
        mode: u32,
        data: &[u8],
        made: &mut Vec<String>,
    ) {
        let mut at = String::new();
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            at.push('/');
            at.push_str(part);
            if !made.contains(&at) {
                self.dir(&at);
                made.push(at.clone());
            }
        }
        self.file(path, mode, data);
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.bytes
    }
}

/// The host's busybox and the shared objects it loads (from `ldd`).
fn busybox_and_libraries() -> Result<Vec<PathBuf>, String> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("busybox is not installed: apt-get install busybox (it runs the microVM's /init)")?;
    let out = Command::new("ldd")
        .arg(&busybox)
        .output()
        .map_err(|e| format!("ldd {}: {e}", busybox.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut files = vec![busybox];
    // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and the loader
    // `/lib64/ld-linux-x86-64.so.2 (0x…)`; a static busybox has none.
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.push(PathBuf::from(p));
        }
    }
    Ok(files)
}

/// The module files `/init` loads, in load order, for kernel `release`
/// whose modules are under `root/lib/modules/<release>` (built-in ones
/// need nothing).
fn module_files(root: &Path, release: &str) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<PathBuf> = Vec::new();
    for module in WANTED {
        let out = Command::new("modprobe")
            .arg("-d")
            .arg(root)
            .args(["-S", release, "--show-depends", module])
            .output()
            .map_err(|e| format!("modprobe (kmod): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "kernel {release} has no module {module} (needed to mount the host's root in the VM): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("insmod") {
                continue;
            }
            if let Some(p) = words.next().map(PathBuf::from) {
                if !files.contains(&p) {
                    files.push(p);
                }
            }
        }
    }
    Ok(files)
}

/// A module file's ELF bytes (`.ko`, or `.ko.xz`/`.ko.zst`/`.ko.gz`
/// decompressed by the tool of that format).
fn module_bytes(path: &Path) -> Result<Vec<u8>, String> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    let Some(tool) = tool else {
        return std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()));
    };
    let out = Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .map_err(|e| {
            format!(
                "{tool} -dc {}: {e} (apt-get install {tool})",
                path.display()
            )
        })?;
    if !out.status.success() {
        return Err(format!("{tool} -dc {} failed", path.display()));
    }
    Ok(out.stdout)
}

/// The archive for kernel `release`, its modules under `modules_root`
/// (`<modules_root>/lib/modules/<release>`).
pub fn build(modules_root: &Path, release: &str) -> Result<Vec<u8>, String> {
    let mut cpio = Cpio::default();
    let mut made: Vec<String> = Vec::new();
    for d in [
        "/dev", "/proc", "/sys", "/lower", "/rw", "/newroot", "/mods",
    ] {
        cpio.dir(d);
        made.push(d.to_string());
    }
    cpio.char_device("/dev/console", 5, 1);
    for file in busybox_and_libraries()? {
        let data = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let name = file.to_string_lossy().into_owned();
        cpio.file_with_parents(&name, 0o755, &data, &mut made);
    }
    let mut list = String::new();
    for (i, m) in module_files(modules_root, release)?.iter().enumerate() {
        let data = module_bytes(m)?;
        let name = format!("{i:02}.ko");
        cpio.file(&format!("/mods/{name}"), 0o644, &data);
        list.push_str(&name);
        list.push('\n');
    }
    cpio.file("/modules.list", 0o644, list.as_bytes());
    cpio.file("/init", 0o755, INIT.as_bytes());
    Ok(cpio.finish())
}

/// The first stage, as PID 1 in the initramfs (busybox sh): the modules,
/// the host's root (9p, read-only) under a tmpfs overlay, the run's own
/// directory (9p, read-write), then the second stage as PID 1 in that root.
/// A step that fails says so on the console and powers off.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mkdir -p /bin
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "cnilab-vm: $*"; echo o > /proc/sysrq-trigger; sleep 10; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.list); do insmod /mods/$m || fail "insmod $m"; done
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o $opts,ro,cache=loose hostroot /lower || fail "mount the host's root (9p)"
mount -t tmpfs -o mode=0755 tmpfs /rw || fail "tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot || fail "overlay"
mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "tmpfs /run"
mkdir -p /newroot/run/cnilab-vm
mount -t 9p -o $opts cnilabrun /newroot/run/cnilab-vm || fail "mount the run's directory (9p)"
umount /proc /sys
mount --move /dev /newroot/dev || umount /dev
exec switch_root /newroot /bin/sh /run/cnilab-vm/stage2.sh
fail "switch_root"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// The archive is what the kernel's unpacker reads: `070701` headers
    /// with hex fields, names and data padded to 4 bytes, a trailer.
    #[test]
    fn newc_entries_are_aligned_and_end_in_a_trailer() {
        let mut c = Cpio::default();
        c.dir("/mods");
        c.file("/init", 0o755, b"#!/bin/sh\n");
        c.char_device("/dev/console", 5, 1);
        let bytes = c.finish();
        assert!(bytes.len().is_multiple_of(4));
        assert!(bytes.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(text.matches("070701").count(), 4, "{text}");
        assert!(text.contains("TRAILER!!!"));
        // The file's header: mode 0100755, size 10, name "init" + NUL = 5.
        let at = text.find("init\0").expect("the file's name");
        let header = &text[at - 110..at];
        assert_eq!(&header[14..22], "000081ed", "{header}");
        assert_eq!(&header[54..62], "0000000a", "{header}");
        assert_eq!(&header[94..102], "00000005", "{header}");
        // The console: a character device 5:1.
        let at = text.find("dev/console\0").expect("the console");
        let header = &text[at - 110..at];
        assert_eq!(&header[14..22], "00002180", "{header}");
        assert_eq!(&header[78..86], "00000005", "{header}");
        assert_eq!(&header[86..94], "00000001", "{header}");
        // Data starts 4-aligned after the name.
        let name_end = text.find("init\0").expect("name") + 5;
        let data_at = text[name_end..].find("#!/bin/sh").expect("data") + name_end;
        assert!(data_at.is_multiple_of(4));
    }
}
