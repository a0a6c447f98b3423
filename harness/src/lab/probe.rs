//! In-process probes. A socket belongs to the namespace it was created in,
//! so each socket is made on a short-lived thread inside the source (or
//! responder) namespace and then driven from the lab's tokio runtime.
//! No `ping` process per probe: thousands of probes run concurrently.
//!
//! Responders answer TCP and UDP with `SRC <address they saw>`, which is how
//! the checks prove masquerade (or its absence). ICMP echo is answered by
//! the kernel itself.

pub use crate::connectivity::Proto;
use cnilab_net::netns::run_in;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockProtocol, SockType};
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The port every responder listens on (TCP and UDP).
pub const PORT: u16 = 7777;

/// The port a TCP or UDP probe goes to: a captured Service's own, else [`PORT`].
pub fn port_of(spec: &crate::connectivity::ProbeSpec) -> u16 {
    spec.service.as_ref().map_or(PORT, |s| s.port)
}

/// What a probe saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The source address the responder saw (TCP/UDP), `None` for ICMP.
    pub seen_src: Option<IpAddr>,
    /// Who answered (TCP/UDP): catches traffic that reached the wrong
    /// endpoint, as with duplicate addresses.
    pub responder: Option<String>,
    pub rtt: Duration,
}

fn unspecified(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    }
}

fn in_ns<R: Send>(ns: &File, f: impl FnOnce() -> io::Result<R> + Send) -> io::Result<R> {
    run_in(ns, f)?
}

/// A job for the socket makers: enter the namespace, run the closure.
type MakerJob = (File, Box<dyn FnOnce() + Send>);

/// The senders to the socket-maker threads: dedicated OS threads (never a
/// tokio worker) that enter a probe's source namespace and make its socket.
/// A thread per probe blocked the runtime's two workers for the length of
/// a thread start: with tens of thousands of probes that was most of the
/// check's time.
fn makers() -> &'static std::sync::Mutex<std::sync::mpsc::Sender<MakerJob>> {
    use std::sync::{mpsc, Arc, Mutex, OnceLock};
    static MAKERS: OnceLock<Mutex<mpsc::Sender<MakerJob>>> = OnceLock::new();
    MAKERS.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<MakerJob>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..2 {
            let rx = Arc::clone(&rx);
            let _ = std::thread::Builder::new()
                .name(format!("cnilab-sockets-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(r) => r.recv(),
                        Err(_) => return,
                    };
                    let Ok((ns, run)) = job else { return };
                    // On failure the job is dropped: its caller sees the
                    // closed reply channel.
                    if nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).is_ok() {
                        run();
                    }
                });
        }
        Mutex::new(tx)
    })
}

/// Runs `f` inside `ns` on a socket-maker thread, without blocking the
/// caller's tokio worker.
async fn in_ns_async<R: Send + 'static>(
    ns: &File,
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> io::Result<R> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Box<dyn FnOnce() + Send> = Box::new(move || {
        let _ = tx.send(f());
    });
    let ns = ns.try_clone()?;
    makers()
        .lock()
        .map_err(|_| io::Error::other("socket makers are gone"))?
        .send((ns, job))
        .map_err(|_| io::Error::other("socket makers are gone"))?;
    rx.await
        .map_err(|_| io::Error::other("cannot enter the source namespace"))?
}

/// Allows unprivileged-style ICMP echo sockets for root in this namespace
/// (new namespaces start with `ping_group_range = 1 0`, which excludes everyone).
pub fn allow_ping_sockets(ns: &File) -> io::Result<()> {
    cnilab_net::netns::write_sysctl(Some(ns), PING_GROUP_RANGE.0, PING_GROUP_RANGE.1)
}

/// [`allow_ping_sockets`] in the calling thread's own namespace (a thread
/// inside a namespace it just made).
pub fn allow_ping_sockets_here() -> io::Result<()> {
    cnilab_net::netns::write_sysctl(None, PING_GROUP_RANGE.0, PING_GROUP_RANGE.1)
}

/// Every group may open ping sockets.
const PING_GROUP_RANGE: (&str, &str) = ("net/ipv4/ping_group_range", "0 2147483647");

