//! `cnilab vm` (one command in a microVM on another kernel) and `cnilab
//! matrix` (one command on several kernels, one table).

use super::args::CheckOutputArgs;
use super::{CliResult, Format};
use crate::report;
use crate::util::ScratchDir;
use crate::vm::{self, kernels, matrix, Accel};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// How the VM is made (shared by `vm` and `matrix`).
#[derive(clap::Args, Clone, Debug)]
pub struct VmFlags {
    /// kvm, tcg, or auto: KVM where the CPU has VMX/SVM and /dev/kvm opens.
    #[arg(long, value_enum, default_value_t = Accel::Auto)]
    pub accel: Accel,
    /// The VM's memory in MiB.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(256..=65536))]
    pub memory: u32,
    /// The VM's CPUs.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cpus: u32,
    /// Give up on a VM after this long (30s, 20m; a bare number is seconds).
    #[arg(long, default_value = "30m", value_parser = crate::util::parse_duration)]
    pub timeout: Duration,
}

impl Default for VmFlags {
    fn default() -> VmFlags {
        VmFlags {
            accel: Accel::Auto,
            memory: 2048,
            cpus: 2,
            timeout: Duration::from_secs(30 * 60),
        }
    }
}

/// `lab run --capture … --kernel`: the replay on another kernel.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct KernelFlags {
    /// Replay on another kernel, in a microVM as `cnilab vm` makes it:
    /// `auto` the kernel the captures name (this machine's, the kernel
    /// cache's or Debian's archive's; when that release is not to be had,
    /// the newest of its series, said in one line), `host`, a version
    /// (6.1, 6.12) or a path to a vmlinuz.
    #[arg(long, value_name = "auto|host|VERSION|PATH")]
    pub kernel: Option<String>,
    /// With --kernel PATH: the directory whose lib/modules/<release> holds
    /// its modules.
    #[arg(long, value_name = "DIR", requires = "kernel")]
    pub modules: Option<PathBuf>,
}

impl VmFlags {
    fn options(&self, stream: bool) -> vm::Options {
        vm::Options {
            accel: self.accel,
            memory_mib: self.memory,
            cpus: self.cpus,
            timeout: self.timeout,
            stream,
        }
    }
}

/// Run one cnilab command inside a microVM booted on another kernel: the
/// host's root read-only under a memory overlay, no network card, the
/// kernel's own modules. Kernels by version come from Debian's archive
/// into ~/.cache/cnilab/kernels ($CNILAB_KERNEL_CACHE) and are reused.
/// Exits with the command's own exit code (2 when the VM could not run it).
#[derive(clap::Args)]
#[command(after_help = concat!("What the command writes under the current directory (a \
    --junit or --report file) comes back; everything else the VM wrote is gone with it.\n\n\
    Examples:\n  \
    cnilab vm --kernel 6.1 -- lab run --nodes 2\n  \
    cnilab vm --kernel 6.12 -- conform --plugin-dir target/release --config harness/examples/cnilab-bridge.conflist --only A1,A2\n  \
    cnilab vm --kernel /boot/vmlinuz-6.1.0-57-amd64 --modules / -- lab run -o json\n\n",
    crate::exit_codes_help!()))]
