//! Health probes. Each probe looks at one aspect of one device and returns a verdict;
//! probes never call each other, and [`probe_all`] runs every probe on every device.
//!
//! What a probe read on the way (the node's stat, the PCI function behind the device, its
//! AER counters) it writes into the device's [`Findings`], kept beside the verdicts: a
//! later probe of the same device and the stages after the probes (the PCIe baseline move,
//! the start snapshot) take it from there instead of reading sysfs again, so each file is
//! read once per start. Whoever finds a field empty (its probe did not run, as for a spare
//! the remap probed on its own) reads it itself.

pub(crate) mod cluster;
pub(crate) mod counters;
pub(crate) mod findings;
pub(crate) mod gpu;
pub(crate) mod node;
pub(crate) mod pcie;
pub(crate) mod quarantine;
pub(crate) mod sysfs;

use crate::config::Config;
use crate::gpu::GpuContext;
use crate::model::device::Device;
use crate::model::verdict::ProbeResult;
use crate::store::quarantine::Ledger;
use cluster::ClusterTaintProbe;
pub use findings::{Findings, Probe};
use gpu::{NvmlProbe, XidProbe};
pub use node::HostNodes;
use node::NodeProbe;
use pcie::PcieProbe;
use quarantine::QuarantineProbe;
use sysfs::SysfsProbe;

/// The probes' verdicts per device, and beside them what they read, in device order.
#[derive(Debug, Default)]
pub struct Probed {
    pub verdicts: Vec<Vec<ProbeResult>>,
    pub findings: Vec<Findings>,
}

/// Runs every probe on one device, in order.
pub fn run_all(probes: &[&dyn Probe], device: &Device) -> (Vec<ProbeResult>, Findings) {
    let mut found = Findings::default();
    let verdicts = probes
        .iter()
        .map(|p| ProbeResult {
            probe: p.name().to_string(),
            verdict: p.check(device, &mut found),
        })
        .collect();
    (verdicts, found)
}

/// Runs every probe on every device. The probe list is built once per call; the NVML, XID
/// and cluster probes join it only when a device has an NVIDIA class and the caller
/// gathered their context. `nodes` says whether discovery just found the devices' host
/// nodes; `pod_uid` is the container's pod (the cluster probe's tolerations), None for
/// `status` and spares.
pub fn probe_all(
    config: &Config,
    ledger: &Ledger,
    devices: &[Device],
    gpu: Option<&GpuContext>,
    nodes: HostNodes,
    pod_uid: Option<&str>,
) -> Probed {
    let node = NodeProbe {
        dev_root: config.dev_root.clone(),
        nodes,
    };
    let sysfs = SysfsProbe::new(&config.sysfs_root);
    let quarantine = QuarantineProbe { ledger };
    let nvidia = devices.iter().any(|d| d.class.is_nvidia());
    let gpu = gpu.filter(|_| nvidia);
    let pcie = PcieProbe::new(&config.sysfs_root, &config.state_dir, gpu);
    let nvml_probe = gpu.map(|g| NvmlProbe {
        answer: &g.nvml,
        limits: g.limits,
        gpus: crate::gpu::gpu_minors(devices).len(),
    });
    let xid_probe = gpu.map(|g| XidProbe {
        scan: &g.kmsg,
        table: &g.xid_table,
        nvml: &g.nvml,
        proc: &g.proc_gpus,
    });
    let cluster_probe = gpu.map(|gpu| ClusterTaintProbe {
        gpu,
        pod_uid,
        max_age_s: config.cluster_taints_max_age_s,
        now: crate::model::clock::now_unix(),
    });
    let mut probes: Vec<&dyn Probe> = vec![&node, &sysfs, &pcie, &quarantine];
    if let Some(p) = &nvml_probe {
        probes.push(p);
    }
    if let Some(p) = &xid_probe {
        probes.push(p);
    }
    if let Some(p) = &cluster_probe {
        probes.push(p);
    }
    let (verdicts, findings) = devices.iter().map(|d| run_all(&probes, d)).unzip();
    Probed { verdicts, findings }
}
