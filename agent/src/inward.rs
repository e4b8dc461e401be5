//! Inward: the cluster's taints on this node's devices (DeviceTaintRules other than the
//! agent's own, and the drivers' own ResourceSlice taints), each with the pods whose claims
//! tolerate it, for the hook's file. The hook never calls the API server; this is how it
//! hears of a taint.

use crate::dra::{tolerating_pods, DeviceTaintRule, NodeDevice, ResourceClaim, Taint};
use crate::outward::is_ours;
use devgate::store::cluster::{
    ClusterTaint, Effect, MAX_STRING_CHARS, MAX_TAINTS, MAX_TOLERATED_BY,
};

/// A taint on one of this node's devices, and where it came from.
pub struct Found<'a> {
    pub device: &'a NodeDevice,
    pub taint: &'a Taint,
    pub source: String,
}

/// Every taint the cluster puts on `devices`: the drivers' own, then the rules'.
pub fn taints_here<'a>(
    rules: &'a [DeviceTaintRule],
    devices: &'a [NodeDevice],
    node: &str,
) -> Vec<Found<'a>> {
    let mut out = Vec::new();
    for d in devices {
        for t in &d.taints {
            out.push(Found {
                device: d,
                taint: t,
                source: format!("ResourceSlice {}", d.slice),
            });
        }
        for r in rules.iter().filter(|r| !is_ours(r, node)) {
            if r.spec
                .device_selector
                .as_ref()
                .is_some_and(|s| s.selects(d))
            {
                out.push(Found {
                    device: d,
                    taint: &r.spec.taint,
                    source: format!("DeviceTaintRule {}", r.metadata.name),
                });
            }
        }
    }
    out
}

/// The file's entries for `found`; a taint of an effect the hook does not know is left out
/// (and said), so a newer cluster's effect never turns into a reject by accident.
pub fn file_taints(found: &[Found], claims: &[ResourceClaim]) -> Vec<ClusterTaint> {
    found
        .iter()
        .filter_map(|f| {
            let Some(effect) = effect(&f.taint.effect) else {
                log::warn!(
                    "{}: taint effect {:?} unknown to devgate; not passed to the gate",
                    f.source,
                    devgate::model::text::one_line(&f.taint.effect)
                );
                return None;
            };
            let mut tolerated_by = tolerating_pods(claims, f.device, f.taint);
            tolerated_by.truncate(MAX_TOLERATED_BY);
            Some(ClusterTaint {
                uuid: f.device.uuid.as_deref().map(bounded),
                pci_bus_id: f.device.pci_bus_id.as_deref().map(bounded),
                device: bounded(&f.device.device),
                driver: bounded(&f.device.driver),
                pool: bounded(&f.device.pool),
                key: bounded(&f.taint.key),
                value: bounded(&f.taint.value),
                effect,
                source: bounded(&f.source),
                tolerated_by,
            })
        })
        .take(MAX_TAINTS)
        .collect()
}

fn effect(s: &str) -> Option<Effect> {
    match s {
        "None" => Some(Effect::None),
        "NoSchedule" => Some(Effect::NoSchedule),
        "NoExecute" => Some(Effect::NoExecute),
        _ => None,
    }
}

/// The file's bound on a string; the API server's own bounds are far below it, so this
/// only keeps a strange object from making the whole file unreadable.
fn bounded(s: &str) -> String {
    s.chars().take(MAX_STRING_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::{Meta, RuleSpec, Selector};
    use crate::outward::{MANAGED_BY, NODE_ANNOTATION};
    use std::collections::BTreeMap;

    fn rule(name: &str, device: &str, ours: bool) -> DeviceTaintRule {
        let mut metadata = Meta {
            name: name.into(),
            ..Meta::default()
        };
        if ours {
            metadata.labels = BTreeMap::from([(MANAGED_BY.0.into(), MANAGED_BY.1.into())]);
            metadata.annotations = BTreeMap::from([(NODE_ANNOTATION.into(), "n1".into())]);
        }
        DeviceTaintRule {
            api_version: None,
            kind: None,
            metadata,
            spec: RuleSpec {
                device_selector: Some(Selector {
                    driver: Some("gpu.nvidia.com".into()),
                    pool: None,
                    device: Some(device.into()),
                }),
                taint: Taint {
                    key: "example.com/maint".into(),
                    value: "".into(),
                    effect: "NoSchedule".into(),
                },
            },
        }
    }

    fn dev(name: &str, taints: Vec<Taint>) -> NodeDevice {
        NodeDevice {
            driver: "gpu.nvidia.com".into(),
            pool: "n1".into(),
            device: name.into(),
            uuid: Some(format!("GPU-{name}")),
            pci_bus_id: None,
            taints,
            slice: "slice-1".into(),
        }
    }

    #[test]
    fn others_rules_and_drivers_taints_but_never_the_agents_own() {
        let rules = [
            rule("op", "gpu-1", false),
            rule("devgate-n1-gpu-2-x", "gpu-2", true),
        ];
        let lost = Taint {
            key: "gpu.nvidia.com/gpu-lost".into(),
            value: "".into(),
            effect: "NoExecute".into(),
        };
        let odd = Taint {
            key: "k".into(),
            value: "".into(),
            effect: "Drain".into(),
        };
        let devices = [
            dev("gpu-0", vec![lost, odd]),
            dev("gpu-1", vec![]),
            dev("gpu-2", vec![]),
        ];
        let found = taints_here(&rules, &devices, "n1");
        let seen: Vec<(&str, &str)> = found
            .iter()
            .map(|f| (f.device.device.as_str(), f.source.as_str()))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("gpu-0", "ResourceSlice slice-1"),
                ("gpu-0", "ResourceSlice slice-1"),
                ("gpu-1", "DeviceTaintRule op")
            ]
        );
        let file = file_taints(&found, &[]);
        assert_eq!(file.len(), 2, "the unknown effect is left out");
        assert_eq!(file[1].uuid.as_deref(), Some("GPU-gpu-1"));
        assert_eq!(file[1].effect, Effect::NoSchedule);
        // The same rule read as another node's agent's is someone else's: it counts.
        assert_eq!(taints_here(&rules, &devices, "n2").len(), 4);
    }
}
