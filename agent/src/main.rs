use clap::Parser;
use cnilab_agent::cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cnilab-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            None => cnilab_agent::run::run(cli.run).await,
            Some(Command::Run(args)) => cnilab_agent::run::run(*args).await,
            Some(Command::Uninstall(args)) => cnilab_agent::run::uninstall(args).await,
            Some(Command::InstallPlugin(args)) => cnilab_agent::run::install_plugin(args),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cnilab-agent: {e}");
            ExitCode::FAILURE
        }
    }
}
