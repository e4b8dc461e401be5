//! devgate: an OCI runtime hook that checks the devices assigned to a container before it
//! starts, and tells kubelet and operators why when a device is the reason it cannot.
//!
//! The modules are listed in the order the data flows through a hook call, and each
//! imports only those above it (tests/layering.rs checks this; docs/architecture.md has
//! the map).

// 0. Plumbing every layer uses: errors, bounded reads, atomic writes.
pub mod error;
pub(crate) mod fsutil;
// 1. The shared vocabulary: devices, classes, verdicts, text escaping, the clock.
pub mod model;
// 2. What the runtime hands a hook: the state on stdin, the bundle's config.json, the stage.
pub mod oci;
// 3. devgate's own config file.
pub mod config;
// 4. devgate's files on the node: quarantine ledger, spare leases, container records.
pub mod store;
// 5. Spec → the devices a container is assigned; the host's /dev.
pub mod discover;
// 6. NVIDIA GPUs: the selectors a spec names them by, the driver's list, NVML in query
//    processes, the kernel log's XID history; `gpu::assigned` is the pipeline's entry.
pub mod gpu;
// 7. Health probes: node, sysfs, pcie, quarantine, and thin GPU probes over `gpu`.
pub mod probe;
// 8. The decision table: verdicts and class → disposition. Pure.
pub(crate) mod policy;
// 9. What devgate does to a running container: remap (cgroup, /dev node). Public for the
// tests' stand-in containers, which attach a runtime-like v2 device program with it.
pub mod action;
// 10. What devgate leaves for people: records, faults, termination message, inventory.
pub(crate) mod report;
// 11. One hook call, start to end: the only module that knows every stage.
pub(crate) mod pipeline;
// 12. The static programs' hand-on to devgate (`devgate-hook`, `devgate-runtime`): whether
//     a call may need NVML, which a static program cannot load, and the exec of the
//     devgate beside them that can. Decided before the pipeline runs.
pub mod front;
// 13. The OCI runtime wrapper (`devgate runtime`, `devgate-runtime`): the gate before the
//     runtime reads the spec, a remap written into it, then the real runtime.
pub mod wrapper;
// 14. The command line.
pub mod cli;
// 15. Entry points for the fuzz targets under fuzz/; not an API.
#[doc(hidden)]
pub mod fuzzing;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The hidden first argument that makes devgate the NVML query process; main.rs checks it
/// before anything else runs (see `gpu::nvml::isolate`).
#[doc(hidden)]
pub const NVML_QUERY_ARG: &str = gpu::nvml::isolate::QUERY_ARG;

/// The NVML query process: forks one child per GPU and ends. Never returns.
#[doc(hidden)]
pub fn serve_nvml_query(args: &[std::ffi::OsString]) -> ! {
    gpu::nvml::child::serve(args)
}
