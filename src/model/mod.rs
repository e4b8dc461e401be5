//! The shared vocabulary every layer speaks: a device and its number, device classes,
//! a probe's verdict and its reason code, text escaping and the clock. Imports nothing
//! else of devgate's but its error type.

pub mod class;
pub mod clock;
pub mod device;
pub(crate) mod devtype;
pub(crate) mod reason;
pub mod recovery;
pub mod rule_number;
pub mod text;
pub mod verdict;
