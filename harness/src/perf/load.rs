//! cnilab's own load generator: the four measurements of `lab perf`
//! (TCP stream, TCP request/response, TCP connect/request/close, UDP
//! stream), each a fixed-length window, between sockets made inside the
//! lab's namespaces. No process per measurement: a window of 200 ms is
//! worth measuring, where iperf3 counts whole seconds and a process start
//! would cost more than the window (`docs/src/perf.md` compares the
//! figures with iperf3's and sockperf's on the same path).
//!
//! One server per destination namespace answers all four on
//! [`PORT`] (TCP and UDP); a TCP connection says what it is with its
//! first byte. Sockets are made on a thread inside their namespace
//! ([`run_in`]) and the measuring runs on that thread too: blocking I/O,
//! never on a tokio worker.

use cnilab_net::netns::run_in;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The port the servers listen on (TCP and UDP): the lab's responder
/// port, so the lab's Services (kube-proxy's DNAT to port 7777) lead here.
pub const PORT: u16 = crate::lab::probe::PORT;

const STREAM: u8 = b'S';
const REQUEST_RESPONSE: u8 = b'R';
const CONNECT: u8 = b'C';
const UDP_COUNT: u8 = b'U';
/// A UDP datagram's size: fits a VXLAN pod MTU (1450) with its headers.
pub const DATAGRAM: usize = 1200;
/// How long a connection may stall before the measurement gives up.
const STALL: Duration = Duration::from_secs(3);

/// The servers of one namespace; stopped when dropped.
pub struct Server {
    stop: Arc<AtomicBool>,
    tcp: TcpListener,
    threads: Vec<JoinHandle<()>>,
}

/// A socket address on every address of its namespace: dual-stack where
/// the namespace has IPv6, else IPv4 only.
fn bind<S>(ns: &File, make: impl Fn(SocketAddr) -> io::Result<S> + Send + Sync) -> io::Result<S>
where
    S: Send,
{
    run_in(ns, move || {
        make(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), PORT))
            .or_else(|_| make(SocketAddr::from(([0, 0, 0, 0], PORT))))
    })?
}

