//! NVIDIA GPUs: what NVML says about each GPU (`nvml`) and what the driver reported in the
//! kernel log (`kmsg`, judged by `xid`), both read once per hook call into a [`GpuContext`].

pub(crate) mod gpu;
pub mod gpu_at;
pub mod kmsg;
pub mod kmsg_cache;
pub(crate) mod kmsg_record;
pub(crate) mod nvml;
pub mod pci;
pub(crate) mod procfs;
pub(crate) mod xid;

use crate::config::xid::XidTable;
use crate::config::Config;
use crate::model::class::Class;
use crate::model::device::Device;
use std::time::Duration;

/// What the GPU probes read once per hook call: NVML's answer and the kernel log.
pub struct GpuContext {
    pub nvml: nvml::NvmlAnswer,
    pub kmsg: std::result::Result<kmsg::KmsgScan, String>,
    pub xid_table: XidTable,
    pub limits: gpu::Limits,
    /// The driver's own list of GPUs (minor ↔ PCI address), read before NVML.
    pub proc_gpus: Vec<procfs::ProcGpu>,
}

impl GpuContext {
    /// Opens NVML (bounded by `probe_timeout_ms`) and reads `kmsg_path` (through the
    /// cache in `state_dir`).
    pub fn gather(config: &Config) -> GpuContext {
        let timeout = Duration::from_millis(config.probe_timeout_ms);
        let proc_gpus = procfs::read_gpus(&config.proc_root);
        let nvml = nvml::NvmlAnswer::take(&config.nvml_library, timeout, proc_gpus.clone());
        let limits = kmsg::ReadLimits {
            deadline: timeout,
            ..kmsg::ReadLimits::default()
        };
        GpuContext {
            nvml,
            kmsg: kmsg_cache::read_kmsg_cached(
                &config.kmsg_path,
                limits,
                &config.state_dir,
                &config.proc_root,
            ),
            // validated when the config was loaded
            xid_table: XidTable::new(&config.gpu.xid_actions).unwrap_or_default(),
            limits: gpu::Limits {
                max_volatile_uncorrectable_ecc: config.gpu.max_volatile_uncorrectable_ecc,
            },
            proc_gpus,
        }
    }

    /// Only a GPU opens NVML: containers without one never load the library.
    pub fn for_devices(config: &Config, devices: &[Device]) -> Option<GpuContext> {
        has_gpu(devices).then(|| GpuContext::gather(config))
    }

    /// The first kernel log sequence number after what devgate saw at start; None when the
    /// log could not be read, so that poststop never blames a run for older reports.
    pub fn next_kmsg_seq(&self) -> Option<u64> {
        let scan = self.kmsg.as_ref().ok()?;
        // A read cut short does not know where the log ends.
        if scan.truncated {
            return None;
        }
        Some(scan.last_seq.map_or(0, |s| s + 1))
    }
}

/// A node with no NVIDIA GPU at all: no driver in procfs, NVML unusable, and no PCI
/// function of vendor 0x10de in sysfs. There, GPU selectors from env and annotations (set
/// by every CUDA image) mean nothing. A node with NVIDIA functions but no driver loaded is
/// a GPU node with a broken driver, and its selectors are judged.
pub fn no_nvidia_node(config: &Config, nvml: &nvml::NvmlAnswer) -> bool {
    nvml.gpus.is_err()
        && !config.proc_root.join("driver/nvidia").exists()
        && !has_nvidia_pci(&config.sysfs_root)
}

/// More PCI functions than any node has; the rest are not read.
const MAX_PCI_FUNCTIONS: usize = 4096;

fn has_nvidia_pci(sysfs_root: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(sysfs_root.join("bus/pci/devices")) else {
        return false;
    };
    entries.take(MAX_PCI_FUNCTIONS).flatten().any(|e| {
        crate::fsutil::read_regular_file(&e.path().join("vendor"), 64, "PCI vendor")
            .is_ok_and(|v| String::from_utf8_lossy(&v).trim() == "0x10de")
    })
}

pub fn has_gpu(devices: &[Device]) -> bool {
    devices.iter().any(|d| d.class == Class::NvidiaGpu)
}
