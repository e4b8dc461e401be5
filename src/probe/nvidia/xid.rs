//! The XID probe: the NVIDIA driver's error reports in the kernel log.
//!
//! The driver logs `NVRM: Xid (PCI:0000:3b:00): 79, pid=…, GPU has fallen off the bus.`
//! for every error it sees. devgate reads the log once per hook call (`kmsg_path`,
//! non-blocking and bounded), keeps the XID records and the driver's load records, and
//! judges each GPU by the XIDs reported for its PCI address since the driver last loaded.
//!
//! "Until the GPU was reset after the event" is decided from the log alone:
//! - the kernel log is per boot (its timestamps count from boot), so a reboot clears
//!   every report;
//! - a driver load (`NVRM: loading NVIDIA UNIX … Kernel Module`) re-initialises every GPU,
//!   so reports logged before the newest load record no longer count.
//!
//! A GPU reset with `nvidia-smi -r` under a loaded driver logs nothing devgate can rely on;
//! README.md (GPUs: NVML and XID reports) says how an operator clears a report then.

use super::kmsg::{KmsgScan, XidEvent};
use super::nvml::NvmlAnswer;
use super::pci::PciAddr;
use crate::config::xid::{describe_xid, XidAction, XidTable};
use crate::model::class::Class;
use crate::model::device::Device;
use crate::model::verdict::Verdict;
use crate::probe::Probe;
use std::collections::BTreeMap;

/// Judges one GPU by the reports that still count for its slot. Pure.
pub fn judge_reports<'a>(
    events: impl Iterator<Item = &'a XidEvent>,
    pci: &PciAddr,
    table: &XidTable,
) -> Verdict {
    // xid → (count, newest report)
    let mut seen: BTreeMap<u32, (usize, &XidEvent)> = BTreeMap::new();
    for e in events.filter(|e| e.pci.same_slot(pci)) {
        if table.action(e.xid) == XidAction::Ignore {
            continue;
        }
        let entry = seen.entry(e.xid).or_insert((0, e));
        entry.0 += 1;
        entry.1 = e;
    }
    let mut findings = Vec::new();
    for (xid, (count, last)) in &seen {
        let what = describe_xid(*xid)
            .map(|d| format!("xid {xid} ({d})"))
            .unwrap_or_else(|| format!("xid {xid}"));
        let reason = format!(
            "{what} on {} reported {count} time{} since the driver loaded, last at {}.{:06} s after boot (kmsg seq {}): {:?}",
            last.pci,
            if *count == 1 { "" } else { "s" },
            last.ts_usec / 1_000_000,
            last.ts_usec % 1_000_000,
            last.seq,
            last.text
        );
        findings.push(match table.action(*xid) {
            XidAction::Unhealthy => {
                Verdict::Unhealthy(format!("{reason}; GPU reset or reboot required"))
            }
            _ => Verdict::Warn(reason),
        });
    }
    match Verdict::worst(findings) {
        Verdict::Unhealthy(r) => Verdict::Unhealthy(format!("xid: {r}")),
        Verdict::Warn(r) => Verdict::Warn(format!("xid: {r}")),
        _ => Verdict::Healthy,
    }
}

pub struct XidProbe<'a> {
    pub scan: &'a Result<KmsgScan, String>,
    pub table: &'a XidTable,
    /// Where the GPUs' PCI addresses come from.
    pub nvml: &'a NvmlAnswer,
}

