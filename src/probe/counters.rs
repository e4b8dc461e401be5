//! The counters that can change while a container runs, read at start (the snapshot kept
//! in its record) and again at poststop; `report::fault` compares the two.

use crate::config::Config;
use crate::model::class::Class;
use crate::model::device::{DevNum, Device};
use crate::probe::nvidia::GpuContext;
use crate::probe::pcie;
use crate::store::quarantine::{Ledger, Lookup};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One device's changeable state at a moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCounters {
    pub node_present: bool,
    pub quarantined: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine_reason: Option<String>,
    /// The PCI function behind the device, when sysfs knows one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aer_fatal: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aer_nonfatal: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuCounters>,
}

/// What NVML reports for a GPU that can change during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuCounters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// NVML answered and the GPU was reachable.
    pub reachable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_volatile_uncorrectable: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_uncorrectable: Option<u64>,
    #[serde(default)]
    pub remap_failure: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    #[serde(flatten)]
    pub num: DevNum,
    pub name: String,
    pub counters: DeviceCounters,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub time_unix: u64,
    /// The kernel log's next sequence number at start: XIDs at or after it happened during
    /// the run. None when the log could not be read at start: then no XID is blamed on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kmsg_seq: Option<u64>,
    pub devices: Vec<DeviceSnapshot>,
}

/// Reads one device's counters now. GPU counters are filled by the caller, which owns the
/// (deadline-guarded) NVML session; its context gives a GPU's PCI function.
pub fn read_counters(
    config: &Config,
    ledger: &Ledger,
    device: &Device,
    gpu: Option<&GpuContext>,
) -> DeviceCounters {
    let node_present = device
        .host_path
        .as_ref()
        .and_then(|p| crate::discover::node_metadata(&config.dev_root, p).ok())
        .and_then(|m| DevNum::from_metadata(&m))
        == Some(device.num);
    let (quarantined, quarantine_reason) = match ledger.lookup(device.num) {
        Lookup::Clear => (false, None),
        Lookup::Cordoned(e) => (true, Some(e.reason)),
        Lookup::Damaged { .. } => (true, None),
    };
    let pci_dir: Option<PathBuf> = pcie::function_dir(&config.sysfs_root, device, gpu);
    let (aer_fatal, aer_nonfatal) = match pci_dir.as_deref().and_then(pcie::read_aer) {
        Some(Ok(c)) => (Some(c.fatal), Some(c.nonfatal)),
        _ => (None, None),
    };
    DeviceCounters {
        node_present,
        quarantined,
        quarantine_reason,
        pci: pci_dir.and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned())),
        aer_fatal,
        aer_nonfatal,
        gpu: None,
    }
}

/// One device's counters now, GPU counters included when NVML answered.
pub fn snapshot_of(
    config: &Config,
    ledger: &Ledger,
    device: &Device,
    gpu: Option<&GpuContext>,
) -> DeviceSnapshot {
    let mut counters = read_counters(config, ledger, device, gpu);
    if device.class == Class::NvidiaGpu {
        counters.gpu = gpu.and_then(|g| g.nvml.counters(device.num.minor));
    }
    DeviceSnapshot {
        num: device.num,
        name: device.name(),
        counters,
    }
}
