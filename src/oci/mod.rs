//! What an OCI runtime hands a hook: the container state on stdin, the bundle's
//! config.json (only the fields devgate reads), and the lifecycle stage.

mod caps;
mod gokeys;
pub mod spec;
pub(crate) mod stage;
pub(crate) mod state;