pub struct Vm {
    /// A version of Debian's archive (6.1, 6.12, 6.1.0-57-amd64) or a path
    /// to a vmlinuz.
    #[arg(long, value_name = "VERSION|PATH")]
    pub kernel: String,
    /// With a vmlinuz by path: the directory whose lib/modules/<release>
    /// holds its modules (default: the vmlinuz's grandparent, as in
    /// <dir>/boot/vmlinuz-<release>).
    #[arg(long, value_name = "DIR")]
    pub modules: Option<PathBuf>,
    #[command(flatten)]
    pub vm: VmFlags,
    /// The cnilab command to run inside, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The command line to run inside: this cnilab, then `command` (a leading
/// `cnilab` dropped); `vm` and `matrix` themselves are refused.
fn cnilab_argv(command: &[String]) -> Result<Vec<String>, String> {
    let mut args = command.to_vec();
    if args
        .first()
        .is_some_and(|a| a == "cnilab" || a.ends_with("/cnilab"))
    {
        args.remove(0);
    }
    match args.first().map(String::as_str) {
        None => return Err("no command after `--` (cnilab vm --kernel 6.1 -- lab run)".into()),
        Some("vm" | "matrix") => {
            return Err("a VM runs a cnilab command, not another vm or matrix".into())
        }
        Some(a) if a.starts_with('-') => {
            return Err(format!(
                "{a}: the command after `--` is a cnilab subcommand (lab run, conform …)"
            ))
        }
        _ => {}
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this cnilab: {e}"))?;
    Ok(std::iter::once(exe.to_string_lossy().into_owned())
        .chain(args)
        .collect())
}

/// The run's scratch directory, removed on Ctrl-C too (QEMU is killed
/// first: it is a registered child).
fn scratch() -> Result<ScratchDir, String> {
    let scratch = ScratchDir::new("vm").map_err(|e| format!("scratch directory: {e}"))?;
    crate::interrupt::cleanup_on_interrupt(crate::interrupt::Teardown {
        first: || {},
        then: || {},
        extra: None,
        run_dir: scratch.path().to_path_buf(),
    });
    Ok(scratch)
}

fn preflight() -> Result<(), String> {
    crate::netns::require_root().map_err(|e| e.to_string())?;
    for tool in ["qemu-system-x86_64", "modprobe"] {
        if !crate::util::on_path(tool) {
            return Err(format!(
                "{tool} not found: bash lab/install-deps.sh (qemu-system-x86, kmod, busybox, xz-utils)"
            ));
        }
    }
    Ok(())
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(report::exit::USAGE))
}

impl Vm {
    pub fn run(self) -> CliResult {
        let argv = cnilab_argv(&self.command)?;
        preflight()?;
        let (_, line) = vm::choose_accel(self.vm.accel)?;
        let kernel = kernels::resolve(&self.kernel, self.modules.as_deref())?;
        run_on(&kernel, &argv, &self.vm, &line)
    }
}

/// The kernel `lab run --capture … --kernel SPEC` replays on (`None`:
/// this machine's own), said in a line when it is not the one asked for.
/// `captured`: each capture's node and kernel release, as its provenance
/// says.
pub fn replay_kernel(
    spec: &str,
    modules: Option<&Path>,
    captured: &[(String, String)],
) -> Result<Option<kernels::Kernel>, String> {
    let host = host_release()?;
    let kernel = match spec {
        "host" => None,
        "auto" => {
            let (node, release) = captured.first().ok_or("no capture names its kernel")?;
            let others: Vec<String> = captured
                .iter()
                .filter(|(_, r)| r != release)
                .map(|(n, r)| format!("{n} on {}", report::human(r)))
                .collect();
            if !others.is_empty() {
                eprintln!(
                    "cnilab: the captures name more than one kernel ({}); replaying on {}'s",
                    others.join(", "),
                    report::human(node)
                );
            }
            let (choice, why) = kernels::for_release(release, &host)?;
            if let Some(why) = why {
                eprintln!("cnilab: {why}");
            }
            match choice {
                kernels::Choice::Host => None,
                kernels::Choice::Vm(k) => Some(*k),
            }
        }
        other => Some(kernels::resolve(other, modules)?),
    };
    if kernel.is_none() {
        eprintln!("cnilab: replaying on this machine's kernel {host}");
    }
    Ok(kernel)
}

/// This process's command, its `--kernel` and `--modules` taken out, run
/// in a microVM on `kernel`; its exit code. `files`: what the command
/// reads, which must be where the VM sees them.
pub fn rerun_in_vm(kernel: &kernels::Kernel, files: &[PathBuf]) -> CliResult {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| {
            a.into_string().map_err(|a| {
                format!(
                    "{}: an argument that is not UTF-8 cannot be passed into the VM; rename it",
                    a.to_string_lossy()
                )
            })
        })
        .collect::<Result<_, _>>()?;
    let cwd = std::env::current_dir().map_err(|e| format!("the working directory: {e}"))?;
    for f in files {
        unseen_inside(&cwd, f)?;
    }
    let argv = cnilab_argv(&without_kernel_flags(args.into_iter()))?;
    preflight()?;
    let flags = VmFlags::default();
    let (_, line) = vm::choose_accel(flags.accel)?;
    run_on(kernel, &argv, &flags, &line)
}

