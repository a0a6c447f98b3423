//! The files `cnilab` ships inside itself, so that it works outside the
//! repository: scenarios, topologies, config templates, manifests, kind
//! configs, the hostile-input corpus and the example configs, embedded at
//! build time from the repository (`build.rs`; the repository files stay the
//! source, so the built-in copies cannot drift).
//!
//! One rule everywhere: a path that exists on disk is read from disk (a
//! user's file or directory always overrides); a relative path that does
//! not exist and names a repository asset (`lab/scenarios/missing-route.toml`,
//! `tests/corpus`, `lab/topologies/../configs/x.tmpl`) reads the built-in
//! copy. So every example in `--help`, the README and the book (`docs/`) works
//! from any directory.

use std::io;
use std::path::{Component, Path, PathBuf};

/// Every embedded file: (path relative to the repository root, bytes).
static FILES: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/assets.rs"));

/// The built-in scenarios' directory (`cnilab scenario list` without `--dir`).
pub const SCENARIOS: &str = "lab/scenarios";
/// The built-in hostile-input corpus (`conform` without `--corpus`).
pub const CORPUS: &str = "tests/corpus";
/// cnilab's own manifests (`e2e` without `--manifests`).
pub const MANIFESTS: &str = "lab/manifests";

/// `path` as an embedded key: relative, `.` dropped, `..` applied.
fn key(path: &Path) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.join("/"))
}

/// The built-in copy of `path`, if it names an embedded file.
pub fn builtin(path: &Path) -> Option<&'static [u8]> {
    let k = key(path)?;
    FILES.iter().find(|(p, _)| *p == k).map(|(_, b)| *b)
}

/// Whether `path` is read from the built-in copy (it is not on disk).
pub fn is_builtin(path: &Path) -> bool {
    !path.exists() && (builtin(path).is_some() || !builtin_dir(path).is_empty())
}

/// The embedded files directly in `dir` (empty when none).
fn builtin_dir(dir: &Path) -> Vec<PathBuf> {
    let Some(k) = key(dir) else {
        return Vec::new();
    };
    FILES
        .iter()
        .filter_map(|(p, _)| {
            let (parent, name) = p.rsplit_once('/')?;
            (parent == k).then(|| dir.join(name))
        })
        .collect()
}

/// Reads `path` from disk, or its built-in copy when it is not on disk.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    match std::fs::read(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => match builtin(path) {
            Some(bytes) => Ok(bytes.to_vec()),
            None => Err(e),
        },
        other => other,
    }
}

/// [`read`] as UTF-8.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The files directly in `dir`, sorted: from disk when `dir` exists there,
/// else the built-in ones (paths stay under `dir` as given).
pub fn list(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| !p.is_dir())
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let files = builtin_dir(dir);
            if files.is_empty() {
                return Err(e);
            }
            files
        }
        Err(e) => return Err(e),
    };
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_repository_asset_is_embedded_byte_for_byte() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for dir in [
            SCENARIOS,
            CORPUS,
            MANIFESTS,
            "lab/topologies",
            "lab/configs",
            "lab/kind",
        ] {
            for entry in std::fs::read_dir(root.join(dir)).expect("asset dir") {
                let path = entry.expect("entry").path();
                if path.is_file() {
                    let rel = path.strip_prefix(&root).expect("under root");
                    assert_eq!(
                        builtin(rel),
                        Some(std::fs::read(&path).expect("read").as_slice()),
                        "{}",
                        rel.display()
                    );
                }
            }
        }
    }

    #[test]
    fn relative_paths_are_normalised_and_absolute_ones_never_builtin() {
        assert!(builtin(Path::new("lab/topologies/../configs/lab-ptp.conflist.tmpl")).is_some());
        assert!(builtin(Path::new("./lab/scenarios/missing-route.toml")).is_some());
        assert!(builtin(Path::new("/lab/scenarios/missing-route.toml")).is_none());
        assert!(builtin(Path::new("../lab/scenarios/missing-route.toml")).is_none());
        assert!(builtin(Path::new("lab/scenarios/nope.toml")).is_none());
    }

    #[test]
    fn a_missing_directory_lists_the_builtin_files_and_an_unknown_one_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        // An absolute path that does not exist is never built in.
        assert!(list(&dir.path().join("lab/scenarios")).is_err());
        let files = list(Path::new(SCENARIOS)).expect("built-in scenarios");
        assert!(files
            .iter()
            .any(|f| f == Path::new("lab/scenarios/missing-route.toml")));
        assert!(list(Path::new("lab/no-such-dir")).is_err());
    }
}
