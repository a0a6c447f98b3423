//! The probe: one real packet sent from the source namespace (ICMP echo by
//! `ping`, a TCP SYN by a connect, a UDP datagram, or with `--invalid` a
//! TCP segment conntrack classes INVALID, by a raw socket).

use super::{Proto, Request};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long the probe waits for an answer (it needs none: the trace reads
/// what the kernel did with it).
const WAIT: Duration = Duration::from_secs(1);

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

/// 13 bytes: no other probe has the length it gives (41 and 61 bytes;
/// 60 is a TCP SYN's), which the kernel's drop reasons filter on.
const PAYLOAD: &[u8] = b"cnilab trace.";

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

/// Sends the probe of `req` from inside `ns` (from `src`, the kernel's
/// choice when `None`); it waits at most [`WAIT`] for an answer (see
/// [`Sent`]); `req.size` (ICMP only): the whole packet's size, sent with DF.
pub fn send(ns: &File, src: Option<IpAddr>, req: &Request) -> Sent {
    let (dst, proto, port, size) = (req.dst, req.proto, req.port, req.size);
    if req.invalid {
        if let Some(src) = src {
            let _ = cnilab_net::netns::run_in(ns, || send_invalid(src, dst, port.unwrap_or(0)));
        }
        return Sent(None);
    }
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

/// Sends one TCP segment with no flags set from `src` to `dst`:`port` on a
/// raw socket (the kernel adds the IP header, with DF). Conntrack classes
/// it INVALID in every namespace that tracks it ("invalid tcp flag
/// combination", before any state or `nf_conntrack_tcp_loose` counts), so
/// a rule like `ct state invalid drop` on the way drops it; nothing else
/// tells it from the flow's traffic.
fn send_invalid(src: IpAddr, dst: IpAddr, port: u16) -> nix::Result<usize> {
    use nix::sys::socket::{
        bind, sendto, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType,
        SockaddrStorage,
    };
    use std::os::fd::AsRawFd;
    let family = if dst.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(family, SockType::Raw, SockFlag::empty(), SockProtocol::Tcp)?;
    let at = |ip: IpAddr| SockaddrStorage::from(SocketAddr::new(ip, 0));
    bind(fd.as_raw_fd(), &at(src))?;
    let segment = flagless_segment(src, dst, SOURCE_PORT, port);
    sendto(fd.as_raw_fd(), &segment, &at(dst), MsgFlags::empty())
}

/// The invalid probe's source port (any port: no socket owns the flow).
const SOURCE_PORT: u16 = 40_999;

/// A 20-byte TCP header with no flags set, its checksum over the
/// pseudo-header of `src` and `dst`.
pub fn flagless_segment(src: IpAddr, dst: IpAddr, sport: u16, dport: u16) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&1u32.to_be_bytes());
    h[12] = 5 << 4; // data offset: 5 words, no options; flags (h[13]) none
    h[14..16].copy_from_slice(&1024u16.to_be_bytes());
    let addresses = |ip: IpAddr| match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut pseudo = addresses(src);
    pseudo.extend(addresses(dst));
    // Protocol 6 and the segment's length, as both families' pseudo-headers
    // add them up (the words' order does not change the sum).
    pseudo.extend([0, 6, 0, h.len() as u8]);
    let sum = checksum(&pseudo, &h);
    h[16..18].copy_from_slice(&sum.to_be_bytes());
    h
}

/// The Internet checksum over `a` then `b` (each of even length).
fn checksum(a: &[u8], b: &[u8]) -> u16 {
    let mut sum: u32 = a
        .chunks(2)
        .chain(b.chunks(2))
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment's checksum verifies: the sum over the pseudo-header and
    /// the segment, checksum included, is all ones (RFC 1071), in both
    /// families, and the segment has no flag set.
    #[test]
    fn the_invalid_segment_has_no_flags_and_a_checksum_that_verifies() {
        for (src, dst) in [
            ("10.244.1.2", "10.244.2.2"),
            ("fd00:10:244:1::2", "fd00:10:244:2::2"),
        ] {
            let (src, dst): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            let seg = flagless_segment(src, dst, 40_999, 7777);
            assert_eq!(seg[13], 0, "no flags");
            assert_eq!(u16::from_be_bytes([seg[2], seg[3]]), 7777);
            let mut pseudo: Vec<u8> = Vec::new();
            for ip in [src, dst] {
                match ip {
                    IpAddr::V4(a) => pseudo.extend(a.octets()),
                    IpAddr::V6(a) => pseudo.extend(a.octets()),
                }
            }
            pseudo.extend([0, 6, 0, 20]);
            assert_eq!(checksum(&pseudo, &seg), 0, "{src} -> {dst}");
            let mut broken = seg;
            broken[4] ^= 1;
            assert_ne!(checksum(&pseudo, &broken), 0);
        }
    }
}