/// Directories the VM mounts fresh: a file there is not the host's, unless
/// it is under the working directory (shared at its own path).
const FRESH_INSIDE: &[&str] = &["/tmp", "/var/tmp", "/run", "/dev"];

/// Refuses a file the VM would not see: under a directory it mounts fresh
/// and outside the working directory.
fn unseen_inside(cwd: &Path, file: &Path) -> Result<(), String> {
    let abs = cwd.join(file);
    // `/` as the working directory is not shared (it is the host's root,
    // which the VM has read-only under its own fresh mounts).
    if cwd != Path::new("/") && abs.starts_with(cwd) {
        return Ok(());
    }
    match FRESH_INSIDE.iter().find(|d| abs.starts_with(d)) {
        Some(d) => Err(format!(
            "{}: the VM mounts {d} fresh and sees only the working directory's files there; \
             run from {} or copy the file under the working directory",
            file.display(),
            abs.parent().unwrap_or(&abs).display()
        )),
        None => Ok(()),
    }
}

/// `args` without `--kernel X`, `--kernel=X`, `--modules X`, `--modules=X`.
fn without_kernel_flags(args: impl Iterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        match a.as_str() {
            "--kernel" | "--modules" => skip = true,
            _ if a.starts_with("--kernel=") || a.starts_with("--modules=") => {}
            _ => out.push(a),
        }
    }
    out
}

/// Runs `argv` in a microVM on `kernel`, saying which kernel and
/// accelerator (`line`) and how long it took; the command's exit code.
fn run_on(kernel: &kernels::Kernel, argv: &[String], flags: &VmFlags, line: &str) -> CliResult {
    eprintln!(
        "cnilab vm: kernel {} ({}), {line}",
        kernel.release,
        if kernel.fetched {
            format!("fetched into {}", kernels::cache_dir().display())
        } else {
            "cached".to_string()
        }
    );
    let scratch = scratch()?;
    let out = vm::run(
        kernel,
        argv,
        &flags.options(true),
        &scratch.path().join("run"),
    )?;
    eprintln!(
        "cnilab vm: ran on {} (uname -r inside): boot to command {:.1} s, all {:.1} s, exit {}",
        out.kernel,
        out.boot_ms / 1000.0,
        out.total_ms / 1000.0,
        out.code
    );
    Ok(exit_code(out.code))
}

/// Run one cnilab command on several kernels (each in a microVM as `cnilab
/// vm` makes it; `host` is this machine's own) and print one table, check
/// by kernel: a verdict that differs between kernels is marked, a failing
/// cell names its kernel, a kernel whose VM could not run the command is
/// INCONCLUSIVE with the reason. The command's report is read as JSON.
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab matrix --kernels 6.1,6.12,host -- conform --plugin-dir target/release --config harness/examples/cnilab-bridge.conflist\n  \
    cnilab matrix --kernels 6.1,host -o junit -- conform --plugin-dir /usr/lib/cni --config harness/examples/reference-bridge.conflist > kernels.xml\n  \
    cnilab matrix --kernels 6.1,6.12 -- lab run --nodes 2\n\n",
    crate::exit_codes_help!()))]
