//! `CniResult::to_version` over every supported version: the converted
//! result serializes and parses back to itself, conversion is idempotent,
//! going through 1.1.0 first changes nothing, and each version's shape
//! holds (`"version"` on IPs exactly below 1.0.0, no 1.1.0-only fields
//! below 1.1.0).

#![no_main]

use cnilab_net::spec::{CniResult, ErrorBody, Version, SUPPORTED_VERSIONS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = serde_json::from_slice::<ErrorBody>(data) {
        let text = serde_json::to_string(&body).expect("error body serializes");
        let back: ErrorBody = serde_json::from_str(&text).expect("error body parses back");
        assert_eq!(back, body);
    }
    let Ok(result) = serde_json::from_slice::<CniResult>(data) else {
        return;
    };
    let newest = result.to_version(Version::V1_1_0);
    for text in SUPPORTED_VERSIONS {
        let v = Version::parse(text).expect("supported versions parse");
        let out = result.to_version(v);
        assert_eq!(out.cni_version, *text);
        assert_eq!(
            out.to_version(v),
            out,
            "conversion to {text} is not idempotent"
        );
        assert_eq!(
            newest.to_version(v),
            out,
            "1.1.0 then {text} differs from {text}"
        );
        for ip in &out.ips {
            let want = (v < Version::V1_0_0).then(|| {
                if ip.address.addr().is_ipv4() {
                    "4"
                } else {
                    "6"
                }
                .to_string()
            });
            assert_eq!(ip.version, want, "ips[].version in {text}");
        }
        if v < Version::V1_1_0 {
            for i in &out.interfaces {
                assert!(i.mtu.is_none() && i.socket_path.is_none() && i.pci_id.is_none());
            }
            for r in &out.routes {
                assert!(r.mtu.is_none() && r.advmss.is_none() && r.priority.is_none());
                assert!(r.table.is_none() && r.scope.is_none());
            }
        }
        let json = serde_json::to_string(&out).expect("result serializes");
        let back: CniResult = serde_json::from_str(&json).expect("result parses back");
        assert_eq!(back, out, "JSON round trip of the {text} result");
    }
});
