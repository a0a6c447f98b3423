//! What runs in a namespace's datapath beside the kernel's tables and
//! cannot be replayed: eBPF programs on a link's XDP hook, and tc filters
//! (a `bpf` filter is how Cilium and Calico's eBPF mode attach; any tc
//! filter is outside the model). The reader records them so a capture says
//! they were there; `apply` makes none of them and lists each as not made,
//! with what that means for a verdict.

use super::{Hook, Qdisc};
use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached};
use rtnetlink::packet_route::tc::TcAttribute;

/// The XDP programs and tc filters of the namespace behind `h`, by link:
/// XDP from the namespace's link dump `links`, tc filters asked only of the
/// links whose `qdiscs` include an `ingress` or `clsact` one (the only
/// places a filter on those hooks can hang), so a namespace without them
/// costs no request. `name_of`: a link's name by index.
pub(super) async fn read(
    h: &rtnetlink::Handle,
    links: &[LinkMessage],
    qdiscs: &[Qdisc],
    name_of: &impl Fn(u32) -> Option<String>,
) -> Result<Vec<Hook>, rtnetlink::Error> {
    let mut out = Vec::new();
    for m in links {
        let dev = name_of(m.header.index).unwrap_or_default();
        for a in &m.attributes {
            if let LinkAttribute::Xdp(xdp) = a {
                if let Some(hook) = xdp_hook(&dev, xdp) {
                    out.push(hook);
                }
            }
        }
        let hooked = qdiscs
            .iter()
            .filter(|q| q.dev == dev)
            .find(|q| q.kind == "clsact" || q.kind == "ingress");
        let (Some(q), Ok(index)) = (hooked, i32::try_from(m.header.index)) else {
            continue;
        };
        let sides: &[(&str, bool)] = match q.kind.as_str() {
            "clsact" => &[("tc ingress", true), ("tc egress", false)],
            _ => &[("tc ingress", true)],
        };
        for &(side, ingress) in sides {
            let req = h.traffic_filter(index).get();
            let req = if ingress { req.ingress() } else { req.egress() };
            // A link without a clsact or ingress qdisc has no such hook.
            let Ok(filters) = req.execute().try_collect::<Vec<_>>().await else {
                continue;
            };
            let mut kinds: Vec<String> = filters
                .iter()
                .filter_map(|f| {
                    f.attributes.iter().find_map(|a| match a {
                        TcAttribute::Kind(k) => Some(k.clone()),
                        _ => None,
                    })
                })
                .collect();
            kinds.dedup();
            out.extend(kinds.into_iter().map(|kind| Hook {
                dev: dev.clone(),
                hook: side.to_string(),
                kind,
                program: None,
            }));
        }
    }
    Ok(out)
}

/// The XDP program attached to `dev`, if any: its mode and program id.
fn xdp_hook(dev: &str, xdp: &[LinkXdp]) -> Option<Hook> {
    let mode = xdp.iter().find_map(|x| match x {
        LinkXdp::Attached(XdpAttached::None) => None,
        LinkXdp::Attached(XdpAttached::Driver) => Some("driver"),
        LinkXdp::Attached(XdpAttached::SocketBuffer) => Some("generic"),
        LinkXdp::Attached(XdpAttached::Hardware) => Some("offload"),
        LinkXdp::Attached(_) => Some("multi"),
        _ => None,
    })?;
    let program = xdp.iter().find_map(|x| match x {
        LinkXdp::ProgId(id) => Some(*id),
        _ => None,
    });
    Some(Hook {
        dev: dev.to_string(),
        hook: "xdp".into(),
        kind: mode.into(),
        program,
    })
}

/// Why a replay does not make `hook`: for `apply`'s not-made list.
pub(crate) fn not_replayed(hook: &Hook) -> (String, String) {
    let what = match hook.hook.as_str() {
        "xdp" => format!(
            "link {}: XDP program{} ({} mode)",
            hook.dev,
            hook.program.map(|p| format!(" id {p}")).unwrap_or_default(),
            hook.kind
        ),
        side => format!("link {}: {side} filter {}", hook.dev, hook.kind),
    };
    let why = if hook.hook == "xdp" || hook.kind == "bpf" {
        "an eBPF program: a replay makes the kernel's tables only, so its verdicts do not cover what the program does (an eBPF datapath such as Cilium's)"
    } else {
        "a tc filter is outside the model: a replay does not make it, and its verdicts do not cover what it does"
    };
    (what, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xdp_attachment_names_its_mode_and_program() {
        let xdp = vec![
            LinkXdp::Attached(XdpAttached::SocketBuffer),
            LinkXdp::ProgId(42),
        ];
        let hook = xdp_hook("eth0", &xdp).expect("attached");
        assert_eq!((hook.kind.as_str(), hook.program), ("generic", Some(42)));
        let (what, why) = not_replayed(&hook);
        assert_eq!(what, "link eth0: XDP program id 42 (generic mode)");
        assert!(why.contains("verdicts do not cover"), "{why}");
        assert!(xdp_hook("eth0", &[LinkXdp::Attached(XdpAttached::None)]).is_none());
        let tc = Hook {
            dev: "lxc1".into(),
            hook: "tc ingress".into(),
            kind: "u32".into(),
            program: None,
        };
        assert_eq!(not_replayed(&tc).0, "link lxc1: tc ingress filter u32");
        assert!(not_replayed(&tc).1.contains("outside the model"));
    }
}
