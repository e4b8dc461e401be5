//! devgate's files on the node: the operator's quarantine (cordon) ledger, spare leases
//! and, under state_dir, per-container records, the runtime wrapper's marker and the node
//! agent's cluster taints. Each is
//! one JSON file read and written here: bounded reads, atomic writes, and every directory
//! checked.

pub mod cluster;
mod json;
pub mod lease;
pub(crate) mod marker;
pub(crate) mod pcie;
pub(crate) mod quarantine;
pub(crate) mod records;

pub(crate) use json::to_json_line;
pub use json::{file_name, num_from_file_name};
