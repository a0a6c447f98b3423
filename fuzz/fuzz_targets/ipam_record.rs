//! `ipam::parse_record` on arbitrary record files: no panic, a record never
//! has an empty container ID or a line break inside a field, and what the
//! store writes (`id\r\nifname`, for every valid ID and ifname) parses back
//! to exactly that, also with the `\n` endings older host-local wrote.

#![no_main]

use cnilab_plugin::ipam::parse_record;
use cnilab_net::spec::{check_ifname, valid_container_id};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let ip = if selector & 1 == 0 {
        IpAddr::V4(Ipv4Addr::new(10, 0, selector, 7))
    } else {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(selector)))
    };
    let content = String::from_utf8_lossy(rest);
    if let Some(r) = parse_record(ip, &content) {
        assert_eq!(r.ip, ip);
        assert!(!r.container_id.is_empty());
        for field in [&r.container_id, &r.ifname] {
            assert!(!field.contains('\n'), "line break inside {field:?}");
            assert_eq!(field.trim(), field.as_str(), "untrimmed {field:?}");
        }
    }
    // Split the input into an ID and an ifname; when both are valid, the
    // store's own format must round-trip.
    if let Some((id, ifname)) = content.split_once('|') {
        if valid_container_id(id) && check_ifname(ifname).is_ok() {
            for sep in ["\r\n", "\n"] {
                let r = parse_record(ip, &format!("{id}{sep}{ifname}"))
                    .expect("a record the store writes parses");
                assert_eq!((r.container_id.as_str(), r.ifname.as_str()), (id, ifname));
            }
        }
    }
});
