//! Inward: the cluster's taints on this node's devices (DeviceTaintRules other than the
//! agent's own, and the drivers' own ResourceSlice taints), each with the pods whose claims
//! tolerate it, for the hook's file. The hook never calls the API server; this is how it
//! hears of a taint.

use crate::dra::{is_ours, tolerating_pods, DeviceTaintRule, NodeDevice, ResourceClaim, Taint};
use crate::verdicts::NodeGpu;
use devgate::gpu::pci::GpuKey;
use devgate::store::cluster::{
    file_bytes, ClusterTaint, ClusterTaints, Effect, MAX_STRING_CHARS, MAX_TAINTS,
    MAX_TAINTS_BYTES, MAX_TOLERATED_BY,
};

/// The most taints the file carries from the devices' own ResourceSlice taints, and from
/// DeviceTaintRules: each source is bounded on its own, so one cannot crowd out the other.
pub const MAX_SLICE_TAINTS: usize = MAX_TAINTS / 2;
pub const MAX_RULE_TAINTS: usize = MAX_TAINTS / 2;

/// Where a taint came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Slice,
    Rule,
}

/// A taint on one of this node's GPUs, and where it came from.
pub struct Found<'a> {
    pub device: &'a NodeDevice,
    pub taint: &'a Taint,
    pub from: Source,
    pub source: String,
}

/// What the hook's file gets: the taints, or none and why (more than it holds).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Inward {
    pub taints: Vec<ClusterTaint>,
    pub overflow: Option<String>,
}

/// Whether `d` is one of this node's GPUs: it names a GPU (only the GPU driver's
/// devices do, `dra::node_devices`), and that GPU is one devgate lists; while devgate
/// has not answered yet (`gpus` None), any GPU it names.
pub fn is_relevant(d: &NodeDevice, gpus: Option<&[NodeGpu]>) -> bool {
    let key = GpuKey::of(d.uuid.as_deref(), d.pci_bus_id.as_deref());
    if d.uuid.is_none() && d.pci_bus_id.is_none() {
        return false;
    }
    gpus.is_none_or(|gpus| {
        gpus.iter()
            .any(|g| GpuKey::of(g.uuid.as_deref(), g.pci_bus_id.as_deref()).same_gpu(&key))
    })
}

/// Every taint the cluster puts on this node's GPUs among `devices`: the drivers' own,
/// then the rules'. A device that is no GPU of this node is left out: its taints never
/// reach the hook, so they cannot take the file's room.
pub fn taints_here<'a>(
    rules: &'a [DeviceTaintRule],
    devices: &'a [NodeDevice],
    node: &str,
    gpus: Option<&[NodeGpu]>,
) -> Vec<Found<'a>> {
    let mut out = Vec::new();
    for d in devices.iter().filter(|d| is_relevant(d, gpus)) {
        for t in &d.taints {
            out.push(Found {
                device: d,
                taint: t,
                from: Source::Slice,
                source: format!("ResourceSlice {}", d.slice),
            });
        }
        for r in rules.iter().filter(|r| !is_ours(r, node)) {
            if r.spec.selects(d) {
                out.push(Found {
                    device: d,
                    taint: &r.spec.taint,
                    from: Source::Rule,
                    source: format!("DeviceTaintRule {}", r.metadata.name),
                });
            }
        }
    }
    out
}

/// The file's entries for `found`; a taint of an effect the hook does not know is left out
/// (and said), so a newer cluster's effect never turns into a reject by accident. More
/// than a source's bound, or more than the file's bytes: no entry, and the overflow said,
/// which the hook reads as unknown for every GPU. Never some taints kept by position.
pub fn file_taints(found: &[Found], claims: &[ResourceClaim]) -> Inward {
    let known: Vec<(&Found, Effect)> = found
        .iter()
        .filter_map(|f| match effect(&f.taint.effect) {
            Some(e) => Some((f, e)),
            None => {
                log::warn!(
                    "{}: taint effect {:?} unknown to devgate; not passed to the gate",
                    f.source,
                    devgate::model::text::one_line(&f.taint.effect)
                );
                None
            }
        })
        .collect();
    for (from, max, what) in [
        (Source::Slice, MAX_SLICE_TAINTS, "ResourceSlice"),
        (Source::Rule, MAX_RULE_TAINTS, "DeviceTaintRule"),
    ] {
        let n = known.iter().filter(|(f, _)| f.from == from).count();
        if n > max {
            return overflow(format!(
                "{n} {what} taints on this node's GPUs, more than {max}"
            ));
        }
    }
    let taints = known
        .iter()
        .map(|(f, effect)| {
            let (mut tolerated_by, mut tolerated_until) =
                tolerating_pods(claims, f.device, f.taint);
            // Fewer tolerating pods is stricter: a pod left out is refused, never let in.
            tolerated_by.truncate(MAX_TOLERATED_BY);
            tolerated_until.truncate(MAX_TOLERATED_BY);
            ClusterTaint {
                uuid: f.device.uuid.as_deref().map(bounded),
                pci_bus_id: f.device.pci_bus_id.as_deref().map(bounded),
                device: bounded(&f.device.device),
                driver: bounded(&f.device.driver),
                pool: bounded(&f.device.pool),
                key: bounded(&f.taint.key),
                value: bounded(&f.taint.value),
                effect: *effect,
                source: bounded(&f.source),
                tolerated_by,
                tolerated_until,
            }
        })
        .collect();
    Inward {
        taints,
        overflow: None,
    }
}

fn overflow(why: String) -> Inward {
    log::warn!("cluster taints: {why}; the gate reads every GPU's taints as unknown");
    Inward {
        taints: Vec::new(),
        overflow: Some(why),
    }
}

