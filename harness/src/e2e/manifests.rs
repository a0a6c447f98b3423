//! The manifests a run deploys: cnilab's own (`--manifests DIR`, default
//! lab/manifests) or any CNI's (`--cni-manifest FILE…`: flannel, calico,
//! your own), rendered for the cluster, and the workloads in them that
//! `wait` waits for and `dump` describes.

use super::options::{E2eOptions, IMAGE_PLACEHOLDER};
use super::E2eError;
use std::path::Path;

/// A manifest file as read from disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub file_name: String,
    pub text: String,
}

/// Where the manifests came from: cnilab's own must use the image
/// placeholder and set CNILAB_CLUSTER_CIDR; any other CNI's need not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Cnilab,
    AnyCni,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadKind {
    DaemonSet,
    Deployment,
}

impl WorkloadKind {
    /// As kubectl writes the resource (`daemonset/x`).
    pub fn resource(self) -> &'static str {
        match self {
            WorkloadKind::DaemonSet => "daemonset",
            WorkloadKind::Deployment => "deployment",
        }
    }
}

/// A DaemonSet or Deployment the manifests deploy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    /// `key=value,...` from spec.selector.matchLabels.
    pub selector: String,
    /// Whether a container runs the image under test (loaded, not pulled).
    pub runs_image: bool,
}

impl Workload {
    /// The cnilab agent, for `dump` when the manifests cannot be read.
    pub fn cnilab_agent() -> Workload {
        Workload {
            kind: WorkloadKind::DaemonSet,
            namespace: "kube-system".into(),
            name: "cnilab-agent".into(),
            selector: "app.kubernetes.io/name=cnilab-agent".into(),
            runs_image: true,
        }
    }

    /// `daemonset kube-system/cnilab-agent`.
    pub fn describe(&self) -> String {
        format!("{} {}/{}", self.kind.resource(), self.namespace, self.name)
    }
}

/// The rendered manifests and their workloads, in manifest order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rendered {
    pub files: Vec<Manifest>,
    pub workloads: Vec<Workload>,
}

impl Rendered {
    /// Every document of every file, as one multi-document YAML stream
    /// (what `minikube start --cni=FILE` takes: one file).
    pub fn combined(&self) -> String {
        let mut out = String::new();
        for f in &self.files {
            out.push_str(&format!("---\n# {}\n", f.file_name));
            out.push_str(f.text.trim_start_matches("---\n"));
            if !f.text.ends_with('\n') {
                out.push('\n');
            }
        }
        out
    }

    /// Whether any workload runs the image under test.
    pub fn runs_image(&self) -> bool {
        self.workloads.iter().any(|w| w.runs_image)
    }
}

/// The manifests of a run: the `--cni-manifest` files in the order given,
/// else `*.yaml` of `--manifests` sorted (without kustomization.yaml).
pub fn read(opts: &E2eOptions) -> Result<(Vec<Manifest>, Origin), E2eError> {
    if opts.cni_manifests.is_empty() {
        return Ok((read_dir(&opts.manifests)?, Origin::Cnilab));
    }
    let mut files: Vec<Manifest> = Vec::new();
    for path in &opts.cni_manifests {
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| {
                E2eError::Invalid(format!("--cni-manifest {}: not a file", path.display()))
            })?;
        if files.iter().any(|f| f.file_name == file_name) {
            return Err(E2eError::Invalid(format!(
                "--cni-manifest: two files are named {file_name} (they are written side by side under the work dir; rename one)"
            )));
        }
        let text = read_file(path)?;
        files.push(Manifest { file_name, text });
    }
    Ok((files, Origin::AnyCni))
}

fn read_file(path: &Path) -> Result<String, E2eError> {
    crate::assets::read_to_string(path).map_err(|e| E2eError::Io {
        what: format!("cannot read the manifest {}", path.display()),
        source: e,
    })
}

