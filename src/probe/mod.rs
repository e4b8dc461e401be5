//! Health probes. Each probe looks at one aspect of one device and returns a verdict;
//! probes never call each other, and [`probe_all`] runs every probe on every device.

pub(crate) mod counters;
pub(crate) mod node;
pub mod nvidia;
pub(crate) mod pcie;
pub(crate) mod quarantine;
pub(crate) mod sysfs;

use crate::config::Config;
use crate::model::device::Device;
use crate::model::verdict::{ProbeResult, Verdict};
use crate::store::quarantine::Ledger;
use node::NodeProbe;
use nvidia::gpu::NvmlProbe;
use nvidia::xid::XidProbe;
use nvidia::GpuContext;
use pcie::PcieProbe;
use quarantine::QuarantineProbe;
use sysfs::SysfsProbe;

pub trait Probe {
    fn name(&self) -> &'static str;
    fn check(&self, device: &Device) -> Verdict;
}

/// Runs every probe on one device, in order.
pub fn run_all(probes: &[&dyn Probe], device: &Device) -> Vec<ProbeResult> {
    probes
        .iter()
        .map(|p| ProbeResult {
            probe: p.name().to_string(),
            verdict: p.check(device),
        })
        .collect()
}

/// Runs every probe on every device. The probe list is built once per call; the NVML and
/// XID probes join it only when a device has an NVIDIA class and the caller gathered their
/// context.
pub fn probe_all(
    config: &Config,
    ledger: &Ledger,
    devices: &[Device],
    gpu: Option<&GpuContext>,
) -> Vec<Vec<ProbeResult>> {
    let node = NodeProbe {
        dev_root: config.dev_root.clone(),
    };
    let sysfs = SysfsProbe {
        sysfs_root: config.sysfs_root.clone(),
    };
    let quarantine = QuarantineProbe { ledger };
    let nvidia = devices.iter().any(|d| d.class.is_nvidia());
    let gpu = gpu.filter(|_| nvidia);
    let pcie = PcieProbe {
        sysfs_root: config.sysfs_root.clone(),
        state_dir: config.state_dir.clone(),
        gpu,
    };
    let nvml_probe = gpu.map(|g| NvmlProbe {
        answer: &g.nvml,
        limits: g.limits,
        gpus: nvidia::gpu_minors(devices).len(),
    });
    let xid_probe = gpu.map(|g| XidProbe {
        scan: &g.kmsg,
        table: &g.xid_table,
        nvml: &g.nvml,
        proc: &g.proc_gpus,
    });
    let mut probes: Vec<&dyn Probe> = vec![&node, &sysfs, &pcie, &quarantine];
    if let Some(p) = &nvml_probe {
        probes.push(p);
    }
    if let Some(p) = &xid_probe {
        probes.push(p);
    }
    devices.iter().map(|d| run_all(&probes, d)).collect()
}
