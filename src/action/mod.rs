//! What devgate does to a container that is about to start: swap a bad device for a
//! healthy spare (`remap`), editing its device cgroup (`cgroup`) and its /dev (`nsdev`).

pub mod cgroup;
pub(crate) mod error;
pub(crate) mod nsdev;
pub(crate) mod remap;
pub(crate) mod spare;
