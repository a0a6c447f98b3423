//! A new namespace starts from the kernel's settings, not the host's.
//!
//! A new network namespace copies its IPv4 `conf/all` and `conf/default`
//! from the machine's initial namespace (`net.core.devconf_inherit_init_net`
//! 0, the default, and 1; with 3 from the creating namespace), IPv6's too
//! with 1 and 3, and its `lo` takes `conf/default`'s values as it appears.
//! A host that runs Docker, podman or a kubelet has `ip_forward = 1`; an
//! Ubuntu host has `rp_filter = 2`. Inherited, they change what a lab's
//! namespaces do (an external host that forwards, a pod path that loose
//! reverse-path filtering lets through), so a verdict would depend on the
//! host. Every namespace made here is therefore set to the kernel's own
//! values for the settings in [`SETTINGS`] right after it is made, before
//! anything else runs in it; the lab and the tests then set what they rely
//! on, on top.
//!
//! What differs is found once a process, in the first namespace it makes
//! (about 100 reads), and only the differing keys are written in every
//! later one: on a host at the kernel's values nothing is written. Where
//! namespaces inherit from their creator's (`devconf_inherit_init_net = 3`,
//! or a process that cannot read the mode) it is found in each.

use super::sysctl::{read_sysctl, write_sysctl};
use std::io;
use std::sync::OnceLock;

/// A setting of `net/<family>/conf/<dev>/<name>` and the kernel's value for
/// it in `all`, `default` and `lo` of a new namespace (Linux's
/// `ipv4_devconf`, `ipv4_devconf_dflt` and loopback's own, and the IPv6
/// equivalents). `forwarding` comes first: writing `all/forwarding` also
/// sets every device's and `default`'s.
pub struct Setting {
    pub family: &'static str,
    pub name: &'static str,
    pub all: &'static str,
    pub default: &'static str,
    pub lo: &'static str,
}

const fn v4(name: &'static str, all: &'static str, default: &'static str) -> Setting {
    Setting {
        family: "ipv4",
        name,
        all,
        default,
        lo: default,
    }
}

const fn v6(
    name: &'static str,
    all: &'static str,
    default: &'static str,
    lo: &'static str,
) -> Setting {
    Setting {
        family: "ipv6",
        name,
        all,
        default,
        lo,
    }
}

/// Every IPv4 `conf` setting, and the IPv6 ones a lab's datapath depends
/// on, with the kernel's values (read off a 6.x kernel whose host was left
/// at them).
pub const SETTINGS: &[Setting] = &[
    v4("forwarding", "0", "0"),
    v4("rp_filter", "0", "0"),
    v4("accept_local", "0", "0"),
    v4("route_localnet", "0", "0"),
    v4("proxy_arp", "0", "0"),
    v4("proxy_arp_pvlan", "0", "0"),
    v4("arp_filter", "0", "0"),
    v4("arp_ignore", "0", "0"),
    v4("arp_announce", "0", "0"),
    v4("arp_accept", "0", "0"),
    v4("arp_notify", "0", "0"),
    v4("drop_gratuitous_arp", "0", "0"),
    v4("drop_unicast_in_l2_multicast", "0", "0"),
    v4("bc_forwarding", "0", "0"),
    v4("src_valid_mark", "0", "0"),
    v4("accept_redirects", "1", "1"),
    v4("secure_redirects", "1", "1"),
    v4("send_redirects", "1", "1"),
    v4("shared_media", "1", "1"),
    v4("accept_source_route", "0", "1"),
    v4("log_martians", "0", "0"),
    v4("bootp_relay", "0", "0"),
    v4("promote_secondaries", "0", "0"),
    v4("ignore_routes_with_linkdown", "0", "0"),
    v4("arp_evict_nocarrier", "1", "1"),
    v6("forwarding", "0", "0", "0"),
    v6("accept_ra", "1", "1", "1"),
    v6("disable_ipv6", "0", "0", "0"),
    v6("accept_dad", "0", "1", "-1"),
    v6("autoconf", "1", "1", "1"),
    v6("accept_redirects", "1", "1", "1"),
    v6("proxy_ndp", "0", "0", "0"),
    v6("keep_addr_on_down", "0", "0", "0"),
    v6("accept_source_route", "0", "0", "0"),
];

/// The keys of the calling thread's namespace that differ from the kernel's
/// values, with the value each should have. A key this kernel lacks (no
/// IPv6, an older kernel) is passed over.
pub fn inherited_differences() -> io::Result<Vec<(String, &'static str)>> {
    let mut out = Vec::new();
    for s in SETTINGS {
        for (dev, want) in [("all", s.all), ("default", s.default), ("lo", s.lo)] {
            let key = format!("net/{}/conf/{dev}/{}", s.family, s.name);
            match read_sysctl(None, &key) {
                Ok(have) if have != want => out.push((key, want)),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(out)
}

/// Sets the calling thread's namespace to the kernel's values wherever it
/// differs from them (found anew).
pub fn reset_to_kernel_values() -> io::Result<()> {
    write_all(&inherited_differences()?)
}

/// Whether every namespace this process makes inherits the same settings:
/// true with `net.core.devconf_inherit_init_net` 0 or 1 (copied from the
/// initial namespace) and 2 (the kernel's values); false with 3 (copied
/// from the creating thread's namespace) and where the key cannot be read
/// (it exists only in the initial namespace: a process in a container).
/// Read once, before the first namespace is made, in the caller's.
pub(super) fn inherits_alike() -> bool {
    static ALIKE: OnceLock<bool> = OnceLock::new();
    *ALIKE.get_or_init(|| {
        read_sysctl(None, "net/core/devconf_inherit_init_net")
            .is_ok_and(|mode| matches!(mode.as_str(), "0" | "1" | "2"))
    })
}

/// [`reset_to_kernel_values`] for a namespace just made. Where every new
/// namespace inherits alike (`alike`, from [`inherits_alike`]), the keys to
/// write are found in the first one and reused; else they are found in
/// each. Runs on the thread that made the namespace, inside it.
pub(super) fn reset_inherited(alike: bool) -> io::Result<()> {
    static WRITES: OnceLock<Vec<(String, &'static str)>> = OnceLock::new();
    if !alike {
        return reset_to_kernel_values();
    }
    let writes = match WRITES.get() {
        Some(w) => w,
        None => {
            let found = inherited_differences()?;
            WRITES.get_or_init(|| found)
        }
    };
    write_all(writes)
}

fn write_all(writes: &[(String, &'static str)]) -> io::Result<()> {
    for (key, value) in writes {
        match write_sysctl(None, key, value) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
}
