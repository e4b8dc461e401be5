//! The GPU probes: thin, over what `gpu` gathered once per hook call. `nvml` judges the
//! GPU by NVML's answer (`gpu::checks`), `xid` by the driver's XID reports in the kernel
//! log (`gpu::xid`).

use super::findings::{Findings, Probe};
use crate::config::xid::XidTable;
use crate::gpu::checks::{checks, verdict_for, Limits};
use crate::gpu::kmsg::{KmsgError, KmsgScan};
use crate::gpu::nvml::{GpuFacts, Lookup, NvmlAnswer, Reading};
use crate::gpu::pci::PciAddr;
use crate::gpu::xid::{blocks, judge_reports};
use crate::gpu::{driver, recovery};
use crate::model::class::Class;
use crate::model::device::Device;
use crate::model::verdict::{Code, Verdict};

pub struct NvmlProbe<'a> {
    pub answer: &'a NvmlAnswer,
    pub limits: Limits,
    /// How many NVIDIA GPUs the container is given: with several, peer-to-peer is possible.
    pub gpus: usize,
}

impl Probe for NvmlProbe<'_> {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn check(&self, device: &Device, _: &mut Findings) -> Verdict {
        if device.class != Class::NvidiaGpu {
            return Verdict::not_applicable(Code::NotNvidiaGpu, "not an NVIDIA GPU");
        }
        let gpus = match &self.answer.gpus {
            Ok(g) => g,
            Err(why) => return Verdict::unknown(why.code(), why.to_string()),
        };
        let minor = device.num.minor;
        match self.answer.gpu_by_minor(minor) {
            Some(g) => {
                let mut checks = checks(g, self.limits);
                if let (Reading::Value(a), Some(c)) = (
                    &g.recovery_action,
                    checks.iter_mut().find(|c| c.check == "recovery_action"),
                ) {
                    c.verdict = recovery::action_verdict(*a, self.gpus);
                }
                verdict_for(g, &checks)
            }
            None if self.answer.lookup == Lookup::DriverList => Verdict::unhealthy(
                Code::GpuMissing,
                format!(
                    "nvml: the driver lists no usable GPU with minor number {minor} (/proc/driver/nvidia/gpus: none, or one excluded from use)"
                ),
            ),
            None => missing_minor(minor, gpus),
        }
    }
}

/// No GPU answered with this minor. When some index had no handle that is most likely the
/// one, and it is lost; otherwise the node has a node with no GPU behind it.
fn missing_minor(minor: u32, gpus: &[GpuFacts]) -> Verdict {
    let unreachable: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            g.unreachable
                .as_ref()
                .map(|why| format!("index {}: {why}", g.index))
        })
        .collect();
    if unreachable.is_empty() {
        Verdict::unhealthy(
            Code::GpuMissing,
            format!(
                "nvml: no GPU with minor number {minor} among the {} GPUs NVML reports",
                gpus.len()
            ),
        )
    } else {
        Verdict::unhealthy(
            Code::GpuMissing,
            format!(
                "nvml: no reachable GPU with minor number {minor}; unreachable {}",
                unreachable.join(", ")
            ),
        )
    }
}

pub struct XidProbe<'a> {
    pub scan: &'a Result<KmsgScan, KmsgError>,
    pub table: &'a XidTable,
    /// Where the GPUs' PCI addresses come from: NVML, else the driver's /proc list (so
    /// that a report, XID 154's recovery action above all, still counts when NVML hangs).
    pub nvml: &'a NvmlAnswer,
    pub proc: &'a [driver::ProcGpu],
}

