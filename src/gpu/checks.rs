//! What NVML's answer means for a container's GPUs: each GPU's checks against the
//! operator's limits (pure), the NVML probe, and (in `select`) which GPUs a selector names.

use super::nvml::facts::RemappedRows;
use super::nvml::{GpuFacts, Link, Reading, LOST};
use super::recovery;
use crate::model::verdict::{Code, Verdict};
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

/// Judges one GPU's facts, check by check, in the order `devgate status` lists them. Pure.
pub fn checks(g: &GpuFacts, limits: Limits) -> Vec<Check> {
    [
        ("reachable", reachable(g)),
        (
            "remapped_rows",
            judge(&g.remapped_rows, "remapped rows", remapped_rows),
        ),
        (
            "retired_pages",
            judge(&g.retired_pages_pending, "retired pages", |p| {
                retired_pages(*p)
            }),
        ),
        (
            "volatile_ecc",
            judge(&g.volatile_uncorrectable_ecc, "volatile ECC", |n| {
                volatile_ecc(*n, limits)
            }),
        ),
        (
            "throttle",
            judge(&g.throttle_reasons, "throttle reasons", |bits| {
                throttle(*bits)
            }),
        ),
        // Only the width: an idle GPU trains its link down to gen 1 to save power, and NVML
        // has no "under load" signal, so the generation says nothing at prestart.
        (
            "pcie_link",
            judge(&g.pcie_width, "PCIe link width", |l| {
                below(l, "PCIe link width x", "x")
            }),
        ),
        // One GPU's view; the probe refuses DRAIN_P2P for a container with several GPUs.
        (
            "recovery_action",
            judge(&g.recovery_action, "recovery action", |a| {
                recovery::action_verdict(*a, 1)
            }),
        ),
        (
            "drain",
            judge(&g.drain, "drain state", |d| recovery::drain_verdict(*d)),
        ),
    ]
    .into_iter()
    .map(|(check, verdict)| Check { check, verdict })
    .collect()
}

/// Whether NVML reached the GPU; a lost GPU is unhealthy whatever the reason.
fn reachable(g: &GpuFacts) -> Verdict {
    match &g.unreachable {
        Some(why) if g.is_lost() => {
            Verdict::unhealthy(Code::GpuLost, format!("unreachable: {why}"))
        }
        Some(why) => Verdict::unknown(g.unreachable_code(), why.clone()),
        None if g.is_lost() => Verdict::unhealthy(Code::GpuLost, LOST),
        None => Verdict::Healthy,
    }
}

fn remapped_rows(r: &RemappedRows) -> Verdict {
    if r.failure {
        Verdict::unhealthy(
            Code::RowRemapFailed,
            format!(
                "row remapping failed ({} uncorrectable rows, {} correctable)",
                r.uncorrectable, r.correctable
            ),
        )
    } else if r.pending {
        Verdict::unhealthy(
            Code::RowRemapPending,
            format!(
                "row remapping pending, reset required ({} uncorrectable rows, {} correctable)",
                r.uncorrectable, r.correctable
            ),
        )
    } else {
        Verdict::Healthy
    }
}

fn retired_pages(pending: bool) -> Verdict {
    if pending {
        Verdict::unhealthy(
            Code::RetiredPagesPending,
            "retired pages pending, reboot required",
        )
    } else {
        Verdict::Healthy
    }
}

fn volatile_ecc(n: u64, limits: Limits) -> Verdict {
    let max = limits.max_volatile_uncorrectable_ecc;
    if n > max {
        Verdict::unhealthy(
            Code::EccVolatileUncorrectable,
            format!("volatile uncorrectable ECC errors {n} > {max}"),
        )
    } else {
        Verdict::Healthy
    }
}

/// The hardware's own throttle reasons among `bits` ([`THROTTLE_REASONS`]): a warning.
fn throttle(bits: u64) -> Verdict {
    let active: Vec<&str> = THROTTLE_REASONS
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if active.is_empty() {
        Verdict::Healthy
    } else {
        Verdict::warn(
            Code::Throttled,
            format!(
                "clocks throttled by {} (reasons 0x{bits:x})",
                active.join(", ")
            ),
        )
    }
}

fn below(l: &Link, what: &str, unit: &str) -> Verdict {
    if l.current < l.max {
        Verdict::warn(
            Code::PcieLinkDegraded,
            format!("{what}{} below max {unit}{}", l.current, l.max),
        )
    } else {
        Verdict::Healthy
    }
}

