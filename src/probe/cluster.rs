//! The cluster probe: a GPU that the cluster has tainted (a DRA DeviceTaintRule, or a
//! taint in a DRA driver's ResourceSlice, NoSchedule or NoExecute) is unhealthy, unless
//! the container's pod tolerates the taint. The taints come from the node agent's file
//! (`store::cluster`), read once per call through the `GpuContext`; the GPU is found in it
//! by its UUID, else by its PCI address, both as NVML or the driver's /proc list told
//! them.

use super::findings::{Findings, Probe};
use crate::gpu::pci::GpuKey as GpuId;
#[cfg(test)]
use crate::gpu::pci::PciAddr;
use crate::gpu::GpuContext;
use crate::model::class::Class;
use crate::model::device::Device;
use crate::model::text::one_line;
use crate::model::verdict::{Code, Verdict};
use crate::store::cluster::ClusterTaint;

/// The most characters of one outside string in the reject line; longer ones are cut.
/// Kubernetes' own longest names (a qualified key, 316) fit.
const MAX_SHOWN_CHARS: usize = 320;

pub struct ClusterTaintProbe<'a> {
    pub gpu: &'a GpuContext,
    /// The container's pod uid from the CRI annotations; None outside a pod, where the
    /// two runtimes' annotations disagree, and for `status` and spares.
    pub pod_uid: Option<&'a str>,
    /// `cluster_taints_max_age_s`, and now (unix seconds): an older file is stale.
    pub max_age_s: u64,
    pub now: u64,
}

impl Probe for ClusterTaintProbe<'_> {
    fn name(&self) -> &'static str {
        "cluster"
    }

    fn check(&self, device: &Device, _: &mut Findings) -> Verdict {
        if device.class != Class::NvidiaGpu {
            return Verdict::not_applicable(Code::NotNvidiaGpu, "not an NVIDIA GPU");
        }
        let taints = match self.gpu.cluster_taints.get() {
            Ok(None) => return Verdict::Healthy,
            Ok(Some(t)) => match (t.stale_age(self.now, self.max_age_s), &t.overflow) {
                // The taints may have changed since, either way: a taint cleared in the
                // cluster must not refuse pods forever, nor a new one go unseen silently.
                (Some(age), _) => {
                    return Verdict::unknown(Code::ClusterTaintsStale, stale(age, self.max_age_s))
                }
                (None, Some(why)) => return overflowed(why),
                (None, None) => t,
            },
            Err(e) => {
                return Verdict::unknown(
                    Code::ClusterTaintsUnreadable,
                    format!("cluster taints unreadable: {e}"),
                )
            }
        };
        let minor = device.num.minor;
        let id = GpuId {
            uuid: self.gpu.uuid_of_minor(minor),
            pci: self.gpu.pci_of_minor(minor),
        };
        match blocking_taint(&taints.taints, id, self.pod_uid, self.now) {
            Some(t) => Verdict::unhealthy(Code::ClusterTaint, detail(t)),
            None => Verdict::Healthy,
        }
    }
}

/// Why a stale file is not read: its age and the bound.
pub fn stale(age: u64, max_age_s: u64) -> String {
    format!(
        "cluster taints stale: written {age} s ago, more than cluster_taints_max_age_s \
         {max_age_s} (devgate-agent stopped, or cannot reach the API server)"
    )
}

/// The first taint on the GPU that keeps the pod off it at `now` (unix seconds):
/// NoSchedule or NoExecute, and not tolerated by `pod_uid` (for good, or until a time
/// not yet past).
pub fn blocking_taint<'t>(
    taints: &'t [ClusterTaint],
    gpu: GpuId,
    pod_uid: Option<&str>,
    now: u64,
) -> Option<&'t ClusterTaint> {
    taints
        .iter()
        .filter(|t| t.effect.blocks() && is_on(t, gpu))
        .find(|t| !tolerated(t, pod_uid, now))
}

/// The agent found more taints on this node's GPUs than its file holds: no GPU's
/// taints are known.
fn overflowed(why: &str) -> Verdict {
    Verdict::unknown(
        Code::ClusterTaintsUnreadable,
        format!("cluster taints overflowed: {}", shown(why)),
    )
}

