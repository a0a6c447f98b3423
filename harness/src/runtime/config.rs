//! Network configs (`.conf` / `.conflist`) and per-call inputs: loading,
//! validating, and what each plugin gets on stdin.

use super::RuntimeError;
use cnilab_net::spec::{self, Version};
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Per-call inputs (libcni's `RuntimeConf`).
#[derive(Clone, Debug, Default)]
pub struct RuntimeConf {
    pub container_id: String,
    /// `CNI_NETNS`; `None` leaves it unset (allowed for DEL).
    pub netns: Option<PathBuf>,
    pub ifname: String,
    /// Extra `CNI_ARGS` pairs; `IgnoreUnknown=1` is always sent first.
    pub args: Vec<(String, String)>,
    /// Capability arguments, injected as `runtimeConfig` for plugins that
    /// declare the capability.
    pub capability_args: Map<String, Value>,
}

impl RuntimeConf {
    pub fn new(container_id: &str, netns: Option<&Path>, ifname: &str) -> Self {
        RuntimeConf {
            container_id: container_id.to_string(),
            netns: netns.map(Path::to_path_buf),
            ifname: ifname.to_string(),
            ..Default::default()
        }
    }

    pub(super) fn cni_args(&self) -> String {
        let mut s = String::from("IgnoreUnknown=1");
        for (k, v) in &self.args {
            s.push_str(&format!(";{k}={v}"));
        }
        s
    }
}

/// A loaded `.conf` or `.conflist`.
#[derive(Clone, Debug)]
pub struct NetworkConfig {
    pub name: String,
    /// The version chosen for this run (highest of cniVersion ∪ cniVersions
    /// that the runtime supports).
    pub version: Version,
    pub disable_check: bool,
    pub disable_gc: bool,
    /// The plugin configs, in chain order.
    pub plugins: Vec<Map<String, Value>>,
    /// Where it came from (for messages).
    pub source: PathBuf,
}

fn flag(value: Option<&Value>, key: &str, path: &Path) -> Result<bool, RuntimeError> {
    match value {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(RuntimeError::BadConfig {
            path: path.to_path_buf(),
            reason: format!("{key} must be true/false or \"true\"/\"false\", got {other}"),
        }),
    }
}

impl NetworkConfig {
    /// Reads a `.conf` (one plugin) or `.conflist` (a `plugins` array).
    pub fn load(path: &Path) -> Result<NetworkConfig, RuntimeError> {
        let text = crate::assets::read_to_string(path).map_err(|e| RuntimeError::ReadConfig {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::parse(&text, path)
    }

    /// Parses config text; `source` only names it in messages.
    pub fn parse(text: &str, source: &Path) -> Result<NetworkConfig, RuntimeError> {
        let bad = |reason: String| RuntimeError::BadConfig {
            path: source.to_path_buf(),
            reason,
        };
        let value: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Value::Object(top) = value else {
            return Err(bad("the top level must be a JSON object".into()));
        };
        let name = match top.get("name") {
            Some(Value::String(n)) if !n.is_empty() => n.clone(),
            _ => return Err(bad("missing \"name\" (a non-empty string)".into())),
        };
        let mut offered: Vec<String> = Vec::new();
        if let Some(Value::String(v)) = top.get("cniVersion") {
            offered.push(v.clone());
        }
        if let Some(list) = top.get("cniVersions") {
            let Value::Array(list) = list else {
                return Err(bad("\"cniVersions\" must be an array of strings".into()));
            };
            for v in list {
                match v {
                    Value::String(s) => offered.push(s.clone()),
                    _ => return Err(bad("\"cniVersions\" must be an array of strings".into())),
                }
            }
        }
        let version = offered
            .iter()
            .filter(|v| spec::is_supported(v))
            .filter_map(|v| Version::parse(v))
            .max()
            .ok_or_else(|| {
                bad(format!(
                    "no supported version among {offered:?}; the harness speaks {:?}",
                    spec::SUPPORTED_VERSIONS
                ))
            })?;
        let plugins = match top.get("plugins") {
            Some(Value::Array(list)) => {
                let mut out = Vec::new();
                for (i, p) in list.iter().enumerate() {
                    match p {
                        Value::Object(o) if o.get("type").is_some_and(Value::is_string) => {
                            out.push(o.clone())
                        }
                        _ => {
                            return Err(bad(format!(
                                "plugins[{i}] must be an object with a \"type\" string"
                            )))
                        }
                    }
                }
                if out.is_empty() {
                    return Err(bad("\"plugins\" is empty".into()));
                }
                out
            }
            Some(_) => return Err(bad("\"plugins\" must be an array".into())),
            None => {
                if !top.get("type").is_some_and(Value::is_string) {
                    return Err(bad(
                        "a .conf needs a \"type\" (or use a .conflist with \"plugins\")".into(),
                    ));
                }
                vec![top.clone()]
            }
        };
        Ok(NetworkConfig {
            name,
            version,
            disable_check: flag(top.get("disableCheck"), "disableCheck", source)?,
            disable_gc: flag(top.get("disableGC"), "disableGC", source)?,
            plugins,
            source: source.to_path_buf(),
        })
    }

    /// The same network at another config version (for per-version runs).
    pub fn with_version(&self, version: Version) -> NetworkConfig {
        NetworkConfig {
            version,
            ..self.clone()
        }
    }

    /// Plugin `index`'s `type`.
    pub fn plugin_type(&self, index: usize) -> &str {
        self.plugins
            .get(index)
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// What plugin `index` gets on stdin, as libcni builds it: the plugin's
    /// own object plus `name`, `cniVersion`, `prevResult` (when given) and
    /// `runtimeConfig` restricted to the plugin's declared capabilities.
    pub fn plugin_stdin(
        &self,
        index: usize,
        prev_result: Option<&Value>,
        rt: Option<&RuntimeConf>,
    ) -> Map<String, Value> {
        let mut conf = self.plugins.get(index).cloned().unwrap_or_default();
        conf.insert("name".into(), Value::String(self.name.clone()));
        conf.insert("cniVersion".into(), Value::String(self.version.to_string()));
        conf.remove("prevResult");
        if let Some(prev) = prev_result {
            conf.insert("prevResult".into(), prev.clone());
        }
        if let Some(rt) = rt {
            let caps: HashSet<String> = match conf.get("capabilities") {
                Some(Value::Object(c)) => c
                    .iter()
                    .filter(|(_, v)| v.as_bool() == Some(true))
                    .map(|(k, _)| k.clone())
                    .collect(),
                _ => HashSet::new(),
            };
            let runtime_config: Map<String, Value> = rt
                .capability_args
                .iter()
                .filter(|(k, _)| caps.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !runtime_config.is_empty() {
                conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
            }
        }
        conf
    }

    /// Points every plugin's `ipam.dataDir` at `dir`, so a run keeps its
    /// address reservations in a scratch directory of its own.
    pub fn set_ipam_data_dir(&mut self, dir: &Path) {
        for plugin in &mut self.plugins {
            if let Some(Value::Object(ipam)) = plugin.get_mut("ipam") {
                ipam.insert(
                    "dataDir".into(),
                    Value::String(dir.to_string_lossy().into_owned()),
                );
            }
        }
    }

    /// `ipam.dataDir` of the first plugin when it keeps a host-local style
    /// store (`<dataDir>/<network>/<ip>` files). `None` when unknown.
    pub fn ipam_store_dir(&self) -> Option<PathBuf> {
        let ipam = self.plugins.first()?.get("ipam")?.as_object()?;
        let data_dir = ipam
            .get("dataDir")
            .and_then(Value::as_str)
            .unwrap_or("/var/lib/cni/networks");
        Some(Path::new(data_dir).join(&self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn parse(text: &str) -> Result<NetworkConfig, RuntimeError> {
        NetworkConfig::parse(text, Path::new("test.conflist"))
    }

    #[rstest]
    #[case(
        r#"{"name":"n","cniVersion":"0.4.0","plugins":[{"type":"bridge"}]}"#,
        "0.4.0"
    )]
    #[case(r#"{"name":"n","cniVersion":"0.4.0","cniVersions":["1.0.0","0.3.1"],"plugins":[{"type":"bridge"}]}"#, "1.0.0")]
    #[case(r#"{"name":"n","cniVersion":"1.0.0","cniVersions":["9.0.0"],"plugins":[{"type":"bridge"}]}"#, "1.0.0")]
    #[case(r#"{"name":"n","cniVersion":"1.1.0","type":"bridge"}"#, "1.1.0")]
    fn chooses_the_highest_supported_version(#[case] text: &str, #[case] want: &str) {
        let net = parse(text).expect("parses");
        assert_eq!(net.version.to_string(), want);
    }

    #[rstest]
    #[case(r#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#, "name")]
    #[case(
        r#"{"name":"n","cniVersion":"7.0.0","plugins":[{"type":"bridge"}]}"#,
        "no supported version"
    )]
    #[case(r#"{"name":"n","cniVersion":"1.0.0","plugins":[{}]}"#, "type")]
    #[case(
        r#"{"name":"n","cniVersion":"1.0.0","disableCheck":"maybe","plugins":[{"type":"x"}]}"#,
        "disableCheck"
    )]
    #[case(r#"{"name":"n","cniVersion":"1.0.0"}"#, "type")]
    #[case("not json", "not JSON")]
    fn rejects_bad_configs(#[case] text: &str, #[case] needle: &str) {
        let err = parse(text).expect_err("must be rejected").to_string();
        assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    }

    #[rstest]
    #[case(r#"true"#, true)]
    #[case(r#""true""#, true)]
    #[case(r#""False""#, false)]
    #[case(r#"false"#, false)]
    fn honours_disable_flags_as_bool_or_string(#[case] value: &str, #[case] want: bool) {
        let text = format!(
            r#"{{"name":"n","cniVersion":"1.1.0","disableCheck":{value},"disableGC":{value},"plugins":[{{"type":"x"}}]}}"#
        );
        let net = parse(&text).expect("parses");
        assert_eq!(net.disable_check, want);
        assert_eq!(net.disable_gc, want);
    }

    #[test]
    fn plugin_stdin_injects_name_version_prev_result_and_capabilities() {
        let net = parse(
            r#"{"name":"net1","cniVersion":"1.0.0","plugins":[{"type":"a"},{"type":"b","capabilities":{"portMappings":true},"prevResult":"stale"}]}"#,
        )
        .expect("parses");
        let mut rt = RuntimeConf::new("c1", None, "eth0");
        rt.capability_args
            .insert("portMappings".into(), serde_json::json!([{"hostPort": 80}]));
        rt.capability_args
            .insert("bandwidth".into(), serde_json::json!({}));
        let first = net.plugin_stdin(0, None, Some(&rt));
        assert_eq!(first["name"], "net1");
        assert_eq!(first["cniVersion"], "1.0.0");
        assert!(first.get("prevResult").is_none());
        assert!(
            first.get("runtimeConfig").is_none(),
            "no capability declared"
        );
        let prev = serde_json::json!({"cniVersion":"1.0.0"});
        let second = net.plugin_stdin(1, Some(&prev), Some(&rt));
        assert_eq!(second["prevResult"], prev);
        assert!(second["runtimeConfig"].get("portMappings").is_some());
        assert!(second["runtimeConfig"].get("bandwidth").is_none());
    }

    #[test]
    fn cni_args_always_start_with_ignore_unknown() {
        let mut rt = RuntimeConf::new("c", None, "eth0");
        rt.args.push(("K8S_POD_NAME".into(), "p".into()));
        assert_eq!(rt.cni_args(), "IgnoreUnknown=1;K8S_POD_NAME=p");
    }
}
