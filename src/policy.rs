//! The decision table: a device's probe verdicts and its class, under the operator's
//! policy, give one disposition. Pure functions over plain data.

use crate::config::policy::{Action, OnUnknown, Policy};
use crate::model::device::{Device, Source};
use crate::model::text::one_line;
use crate::model::verdict::{ProbeResult, Reason, Verdict};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Disposition {
    /// Every probe passed (warnings aside).
    Healthy,
    /// Something is wrong but policy lets it start (`allow`, `warn`, `on_unknown: allow`).
    Allowed,
    Reject,
    Remap,
}

/// Why a disposition was chosen, as the operator configured it: `policy reject`,
/// `policy on_unknown reject`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceDecision {
    pub device: Device,
    pub verdicts: Vec<ProbeResult>,
    pub disposition: Disposition,
    /// The policy rule that applied, empty for a healthy device.
    pub rule: String,
    /// Unhealthy (or, under on_unknown, unknown) reasons that drove the disposition.
    pub reasons: Vec<String>,
    /// Warn-level findings that never block a start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The rule of a bad device a container holds but was not assigned
/// ([`Source::Held`]).
pub const HELD_RULE: &str =
    "held, not assigned: a container that holds every device is judged on its assigned devices";

/// How the held line begins ([`held_line`]).
const HELD_PREFIX: &str = "devgate: warning: holds ";

/// The rule of a device whose findings only warn, by how it reached the container: a GPU
/// named only by `all`, which every CUDA image asks for and may not even use; a device a
/// privileged container holds unassigned, since one bad GPU must not stop the node's own
/// pods (CNI, CSI, the GPU stack) from starting.
fn warns_only(source: Source) -> Option<&'static str> {
    match source {
        Source::AllGpus => Some("selected only by all: warns, never rejects"),
        Source::Held => Some(HELD_RULE),
        _ => None,
    }
}

/// One device's disposition, from its probes' verdicts and the operator's policy.
/// Long because it is one match in order of precedence (warns only, unhealthy, unknown,
/// healthy); split, the precedence would be spread out.
pub fn decide(device: Device, verdicts: Vec<ProbeResult>, policy: &Policy) -> DeviceDecision {
    let collect = |pick: fn(&Verdict) -> Option<&Reason>| -> Vec<String> {
        verdicts
            .iter()
            .filter_map(|r| pick(&r.verdict).map(|r| r.detail.clone()))
            .collect()
    };
    let bad = collect(|v| match v {
        Verdict::Unhealthy(r) => Some(r),
        _ => None,
    });
    let unknown: Vec<String> = verdicts
        .iter()
        .filter_map(|r| match &r.verdict {
            Verdict::Unknown(why) => Some(format!("{} unknown: {why}", r.probe)),
            _ => None,
        })
        .collect();
    let warnings = collect(|v| match v {
        Verdict::Warn(r) => Some(r),
        _ => None,
    });

    let (disposition, rule, reasons) = match warns_only(device.source) {
        Some(rule) if !(bad.is_empty() && unknown.is_empty()) => {
            let mut reasons = bad.clone();
            reasons.extend(unknown);
            (Disposition::Allowed, rule.into(), reasons)
        }
        _ if !bad.is_empty() => {
            let action = policy.action_for(&device.class);
            let d = match action {
                Action::Allow | Action::Warn => Disposition::Allowed,
                Action::Reject => Disposition::Reject,
                // Only a device the spec grants (linux.devices, a device rule, a bind mount) may
                // be swapped: a GPU named only by env or an annotation was never allocated to
                // the pod, and a spare granted for it would widen the pod's devices.
                Action::Remap if device.source.is_selector() => Disposition::Reject,
                Action::Remap => Disposition::Remap,
            };
            let rule = if action == Action::Remap && device.source.is_selector() {
                format!(
                    "policy remap; not remapped: named only by {}, not granted by the spec",
                    device.source.describe()
                )
            } else {
                format!("policy {}", action.as_str())
            };
            (d, rule, bad)
        }
        _ if !unknown.is_empty() => match policy.on_unknown {
            OnUnknown::Allow => (
                Disposition::Allowed,
                "policy on_unknown allow".into(),
                unknown,
            ),
            OnUnknown::Reject => (
                Disposition::Reject,
                "policy on_unknown reject".into(),
                unknown,
            ),
        },
        _ => (Disposition::Healthy, String::new(), Vec::new()),
    };
    DeviceDecision {
        device,
        verdicts,
        disposition,
        rule,
        reasons,
        warnings,
    }
}

