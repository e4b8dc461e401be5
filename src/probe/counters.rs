//! The counters that can change while a container runs, read at start (the snapshot kept
//! in its record) and again at poststop; `report::fault` compares the two.

use crate::config::Config;
pub use crate::gpu::nvml::GpuCounters;
use crate::gpu::GpuContext;
use crate::model::class::Class;
use crate::model::device::{DevNum, Device};
use crate::probe::findings::Findings;
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

/// One device's counters: from what the probes read of it at this start (`found`), else
/// read now (poststop; a spare the remap put in). GPU counters are filled by the caller,
/// which owns the (deadline-guarded) NVML session; its context gives a GPU's PCI function.
pub fn read_counters(
    config: &Config,
    ledger: &Ledger,
    device: &Device,
    gpu: Option<&GpuContext>,
    found: Option<&Findings>,
) -> DeviceCounters {
    let node_present = found.and_then(|f| f.node_present).unwrap_or_else(|| {
        device
            .host_path
            .as_ref()
            .and_then(|p| crate::discover::node_metadata(&config.dev_root, p).ok())
            .and_then(|m| DevNum::from_metadata(&m))
            == Some(device.num)
    });
    let (quarantined, quarantine_reason) = match ledger.lookup(device.num) {
        Lookup::Clear => (false, None),
        Lookup::Cordoned(e) => (true, Some(e.reason)),
        Lookup::Damaged { .. } => (true, None),
    };
    // The device's own function is the first the pcie probe read.
    let (pci, aer) = match found.and_then(|f| f.pcie.as_ref()) {
        Some(seen) => match seen.first() {
            Some(f) => (Some(f.name.clone()), f.aer.clone()),
            None => (None, None),
        },
        None => {
            let dir: Option<PathBuf> = pcie::function_dir(&config.sysfs_root, device, gpu);
            let aer = dir.as_deref().and_then(pcie::read_aer);
            let name = dir.and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
            (name, aer)
        }
    };
    let (aer_fatal, aer_nonfatal) = match aer {
        Some(Ok(c)) => (Some(c.fatal), Some(c.nonfatal)),
        _ => (None, None),
    };
    DeviceCounters {
        node_present,
        quarantined,
        quarantine_reason,
        pci,
        aer_fatal,
        aer_nonfatal,
        gpu: None,
    }
}

/// One device's counters, GPU counters included when NVML answered; `found` as for
/// [`read_counters`].
pub fn snapshot_of(
    config: &Config,
    ledger: &Ledger,
    device: &Device,
    gpu: Option<&GpuContext>,
    found: Option<&Findings>,
) -> DeviceSnapshot {
    let mut counters = read_counters(config, ledger, device, gpu, found);
    if device.class == Class::NvidiaGpu {
        counters.gpu = gpu.and_then(|g| g.nvml.counters(device.num.minor));
    }
    DeviceSnapshot {
        num: device.num,
        name: device.name(),
        counters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::{DevType, Source};
    use crate::probe::pcie::FunctionSeen;
    use crate::store::pcie::AerCounts;

    #[test]
    fn the_start_snapshot_takes_what_the_probes_read_and_reads_only_without_it() {
        let dir = crate::fsutil::tests::tempdir("devgate-counters-found");
        let config = Config {
            quarantine_dir: dir.join("q"),
            state_dir: dir.join("s"),
            sysfs_root: dir.join("sys"),
            ..Config::default()
        };
        let ledger = Ledger::new(&config.quarantine_dir);
        let null = Device {
            num: DevNum {
                typ: DevType::Char,
                major: 1,
                minor: 3,
            },
            class: "char".into(),
            container_path: Some("/dev/null".into()),
            host_path: Some("/dev/null".into()),
            source: Source::LinuxDevices,
            file_mode: None,
            uid: None,
            gid: None,
        };
        // read now: the node is there, and the empty sysfs tree has no PCI function
        let now = read_counters(&config, &ledger, &null, None, None);
        assert!(now.node_present);
        assert_eq!((now.pci, now.aer_fatal), (None, None));
        // from the probes' findings: nothing is read again, so findings that disagree with
        // the node and with sysfs (a function directory that does not exist) are what the
        // snapshot says
        let found = Findings {
            node_present: Some(false),
            device_pci: Some(None),
            pcie: Some(vec![FunctionSeen {
                dir: dir.join("nowhere/0000:3b:00.0"),
                name: "0000:3b:00.0".into(),
                aer: Some(Ok(AerCounts {
                    correctable: 9,
                    nonfatal: 1,
                    fatal: 2,
                })),
                replay: None,
                baseline: Ok(None),
            }]),
        };
        let c = read_counters(&config, &ledger, &null, None, Some(&found));
        assert!(!c.node_present);
        assert_eq!(c.pci.as_deref(), Some("0000:3b:00.0"));
        assert_eq!((c.aer_fatal, c.aer_nonfatal), (Some(2), Some(1)));
        // the pcie probe found no function: none, without looking
        let none = Findings {
            pcie: Some(Vec::new()),
            ..found
        };
        let c = read_counters(&config, &ledger, &null, None, Some(&none));
        assert_eq!((c.pci, c.aer_fatal), (None, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
