//! The reconcile plan, table-driven: nodes + routes in the kernel → actions.

use cnilab_agent::nodes::NodeInfo;
use cnilab_agent::plan::{plan, InstalledRoute, NodeRoute, RouteAction, Warning};
use ipnet::IpNet;
use rstest::rstest;
use std::net::IpAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn net(s: &str) -> IpNet {
    s.parse().expect("test network")
}

/// `node("b", &["10.0.0.2"], &["10.244.2.0/24"])`
fn node(name: &str, ips: &[&str], cidrs: &[&str]) -> NodeInfo {
    let ips: Vec<IpAddr> = ips.iter().map(|s| ip(s)).collect();
    let cidrs: Vec<IpNet> = cidrs.iter().map(|s| net(s)).collect();
    NodeInfo::new(name, &ips, &cidrs)
}

/// Wide enough for every table above: these tests are about the other rules.
fn cluster() -> Vec<IpNet> {
    vec![net("10.0.0.0/8"), net("fd00::/8")]
}

fn own(dst: &str, gateway: &str) -> InstalledRoute {
    InstalledRoute {
        dst: net(dst),
        gateway: Some(ip(gateway)),
        priority: 0,
        ours: true,
    }
}

fn foreign(dst: &str, gateway: Option<&str>) -> InstalledRoute {
    InstalledRoute {
        dst: net(dst),
        gateway: gateway.map(ip),
        priority: 0,
        ours: false,
    }
}

fn route(dst: &str, gateway: &str) -> NodeRoute {
    NodeRoute {
        dst: net(dst),
        gateway: ip(gateway),
    }
}

fn add(dst: &str, gateway: &str) -> RouteAction {
    RouteAction::Add(route(dst, gateway))
}

fn a() -> NodeInfo {
    node(
        "a",
        &["10.0.0.1", "fd00::1"],
        &["10.244.1.0/24", "fd00:10:244:1::/64"],
    )
}

fn b() -> NodeInfo {
    node("b", &["10.0.0.2"], &["10.244.2.0/24"])
}

fn c() -> NodeInfo {
    node("c", &["10.0.0.3"], &["10.244.3.0/24"])
}

/// Host routes that are always there and never ours.
fn host_routes() -> Vec<InstalledRoute> {
    vec![
        foreign("0.0.0.0/0", Some("10.0.0.254")),
        foreign("10.0.0.0/24", None),
        foreign("10.244.1.0/24", None),
    ]
}

#[rstest]
#[case::first_start(vec![a(), b(), c()], vec![], vec![add("10.244.2.0/24", "10.0.0.2"), add("10.244.3.0/24", "10.0.0.3")])]
#[case::steady_state_changes_nothing(vec![a(), b(), c()], vec![own("10.244.2.0/24", "10.0.0.2"), own("10.244.3.0/24", "10.0.0.3")], vec![])]
#[case::join(vec![a(), b(), c()], vec![own("10.244.2.0/24", "10.0.0.2")], vec![add("10.244.3.0/24", "10.0.0.3")])]
#[case::leave(vec![a(), b()], vec![own("10.244.2.0/24", "10.0.0.2"), own("10.244.3.0/24", "10.0.0.3")], vec![RouteAction::Delete(own("10.244.3.0/24", "10.0.0.3"))])]
#[case::pod_cidr_change(
    vec![a(), node("b", &["10.0.0.2"], &["10.244.9.0/24"])],
    vec![own("10.244.2.0/24", "10.0.0.2")],
    vec![RouteAction::Delete(own("10.244.2.0/24", "10.0.0.2")), add("10.244.9.0/24", "10.0.0.2")],
)]
#[case::internal_ip_change(
    vec![a(), node("b", &["10.0.0.22"], &["10.244.2.0/24"])],
    vec![own("10.244.2.0/24", "10.0.0.2")],
    vec![RouteAction::Replace { old: own("10.244.2.0/24", "10.0.0.2"), new: route("10.244.2.0/24", "10.0.0.22") }],
)]
#[case::dual_stack(
    vec![a(), node("d", &["10.0.0.4", "fd00::4"], &["10.244.4.0/24", "fd00:10:244:4::/64"])],
    vec![],
    vec![add("10.244.4.0/24", "10.0.0.4"), add("fd00:10:244:4::/64", "fd00::4")],
)]
#[case::foreign_route_to_a_removed_cidr_is_left_alone(
    vec![a(), b()],
    vec![foreign("10.244.3.0/24", Some("10.0.0.3")), own("10.244.2.0/24", "10.0.0.2")],
    vec![],
)]
#[case::own_node_is_never_routed(vec![a()], vec![], vec![])]
#[case::duplicate_own_routes_keep_the_right_one(
    vec![a(), b()],
    vec![own("10.244.2.0/24", "10.0.0.9"), own("10.244.2.0/24", "10.0.0.2")],
    vec![RouteAction::Delete(own("10.244.2.0/24", "10.0.0.9"))],
)]
fn plans(
    #[case] nodes: Vec<NodeInfo>,
    #[case] ours: Vec<InstalledRoute>,
    #[case] expected: Vec<RouteAction>,
) {
    let mut installed = host_routes();
    installed.extend(ours);
    let result = plan("a", &nodes, &installed, &cluster());
    assert_eq!(result.actions, expected);
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);
}

