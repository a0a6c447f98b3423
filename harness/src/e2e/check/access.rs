//! Which cluster the check talks to, found the way kubectl finds it
//! (client-go's ClientConfigLoadingRules):
//! - `--kubeconfig FILE`: that file only (it must exist);
//! - else `$KUBECONFIG`: every file of the list (`:`-separated), merged, the
//!   first file to set a value or a map key wins; files that do not exist
//!   are skipped, as kubectl skips them;
//! - else `~/.kube/config`.
//!
//! `--context NAME` picks the context; else the merged `current-context`.

use super::super::E2eError;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// What the command line says about cluster access.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
}

/// The merged kubeconfig, the files it came from and the context chosen.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub files: Vec<PathBuf>,
    pub config: Kubeconfig,
    pub context: String,
}

impl Resolved {
    /// `context kind-x (from a.yaml:b.yaml)`, for messages.
    pub fn describe(&self) -> String {
        let files: Vec<String> = self.files.iter().map(|f| f.display().to_string()).collect();
        format!("context {} (from {})", self.context, files.join(":"))
    }
}

/// The files kubectl would read, in order: the explicit one, else the
/// existing files of `kubeconfig_env`, else `<home>/.kube/config`.
pub fn files(
    explicit: Option<&Path>,
    kubeconfig_env: Option<&OsStr>,
    home: Option<&Path>,
) -> Result<Vec<PathBuf>, E2eError> {
    if let Some(file) = explicit {
        if !file.is_file() {
            return Err(E2eError::Invalid(format!(
                "--kubeconfig {}: no such file",
                file.display()
            )));
        }
        return Ok(vec![file.to_path_buf()]);
    }
    let listed: Vec<PathBuf> = kubeconfig_env
        .map(|v| {
            std::env::split_paths(v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    if !listed.is_empty() {
        let existing: Vec<PathBuf> = listed.iter().filter(|p| p.is_file()).cloned().collect();
        if existing.is_empty() {
            let names: Vec<String> = listed.iter().map(|p| p.display().to_string()).collect();
            return Err(E2eError::Invalid(format!(
                "$KUBECONFIG lists {}, and none of them exists; pass --kubeconfig FILE",
                names.join(":")
            )));
        }
        return Ok(existing);
    }
    let default = home
        .map(|h| h.join(".kube").join("config"))
        .ok_or_else(|| {
            E2eError::Invalid(
                "no --kubeconfig, no $KUBECONFIG and no home directory: pass --kubeconfig FILE"
                    .into(),
            )
        })?;
    if !default.is_file() {
        return Err(E2eError::Invalid(format!(
            "no --kubeconfig, no $KUBECONFIG, and {} does not exist: pass --kubeconfig FILE",
            default.display()
        )));
    }
    Ok(vec![default])
}

/// Reads and merges `files` and picks the context.
pub fn load(files: Vec<PathBuf>, context: Option<&str>) -> Result<Resolved, E2eError> {
    let mut merged = Kubeconfig::default();
    for f in &files {
        let one = Kubeconfig::read_from(f).map_err(|e| {
            E2eError::Kube(format!("cannot read the kubeconfig {}: {e}", f.display()))
        })?;
        merged = merged.merge(one).map_err(|e| {
            E2eError::Kube(format!("cannot merge the kubeconfig {}: {e}", f.display()))
        })?;
    }
    let known: Vec<&str> = merged.contexts.iter().map(|c| c.name.as_str()).collect();
    let listing = || {
        if known.is_empty() {
            "it has no contexts".to_string()
        } else {
            format!("its contexts: {}", known.join(", "))
        }
    };
    let from = || {
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    };
    let context = match context.or(merged.current_context.as_deref()) {
        Some(name) if known.contains(&name) => name.to_string(),
        Some(name) => {
            return Err(E2eError::Invalid(format!(
                "context {name:?} is not in {} ({})",
                from(),
                listing()
            )))
        }
        None => {
            return Err(E2eError::Invalid(format!(
                "{} sets no current-context: pass --context ({})",
                from(),
                listing()
            )))
        }
    };
    Ok(Resolved {
        files,
        config: merged,
        context,
    })
}

/// Resolves `access` against this process's environment.
pub fn resolve(access: &Access) -> Result<Resolved, E2eError> {
    let env = std::env::var_os("KUBECONFIG");
    let home = std::env::home_dir();
    load(
        files(
            access.kubeconfig.as_deref(),
            env.as_deref(),
            home.as_deref(),
        )?,
        access.context.as_deref(),
    )
}

/// A client for the resolved context.
pub async fn client(resolved: Resolved) -> Result<kube::Client, E2eError> {
    let what = resolved.describe();
    let options = KubeConfigOptions {
        context: Some(resolved.context.clone()),
        ..KubeConfigOptions::default()
    };
    let config = kube::Config::from_custom_kubeconfig(resolved.config, &options)
        .await
        .map_err(|e| E2eError::Kube(format!("{what}: {e}")))?;
    kube::Client::try_from(config)
        .map_err(|e| E2eError::Kube(format!("cannot build a client: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(current: Option<&str>, clusters: &[(&str, &str)]) -> String {
        let mut s = String::from("apiVersion: v1\nkind: Config\n");
        if let Some(c) = current {
            s.push_str(&format!("current-context: {c}\n"));
        }
        s.push_str("clusters:\n");
        for (name, server) in clusters {
            s.push_str(&format!(
                "- name: {name}\n  cluster:\n    server: {server}\n"
            ));
        }
        s.push_str("contexts:\n");
        for (name, _) in clusters {
            s.push_str(&format!(
                "- name: {name}\n  context:\n    cluster: {name}\n    user: u\n"
            ));
        }
        s.push_str("users:\n- name: u\n  user:\n    token: t\n");
        s
    }

    fn server_of(r: &Resolved) -> Option<String> {
        let ctx = r.config.contexts.iter().find(|c| c.name == r.context)?;
        let cluster = &ctx.context.as_ref()?.cluster;
        r.config
            .clusters
            .iter()
            .find(|c| &c.name == cluster)?
            .cluster
            .as_ref()?
            .server
            .clone()
    }

    struct Dir(tempfile::TempDir);

    impl Dir {
        fn new() -> Dir {
            Dir(tempfile::tempdir().expect("temp dir"))
        }
        fn write(&self, name: &str, text: &str) -> PathBuf {
            let p = self.0.path().join(name);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).expect("mkdir");
            }
            std::fs::write(&p, text).expect("write");
            p
        }
        fn path(&self) -> &Path {
            self.0.path()
        }
    }

    #[test]
    fn kubeconfig_list_merges_first_wins_and_skips_missing() {
        let d = Dir::new();
        let a = d.write(
            "a.yaml",
            &kubeconfig(Some("one"), &[("one", "https://a:1")]),
        );
        let b = d.write(
            "b.yaml",
            &kubeconfig(
                Some("two"),
                &[("one", "https://b:1"), ("two", "https://b:2")],
            ),
        );
        let missing = d.path().join("missing.yaml");
        let list = std::env::join_paths([&missing, &a, &b]).expect("join");
        let found = files(None, Some(&list), Some(d.path())).expect("files");
        assert_eq!(found, [a.clone(), b.clone()], "missing files are skipped");
        let r = load(found.clone(), None).expect("loads");
        assert_eq!(r.context, "one", "the first current-context wins");
        assert_eq!(
            server_of(&r).as_deref(),
            Some("https://a:1"),
            "first map key wins"
        );
        let r = load(found, Some("two")).expect("loads");
        assert_eq!(server_of(&r).as_deref(), Some("https://b:2"));
        assert!(
            r.describe().contains("context two (from "),
            "{}",
            r.describe()
        );
    }

    #[test]
    fn explicit_file_beats_the_environment_and_home() {
        let d = Dir::new();
        let home_config = d.write(
            "home/.kube/config",
            &kubeconfig(Some("h"), &[("h", "https://h")]),
        );
        let env_file = d.write("env.yaml", &kubeconfig(Some("e"), &[("e", "https://e")]));
        let own = d.write("own.yaml", &kubeconfig(Some("o"), &[("o", "https://o")]));
        let home = d.path().join("home");
        let env = env_file.as_os_str();
        assert_eq!(
            files(Some(&own), Some(env), Some(&home)).ok(),
            Some(vec![own.clone()])
        );
        assert_eq!(
            files(None, Some(env), Some(&home)).ok(),
            Some(vec![env_file.clone()])
        );
        // Unset or empty KUBECONFIG: ~/.kube/config.
        assert_eq!(
            files(None, None, Some(&home)).ok(),
            Some(vec![home_config.clone()])
        );
        assert_eq!(
            files(None, Some(OsStr::new("")), Some(&home)).ok(),
            Some(vec![home_config])
        );
    }

    #[test]
    fn clear_errors() {
        let d = Dir::new();
        let err =
            |r: Result<Vec<PathBuf>, E2eError>| r.err().map(|e| e.to_string()).unwrap_or_default();
        let e = err(files(Some(&d.path().join("nope")), None, None));
        assert!(
            e.contains("--kubeconfig") && e.contains("no such file"),
            "{e}"
        );
        let gone = d.path().join("gone");
        let e = err(files(None, Some(gone.as_os_str()), Some(d.path())));
        assert!(
            e.contains("$KUBECONFIG") && e.contains("none of them exists"),
            "{e}"
        );
        let e = err(files(None, None, Some(d.path())));
        assert!(
            e.contains(".kube/config") && e.contains("does not exist"),
            "{e}"
        );
        let no_current = d.write("n.yaml", &kubeconfig(None, &[("x", "https://x")]));
        let e = load(vec![no_current.clone()], None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("no current-context") && e.contains("x"), "{e}");
        let e = load(vec![no_current], Some("y"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("\"y\"") && e.contains("contexts: x"), "{e}");
        let broken = d.write("b.yaml", "clusters: [");
        let e = load(vec![broken], None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("cannot read the kubeconfig"), "{e}");
    }
}
