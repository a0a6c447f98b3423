//! The CRI v1 calls the lab makes, as kubelet makes them, over a node's
//! containerd socket. Blocking: each call runs on one small tokio runtime
//! shared by the process (never on a thread that entered a namespace: the
//! socket is a path in the machine's file system).

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long one CRI call may take (a RunPodSandbox runs the plugin).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("cnilab-cri")
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime for the CRI: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// A CRI client of one containerd.
#[derive(Clone)]
pub struct Cri {
    socket: PathBuf,
    channel: Channel,
}

/// A sandbox as ListPodSandbox shows it.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub id: String,
    pub name: String,
    /// The pod's Kubernetes namespace (`kube-system`).
    pub namespace: String,
    pub ready: bool,
}

impl Sandbox {
    /// `<namespace>/<name>`, as kubectl names a pod (the name alone where
    /// the sandbox has no namespace).
    pub fn pod_name(&self) -> String {
        match self.namespace.is_empty() {
            true => self.name.clone(),
            false => format!("{}/{}", self.namespace, self.name),
        }
    }
}

impl Cri {
    /// Opens a channel to the socket (lazily: the first call connects).
    pub fn new(socket: &Path) -> Result<Cri, String> {
        let rt = runtime()?;
        let path = socket.to_path_buf();
        let channel = {
            let _guard = rt.enter();
            Endpoint::from_static("http://[::]:50051")
                .connect_timeout(Duration::from_secs(2))
                .timeout(CALL_TIMEOUT)
                .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
        };
        Ok(Cri {
            socket: socket.to_path_buf(),
            channel,
        })
    }

    fn call<F, Fut, R>(&self, what: &str, f: F) -> Result<R, String>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let client = RuntimeServiceClient::new(self.channel.clone());
        runtime()?
            .block_on(f(client))
            .map(tonic::Response::into_inner)
            .map_err(|s| {
                format!(
                    "CRI {what} on {}: {}",
                    self.socket.display(),
                    if s.message().is_empty() {
                        s.to_string()
                    } else {
                        s.message().to_string()
                    }
                )
            })
    }

    /// `Version`: the runtime's name and version.
    pub fn version(&self) -> Result<String, String> {
        let v = self.call("Version", |mut c| async move {
            c.version(cri::VersionRequest {
                version: "v1".into(),
            })
            .await
        })?;
        Ok(format!(
            "{} {} (CRI {})",
            v.runtime_name, v.runtime_version, v.runtime_api_version
        ))
    }

    /// `Status`: the runtime's conditions (RuntimeReady, NetworkReady) as
    /// (type, status, reason: message).
    pub fn conditions(&self) -> Result<Vec<(String, bool, String)>, String> {
        let s = self.call("Status", |mut c| async move {
            c.status(cri::StatusRequest { verbose: false }).await
        })?;
        Ok(s.status
            .map(|st| {
                st.conditions
                    .into_iter()
                    .map(|c| (c.r#type, c.status, format!("{}: {}", c.reason, c.message)))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// `RunPodSandbox` for pod `name` (namespace `cnilab`, uid `uid`):
    /// containerd makes the sandbox and calls CNI ADD. Returns its id.
    pub fn run_pod(&self, name: &str, uid: &str, log_dir: &Path) -> Result<String, String> {
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_string(),
                uid: uid.to_string(),
                namespace: "cnilab".into(),
                attempt: 0,
            }),
            hostname: name.to_string(),
            log_directory: log_dir.display().to_string(),
            labels: [("io.cnilab.pod".to_string(), name.to_string())].into(),
            linux: Some(cri::LinuxPodSandboxConfig::default()),
            ..Default::default()
        };
        let r = self.call("RunPodSandbox", |mut c| async move {
            c.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
        })?;
        Ok(r.pod_sandbox_id)
    }

    /// The pid of the sandbox's pause process (`PodSandboxStatus`, verbose
    /// info), whose `/proc/<pid>/ns/net` is the pod's network namespace.
    pub fn sandbox_pid(&self, id: &str) -> Result<u32, String> {
        let id2 = id.to_string();
        let r = self.call("PodSandboxStatus", |mut c| async move {
            c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id2,
                verbose: true,
            })
            .await
        })?;
        let info: serde_json::Value = r
            .info
            .get("info")
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default();
        info["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("PodSandboxStatus of {id}: no pause pid in the verbose info"))
    }

    /// `StopPodSandbox` (CNI DEL with the netns) then `RemovePodSandbox`.
    pub fn remove_pod(&self, id: &str) -> Result<(), String> {
        let id2 = id.to_string();
        self.call("StopPodSandbox", |mut c| async move {
            c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id2,
            })
            .await
        })?;
        let id2 = id.to_string();
        self.call("RemovePodSandbox", |mut c| async move {
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id2,
            })
            .await
        })?;
        Ok(())
    }

    /// `ListPodSandbox`: every sandbox this containerd knows.
    pub fn sandboxes(&self) -> Result<Vec<Sandbox>, String> {
        let r = self.call("ListPodSandbox", |mut c| async move {
            c.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                .await
        })?;
        Ok(r.items
            .into_iter()
            .map(|s| {
                let (name, namespace) = s
                    .metadata
                    .map(|m| (m.name, m.namespace))
                    .unwrap_or_default();
                Sandbox {
                    ready: s.state == cri::PodSandboxState::SandboxReady as i32,
                    name,
                    namespace,
                    id: s.id,
                }
            })
            .collect())
    }
}
