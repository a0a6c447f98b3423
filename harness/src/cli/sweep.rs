//! `cnilab sweep`.

use super::args::OutputArgs;
use super::CliResult;
use crate::netns;
use crate::report::{self, Format};
use std::path::PathBuf;

/// Remove namespaces left behind by killed cnilab runs.
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab sweep\n  \
    cnilab sweep -o json\n\n",
    crate::exit_codes_help!()))]
pub struct Sweep {
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(serde::Serialize)]
struct Agent {
    pid: u32,
    pidfile: PathBuf,
}

/// A dead run's containerd (`lab --runtime containerd`), stopped.
#[derive(serde::Serialize)]
struct Containerd {
    dir: PathBuf,
    /// Sandboxes removed through its CRI.
    sandboxes: usize,
    /// containerd, its shims and their pause processes.
    killed: Vec<u32>,
}

#[derive(serde::Serialize)]
struct Swept {
    agents: Vec<Agent>,
    containerds: Vec<Containerd>,
    namespaces: Vec<String>,
    run_dirs: Vec<PathBuf>,
    scratch_dirs: Vec<PathBuf>,
    trace_instances: Vec<String>,
    trace_tables: Vec<String>,
}

impl Sweep {
    pub fn run(self) -> CliResult {
        netns::require_root()?;
        // A killed `e2e vagrant` run: its processes first, so that the
        // namespace sweep below can remove its namespace.
        let vagrant_runs = crate::e2e::vagrant::sweep();
        let swept =
            crate::sweep::sweep(std::path::Path::new(crate::sweep::RUN_ROOT), netns::PREFIX)?;
        let scratch = crate::util::sweep_scratch().map_err(|e| {
            format!(
                "cannot sweep scratch directories in {}: {e}",
                std::env::temp_dir().display()
            )
        })?;
        let out = Swept {
            agents: swept
                .agents
                .iter()
                .map(|(pid, pidfile)| Agent {
                    pid: *pid,
                    pidfile: pidfile.clone(),
                })
                .collect(),
            containerds: swept
                .containerds
                .iter()
                .map(|(dir, t)| Containerd {
                    dir: dir.clone(),
                    sandboxes: t.sandboxes,
                    killed: t.killed.clone(),
                })
                .collect(),
            namespaces: swept.namespaces,
            run_dirs: swept.dirs,
            scratch_dirs: scratch,
            trace_instances: swept.trace_instances,
            trace_tables: swept.trace_tables,
        };
        if self.output.output != Format::Table {
            println!("{}", report::json("SweepReport", &out));
            return Ok(report::verdict(true));
        }
        if out.agents.is_empty()
            && out.containerds.is_empty()
            && out.namespaces.is_empty()
            && out.run_dirs.is_empty()
            && out.scratch_dirs.is_empty()
            && out.trace_instances.is_empty()
            && out.trace_tables.is_empty()
        {
            println!(
                "nothing to sweep: no {}* namespace, run directory, agent or scratch directory of a dead process",
                netns::PREFIX
            );
        }
        for a in &out.agents {
            println!(
                "stopped agent {} (proved by {})",
                a.pid,
                a.pidfile.display()
            );
        }
        for c in &out.containerds {
            println!(
                "stopped containerd in {} ({} sandboxes removed through the CRI; killed {:?})",
                c.dir.display(),
                c.sandboxes,
                c.killed
            );
        }
        for name in &vagrant_runs {
            println!("stopped the processes of the dead e2e vagrant run {name}");
        }
        for name in &out.namespaces {
            println!("removed netns {name}");
        }
        for dir in &out.run_dirs {
            println!("removed run directory {}", dir.display());
        }
        for path in &out.scratch_dirs {
            println!("removed scratch directory {}", path.display());
        }
        for name in &out.trace_instances {
            println!("removed tracefs instance {name}");
        }
        for table in &out.trace_tables {
            println!("removed trace table {table}");
        }
        Ok(report::verdict(true))
    }
}
