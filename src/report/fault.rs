//! Faults during a run: the start snapshot of the counters that can change while a
//! container runs (`probe::counters`), compared with the live values at poststop. Pure.

use crate::config::xid::describe_xid;
use crate::gpu::pci::PciAddr;
use crate::gpu::GpuContext;
use crate::model::device::DevNum;
use crate::model::text::one_line;
use crate::model::verdict::Code;
use crate::probe::counters::{DeviceCounters, DeviceSnapshot, Snapshot};
use serde::{Deserialize, Serialize};

/// A kernel XID report, already attributed to a PCI bus id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidReport {
    pub seq: u64,
    pub pci: String,
    pub xid: u32,
    pub critical: bool,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// Short and machine-readable: `DeviceFault/XID79`, `DeviceFault/ECCUncorrectable`.
    pub code: String,
    /// The reason code the probes give the same finding (`xid_critical`, `gpu_lost`): what
    /// the next start's verdict carries, so that faults and verdicts group together.
    /// Unspecified in an exit record written before codes.
    #[serde(default)]
    pub reason_code: Code,
    /// The device as a person names it (container path, or host path).
    pub device: String,
    #[serde(flatten)]
    pub num: DevNum,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    /// One human line: `GPU has fallen off the bus`.
    pub message: String,
}

impl Fault {
    /// `DeviceFault/XID79 on /dev/nvidia1 (GPU-…): GPU has fallen off the bus`
    pub fn line(&self) -> String {
        let who = match &self.gpu_uuid {
            Some(u) => format!("{} ({u})", self.device),
            None => format!("{} ({})", self.device, self.num),
        };
        one_line(&format!(
            "devgate: {} on {who}: {}",
            self.code, self.message
        ))
    }
}

/// The faults between a start snapshot and the live counters of the same devices.
/// `xids` are the kernel reports read since the snapshot's kmsg position.
///
/// Long because it is the table of faults, one block per counter, in the order they are
/// reported; each block is a plain comparison.
pub fn diff(start: &Snapshot, now: &[DeviceSnapshot], xids: &[XidReport]) -> Vec<Fault> {
    let mut faults = Vec::new();
    for before in &start.devices {
        let Some(after) = now.iter().find(|d| d.num == before.num) else {
            continue;
        };
        let (b, a) = (&before.counters, &after.counters);
        let uuid = a
            .gpu
            .as_ref()
            .and_then(|g| g.uuid.clone())
            .or_else(|| b.gpu.as_ref().and_then(|g| g.uuid.clone()));
        let found = xid_faults(b, start.kmsg_seq, xids)
            .into_iter()
            .chain(gpu_faults(b, a))
            .chain(node_faults(b, a));
        faults.extend(found.map(|(code, reason_code, message)| Fault {
            code,
            reason_code,
            device: before.name.clone(),
            num: before.num,
            gpu_uuid: uuid.clone(),
            message,
        }));
    }
    faults
}

/// A fault found on one device, before it is named: its code, its reason code and its
/// message.
type Found = (String, Code, String);

/// The critical XIDs the driver reported for the device's GPU (by PCI bus id) during the
/// run, since the start's kernel log position `from`, each XID once.
fn xid_faults(b: &DeviceCounters, from: Option<u64>, xids: &[XidReport]) -> Vec<Found> {
    let mut out = Vec::new();
    let pci = b
        .gpu
        .as_ref()
        .and_then(|g| g.pci_bus_id.as_deref())
        .or(b.pci.as_deref())
        .and_then(PciAddr::parse);
    let (Some(pci), Some(from)) = (pci, from) else {
        return out;
    };
    let mut seen = Vec::new();
    for x in xids
        .iter()
        .filter(|x| x.critical && PciAddr::parse(&x.pci).is_some_and(|a| a.same_slot(&pci)))
    {
        if x.seq < from || seen.contains(&x.xid) {
            continue;
        }
        seen.push(x.xid);
        // XID 154 says what the GPU needs; the catalog's words say only that it changed.
        let recovery = crate::gpu::xid::parse_recovery_change(&x.text)
            .filter(|_| x.xid == crate::gpu::xid::XID_RECOVERY_ACTION)
            .map(|(_, to)| to);
        let (reason_code, message) = match recovery {
            Some(to) => (
                to.reason_code(),
                format!("the driver's recovery action is {}", to.describe()),
            ),
            None => (
                Code::XidCritical,
                describe_xid(x.xid)
                    .unwrap_or("GPU error reported by the driver")
                    .to_string(),
            ),
        };
        out.push((format!("DeviceFault/XID{}", x.xid), reason_code, message));
    }
    out
}

