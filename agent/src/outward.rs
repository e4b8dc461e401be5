//! Outward: one DeviceTaintRule per device devgate judges bad that a DRA driver publishes
//! on this node, kept in step with devgate's verdicts. The agent creates, updates and
//! deletes only rules that carry its label and this node's annotation.

use crate::api::{Api, ApiResult};
use crate::dra::{DeviceTaintRule, List, Meta, NodeDevice, RuleSpec, Selector, Taint};
use crate::names::{label_value, rule_prefix};
use crate::opts::Effect;
use crate::verdicts::Bad;
use devgate::gpu::pci::GpuKey;
use std::collections::BTreeMap;

pub use crate::dra::{is_ours, MANAGED_BY, NODE_ANNOTATION};
/// What an annotation may hold of devgate's words (the API server allows 256 KiB in all).
const MAX_REASON: usize = 1024;

/// The DRA device behind devgate's bad device: the one that names the same GPU, as the
/// hook matches a taint to a GPU (`GpuKey::same_gpu`).
pub fn published_as<'a>(b: &Bad, devices: &'a [NodeDevice]) -> Option<&'a NodeDevice> {
    let gpu = GpuKey::of(b.uuid.as_deref(), b.pci_bus_id.as_deref());
    devices
        .iter()
        .find(|d| GpuKey::of(d.uuid.as_deref(), d.pci_bus_id.as_deref()).same_gpu(&gpu))
}

/// Every DRA device that names the same GPU as `b`: a slice that lists first a device
/// with its uuid (another driver's, or a hostile one's) must not take the taint from the
/// one its own driver publishes.
pub fn all_published_as<'a>(
    b: &Bad,
    devices: &'a [NodeDevice],
) -> impl Iterator<Item = &'a NodeDevice> {
    let uuid = b.uuid.clone();
    let pci = b.pci_bus_id.clone();
    devices.iter().filter(move |d| {
        let gpu = GpuKey::of(uuid.as_deref(), pci.as_deref());
        GpuKey::of(d.uuid.as_deref(), d.pci_bus_id.as_deref()).same_gpu(&gpu)
    })
}

/// The rules this node should have: one per DRA device that names a bad GPU.
pub fn desired(
    bad: &[Bad],
    devices: &[NodeDevice],
    node: &str,
    key: &str,
    effect: Effect,
) -> Vec<DeviceTaintRule> {
    let mut rules: Vec<DeviceTaintRule> = bad
        .iter()
        .flat_map(|b| all_published_as(b, devices).map(move |d| (b, d)))
        .map(|(b, d)| {
            let annotations = BTreeMap::from([
                (NODE_ANNOTATION.to_string(), node.to_string()),
                (
                    "devgate.io/reason".to_string(),
                    b.reason.chars().take(MAX_REASON).collect(),
                ),
                ("devgate.io/code".to_string(), b.code.as_str().to_string()),
                ("devgate.io/device".to_string(), b.name.clone()),
            ]);
            DeviceTaintRule {
                api_version: None,
                kind: None,
                metadata: Meta {
                    generate_name: rule_prefix(node, &d.device),
                    labels: BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())]),
                    annotations,
                    ..Meta::default()
                },
                spec: RuleSpec {
                    device_selector: Some(Selector {
                        driver: Some(d.driver.clone()),
                        pool: Some(d.pool.clone()),
                        device: Some(d.device.clone()),
                    }),
                    taint: Taint {
                        key: key.to_string(),
                        value: label_value(b.code.as_str()),
                        effect: effect.as_str().to_string(),
                        time_added: None,
                    },
                },
            }
        })
        .collect();
    rules.sort_by(|a, b| a.spec.device_selector.cmp(&b.spec.device_selector));
    rules.dedup_by(|a, b| a.spec.device_selector == b.spec.device_selector);
    rules
}