impl Probe for XidProbe<'_> {
    fn name(&self) -> &'static str {
        "xid"
    }

    fn check(&self, device: &Device) -> Verdict {
        if device.class != Class::NvidiaGpu {
            return Verdict::NotApplicable("not an NVIDIA GPU".into());
        }
        let scan = match self.scan {
            Ok(s) => s,
            Err(e) => return Verdict::Unknown(e.clone()),
        };
        if let Some(pci) = self.nvml.pci_of_minor(device.num.minor) {
            let judged = judge_reports(scan.active(), &pci, self.table);
            // Where the driver gives it, NVML's recovery action says when a report stops
            // counting (super::recovery).
            let facts = self.nvml.gpu_by_minor(device.num.minor);
            return match super::recovery::after_recovery(judged, facts) {
                // The log is read oldest first: a read cut short missed the newest
                // records, which are the ones that matter.
                Verdict::Healthy if scan.truncated => Verdict::Unknown(format!(
                    "kernel log read stopped after {} records; newer XID reports not seen",
                    scan.records
                )),
                v => v,
            };
        }
        // Without the GPU's address a report cannot be pinned on it; only reports that
        // would block make that matter.
        let blocking: Vec<String> = scan
            .active()
            .filter(|e| self.table.action(e.xid) == XidAction::Unhealthy)
            .map(|e| format!("xid {} on {}", e.xid, e.pci))
            .collect();
        if blocking.is_empty() {
            Verdict::Healthy
        } else {
            let mut shown = blocking.clone();
            shown.sort();
            shown.dedup();
            shown.truncate(8);
            Verdict::Unknown(format!(
                "{} reset-class XID reports on the node ({}) and the PCI address of minor {} is unknown",
                blocking.len(),
                shown.join(", "),
                device.num.minor
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::nvidia::kmsg::tests::{scan_bytes, FIXTURE};
    use crate::probe::nvidia::kmsg::ReadLimits;
    use crate::probe::nvidia::nvml::Lookup;

    #[test]
    fn reports_before_the_newest_driver_load_do_not_count() {
        let log = "\
4,10,1000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n\
4,11,2000,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15\n\
4,12,3000,-;NVRM: Xid (PCI:0000:5e:00): 48, DBE\n";
        let s = scan_bytes(log.as_bytes(), ReadLimits::default());
        let active: Vec<u32> = s.active().map(|e| e.xid).collect();
        assert_eq!(active, vec![48]);
        let t = XidTable::default();
        let gpu3b = PciAddr::parse("00000000:3B:00.0").unwrap();
        assert_eq!(judge_reports(s.active(), &gpu3b, &t), Verdict::Healthy);
        // without the load record the same report still counts
        let s = scan_bytes(
            log.lines().next().unwrap().as_bytes(),
            ReadLimits::default(),
        );
        assert_eq!(judge_reports(s.active(), &gpu3b, &t).status(), "unhealthy");
    }

    #[test]
    fn classification_and_reason_carry_the_figures() {
        let s = scan_bytes(FIXTURE.as_bytes(), ReadLimits::default());
        let t = XidTable::default();
        let v = judge_reports(s.active(), &PciAddr::parse("00000000:3B:00.0").unwrap(), &t);
        assert_eq!(
            v,
            Verdict::Unhealthy(
                "xid: xid 79 (GPU has fallen off the bus) on 0000:3b:00 reported 2 times since the driver loaded, last at 12.345678 s after boot (kmsg seq 300): \"pid=1234, name=python3, GPU has fallen off the bus.\"; GPU reset or reboot required".into()
            )
        );
        // application XID 31 alone: ignored
        let v = judge_reports(s.active(), &PciAddr::parse("0000:5e:00.0").unwrap(), &t);
        assert_eq!(v, Verdict::Healthy);
        // unknown XID 154: a warning
        let v = judge_reports(s.active(), &PciAddr::parse("0000:af:00.0").unwrap(), &t);
        assert_eq!(v.status(), "warn", "{v:?}");
        // old-format address, DBE
        let v = judge_reports(s.active(), &PciAddr::parse("0000:86:00.0").unwrap(), &t);
        assert!(
            v.reason()
                .unwrap()
                .contains("xid 48 (double-bit ECC error)"),
            "{v:?}"
        );
        // the operator's table wins
        let mut o = BTreeMap::new();
        o.insert("79".to_string(), "warn".to_string());
        o.insert("31".to_string(), "unhealthy".to_string());
        let t = XidTable::new(&o).unwrap();
        let v = judge_reports(s.active(), &PciAddr::parse("0000:3b:00.0").unwrap(), &t);
        assert_eq!(v.status(), "warn");
        let v = judge_reports(s.active(), &PciAddr::parse("0000:5e:00.0").unwrap(), &t);
        assert_eq!(v.status(), "unhealthy");
    }

    #[test]
    fn probe_needs_the_gpus_address_only_when_a_report_would_block() {
        use crate::model::device::{DevNum, DevType, Source};
        let gpu = Device {
            num: DevNum {
                typ: DevType::Char,
                major: 195,
                minor: 1,
            },
            class: Class::NvidiaGpu,
            container_path: Some("/dev/nvidia1".into()),
            host_path: None,
            source: Source::LinuxDevices,
            file_mode: None,
            uid: None,
            gid: None,
        };
        let no_nvml = NvmlAnswer {
            gpus: Err("cannot load x".into()),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let table = XidTable::default();
        let scan = Ok(scan_bytes(FIXTURE.as_bytes(), ReadLimits::default()));
        let p = XidProbe {
            scan: &scan,
            table: &table,
            nvml: &no_nvml,
        };
        assert_eq!(
            p.check(&gpu),
            Verdict::Unknown(
                "3 reset-class XID reports on the node (xid 48 on 0000:86:00, xid 79 on 0000:3b:00) and the PCI address of minor 1 is unknown".into()
            )
        );
        let quiet = Ok(scan_bytes(
            b"4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 13, app\n",
            ReadLimits::default(),
        ));
        let p = XidProbe {
            scan: &quiet,
            table: &table,
            nvml: &no_nvml,
        };
        assert_eq!(p.check(&gpu), Verdict::Healthy);
        let unreadable = Err("cannot open kernel log /dev/kmsg: permission denied".to_string());
        let p = XidProbe {
            scan: &unreadable,
            table: &table,
            nvml: &no_nvml,
        };
        assert_eq!(p.check(&gpu).status(), "unknown");
        let mut ctl = gpu.clone();
        ctl.class = "nvidia-ctl".into();
        assert_eq!(p.check(&ctl).status(), "not_applicable");
    }

    #[test]
    fn a_cut_short_read_is_unknown_not_healthy() {
        use crate::model::device::{DevNum, DevType};
        let num = DevNum {
            typ: DevType::Char,
            major: 195,
            minor: 1,
        };
        let gpu = Device::on_host(num, Class::NvidiaGpu, None);
        let nvml = NvmlAnswer {
            gpus: Ok(vec![crate::probe::nvidia::nvml::tests::healthy(1)]),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let table = XidTable::default();
        let mut scan = scan_bytes(
            b"4,1,1,-;NVRM: Xid (PCI:0000:2b:00): 13, app\n",
            ReadLimits::default(),
        );
        let p = |scan: &Result<KmsgScan, String>| {
            XidProbe {
                scan,
                table: &table,
                nvml: &nvml,
            }
            .check(&gpu)
        };
        assert_eq!(p(&Ok(scan.clone())), Verdict::Healthy);
        scan.truncated = true;
        assert_eq!(
            p(&Ok(scan)),
            Verdict::Unknown(
                "kernel log read stopped after 1 records; newer XID reports not seen".into()
            )
        );
    }
}
