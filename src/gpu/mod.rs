//! NVIDIA GPUs, as devgate sees them. The pipeline's one entry point is [`assigned`]: the
//! GPUs a container's spec asks for, the context the GPU probes read, and the warnings.
//!
//! - What a container asks for: its selectors (`NVIDIA_VISIBLE_DEVICES`, CDI annotations,
//!   the device plugin's mounts) in `request`, each token read by NVIDIA's grammar in
//!   `selector`, resolved to GPUs in `select`.
//! - What the node has: the driver's list (`driver`), NVML in query processes of its own
//!   (`nvml`), PCI addresses (`pci`).
//! - What the driver reported: the kernel log (`kmsg`, `kmsg_record`), kept as the XID
//!   history of this boot (`xid_history`), where a lost GPU's UUID was (`gpu_at`).
//! - What it means: NVML's answer judged against the operator's limits (`checks`), XID
//!   reports judged by the catalog (`xid`), NVML's recovery action (`recovery`). Pure;
//!   the probes in `probe::gpu` only call them.

mod assign;
pub(crate) mod checks;
mod context;
pub mod driver;
pub mod gpu_at;
pub mod kmsg;
mod kmsg_error;
pub(crate) mod kmsg_record;
pub(crate) mod nvml;
pub mod pci;
pub(crate) mod recovery;
pub mod request;
pub(crate) mod select;
pub mod selector;
pub(crate) mod xid;
pub mod xid_history;

pub use assign::{assigned, may_have_devices, may_name_nvidia, Assigned};
pub use context::{driver_gpus, gpu_minors, has_gpu, no_nvidia_node, GpuContext};
