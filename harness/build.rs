//! Builds the lab's pause binary (`src/cri/pause.c`, static) for the
//! sandbox image of `lab --runtime containerd`. A C compiler and a static
//! libc (Debian: gcc, libc6-dev — what linking Rust needs anyway) are used
//! when present; without them the file is empty and the containerd runtime
//! reports that as an environment error at run time.
//!
//! Also embeds the repository's assets (scenarios, topologies, config
//! templates, manifests, kind configs, the hostile-input corpus, the
//! example configs): `OUT_DIR/assets.rs` lists every file of
//! [`ASSET_DIRS`] with its bytes (`include_bytes!` of the repository file,
//! so the built-in copy cannot drift from it); `src/assets.rs` serves them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Directories (relative to the repository root) whose files ship inside
/// the binary.
const ASSET_DIRS: &[&str] = &[
    "lab/scenarios",
    "lab/topologies",
    "lab/configs",
    "lab/manifests",
    "lab/kind",
    "tests/corpus",
    "harness/examples",
];

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            files_under(&path, out);
        } else if path.is_file() {
            out.push(path);
        }
    }
}

fn embed_assets(out_dir: &Path) {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest
        .parent()
        .expect("the harness is one level below the root");
    let mut code = String::from("&[\n");
    for dir in ASSET_DIRS {
        let abs = root.join(dir);
        println!("cargo:rerun-if-changed={}", abs.display());
        let mut files = Vec::new();
        files_under(&abs, &mut files);
        files.sort();
        for file in files {
            let rel = file.strip_prefix(root).expect("under the root");
            let rel = rel.to_str().expect("asset paths are UTF-8");
            let abs = file.to_str().expect("asset paths are UTF-8");
            code.push_str(&format!("    ({rel:?}, include_bytes!({abs:?})),\n"));
        }
    }
    code.push_str("]\n");
    std::fs::write(out_dir.join("assets.rs"), code).expect("write OUT_DIR/assets.rs");
}

fn main() {
    embed_assets(&PathBuf::from(
        std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"),
    ));
    let src = "src/cri/pause.c";
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