/// Whether the taint is on this GPU ([`GpuId::same_gpu`]).
pub fn is_on(taint: &ClusterTaint, gpu: GpuId) -> bool {
    GpuId::of(taint.uuid.as_deref(), taint.pci_bus_id.as_deref()).same_gpu(&gpu)
}

/// Whether the pod whose uid is `pod_uid` tolerates the taint at `now`: for good, or for a
/// time not yet run out. No uid tolerates nothing.
fn tolerated(taint: &ClusterTaint, pod_uid: Option<&str>, now: u64) -> bool {
    pod_uid.filter(|u| !u.is_empty()).is_some_and(|u| {
        taint.tolerated_by.iter().any(|p| p == u)
            || (taint.tolerated_until.iter()).any(|p| p.pod == u && now < p.until_unix)
    })
}

/// `tainted in the cluster: KEY=VALUE:EFFECT (SOURCE on DRIVER/POOL/DEVICE)`, each
/// outside string escaped and cut to [`MAX_SHOWN_CHARS`]; an empty value is left out
/// (`KEY:EFFECT`), as kubectl prints a taint.
pub fn detail(t: &ClusterTaint) -> String {
    let value = if t.value.is_empty() {
        String::new()
    } else {
        format!("={}", shown(&t.value))
    };
    format!(
        "tainted in the cluster: {}{value}:{} ({} on {}/{}/{})",
        shown(&t.key),
        t.effect.as_str(),
        shown(&t.source),
        shown(&t.driver),
        shown(&t.pool),
        shown(&t.device)
    )
}

