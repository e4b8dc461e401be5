//! What devgate leaves behind for people and tools: the decision log and records, the
//! faults found at stop, the termination message kubelet shows, and the node inventory
//! behind `status`, `check` and `metrics`.

pub(crate) mod error;
pub(crate) mod fault;
pub(crate) mod inventory;
pub(crate) mod metrics;
pub(crate) mod pod_log;
pub(crate) mod prior;
pub(crate) mod record;
pub(crate) mod termination;
