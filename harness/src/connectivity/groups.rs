//! The check groups: one name per group, and which of them the lab and the
//! in-cluster check run, in report order. Probes name their group by these
//! constants; `--only` selects among them by prefix.

pub const PODS_READY: &str = "pods-ready";
pub const POD_TO_POD_SAME_NODE: &str = "pod-to-pod/same-node";
pub const POD_TO_POD_CROSS_NODE: &str = "pod-to-pod/cross-node";
pub const NODE_TO_POD: &str = "node-to-pod";
pub const POD_TO_NODE: &str = "pod-to-node";
pub const POD_TO_EXTERNAL: &str = "pod-to-external";
pub const POD_TO_SERVICE: &str = "pod-to-service";
pub const POD_TO_SERVICE_DNS: &str = "pod-to-service/dns";
pub const HAIRPIN: &str = "hairpin";
pub const MTU_DF_CROSS_NODE: &str = "mtu/df-cross-node";

/// What every lab checks, in report order (its Service groups, which run
/// only in a lab with a `[service]`, follow them: `lab::checks`).
pub const LAB: &[&str] = &[
    POD_TO_POD_SAME_NODE,
    POD_TO_POD_CROSS_NODE,
    NODE_TO_POD,
    POD_TO_NODE,
    POD_TO_EXTERNAL,
    MTU_DF_CROSS_NODE,
];

/// What `cnilab e2e check` checks in a real cluster, in report order.
pub const E2E: &[&str] = &[
    PODS_READY,
    POD_TO_POD_SAME_NODE,
    POD_TO_POD_CROSS_NODE,
    NODE_TO_POD,
    POD_TO_NODE,
    POD_TO_SERVICE,
    POD_TO_SERVICE_DNS,
    HAIRPIN,
    MTU_DF_CROSS_NODE,
];
