//! nftables over netlink, for the one thing done once per pod: adding and
//! removing elements of an existing set, and asking whether a set (or any
//! table: a capture and a firewall snapshot skip `nft` where there is
//! none) exists.
//! One `NETLINK_NETFILTER` socket in the caller's namespace, one atomic
//! batch (`NFNL_MSG_BATCH_BEGIN` … `END`) per change, no process. Creating
//! tables, chains and rules stays with `nft -f -` ([`crate::nft`]): that
//! happens once per node and config, not per pod.
//!
//! The wire format (linux/netfilter/nfnetlink.h, nf_tables.h) is written
//! by hand: a few fixed headers and attributes. The framing helpers
//! (`frame`, `put_attr`, `split`, `errno_of`) also serve
//! `netns::forwarding`'s one `RTM_GETNETCONF`, which the rtnetlink crate
//! does not speak.

use nix::sys::socket::{
    bind, recv, send, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType,
};
use nix::sys::time::TimeVal;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_ROOT | NLM_F_MATCH`: every object.
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
/// `NFPROTO_INET`: the `inet` family (IPv4 and IPv6 in one table).
pub const FAMILY_INET: u8 = 1;
// NFTA_SET_ELEM_LIST_*, NFTA_SET_*, NFTA_LIST_ELEM, NFTA_SET_ELEM_KEY,
// NFTA_DATA_VALUE: each is attribute 1 or 2 of its level.
const LIST_TABLE: u16 = 1;
const LIST_SET: u16 = 2;
const LIST_ELEMENTS: u16 = 3;
const LIST_ELEM: u16 = 1;
const ELEM_KEY: u16 = 1;
const DATA_VALUE: u16 = 1;

/// What to do with a set's elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementOp {
    /// Add (an element already there is not an error).
    Add,
    /// Delete (an element not there makes the kernel refuse the batch).
    Delete,
}

/// One change to one set.
#[derive(Clone, Debug)]
pub struct SetChange<'a> {
    pub table: &'a str,
    pub set: &'a str,
    pub op: ElementOp,
    pub elements: &'a [IpAddr],
}

pub(crate) fn align4(n: usize) -> usize {
    (n + 3) & !3
}

pub(crate) fn put_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    buf.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(align4(buf.len()), 0);
}

fn put_str(buf: &mut Vec<u8>, kind: u16, s: &str) {
    let mut z = s.as_bytes().to_vec();
    z.push(0);
    put_attr(buf, kind, &z);
}

/// A nested attribute whose body `fill` writes.
fn put_nested(buf: &mut Vec<u8>, kind: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    fill(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
}

/// One netlink message: the `nlmsghdr` (port 0: the kernel), then `body`.
pub(crate) fn frame(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(16 + body.len());
    m.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(body);
    m
}

/// One nfnetlink message: header, `nfgenmsg`, attributes.
fn message(kind: u16, flags: u16, seq: u32, family: u8, res_id: u16, attrs: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(4 + attrs.len());
    body.push(family);
    body.push(0); // NFNETLINK_V0
    body.extend_from_slice(&res_id.to_be_bytes());
    body.extend_from_slice(attrs);
    frame(kind, flags, seq, &body)
}

fn nft_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The batch that applies `changes` atomically (in order), every change
/// acknowledged; returns it and how many acknowledgements to expect.
pub fn batch(family: u8, changes: &[SetChange<'_>]) -> (Vec<u8>, usize) {
    let mut out = message(
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        1,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    let mut acks = 0;
    for (i, change) in changes
        .iter()
        .filter(|c| !c.elements.is_empty())
        .enumerate()
    {
        let mut attrs = Vec::new();
        put_str(&mut attrs, LIST_TABLE, change.table);
        put_str(&mut attrs, LIST_SET, change.set);
        put_nested(&mut attrs, LIST_ELEMENTS, |b| {
            for ip in change.elements {
                put_nested(b, LIST_ELEM, |b| {
                    put_nested(b, ELEM_KEY, |b| put_attr(b, DATA_VALUE, &ip_bytes(ip)));
                });
            }
        });
        let (kind, flags) = match change.op {
            ElementOp::Add => (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK),
            ElementOp::Delete => (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK),
        };
        out.extend(message(
            nft_type(kind),
            flags,
            2 + i as u32,
            family,
            0,
            &attrs,
        ));
        acks += 1;
    }
    let end_seq = 2 + acks as u32;
    out.extend(message(
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        end_seq,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    ));
    (out, acks)
}

/// A netfilter netlink socket in the caller's namespace.
pub struct Socket {
    fd: OwnedFd,
}

impl Socket {
    pub fn open() -> io::Result<Socket> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        // Never wait for ever on a kernel answer.
        setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(5, 0))?;
        Ok(Socket { fd })
    }

    /// Applies `changes` in one atomic batch. An error names the kernel's
    /// errno (`ENOENT`: the table or set does not exist; the batch changed
    /// nothing).
    pub fn apply(&self, family: u8, changes: &[SetChange<'_>]) -> io::Result<()> {
        let (bytes, acks) = batch(family, changes);
        if acks == 0 {
            return Ok(());
        }
        send(self.fd.as_raw_fd(), &bytes, MsgFlags::empty())?;
        let mut first_error = None;
        let mut seen = 0;
        while seen < acks {
            for (kind, body) in self.receive()? {
                if kind == NLMSG_ERROR {
                    seen += 1;
                    if let Some(e) = errno_of(&body).filter(|e| *e != 0) {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(io::Error::from_raw_os_error(e)),
        }
    }

    /// Whether `set` exists in `table` (of `family`).
    pub fn set_exists(&self, family: u8, table: &str, set: &str) -> io::Result<bool> {
        let mut attrs = Vec::new();
        put_str(&mut attrs, LIST_TABLE, table);
        put_str(&mut attrs, LIST_SET, set);
        let msg = message(
            nft_type(NFT_MSG_GETSET),
            NLM_F_REQUEST | NLM_F_ACK,
            1,
            family,
            0,
            &attrs,
        );
        send(self.fd.as_raw_fd(), &msg, MsgFlags::empty())?;
        let mut found = false;
        loop {
            for (kind, body) in self.receive()? {
                if kind == nft_type(NFT_MSG_NEWSET) {
                    found = true;
                } else if kind == NLMSG_ERROR {
                    return match errno_of(&body) {
                        Some(0) => Ok(found),
                        Some(e) if e == nix::libc::ENOENT => Ok(false),
                        Some(e) => Err(io::Error::from_raw_os_error(e)),
                        None => Err(io::Error::other("short netlink error message")),
                    };
                }
            }
        }
    }

    /// Whether the namespace has any nftables table (of any family:
    /// iptables-nft's included), by one `NFT_MSG_GETTABLE` dump: what
    /// `nft list ruleset` would print nothing for, without running it.
    pub fn has_tables(&self) -> io::Result<bool> {
        let msg = message(
            nft_type(NFT_MSG_GETTABLE),
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            0, // NFPROTO_UNSPEC: every family
            0,
            &[],
        );
        send(self.fd.as_raw_fd(), &msg, MsgFlags::empty())?;
        let mut found = false;
        loop {
            for (kind, body) in self.receive()? {
                if kind == nft_type(NFT_MSG_NEWTABLE) {
                    found = true;
                } else if kind == NLMSG_DONE {
                    return Ok(found);
                } else if kind == NLMSG_ERROR {
                    return match errno_of(&body) {
                        Some(0) => Ok(found),
                        Some(e) => Err(io::Error::from_raw_os_error(e)),
                        None => Err(io::Error::other("short netlink error message")),
                    };
                }
            }
        }
    }

    /// One datagram, split into (type, body after the header) messages.
    fn receive(&self) -> io::Result<Vec<(u16, Vec<u8>)>> {
        let mut buf = vec![0u8; 16384];
        let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        Ok(split(&buf[..n]))
    }
}

/// Whether the calling thread's namespace has any nftables table (one
/// netlink dump, no process); `true` when it cannot tell, so that `nft`
/// runs and says why.
pub fn any_table_here() -> bool {
    Socket::open().and_then(|s| s.has_tables()).unwrap_or(true)
}

/// Netlink messages of one datagram: (type, body).
pub(crate) fn split(mut data: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    while data.len() >= 16 {
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if len < 16 || len > data.len() {
            break;
        }
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        out.push((kind, data[16..len].to_vec()));
        data = &data[align4(len).min(data.len())..];
    }
    out
}

/// The positive errno of an `NLMSG_ERROR` body (0: an acknowledgement).
pub(crate) fn errno_of(body: &[u8]) -> Option<i32> {
    let raw: [u8; 4] = body.get(..4)?.try_into().ok()?;
    Some(-i32::from_ne_bytes(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_frames_one_acknowledged_message_per_change() {
        let v4: Vec<IpAddr> = vec!["10.1.0.5".parse().expect("ip")];
        let changes = [
            SetChange {
                table: "t",
                set: "pods4",
                op: ElementOp::Add,
                elements: &v4,
            },
            SetChange {
                table: "t",
                set: "pods6",
                op: ElementOp::Add,
                elements: &[],
            },
            SetChange {
                table: "t",
                set: "pods4",
                op: ElementOp::Delete,
                elements: &v4,
            },
        ];
        let (bytes, acks) = batch(FAMILY_INET, &changes);
        assert_eq!(acks, 2, "the empty change sends nothing");
        let msgs = split(&bytes);
        let kinds: Vec<u16> = msgs.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                NFNL_MSG_BATCH_BEGIN,
                nft_type(NFT_MSG_NEWSETELEM),
                nft_type(NFT_MSG_DELSETELEM),
                NFNL_MSG_BATCH_END
            ]
        );
        // Begin: nfgenmsg with res_id = the nftables subsystem, big-endian.
        assert_eq!(msgs[0].1, [0, 0, 0, 10]);
        let add = &msgs[1].1;
        assert_eq!(add[0], FAMILY_INET);
        let body = &add[4..];
        assert!(body.windows(6).any(|w| w == b"pods4\0"));
        assert!(
            body.windows(8).any(|w| w == [8, 0, 1, 0, 10, 1, 0, 5]),
            "the address as NFTA_DATA_VALUE"
        );
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(errno_of(&(-2i32).to_ne_bytes()), Some(2));
        assert_eq!(errno_of(&[0, 0]), None);
    }
}
