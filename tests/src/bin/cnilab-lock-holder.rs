//! Test helper for `tests/security.rs`, not a test: takes the IPAM store
//! lock of the directory given as the only argument with the plugin's own
//! code, prints `store-locked`, and sleeps until it is killed.

use cnilab_plugin::ipam::Store;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: cnilab-lock-holder STORE_DIR");
        return ExitCode::from(2);
    };
    let _store = match Store::open_locked(Path::new(&dir), Duration::from_secs(5)) {
        Ok(store) => store,
        Err(e) => {
            eprintln!(
                "cnilab-lock-holder: cannot lock {}: {e:?}",
                Path::new(&dir).display()
            );
            return ExitCode::FAILURE;
        }
    };
    println!("store-locked");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