/// Reads `*.yaml` in `dir`, sorted, except kustomization.yaml.
pub fn read_dir(dir: &Path) -> Result<Vec<Manifest>, E2eError> {
    let entries = crate::assets::list(dir).map_err(|e| E2eError::Io {
        what: format!(
            "cannot read the manifests directory {} (--manifests DIR; without it cnilab's built-in manifests are used)",
            dir.display()
        ),
        source: e,
    })?;
    let mut files = Vec::new();
    for path in entries {
        let Some(file_name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        if !file_name.ends_with(".yaml") || file_name == "kustomization.yaml" {
            continue;
        }
        let text = read_file(&path)?;
        files.push(Manifest { file_name, text });
    }
    files.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    if files.is_empty() {
        return Err(E2eError::Invalid(format!(
            "no *.yaml manifests in {}",
            dir.display()
        )));
    }
    Ok(files)
}

/// Points every use of the placeholder image at `image`, sets a
/// CNILAB_CLUSTER_CIDR env var to the cluster's pod subnet, and finds the
/// workloads. Line-based so that comments and layout survive. cnilab's own
/// manifests must use both; another CNI's are taken as they are.
pub fn render(
    files: &[Manifest],
    origin: Origin,
    image: &str,
    cluster_cidr: &str,
) -> Result<Rendered, E2eError> {
    let mut out = Vec::new();
    let mut placeholder_seen = false;
    let mut cidr_seen = false;
    for f in files {
        placeholder_seen |= f.text.contains(IMAGE_PLACEHOLDER);
        let replaced = f.text.replace(IMAGE_PLACEHOLDER, image);
        let mut lines: Vec<String> = replaced.lines().map(str::to_string).collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i].trim_start().trim_start_matches("- ").trim() == "name: CNILAB_CLUSTER_CIDR"
            {
                let next = lines
                    .iter()
                    .enumerate()
                    .skip(i + 1)
                    .find(|(_, l)| !l.trim().is_empty());
                match next {
                    Some((j, l)) if l.trim_start().starts_with("value:") => {
                        let indent = &l[..l.len() - l.trim_start().len()];
                        lines[j] = format!("{indent}value: \"{cluster_cidr}\"");
                        cidr_seen = true;
                        i = j;
                    }
                    _ => {
                        return Err(E2eError::Invalid(format!(
                            "{}: CNILAB_CLUSTER_CIDR has no literal `value:` on the next line",
                            f.file_name
                        )))
                    }
                }
            }
            i += 1;
        }
        let mut text = lines.join("\n");
        if replaced.ends_with('\n') {
            text.push('\n');
        }
        out.push(Manifest {
            file_name: f.file_name.clone(),
            text,
        });
    }
    if origin == Origin::Cnilab {
        if !placeholder_seen {
            return Err(E2eError::Invalid(format!(
                "no manifest uses the image placeholder {IMAGE_PLACEHOLDER}: the image under test would never run"
            )));
        }
        if !cidr_seen {
            return Err(E2eError::Invalid(
                "no manifest sets CNILAB_CLUSTER_CIDR: the agent would masquerade pod-to-pod traffic"
                    .into(),
            ));
        }
    }
    let mut workloads = Vec::new();
    for f in &out {
        for doc in serde_norway::Deserializer::from_str(&f.text) {
            let value: serde_json::Value = serde::Deserialize::deserialize(doc)
                .map_err(|e| E2eError::Invalid(format!("{}: not valid YAML: {e}", f.file_name)))?;
            collect(&f.file_name, &value, image, &mut workloads)?;
        }
    }
    if workloads.is_empty() {
        return Err(E2eError::Invalid(
            "no DaemonSet or Deployment in the manifests: nothing would run the CNI, and `wait` would have nothing to wait for".into(),
        ));
    }
    Ok(Rendered {
        files: out,
        workloads,
    })
}