impl Probe for XidProbe<'_> {
    fn name(&self) -> &'static str {
        "xid"
    }

    /// The GPU's XID verdict: its own reports where its PCI address is known, else unknown
    /// only when some slot's reports would block.
    /// Long because it holds both cases, the address known and not, after the shared early
    /// returns: they are the probe's one decision, read in the order it is taken.
    fn check(&self, device: &Device, _: &mut Findings) -> Verdict {
        if device.class != Class::NvidiaGpu {
            return Verdict::not_applicable(Code::NotNvidiaGpu, "not an NVIDIA GPU");
        }
        let scan = match self.scan {
            Ok(s) => s,
            Err(e) => return Verdict::unknown(Code::KernelLogUnreadable, e.to_string()),
        };
        let minor = device.num.minor;
        let pci = self
            .nvml
            .pci_of_minor(minor)
            .or_else(|| driver::pci_of_minor(self.proc, minor));
        if let Some(pci) = pci {
            let judged = judge_reports(scan.active(), &pci, self.table);
            // Where the driver gives it, NVML's recovery action says when a report stops
            // counting (gpu::recovery).
            let facts = self.nvml.gpu_by_minor(minor);
            return match recovery::after_recovery(judged, facts) {
                // The log is read oldest first: a read cut short missed the newest
                // records, which are the ones that matter.
                Verdict::Healthy if scan.truncated => Verdict::unknown(
                    Code::KernelLogTruncated,
                    format!(
                        "kernel log read stopped after {} records; newer XID reports not seen",
                        scan.records
                    ),
                ),
                v => v,
            };
        }
        // Without the GPU's address a report cannot be pinned on it; only slots whose
        // reports would block make that matter, each judged as its own GPU would be.
        let mut slots: Vec<PciAddr> = Vec::new();
        for e in scan.active() {
            if !slots.iter().any(|s| s.same_slot(&e.pci)) {
                slots.push(e.pci);
            }
        }
        let mut blocking: Vec<String> = Vec::new();
        let mut count = 0;
        for slot in &slots {
            if judge_reports(scan.active(), slot, self.table).status() != "unhealthy" {
                continue;
            }
            for e in scan
                .active()
                .filter(|e| e.pci.same_slot(slot) && blocks(e, self.table))
            {
                count += 1;
                blocking.push(format!("xid {} on {}", e.xid, e.pci));
            }
        }
        if blocking.is_empty() {
            return Verdict::Healthy;
        }
        blocking.sort();
        blocking.dedup();
        blocking.truncate(8);
        Verdict::unknown(
            Code::GpuAddressUnknown,
            format!(
                "{count} reset-class XID reports on the node ({}) and the PCI address of minor {} is unknown",
                blocking.join(", "),
                device.num.minor
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kmsg::tests::{scan_bytes, FIXTURE};
    use crate::gpu::kmsg::ReadLimits;
    use crate::gpu::nvml::tests::healthy;

    const L: Limits = Limits {
        max_volatile_uncorrectable_ecc: 0,
    };

    fn gpu_dev(minor: u32, class: &str) -> Device {
        Device {
            class: class.into(),
            ..Device::linux_gpu(minor)
        }
    }

    #[test]
    fn probe_maps_by_minor_and_explains_missing_ones() {
        let mut gpus: Vec<GpuFacts> = (0..4).map(healthy).collect();
        gpus[1].minor = Reading::Value(7); // minors need not follow indices
        gpus[3] = GpuFacts::unreachable(3, "GPU is lost".into(), true);
        let snap = NvmlAnswer {
            gpus: Ok(gpus),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let p = NvmlProbe {
            answer: &snap,
            limits: L,
            gpus: 1,
        };
        assert_eq!(
            p.check(&gpu_dev(7, "nvidia-gpu"), &mut Findings::default()),
            Verdict::Healthy
        );
        assert_eq!(
            p.check(&gpu_dev(1, "nvidia-gpu"), &mut Findings::default()),
            Verdict::unhealthy(
                Code::GpuMissing,
                "nvml: no reachable GPU with minor number 1; unreachable index 3: GPU is lost"
            )
        );
        assert_eq!(
            p.check(&gpu_dev(255, "nvidia-ctl"), &mut Findings::default())
                .code(),
            Some(Code::NotNvidiaGpu)
        );
        assert_eq!(snap.pci_of_minor(7).unwrap().to_string(), "0000:2b:00.0");
        let failed = NvmlAnswer {
            gpus: Err(crate::gpu::nvml::QueryError::Timeout {
                ms: 2000,
                one_gpu: false,
            }),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let p = NvmlProbe {
            answer: &failed,
            limits: L,
            gpus: 1,
        };
        assert_eq!(
            p.check(&gpu_dev(0, "nvidia-gpu"), &mut Findings::default()),
            Verdict::unknown(Code::NvmlTimeout, "NVML did not answer in 2000 ms")
        );
    }

    #[test]
    /// Long because each case is the same probe with one input changed (the log, the driver's
    /// /proc list, the class); they read as a table.
    fn probe_needs_the_gpus_address_only_when_a_report_would_block() {
        let gpu = Device::linux_gpu(1);
        let no_nvml = NvmlAnswer {
            gpus: Err(crate::gpu::nvml::QueryError::Failed("cannot load x".into())),
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
            proc: &[],
        };
        assert_eq!(
            p.check(&gpu, &mut Findings::default()),
            Verdict::unknown(
                Code::GpuAddressUnknown,
                "3 reset-class XID reports on the node (xid 48 on 0000:86:00, xid 79 on 0000:3b:00) and the PCI address of minor 1 is unknown"
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
            proc: &[],
        };
        assert_eq!(p.check(&gpu, &mut Findings::default()), Verdict::Healthy);
        // NVML has no address for minor 1 but the driver's /proc list has: a report for
        // that slot is pinned on the GPU (XID 154 needs no NVML call, even when NVML hangs)
        let listed = [driver::ProcGpu {
            minor: 1,
            pci: PciAddr::parse("0000:01:00.0").unwrap(),
            uuid: None,
        }];
        let reset = Ok(scan_bytes(
            b"4,1,1,-;NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\n",
            ReadLimits::default(),
        ));
        let p = XidProbe {
            scan: &reset,
            table: &table,
            nvml: &no_nvml,
            proc: &listed,
        };
        let v = p.check(&gpu, &mut Findings::default());
        assert_eq!(v.status(), "unhealthy");
        assert_eq!(v.code(), Some(Code::RecoveryGpuReset));
        let p = XidProbe {
            scan: &reset,
            table: &table,
            nvml: &no_nvml,
            proc: &[],
        };
        let v = p.check(&gpu, &mut Findings::default());
        assert_eq!(v.status(), "unknown");
        assert_eq!(v.code(), Some(Code::GpuAddressUnknown));
        let unreadable = Err(KmsgError::new(
            crate::gpu::kmsg::KmsgStep::Open,
            std::path::Path::new("/dev/kmsg"),
            std::io::Error::from_raw_os_error(libc::EACCES),
        ));
        let p = XidProbe {
            scan: &unreadable,
            table: &table,
            nvml: &no_nvml,
            proc: &[],
        };
        let v = p.check(&gpu, &mut Findings::default());
        assert_eq!(v.status(), "unknown");
        assert_eq!(v.code(), Some(Code::KernelLogUnreadable));
        let mut ctl = gpu.clone();
        ctl.class = "nvidia-ctl".into();
        assert_eq!(
            p.check(&ctl, &mut Findings::default()).code(),
            Some(Code::NotNvidiaGpu)
        );
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
            gpus: Ok(vec![crate::gpu::nvml::tests::healthy(1)]),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let table = XidTable::default();
        let mut scan = scan_bytes(
            b"4,1,1,-;NVRM: Xid (PCI:0000:2b:00): 13, app\n",
            ReadLimits::default(),
        );
        let p = |scan: &Result<KmsgScan, KmsgError>| {
            XidProbe {
                scan,
                table: &table,
                nvml: &nvml,
                proc: &[],
            }
            .check(&gpu, &mut Findings::default())
        };
        assert_eq!(p(&Ok(scan.clone())), Verdict::Healthy);
        scan.truncated = true;
        assert_eq!(
            p(&Ok(scan)),
            Verdict::unknown(
                Code::KernelLogTruncated,
                "kernel log read stopped after 1 records; newer XID reports not seen"
            )
        );
    }
}
