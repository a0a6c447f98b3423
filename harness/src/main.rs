//! `cnilab`: parses the command line and runs the command. Everything about
//! the command line (flags, examples, output, exit codes) lives in
//! `cnilab_harness::cli`, one file per subcommand.

fn main() -> std::process::ExitCode {
    cnilab_harness::cli::main()
}