/// What NVML's counters say changed: the GPU lost, new uncorrectable ECC errors, a row
/// remap that failed.
fn gpu_faults(b: &DeviceCounters, a: &DeviceCounters) -> Vec<Found> {
    let mut out = Vec::new();
    let (Some(gb), Some(ga)) = (&b.gpu, &a.gpu) else {
        return out;
    };
    if gb.reachable && !ga.reachable {
        out.push((
            "DeviceFault/GPULost".into(),
            Code::GpuLost,
            "GPU is lost: NVML cannot reach it".into(),
        ));
    }
    if let (Some(x), Some(y)) = (gb.ecc_volatile_uncorrectable, ga.ecc_volatile_uncorrectable) {
        if y > x {
            out.push((
                "DeviceFault/ECCUncorrectable".into(),
                Code::EccVolatileUncorrectable,
                format!(
                    "{} new volatile uncorrectable ECC errors ({x} -> {y})",
                    y - x
                ),
            ));
        }
    }
    if !gb.remap_failure && ga.remap_failure {
        out.push((
            "DeviceFault/RowRemapFailure".into(),
            Code::RowRemapFailed,
            "row remapping failed".into(),
        ));
    }
    out
}

/// What any device's counters say changed: new AER fatal errors, its node gone, a cordon.
fn node_faults(b: &DeviceCounters, a: &DeviceCounters) -> Vec<Found> {
    let mut out = Vec::new();
    if let (Some(x), Some(y)) = (b.aer_fatal, a.aer_fatal) {
        if y > x {
            out.push((
                "DeviceFault/AERFatal".into(),
                Code::AerFatal,
                format!(
                    "{} new PCIe AER fatal errors on {} ({x} -> {y})",
                    y - x,
                    a.pci.as_deref().unwrap_or("its PCI function")
                ),
            ));
        }
    }
    if b.node_present && !a.node_present {
        out.push((
            "DeviceFault/NodeGone".into(),
            Code::NodeMissing,
            "device node disappeared".into(),
        ));
    }
    if !b.quarantined && a.quarantined {
        let why = a
            .quarantine_reason
            .as_deref()
            .map(|r| format!("cordoned by operator during the run: {r:?}"))
            .unwrap_or_else(|| "cordoned by operator during the run".into());
        out.push(("DeviceFault/Cordoned".into(), Code::Quarantined, why));
    }
    out
}