/// One device's part of a reject line: `/dev/nvidia1 (195:1): reason; reason; policy reject`.
pub fn reject_clause(d: &DeviceDecision) -> String {
    let mut s = d.device.describe();
    s.push_str(": ");
    s.push_str(&d.reasons.join("; "));
    if !d.rule.is_empty() {
        s.push_str("; ");
        s.push_str(&d.rule);
    }
    s
}

/// Under `on_unknown: reject`, GPU selectors that name no GPU devgate can find refuse the
/// start: the reject line, from their warning lines. None otherwise.
pub fn unknown_selectors(warnings: &[String], policy: &Policy) -> Option<String> {
    if policy.on_unknown != OnUnknown::Reject || warnings.is_empty() {
        return None;
    }
    let why: Vec<&str> = warnings
        .iter()
        .map(|w| w.trim_start_matches("devgate: warning: "))
        .collect();
    Some(one_line(&format!(
        "devgate: rejected: {}; policy on_unknown reject",
        why.join("; ")
    )))
}

/// The one line runc carries up to kubelet. Several bad devices share the line, joined by
/// " | ", so `kubectl describe pod` shows all of them. Newlines in reasons (from a hostile
/// quarantine reason, say) are flattened: the line must stay one line.
pub fn reject_line<'a>(rejected: impl IntoIterator<Item = &'a DeviceDecision>) -> String {
    let clauses: Vec<String> = rejected.into_iter().map(reject_clause).collect();
    one_line(&format!("devgate: rejected {}", clauses.join(" | ")))
}

/// Every device's disposition, from its probe verdicts (one list per device, in order).
pub fn decide_all(
    devices: Vec<Device>,
    verdicts: Vec<Vec<ProbeResult>>,
    policy: &Policy,
) -> Vec<DeviceDecision> {
    devices
        .into_iter()
        .zip(verdicts)
        .map(|(d, verdicts)| decide(d, verdicts, policy))
        .collect()
}

/// A bad device the container holds but was not assigned: allowed, on the held line.
fn is_held_bad(d: &DeviceDecision) -> bool {
    d.device.source == Source::Held && d.disposition == Disposition::Allowed
}

/// The one line for every bad device a container holds but was not assigned:
/// `devgate: warning: holds /dev/nvidia2 (195:2): reason | …; not assigned to it: a
/// container that holds every device is judged on its assigned devices`.
pub fn held_line(held: &[&DeviceDecision]) -> String {
    let clauses: Vec<String> = held
        .iter()
        .map(|d| format!("{}: {}", d.device.describe(), d.reasons.join("; ")))
        .collect();
    one_line(&format!(
        "{HELD_PREFIX}{}; not assigned to it: a container that holds every device \
         is judged on its assigned devices",
        clauses.join(" | ")
    ))
}

