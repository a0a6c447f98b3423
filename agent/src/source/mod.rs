//! Where the node list comes from. Each source publishes complete snapshots;
//! the reconcile loop only ever sees the latest one.

pub mod file;
pub mod kube;
