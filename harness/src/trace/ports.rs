//! What a bridge port refuses on the walk: a veth port whose other end is
//! down, an STP state that does not forward, isolation; and [`died`], the
//! walk's end for a named death.

use super::{Death, End, World};

/// The other end of a bridge's veth port, down: named there (the port
/// then has no carrier, and the bridge disables it, which is only what
/// follows).
pub(super) fn peer_up(
    world: &World,
    (ns, port): (&str, &str),
    (peer_ns, peer): (&str, &str),
) -> Result<(), End> {
    match world.link(peer_ns, peer) {
        Some(l) if !l.up => Err(died(
            peer_ns,
            "link-down",
            &format!("link {peer}"),
            &format!(
                "{peer} (the other end of {ns}/{port}) is down: {port} has no carrier and \
                 its bridge forwards nothing to it (ip link set {peer} up)"
            ),
        )),
        _ => Ok(()),
    }
}

/// A bridge port whose STP state is not `forwarding` drops what it gets.
pub(super) fn port_forwards(ns: &str, bridge: &str, port: &crate::model::Link) -> Result<(), End> {
    match port.port.as_ref().and_then(|p| p.state.as_deref()) {
        Some(state) if state != "forwarding" => Err(died(
            ns,
            "bridge-port-blocked",
            &format!("port {} of {bridge}", port.name),
            &format!("STP state {state}"),
        )),
        _ => Ok(()),
    }
}

/// A bridge forwards nothing from an isolated port to another isolated port.
pub(super) fn isolation(
    world: &World,
    ns: &str,
    bridge: &str,
    in_port: Option<&str>,
    out: &crate::model::Link,
) -> Result<(), End> {
    let isolated = |l: &crate::model::Link| l.port.as_ref().is_some_and(|p| p.isolated);
    let Some(inp) = in_port.and_then(|p| world.link(ns, p)) else {
        return Ok(());
    };
    if isolated(inp) && isolated(out) {
        return Err(died(
            ns,
            "bridge-port-isolated",
            &format!("port {} of {bridge}", out.name),
            &format!(
                "{} and {} are both isolated: {bridge} forwards nothing between them",
                inp.name, out.name
            ),
        ));
    }
    Ok(())
}

/// A death of `cause` at `object` in `ns` as the walk's end.
pub(super) fn died(ns: &str, cause: &str, object: &str, evidence: &str) -> End {
    End::Died(Box::new(Death::new(ns, cause, object, evidence)))
}
