//! `cnilab completions`.

use super::{Cli, CliResult};
use clap::CommandFactory;

/// The shells `cnilab completions` writes scripts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Print a shell completion script.
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab completions bash > /etc/bash_completion.d/cnilab\n  \
    cnilab completions zsh > \"${fpath[1]}/_cnilab\"\n\n",
    crate::exit_codes_help!()))]
pub struct Completions {
    /// The shell: bash, zsh or fish.
    #[arg(value_enum)]
    pub shell: Shell,
}

impl Completions {
    pub fn run(self) -> CliResult {
        let shell = match self.shell {
            Shell::Bash => clap_complete::Shell::Bash,
            Shell::Zsh => clap_complete::Shell::Zsh,
            Shell::Fish => clap_complete::Shell::Fish,
        };
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "cnilab", &mut script);
        print!(
            "{}",
            lab_names(self.shell, &String::from_utf8_lossy(&script))
        );
        Ok(crate::report::verdict(true))
    }
}

/// The lab subcommands whose `--name` is a standing lab's: every `lab`
/// subcommand with a `--name` (read from the command line's own definition,
/// so a new one such as `lab show` is never left completing file names).
fn lab_cmds() -> Vec<String> {
    Cli::command()
        .find_subcommand("lab")
        .map(|lab| {
            lab.get_subcommands()
                .filter(|c| c.get_arguments().any(|a| a.get_long() == Some("name")))
                .map(|c| c.get_name().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// `script` with `lab … --name` completing the names of standing labs (the
/// directories of `/run/cnilab/labs`) instead of file names.
fn lab_names(shell: Shell, script: &str) -> String {
    let labs = crate::lab::state::LABS_DIR;
    let lab_cmds = lab_cmds();
    let mut out = String::with_capacity(script.len());
    let mut in_lab = false;
    let mut prev = "";
    for raw in script.lines() {
        let mut line = raw.to_string();
        match shell {
            Shell::Bash => {
                if let Some(section) = line.trim().strip_suffix(')') {
                    if section.starts_with("cnilab__subcmd__") && !section.contains(' ') {
                        in_lab = lab_cmds
                            .iter()
                            .any(|c| section == format!("cnilab__subcmd__lab__subcmd__{c}"));
                    }
                }
                if in_lab && prev.trim() == "--name)" && line.contains("compgen -f") {
                    line = line.replace(
                        "compgen -f \"${cur}\"",
                        &format!("compgen -W \"$(ls {labs} 2>/dev/null)\" -- \"${{cur}}\""),
                    );
                }
            }
            Shell::Zsh => {
                if line.contains("'--name=[Lab name]") || line.contains("'--name=[Only this lab") {
                    line = line.replace(
                        ":NAME:_default'",
                        &format!(":NAME:_path_files -W {labs} -/'"),
                    );
                }
            }
            Shell::Fish => {
                let lab_cmd = lab_cmds
                    .iter()
                    .any(|c| line.contains(&format!("__fish_seen_subcommand_from {c}\"")));
                if line.contains("__fish_cnilab_using_subcommand lab;")
                    && lab_cmd
                    && line.contains(" -l name ")
                {
                    line.push_str(&format!(" -f -a \"(ls {labs} 2>/dev/null)\""));
                }
            }
        }
        out.push_str(&line);
        out.push('\n');
        prev = raw;
    }
    out
}