#[test]
fn a_foreign_route_on_a_wanted_destination_wins_and_is_reported() {
    let installed = vec![foreign("10.244.2.0/24", Some("10.0.0.77"))];
    let result = plan("a", &[a(), b()], &installed, &cluster());
    assert_eq!(result.actions, vec![]);
    assert!(matches!(
        result.warnings.as_slice(),
        [Warning::ForeignRouteConflict { .. }]
    ));
}

#[rstest]
#[case::nat_address_shared_by_every_vm(
    vec![node("a", &["10.0.2.15"], &["10.244.1.0/24"]), node("b", &["10.0.2.15"], &["10.244.2.0/24"])],
    vec![],
    "claimed by several nodes",
)]
#[case::nat_address_on_one_node_is_used_but_reported(
    vec![a(), node("b", &["10.0.2.15"], &["10.244.2.0/24"])],
    vec![route("10.244.2.0/24", "10.0.2.15")],
    "NAT address",
)]
#[case::v6_cidr_without_v6_internal_ip(
    vec![a(), node("b", &["10.0.0.2"], &["10.244.2.0/24", "fd00:10:244:2::/64"])],
    vec![route("10.244.2.0/24", "10.0.0.2")],
    "no usable InternalIP",
)]
#[case::no_pod_cidr_yet(vec![a(), node("b", &["10.0.0.2"], &[])], vec![], "no podCIDR")]
#[case::overlapping_cidrs(
    vec![a(), node("b", &["10.0.0.2"], &["10.244.2.0/24"]), node("c", &["10.0.0.3"], &["10.244.2.0/23"])],
    vec![],
    "overlaps between nodes",
)]
#[case::overlap_with_own(vec![a(), node("b", &["10.0.0.2"], &["10.244.1.0/24"])], vec![], "overlaps this node")]
#[case::peer_cidr_covers_the_node_addresses(
    vec![a(), node("b", &["10.0.0.2"], &["10.0.0.0/25"]), c()],
    vec![route("10.244.3.0/24", "10.0.0.3")],
    "node b's podCIDR 10.0.0.0/25 covers the node address",
)]
#[case::peer_cidr_covers_this_node_only(
    vec![node("a", &["10.0.0.200"], &["10.244.1.0/24"]), node("b", &["10.0.0.2"], &["10.0.0.128/25"]), c()],
    vec![route("10.244.3.0/24", "10.0.0.3")],
    "covers the node address 10.0.0.200",
)]
#[case::loopback_internal_ip(vec![a(), node("b", &["127.0.0.1"], &["10.244.2.0/24"])], vec![], "no usable InternalIP")]
fn suspicious_node_lists(
    #[case] nodes: Vec<NodeInfo>,
    #[case] desired: Vec<NodeRoute>,
    #[case] warning: &str,
) {
    let result = plan("a", &nodes, &[], &cluster());
    assert_eq!(result.desired, desired);
    let text: Vec<String> = result.warnings.iter().map(ToString::to_string).collect();
    assert!(text.iter().any(|w| w.contains(warning)), "{text:?}");
}

