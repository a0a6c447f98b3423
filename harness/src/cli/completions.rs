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
        clap_complete::generate(shell, &mut Cli::command(), "cnilab", &mut std::io::stdout());
        Ok(crate::report::verdict(true))
    }
}
