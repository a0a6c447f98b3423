//! `cnilab capture`: a node's network (and its pods') as one JSON file.

use super::CliResult;
use crate::capture::{self, Capture, Options};
use crate::report;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Capture a node's network and its pods' into one file, to replay and
/// diagnose elsewhere (run as root on the node, or against a namespace).
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab capture -o node1.json\n  \
    cnilab capture --redact --redact-key \"$KEY\" -o node1.json\n  \
    cnilab capture --netns cnilab-lab-demo-node1 -o json\n  \
    cnilab capture --script > node.sh; ssh node1 sudo sh -s < node.sh > node1.capture\n  \
    cnilab capture --from-script node1.capture -o node1.json\n\n\
    A node without cnilab: docs/src/capture-script.md.\n\
    The file's schema: `cnilab schema capture` (docs/src/capture-format.md).\n\n",
    crate::exit_codes_help!()))]
pub struct CaptureCmd {
    /// Where the capture goes: FILE (written at the end, checked before
    /// anything is read), `json` (the capture on stdout) or `table` (a
    /// summary on stdout, nothing written).
    #[arg(
        short = 'o',
        long = "output",
        value_name = "table|json|FILE",
        default_value = "table"
    )]
    pub output: String,
    /// Capture this namespace (a name under /run/netns or a path such as
    /// /proc/<pid>/ns/net) instead of the process's own.
    #[arg(long, value_name = "NAME|PATH")]
    pub netns: Option<String>,
    /// The node's name in the capture (default: the hostname, or the
    /// namespace's name with --netns).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Map addresses and names consistently (keeping prefixes, reserved
    /// ranges and subnets) for posting in public.
    #[arg(long)]
    pub redact: bool,
    /// The redaction key (implies --redact): the same key on every node
    /// gives the same mapping (default: a random key, never written).
    #[arg(long, value_name = "KEY")]
    pub redact_key: Option<String>,
    /// A CRI socket to ask for pod names (repeatable; default: the usual
    /// containerd and CRI-O sockets that exist).
    #[arg(long, value_name = "PATH")]
    pub cri_socket: Vec<PathBuf>,
    /// The node's CNI cache, whose ADD results tell pods from other
    /// namespaces (default: /var/lib/cni/results when capturing this
    /// machine, none with --netns; a missing one is empty).
    #[arg(long, value_name = "DIR")]
    pub cni_cache: Option<PathBuf>,
    /// The node's CNI configuration, whose subnets tell pods from other
    /// namespaces (default: /etc/cni/net.d when capturing this machine,
    /// none with --netns).
    #[arg(long, value_name = "DIR")]
    pub cni_conf_dir: Option<PathBuf>,
    /// Print a POSIX sh script that captures a node without cnilab on it
    /// (sh, coreutils or busybox, nsenter, iproute2), into one file that
    /// `lab up --capture` and `--from-script` read; nothing else is done.
    #[arg(long, conflicts_with_all = ["from_script", "netns", "redact", "redact_key", "cri_socket", "cni_cache", "cni_conf_dir", "node_name"])]
    pub script: bool,
    /// Read the file the capture script wrote (instead of this machine)
    /// into a capture.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["netns", "cri_socket", "cni_cache", "cni_conf_dir"])]
    pub from_script: Option<PathBuf>,
}

/// Where the capture goes.
enum Sink {
    Table,
    Json,
    /// The final path and the partial file that proves it is writable.
    File(PathBuf, crate::util::Staged),
}

