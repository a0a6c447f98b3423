//! Every cause cnilab names for a failed probe, declared in one place: its
//! id (what `lab check`, `lab trace`, `e2e check` and scenarios report and
//! assert on), who names it, what it means, the object that proves it, and
//! how to fix it, with the tests that apply the fix and see the probes
//! pass again. The rules and the tracer that find a cause live with what
//! they read (the lab's rules in `lab/`, the walk in `trace/`, the
//! cluster's in `e2e/check/`); what each id means lives here, and tests
//! hold them to it: every id they can name is declared, and the docs'
//! table of causes is this table (`cnilab lab causes` prints it).

use serde::Serialize;

/// Who names a cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Finder {
    /// A rule of `lab check` reading the lab's nodes (routes, sysctls,
    /// rules), before any trace.
    Rule,
    /// The trace of a failed probe (`lab trace`, and `lab check` for what
    /// no rule explains): the routing walk, nftables' trace, counters,
    /// neighbours and the kernel's drop reasons.
    Trace,
    /// The in-cluster check (`cnilab e2e … check`).
    Cluster,
}

/// One cause.
#[derive(Debug, Serialize)]
pub struct Cause {
    pub id: &'static str,
    pub found_by: &'static [Finder],
    /// What it means, in one line.
    pub means: &'static str,
    /// The object that proves it, as the report names it.
    pub evidence: &'static str,
    /// How to fix it.
    pub fix: &'static str,
    /// The tests that apply the fix by hand and see the failing probes
    /// pass again: `BINARY::TEST` of `tests/tests/` (`cargo test -p
    /// cnilab-tests --test BINARY TEST`) or `scenario NAME` (a shipped
    /// scenario that names the cause, heals and passes). Empty where no
    /// test proves it yet.
    pub proven_by: &'static [&'static str],
}

use Finder::{Cluster, Rule, Trace};

const fn cause(
    id: &'static str,
    found_by: &'static [Finder],
    means: &'static str,
    evidence: &'static str,
    fix: &'static str,
    proven_by: &'static [&'static str],
) -> Cause {
    Cause {
        id,
        found_by,
        means,
        evidence,
        fix,
        proven_by,
    }
}

