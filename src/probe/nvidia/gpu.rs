//! What NVML's answer means for a container's GPUs: each GPU's checks against the
//! operator's limits (pure), the NVML probe, and which GPUs a selector names.

use super::nvml::{GpuFacts, Link, Lookup, NvmlAnswer, Reading, LOST};
use super::pci::PciAddr;
use super::procfs::ProcGpu;
use super::recovery;
use crate::discover::gpu::{GpuSelector, NVIDIA_VISIBLE_DEVICES};
use crate::discover::selector::uuid_names;
use crate::model::class::Class;
use crate::model::device::{Device, Source};
use crate::model::verdict::Verdict;
use crate::probe::{Findings, Probe};
use serde::Serialize;

/// Throttle reasons that mean the hardware is protecting itself, not policy (power cap,
/// idle, application clocks): NVML's HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE.
const THROTTLE_REASONS: [(u64, &str); 4] = [
    (0x08, "hw_slowdown"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
];

/// One check's result, as `devgate status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub check: &'static str,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// Thresholds the operator sets.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_volatile_uncorrectable_ecc: u64,
}

/// Judges one GPU's facts, check by check. Pure.
///
/// Long because it is the table of NVML checks, one block per check, in the order
/// `devgate status` lists them.
pub fn checks(g: &GpuFacts, limits: Limits) -> Vec<Check> {
    let mut out = Vec::new();
    let mut push = |check, verdict| out.push(Check { check, verdict });
    push(
        "reachable",
        match &g.unreachable {
            Some(why) if g.is_lost() => Verdict::Unhealthy(format!("unreachable: {why}")),
            Some(why) => Verdict::Unknown(why.clone()),
            None if g.is_lost() => Verdict::Unhealthy(LOST.into()),
            None => Verdict::Healthy,
        },
    );
    push(
        "remapped_rows",
        judge(&g.remapped_rows, "remapped rows", |r| {
            if r.failure {
                Verdict::Unhealthy(format!(
                    "row remapping failed ({} uncorrectable rows, {} correctable)",
                    r.uncorrectable, r.correctable
                ))
            } else if r.pending {
                Verdict::Unhealthy(format!(
                    "row remapping pending, reset required ({} uncorrectable rows, {} correctable)",
                    r.uncorrectable, r.correctable
                ))
            } else {
                Verdict::Healthy
            }
        }),
    );
    push(
        "retired_pages",
        judge(&g.retired_pages_pending, "retired pages", |p| {
            if *p {
                Verdict::Unhealthy("retired pages pending, reboot required".into())
            } else {
                Verdict::Healthy
            }
        }),
    );
    push(
        "volatile_ecc",
        judge(&g.volatile_uncorrectable_ecc, "volatile ECC", |n| {
            let max = limits.max_volatile_uncorrectable_ecc;
            if *n > max {
                Verdict::Unhealthy(format!("volatile uncorrectable ECC errors {n} > {max}"))
            } else {
                Verdict::Healthy
            }
        }),
    );
    push(
        "throttle",
        judge(&g.throttle_reasons, "throttle reasons", |bits| {
            let active: Vec<&str> = THROTTLE_REASONS
                .iter()
                .filter(|(b, _)| bits & b != 0)
                .map(|(_, n)| *n)
                .collect();
            if active.is_empty() {
                Verdict::Healthy
            } else {
                Verdict::Warn(format!(
                    "clocks throttled by {} (reasons 0x{bits:x})",
                    active.join(", ")
                ))
            }
        }),
    );
    // Only the width: an idle GPU trains its link down to gen 1 to save power, and NVML
    // has no "under load" signal, so the generation says nothing at prestart.
    push(
        "pcie_link",
        judge(&g.pcie_width, "PCIe link width", |l| {
            below(l, "PCIe link width x", "x")
        }),
    );
    // One GPU's view; the probe refuses DRAIN_P2P for a container with several GPUs.
    push(
        "recovery_action",
        judge(&g.recovery_action, "recovery action", |a| {
            recovery::action_verdict(*a, 1)
        }),
    );
    push(
        "drain",
        judge(&g.drain, "drain state", |d| recovery::drain_verdict(*d)),
    );
    out
}