fn judge<T>(r: &Reading<T>, what: &str, f: impl FnOnce(&T) -> Verdict) -> Verdict {
    match r {
        Reading::Value(v) => f(v),
        Reading::NotSupported(why) => {
            Verdict::not_applicable(Code::NotReported, format!("{what}: {why}"))
        }
        Reading::Lost => Verdict::unhealthy(Code::GpuLost, LOST),
        Reading::Failed(why) => {
            Verdict::unknown(Code::NvmlReadFailed, format!("cannot read {what}: {why}"))
        }
    }
}

/// The probe's one verdict for a GPU: a lost GPU is one finding, whatever else failed;
/// otherwise the worst checks, prefixed with which GPU NVML means.
pub fn verdict_for(g: &GpuFacts, checks: &[Check]) -> Verdict {
    let label = g.label();
    if g.is_lost() {
        return Verdict::unhealthy(Code::GpuLost, format!("nvml: GPU {label}: {LOST}"));
    }
    let prefix = format!("nvml: GPU {label}: ");
    // No answer: one reason, not one per check.
    if let Some(why) = &g.unreachable {
        return Verdict::unknown(g.unreachable_code(), format!("{prefix}{why}"));
    }
    match Verdict::worst(checks.iter().map(|c| c.verdict.clone()).collect()) {
        Verdict::NotApplicable(_) | Verdict::Healthy => Verdict::Healthy,
        v => v.prefixed(&prefix),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::nvml::facts::RemappedRows;
    use crate::gpu::nvml::tests::healthy;
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
            Verdict::unhealthy(
                Code::RowRemapFailed,
                "nvml: GPU GPU-00000001-0000-0000-0000-000000000000 (0000:2b:00.0): row remapping failed (3 uncorrectable rows, 1 correctable)"
            )
        );
        g.remapped_rows = Reading::Value(RemappedRows {
            correctable: 0,
            uncorrectable: 2,
            pending: true,
            failure: false,
        });
        let v = verdict(&g);
        assert_eq!(v.code(), Some(Code::RowRemapPending));
        assert!(
            v.detail().unwrap().ends_with(
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
        // the first of the worst findings names the code; the detail names both
        assert_eq!(v.code(), Some(Code::RetiredPagesPending));
        assert!(
            v.detail().unwrap().ends_with(
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
            Verdict::unhealthy(
                Code::GpuLost,
                "nvml: GPU GPU-00000002-0000-0000-0000-000000000000 (0000:3b:00.0): GPU is lost (fallen off the bus)"
            )
        );
        let pcie = &checks(&g, L)[5];
        assert_eq!(pcie.verdict, Verdict::unhealthy(Code::GpuLost, LOST));
        // a GPU NVML gave no answer for, not lost: unknown, one reason
        let slow = GpuFacts::unreachable(
            4,
            "NVML did not answer for this GPU in 2000 ms".into(),
            false,
        );
        assert_eq!(
            verdict(&slow),
            Verdict::unknown(
                Code::NvmlUnanswered,
                "nvml: GPU index 4: NVML did not answer for this GPU in 2000 ms"
            )
        );
        let u = GpuFacts::unreachable(5, "GPU is lost".into(), true);
        assert!(u.is_lost());
        assert_eq!(
            verdict(&u),
            Verdict::unhealthy(
                Code::GpuLost,
                "nvml: GPU index 5: GPU is lost (fallen off the bus)"
            )
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
            Verdict::warn(
                Code::Throttled,
                "nvml: GPU GPU-00000000-0000-0000-0000-000000000000 (0000:1b:00.0): clocks throttled by hw_slowdown, hw_thermal (reasons 0x4c); PCIe link width x8 below max x16"
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
        assert_eq!(checks[1].verdict.code(), Some(Code::NotReported));
        assert_eq!(checks[2].verdict.code(), Some(Code::NotReported));
        assert_eq!(checks[2].verdict.status(), "not_applicable");
        assert_eq!(verdict_for(&g, &checks), Verdict::Healthy);
        g.volatile_uncorrectable_ecc = Reading::from_error(NvmlError::Unknown);
        let v = verdict(&g);
        assert_eq!(v.status(), "unknown");
        assert_eq!(v.code(), Some(Code::NvmlReadFailed));
        assert!(
            v.detail().unwrap().contains("cannot read volatile ECC"),
            "{v:?}"
        );
    }
}