/// XID reports in the kernel log, classified by the operator's table.
pub fn xid_reports(gpu: &GpuContext) -> Vec<XidReport> {
    let Ok(scan) = &gpu.kmsg else {
        return Vec::new();
    };
    scan.events
        .iter()
        .map(|e| XidReport {
            seq: e.seq,
            pci: e.pci.to_string(),
            xid: e.xid,
            critical: crate::gpu::xid::blocks(e, &gpu.xid_table),
            text: e.text.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::DevType;
    use crate::probe::counters::{DeviceCounters, GpuCounters};

    const GPU1: DevNum = DevNum {
        typ: DevType::Char,
        major: 195,
        minor: 1,
    };

    fn snap(counters: DeviceCounters) -> DeviceSnapshot {
        DeviceSnapshot {
            num: GPU1,
            name: "/dev/nvidia1".into(),
            counters,
        }
    }

    fn gpu(ecc: u64, reachable: bool) -> Option<GpuCounters> {
        Some(GpuCounters {
            uuid: Some("GPU-1111".into()),
            pci_bus_id: Some("00000000:3B:00.0".into()),
            reachable,
            ecc_volatile_uncorrectable: Some(ecc),
            remapped_rows_uncorrectable: Some(0),
            remap_failure: false,
        })
    }

    fn base() -> DeviceCounters {
        DeviceCounters {
            node_present: true,
            gpu: gpu(0, true),
            aer_fatal: Some(0),
            ..Default::default()
        }
    }

    #[test]
    fn no_change_no_fault() {
        let start = Snapshot {
            time_unix: 1,
            kmsg_seq: Some(10),
            devices: vec![snap(base())],
        };
        assert!(diff(&start, &[snap(base())], &[]).is_empty());
    }

    /// Every kind of change in one run, so that the faults' order and what gives no fault
    /// are checked together: an XID from before the start's kernel log position, the same
    /// XID again, a non-critical one and one at another GPU's address. Long because the
    /// five kernel log reports are spelled out field by field.
    #[test]
    fn each_change_is_its_own_fault() {
        let start = Snapshot {
            time_unix: 1,
            kmsg_seq: Some(10),
            devices: vec![snap(base())],
        };
        let mut now = base();
        now.gpu = gpu(2, false);
        now.aer_fatal = Some(1);
        now.node_present = false;
        now.quarantined = true;
        now.quarantine_reason = Some("bad".into());
        let xids = vec![
            XidReport {
                seq: 9,
                pci: "0000:3b:00".into(),
                xid: 48,
                critical: true,
                text: "old".into(),
            },
            XidReport {
                seq: 11,
                pci: "0000:3b:00".into(),
                xid: 79,
                critical: true,
                text: "".into(),
            },
            XidReport {
                seq: 12,
                pci: "0000:3b:00".into(),
                xid: 79,
                critical: true,
                text: "".into(),
            },
            XidReport {
                seq: 13,
                pci: "0000:3b:00".into(),
                xid: 13,
                critical: false,
                text: "".into(),
            },
            XidReport {
                seq: 14,
                pci: "0000:af:00".into(),
                xid: 79,
                critical: true,
                text: "".into(),
            },
        ];
        let codes: Vec<(String, Code)> = diff(&start, &[snap(now)], &xids)
            .into_iter()
            .map(|f| (f.code, f.reason_code))
            .collect();
        let want = [
            ("DeviceFault/XID79", Code::XidCritical),
            ("DeviceFault/GPULost", Code::GpuLost),
            (
                "DeviceFault/ECCUncorrectable",
                Code::EccVolatileUncorrectable,
            ),
            ("DeviceFault/AERFatal", Code::AerFatal),
            ("DeviceFault/NodeGone", Code::NodeMissing),
            ("DeviceFault/Cordoned", Code::Quarantined),
        ];
        assert_eq!(codes, want.map(|(c, r)| (c.to_string(), r)));
    }

    #[test]
    fn xid_154_during_the_run_names_the_recovery_action() {
        let start = Snapshot {
            time_unix: 1,
            kmsg_seq: Some(10),
            devices: vec![snap(base())],
        };
        let xids = vec![XidReport {
            seq: 11,
            pci: "0000:3b:00".into(),
            xid: 154,
            critical: true,
            text: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
                .into(),
        }];
        let f = diff(&start, &[snap(base())], &xids);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].code, "DeviceFault/XID154");
        assert_eq!(f[0].reason_code, Code::RecoveryNodeReboot);
        assert_eq!(
            f[0].message,
            "the driver's recovery action is node reboot required"
        );
    }

    #[test]
    fn unreadable_kernel_log_at_start_blames_no_xid() {
        let start = Snapshot {
            time_unix: 1,
            kmsg_seq: None,
            devices: vec![snap(base())],
        };
        let xids = vec![XidReport {
            seq: 11,
            pci: "0000:3b:00".into(),
            xid: 79,
            critical: true,
            text: "".into(),
        }];
        assert!(diff(&start, &[snap(base())], &xids).is_empty());
    }

    #[test]
    fn fault_line_format() {
        let f = Fault {
            code: "DeviceFault/XID79".into(),
            reason_code: Code::XidCritical,
            device: "/dev/nvidia1".into(),
            num: GPU1,
            gpu_uuid: Some("GPU-1111".into()),
            message: "GPU has fallen off the bus".into(),
        };
        assert_eq!(
            f.line(),
            "devgate: DeviceFault/XID79 on /dev/nvidia1 (GPU-1111): GPU has fallen off the bus"
        );
        let f = Fault {
            gpu_uuid: None,
            ..f
        };
        assert_eq!(
            f.line(),
            "devgate: DeviceFault/XID79 on /dev/nvidia1 (195:1): GPU has fallen off the bus"
        );
    }

    /// The exit record carries each fault's reason code; one written before codes (no
    /// `reason_code`) still reads, its code unspecified.
    #[test]
    fn a_fault_carries_its_reason_code_and_an_older_one_still_reads() {
        let f = Fault {
            code: "DeviceFault/GPULost".into(),
            reason_code: Code::GpuLost,
            device: "/dev/nvidia1".into(),
            num: GPU1,
            gpu_uuid: None,
            message: "GPU is lost: NVML cannot reach it".into(),
        };
        let text = serde_json::to_string(&f).unwrap();
        assert!(text.contains(r#""reason_code":"gpu_lost""#), "{text}");
        assert_eq!(serde_json::from_str::<Fault>(&text).unwrap(), f);
        let old = r#"{"code":"DeviceFault/NodeGone","device":"/dev/zero","type":"c","major":1,
            "minor":5,"message":"device node disappeared"}"#;
        let old: Fault = serde_json::from_str(old).unwrap();
        assert_eq!(
            (old.code.as_str(), old.reason_code),
            ("DeviceFault/NodeGone", Code::Unspecified)
        );
    }

    #[test]
    fn pci_ids_in_every_spelling_name_one_slot() {
        let slot = |s: &str| PciAddr::parse(s).unwrap();
        let gpu = slot("0000:3b:00");
        for same in ["00000000:3B:00.0", "0000:3b:00", "3b:00.0"] {
            assert!(slot(same).same_slot(&gpu), "{same}");
        }
        assert!(!slot("0001:3b:00.1").same_slot(&gpu));
        assert!(slot("0001:3b:00.1").same_slot(&slot("0001:3b:00")));
    }
}
