//! What the GPU probes read once per hook call: NVML's answer and the kernel log, in one
//! [`GpuContext`], with the small lookups around it.

use super::driver::{self, ProcGpu};
use super::{checks, kmsg, nvml, pci, xid_history};
use crate::config::xid::XidTable;
use crate::config::Config;
use crate::model::class::Class;
use crate::model::device::Device;
use crate::store::cluster::TaintsOnce;
use std::time::Duration;

/// What the GPU probes read once per hook call: NVML's answer and the kernel log.
pub struct GpuContext {
    pub nvml: nvml::NvmlAnswer,
    pub kmsg: std::result::Result<kmsg::KmsgScan, kmsg::KmsgError>,
    pub xid_table: XidTable,
    pub limits: checks::Limits,
    /// The driver's own list of GPUs (minor ↔ PCI address), read before NVML.
    pub proc_gpus: Vec<driver::ProcGpu>,
    /// The node agent's cluster taints, read on the first GPU that asks (the cluster
    /// probe), once for the call's probes and spares alike.
    pub cluster_taints: TaintsOnce,
}

impl GpuContext {
    /// NVML's answer for the GPUs behind `minors`, and the kernel log. Each GPU is found by
    /// the driver's list and asked about on its own (bounded by `probe_timeout_ms`); only
    /// when that list cannot be read does NVML enumerate every GPU.
    pub fn gather(config: &Config, minors: &[u32]) -> GpuContext {
        let driver = driver_gpus(config);
        if driver.is_empty() {
            return GpuContext::enumerated(config);
        }
        GpuContext::for_minors(config, &driver, minors)
    }

    /// NVML's answer for the listed GPUs behind `minors` (`driver`: [`driver_gpus`]).
    pub fn for_minors(config: &Config, driver: &[(u32, ProcGpu)], minors: &[u32]) -> GpuContext {
        let wanted: Vec<(u32, ProcGpu)> = driver
            .iter()
            .filter(|(_, p)| minors.contains(&p.minor))
            .cloned()
            .collect();
        let stuck = nvml::stuck::Stuck::new(&config.state_dir);
        // The kernel log is read while the NVML children run.
        let mut log = None;
        let nvml = nvml::NvmlAnswer::for_gpus(
            &config.nvml_library,
            &config.proc_root,
            timeout(config),
            &wanted,
            &stuck,
            || log = Some(read_log(config)),
        );
        let proc_gpus = driver.iter().map(|(_, p)| p.clone()).collect();
        GpuContext::with(config, nvml, log, proc_gpus)
    }

    /// Every GPU NVML counts, in one process: for a node whose driver list is unreadable.
    pub fn enumerated(config: &Config) -> GpuContext {
        let mut log = None;
        let nvml = nvml::NvmlAnswer::enumerate(
            &config.nvml_library,
            &config.proc_root,
            timeout(config),
            || log = Some(read_log(config)),
        );
        GpuContext::with(config, nvml, log, Vec::new())
    }

    fn with(
        config: &Config,
        nvml: nvml::NvmlAnswer,
        log: Option<Kmsg>,
        proc_gpus: Vec<ProcGpu>,
    ) -> GpuContext {
        GpuContext {
            nvml,
            kmsg: log.unwrap_or_else(|| read_log(config)),
            // validated when the config was loaded
            xid_table: XidTable::new(&config.gpu.xid_actions).unwrap_or_default(),
            limits: checks::Limits {
                max_volatile_uncorrectable_ecc: config.gpu.max_volatile_uncorrectable_ecc,
            },
            proc_gpus,
            cluster_taints: TaintsOnce::new(&config.state_dir),
        }
    }

    /// The PCI address of /dev/nvidia`minor`: NVML's answer, else the driver's /proc list,
    /// which still answers when NVML is missing, stuck or has lost the GPU.
    pub fn pci_of_minor(&self, minor: u32) -> Option<pci::PciAddr> {
        self.nvml
            .pci_of_minor(minor)
            .or_else(|| driver::pci_of_minor(&self.proc_gpus, minor))
    }

    /// Only a GPU opens NVML: containers without one never load the library.
    pub fn for_devices(config: &Config, devices: &[Device]) -> Option<GpuContext> {
        has_gpu(devices).then(|| GpuContext::gather(config, &gpu_minors(devices)))
    }

    /// The UUID of /dev/nvidia`minor`: NVML's answer, else the driver's /proc list.
    pub fn uuid_of_minor(&self, minor: u32) -> Option<&str> {
        self.nvml
            .gpu_by_minor(minor)
            .and_then(|g| g.uuid.value())
            .or_else(|| {
                let p = self.proc_gpus.iter().find(|g| g.minor == minor)?;
                p.uuid.as_ref()
            })
            .map(String::as_str)
    }

    /// Whether this context can judge /dev/nvidia`minor`: NVML enumerated every GPU, or
    /// was asked about this one.
    pub fn covers(&self, minor: u32) -> bool {
        self.nvml.lookup == nvml::Lookup::Enumeration || self.nvml.gpu_by_minor(minor).is_some()
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

/// The kernel log as read for this hook call, or why it could not be.
pub(crate) type Kmsg = std::result::Result<kmsg::KmsgScan, kmsg::KmsgError>;

/// The kernel log, bounded by `probe_timeout_ms`, through the cache in `state_dir`.
pub(crate) fn read_log(config: &Config) -> Kmsg {
    let limits = kmsg::ReadLimits {
        deadline: timeout(config),
        ..kmsg::ReadLimits::default()
    };
    xid_history::read_with_history(
        &config.kmsg_path,
        limits,
        &config.state_dir,
        &config.proc_root,
    )
}

fn timeout(config: &Config) -> Duration {
    Duration::from_millis(config.probe_timeout_ms)
}

/// The driver's list of GPUs, each with its index in it: NVML numbers GPUs in PCI address
/// order, and the list is sorted so. Empty when the driver is not loaded or /proc is not
/// readable.
pub fn driver_gpus(config: &Config) -> Vec<(u32, ProcGpu)> {
    driver::read_gpus(&config.proc_root)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (i as u32, p))
        .collect()
}

/// The minors of the NVIDIA GPUs among `devices`.
pub fn gpu_minors(devices: &[Device]) -> Vec<u32> {
    devices
        .iter()
        .filter(|d| d.class == Class::NvidiaGpu)
        .map(|d| d.num.minor)
        .collect()
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