/// A peer podCIDR inside the underlay (a connected route of this node) that
/// covers no node address is still refused; the other peers stay routed.
#[test]
fn a_peer_cidr_overlapping_the_underlay_is_refused_and_the_others_kept() {
    let nodes = vec![a(), node("b", &["10.0.0.2"], &["10.0.0.128/25"]), c()];
    let result = plan("a", &nodes, &host_routes(), &cluster());
    assert_eq!(result.actions, vec![add("10.244.3.0/24", "10.0.0.3")]);
    assert_eq!(result.desired, vec![route("10.244.3.0/24", "10.0.0.3")]);
    let text: Vec<String> = result.warnings.iter().map(ToString::to_string).collect();
    assert!(
        text.iter().any(|w| w.contains("node b")
            && w.contains("10.0.0.128/25")
            && w.contains("10.0.0.0/24")),
        "{text:?}"
    );
}

/// An own route to a CIDR that is now refused is deleted, not kept.
#[test]
fn an_own_route_to_a_refused_cidr_is_deleted() {
    let nodes = vec![a(), node("b", &["10.0.0.2"], &["10.0.0.128/25"])];
    let mut installed = host_routes();
    installed.push(own("10.0.0.128/25", "10.0.0.2"));
    let result = plan("a", &nodes, &installed, &cluster());
    assert_eq!(
        result.actions,
        vec![RouteAction::Delete(own("10.0.0.128/25", "10.0.0.2"))]
    );
}

/// Peer pod CIDRs outside the cluster CIDRs or in special-purpose blocks are
/// refused (each named), and the peer's last good route stays.
#[test]
fn out_of_scope_peer_cidrs_are_refused_and_the_last_good_route_kept() {
    let nodes = vec![
        a(),
        node("b", &["10.0.0.2"], &["169.254.169.254/32"]),
        c(),
        node("d", &["10.0.0.4"], &["192.0.2.0/24"]),
        node("e", &["10.0.0.5"], &["224.0.0.0/4"]),
    ];
    let mut installed = host_routes();
    installed.push(own("10.244.2.0/24", "10.0.0.2"));
    installed.push(own("10.244.4.0/24", "10.0.0.4"));
    // Made by an older agent: now out of scope, so deleted.
    installed.push(own("169.254.169.254/32", "10.0.0.2"));
    let result = plan("a", &nodes, &installed, &[net("10.244.0.0/16")]);
    assert_eq!(
        result.actions,
        vec![
            RouteAction::Delete(own("169.254.169.254/32", "10.0.0.2")),
            add("10.244.3.0/24", "10.0.0.3"),
        ]
    );
    let text: Vec<String> = result.warnings.iter().map(ToString::to_string).collect();
    for needle in [
        "node b's podCIDR 169.254.169.254/32 overlaps the special-purpose block 169.254.0.0/16",
        "node d's podCIDR 192.0.2.0/24 is outside every --cluster-cidr",
        "node e's podCIDR 224.0.0.0/4 overlaps the special-purpose block",
    ] {
        assert!(
            text.iter().any(|w| w.contains(needle)),
            "{needle}: {text:?}"
        );
    }
    let refused = result
        .warnings
        .iter()
        .filter(|w| w.refused_out_of_scope().is_some())
        .count();
    assert_eq!(refused, 3);
}
