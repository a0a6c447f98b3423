//! What a plugin leaves on the host side: address reservations in a
//! host-local style store, and firewall rules.

// Firewall readings are part of what a namespace holds (cnilab_net::snapshot);
// re-exported so the soak and conform call sites keep their paths.
pub use cnilab_net::snapshot::{firewall_rules, new_lines};
use std::net::IpAddr;
use std::path::Path;

/// One reserved address in a host-local layout store
/// (`<dataDir>/<network>/<ip>` holding `containerID\r\nifname`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Reservation {
    pub ip: IpAddr,
    pub container_id: String,
    pub ifname: String,
}

/// Reads the reservations of a network's store directory. A missing
/// directory is an empty store.
pub fn reservations(dir: &Path) -> std::io::Result<Vec<Reservation>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Files other than addresses (lock, last_reserved_ip.N) are not records.
        let Ok(ip) = name.parse::<IpAddr>() else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let mut lines = text.split(['\r', '\n']).filter(|l| !l.is_empty());
        out.push(Reservation {
            ip,
            container_id: lines.next().unwrap_or("").trim().to_string(),
            ifname: lines.next().unwrap_or("").trim().to_string(),
        });
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_host_local_records_with_either_line_ending() {
        let dir = crate::util::ScratchDir::new("store-test").expect("scratch");
        std::fs::write(dir.path().join("10.0.0.2"), "c1\r\neth0").expect("write");
        std::fs::write(dir.path().join("fd00::2"), "c2\neth1\n").expect("write");
        std::fs::write(dir.path().join("lock"), "").expect("write");
        std::fs::write(dir.path().join("last_reserved_ip.0"), "10.0.0.2").expect("write");
        let r = reservations(dir.path()).expect("reads");
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].container_id, "c1");
        assert_eq!(r[0].ifname, "eth0");
        assert_eq!(r[1].ifname, "eth1");
        assert!(reservations(&dir.path().join("missing"))
            .expect("empty")
            .is_empty());
    }
}
