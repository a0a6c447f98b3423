//! The result cache: the final ADD result per attachment, for CHECK and DEL
//! (in memory, and on disk when a cache directory is set).

use super::{NetworkConfig, Runtime, RuntimeConf, RuntimeError};
use cnilab_net::spec;
use serde_json::Value;
use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct CacheKey {
    network: String,
    container_id: String,
    ifname: String,
}

impl Runtime {
    pub(super) fn cache_file(&self, key: &CacheKey) -> Option<PathBuf> {
        let dir = self.cache_dir.as_ref()?;
        let safe = |s: &str| spec::valid_container_id(s);
        if !safe(&key.network)
            || !safe(&key.container_id)
            || spec::check_ifname(&key.ifname).is_err()
        {
            return None;
        }
        Some(dir.join(format!(
            "{}-{}-{}",
            key.network, key.container_id, key.ifname
        )))
    }

    pub(super) fn cached(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
    ) -> Result<Option<Value>, RuntimeError> {
        let key = CacheKey {
            network: net.name.clone(),
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
        };
        if let Some(v) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(Some(v));
        }
        let Some(path) = self.cache_file(&key) else {
            return Ok(None);
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| RuntimeError::Cache {
                    path,
                    reason: format!("corrupt cache entry: {e}"),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RuntimeError::Cache {
                path,
                reason: e.to_string(),
            }),
        }
    }

    pub(super) fn store_cached(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
        value: Option<&Value>,
    ) -> Result<(), RuntimeError> {
        let key = CacheKey {
            network: net.name.clone(),
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
        };
        let file = self.cache_file(&key);
        if let Ok(mut cache) = self.cache.lock() {
            match value {
                Some(v) => {
                    cache.insert(key, v.clone());
                }
                None => {
                    cache.remove(&key);
                }
            }
        }
        let Some(path) = file else {
            return Ok(());
        };
        let io = |e: std::io::Error| RuntimeError::Cache {
            path: path.clone(),
            reason: e.to_string(),
        };
        match value {
            Some(v) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
                std::fs::write(&path, v.to_string()).map_err(io)
            }
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
                _ => Ok(()),
            },
        }
    }
}