/// The whole file for `node`: over the bytes the hook reads, it holds no taint and says
/// so, as an overflow does.
pub fn file(node: &str, written_unix: u64, inward: Inward) -> ClusterTaints {
    let mut f = ClusterTaints {
        node: node.to_string(),
        written_unix,
        taints: inward.taints,
        overflow: inward.overflow,
    };
    let bytes = file_bytes(&f);
    if bytes as u64 > MAX_TAINTS_BYTES {
        let o = overflow(format!(
            "{} taints take {bytes} bytes, more than {MAX_TAINTS_BYTES}",
            f.taints.len()
        ));
        f.taints = o.taints;
        f.overflow = o.overflow;
    }
    f
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
    use crate::dra::{MANAGED_BY, NODE_ANNOTATION};
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
                    time_added: None,
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
            time_added: None,
        };
        let odd = Taint {
            key: "k".into(),
            value: "".into(),
            effect: "Drain".into(),
            time_added: None,
        };
        let devices = [
            dev("gpu-0", vec![lost, odd]),
            dev("gpu-1", vec![]),
            dev("gpu-2", vec![]),
        ];
        let found = taints_here(&rules, &devices, "n1", None);
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
        let file = file_taints(&found, &[]).taints;
        assert_eq!(file.len(), 2, "the unknown effect is left out");
        assert_eq!(file[1].uuid.as_deref(), Some("GPU-gpu-1"));
        assert_eq!(file[1].effect, Effect::NoSchedule);
        // The same rule read as another node's agent's is someone else's: it counts.
        assert_eq!(taints_here(&rules, &devices, "n2", None).len(), 4);
    }

    fn gpus(n: usize) -> Vec<NodeGpu> {
        (0..n)
            .map(|i| NodeGpu {
                uuid: Some(format!("GPU-gpu-{i}")),
                pci_bus_id: None,
            })
            .collect()
    }

    fn filler(n: usize) -> Vec<Taint> {
        (0..n)
            .map(|i| Taint {
                key: format!("a.example.com/f{i:02}"),
                value: String::new(),
                effect: "NoSchedule".into(),
                time_added: None,
            })
            .collect()
    }

    /// A publisher's 64 devices of 16 taints each, named to sort first, on no GPU of
    /// this node: left out, and the real GPU's taint is in the file.
    #[test]
    fn filler_on_devices_that_are_no_gpu_here_never_pushes_the_real_taint_out() {
        let mut devices: Vec<NodeDevice> = (0..64)
            .map(|i| {
                let mut d = dev(&format!("aaa-{i}"), filler(16));
                d.uuid = Some(format!("GPU-not-here-{i}"));
                d
            })
            .collect();
        let mut nameless = dev("aaa-nameless", filler(16));
        nameless.uuid = None;
        devices.push(nameless);
        let real = Taint {
            key: "gpu.nvidia.com/xid".into(),
            value: "79".into(),
            effect: "NoExecute".into(),
            time_added: None,
        };
        devices.push(dev("gpu-3", vec![real]));
        let g = gpus(8);
        let found = taints_here(&[], &devices, "n1", Some(&g));
        let inward = file_taints(&found, &[]);
        assert_eq!(inward.overflow, None);
        assert_eq!(inward.taints.len(), 1, "{:?}", inward.taints);
        assert_eq!(inward.taints[0].device, "gpu-3");
    }

    /// More than a source's bound on this node's own GPUs: no taint at all, and why; the
    /// other source's bound is its own.
    #[test]
    fn over_a_sources_bound_fails_closed_and_says_so() {
        let devices: Vec<NodeDevice> = (0..8)
            .map(|i| dev(&format!("gpu-{i}"), filler(64)))
            .collect();
        let g = gpus(8);
        let found = taints_here(&[], &devices, "n1", Some(&g));
        assert_eq!(found.len(), MAX_SLICE_TAINTS);
        assert!(file_taints(&found, &[]).overflow.is_none());
        let mut more = devices.clone();
        more[0].taints.push(filler(65).pop().unwrap());
        let found = taints_here(&[], &more, "n1", Some(&g));
        let inward = file_taints(&found, &[]);
        assert!(inward.taints.is_empty());
        assert_eq!(
            inward.overflow.as_deref(),
            Some("513 ResourceSlice taints on this node's GPUs, more than 512")
        );
        // 512 slice taints and a rule on every GPU: each source within its bound.
        let mut all = [rule("op", "gpu-1", false)];
        all[0].spec.device_selector = Some(Selector::default());
        let found = taints_here(&all, &devices, "n1", Some(&g));
        let inward = file_taints(&found, &[]);
        assert_eq!((inward.taints.len(), inward.overflow), (520, None));
    }

    #[test]
    fn a_file_over_its_bytes_says_it_overflowed() {
        let mut t = dev("gpu-0", filler(1));
        t.device = "d".repeat(1000);
        let devices: Vec<NodeDevice> = (0..8)
            .map(|i| {
                let mut d = t.clone();
                d.uuid = Some(format!("GPU-gpu-{i}"));
                d.taints = filler(64);
                d
            })
            .collect();
        let found = taints_here(&[], &devices, "n1", None);
        let mut inward = file_taints(&found, &[]);
        for t in &mut inward.taints {
            t.tolerated_by = vec!["u".repeat(100); 10];
        }
        let f = file("n1", 1, inward);
        assert!(f.taints.is_empty());
        assert!(f.overflow.unwrap().contains("bytes, more than 1048576"));
        assert!(file_bytes(&file("n1", 1, Inward::default())) < 100);
    }
}
