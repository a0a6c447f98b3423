//! `cnilab vm`: one cnilab command run inside a microVM on another kernel.
//!
//! QEMU boots the kernel directly (`-kernel`, no firmware disk, no
//! bootloader) with an initramfs of the run's own (`initramfs.rs`), which
//! mounts the host's root read-only over virtio-9p under a tmpfs overlay:
//! the VM sees the host's binaries, the caller's plugin directory and the
//! kernel's own modules (from the cache, `kernels.rs`), and writes only to
//! memory. The run's directory is a second 9p share, read-write: the
//! second stage, the command line, and what comes back (the command's
//! output and exit code). The caller's working directory is a third, so a
//! report written there (`--junit report.xml`) comes back too.
//!
//! The VM has no NIC (`-nic none`): it cannot touch the host's network.
//! QEMU dies with cnilab (PR_SET_PDEATHSIG), the run's directory is a
//! scratch directory `cnilab sweep` removes once its process is gone, and
//! Ctrl-C removes both. KVM is used where it serves (a CPU with VMX or SVM
//! and /dev/kvm open); elsewhere, TCG.

pub mod initramfs;
pub mod kernels;
pub mod matrix;

use kernels::Kernel;
use serde::Serialize;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How QEMU runs the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// KVM where it serves, else TCG.
    Auto,
    Kvm,
    Tcg,
}

/// How a VM is sized and how long it may run.
#[derive(Clone, Debug)]
pub struct Options {
    pub accel: Accel,
    pub memory_mib: u32,
    pub cpus: u32,
    pub timeout: Duration,
    /// Copy the command's output to this process's stdout and stderr as it
    /// comes (false: keep it, in [`Outcome`]).
    pub stream: bool,
}

/// What one run in a VM gave.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// The kernel's release, as `uname -r` said it inside the VM.
    pub kernel: String,
    pub accel: Accel,
    /// The command's exit code.
    pub code: i32,
    /// From QEMU's start to the command's start.
    pub boot_ms: f64,
    /// From QEMU's start to its end.
    pub total_ms: f64,
    #[serde(skip)]
    pub stdout: Vec<u8>,
    #[serde(skip)]
    pub stderr: Vec<u8>,
}

/// Why KVM does or does not serve here, as one line.
pub fn kvm_usable() -> Result<(), String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    if !has("vmx") && !has("svm") {
        return Err("the CPU shows no VMX or SVM (a /dev/kvm without them, such as PVM, cannot boot a stock kernel)".into());
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(|_| ())
        .map_err(|e| format!("/dev/kvm: {e}"))
}

/// The accelerator `wanted` comes to here, and the one line that says so.
pub fn choose_accel(wanted: Accel) -> Result<(Accel, String), String> {
    match (wanted, kvm_usable()) {
        (Accel::Tcg, _) => Ok((Accel::Tcg, "TCG (asked for)".into())),
        (Accel::Kvm | Accel::Auto, Ok(())) => Ok((Accel::Kvm, "KVM".into())),
        (Accel::Kvm, Err(why)) => Err(format!("--accel kvm: KVM cannot serve here: {why}")),
        (Accel::Auto, Err(why)) => Ok((Accel::Tcg, format!("TCG, software emulation: {why}"))),
    }
}

/// The second stage, PID 1 in the overlay root (the host's /bin/sh): the
/// rest of the filesystems, the kernel's modules where modprobe looks, the
/// caller's directory, then the command; its exit code is written back and
/// the VM powers off.
const STAGE2: &str = r#"set -u
run=/run/cnilab-vm
. $run/env.sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
[ -e /dev/null ] || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /var/tmp
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mkdir -p /lib/modules/$CNILAB_VM_RELEASE
mount --bind "$CNILAB_VM_MODULES" /lib/modules/$CNILAB_VM_RELEASE
# What a Kubernetes node loads at boot and no request loads on demand:
# br_netfilter (kubeadm's prerequisite: the bridge-nf-call-* sysctls).
modprobe br_netfilter 2>/dev/null
if [ -n "$CNILAB_VM_CWD" ]; then
  mkdir -p "$CNILAB_VM_CWD"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 cnilabcwd "$CNILAB_VM_CWD" || echo "cnilab-vm: the working directory is not shared" >&2
fi
ip link set lo up
hostname cnilab-vm
cd "${CNILAB_VM_CWD:-/}"
uname -r > $run/release
: > $run/started
sh $run/cmd.sh > $run/stdout 2> $run/stderr
echo $? > $run/rc.tmp
mv $run/rc.tmp $run/rc
sync
echo o > /proc/sysrq-trigger
sleep 30
"#;