impl CaptureCmd {
    pub fn run(self) -> CliResult {
        if self.script {
            print!("{}", capture::script::script());
            return Ok(ExitCode::SUCCESS);
        }
        let sink = match self.output.as_str() {
            "table" => Sink::Table,
            "json" => Sink::Json,
            path => {
                let (path, staged) = writable(Path::new(path))?;
                Sink::File(path, staged)
            }
        };
        // A failed capture drops the staged file, which removes it.
        let c = self.capture()?;
        match sink {
            Sink::Json => println!("{}", serde_json::to_string_pretty(&c)?),
            Sink::Table => report::print_human(&summary(&c)),
            Sink::File(path, staged) => {
                write(&c, &path, staged)?;
                let done = format!("{}written to {}\n", summary(&c), path.display());
                report::print_human(&done);
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    fn capture(&self) -> Result<Capture, Box<dyn std::error::Error>> {
        let redact = match (&self.redact_key, self.redact) {
            (Some(k), _) if k.is_empty() => return Err("--redact-key is empty".into()),
            (Some(k), _) => Some(k.as_bytes().to_vec()),
            (None, true) => Some(capture::redact::random_key()?),
            (None, false) => None,
        };
        if let Some(file) = &self.from_script {
            let opts = capture::script::Options {
                node_name: self.node_name.clone(),
                redact,
            };
            return Ok(capture::script::convert(file, &opts)?);
        }
        let opts = Options {
            netns: self.netns.as_deref().map(capture::netns_path),
            node_name: self.node_name.clone(),
            cri_sockets: self.cri_socket.clone(),
            redact,
            cni_cache: self.cni_cache.clone(),
            cni_conf_dir: self.cni_conf_dir.clone(),
        };
        // Refused before anything else is read.
        if !nix::unistd::geteuid().is_root() {
            return Err("cnilab capture enters every network namespace and needs root (CAP_SYS_ADMIN): run it as root, for example with sudo".into());
        }
        capture::open_node(opts.netns.as_deref())?;
        Ok(capture::capture(&opts)?)
    }
}

/// `-o FILE`: its directory must exist and take a file; the partial file
/// made there now (`util::Staged`: no symlink or planted file is followed)
/// is renamed over FILE at the end.
fn writable(path: &Path) -> Result<(PathBuf, crate::util::Staged), String> {
    let fix = "give -o a file in a directory you can write (or -o json for stdout)";
    if path.is_dir() {
        return Err(format!("-o {}: is a directory; {fix}", path.display()));
    }
    if path.file_name().is_none() {
        return Err(format!("-o {}: not a file name; {fix}", path.display()));
    }
    let staged = crate::util::Staged::new(path)
        .map_err(|e| format!("-o {}: cannot write there ({e}); {fix}", path.display()))?;
    Ok((path.to_path_buf(), staged))
}

fn write(
    c: &Capture,
    path: &Path,
    staged: crate::util::Staged,
) -> Result<(), Box<dyn std::error::Error>> {
    let done = serde_json::to_vec_pretty(c)
        .map_err(|e| e.to_string())
        .and_then(|text| staged.commit(&text).map_err(|e| e.to_string()));
    done.map_err(|e| format!("-o {}: {e}", path.display()).into())
}

/// A few lines: the node, what it holds, its pods, the warnings.
fn summary(c: &Capture) -> String {
    let n = &c.node.net;
    let mut out = format!(
        "📸 node {} (kernel {}, {}): {} links, {} routes, {} rules, {} neighbours, {} FDB entries, {} nftables tables{}\n",
        n.name,
        c.provenance.kernel,
        c.provenance.time,
        n.links.len(),
        n.routes.len(),
        n.rules.len(),
        n.neighbours.len(),
        n.fdb.len(),
        n.nftables.len(),
        if n.iptables.is_empty() { "" } else { ", iptables-save text" }
    );
    let pods: Vec<&str> = c
        .pods
        .iter()
        .filter(|p| p.skipped.is_none())
        .map(|p| p.name.as_str())
        .collect();
    out.push_str(&format!("   {} pods", pods.len()));
    if !pods.is_empty() {
        let more = if pods.len() > 8 { ", …" } else { "" };
        let first: Vec<&str> = pods.iter().take(8).copied().collect();
        out.push_str(&format!(": {}{more}", first.join(", ")));
    }
    out.push('\n');
    for p in c.pods.iter().filter(|p| p.skipped.is_some()) {
        let why = p.skipped.as_deref().unwrap_or_default();
        out.push_str(&format!(
            "   linked like a pod, not probed: {}: {why}\n",
            p.name
        ));
    }
    if !c.peers.is_empty() {
        let peers: Vec<&str> = c.peers.iter().map(|p| p.name.as_str()).collect();
        out.push_str(&format!("   linked, not pods: {}\n", peers.join(", ")));
    }
    for w in &c.warnings {
        out.push_str(&format!("⚠️  {w}\n"));
    }
    out
}