/// What to do to go from `have` (this node's own rules) to `want`.
#[derive(Debug, PartialEq)]
pub enum Step<'a> {
    Create(&'a DeviceTaintRule),
    /// Spec or code changed: a merge patch (the API server's timeAdded stays), on the
    /// version the agent read (`resource_version`), so a rule replaced meanwhile is not
    /// edited.
    Update {
        rule: &'a DeviceTaintRule,
        name: &'a str,
        resource_version: &'a str,
    },
    Delete {
        name: &'a str,
        uid: &'a str,
    },
}

/// A rule of this agent is known by what it selects, not by its name (which the API
/// server gives it): the first of its rules selecting a device is that device's, any
/// other is deleted.
pub fn plan<'a>(have: &'a [DeviceTaintRule], want: &'a [DeviceTaintRule]) -> Vec<Step<'a>> {
    let mut steps = Vec::new();
    let for_device = |w: &DeviceTaintRule| {
        have.iter()
            .find(|h| h.spec.device_selector == w.spec.device_selector)
    };
    for w in want {
        match for_device(w) {
            None => steps.push(Step::Create(w)),
            Some(h) => {
                let code =
                    |r: &DeviceTaintRule| r.metadata.annotations.get("devgate.io/code").cloned();
                // The API server adds timeAdded: not a difference of devgate's.
                let same_spec = h.spec.device_selector == w.spec.device_selector
                    && h.spec.taint.same(&w.spec.taint);
                if !same_spec || code(h) != code(w) {
                    steps.push(Step::Update {
                        rule: w,
                        name: &h.metadata.name,
                        resource_version: &h.metadata.resource_version,
                    });
                }
            }
        }
    }
    for h in have {
        let kept = want
            .iter()
            .any(|w| for_device(w).is_some_and(|k| k.metadata.name == h.metadata.name));
        if !kept {
            steps.push(Step::Delete {
                name: &h.metadata.name,
                uid: &h.metadata.uid,
            });
        }
    }
    steps
}

/// Every DeviceTaintRule on the cluster (the inward path reads the others').
pub async fn list_rules(api: &Api, version: &str) -> ApiResult<Vec<DeviceTaintRule>> {
    // resourceVersion=0: from the API server's watch cache, not etcd (every node asks).
    let l: List<DeviceTaintRule> = api
        .get(&format!(
            "/apis/resource.k8s.io/{version}/devicetaintrules?resourceVersion=0"
        ))
        .await?;
    Ok(l.items)
}

/// Brings this node's rules to `want`; returns how many of `want` it holds after. A
/// rule it could not create is left for the next sync and counted out, so the status
/// file, doctor and the metrics show it (`rules` below `rules_wanted`).
pub async fn apply(
    api: &Api,
    version: &str,
    node: &str,
    all: &[DeviceTaintRule],
    want: &[DeviceTaintRule],
) -> ApiResult<usize> {
    let have: Vec<DeviceTaintRule> = all.iter().filter(|r| is_ours(r, node)).cloned().collect();
    let base = format!("/apis/resource.k8s.io/{version}/devicetaintrules");
    let mut held = want.len();
    for step in plan(&have, want) {
        match step {
            Step::Create(r) => {
                let mut body = serde_json::to_value(r).expect("rule");
                body["apiVersion"] = format!("resource.k8s.io/{version}").into();
                body["kind"] = "DeviceTaintRule".into();
                match api.post(&base, &body).await {
                    // generateName met a name someone holds (the API server does not
                    // retry): the next sync asks for another.
                    Err(e) if e.code() == Some(409) => {
                        held -= 1;
                        log::warn!(
                            "DeviceTaintRule {}…: the name given is taken; retried next sync",
                            r.metadata.generate_name
                        )
                    }
                    Err(e) => return Err(e),
                    Ok(()) => log::info!(
                        "created DeviceTaintRule {}… ({})",
                        r.metadata.generate_name,
                        taint_text(&r.spec.taint)
                    ),
                }
            }
            Step::Update {
                rule: r,
                name,
                resource_version,
            } => {
                let body = serde_json::json!({
                    "metadata": {"annotations": r.metadata.annotations,
                        "resourceVersion": resource_version},
                    "spec": {"deviceSelector": r.spec.device_selector, "taint": {
                        "key": r.spec.taint.key, "value": r.spec.taint.value, "effect": r.spec.taint.effect}},
                });
                api.patch(&format!("{base}/{name}"), &body, true).await?;
                log::info!(
                    "updated DeviceTaintRule {name} ({})",
                    taint_text(&r.spec.taint)
                );
            }
            Step::Delete { name, uid } => {
                api.delete(&format!("{base}/{name}"), uid).await?;
                log::info!("deleted DeviceTaintRule {name}: the device is healthy again, or a second rule for it");
            }
        }
    }
    Ok(held)
}

