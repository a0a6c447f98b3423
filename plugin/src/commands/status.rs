//! STATUS (1.1.0): ready when the store is writable and no range is full.

use super::{delegate, require_version};
use crate::config::{IpamPlan, Plan};
use crate::env::CniEnv;
use crate::error::{CniError, Result};
use crate::ipam::{Store, LOCK_TIMEOUT};
use cnilab_net::spec::{code, Version};

pub fn run(env: &CniEnv, plan: &Plan) -> Result<()> {
    require_version(plan, Version::V1_1_0, "STATUS")?;
    match &plan.ipam {
        IpamPlan::None => Ok(()),
        IpamPlan::Delegate { plugin } => {
            delegate::exec(plugin, "STATUS", env, &plan.raw).map(|_| ())
        }
        IpamPlan::Builtin(ipam) => {
            let unavailable = |e: CniError| CniError::new(code::NOT_AVAILABLE, e.msg);
            let store = Store::open_locked(&ipam.store_dir, LOCK_TIMEOUT).map_err(unavailable)?;
            store.probe_writable().map_err(unavailable)?;
            for set in &ipam.range_sets {
                let (taken, capacity) = store.usage(set).map_err(unavailable)?;
                if taken >= capacity {
                    let names: Vec<String> = set.iter().map(|r| r.subnet.to_string()).collect();
                    return Err(CniError::new(
                        code::NOT_AVAILABLE,
                        format!(
                            "range {} is exhausted: {taken} of {capacity} addresses reserved",
                            names.join(", ")
                        ),
                    ));
                }
            }
            Ok(())
        }
    }
}
