//! Builds the lab's pause binary (`src/lab/cri/pause.c`, static) for the
//! sandbox image of `lab --runtime containerd`. A C compiler and a static
//! libc (Debian: gcc, libc6-dev — what linking Rust needs anyway) are used
//! when present; without them the file is empty and the containerd runtime
//! reports that as an environment error at run time.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "src/lab/cri/pause.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("pause");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = std::env::var("TARGET") == std::env::var("HOST")
        && Command::new(&cc)
            .args(["-static", "-Os", "-s", "-o"])
            .arg(&out)
            .arg(src)
            .status()
            .is_ok_and(|s| s.success());
    if !built {
        println!("cargo:warning=cannot build the static pause binary with {cc} (install gcc and libc6-dev): `lab --runtime containerd` will be unavailable");
        std::fs::write(&out, b"").expect("write OUT_DIR/pause");
    }
}