/// Starts TCP and UDP responders on `port` (the lab's: [`PORT`]) inside
/// `ns` on the lab runtime. They run until the runtime shuts down.
pub fn start_responders(
    ns: &File,
    v6: bool,
    rt: &tokio::runtime::Handle,
    name: &str,
    port: u16,
) -> io::Result<()> {
    let addr = SocketAddr::new(unspecified(v6), port);
    let (tcp, udp) = in_ns(ns, || {
        let tcp = if v6 {
            tokio::net::TcpSocket::new_v6()?
        } else {
            tokio::net::TcpSocket::new_v4()?
        };
        tcp.set_reuseaddr(true)?;
        tcp.bind(addr)?;
        let udp = std::net::UdpSocket::bind(addr)?;
        udp.set_nonblocking(true)?;
        Ok((tcp, udp))
    })?;
    let _entered = rt.enter();
    let listener = tcp.listen(1024)?;
    let udp = tokio::net::UdpSocket::from_std(udp)?;
    let tcp_name = name.to_string();
    let udp_name = name.to_string();
    rt.spawn(async move {
        loop {
            let Ok((mut stream, peer)) = listener.accept().await else {
                continue;
            };
            let name = tcp_name.clone();
            tokio::spawn(async move {
                let _ = stream
                    .write_all(format!("SRC {} NAME {name}\n", canonical(peer.ip())).as_bytes())
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    rt.spawn(async move {
        let mut buf = vec![0u8; 65536];
        loop {
            if let Ok((_, peer)) = udp.recv_from(&mut buf).await {
                let _ = udp
                    .send_to(
                        format!("SRC {} NAME {udp_name}\n", canonical(peer.ip())).as_bytes(),
                        peer,
                    )
                    .await;
            }
        }
    });
    Ok(())
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Parses `SRC <ip> NAME <responder>`.
fn parse_reply(buf: &[u8]) -> Option<(IpAddr, String)> {
    let text = std::str::from_utf8(buf).ok()?.trim();
    let rest = text.strip_prefix("SRC ")?;
    let (ip, name) = rest.split_once(" NAME ")?;
    Some((ip.trim().parse().ok()?, name.trim().to_string()))
}

/// Sends one probe from namespace `ns` to `dst` (TCP and UDP at `port`).
/// `size` is the DF payload size (the probe's IP packet is then exactly the MTU).
pub async fn probe(
    ns: &File,
    dst: IpAddr,
    port: u16,
    proto: Proto,
    timeout: Duration,
    mtu: u32,
) -> Result<Reply, String> {
    // The timeout runs from the moment the probe's socket exists: waiting
    // for a socket maker on a loaded machine is not the network's time.
    let (answer, rtt) = match proto {
        Proto::Tcp => tcp_probe(ns, SocketAddr::new(dst, port), timeout).await,
        Proto::Udp => udp_probe(ns, SocketAddr::new(dst, port), None, timeout).await,
        Proto::Df => udp_probe(ns, SocketAddr::new(dst, port), Some(mtu), timeout).await,
        Proto::Icmp => icmp_probe(ns, dst, timeout).await,
    }?;
    Ok(Reply {
        seen_src: answer.as_ref().map(|(ip, _)| *ip),
        responder: answer.map(|(_, name)| name),
        rtt,
    })
}

/// Runs `exchange` within `timeout`, measuring it.
async fn timed<F>(timeout: Duration, exchange: F) -> Result<(Answer, Duration), String>
where
    F: std::future::Future<Output = Result<Answer, String>>,
{
    let started = Instant::now();
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(answer)) => Ok((answer, started.elapsed())),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("timed out after {timeout:?}")),
    }
}

type Answer = Option<(IpAddr, String)>;

async fn tcp_socket(ns: &File, v6: bool) -> Result<tokio::net::TcpSocket, String> {
    in_ns_async(ns, move || {
        if v6 {
            tokio::net::TcpSocket::new_v6()
        } else {
            tokio::net::TcpSocket::new_v4()
        }
    })
    .await
    .map_err(|e| format!("socket: {e}"))
}

/// TCP: connect and read the responder's line. A lost SYN would cost the
/// kernel's 1 s retransmission timeout, the whole default probe timeout: so
/// the first attempt gets 40% of it, and a second one, on a fresh socket,
/// the rest (as UDP and ICMP probes resend within the timeout).
async fn tcp_probe(
    ns: &File,
    dst: SocketAddr,
    timeout: Duration,
) -> Result<(Answer, Duration), String> {
    let v6 = dst.is_ipv6();
    let first = tcp_socket(ns, v6).await?;
    let started = Instant::now();
    let first_try = timeout.mul_f32(0.4);
    let answer = match tokio::time::timeout(first_try, tcp_exchange(first, dst)).await {
        Ok(done) => done,
        Err(_) => {
            let second = tcp_socket(ns, v6).await?;
            let rest = timeout.saturating_sub(started.elapsed());
            match tokio::time::timeout(rest, tcp_exchange(second, dst)).await {
                Ok(done) => done,
                Err(_) => Err(format!("timed out after {timeout:?}")),
            }
        }
    }?;
    Ok((answer, started.elapsed()))
}

async fn tcp_exchange(sock: tokio::net::TcpSocket, dst: SocketAddr) -> Result<Answer, String> {
    let mut stream = sock
        .connect(dst)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut buf = Vec::new();
    stream
        .read_to_end(&mut buf)
        .await
        .map_err(|e| format!("read: {e}"))?;
    parse_reply(&buf)
        .map(Some)
        .ok_or_else(|| format!("unexpected reply {:?}", String::from_utf8_lossy(&buf)))
}

fn set_dont_fragment(sock: &std::net::UdpSocket, v6: bool) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    let (level, name, value) = if v6 {
        (nix::libc::IPPROTO_IPV6, nix::libc::IPV6_DONTFRAG, 1)
    } else {
        (
            nix::libc::IPPROTO_IP,
            nix::libc::IP_MTU_DISCOVER,
            nix::libc::IP_PMTUDISC_PROBE,
        )
    };
    // SAFETY: a plain setsockopt on a socket we own, with an int option.
    let rc = unsafe {
        nix::libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as nix::libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

async fn udp_probe(
    ns: &File,
    to: SocketAddr,
    df_mtu: Option<u32>,
    timeout: Duration,
) -> Result<(Answer, Duration), String> {
    let v6 = to.is_ipv6();
    let sock = in_ns_async(ns, move || {
        let s = std::net::UdpSocket::bind(SocketAddr::new(unspecified(v6), 0))?;
        s.set_nonblocking(true)?;
        if df_mtu.is_some() {
            set_dont_fragment(&s, v6)?;
        }
        Ok(s)
    })
    .await
    .map_err(|e| format!("socket: {e}"))?;
    let sock = tokio::net::UdpSocket::from_std(sock).map_err(|e| format!("socket: {e}"))?;
    let payload = match df_mtu {
        // IP header 20 (v4) / 40 (v6) + UDP 8: the packet is exactly the MTU.
        Some(mtu) => vec![b'x'; mtu as usize - if v6 { 48 } else { 28 }],
        None => b"probe".to_vec(),
    };
    let mut buf = vec![0u8; 1024];
    // UDP may be lost once (ARP/ND resolution); retry within the timeout.
    timed(timeout, async {
        loop {
            sock.send_to(&payload, to)
                .await
                .map_err(|e| format!("send: {e}"))?;
            match tokio::time::timeout(Duration::from_millis(300), sock.recv_from(&mut buf)).await {
                Ok(Ok((n, _))) => {
                    return parse_reply(&buf[..n]).map(Some).ok_or_else(|| {
                        format!("unexpected reply {:?}", String::from_utf8_lossy(&buf[..n]))
                    })
                }
                Ok(Err(e)) => return Err(format!("receive: {e}")),
                Err(_) => continue,
            }
        }
    })
    .await
}

fn icmp_socket(v6: bool) -> io::Result<OwnedFd> {
    let (family, proto) = if v6 {
        (AddressFamily::Inet6, SockProtocol::IcmpV6)
    } else {
        (AddressFamily::Inet, SockProtocol::Icmp)
    };
    socket(
        family,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        proto,
    )
    .map_err(io::Error::from)
}

async fn icmp_probe(
    ns: &File,
    dst: IpAddr,
    timeout: Duration,
) -> Result<(Answer, Duration), String> {
    let v6 = dst.is_ipv6();
    let fd = in_ns_async(ns, move || icmp_socket(v6))
        .await
        .map_err(|e| {
            format!("ICMP socket: {e} (is net.ipv4.ping_group_range open in the source namespace?)")
        })?;
    // An ICMP echo socket is a datagram socket: tokio's UdpSocket drives it.
    let sock = tokio::net::UdpSocket::from_std(std::net::UdpSocket::from(fd))
        .map_err(|e| format!("socket: {e}"))?;
    // Echo request: type, code, checksum and identifier are filled in by the kernel.
    let request: [u8; 16] = [
        if v6 { 128 } else { 8 },
        0,
        0,
        0,
        0,
        0,
        0,
        1,
        b'c',
        b'n',
        b'i',
        b'l',
        b'a',
        b'b',
        0,
        0,
    ];
    let want = if v6 { 129 } else { 0 };
    let to = SocketAddr::new(dst, 0);
    let mut buf = [0u8; 1500];
    timed(timeout, async {
        loop {
            sock.send_to(&request, to)
                .await
                .map_err(|e| format!("send: {e}"))?;
            match tokio::time::timeout(Duration::from_millis(300), sock.recv_from(&mut buf)).await {
                Ok(Ok((n, _))) if n >= 1 && buf[0] == want => return Ok(None),
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => return Err(format!("receive: {e}")),
                Err(_) => continue,
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_responder_replies() {
        assert_eq!(
            parse_reply(b"SRC 10.0.0.1 NAME node1/p\n"),
            Some((IpAddr::from([10, 0, 0, 1]), "node1/p".to_string()))
        );
        assert_eq!(
            parse_reply(b"SRC fd00::1 NAME x\n").map(|r| r.0),
            Some("fd00::1".parse().expect("ip"))
        );
        assert_eq!(parse_reply(b"SRC 10.0.0.1\n"), None);
        assert_eq!(parse_reply(b"garbage"), None);
        assert_eq!(
            canonical("::ffff:10.0.0.1".parse().expect("ip")),
            IpAddr::from([10, 0, 0, 1])
        );
    }
}
