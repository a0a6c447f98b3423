//! Counters for `/metrics` (Prometheus text format) and the `/healthz`
//! readiness answer, served by a deliberately tiny HTTP/1.1 responder.

use crate::error::{AgentError, Result};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Default)]
pub struct Metrics {
    pub routes_managed: AtomicU64,
    pub nodes: AtomicU64,
    pub reconciles: AtomicU64,
    pub reconcile_errors: AtomicU64,
    pub source_errors: AtomicU64,
    pub routes_added: AtomicU64,
    pub routes_replaced: AtomicU64,
    pub routes_deleted: AtomicU64,
    /// Peer pod CIDRs refused in the last pass: outside every cluster CIDR
    /// or in a special-purpose block.
    pub pod_cidrs_refused: AtomicU64,
    /// Unix time in milliseconds; 0 before the first reconcile.
    pub last_reconcile_ms: AtomicU64,
    pub last_success_ms: AtomicU64,
    /// A reconcile succeeded: the node is set up and routes are programmed.
    pub ready: AtomicBool,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {value}");
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        let seconds = |a: &AtomicU64| format!("{:.3}", a.load(Ordering::Relaxed) as f64 / 1000.0);
        metric(
            "cnilab_agent_routes_managed",
            "gauge",
            "Routes to other nodes' pod CIDRs owned by this agent.",
            get(&self.routes_managed),
        );
        metric(
            "cnilab_agent_nodes",
            "gauge",
            "Nodes in the last node list.",
            get(&self.nodes),
        );
        metric(
            "cnilab_agent_pod_cidrs_refused",
            "gauge",
            "Peer pod CIDRs refused in the last reconcile: outside every --cluster-cidr or in a special-purpose block.",
            get(&self.pod_cidrs_refused),
        );
        metric(
            "cnilab_agent_reconciles_total",
            "counter",
            "Reconcile passes run.",
            get(&self.reconciles),
        );
        metric(
            "cnilab_agent_reconcile_errors_total",
            "counter",
            "Reconcile passes that hit an error.",
            get(&self.reconcile_errors),
        );
        metric(
            "cnilab_agent_source_errors_total",
            "counter",
            "Errors reading the node source (watch errors, unreadable nodes file).",
            get(&self.source_errors),
        );
        metric(
            "cnilab_agent_last_reconcile_timestamp_seconds",
            "gauge",
            "Unix time of the last reconcile pass.",
            seconds(&self.last_reconcile_ms),
        );
        metric(
            "cnilab_agent_last_success_timestamp_seconds",
            "gauge",
            "Unix time of the last reconcile pass without errors.",
            seconds(&self.last_success_ms),
        );
        let _ = writeln!(
            out,
            "# HELP cnilab_agent_route_changes_total Route changes made, by action."
        );
        let _ = writeln!(out, "# TYPE cnilab_agent_route_changes_total counter");
        for (action, counter) in [
            ("add", &self.routes_added),
            ("replace", &self.routes_replaced),
            ("delete", &self.routes_deleted),
        ] {
            let _ = writeln!(
                out,
                "cnilab_agent_route_changes_total{{action=\"{action}\"}} {}",
                get(counter)
            );
        }
        out
    }
}

/// Binds the metrics address. `[::]` (both families, what the DaemonSet
/// uses so kubelet's probe reaches it on IPv4, IPv6 and dual-stack nodes)
/// falls back to `0.0.0.0` on a node without IPv6.
pub async fn listen(addr: SocketAddr) -> Result<TcpListener> {
    let bound = match TcpListener::bind(addr).await {
        Err(e) if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) => {
            let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
            tracing::warn!(error = %e, fallback = %v4, "cannot listen on [::]; IPv6 disabled?");
            TcpListener::bind(v4).await
        }
        other => other,
    };
    let listener =
        bound.map_err(|e| AgentError::io(format!("listen on --metrics-addr {addr}"), e))?;
    if let Ok(local) = listener.local_addr() {
        tracing::info!(addr = %local, "serving /healthz and /metrics");
    }
    Ok(listener)
}

/// Serves `/healthz` and `/metrics` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &metrics).await {
                        tracing::debug!(error = %e, "metrics connection");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    let mut request = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    let read_head = async {
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            request.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), read_head)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head"))??;
    let head = String::from_utf8_lossy(&request);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/healthz") if metrics.ready.load(Ordering::Relaxed) => {
            ("200 OK", "text/plain", "ok\n".to_string())
        }
        ("GET" | "HEAD", "/healthz") => (
            "503 Service Unavailable",
            "text/plain",
            "not ready: no successful reconcile yet\n".to_string(),
        ),
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_string(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn healthz_follows_readiness_and_metrics_render() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let metrics = Arc::new(Metrics::default());
        let server = tokio::spawn(serve(listener, metrics.clone()));
        let get = |path: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 503"));
        metrics.ready.store(true, Ordering::Relaxed);
        metrics.routes_managed.store(3, Ordering::Relaxed);
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        let body = get("/metrics").await;
        assert!(body.contains("\ncnilab_agent_routes_managed 3\n"), "{body}");
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