/// An outside string as the reject line shows it: escaped, then at most
/// [`MAX_SHOWN_CHARS`] characters of that, `…` where cut.
fn shown(s: &str) -> String {
    let mut e = one_line(s);
    if let Some((cut, _)) = e.char_indices().nth(MAX_SHOWN_CHARS) {
        e.truncate(cut);
        e.push('…');
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::cluster::Effect;

    fn taint(uuid: Option<&str>, pci: Option<&str>, effect: Effect) -> ClusterTaint {
        ClusterTaint {
            uuid: uuid.map(String::from),
            pci_bus_id: pci.map(String::from),
            device: "gpu-2".into(),
            driver: "gpu.nvidia.com".into(),
            pool: "node-1".into(),
            key: "example.com/maintenance".into(),
            value: "swap".into(),
            effect,
            source: "DeviceTaintRule example-rule".into(),
            tolerated_by: vec!["pod-a".into()],
            tolerated_until: vec![],
        }
    }

    const UUID: &str = "GPU-0f8e1c2d-1111-2222-3333-444444444444";
    const NOW: u64 = 1_800_000_000;

    fn gpu() -> GpuId<'static> {
        GpuId {
            uuid: Some(UUID),
            pci: PciAddr::parse("00000000:3B:00.0"),
        }
    }

    #[test]
    fn the_contracts_detail_line() {
        let t = taint(Some(UUID), None, Effect::NoSchedule);
        assert_eq!(
            detail(&t),
            "tainted in the cluster: example.com/maintenance=swap:NoSchedule \
             (DeviceTaintRule example-rule on gpu.nvidia.com/node-1/gpu-2)"
        );
        let t = ClusterTaint {
            value: String::new(),
            effect: Effect::NoExecute,
            ..t
        };
        assert!(detail(&t).contains(" example.com/maintenance:NoExecute ("));
    }

    #[test]
    fn matched_by_uuid_in_any_case_else_by_pci_address() {
        let lower = UUID.to_ascii_lowercase();
        assert!(is_on(&taint(Some(&lower), None, Effect::NoSchedule), gpu()));
        // another GPU's uuid, even at this GPU's address: not this GPU
        let other = taint(
            Some("GPU-ffffffff-1111-2222-3333-444444444444"),
            Some("0000:3b:00.0"),
            Effect::NoSchedule,
        );
        assert!(!is_on(&other, gpu()));
        // no uuid in the taint: by address, in any of the spellings devgate reads
        for pci in ["0000:3b:00.0", "00000000:3B:00.0", "3b:00.0", "0000:3b:00"] {
            assert!(
                is_on(&taint(None, Some(pci), Effect::NoSchedule), gpu()),
                "{pci}"
            );
        }
        for pci in ["0000:3b:00.1", "0000:5e:00.0", "not an address", ""] {
            assert!(
                !is_on(&taint(None, Some(pci), Effect::NoSchedule), gpu()),
                "{pci}"
            );
        }
        // the GPU's uuid unknown (NVML lost it, no /proc list): by address
        let no_uuid = GpuId {
            uuid: None,
            ..gpu()
        };
        assert!(is_on(&other, no_uuid));
        assert!(!is_on(&taint(None, None, Effect::NoSchedule), gpu()));
        assert!(!is_on(
            &taint(None, Some("0000:3b:00.0"), Effect::NoSchedule),
            GpuId::default()
        ));
    }

    #[test]
    fn a_tolerating_pod_and_effect_none_pass_everyone_else_is_kept_off() {
        let t = [taint(Some(UUID), None, Effect::NoSchedule)];
        assert!(blocking_taint(&t, gpu(), None, NOW).is_some());
        assert!(blocking_taint(&t, gpu(), Some("pod-b"), NOW).is_some());
        assert!(blocking_taint(&t, gpu(), Some("pod-a"), NOW).is_none());
        // an empty uid tolerates nothing, even against an empty entry
        let mut empty = t.clone();
        empty[0].tolerated_by = vec![String::new()];
        assert!(blocking_taint(&empty, gpu(), Some(""), NOW).is_some());
        let none = [taint(Some(UUID), None, Effect::None)];
        assert!(blocking_taint(&none, gpu(), None, NOW).is_none());
        // the first taint the pod does not tolerate is the one named
        let mut two = vec![t[0].clone(), taint(Some(UUID), None, Effect::NoExecute)];
        two[1].tolerated_by.clear();
        let b = blocking_taint(&two, gpu(), Some("pod-a"), NOW).unwrap();
        assert_eq!(b.effect, Effect::NoExecute);
    }

    /// Strings from API objects others write: escaped, and bounded however long.
    #[test]
    fn hostile_strings_are_escaped_and_bounded() {
        let mut t = taint(Some(UUID), None, Effect::NoSchedule);
        t.key = "k\n devgate: allowed\u{202e}".into();
        t.value = "\x1b[31mred".into();
        t.source = "x".repeat(1024);
        t.device = "é".repeat(1024);
        let d = detail(&t);
        assert!(
            !d.contains('\n') && !d.contains('\x1b') && !d.contains('\u{202e}'),
            "{d}"
        );
        assert!(
            d.contains("k\\x0a devgate: allowed\\u{202e}=\\x1b[31mred:NoSchedule"),
            "{d}"
        );
        assert!(
            d.contains(&format!("({}… on", "x".repeat(MAX_SHOWN_CHARS))),
            "{d}"
        );
        t.key = "\u{2028}".repeat(1024);
        let d = detail(&t);
        assert!(
            d.chars().count() < 6 * (MAX_SHOWN_CHARS + 1) + 100,
            "{}",
            d.len()
        );
    }

    /// A pod tolerated until a time (a NoExecute toleration's seconds) is let through
    /// before it, refused from it on; another pod never.
    #[test]
    fn a_pod_tolerated_for_a_time_is_refused_after_it() {
        use crate::store::cluster::TimedToleration;
        let mut t = [taint(Some(UUID), None, Effect::NoExecute)];
        t[0].tolerated_by.clear();
        t[0].tolerated_until = vec![TimedToleration {
            pod: "pod-a".into(),
            until_unix: NOW + 60,
        }];
        assert!(blocking_taint(&t, gpu(), Some("pod-a"), NOW).is_none());
        assert!(blocking_taint(&t, gpu(), Some("pod-a"), NOW + 59).is_none());
        assert!(blocking_taint(&t, gpu(), Some("pod-a"), NOW + 60).is_some());
        assert!(blocking_taint(&t, gpu(), Some("pod-b"), NOW).is_some());
        assert!(blocking_taint(&t, gpu(), Some(""), NOW).is_some());
    }

    #[test]
    fn an_overflowed_file_is_unknown() {
        let v = overflowed("1100 taints\n");
        assert!(
            matches!(&v, Verdict::Unknown(w) if w.code == Code::ClusterTaintsUnreadable),
            "{v:?}"
        );
    }
}
