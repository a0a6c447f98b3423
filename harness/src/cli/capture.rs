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
    cnilab capture --from-script node1.capture -o node1.json\n  \
    cnilab capture --kubeconfig --nodes kind-worker,kind-worker2 -o cluster.json\n  \
    cnilab lab run --capture cluster.json\n\n\
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
    /// Capture a whole cluster through its API server into one bundle: a
    /// privileged pod on each node runs the capture script (nothing is
    /// installed on the nodes). Without FILE: $KUBECONFIG, else
    /// ~/.kube/config, as kubectl finds it.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "",
          conflicts_with_all = ["script", "from_script", "netns", "cri_socket", "cni_cache", "cni_conf_dir", "node_name"])]
    pub kubeconfig: Option<String>,
    /// With --kubeconfig: the context (default: the current one).
    #[arg(long, value_name = "NAME", requires = "kubeconfig")]
    pub context: Option<String>,
    /// With --kubeconfig: only these nodes (comma-separated Kubernetes
    /// node names; default: every node).
    #[arg(
        long,
        value_name = "NODE,...",
        value_delimiter = ',',
        requires = "kubeconfig"
    )]
    pub nodes: Vec<String>,
    /// With --kubeconfig: the namespace of the capture pods (it must allow
    /// privileged pods).
    #[arg(long, value_name = "NS", default_value = "default")]
    pub namespace: String,
    /// With --kubeconfig: the capture pods' image (any with `sleep` and
    /// `chroot`; the script runs the node's own tools).
    #[arg(long, value_name = "IMAGE", default_value = crate::e2e::capture::DEFAULT_POD_IMAGE)]
    pub image: String,
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
        if self.kubeconfig.is_some() {
            return self.cluster(sink);
        }
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

    fn redact_key(&self) -> Result<Option<Vec<u8>>, Box<dyn std::error::Error>> {
        Ok(match (&self.redact_key, self.redact) {
            (Some(k), _) if k.is_empty() => return Err("--redact-key is empty".into()),
            (Some(k), _) => Some(k.as_bytes().to_vec()),
            (None, true) => Some(capture::redact::random_key()?),
            (None, false) => None,
        })
    }

    /// `--kubeconfig`: every chosen node through the API server, one
    /// bundle. Exit 2 when a node could not be captured (the bundle holds
    /// the others, and says why).
    fn cluster(&self, sink: Sink) -> CliResult {
        crate::e2e::check_namespace(&self.namespace)?;
        let access = crate::e2e::check::access::Access {
            kubeconfig: self
                .kubeconfig
                .as_deref()
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            context: self.context.clone(),
        };
        let opts = crate::e2e::collect::CollectOptions {
            nodes: self.nodes.clone(),
            namespace: self.namespace.clone(),
            image: self.image.clone(),
            start_timeout: std::time::Duration::from_secs(180),
            redact: self.redact_key()?,
            context: String::new(),
            server: String::new(),
        };
        let b = crate::e2e::collect::collect_blocking(&access, opts)?;
        let text = bundle_summary(&b);
        match sink {
            Sink::Json => println!("{}", serde_json::to_string_pretty(&b)?),
            Sink::Table => report::print_human(&text),
            Sink::File(path, staged) => {
                let done = serde_json::to_vec_pretty(&b)
                    .map_err(|e| e.to_string())
                    .and_then(|t| staged.commit(&t).map_err(|e| e.to_string()));
                done.map_err(|e| format!("-o {}: {e}", path.display()))?;
                report::print_human(&format!("{text}written to {}\n", path.display()));
            }
        }
        let failed = b.nodes.iter().filter(|n| n.capture.is_none()).count();
        if failed > 0 {
            eprintln!(
                "cnilab capture: {failed} of {} nodes could not be captured (see above)",
                b.nodes.len()
            );
            return Ok(ExitCode::from(2));
        }
        Ok(ExitCode::SUCCESS)
    }

    fn capture(&self) -> Result<Capture, Box<dyn std::error::Error>> {
        let redact = self.redact_key()?;
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

/// Each node's summary (or why it was not captured), then the API's facts.
fn bundle_summary(b: &capture::bundle::Bundle) -> String {
    let mut out = format!(
        "☸️  cluster {} ({}): {} nodes, {} pods, {} Services, {} EndpointSlices in the API\n",
        b.cluster.context,
        b.cluster.server,
        b.nodes.len(),
        b.pods.len(),
        b.services.len(),
        b.endpoint_slices.len()
    );
    for n in &b.nodes {
        match (&n.capture, &n.error) {
            (Some(c), _) => out.push_str(&summary(c)),
            (None, e) => out.push_str(&format!(
                "❌ node {}: not captured: {}\n",
                n.name,
                e.as_deref().unwrap_or("no capture")
            )),
        }
    }
    for w in &b.warnings {
        out.push_str(&format!("⚠️  {w}\n"));
    }
    out
}