/// The container's action, its line (the reject line; else, where a privileged container
/// holds bad devices it was not assigned, the held line, for the decision log), and
/// warning lines for stderr.
pub fn summarize(decisions: &[DeviceDecision]) -> (Action, Option<String>, Vec<String>) {
    let rejected: Vec<&DeviceDecision> = decisions
        .iter()
        .filter(|d| d.disposition == Disposition::Reject)
        .collect();
    let mut warnings = Vec::new();
    let held: Vec<&DeviceDecision> = decisions.iter().filter(|d| is_held_bad(d)).collect();
    let held = (!held.is_empty()).then(|| held_line(&held));
    warnings.extend(held.clone());
    for d in decisions {
        if d.disposition == Disposition::Allowed && !is_held_bad(d) {
            warnings.push(one_line(&format!("devgate: warning: {}", reject_clause(d))));
        }
        for w in &d.warnings {
            warnings.push(one_line(&format!(
                "devgate: warning: {}: {w}",
                d.device.describe()
            )));
        }
    }
    if !rejected.is_empty() {
        return (Action::Reject, Some(reject_line(rejected)), warnings);
    }
    let action = if decisions
        .iter()
        .any(|d| d.disposition == Disposition::Remap)
    {
        Action::Remap
    } else if decisions
        .iter()
        .any(|d| d.disposition == Disposition::Allowed)
        || !warnings.is_empty()
    {
        Action::Warn
    } else {
        Action::Allow
    };
    (action, held, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::{DevNum, DevType};
    use crate::model::verdict::Code;

    fn gpu(minor: u32) -> Device {
        Device {
            num: DevNum {
                typ: DevType::Char,
                major: 195,
                minor,
            },
            class: "nvidia-gpu".into(),
            container_path: Some(format!("/dev/nvidia{minor}").into()),
            host_path: Some(format!("/dev/nvidia{minor}").into()),
            source: Source::LinuxDevices,
            file_mode: None,
            uid: None,
            gid: None,
        }
    }

    fn res(probe: &'static str, v: Verdict) -> ProbeResult {
        ProbeResult {
            probe: probe.into(),
            verdict: v,
        }
    }

    #[test]
    fn healthy_device_is_healthy_with_warnings_kept() {
        let d = decide(
            gpu(0),
            vec![
                res("node", Verdict::Healthy),
                res("sysfs", Verdict::warn(Code::PcieLinkDegraded, "link slow")),
            ],
            &Policy::default(),
        );
        assert_eq!(d.disposition, Disposition::Healthy);
        assert_eq!(d.warnings, vec!["link slow".to_string()]);
    }

    /// A bad device a privileged container holds unassigned warns, on one line for all
    /// of them, whatever the policy says; an assigned one beside it is judged as ever.
    #[test]
    fn held_bad_devices_warn_on_one_line_and_assigned_ones_are_judged() {
        let held = |minor| Device {
            source: Source::Held,
            ..gpu(minor)
        };
        let lost = || {
            vec![res(
                "nvml",
                Verdict::unhealthy(Code::GpuLost, "GPU is lost (fallen off the bus)"),
            )]
        };
        let unknown = || {
            vec![res(
                "nvml",
                Verdict::unknown(Code::NvmlTimeout, "no answer"),
            )]
        };
        let mut p = Policy {
            on_unknown: OnUnknown::Reject,
            ..Policy::default()
        };
        p.classes.insert("nvidia-gpu".into(), Action::Remap);
        let d = vec![
            decide(held(2), lost(), &p),
            decide(held(3), unknown(), &p),
            decide(held(4), vec![res("nvml", Verdict::Healthy)], &p),
        ];
        assert_eq!(d[0].disposition, Disposition::Allowed);
        assert_eq!(d[0].rule, HELD_RULE);
        assert_eq!(d[1].disposition, Disposition::Allowed);
        assert_eq!(d[2].disposition, Disposition::Healthy);
        let (action, message, warnings) = summarize(&d);
        let line = format!(
            "{HELD_PREFIX}/dev/nvidia2 (195:2): GPU is lost (fallen off the bus) | \
             /dev/nvidia3 (195:3): nvml unknown: no answer; not assigned to it: a \
             container that holds every device is judged on its assigned devices"
        );
        // the one line on stderr, and the decision's line for the log
        assert_eq!(action, Action::Warn);
        assert_eq!(message.as_deref(), Some(line.as_str()));
        assert_eq!(warnings, vec![line]);
        // the same GPU assigned: the policy's
        let mut d = d;
        d.push(decide(gpu(5), lost(), &Policy::default()));
        let (action, message, _) = summarize(&d);
        assert_eq!(action, Action::Reject);
        assert!(message
            .unwrap()
            .starts_with("devgate: rejected /dev/nvidia5 (195:5)"));
    }

    #[test]
    fn unhealthy_follows_class_then_default() {
        let mut p = Policy::default();
        let bad = || {
            vec![res(
                "quarantine",
                Verdict::unhealthy(Code::Quarantined, "quarantined by operator: \"x\""),
            )]
        };
        assert_eq!(decide(gpu(1), bad(), &p).disposition, Disposition::Reject);
        p.classes.insert("nvidia-gpu".into(), Action::Warn);
        let d = decide(gpu(1), bad(), &p);
        assert_eq!(d.disposition, Disposition::Allowed);
        assert_eq!(d.rule, "policy warn");
        p.classes.insert("nvidia-gpu".into(), Action::Remap);
        assert_eq!(decide(gpu(1), bad(), &p).disposition, Disposition::Remap);
        // a GPU named only by env or a CDI annotation is gated, never remapped
        for src in [Source::NvidiaVisibleDevices, Source::CdiAnnotation] {
            let d = decide(
                Device {
                    source: src,
                    ..gpu(1)
                },
                bad(),
                &p,
            );
            assert_eq!(d.disposition, Disposition::Reject, "{src:?}");
            assert!(d.rule.contains("not remapped"), "{}", d.rule);
        }
        p.default = Action::Allow;
        p.classes.clear();
        assert_eq!(decide(gpu(1), bad(), &p).disposition, Disposition::Allowed);
    }

    #[test]
    fn a_gpu_selected_only_by_all_warns_never_rejects() {
        let p = Policy {
            on_unknown: OnUnknown::Reject,
            ..Policy::default()
        };
        let all = || Device {
            source: Source::AllGpus,
            ..gpu(1)
        };
        let bad = vec![res(
            "nvml",
            Verdict::unhealthy(Code::RowRemapFailed, "row remapping failed"),
        )];
        let d = decide(all(), bad.clone(), &p);
        assert_eq!(d.disposition, Disposition::Allowed);
        assert_eq!(d.reasons, vec!["row remapping failed".to_string()]);
        let unk = vec![res("nvml", Verdict::unknown(Code::NvmlUnanswered, "hang"))];
        assert_eq!(decide(all(), unk, &p).disposition, Disposition::Allowed);
        // the same GPU named on its own is gated
        assert_eq!(decide(gpu(1), bad, &p).disposition, Disposition::Reject);
    }

    #[test]
    fn unknown_follows_on_unknown_and_unhealthy_wins_over_unknown() {
        let mut p = Policy::default();
        let unk = || {
            vec![res(
                "nvml",
                Verdict::unknown(Code::NvmlUnanswered, "library not found"),
            )]
        };
        assert_eq!(decide(gpu(0), unk(), &p).disposition, Disposition::Allowed);
        p.on_unknown = OnUnknown::Reject;
        let d = decide(gpu(0), unk(), &p);
        assert_eq!(d.disposition, Disposition::Reject);
        assert_eq!(
            reject_clause(&d),
            "/dev/nvidia0 (195:0): nvml unknown: library not found; policy on_unknown reject"
        );
        let mut v = unk();
        v.push(res("node", Verdict::unhealthy(Code::NodeMissing, "gone")));
        assert_eq!(decide(gpu(0), v, &p).rule, "policy reject");
    }

    #[test]
    fn reject_line_format_matches_contract() {
        let d = decide(
            gpu(1),
            vec![res(
                "quarantine",
                Verdict::unhealthy(
                    Code::Quarantined,
                    "quarantined by operator: \"xid 79 seen\"",
                ),
            )],
            &Policy::default(),
        );
        assert_eq!(
            reject_line([&d]),
            "devgate: rejected /dev/nvidia1 (195:1): quarantined by operator: \"xid 79 seen\"; policy reject"
        );
        let d2 = decide(
            gpu(2),
            vec![
                res("node", Verdict::unhealthy(Code::NodeMissing, "a\nb")),
                res("sysfs", Verdict::unhealthy(Code::DriverUnbound, "c")),
            ],
            &Policy::default(),
        );
        assert_eq!(
            reject_line([&d, &d2]),
            "devgate: rejected /dev/nvidia1 (195:1): quarantined by operator: \"xid 79 seen\"; policy reject | /dev/nvidia2 (195:2): a\\x0ab; c; policy reject"
        );
    }

    #[test]
    fn unknown_selectors_refuse_only_under_on_unknown_reject() {
        let w = vec!["devgate: warning: NVIDIA_VISIBLE_DEVICES value \"junk\" is …".to_string()];
        let mut p = Policy::default();
        assert_eq!(unknown_selectors(&w, &p), None);
        p.on_unknown = OnUnknown::Reject;
        assert_eq!(unknown_selectors(&[], &p), None);
        assert_eq!(
            unknown_selectors(&w, &p).unwrap(),
            "devgate: rejected: NVIDIA_VISIBLE_DEVICES value \"junk\" is …; policy on_unknown reject"
        );
    }
}