impl Server {
    /// Starts the TCP and UDP servers inside `ns`.
    pub fn start(ns: &File) -> io::Result<Server> {
        let tcp = bind(ns, TcpListener::bind)?;
        let udp = bind(ns, UdpSocket::bind)?;
        udp.set_read_timeout(Some(Duration::from_millis(50)))?;
        let _ = nix::sys::socket::setsockopt(&udp, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
        let stop = Arc::new(AtomicBool::new(false));
        let counts: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
        let mut threads = Vec::new();
        let (s, c) = (Arc::clone(&stop), Arc::clone(&counts));
        threads.push(std::thread::spawn(move || count_datagrams(&udp, &s, &c)));
        let listener = tcp.try_clone()?;
        let s = Arc::clone(&stop);
        threads.push(std::thread::spawn(move || accept(&listener, &s, &counts)));
        Ok(Server { stop, tcp, threads })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocked accept (Linux: EINVAL on a listener shut down).
        let _ = nix::sys::socket::shutdown(self.tcp.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Counts the datagrams of each UDP run (by the run's id) until stopped.
fn count_datagrams(udp: &UdpSocket, stop: &AtomicBool, counts: &Mutex<HashMap<u64, u64>>) {
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::SeqCst) {
        let Ok(n) = udp.recv(&mut buf) else { continue };
        if n < 8 {
            continue;
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&buf[..8]);
        if let Ok(mut c) = counts.lock() {
            *c.entry(u64::from_be_bytes(id)).or_default() += 1;
        }
    }
}

/// Accepts until stopped. A connect/request/close is answered here (a
/// thread per connection would cost more than the connection); a stream
/// or a request/response connection gets a thread of its own.
fn accept(listener: &TcpListener, stop: &AtomicBool, counts: &Mutex<HashMap<u64, u64>>) {
    while !stop.load(Ordering::SeqCst) {
        let Ok((mut conn, _)) = listener.accept() else {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            continue;
        };
        let _ = conn.set_read_timeout(Some(STALL));
        let _ = conn.set_nodelay(true);
        let mut mode = [0u8; 1];
        if conn.read_exact(&mut mode).is_err() {
            continue;
        }
        match mode[0] {
            CONNECT => {
                let _ = conn.write_all(&[1]);
            }
            UDP_COUNT => {
                let mut id = [0u8; 8];
                if conn.read_exact(&mut id).is_ok() {
                    let got = counts
                        .lock()
                        .ok()
                        .and_then(|mut c| c.remove(&u64::from_be_bytes(id)))
                        .unwrap_or(0);
                    let _ = conn.write_all(&got.to_be_bytes());
                }
            }
            STREAM => {
                std::thread::spawn(move || sink(conn));
            }
            REQUEST_RESPONSE => {
                std::thread::spawn(move || echo(conn));
            }
            _ => {}
        }
    }
}

/// A stream's receiving end: counts bytes to the end, then says how many.
fn sink(mut conn: TcpStream) {
    let mut buf = vec![0u8; 256 << 10];
    let mut total: u64 = 0;
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(_) => return,
        }
    }
    let _ = conn.write_all(&total.to_be_bytes());
}

/// A request/response connection's server: one byte back for each.
fn echo(mut conn: TcpStream) {
    let mut b = [0u8; 1];
    while conn.read_exact(&mut b).is_ok() {
        if conn.write_all(&b).is_err() {
            return;
        }
    }
}

/// A client's measurement, on a thread inside `ns`. The threads are not
/// pinned to CPUs: pinning the client to one CPU and the servers to the
/// other doubled the spread of the ratios here (docs/src/perf.md).
fn client<R: Send>(ns: &File, f: impl FnOnce() -> io::Result<R> + Send) -> io::Result<R> {
    run_in(ns, f)?
}

fn connect(dst: SocketAddr) -> io::Result<TcpStream> {
    let conn = TcpStream::connect_timeout(&dst, STALL)?;
    conn.set_read_timeout(Some(STALL))?;
    conn.set_write_timeout(Some(STALL))?;
    Ok(conn)
}

/// TCP stream for `window`: bits per second the server received.
pub fn stream(ns: &File, dst: SocketAddr, window: Duration) -> io::Result<f64> {
    client(ns, || {
        let mut conn = connect(dst)?;
        conn.write_all(&[STREAM])?;
        let buf = vec![0x5au8; 128 << 10];
        let start = Instant::now();
        while start.elapsed() < window {
            conn.write_all(&buf)?;
        }
        conn.shutdown(Shutdown::Write)?;
        let mut got = [0u8; 8];
        conn.read_exact(&mut got)?;
        let secs = start.elapsed().as_secs_f64();
        Ok(u64::from_be_bytes(got) as f64 * 8.0 / secs)
    })
}

/// TCP request/response (one byte each way, one connection) for
/// `window`: every round trip's time.
pub fn request_response(ns: &File, dst: SocketAddr, window: Duration) -> io::Result<Vec<Duration>> {
    client(ns, || {
        let mut conn = connect(dst)?;
        conn.set_nodelay(true)?;
        conn.write_all(&[REQUEST_RESPONSE])?;
        let mut times = Vec::new();
        let mut b = [7u8; 1];
        let start = Instant::now();
        while start.elapsed() < window {
            let t = Instant::now();
            conn.write_all(&b)?;
            conn.read_exact(&mut b)?;
            times.push(t.elapsed());
        }
        Ok(times)
    })
}

/// TCP connect/request/close for `window`: connections per second.
pub fn connect_rate(ns: &File, dst: SocketAddr, window: Duration) -> io::Result<f64> {
    client(ns, || {
        let mut done = 0u64;
        let start = Instant::now();
        while start.elapsed() < window {
            let mut conn = connect(dst)?;
            conn.set_nodelay(true)?;
            conn.write_all(&[CONNECT])?;
            let mut b = [0u8; 1];
            conn.read_exact(&mut b)?;
            // Closed with a reset (linger 0), so that no end keeps the
            // connection in TIME_WAIT: with thousands a second, a SYN
            // reusing a port found the server's TIME_WAIT and waited a
            // second for its retransmission, and the rate halved at random.
            nix::sys::socket::setsockopt(
                &conn,
                nix::sys::socket::sockopt::Linger,
                &nix::libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                },
            )?;
            done += 1;
        }
        Ok(done as f64 / start.elapsed().as_secs_f64())
    })
}

/// What a UDP stream lost.
#[derive(Clone, Copy, Debug)]
pub struct Datagrams {
    pub sent: u64,
    pub received: u64,
}

impl Datagrams {
    /// The share lost, in percent.
    pub fn loss_percent(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        100.0 * self.sent.saturating_sub(self.received) as f64 / self.sent as f64
    }
}

/// A run id no other UDP stream of this process has.
fn run_id() -> u64 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    (u64::from(std::process::id()) << 32) | NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A UDP stream at `bits_per_sec` for `window`, paced each millisecond,
/// then the server asked (over TCP) how many it received.
pub fn udp(
    ns: &File,
    dst: SocketAddr,
    bits_per_sec: f64,
    window: Duration,
) -> io::Result<Datagrams> {
    client(ns, || {
        let any: SocketAddr = if dst.is_ipv6() {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
        } else {
            SocketAddr::from(([0, 0, 0, 0], 0))
        };
        let sock = UdpSocket::bind(any)?;
        sock.connect(dst)?;
        let id = run_id();
        let mut payload = vec![0u8; DATAGRAM];
        payload[..8].copy_from_slice(&id.to_be_bytes());
        let per_sec = bits_per_sec / (DATAGRAM as f64 * 8.0);
        let mut sent = 0u64;
        let start = Instant::now();
        loop {
            let elapsed = start.elapsed();
            if elapsed >= window {
                break;
            }
            let due = (elapsed.as_secs_f64() * per_sec) as u64;
            while sent < due {
                // A full socket buffer (ENOBUFS) is loss on our side of
                // the path: counted as sent, as iperf3 counts it.
                let _ = sock.send(&payload);
                sent += 1;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        // The last datagrams' way across.
        std::thread::sleep(Duration::from_millis(20));
        let mut conn = connect(dst)?;
        conn.write_all(&[UDP_COUNT])?;
        conn.write_all(&id.to_be_bytes())?;
        let mut got = [0u8; 8];
        conn.read_exact(&mut got)?;
        Ok(Datagrams {
            sent,
            received: u64::from_be_bytes(got),
        })
    })
}