pub struct Matrix {
    /// Comma-separated kernels: versions of Debian's archive, paths to a
    /// vmlinuz, and `host`.
    #[arg(long, value_name = "LIST")]
    pub kernels: String,
    #[command(flatten)]
    pub vm: VmFlags,
    #[command(flatten)]
    pub output: CheckOutputArgs,
    /// Also write JUnit XML to this file.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// The cnilab command to run on each kernel, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// This machine's kernel release (`uname -r`).
fn host_release() -> Result<String, String> {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .map_err(|e| format!("this machine's kernel release: {e}"))
}

/// The command on this machine's own kernel.
fn on_host(argv: &[String]) -> matrix::Column {
    let mut col = matrix::Column::named("host");
    col.release = Some(host_release().unwrap_or_else(|_| "host".into()));
    let start = std::time::Instant::now();
    match std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .output()
    {
        Ok(out) => {
            col.code = out.status.code();
            col.total_ms = Some(start.elapsed().as_secs_f64() * 1000.0);
            col.output = Some(out.stdout);
        }
        Err(e) => col.error = Some(format!("{}: {e}", argv[0])),
    }
    col
}

/// The command in a VM on `spec`.
fn in_vm(spec: &str, argv: &[String], o: &vm::Options, dir: &Path) -> matrix::Column {
    let mut col = matrix::Column::named(spec);
    let kernel = match kernels::resolve(spec, None) {
        Ok(k) => k,
        Err(e) => {
            col.error = Some(e);
            return col;
        }
    };
    col.release = Some(kernel.release.clone());
    match vm::run(&kernel, argv, o, dir) {
        Ok(out) => {
            col.accel = Some(out.accel);
            col.code = Some(out.code);
            col.boot_ms = Some(out.boot_ms);
            col.total_ms = Some(out.total_ms);
            col.output = Some(out.stdout);
            if out.code == i32::from(report::exit::USAGE) {
                let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
                col.error = Some(format!("the command could not run there (exit 2): {why}"));
                col.output = None;
            }
        }
        Err(e) => col.error = Some(e),
    }
    col
}

impl Matrix {
    pub fn run(self) -> CliResult {
        let argv = matrix::with_json(&cnilab_argv(&self.command)?);
        let specs = matrix::parse_kernels(&self.kernels)?;
        preflight()?;
        let (_, line) = vm::choose_accel(self.vm.accel)?;
        eprintln!("cnilab matrix: {} kernels; VMs under {line}", specs.len());
        let scratch = scratch()?;
        let options = self.vm.options(false);
        let mut columns = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            eprintln!("cnilab matrix: [{}/{}] {spec}", i + 1, specs.len());
            let col = if spec == "host" {
                on_host(&argv)
            } else {
                in_vm(
                    spec,
                    &argv,
                    &options,
                    &scratch.path().join(format!("run{i}")),
                )
            };
            columns.push(col);
        }
        let m = matrix::assemble(self.command.clone(), columns);
        if let Some(path) = &self.junit {
            std::fs::write(path, m.junit().to_xml())
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        match self.output.output {
            Format::Json => println!("{}", report::json("MatrixReport", &m)),
            Format::Junit => print!("{}", m.junit().to_xml()),
            Format::Table => print!("{}", m.table()),
        }
        Ok(ExitCode::from(match m.verdict.as_str() {
            "pass" => report::exit::PASS,
            "fail" => report::exit::FAIL,
            _ => report::exit::INCONCLUSIVE,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_the_vm_mounts_fresh_is_refused_unless_under_the_working_directory() {
        let cwd = Path::new("/home/me/bug");
        assert!(unseen_inside(cwd, Path::new("n1.json")).is_ok());
        assert!(unseen_inside(cwd, Path::new("/home/me/caps/n1.json")).is_ok());
        let err = unseen_inside(cwd, Path::new("/tmp/caps/n1.json")).expect_err("refused");
        assert!(
            err.contains("/tmp") && err.contains("run from /tmp/caps"),
            "{err}"
        );
        assert!(unseen_inside(Path::new("/tmp/caps"), Path::new("/tmp/caps/n1.json")).is_ok());
        assert!(unseen_inside(Path::new("/"), Path::new("/tmp/caps/n1.json")).is_err());
        assert!(unseen_inside(Path::new("/"), Path::new("/srv/n1.json")).is_ok());
    }

    #[test]
    fn the_rerun_inside_drops_only_the_kernel_flags() {
        let args = [
            "lab",
            "run",
            "--kernel",
            "auto",
            "--capture",
            "a.json",
            "--modules=/m",
            "-o",
            "json",
        ];
        let kept = without_kernel_flags(args.iter().map(|a| a.to_string()));
        assert_eq!(kept, ["lab", "run", "--capture", "a.json", "-o", "json"]);
    }

    #[test]
    fn the_command_inside_is_a_cnilab_subcommand() {
        let argv = cnilab_argv(&["cnilab".into(), "lab".into(), "run".into()]).expect("argv");
        let exe = std::env::current_exe().expect("this test's executable");
        assert_eq!(argv[0], exe.to_string_lossy());
        assert_eq!(&argv[1..], ["lab", "run"]);
        assert!(cnilab_argv(&["vm".into()]).is_err());
        assert!(cnilab_argv(&["matrix".into()]).is_err());
        assert!(cnilab_argv(&["--kernel".into()]).is_err());
        assert!(cnilab_argv(&[]).is_err());
    }
}