/// Every cause, by id.
pub const CAUSES: &[Cause] = &[
    cause(
        "missing-route",
        &[Rule],
        "a node has no route to another node's pod CIDR",
        "the node's routing table and the peer's pod CIDR",
        "add `<podCIDR> via <peer's node IP>` (the agent or the routing daemon missed the node)",
        &["scenario missing-route"],
    ),
    cause(
        "stale-route",
        &[Rule],
        "a node routes a pod CIDR via an address no node holds any more",
        "the route and the next hop no node has",
        "replace the route's next hop with the peer's current node IP",
        &["scenario stale-route"],
    ),
    cause(
        "ip-forward-off",
        &[Rule],
        "a node does not forward IPv4 (or IPv6) between its pods and the underlay",
        "net.ipv4.ip_forward (net.ipv6.conf.all.forwarding) on the node",
        "sysctl -w net.ipv4.ip_forward=1 on the node",
        &["scenario ip-forward-off", "scenario ipv6-forwarding-off"],
    ),
    cause(
        "forward-drop",
        &[Rule],
        "the node's iptables FORWARD policy is DROP and nothing accepts pod traffic (as Docker sets it)",
        "the FORWARD chain's policy and rules",
        "accept the pod CIDRs in FORWARD, or set its policy back to ACCEPT",
        &["scenario forward-policy-drop"],
    ),
    cause(
        "mtu-mismatch",
        &[Rule],
        "the pods' MTU is above a node's uplink MTU, so full-size packets with DF are dropped",
        "the pods' and the uplinks' MTUs",
        "give the pods an MTU no larger than the smallest uplink's (less the overlay's overhead), or raise the uplink's MTU back",
        &["scenario mtu-mismatch"],
    ),
    cause(
        "vxlan-mtu-overhead",
        &[Rule],
        "pods over VXLAN use the uplink's MTU, not the uplink's less the 50 bytes of encapsulation",
        "the pods', the VXLAN device's and the uplink's MTUs",
        "set the pods' MTU (and the VXLAN device's) to the uplink's less 50",
        &["scenario vxlan-mtu-not-reduced"],
    ),
    cause(
        "vxlan-fdb-missing",
        &[Rule, Trace],
        "a node's VXLAN device has no FDB entry for a peer's VTEP MAC, so encapsulated frames have no destination",
        "the VXLAN device's FDB and the peer's VTEP MAC",
        "`bridge fdb append <VTEP MAC> dev <vxlan> dst <peer's node IP>` (the node missed a peer's re-join)",
        &[
            "scenario vxlan-fdb-missing-after-rejoin",
            "trace::vxlan_outer_packet_is_followed_and_a_missing_fdb_entry_is_named",
        ],
    ),
    cause(
        "vxlan-fdb-wrong",
        &[Trace],
        "a node's VXLAN FDB entry sends a peer's VTEP MAC to a wrong underlay address",
        "the FDB entry and the address the peer holds",
        "replace the FDB entry's dst with the peer's node IP",
        &["trace_paths::faults_on_the_routed_and_vxlan_shapes_are_named"],
    ),
    cause(
        "vxlan-no-device",
        &[Trace],
        "the outer packet reaches a node that has no VXLAN device of its VNI, neither on the UDP port it was sent to nor on another",
        "the VNI the peer sends with",
        "re-create the node's VXLAN device with the cluster's VNI and port (the overlay's agent makes it), with its address, routes, neighbours and FDB entries",
        &["trace_paths::a_vxlan_device_of_another_vni_or_port_is_named"],
    ),
    cause(
        "vxlan-vni-mismatch",
        &[Trace],
        "a node's VXLAN device listens on the UDP port its peers send to, with another VNI: it takes no other, so their packets die there",
        "the VNI the peer sends with and the receiving device's",
        "re-create the device with the cluster's VNI (it cannot change in place: `ip link add <vxlan> type vxlan id <VNI> …`), with its address, routes, neighbours and FDB entries",
        &["trace_paths::a_vxlan_device_of_another_vni_or_port_is_named"],
    ),
    cause(
        "vxlan-port-mismatch",
        &[Trace],
        "a node's VXLAN device of the cluster's VNI listens on another UDP port than its peers send to, so nothing takes their packets",
        "the UDP port the peer sends to and the receiving device's",
        "re-create the device with the cluster's port (`dstport`; it cannot change in place), with its address, routes, neighbours and FDB entries",
        &["trace_paths::a_vxlan_device_of_another_vni_or_port_is_named"],
    ),
    cause(
        "masquerade-missing",
        &[Rule],
        "pod traffic to the outside leaves its node with the pod's address, which nothing routes back",
        "the node's nat rules (no masquerade for the pod CIDR)",
        "masquerade traffic from the pod CIDR to destinations outside the cluster CIDRs",
        &["scenario masquerade-missing"],
    ),
    cause(
        "masquerade-too-broad",
        &[Rule],
        "a node masquerades pod traffic to other pods too, hiding the source",
        "the masquerade or SNAT rule that excludes no cluster destination",
        "exclude the cluster CIDRs from the masquerade rule",
        &[
            "scenario masquerade-too-broad",
            "trace_nat::a_masquerade_on_the_way_in_is_named_at_its_node",
        ],
    ),
    cause(
        "podcidr-overlap",
        &[Rule],
        "two nodes were given overlapping pod CIDRs",
        "both nodes' pod CIDRs",
        "give each node its own pod CIDR (the controller manager's allocation), then recreate its pods",
        &["scenario podcidr-overlap"],
    ),
    cause(
        "duplicate-address",
        &[Rule, Trace],
        "two pods hold one address, and the node reaches whichever answered ARP last",
        "both ends' namespace, MAC and bridge port",
        "each pod its own address back, then `ip neigh flush dev <bridge>` on the node",
        &["trace_twins::a_pod_holding_another_pods_address_is_named_at_the_bridge"],
    ),
    cause(
        "duplicate-mac",
        &[Trace],
        "two ends behind one bridge share a MAC, and the bridge's FDB follows whichever sent last",
        "both ends and the bridge's FDB",
        "each end its own MAC back, then flush the neighbours that learned the twin's",
        &["trace_twins::a_pod_with_another_pods_mac_is_named_at_the_bridge"],
    ),
    cause(
        "address-missing",
        &[Trace],
        "the pod (or bridge) known by an address holds none of it",
        "the address and the namespace expected to hold it",
        "give the address back to its holder (the plugin's ADD, or the bridge's gateway address)",
        &["trace_twins::a_bridge_without_the_pods_gateway_is_named"],
    ),
    cause(
        "bridge-address-missing",
        &[Trace],
        "a node's pod bridge holds no address on its pods' subnet: no connected route to them, no gateway for them",
        "the bridge and its addresses",
        "give the bridge its gateway address (the plugin's isGateway)",
        &["trace_twins::a_bridge_without_the_pods_gateway_is_named"],
    ),
    cause(
        "stale-neighbour",
        &[Rule],
        "a node maps a re-created peer's address to the peer's old MAC",
        "the neighbour entry and the peer's uplink MAC",
        "`ip neigh flush to <address> nud all` on the node (`nud all`: also a pinned entry)",
        &["lab::a_stale_neighbour_entry_is_diagnosed"],
    ),
    cause(
        "pod-no-route",
        &[Rule],
        "a pod has no default route nor a route to the cluster CIDR",
        "the pod's routing table",
        "give the plugin a default route (IPAM `routes`, or isDefaultGateway)",
        &["lab::a_pod_without_a_default_route_is_diagnosed"],
    ),
    cause(
        "bridge-down",
        &[Rule],
        "a node's pod bridge is down",
        "the bridge and its ports",
        "`ip link set <bridge> up` on the node",
        &["lab::a_bridge_that_is_down_is_diagnosed"],
    ),
    cause(
        "br-netfilter-forward-drop",
        &[Rule],
        "bridge-nf-call-iptables hands same-node pod traffic to a FORWARD chain that drops it",
        "the sysctl and the FORWARD chain",
        "accept the pod CIDR in FORWARD (or bridge-nf-call-iptables = 0 where nothing needs it)",
        &["lab::br_netfilter_forward_drop_between_same_node_pods_is_diagnosed"],
    ),
    cause(
        "rp-filter",
        &[Rule],
        "strict reverse-path filtering drops packets whose way back leaves by another interface",
        "the effective rp_filter (max of all and the interface) and the route back",
        "rp_filter = 2 (loose) or 0 on the interface, or make the route back symmetric",
        &["scenario asymmetric-route-rp-filter"],
    ),
    cause(
        "conntrack-invalid",
        &[Rule, Trace],
        "a rule drops packets conntrack classes INVALID",
        "the rule and its counter",
        "drop the rule, or fix what makes the flow invalid (asymmetric routing, a missed SYN)",
        &["trace_faults::an_invalid_probe_is_named_at_the_ct_state_invalid_rule"],
    ),
    cause(
        "host-gw-across-l3",
        &[Rule],
        "host-gw routes a pod CIDR via a node in another subnet, which the kernel refuses",
        "both nodes' subnets and the router between them",
        "use an overlay (VXLAN) or have the router carry the pod CIDRs",
        &["scenario host-gw-across-l3"],
    ),
    cause(
        "nat-internal-ip",
        &[Rule],
        "every node's InternalIP is the VirtualBox NAT address, so no route to a peer's pods can use it",
        "the node list and the NAT interface",
        "pin kubelet --node-ip to the host-only address",
        &["scenario vagrant-nat-internal-ip"],
    ),
    cause(
        "service-dnat-missing",
        &[Rule],
        "a node has no DNAT for a Service's ClusterIP: traffic leaves with the ClusterIP and nothing answers",
        "the node's Service table",
        "restore the Service's rules (kube-proxy on that node)",
        &["scenario clusterip-dnat-missing"],
    ),
    cause(
        "kube-proxy-service-missing",
        &[Rule],
        "a node's KUBE-SERVICES has no rule for a Service",
        "the KUBE-SERVICES chain",
        "restart kube-proxy on the node, or find what flushed its rules",
        &["capture_replay::a_kube_services_rule_deleted_before_capture_is_named_in_the_replay"],
    ),
    cause(
        "kube-proxy-endpoint-missing",
        &[Rule],
        "a node's Service chain never jumps to an endpoint the other nodes have",
        "the KUBE-SVC and KUBE-SEP chains",
        "let kube-proxy resync (its endpoints on that node are stale)",
        &["capture_replay::a_kube_svc_jump_deleted_before_capture_is_named_in_the_replay"],
    ),
    cause(
        "kube-proxy-endpoint-dnat-missing",
        &[Rule],
        "a node's endpoint chain has no DNAT rule: connections fall through to the ClusterIP",
        "the KUBE-SEP chain",
        "let kube-proxy resync the chain",
        &["capture_replay::a_kube_sep_dnat_rule_deleted_before_capture_is_named_in_the_replay"],
    ),
    cause(
        "kube-proxy-endpoint-wrong",
        &[Rule],
        "a node's endpoint chain DNATs to another address than the other nodes' do",
        "the KUBE-SEP chain's DNAT target",
        "let kube-proxy resync (a stale endpoint)",
        &[],
    ),
    cause(
        "hairpin-off",
        &[Rule],
        "a pod reaching itself through its Service is sent back to its own bridge port, and hairpin mode is off",
        "the bridge port's hairpin_mode",
        "turn hairpin mode on for pod ports (the plugin's hairpinMode)",
        &["scenario hairpin-off"],
    ),
    cause(
        "hairpin-masquerade-missing",
        &[Rule],
        "hairpin traffic is not masqueraded, so the backend answers itself and bypasses the DNAT",
        "the node's Service rules",
        "masquerade a backend's traffic to itself through its Service (kube-proxy's hairpin rule)",
        &["scenario hairpin-masquerade-missing"],
    ),
    cause(
        "blackhole",
        &[Rule, Trace],
        "a blackhole route (or policy rule) swallows the packet",
        "the route or rule, with its table",
        "delete the blackhole route, or route the prefix where it belongs",
        &["trace_matrix::l2_each_class_is_named_by_lab_check_on_every_path_it_breaks"],
    ),
    cause(
        "no-route",
        &[Trace],
        "a namespace has no route to the destination",
        "the kernel's answer to `ip route get`",
        "add the route (the plugin's or the agent's)",
        &["trace::a_missing_route_is_named"],
    ),
    cause(
        "unreachable",
        &[Trace],
        "an unreachable route (or policy rule) refuses the packet",
        "the route or rule",
        "delete the unreachable route, or route the prefix where it belongs",
        &["trace_paths::faults_on_the_routed_and_vxlan_shapes_are_named"],
    ),
    cause(
        "prohibit",
        &[Trace],
        "a prohibit route (or policy rule) refuses the packet",
        "the route or rule",
        "delete the prohibit route or rule",
        &["trace_paths::faults_on_the_routed_and_vxlan_shapes_are_named"],
    ),
    cause(
        "route-refused",
        &[Trace],
        "the kernel refuses the route lookup for another reason",
        "the kernel's answer to `ip route get`",
        "read the kernel's answer in the trace's evidence",
        &[],
    ),
    cause(
        "routing-loop",
        &[Trace],
        "the packet comes back to a namespace it already left",
        "the route at the node that holds the destination and routes it away (else where the walk gave up)",
        "fix the route that sends it back",
        &["trace_faults::a_route_sending_a_pods_address_back_is_named_as_a_loop"],
    ),
    cause(
        "reverse-path",
        &[Trace],
        "rp_filter drops the packet: the way back to its source leaves by another device",
        "the interface's rp_filter and the route back",
        "rp_filter = 2 or 0 on the interface, or a symmetric route back",
        &["trace_faults::reverse_path_filtering_is_named"],
    ),
    cause(
        "accept-local",
        &[Trace],
        "the packet arrives with a source address the namespace holds itself",
        "the namespace's addresses and accept_local",
        "give the sender its own address (a twin), or route the packet so it does not come back",
        &["trace_faults::a_local_source_refused_by_accept_local_is_named"],
    ),
    cause(
        "forwarding-off",
        &[Trace],
        "the namespace does not forward the packet's family on that interface",
        "the forwarding sysctl",
        "turn forwarding on for the family (and the interface)",
        &[
            "trace_matrix::l2_each_class_is_named_by_lab_check_on_every_path_it_breaks",
            "trace_sysctls::forwarding_off_on_one_interface_is_named_for_the_answers_too",
        ],
    ),
    cause(
        "link-down",
        &[Trace],
        "a device on the way is down: a veth end, a bridge or its port",
        "the device and its state",
        "`ip link set <device> up`",
        &["trace_matrix::l2_each_class_is_named_by_lab_check_on_every_path_it_breaks"],
    ),
    cause(
        "bridge-port-blocked",
        &[Trace],
        "an STP state keeps a bridge port from forwarding",
        "the port's STP state",
        "put the port back in forwarding (`bridge link set dev <port> state 3`): let STP converge, or turn STP off on the pod bridge",
        &[
            "trace_faults::a_blocked_bridge_port_is_named",
            "trace_matrix::l2_each_class_is_named_by_lab_check_on_every_path_it_breaks",
        ],
    ),
    cause(
        "bridge-port-isolated",
        &[Trace],
        "the packet's in and out bridge ports are both isolated",
        "both ports' isolated flags",
        "turn isolation off on one of the ports",
        &["trace_faults::isolated_bridge_ports_are_named"],
    ),
    cause(
        "bridge-loop",
        &[Trace],
        "the bridge would send the frame back out of the port it came in on",
        "the bridge's FDB and the port",
        "fix the FDB entry (or hairpin mode where it is meant)",
        &[],
    ),
    cause(
        "bridge-fdb-missing",
        &[Trace],
        "a port with learning and unicast flooding off has no FDB entry for the next hop's MAC",
        "the bridge's FDB, read live",
        "add the FDB entry, or turn learning or flooding back on",
        &["trace_faults::a_bridge_port_that_neither_learns_nor_floods_is_named"],
    ),
    cause(
        "noarp",
        &[Trace],
        "the device the packet leaves by does not resolve neighbours (NOARP) and has no entry",
        "the device's flags and neighbours",
        "turn ARP on for the device, or add a permanent neighbour",
        &["trace_faults::noarp_on_a_link_is_named"],
    ),
    cause(
        "mtu",
        &[Trace],
        "a link (or a route's own MTU) is below the packet, sent with DF",
        "the link or the route and its MTU",
        "raise the link's MTU, or lower the pods' to fit",
        &["trace_faults::an_mtu_smaller_than_the_packet_is_named"],
    ),
    cause(
        "wrong-next-hop",
        &[Trace],
        "a route sends the packet to a next hop that does not lead to the destination",
        "the route that chose it, named in its namespace",
        "route the prefix via the right next hop",
        &["trace_faults::a_wrong_next_hop_is_named_at_the_node_whose_route_chose_it"],
    ),
    cause(
        "wrong-device",
        &[Trace],
        "a route sends the packet out of a device that does not lead to the next hop, while another does",
        "the route and its device",
        "route via the device that leads to the next hop",
        &["trace_matrix::a_route_out_of_the_wrong_device_is_named"],
    ),
    cause(
        "neighbour-wrong-mac",
        &[Trace],
        "a permanent neighbour entry holds a MAC that is not the owner's",
        "the entry and the owner's MAC",
        "`ip neigh replace <address> lladdr <owner's MAC>` or delete the entry",
        &[
            "trace_faults::a_permanent_neighbour_with_a_wrong_mac_is_named",
            "trace_matrix::l2_each_class_is_named_by_lab_check_on_every_path_it_breaks",
        ],
    ),
    cause(
        "neighbour-missing",
        &[Trace],
        "the next hop has no neighbour entry where one is needed",
        "the neighbour table",
        "let ARP/NDP resolve it (see why it does not: arp_ignore, a queue, a firewall)",
        &[],
    ),
    cause(
        "neighbour-failed",
        &[Trace],
        "the next hop's neighbour entry stayed INCOMPLETE or FAILED: nobody answered ARP/NDP",
        "the neighbour entry",
        "make the owner answer: its address, arp_ignore, the path of the requests",
        &["trace::a_neighbour_that_never_resolves_is_named"],
    ),
    cause(
        "arp-ignore",
        &[Trace],
        "the owner ignores every ARP request for the next hop (arp_ignore)",
        "the owner's arp_ignore",
        "arp_ignore = 0 or 1 on the owner's interface",
        &["trace_faults::arp_ignore_is_named_at_the_pod_that_ignores"],
    ),
    cause(
        "arp-announce",
        &[Trace],
        "the namespace asks with a sender address outside the owner's subnet, which answers only its own",
        "arp_announce on the asker, arp_ignore on the owner",
        "arp_announce = 2 on the asker, or arp_ignore below 2 on the owner",
        &["trace_faults::arp_announce_is_named_where_it_chooses_the_arp_sender"],
    ),
    cause(
        "qdisc-drop",
        &[Trace],
        "a queueing discipline on the way drops the packet (or the answers to its ARP)",
        "the qdisc and its drop counter",
        "remove or fix the qdisc (`tc qdisc del dev <device> root`)",
        &[
            "trace_faults::a_qdisc_that_drops_is_named_by_its_counter",
            "trace_matrix::l2_each_class_is_named_by_lab_check_on_every_path_it_breaks",
        ],
    ),
    cause(
        "echo-ignored",
        &[Trace],
        "an ICMP echo arrived where echo requests are ignored",
        "icmp_echo_ignore_all (echo_ignore_all for IPv6)",
        "set it to 0 where pings are to be answered",
        &["trace_sysctls::a_pod_that_ignores_echo_requests_is_named"],
    ),
    cause(
        "dnat-nowhere",
        &[Trace],
        "a DNAT rewrites the packet to an address no namespace holds",
        "the DNAT rule and its chain",
        "point the DNAT at a live backend (the Service's endpoints)",
        &["trace_nat::a_dnat_to_an_address_nobody_holds_is_named_at_its_rule"],
    ),
    cause(
        "firewall-drop",
        &[Rule, Trace],
        "an nftables (or iptables-nft) rule drops the packet",
        "the table, chain, rule handle and text",
        "remove the rule, or accept the traffic before it",
        &["trace_matrix::l2_each_class_is_named_by_lab_check_on_every_path_it_breaks"],
    ),
    cause(
        "firewall-reject",
        &[Trace],
        "an nftables (or iptables-nft) rule rejects the packet",
        "the table, chain, rule handle and text",
        "remove the rule, or accept the traffic before it",
        &["trace_paths::drops_and_rejects_in_every_hook_are_named_on_their_path"],
    ),
    cause(
        "firewall-policy",
        &[Trace],
        "a chain's policy drops the packet and no rule accepts it",
        "the table, chain and policy",
        "accept the traffic in the chain, or set its policy to accept",
        &[
            "trace_families::a_bridge_family_drop_is_named_as_its_chain_not_as_br_netfilter",
            "trace_faults::a_chain_policy_drop_is_named_as_the_policy",
        ],
    ),
    cause(
        "tc-filter",
        &[Trace],
        "a tc filter on a device on the way takes the probe off its path (a redirect, a drop or a rewrite) before the firewall sees it",
        "the device's tc filters and the last namespace the probe was seen in",
        "delete the filter (`tc filter del dev <device> ingress|egress`), or fix its match or action",
        &["trace_faults::a_tc_redirect_off_the_path_is_named_at_its_filter"],
    ),
    cause(
        "xdp-program",
        &[Trace],
        "an XDP program on a device the probe comes in by takes it before the kernel's stack sees it",
        "the device's XDP program and the last namespace the probe was seen in",
        "detach the program (`ip link set dev <device> xdp off`), or fix what it does",
        &[],
    ),
    cause(
        "iptables-legacy-drop",
        &[Trace],
        "an x_tables (iptables-legacy) rule dropped or rejected the packet",
        "the table, chain and rule number, by its counter",
        "remove the rule (`iptables-legacy -D`), or accept the traffic before it",
        &["trace_faults::legacy_iptables_drops_are_named_by_their_counters"],
    ),
    cause(
        "iptables-legacy-policy",
        &[Trace],
        "an x_tables chain's DROP policy dropped the packet",
        "the chain's policy counter",
        "accept the traffic in the chain, or set its policy to ACCEPT",
        &["trace_faults::legacy_iptables_drops_are_named_by_their_counters"],
    ),
    cause(
        "kernel-drop",
        &[Trace],
        "the kernel dropped the packet where nothing else the trace reads explains it",
        "the kernel's drop reason, device and function (skb:kfree_skb)",
        "read the reason (docs: drop reasons) and the function",
        &[],
    ),
    cause(
        "trace",
        &[Trace],
        "the trace named a death that has no id of its own",
        "the trace's death",
        "read the trace (`cnilab lab trace`)",
        &[],
    ),
    cause(
        "undiagnosed",
        &[Rule, Trace],
        "a failed probe that no rule and no trace explains",
        "the probe and its error",
        "trace it (`cnilab lab trace`) and capture the nodes",
        &[],
    ),
    cause(
        "drop-reasons-skipped",
        &[Trace],
        "not a cause: the kernel's drop reasons could not be read here (a SKIP, said once)",
        "why: no tracefs, or a kernel without drop reasons",
        "mount tracefs, or use a kernel since 5.17",
        &[],
    ),
    cause(
        "detour",
        &[Rule],
        "not a failure: a route works but detours through a third node (WARN)",
        "the route and the node it passes",
        "route the pod CIDR directly to its node",
        &[],
    ),
    cause(
        "image-pull",
        &[Cluster],
        "a node cannot pull the probe image",
        "the probe pod's status",
        "give a reachable image with --image",
        &[],
    ),
    cause(
        "cni-add-failed",
        &[Cluster],
        "a pod sandbox was not set up: the CNI ADD failed or no CNI config is installed",
        "the probe pod's events",
        "check the node's CNI config and binaries (`cnilab e2e <provider> dump`)",
        &[],
    ),
    cause(
        "service-proxy",
        &[Cluster],
        "a pod reaches pods directly but not the ClusterIP: kube-proxy's rules do not apply to pod traffic",
        "the failing ClusterIP probes beside passing pod probes",
        "bridge-nf-call-iptables = 1 where pods sit on a bridge, and kube-proxy running on the node",
        &[],
    ),
    cause(
        "dns",
        &[Cluster],
        "a pod reaches a Service by ClusterIP but not by name",
        "the name and ClusterIP probes",
        "make CoreDNS reachable and Ready from the pod",
        &[],
    ),
    cause(
        "hairpin",
        &[Cluster],
        "a pod reaches the echo Service but not itself through it",
        "the hairpin probe",
        "hairpin mode on the pod's bridge port (the plugin's hairpinMode)",
        &[],
    ),
];