/// Adds the workloads of one document (a `kind: List` counts its items).
fn collect(
    file: &str,
    doc: &serde_json::Value,
    image: &str,
    out: &mut Vec<Workload>,
) -> Result<(), E2eError> {
    let kind = match doc["kind"].as_str() {
        Some("List") => {
            for item in doc["items"].as_array().into_iter().flatten() {
                collect(file, item, image, out)?;
            }
            return Ok(());
        }
        Some("DaemonSet") => WorkloadKind::DaemonSet,
        Some("Deployment") => WorkloadKind::Deployment,
        _ => return Ok(()),
    };
    let runs_image = check_pull_policy(file, doc, image)?;
    let name = doc["metadata"]["name"].as_str();
    let labels = doc["spec"]["selector"]["matchLabels"].as_object();
    match (name, labels) {
        (Some(name), Some(labels)) if !labels.is_empty() => {
            out.push(Workload {
                kind,
                // Applied with cnilab's own kubeconfig, whose context has
                // no namespace: kubectl puts unnamespaced objects in `default`.
                namespace: doc["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_string(),
                name: name.to_string(),
                selector: labels
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(","),
                runs_image,
            });
            Ok(())
        }
        _ => Err(E2eError::Invalid(format!(
            "{file}: the {} needs metadata.name and spec.selector.matchLabels",
            kind.resource()
        ))),
    }
}

/// Whether a container runs `image`; an error when it would pull it
/// (a loaded image cannot be pulled).
fn check_pull_policy(file: &str, doc: &serde_json::Value, image: &str) -> Result<bool, E2eError> {
    let spec = &doc["spec"]["template"]["spec"];
    let mut runs = false;
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            if c["image"] != image {
                continue;
            }
            runs = true;
            if c["imagePullPolicy"] == "Always" {
                return Err(E2eError::Invalid(format!(
                    "{file}: container {} pulls {image} with imagePullPolicy: Always, but a loaded image cannot be pulled (use IfNotPresent)",
                    c["name"].as_str().unwrap_or("?")
                )));
            }
        }
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(text: &str) -> Vec<Manifest> {
        vec![Manifest {
            file_name: "a.yaml".into(),
            text: text.into(),
        }]
    }

    const DS: &str = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: agent\n  namespace: net\nspec:\n  selector:\n    matchLabels:\n      app: agent\n  template:\n    spec:\n      containers:\n        - name: agent\n          image: ghcr.io/cnilab/cnilab:dev\n          imagePullPolicy: IfNotPresent\n          env:\n            - name: CNILAB_CLUSTER_CIDR\n              value: \"10.0.0.0/8\"\n";

    #[test]
    fn renders_image_cidr_and_finds_the_daemonset() {
        let r = render(
            &manifest(DS),
            Origin::Cnilab,
            "localhost/x:1",
            "10.244.0.0/16,fd00:10:244::/56",
        );
        let r = match r {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        assert!(r.files[0].text.contains("image: localhost/x:1"));
        assert!(r.files[0]
            .text
            .contains("              value: \"10.244.0.0/16,fd00:10:244::/56\"\n"));
        assert_eq!(
            r.workloads,
            [Workload {
                kind: WorkloadKind::DaemonSet,
                namespace: "net".into(),
                name: "agent".into(),
                selector: "app=agent".into(),
                runs_image: true,
            }]
        );
    }

    #[test]
    fn refuses_what_cannot_work_in_a_kind_cluster() {
        let always = DS.replace("IfNotPresent", "Always");
        let err = render(
            &manifest(&always),
            Origin::Cnilab,
            "localhost/x:1",
            "10.244.0.0/16",
        );
        assert!(matches!(err, Err(E2eError::Invalid(m)) if m.contains("imagePullPolicy: Always")));
        let no_placeholder = DS.replace("ghcr.io/cnilab/cnilab:dev", "busybox");
        let err = render(
            &manifest(&no_placeholder),
            Origin::Cnilab,
            "localhost/x:1",
            "10.244.0.0/16",
        );
        assert!(matches!(err, Err(E2eError::Invalid(m)) if m.contains("placeholder")));
        let no_cidr = DS.replace("CNILAB_CLUSTER_CIDR", "OTHER");
        let err = render(
            &manifest(&no_cidr),
            Origin::Cnilab,
            "localhost/x:1",
            "10.244.0.0/16",
        );
        assert!(matches!(err, Err(E2eError::Invalid(m)) if m.contains("CNILAB_CLUSTER_CIDR")));
        let nothing = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";
        let err = render(
            &manifest(nothing),
            Origin::AnyCni,
            "localhost/x:1",
            "10.244.0.0/16",
        );
        assert!(
            matches!(err, Err(E2eError::Invalid(m)) if m.contains("no DaemonSet or Deployment"))
        );
    }

    /// A flannel-like manifest: another namespace, a DaemonSet, no placeholder,
    /// plus a Deployment inside a `kind: List`, and an unnamespaced one.
    #[test]
    fn any_cni_workloads_in_order() {
        let flannel = "---\nkind: Namespace\napiVersion: v1\nmetadata:\n  name: kube-flannel\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: kube-flannel-ds\n  namespace: kube-flannel\n  labels:\n    app: flannel\nspec:\n  selector:\n    matchLabels:\n      app: flannel\n      k8s-app: flannel\n  template:\n    spec:\n      containers:\n      - name: kube-flannel\n        image: ghcr.io/flannel-io/flannel:v0.27.0\n";
        let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata:\n    name: operator\n  spec:\n    selector:\n      matchLabels:\n        name: operator\n    template:\n      spec:\n        containers:\n        - name: op\n          image: localhost/x:1\n";
        let files = vec![
            Manifest {
                file_name: "kube-flannel.yml".into(),
                text: flannel.into(),
            },
            Manifest {
                file_name: "op.yaml".into(),
                text: list.into(),
            },
        ];
        let r = render(&files, Origin::AnyCni, "localhost/x:1", "10.244.0.0/16");
        let r = match r {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(r.files[0].text, flannel, "taken as it is");
        let got: Vec<(String, String, bool)> = r
            .workloads
            .iter()
            .map(|w| (w.describe(), w.selector.clone(), w.runs_image))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "daemonset kube-flannel/kube-flannel-ds".to_string(),
                    "app=flannel,k8s-app=flannel".to_string(),
                    false
                ),
                (
                    "deployment default/operator".to_string(),
                    "name=operator".to_string(),
                    true
                ),
            ]
        );
        let combined = r.combined();
        let docs: Vec<serde_json::Value> = serde_norway::Deserializer::from_str(&combined)
            .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
            .filter(|v: &serde_json::Value| !v.is_null())
            .collect();
        assert_eq!(docs.len(), 3, "{combined}");
        let selectorless = flannel.replace(
            "  selector:\n    matchLabels:\n      app: flannel\n      k8s-app: flannel\n",
            "",
        );
        let err = render(
            &manifest(&selectorless),
            Origin::AnyCni,
            "i",
            "10.244.0.0/16",
        );
        assert!(matches!(err, Err(E2eError::Invalid(m)) if m.contains("matchLabels")));
    }
}
