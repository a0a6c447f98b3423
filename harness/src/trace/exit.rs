//! Where a packet leaves the one node a live trace reads
//! ([`super::World::one_node`]), and what makes that a verdict.

use super::{End, Trace};
use serde::Serialize;
use std::net::IpAddr;

/// Where a packet leaves the one node a trace reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Exit {
    pub namespace: String,
    /// The link it leaves by (an uplink, a veth to outside the node).
    pub device: String,
    /// The address it is sent to there (a gateway, the destination, or
    /// the VTEP of a VXLAN device).
    pub next_hop: IpAddr,
    /// The VXLAN device that encapsulated it, when it leaves as the
    /// outer packet of one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encapsulated_by: Option<String>,
}

impl Exit {
    /// The walk's end where the packet leaves `ns` by `device` toward
    /// `next_hop`.
    pub(super) fn end(ns: &str, device: &str, next_hop: IpAddr) -> End {
        End::Left(Box::new(Exit {
            namespace: ns.to_string(),
            device: device.to_string(),
            next_hop,
            encapsulated_by: None,
        }))
    }

    /// The device the probe itself (not an outer packet) is queued on last.
    pub(super) fn last_device(&self) -> &str {
        self.encapsulated_by.as_deref().unwrap_or(&self.device)
    }

    pub(crate) fn describe(&self) -> String {
        let by = match &self.encapsulated_by {
            Some(v) => format!(" (encapsulated by {v})"),
            None => String::new(),
        };
        format!(
            "{} by {} toward {}{by}",
            self.namespace, self.device, self.next_hop
        )
    }
}

/// What makes a walk that leaves the node a verdict: the kernel saw the
/// probe queued on its last device there, and dropped it nowhere.
pub(super) fn evidence(exit: &Exit, trace: &Trace) -> Result<(), String> {
    let routed = format!("the kernel's routes send it out of {}", exit.describe());
    if let Some(why) = &trace.drop_reasons_skipped {
        return Err(format!(
            "{routed}, but the kernel's record of the probe is unavailable ({why})"
        ));
    }
    let queued = trace.devices.iter().any(|d| {
        d.namespace == exit.namespace && d.device == exit.last_device() && d.direction == "out"
    });
    if queued {
        Ok(())
    } else {
        Err(format!(
            "{routed}, but the kernel never saw it queued on {} in {}",
            exit.last_device(),
            exit.namespace
        ))
    }
}