/// The cause of `id`.
pub fn find(id: &str) -> Option<&'static Cause> {
    CAUSES.iter().find(|c| c.id == id)
}

/// The finders of a cause as words (`rule, trace`).
pub fn finders(c: &Cause) -> String {
    let words: Vec<&str> = c
        .found_by
        .iter()
        .map(|f| match f {
            Rule => "rule",
            Trace => "trace",
            Cluster => "cluster",
        })
        .collect();
    words.join(", ")
}

/// The commands that run the tests proving a cause's fix.
pub fn proofs(c: &Cause) -> Vec<String> {
    c.proven_by
        .iter()
        .map(|p| match p.split_once("::") {
            Some((binary, test)) => {
                format!("cargo test -p cnilab-tests --test {binary} {test}")
            }
            None => format!("cnilab scenario run {}", p.trim_start_matches("scenario ")),
        })
        .collect()
}

/// The table of causes in Markdown, as the docs hold it.
pub fn markdown() -> String {
    let mut out = String::from(
        "| cause | named by | what it means | fix | fix proven by |\n|---|---|---|---|---|\n",
    );
    for c in CAUSES {
        let proven: Vec<String> = c.proven_by.iter().map(|p| format!("`{p}`")).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            c.id,
            finders(c),
            c.means.replace('|', "\\|"),
            c.fix.replace('|', "\\|"),
            if proven.is_empty() {
                "no test yet".to_string()
            } else {
                proven.join("<br>")
            }
        ));
    }
    out
}
