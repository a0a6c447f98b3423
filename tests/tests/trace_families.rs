//! A filter of the bridge family (root), made by hand with plain `nft` in
//! a standing lab of 2 nodes with 2 pods each: a forward chain of policy
//! drop in a `bridge` table on node2, which only its pods' bridged
//! traffic meets. No rule may call it a FORWARD chain that br_netfilter
//! feeds (whose advice, `bridge-nf-call-iptables = 0`, would not fix
//! it): the trace names the chain's policy at node2, for every failing
//! probe; the table deleted, `lab check` passes again.

mod trace_common;

use cnilab_tests::{host_untouched, StandingLab as Standing};
use trace_common::{assert_died, assert_every_failure_is, assert_fixed, Lab};

#[test]
fn a_bridge_family_drop_is_named_as_its_chain_not_as_br_netfilter() {
    let _host = host_untouched();
    let lab = Standing::sized("fmbr", 2, 2, &[]);
    lab.sh("node2", "nft", &["add", "table", "bridge", "faulty"]);
    let spec = "{ type filter hook forward priority filter; policy drop; }";
    lab.sh(
        "node2",
        "nft",
        &["add", "chain", "bridge", "faulty", "forward", spec],
    );
    let object = "bridge faulty forward policy drop";
    let t = lab.trace("node2-pod0", "node2-pod1", &[]);
    assert_died(&t, "node2", "firewall-policy", object);
    assert_every_failure_is(&lab, "firewall-policy", "node2", object);
    lab.sh("node2", "nft", &["delete", "table", "bridge", "faulty"]);
    assert_fixed(&lab, "firewall-policy");
}
