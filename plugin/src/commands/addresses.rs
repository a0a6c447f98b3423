//! Address management behind one interface: the built-in store or a
//! delegated IPAM plugin.

use super::delegate;
use crate::config::{IpamPlan, Plan};
use crate::env::CniEnv;
use crate::error::{CniError, Result};
use crate::ipam::{Store, LOCK_TIMEOUT};
use cnilab_net::spec::{Dns, IpConfig, Route};
use ipnet::IpNet;
use std::net::IpAddr;

/// What IPAM handed out for one attachment.
#[derive(Debug, Default)]
pub struct Allocation {
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Option<Dns>,
    /// Built-in store: (range set, cursor before, cursor after) per set, so
    /// a failed ADD puts the round-robin cursor back where it was.
    pub cursors: Vec<(usize, Option<IpAddr>, IpAddr)>,
}

impl Allocation {
    pub fn addresses(&self) -> Vec<IpNet> {
        self.ips.iter().map(|i| i.address).collect()
    }
}

/// Reserves one address per range set (built-in) or asks the IPAM plugin.
pub fn allocate(env: &CniEnv, plan: &Plan) -> Result<Allocation> {
    match &plan.ipam {
        IpamPlan::None => Ok(Allocation::default()),
        IpamPlan::Delegate { plugin } => {
            let res = delegate::exec(plugin, "ADD", env, &plan.raw)?
                .ok_or_else(|| CniError::io(format!("IPAM plugin {plugin} returned no result")))?;
            Ok(Allocation {
                ips: res.ips,
                routes: res.routes,
                dns: res.dns,
                cursors: Vec::new(),
            })
        }
        IpamPlan::Builtin(ipam) => {
            let store = Store::open_locked(&ipam.store_dir, LOCK_TIMEOUT)?;
            let mut out = Allocation::default();
            for (i, set) in ipam.range_sets.iter().enumerate() {
                let before = store.cursor(i);
                match store.reserve(i, set, &env.container_id, &env.ifname) {
                    Ok((ip, range)) => {
                        out.cursors.push((i, before, ip));
                        out.ips.push(IpConfig {
                            version: None,
                            interface: None,
                            address: range.with_prefix(ip),
                            gateway: Some(range.gateway),
                        })
                    }
                    Err(e) => {
                        // Nothing half-allocated survives a failed ADD:
                        // neither an address nor a moved cursor.
                        undo(&store, env, &out);
                        return Err(e);
                    }
                }
            }
            out.routes = ipam.routes.clone();
            Ok(out)
        }
    }
}

/// Releases what (container, ifname) holds; returns the freed addresses
/// when the store knows them. Idempotent.
pub fn release(env: &CniEnv, plan: &Plan) -> Result<Vec<IpAddr>> {
    match &plan.ipam {
        IpamPlan::None => Ok(Vec::new()),
        IpamPlan::Delegate { plugin } => {
            delegate::exec(plugin, "DEL", env, &plan.raw)?;
            Ok(Vec::new())
        }
        IpamPlan::Builtin(ipam) => {
            if !ipam.store_dir.exists() {
                return Ok(Vec::new());
            }
            let store = Store::open_locked(&ipam.store_dir, LOCK_TIMEOUT)?;
            store.release(&env.container_id, &env.ifname)
        }
    }
}

/// Undoes `allocate` after a failed ADD: exactly the addresses it handed
/// out, so an earlier reservation of the same attachment is left alone.
pub fn release_allocation(env: &CniEnv, plan: &Plan, alloc: &Allocation) {
    match &plan.ipam {
        IpamPlan::None => {}
        // A delegated plugin releases by (container, ifname): call it only if
        // this ADD did allocate, or an existing attachment's address goes too.
        IpamPlan::Delegate { .. } if !alloc.ips.is_empty() => {
            let _ = release(env, plan);
        }
        IpamPlan::Delegate { .. } => {}
        IpamPlan::Builtin(ipam) => {
            if let Ok(store) = Store::open_locked(&ipam.store_dir, LOCK_TIMEOUT) {
                undo(&store, env, alloc);
            }
        }
    }
}

/// Releases exactly the addresses of `alloc` and puts each cursor back
/// where it was, unless another ADD moved it since.
fn undo(store: &Store, env: &CniEnv, alloc: &Allocation) {
    for ip in &alloc.ips {
        let _ = store.release_ip(ip.address.addr(), &env.container_id, &env.ifname);
    }
    for (set, before, after) in &alloc.cursors {
        if store.cursor(*set) == Some(*after) {
            let _ = store.set_cursor(*set, *before);
        }
    }
}

/// Verifies that each address is still reserved for (container, ifname).
pub fn check(env: &CniEnv, plan: &Plan, ips: &[IpAddr]) -> Result<()> {
    match &plan.ipam {
        IpamPlan::None => Ok(()),
        IpamPlan::Delegate { plugin } => {
            delegate::exec(plugin, "CHECK", env, &plan.raw).map(|_| ())
        }
        IpamPlan::Builtin(ipam) => {
            let store = Store::open_locked(&ipam.store_dir, LOCK_TIMEOUT)?;
            let held = store.find(&env.container_id, &env.ifname)?;
            for ip in ips {
                if !held.contains(ip) {
                    return Err(CniError::new(
                        cnilab_net::spec::code::CHECK_MISMATCH,
                        format!(
                            "address {ip} is not reserved for container {} ifname {} in {}",
                            env.container_id,
                            env.ifname,
                            ipam.store_dir.display()
                        ),
                    ));
                }
            }
            Ok(())
        }
    }
}
