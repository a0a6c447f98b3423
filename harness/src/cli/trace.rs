//! `cnilab trace`: one packet followed on a live node, outside any lab.

use super::args::OutputArgs;
use super::{CliResult, Format};
use crate::report;
use crate::trace::live::{self, Probe};
use crate::trace::Proto;
use nix::sys::signal::{SigSet, Signal};
use std::path::PathBuf;
use std::process::ExitCode;

/// Follow one packet from FROM to TO on this node (or the node in
/// --netns): the kernel's routing answer at each namespace, nftables' own
/// trace of one real probe and the kernel's drop reason, as `lab trace`
/// does in a lab. Changes nothing on the node but the tracing it turns on
/// and off again (exit 0 arrived or left the node, 1 died here,
/// 3 inconclusive).
#[derive(clap::Args)]
#[command(after_help = concat!("FROM is a pod (its CRI name namespace/name, its network namespace's \
    name or path, pid:N of a process in it), the node's name, or an address here. TO is an \
    address, a pod or the node. Pods are found as `cnilab capture` finds them.\n\n\
    Examples:\n  \
    cnilab trace default/web-0 10.244.2.7\n  \
    cnilab trace cni-1d2c6a7e-0b4f-4c1e-9a55-3f0a4b7e2c11 10.96.0.10 --proto tcp --port 80\n  \
    cnilab trace pid:4121 10.244.1.9 --size 1450 -o json\n  \
    cnilab trace node1 10.244.1.9 --netns node1\n\n",
    crate::exit_codes_help!()))]
pub struct TraceCmd {
    /// Where the packet starts: a pod, the node or an address.
    pub from: String,
    /// Where it should arrive: an address, a pod or the node.
    pub to: String,
    /// The node's namespace (a name under /run/netns or a path such as
    /// /proc/<pid>/ns/net) instead of the process's own.
    #[arg(long, value_name = "NAME|PATH")]
    pub netns: Option<String>,
    /// The node's name (default: the hostname, or the namespace's name
    /// with --netns).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// A CRI socket to ask for pod names (repeatable; default: the usual
    /// containerd and CRI-O sockets that exist).
    #[arg(long, value_name = "PATH")]
    pub cri_socket: Vec<PathBuf>,
    /// The probe's protocol.
    #[arg(long, value_enum, default_value_t = Proto::Icmp)]
    pub proto: Proto,
    /// Destination port (needed with tcp and udp).
    #[arg(long)]
    pub port: Option<u16>,
    /// The probe's size in bytes, IP header included, sent with DF
    /// (icmp; default ping's 84, or 104 for IPv6): finds an MTU too small.
    #[arg(long, value_parser = clap::value_parser!(u32).range(48..=65535))]
    pub size: Option<u32>,
    /// Send a TCP segment with no flags set, which conntrack classes
    /// INVALID, instead of a SYN (tcp).
    #[arg(long)]
    pub invalid: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl TraceCmd {
    pub fn run(self) -> CliResult {
        let probe = Probe {
            proto: self.proto,
            port: self.port,
            size: self.size,
            invalid: self.invalid,
        };
        check_probe(probe)?;
        if self.proto != Proto::Icmp && self.port.is_none() {
            return Err("--proto tcp and udp need --port (the port a pod listens on)".into());
        }
        let opts = live::Options {
            netns: self.netns.as_deref().map(crate::capture::netns_path),
            node_name: self.node_name,
            cri_sockets: self.cri_socket,
        };
        // Ctrl-C waits for the trace to end: its tables and tracefs
        // instance go on the way out, as on any other exit.
        let held = hold_signals()?;
        let traced = live::run(&opts, &self.from, &self.to, probe);
        if interrupted(&held) {
            eprintln!(
                "cnilab: interrupted; the trace's own tables and tracefs instance are removed"
            );
            return Ok(ExitCode::from(130));
        }
        print(&traced?, self.output.output)
    }
}

/// SIGINT and SIGTERM blocked for this thread and those it starts (the
/// programs it runs start with none blocked).
fn hold_signals() -> Result<SigSet, String> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()
        .map_err(|e| format!("blocking SIGINT and SIGTERM: {e}"))?;
    Ok(set)
}

/// Whether a signal of `held` arrived meanwhile.
fn interrupted(held: &SigSet) -> bool {
    let mut pending = std::mem::MaybeUninit::<nix::libc::sigset_t>::uninit();
    // SAFETY: sigpending fills the set it is given; the set is read only
    // when the call succeeded.
    unsafe {
        if nix::libc::sigpending(pending.as_mut_ptr()) != 0 {
            return false;
        }
        let pending = pending.assume_init();
        held.iter()
            .any(|s| nix::libc::sigismember(&pending, s as nix::libc::c_int) == 1)
    }
}

/// What `--invalid`, `--port` and `--size` need (`trace` and `lab trace`).
pub fn check_probe(p: Probe) -> Result<(), String> {
    if p.invalid && p.proto != Proto::Tcp {
        return Err("--invalid needs --proto tcp (conntrack classes TCP segments)".into());
    }
    if p.port.is_some() && p.proto == Proto::Icmp {
        return Err("--port needs --proto tcp or udp".into());
    }
    if p.size.is_some() && p.proto != Proto::Icmp {
        return Err("--size needs --proto icmp (the default)".into());
    }
    Ok(())
}

/// A trace as text or JSON; the exit code is its verdict's.
pub fn print(t: &crate::trace::Trace, format: Format) -> CliResult {
    if format == Format::Table {
        report::print_human(&crate::trace::render(t));
    } else {
        println!("{}", serde_json::to_string_pretty(t)?);
    }
    Ok(ExitCode::from(t.verdict.exit_code()))
}
