//! `cnilab-bridge`: reads the CNI environment and stdin, runs one command,
//! prints the result or the JSON error on stdout.

use std::io::{Read, Write};

fn main() {
    let mut stdin = Vec::new();
    // Read one byte past the limit so an oversized config is detected, not truncated.
    let limit = (cnilab_plugin::commands::MAX_STDIN + 1) as u64;
    let _ = std::io::stdin().take(limit).read_to_end(&mut stdin);
    let outcome = cnilab_plugin::commands::run_with_os_vars(std::env::vars_os().collect(), &stdin);
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(outcome.stdout.as_bytes());
    let _ = out.flush();
    eprintln!(
        "cnilab-bridge: {}",
        cnilab_plugin::commands::escape_log(&outcome.log)
    );
    std::process::exit(outcome.exit_code);
}
