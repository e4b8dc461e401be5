//! The baseline rules, pure: how the counters read at a start are judged against the
//! baseline stored at the last one, and what is stored next.

use super::seen::FunctionSeen;
use crate::gpu::nvml::Reading;
use crate::model::clock;
use crate::model::verdict::{Code, Verdict};
use crate::store::pcie::{AerCounts, PcieBaseline, ReplayCount};

/// Counters lower than the baseline restarted (the function was removed and added again:
/// a reboot, a hot-plug, a link that dropped and came back) after the baseline was taken.
fn restarted(now: &AerCounts, base: &AerCounts) -> bool {
    now.fatal < base.fatal || now.nonfatal < base.nonfatal || now.correctable < base.correctable
}

/// What counts are judged against: the stored counts, or zero where the counters restarted
/// since, as all they count then happened after the baseline was taken (a broken device
/// whose link drops and comes back with a fatal error must not pass as a restart).
fn judged_against(now: &AerCounts, base: &AerCounts) -> AerCounts {
    match restarted(now, base) {
        true => AerCounts::default(),
        false => *base,
    }
}

/// The rule, pure: a rise of the fatal count since the baseline is unhealthy; of the
/// non-fatal or correctable count, a warning. No baseline yet: nothing to judge.
pub fn judge_aer(name: &str, now: &AerCounts, base: Option<&PcieBaseline>) -> Verdict {
    let Some((b, stored)) = base.and_then(|b| Some((b, b.aer?))) else {
        return Verdict::Healthy;
    };
    let aer = judged_against(now, &stored);
    let since = clock::rfc3339(b.time_unix);
    let restart = if restarted(now, &stored) {
        "counters restarted: "
    } else {
        ""
    };
    let rise = |what: &str, was: u64, is: u64| {
        let n = is - was;
        format!(
            "PCIe AER: {n} {what} error{} on {name} since {since} ({restart}{was} -> {is})",
            if n == 1 { "" } else { "s" }
        )
    };
    let mut findings = Vec::new();
    if now.fatal > aer.fatal {
        findings.push(Verdict::unhealthy(
            Code::AerFatal,
            rise("fatal", aer.fatal, now.fatal),
        ));
    }
    if now.nonfatal > aer.nonfatal {
        findings.push(Verdict::warn(
            Code::AerNonfatal,
            rise("non-fatal", aer.nonfatal, now.nonfatal),
        ));
    }
    if now.correctable > aer.correctable {
        findings.push(Verdict::warn(
            Code::AerCorrectable,
            rise("correctable", aer.correctable, now.correctable),
        ));
    }
    match Verdict::worst(findings) {
        Verdict::NotApplicable(_) => Verdict::Healthy,
        v => v,
    }
}

/// The replay rule, pure: a rise since the baseline warns, as a correctable AER error does
/// (a replay is the link recovering from an error by sending again). No baseline yet, or
/// a count below it (the driver reloaded, the GPU was reset): nothing to judge.
pub fn judge_replay(name: &str, now: u64, base: Option<&PcieBaseline>) -> Verdict {
    match base.and_then(|b| b.replay) {
        Some(b) if now > b.count => {
            let n = now - b.count;
            Verdict::warn(
                Code::PcieReplay,
                format!(
                    "PCIe replay counter: {n} replay{} on {name} since {} ({} -> {now})",
                    if n == 1 { "" } else { "s" },
                    clock::rfc3339(b.time_unix),
                    b.count
                ),
            )
        }
        _ => Verdict::Healthy,
    }
}

/// The baseline after a gate: the counts now, except that a fatal rise is kept unmoved so
/// that it goes on counting until the counters restart or the operator removes the file
/// (counters that restarted keep a fatal count of zero: one counted since is a rise).
pub fn advance(now: &AerCounts, base: Option<&AerCounts>) -> AerCounts {
    match base {
        Some(b) => AerCounts {
            fatal: judged_against(now, b).fatal,
            ..*now
        },
        None => *now,
    }
}

/// The baseline to store after a gate that read `seen`, from the one stored before (`old`);
/// None when there is nothing to store.
pub(super) fn next_baseline(
    seen: &FunctionSeen,
    old: Option<&PcieBaseline>,
    now_unix: u64,
) -> Option<PcieBaseline> {
    let old_aer = old.and_then(|b| b.aer);
    let aer = match &seen.aer {
        Some(Ok(now)) => Some(advance(now, old_aer.as_ref())),
        _ => old_aer,
    };
    let time_unix = match (old, &seen.aer) {
        (Some(o), _) if aer == old_aer => o.time_unix,
        // While a fatal rise stands, "since" keeps naming when it was taken.
        (Some(o), Some(Ok(now))) if aer.is_some_and(|a| a.fatal < now.fatal) => o.time_unix,
        _ => now_unix,
    };
    // The replay counter only ever warns: it moves to the count read.
    let old_replay = old.and_then(|b| b.replay);
    let replay = match &seen.replay {
        Some(Reading::Value(n)) => Some(match old_replay {
            Some(r) if r.count == u64::from(*n) => r,
            _ => ReplayCount {
                count: u64::from(*n),
                time_unix: now_unix,
            },
        }),
        _ => old_replay,
    };
    if aer.is_none() && replay.is_none() {
        return None;
    }
    let next = PcieBaseline {
        function: seen.name.clone(),
        time_unix,
        aer,
        replay,
    };
    (old != Some(&next)).then_some(next)
}