fn below(l: &Link, what: &str, unit: &str) -> Verdict {
    if l.current < l.max {
        Verdict::Warn(format!("{what}{} below max {unit}{}", l.current, l.max))
    } else {
        Verdict::Healthy
    }
}

fn judge<T>(r: &Reading<T>, what: &str, f: impl FnOnce(&T) -> Verdict) -> Verdict {
    match r {
        Reading::Value(v) => f(v),
        Reading::NotSupported(why) => Verdict::NotApplicable(format!("{what}: {why}")),
        Reading::Lost => Verdict::Unhealthy(LOST.into()),
        Reading::Failed(why) => Verdict::Unknown(format!("cannot read {what}: {why}")),
    }
}

/// The probe's one verdict for a GPU: a lost GPU is one finding, whatever else failed;
/// otherwise the worst checks, prefixed with which GPU NVML means.
pub fn verdict_for(g: &GpuFacts, checks: &[Check]) -> Verdict {
    let label = g.label();
    if g.is_lost() {
        return Verdict::Unhealthy(format!("nvml: GPU {label}: {LOST}"));
    }
    let prefix = |r: String| format!("nvml: GPU {label}: {r}");
    // No answer: one reason, not one per check.
    if let Some(why) = &g.unreachable {
        return Verdict::Unknown(prefix(why.clone()));
    }
    match Verdict::worst(checks.iter().map(|c| c.verdict.clone()).collect()) {
        Verdict::Unhealthy(r) => Verdict::Unhealthy(prefix(r)),
        Verdict::Unknown(r) => Verdict::Unknown(prefix(r)),
        Verdict::Warn(r) => Verdict::Warn(prefix(r)),
        Verdict::NotApplicable(_) | Verdict::Healthy => Verdict::Healthy,
    }
}

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
            return Verdict::NotApplicable("not an NVIDIA GPU".into());
        }
        let gpus = match &self.answer.gpus {
            Ok(g) => g,
            Err(why) => return Verdict::Unknown(why.clone()),
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
            None if self.answer.lookup == Lookup::DriverList => Verdict::Unhealthy(format!(
                "nvml: the driver lists no usable GPU with minor number {minor} (/proc/driver/nvidia/gpus: none, or one excluded from use)"
            )),
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
        Verdict::Unhealthy(format!(
            "nvml: no GPU with minor number {minor} among the {} GPUs NVML reports",
            gpus.len()
        ))
    } else {
        Verdict::Unhealthy(format!(
            "nvml: no reachable GPU with minor number {minor}; unreachable {}",
            unreachable.join(", ")
        ))
    }
}

/// One GPU as selectors see it, in index order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuId {
    pub minor: u32,
    pub uuid: Option<String>,
    /// For a PCI bus id selector.
    pub pci: Option<PciAddr>,
}

/// The GPUs selectors are resolved against, and who listed them; `Err` when nobody could.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownGpus {
    pub ids: Result<Vec<GpuId>, String>,
    /// `NVML` or `the driver`, for the warnings.
    pub by: &'static str,
}

impl KnownGpus {
    /// Whether a GPU on the list has a UUID this selector names (as NVIDIA compares them:
    /// a prefix, ignoring case).
    pub fn knows_uuid(&self, uuid: &str) -> bool {
        self.ids.as_ref().is_ok_and(|ids| {
            ids.iter()
                .any(|g| g.uuid.as_deref().is_some_and(|v| uuid_names(uuid, v)))
        })
    }

    /// The driver's list, in PCI address order: NVML's own index order.
    pub fn from_driver(driver: &[(u32, ProcGpu)]) -> KnownGpus {
        KnownGpus {
            ids: Ok(driver
                .iter()
                .map(|(_, p)| GpuId {
                    minor: p.minor,
                    uuid: p.uuid.clone(),
                    pci: Some(p.pci),
                })
                .collect()),
            by: "the driver",
        }
    }

