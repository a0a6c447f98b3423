//! The probe: one real packet sent from the source namespace (ICMP echo by
//! `ping`, a TCP SYN by a connect, a UDP datagram), and the nft match the
//! trace rules use for it.

use super::Proto;
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long the probe waits for an answer (it needs none: the trace reads
/// what the kernel did with it).
const WAIT: Duration = Duration::from_secs(1);

/// The nft match for the probe: any of its destinations (before and after
/// a DNAT), the protocol and any of its ports. `dsts` is never empty.
pub fn matcher(dsts: &[IpAddr], proto: Proto, ports: &[u16]) -> String {
    let v4 = dsts.first().is_none_or(|d| d.is_ipv4());
    let family = if v4 { "ip" } else { "ip6" };
    let set = |items: Vec<String>| match items.as_slice() {
        [one] => one.clone(),
        [] => "0".to_string(),
        _ => format!("{{ {} }}", items.join(", ")),
    };
    let mut dsts: Vec<String> = dsts.iter().map(IpAddr::to_string).collect();
    dsts.dedup();
    let mut ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    ports.dedup();
    let l4 = match (proto, v4) {
        (Proto::Icmp, true) => "meta l4proto icmp icmp type echo-request".to_string(),
        (Proto::Icmp, false) => "meta l4proto ipv6-icmp icmpv6 type echo-request".to_string(),
        (Proto::Tcp, _) => format!("tcp dport {}", set(ports)),
        (Proto::Udp, _) => format!("udp dport {}", set(ports)),
    };
    format!("{family} daddr {} {l4}", set(dsts))
}

/// The IP and ICMP echo headers around ping's payload.
pub fn icmp_headers(dst: IpAddr) -> u32 {
    if dst.is_ipv4() {
        28
    } else {
        48
    }
}

/// The size of the probe as sent by default (ping's 56-byte payload, a SYN
/// with its options, the UDP datagram below), IP header included.
pub fn default_size(dst: IpAddr, proto: Proto) -> u32 {
    let ip = if dst.is_ipv4() { 20 } else { 40 };
    match proto {
        Proto::Icmp => icmp_headers(dst) + 56,
        Proto::Tcp => ip + 40,
        Proto::Udp => ip + 8 + PAYLOAD.len() as u32,
    }
}

const PAYLOAD: &[u8] = b"cnilab trace";

/// A probe on its way: it ends by itself within [`WAIT`], or earlier when
/// stopped (once the trace is certain of its fate, the answer, which never
/// comes for a packet that died, is not waited for). Only ping is left
/// running; a connect or a datagram is done when [`send`] returns.
pub struct Sent(Option<Child>);

impl Sent {
    /// Nothing sent.
    pub fn none() -> Sent {
        Sent(None)
    }

    /// True when the probe ended by itself (answered or timed out).
    pub fn finished(&mut self) -> bool {
        match &mut self.0 {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }
}

/// Stops waiting for the probe's answer (ping sends one echo request only:
/// nothing more is sent).
impl Drop for Sent {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends one probe from inside `ns`; it waits at most [`WAIT`] for an
/// answer (see [`Sent`]); `size` (ICMP only): the whole packet's size, sent
/// with DF.
pub fn send(
    ns: &File,
    src: Option<IpAddr>,
    dst: IpAddr,
    proto: Proto,
    port: Option<u16>,
    size: Option<u32>,
) -> Sent {
    match proto {
        Proto::Icmp => {
            let mut cmd = Command::new("ping");
            cmd.args(["-n", "-c", "1", "-W", "1", "-M", "do"]);
            if let Some(size) = size {
                let payload = size.saturating_sub(icmp_headers(dst));
                cmd.args(["-s", &payload.to_string()]);
            }
            if let Some(src) = src {
                cmd.args(["-I", &src.to_string()]);
            }
            cmd.arg(dst.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            Sent(cnilab_net::netns::spawn_in(ns, &mut cmd).ok())
        }
        Proto::Tcp => {
            // Waited for here: a connect given up early could send its SYN
            // again while the next trace watches.
            let to = SocketAddr::new(dst, port.unwrap_or(0));
            let _ =
                cnilab_net::netns::run_in(ns, || std::net::TcpStream::connect_timeout(&to, WAIT));
            Sent(None)
        }
        Proto::Udp => {
            let to = SocketAddr::new(dst, port.unwrap_or(0));
            let _ = cnilab_net::netns::run_in(ns, || {
                let any: SocketAddr = if dst.is_ipv4() {
                    ([0, 0, 0, 0], 0).into()
                } else {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                };
                std::net::UdpSocket::bind(any).and_then(|s| s.send_to(PAYLOAD, to))
            });
            Sent(None)
        }
    }
}