/// Variables of the caller's environment the command keeps.
const KEPT: &[&str] = &[
    "PATH",
    "HOME",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "CI",
    "KUBECONFIG",
];

/// Quotes `s` for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The files the run's share starts with: the second stage, the
/// environment and the command line (`argv[0]` is this cnilab).
fn write_run_files(
    dir: &Path,
    kernel: &Kernel,
    cwd: Option<&Path>,
    argv: &[String],
) -> Result<(), String> {
    let w = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text)
            .map_err(|e| format!("{}: {e}", dir.join(name).display()))
    };
    let mut env = String::new();
    for key in KEPT {
        if let Ok(v) = std::env::var(key) {
            env.push_str(&format!("export {key}={}\n", quote(&v)));
        }
    }
    for (k, v) in
        std::env::vars().filter(|(k, _)| k.starts_with("CNILAB_") && !k.starts_with("CNILAB_VM_"))
    {
        env.push_str(&format!("export {k}={}\n", quote(&v)));
    }
    env.push_str(&format!(
        "export CNILAB_VM_RELEASE={}\n",
        quote(&kernel.release)
    ));
    let modules = kernel.modules_dir();
    env.push_str(&format!(
        "export CNILAB_VM_MODULES={}\n",
        quote(&modules.to_string_lossy())
    ));
    let cwd = cwd
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    env.push_str(&format!("export CNILAB_VM_CWD={}\n", quote(&cwd)));
    w("env.sh", &env)?;
    w("stage2.sh", STAGE2)?;
    let line: Vec<String> = argv.iter().map(|a| quote(a)).collect();
    w("cmd.sh", &format!("exec {}\n", line.join(" ")))
}

/// QEMU, killed when this process dies.
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_qemu(
    kernel: &Kernel,
    dir: &Path,
    cwd: Option<&Path>,
    accel: Accel,
    o: &Options,
) -> Result<Qemu, String> {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"]);
    match accel {
        Accel::Kvm => cmd.args(["-accel", "kvm", "-cpu", "host"]),
        // Debian's kernels crash early on TCG's `max` model; `qemu64`
        // boots them all.
        _ => cmd.args(["-accel", "tcg", "-cpu", "qemu64"]),
    };
    cmd.args(["-m", &o.memory_mib.to_string(), "-smp", &o.cpus.to_string()])
        .args(["-nic", "none", "-display", "none", "-monitor", "none"])
        .arg("-serial")
        .arg(format!("file:{}", dir.join("console.log").display()))
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(dir.join("initramfs.cpio"))
        // `no_hash_pointers`: a kernel that prints a drop's location with
        // `%p` (6.1) prints it in clear, so a trace names the function.
        .args([
            "-append",
            "console=ttyS0 panic=-1 loglevel=4 rdinit=/init no_hash_pointers",
        ]);
    let share = |path: &Path, tag: &str, ro: bool| {
        format!(
            "local,path={},mount_tag={tag},security_model=passthrough,multidevs=remap{}",
            path.display(),
            if ro { ",readonly=on" } else { "" }
        )
    };
    cmd.arg("-virtfs")
        .arg(share(Path::new("/"), "hostroot", true));
    cmd.arg("-virtfs").arg(share(dir, "cnilabrun", false));
    if let Some(cwd) = cwd {
        cmd.arg("-virtfs").arg(share(cwd, "cnilabcwd", false));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: prctl only, between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("qemu-system-x86_64: {e} (apt-get install qemu-system-x86)"))?;
    crate::interrupt::register_child(child.id());
    Ok(Qemu(child))
}