    /// NVML's enumeration. A GPU without a minor (lost) is taken at the driver's default
    /// numbering, index N = /dev/nvidiaN, so that it is still checked and found wanting
    /// rather than silently skipped.
    pub fn from_answer(answer: &NvmlAnswer) -> KnownGpus {
        KnownGpus {
            ids: answer.gpus.as_ref().map_err(Clone::clone).map(|gpus| {
                gpus.iter()
                    .map(|g| GpuId {
                        minor: g.minor.value().copied().unwrap_or(g.index),
                        uuid: g.uuid.value().cloned(),
                        pci: g.pci_bus_id.value().and_then(|b| PciAddr::parse(b)),
                    })
                    .collect()
            }),
            by: "NVML",
        }
    }
}

/// Whether a PCI bus id selector names this GPU: domain, bus and device, as
/// libnvidia-container compares `%08x:%02x:%02x.0` with the GPU's bus id.
fn bus_id_names(sel: &GpuSelector, g: &GpuId) -> bool {
    let GpuSelector::PciBusId {
        domain,
        bus,
        device,
    } = sel
    else {
        return false;
    };
    g.pci
        .is_some_and(|a| a.domain == *domain && a.bus == *bus && a.device == *device)
}

fn show_bus_id(sel: &GpuSelector) -> String {
    match sel {
        GpuSelector::PciBusId {
            domain,
            bus,
            device,
        } => format!("{domain:08x}:{bus:02x}:{device:02x}.0"),
        _ => String::new(),
    }
}

/// The minors a container's GPU selectors name, and a sentence for each one that names no
/// GPU. When no GPU list could be had, an index is taken at the driver's default numbering
/// and `all` means the `nvidiaN` nodes on the host (`nodes`), so that every GPU is still
/// checked.
pub fn resolve_selectors(
    selectors: &[(GpuSelector, Source)],
    known: &KnownGpus,
    nodes: &[u32],
) -> (Vec<(u32, Source)>, Vec<String>) {
    let mut chosen: Vec<(u32, Source)> = Vec::new();
    let mut unresolved = Vec::new();
    let mut add = |minor: u32, source: Source| {
        match chosen.iter_mut().find(|(m, _)| *m == minor) {
            // a GPU also named on its own is judged as named
            Some(c) if c.1 == Source::AllGpus => c.1 = source,
            Some(_) => {}
            None => chosen.push((minor, source)),
        }
    };
    let (by, (report, reports)) = (
        known.by,
        if known.by == "NVML" {
            ("reports", "report")
        } else {
            ("lists", "list")
        },
    );
    for (sel, source) in selectors {
        let how = match source {
            Source::CdiAnnotation => "CDI annotation",
            _ => NVIDIA_VISIBLE_DEVICES,
        };
        match (&known.ids, sel) {
            (Ok(gpus), GpuSelector::All) => gpus.iter().for_each(|g| add(g.minor, Source::AllGpus)),
            (Ok(gpus), GpuSelector::Index(i)) => match gpus.get(*i as usize) {
                Some(g) => add(g.minor, *source),
                None => unresolved.push(format!(
                    "{how} selects GPU {i} but {by} {report} {} GPUs",
                    gpus.len()
                )),
            },
            (Ok(gpus), GpuSelector::Uuid(u)) => {
                match gpus
                    .iter()
                    .find(|g| g.uuid.as_deref().is_some_and(|v| uuid_names(u, v)))
                {
                    Some(g) => add(g.minor, *source),
                    None => {
                        unresolved.push(format!("{how} selects {u}, which {by} does not {reports}"))
                    }
                }
            }
            (Ok(gpus), GpuSelector::PciBusId { .. }) => {
                match gpus.iter().find(|g| bus_id_names(sel, g)) {
                    Some(g) => add(g.minor, *source),
                    None => unresolved.push(format!(
                        "{how} selects PCI bus id {}, which {by} does not {reports}",
                        show_bus_id(sel)
                    )),
                }
            }
            // A MIG instance runs on its parent GPU: that is what is checked.
            (Ok(gpus), GpuSelector::Mig { gpu, instance }) => match gpus.get(*gpu as usize) {
                Some(g) => add(g.minor, *source),
                None => unresolved.push(format!(
                    "{how} selects MIG device {gpu}:{instance} but {by} {report} {} GPUs",
                    gpus.len()
                )),
            },
            (_, GpuSelector::MigUuid(u)) => unresolved.push(format!(
                "{how} selects MIG device {u}, whose GPU devgate cannot tell (it does not list MIG devices)"
            )),
            (_, GpuSelector::Invalid(why)) => unresolved.push(format!(
                "{how} value {why}, which NVIDIA's tooling refuses"
            )),
            (Err(_), GpuSelector::All) => nodes.iter().for_each(|n| add(*n, Source::AllGpus)),
            (Err(_), GpuSelector::Index(i) | GpuSelector::Mig { gpu: i, .. }) => add(*i, *source),
            (Err(why), GpuSelector::Uuid(u)) => {
                unresolved.push(format!("{how} selects {u}, which cannot be checked: {why}"))
            }
            (Err(why), GpuSelector::PciBusId { .. }) => unresolved.push(format!(
                "{how} selects PCI bus id {}, which cannot be checked: {why}",
                show_bus_id(sel)
            )),
        }
    }
    if unresolved.len() > MAX_UNRESOLVED {
        let more = unresolved.len() - MAX_UNRESOLVED;
        unresolved.truncate(MAX_UNRESOLVED);
        unresolved.push(format!("and {more} more GPU selectors that name no GPU"));
    }
    (chosen, unresolved)
}