pub fn taint_text(t: &Taint) -> String {
    if t.value.is_empty() {
        format!("{}:{}", t.key, t.effect)
    } else {
        format!("{}={}:{}", t.key, t.value, t.effect)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devgate::model::verdict::Code;

    fn dev(name: &str, uuid: Option<&str>, pci: Option<&str>) -> NodeDevice {
        NodeDevice {
            driver: "gpu.nvidia.com".into(),
            pool: "n1".into(),
            device: name.into(),
            uuid: uuid.map(String::from),
            pci_bus_id: pci.map(String::from),
            taints: vec![],
            slice: "s".into(),
        }
    }

    fn bad(uuid: Option<&str>, pci: Option<&str>, code: Code) -> Bad {
        Bad {
            key: "c 195:2".into(),
            name: "/dev/nvidia2".into(),
            class: devgate::model::class::Class::NvidiaGpu,
            code,
            reason: "xid: XID 79".into(),
            uuid: uuid.map(String::from),
            pci_bus_id: pci.map(String::from),
        }
    }

    #[test]
    fn a_bad_gpu_is_found_by_uuid_then_by_pci_address() {
        let devs = [
            dev("gpu-0", Some("GPU-a"), Some("0000:01:00.0")),
            dev("gpu-2", None, Some("0000:03:00.0")),
        ];
        assert_eq!(
            published_as(&bad(Some("gpu-A"), None, Code::XidCritical), &devs)
                .unwrap()
                .device,
            "gpu-0"
        );
        assert_eq!(
            published_as(
                &bad(Some("GPU-z"), Some("00000000:03:00.0"), Code::XidCritical),
                &devs
            )
            .unwrap()
            .device,
            "gpu-2"
        );
        assert!(published_as(&bad(None, Some("0000:09:00.0"), Code::XidCritical), &devs).is_none());
        assert!(published_as(&bad(None, None, Code::XidCritical), &devs).is_none());
        // As the hook reads a taint: another uuid at the same address is another GPU.
        let other = [dev("gpu-0", Some("GPU-other"), Some("0000:01:00.0"))];
        assert!(published_as(
            &bad(Some("GPU-a"), Some("0000:01:00.0"), Code::XidCritical),
            &other
        )
        .is_none());
    }

    /// Another slice of the GPU driver on the node (a hostile one) that names the same
    /// GPU first does not take the taint from the device its real driver publishes: every
    /// device that names the bad GPU is tainted. (Another driver's devices name no GPU:
    /// `dra::node_devices`.)
    #[test]
    fn every_device_naming_the_bad_gpu_is_tainted() {
        let mut decoy = dev("decoy", Some("GPU-2"), None);
        decoy.pool = "elsewhere".into();
        let devs = [decoy, dev("gpu-2", Some("GPU-2"), Some("0000:03:00.0"))];
        let want = desired(
            &[bad(Some("GPU-2"), None, Code::XidCritical)],
            &devs,
            "n1",
            "k",
            Effect::NoExecute,
        );
        let mut picked: Vec<_> = (want.iter())
            .filter_map(|r| r.spec.device_selector.as_ref()?.device.clone())
            .collect();
        picked.sort();
        assert_eq!(picked, ["decoy", "gpu-2"]);
    }

    #[test]
    fn one_rule_per_bad_device_selecting_exactly_it() {
        let devs = [dev("gpu-2", Some("GPU-2"), None)];
        let want = desired(
            &[bad(Some("GPU-2"), None, Code::XidCritical)],
            &devs,
            "n1",
            "devgate.io/unhealthy",
            Effect::NoExecute,
        );
        assert_eq!(want.len(), 1);
        let r = &want[0];
        assert_eq!(r.metadata.generate_name, "devgate-n1-gpu-2-");
        assert!(r.metadata.name.is_empty(), "the API server names it");
        assert!(is_ours(r, "n1") && !is_ours(r, "n2"));
        let sel = r.spec.device_selector.as_ref().unwrap();
        assert_eq!(
            (
                sel.driver.as_deref(),
                sel.pool.as_deref(),
                sel.device.as_deref()
            ),
            (Some("gpu.nvidia.com"), Some("n1"), Some("gpu-2"))
        );
        assert_eq!(
            taint_text(&r.spec.taint),
            "devgate.io/unhealthy=xid_critical:NoExecute"
        );
        assert_eq!(r.metadata.annotations["devgate.io/reason"], "xid: XID 79");
    }

    #[test]
    fn the_plan_creates_updates_and_deletes_only_what_differs() {
        let devs = [dev("gpu-2", Some("GPU-2"), None)];
        let want = desired(
            &[bad(Some("GPU-2"), None, Code::XidCritical)],
            &devs,
            "n1",
            "k",
            Effect::NoSchedule,
        );
        assert!(matches!(plan(&[], &want)[..], [Step::Create(_)]));
        let mut have = want.clone();
        have[0].metadata.uid = "u1".into();
        have[0].metadata.name = "devgate-n1-gpu-2-x7k2p".into();
        have[0].spec.taint.time_added = Some("2026-12-05T00:00:00Z".into());
        assert!(plan(&have, &want).is_empty());
        let changed = desired(
            &[bad(Some("GPU-2"), None, Code::Quarantined)],
            &devs,
            "n1",
            "k",
            Effect::NoSchedule,
        );
        have[0].metadata.resource_version = "41".into();
        assert!(matches!(
            plan(&have, &changed)[..],
            [Step::Update {
                resource_version: "41",
                ..
            }]
        ));
        assert_eq!(
            plan(&have, &[]),
            vec![Step::Delete {
                name: &have[0].metadata.name,
                uid: "u1"
            }]
        );
    }

    /// Someone created a rule of the name devgate used to give (issue #36): it is not
    /// this agent's, so the agent creates its own under a generated name; a rule of its
    /// own from before, of any name, is taken over; a second of its own is deleted.
    #[test]
    fn a_squatted_name_never_stops_the_agent_and_its_own_rules_are_found_by_device() {
        let devs = [dev("gpu-2", Some("GPU-2"), None)];
        let want = desired(
            &[bad(Some("GPU-2"), None, Code::XidCritical)],
            &devs,
            "n1",
            "k",
            Effect::NoSchedule,
        );
        let mut squat = want[0].clone();
        squat.metadata.name = "devgate-n1-gpu-2-0123abcd".into();
        squat.metadata.labels.clear();
        let all = [squat];
        let have: Vec<_> = all.iter().filter(|r| is_ours(r, "n1")).cloned().collect();
        assert!(
            matches!(plan(&have, &want)[..], [Step::Create(r)] if r.metadata.generate_name == "devgate-n1-gpu-2-")
        );
        let mut old = want[0].clone();
        old.metadata.name = "devgate-n1-gpu-2-0123abcd".into();
        let mut second = want[0].clone();
        second.metadata.name = "devgate-n1-gpu-2-zzzzz".into();
        second.metadata.uid = "u2".into();
        assert_eq!(
            plan(&[old, second], &want),
            vec![Step::Delete {
                name: "devgate-n1-gpu-2-zzzzz",
                uid: "u2"
            }]
        );
    }
}