/// The command's output so far, read from the run's share as it grows.
#[derive(Default)]
struct Got {
    out_at: u64,
    err_at: u64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Got {
    /// What the command wrote since the last pull, kept and (`stream`)
    /// copied to this process's stdout and stderr.
    fn pull(&mut self, dir: &Path, stream: bool) {
        let (mut so, mut se) = (std::io::stdout(), std::io::stderr());
        let (so, se): (Option<&mut dyn Write>, Option<&mut dyn Write>) = if stream {
            (Some(&mut so), Some(&mut se))
        } else {
            (None, None)
        };
        follow(&dir.join("stdout"), &mut self.out_at, &mut self.stdout, so);
        follow(&dir.join("stderr"), &mut self.err_at, &mut self.stderr, se);
    }
}

/// Copies what a growing file gained since `at` to `to`.
fn follow(path: &Path, at: &mut u64, keep: &mut Vec<u8>, to: Option<&mut dyn Write>) {
    let Ok(mut f) = std::fs::File::open(path) else {
        return;
    };
    if f.seek(std::io::SeekFrom::Start(*at)).is_err() {
        return;
    }
    let mut new = Vec::new();
    if f.read_to_end(&mut new).is_ok() && !new.is_empty() {
        *at += new.len() as u64;
        if let Some(to) = to {
            let _ = to.write_all(&new);
            let _ = to.flush();
        }
        keep.extend_from_slice(&new);
    }
}

/// The last lines of the VM's console, for an error.
fn console_tail(dir: &Path) -> String {
    let bytes = std::fs::read(dir.join("console.log")).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    // Without the firmware's screen controls (ESC [ … letter).
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains('\u{1b}'))
        .collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Runs `argv` (a cnilab command line: `argv[0]` is the cnilab binary to
/// run) inside a microVM on `kernel`, with `dir` (a directory of the
/// caller's scratch directory) as the run's share; the caller's working
/// directory is shared when it is not `/`.
pub fn run(kernel: &Kernel, argv: &[String], o: &Options, dir: &Path) -> Result<Outcome, String> {
    let (accel, _) = choose_accel(o.accel)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = dir.to_path_buf();
    let image = initramfs::build(&kernel.modules_root, &kernel.release)?;
    std::fs::write(dir.join("initramfs.cpio"), image).map_err(|e| e.to_string())?;
    let cwd: Option<PathBuf> = std::env::current_dir().ok().filter(|c| c != Path::new("/"));
    write_run_files(&dir, kernel, cwd.as_deref(), argv)?;
    let start = Instant::now();
    let mut qemu = spawn_qemu(kernel, &dir, cwd.as_deref(), accel, o)?;
    let mut got = Got::default();
    let mut boot = None;
    let status = loop {
        if boot.is_none() && dir.join("started").exists() {
            boot = Some(start.elapsed());
        }
        got.pull(&dir, o.stream);
        match qemu.0.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for QEMU: {e}")),
        }
        if start.elapsed() > o.timeout {
            return Err(format!(
                "the VM on {} did not end within {:?}; its console ends:\n{}",
                kernel.release,
                o.timeout,
                console_tail(&dir)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let total = start.elapsed();
    got.pull(&dir, o.stream);
    let rc = std::fs::read_to_string(dir.join("rc")).ok();
    let code = rc.as_deref().and_then(|s| s.trim().parse::<i32>().ok());
    let Some(code) = code else {
        let mut qemu_err = String::new();
        if let Some(mut e) = qemu.0.stderr.take() {
            let _ = e.read_to_string(&mut qemu_err);
        }
        return Err(format!(
            "the VM on {} ended ({status}) before the command gave an exit code{}; its console ends:\n{}",
            kernel.release,
            if qemu_err.trim().is_empty() { String::new() } else { format!(" (QEMU: {})", qemu_err.trim()) },
            console_tail(&dir)
        ));
    };
    let inside = std::fs::read_to_string(dir.join("release")).unwrap_or_default();
    if inside.trim() != kernel.release {
        return Err(format!(
            "the VM says it runs kernel {:?} (uname -r), not {}",
            inside.trim(),
            kernel.release
        ));
    }
    Ok(Outcome {
        kernel: kernel.release.clone(),
        accel,
        code,
        boot_ms: boot.unwrap_or(total).as_secs_f64() * 1000.0,
        total_ms: total.as_secs_f64() * 1000.0,
        stdout: got.stdout,
        stderr: got.stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Single quotes keep everything literal in sh; a quote inside
    /// closes, adds an escaped one and reopens.
    #[test]
    fn a_command_line_is_quoted_for_the_shell() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME `x` \"y\" a b"), "'$HOME `x` \"y\" a b'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn kvm_is_refused_where_it_cannot_serve_and_tcg_is_said() {
        match kvm_usable() {
            Ok(()) => assert_eq!(choose_accel(Accel::Auto).expect("auto").0, Accel::Kvm),
            Err(why) => {
                let (accel, line) = choose_accel(Accel::Auto).expect("auto");
                assert_eq!(accel, Accel::Tcg);
                assert!(line.contains(&why), "{line}");
                assert!(choose_accel(Accel::Kvm).is_err());
            }
        }
        assert_eq!(choose_accel(Accel::Tcg).expect("tcg").0, Accel::Tcg);
    }
}
