//! devgate: an OCI runtime hook that checks the devices assigned to a container before it
//! starts, and tells kubelet and operators why when a device is the reason it cannot.

pub mod cgroup;
pub mod class;
pub mod cli;
pub mod config;
pub mod device;
pub mod error;
pub mod fsutil;
pub mod hook;
pub mod hooks_config;
pub mod ledger;
pub mod nsdev;
pub mod policy;
pub mod probe;
pub mod record;
pub mod remap;
pub mod spec;
pub mod state;
pub mod wrapper;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub mod fault;
pub mod inventory;
pub mod termination;
