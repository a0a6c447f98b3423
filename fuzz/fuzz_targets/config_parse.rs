//! `config::parse` on arbitrary bytes: it must never panic, must answer
//! only with the documented codes, and a config it accepts must satisfy
//! everything ADD relies on without re-checking.

#![no_main]

use cnilab_plugin::config::{self, IpamPlan};
use cnilab_net::spec::{check_ifname, code, Version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The version sniffer runs on every input before anything else.
    let _ = config::sniff_version(data);
    match config::parse(data) {
        Err(e) => {
            assert!(
                [
                    code::DECODE_FAILURE,
                    code::INVALID_CONFIG,
                    code::INCOMPATIBLE_VERSION
                ]
                .contains(&e.code),
                "undocumented code {} for config parse: {}",
                e.code,
                e.msg
            );
            assert!(!e.msg.is_empty());
        }
        Ok(plan) => {
            assert!(plan.version >= Version::V0_3_0 && plan.version <= Version::V1_1_0);
            assert!(!plan.name.is_empty());
            assert!(!plan.name.contains('/') && !plan.name.contains('\0'));
            assert!(plan.name != "." && plan.name != "..");
            assert!(
                check_ifname(&plan.bridge).is_ok(),
                "bridge {:?}",
                plan.bridge
            );
            if let Some(mtu) = plan.mtu {
                assert!((68..=65535).contains(&mtu));
            }
            match &plan.ipam {
                IpamPlan::None => {}
                IpamPlan::Delegate { plugin } => {
                    assert!(!plugin.contains('/') && !plugin.starts_with('.'));
                }
                IpamPlan::Builtin(ipam) => {
                    // The store directory is dataDir joined with a name that
                    // cannot climb out of it.
                    assert_eq!(
                        ipam.store_dir.file_name().and_then(|n| n.to_str()),
                        Some(plan.name.as_str())
                    );
                    assert!(!ipam.range_sets.is_empty());
                    for set in &ipam.range_sets {
                        assert!(!set.is_empty());
                        let v4 = set[0].start.is_ipv4();
                        for r in set {
                            assert_eq!(r.start.is_ipv4(), v4, "one family per set");
                            assert_eq!(r.end.is_ipv4(), v4);
                            assert_eq!(r.gateway.is_ipv4(), v4);
                            assert!(cnilab_net::naming::to_u128(r.start) <= cnilab_net::naming::to_u128(r.end));
                            assert!(r.subnet.contains(&r.start) && r.subnet.contains(&r.end));
                            assert!(r.subnet.contains(&r.gateway));
                            assert_ne!(r.start, r.subnet.network(), "network address handed out");
                            if v4 {
                                assert_ne!(r.end, r.subnet.broadcast(), "broadcast handed out");
                            }
                            assert!(r.capacity() > 0);
                        }
                    }
                    let all: Vec<_> = ipam.range_sets.iter().flatten().collect();
                    for (i, a) in all.iter().enumerate() {
                        for b in &all[i + 1..] {
                            assert!(
                                !(a.contains(b.start) || a.contains(b.end) || b.contains(a.start)),
                                "overlapping ranges accepted"
                            );
                        }
                    }
                }
            }
        }
    }
});