/// Sentences said about selectors that name no GPU, past which they are counted: each is a
/// warning line, a clause of the reject line, and part of the record and the decision log
/// line of every retry of the pod.
pub(crate) const MAX_UNRESOLVED: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::nvidia::nvml::tests::healthy;
    use crate::probe::nvidia::nvml::RemappedRows;
    use nvml_wrapper::error::NvmlError;

    const L: Limits = Limits {
        max_volatile_uncorrectable_ecc: 0,
    };

    fn verdict(g: &GpuFacts) -> Verdict {
        verdict_for(g, &checks(g, L))
    }

    #[test]
    fn healthy_gpu_passes_every_check() {
        let g = healthy(1);
        let checks = checks(&g, L);
        assert_eq!(checks.len(), 8);
        assert!(
            checks.iter().all(|c| c.verdict == Verdict::Healthy),
            "{checks:?}"
        );
        assert_eq!(verdict(&g), Verdict::Healthy);
        assert_eq!(
            g.label(),
            "GPU-00000001-0000-0000-0000-000000000000 (0000:2b:00.0)"
        );
    }

    #[test]
    fn remap_failure_and_pending_are_unhealthy_with_figures() {
        let mut g = healthy(1);
        g.remapped_rows = Reading::Value(RemappedRows {
            correctable: 1,
            uncorrectable: 3,
            pending: true,
            failure: true,
        });
        assert_eq!(
            verdict(&g),
            Verdict::Unhealthy(
                "nvml: GPU GPU-00000001-0000-0000-0000-000000000000 (0000:2b:00.0): row remapping failed (3 uncorrectable rows, 1 correctable)".into()
            )
        );
        g.remapped_rows = Reading::Value(RemappedRows {
            correctable: 0,
            uncorrectable: 2,
            pending: true,
            failure: false,
        });
        let v = verdict(&g);
        assert!(
            v.reason().unwrap().ends_with(
                "row remapping pending, reset required (2 uncorrectable rows, 0 correctable)"
            ),
            "{v:?}"
        );
    }

    #[test]
    fn retired_pages_ecc_and_several_findings_join() {
        let mut g = healthy(0);
        g.retired_pages_pending = Reading::Value(true);
        g.volatile_uncorrectable_ecc = Reading::Value(2);
        let v = verdict(&g);
        assert_eq!(v.status(), "unhealthy");
        assert!(
            v.reason().unwrap().ends_with(
                ": retired pages pending, reboot required; volatile uncorrectable ECC errors 2 > 0"
            ),
            "{v:?}"
        );
        let lenient = Limits {
            max_volatile_uncorrectable_ecc: 2,
        };
        g.retired_pages_pending = Reading::Value(false);
        assert_eq!(verdict_for(&g, &checks(&g, lenient)), Verdict::Healthy);
    }

    #[test]
    fn lost_gpu_is_one_finding() {
        let mut g = healthy(2);
        g.remapped_rows = Reading::Lost;
        g.throttle_reasons = Reading::Lost;
        g.pcie_gen = Reading::Lost;
        g.pcie_width = Reading::Lost;
        assert_eq!(
            verdict(&g),
            Verdict::Unhealthy(
                "nvml: GPU GPU-00000002-0000-0000-0000-000000000000 (0000:3b:00.0): GPU is lost (fallen off the bus)".into()
            )
        );
        let pcie = &checks(&g, L)[5];
        assert_eq!(pcie.verdict, Verdict::Unhealthy(LOST.into()));
        let u = GpuFacts::unreachable(5, "GPU is lost".into(), true);
        assert!(u.is_lost());
        assert_eq!(
            verdict(&u),
            Verdict::Unhealthy("nvml: GPU index 5: GPU is lost (fallen off the bus)".into())
        );
    }

    #[test]
    fn throttle_and_pcie_are_warnings() {
        let mut g = healthy(0);
        g.throttle_reasons = Reading::Value(0x4 | 0x40 | 0x8);
        g.pcie_gen = Reading::Value(Link { current: 3, max: 4 });
        g.pcie_width = Reading::Value(Link {
            current: 8,
            max: 16,
        });
        let v = verdict(&g);
        assert_eq!(
            v,
            Verdict::Warn(
                "nvml: GPU GPU-00000000-0000-0000-0000-000000000000 (0000:1b:00.0): clocks throttled by hw_slowdown, hw_thermal (reasons 0x4c); PCIe link width x8 below max x16".into()
            )
        );
        // an idle link (gen 1 of 5, full width) is no finding at all
        g = healthy(0);
        g.pcie_gen = Reading::Value(Link { current: 1, max: 5 });
        assert_eq!(verdict(&g), Verdict::Healthy);
        // a power cap alone (0x4) is policy, not a fault
        g = healthy(0);
        g.throttle_reasons = Reading::Value(0x4);
        assert_eq!(verdict(&g), Verdict::Healthy);
    }

    #[test]
    fn unsupported_is_not_applicable_and_failures_unknown() {
        let mut g = healthy(0);
        g.remapped_rows = Reading::from_error(NvmlError::FailedToLoadSymbol("x".into()));
        g.retired_pages_pending = Reading::from_error(NvmlError::NotSupported);
        let checks = checks(&g, L);
        assert_eq!(checks[1].verdict.status(), "not_applicable");
        assert_eq!(checks[2].verdict.status(), "not_applicable");
        assert_eq!(verdict_for(&g, &checks), Verdict::Healthy);
        g.volatile_uncorrectable_ecc = Reading::from_error(NvmlError::Unknown);
        let v = verdict(&g);
        assert_eq!(v.status(), "unknown");
        assert!(
            v.reason().unwrap().contains("cannot read volatile ECC"),
            "{v:?}"
        );
    }

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
            Verdict::Unhealthy(
                "nvml: no reachable GPU with minor number 1; unreachable index 3: GPU is lost"
                    .into()
            )
        );
        assert_eq!(
            p.check(&gpu_dev(255, "nvidia-ctl"), &mut Findings::default())
                .status(),
            "not_applicable"
        );
        assert_eq!(snap.pci_of_minor(7).unwrap().to_string(), "0000:2b:00.0");
        let failed = NvmlAnswer {
            gpus: Err("NVML did not answer in 2000 ms".into()),
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
            Verdict::Unknown("NVML did not answer in 2000 ms".into())
        );
    }

    /// A spec naming hundreds of GPUs no list has gets a bounded reason, not one sentence
    /// each: the reject line, its record and the decision log line stay small however many
    /// times a pod is retried.
    #[test]
    fn unresolved_selectors_are_said_a_bounded_number_of_times() {
        let ok = NvmlAnswer {
            gpus: Ok((0..2).map(healthy).collect()),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let sel: Vec<(GpuSelector, Source)> = (0..100)
            .map(|i| {
                (
                    GpuSelector::Uuid(format!("GPU-ffff{i:04}")),
                    Source::NvidiaVisibleDevices,
                )
            })
            .collect();
        let (chosen, unresolved) = resolve_selectors(&sel, &KnownGpus::from_answer(&ok), &[]);
        assert!(chosen.is_empty());
        assert_eq!(unresolved.len(), MAX_UNRESOLVED + 1, "{unresolved:?}");
        assert_eq!(
            unresolved.last().unwrap(),
            &format!(
                "and {} more GPU selectors that name no GPU",
                100 - MAX_UNRESOLVED
            )
        );
    }

    /// libnvidia-container takes a `GPU-` token as a prefix of the UUID, any case, and
    /// gives the first GPU in index order that it begins: so must devgate, or the pod gets
    /// that GPU unchecked (`strncasecmp(uuid, token, strlen(token))` in `select_devices`).
    #[test]
    fn a_uuid_selector_names_the_first_gpu_its_prefix_begins() {
        let mut gpus: Vec<GpuFacts> = (0..3).map(healthy).collect();
        gpus[2].minor = Reading::Value(7);
        let ok = NvmlAnswer {
            gpus: Ok(gpus),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let known = KnownGpus::from_answer(&ok);
        let env = Source::NvidiaVisibleDevices;
        assert!(known.knows_uuid("gpu-00000002-00"));
        let (chosen, unresolved) = resolve_selectors(
            &[
                (GpuSelector::Uuid("gpu-00000002-00".into()), env),
                // GPUs 0, 1 and 2 all begin so: the first in index order
                (GpuSelector::Uuid("GPU-0000000".into()), env),
                // longer than the UUID: no GPU
                (
                    GpuSelector::Uuid("GPU-00000001-0000-0000-0000-0000000000000".into()),
                    env,
                ),
            ],
            &known,
            &[],
        );
        assert_eq!(chosen, vec![(7, env), (0, env)]);
        assert_eq!(unresolved.len(), 1, "{unresolved:?}");
    }

    #[test]
    fn selectors_resolve_through_nvml_or_default_numbering() {
        let mut gpus: Vec<GpuFacts> = (0..3).map(healthy).collect();
        gpus[1].minor = Reading::Value(5);
        gpus[2] = GpuFacts::unreachable(2, "GPU is lost".into(), true);
        let ok = NvmlAnswer {
            gpus: Ok(gpus),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let env = Source::NvidiaVisibleDevices;
        let cdi = Source::CdiAnnotation;
        let sel = vec![
            (GpuSelector::Index(1), env),
            (
                GpuSelector::Uuid("gpu-00000000-0000-0000-0000-000000000000".into()),
                cdi,
            ),
            (GpuSelector::Index(2), env),
            (GpuSelector::Index(9), env),
            (GpuSelector::Uuid("GPU-nope".into()), cdi),
            (GpuSelector::Index(1), cdi),
        ];
        let (chosen, unresolved) = resolve_selectors(&sel, &KnownGpus::from_answer(&ok), &[]);
        assert_eq!(chosen, vec![(5, env), (0, cdi), (2, env)]);
        assert_eq!(
            unresolved,
            vec![
                "NVIDIA_VISIBLE_DEVICES selects GPU 9 but NVML reports 3 GPUs".to_string(),
                "CDI annotation selects GPU-nope, which NVML does not report".to_string()
            ]
        );
        let (chosen, _) = resolve_selectors(
            &[(GpuSelector::All, env)],
            &KnownGpus::from_answer(&ok),
            &[],
        );
        let all = Source::AllGpus;
        assert_eq!(chosen, vec![(0, all), (5, all), (2, all)]);
        // a GPU also named on its own is judged as named
        let (chosen, _) = resolve_selectors(
            &[(GpuSelector::All, env), (GpuSelector::Index(2), cdi)],
            &KnownGpus::from_answer(&ok),
            &[],
        );
        assert_eq!(chosen, vec![(0, all), (5, all), (2, cdi)]);

        let failed = NvmlAnswer {
            gpus: Err("cannot load x".into()),
            driver_version: None,
            elapsed_us: 0,
            lookup: Lookup::Enumeration,
        };
        let (chosen, unresolved) = resolve_selectors(
            &[
                (GpuSelector::All, env),
                (GpuSelector::Index(4), env),
                (GpuSelector::Uuid("GPU-1".into()), env),
            ],
            &KnownGpus::from_answer(&failed),
            &[0, 1],
        );
        assert_eq!(chosen, vec![(0, all), (1, all), (4, env)]);
        assert_eq!(
            unresolved,
            vec!["NVIDIA_VISIBLE_DEVICES selects GPU-1, which cannot be checked: cannot load x"]
        );
    }
}
