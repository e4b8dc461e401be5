//! What NVML's GPU recovery action and drain state mean for a new container. Pure.
//!
//! NVIDIA's reading (docs.nvidia.com, "Error Recovery and Response Flags"): the recovery
//! action (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) is set on uncorrectable errors and
//! says what must happen before the GPU takes new work:
//! - NONE: nothing; "the GPU can be immediately used again by starting a new GPU process";
//! - GPU_RESET: terminate the GPU's processes and reset it (`nvidia-smi -r`);
//! - NODE_REBOOT: the fault may have left the OS inconsistent; reboot;
//! - DRAIN_P2P: peer-to-peer traffic must be quiesced (end the processes that do P2P);
//!   the field then changes to one of the other actions;
//! - DRAIN_AND_RESET: drain P2P, then reset the GPU.
//!
//! So DRAIN_P2P does not bar a container that cannot do peer-to-peer: one with a single
//! GPU. A container given several GPUs could add P2P traffic to what must drain, and is
//! refused. Newer drivers add actions (IMEX domain recovery, bus reset, system reboot);
//! each asks for work before the GPU is used, so an action devgate does not know refuses.
//!
//! The drain state (nvmlDeviceQueryDrainState) is set by an administrator with
//! nvmlDeviceModifyDrainState: the GPU "no longer accepts new incoming requests", so a new
//! container on it is refused.
//!
//! Where the driver gives the recovery action, it also says when an XID report stops
//! counting: after `nvidia-smi -r` the driver is not reloaded, so the kernel log alone
//! would hold the report against the GPU until the next driver load. A GPU that answers
//! NVML, reports recovery action NONE, no pending or failed row remapping and no drain, has
//! recovered by NVIDIA's own definition; its older XID reports then warn instead of block.

use super::nvml::{GpuFacts, Reading};
use crate::model::recovery::RecoveryAction;
use crate::model::verdict::{Code, Verdict};

pub const NONE: u32 = 0;
pub const GPU_RESET: u32 = 1;
pub const NODE_REBOOT: u32 = 2;
pub const DRAIN_P2P: u32 = 3;
pub const DRAIN_AND_RESET: u32 = 4;

/// The recovery action's verdict for a container with `gpus` NVIDIA GPUs.
pub fn action_verdict(action: u32, gpus: usize) -> Verdict {
    let what = |name: &str, need: &str| format!("NVML recovery action {name}: {need}");
    let bad = |detail: String| {
        Verdict::unhealthy(RecoveryAction::from_code(action).reason_code(), detail)
    };
    match action {
        NONE => Verdict::Healthy,
        GPU_RESET => bad(what(
            "GPU_RESET",
            "the GPU needs a reset (nvidia-smi -r) before new work",
        )),
        NODE_REBOOT => bad(what("NODE_REBOOT", "the node needs a reboot")),
        DRAIN_P2P if gpus > 1 => bad(what(
            "DRAIN_P2P",
            &format!("peer-to-peer traffic must drain, and this container's {gpus} GPUs could add to it"),
        )),
        DRAIN_P2P => Verdict::warn(
            Code::RecoveryDrainP2p,
            what(
                "DRAIN_P2P",
                "peer-to-peer traffic must drain; a container with one GPU does none",
            ),
        ),
        DRAIN_AND_RESET => bad(what(
            "DRAIN_AND_RESET",
            "peer-to-peer traffic must drain, then the GPU needs a reset",
        )),
        other => bad(format!(
            "NVML recovery action {other} (newer than devgate knows): the GPU needs work before new use"
        )),
    }
}

/// The drain state's verdict.
pub fn drain_verdict(draining: bool) -> Verdict {
    if draining {
        Verdict::unhealthy(
            Code::GpuDraining,
            "NVML drain state is on: the GPU is being drained and takes no new work",
        )
    } else {
        Verdict::Healthy
    }
}

/// Whether NVML says this GPU has recovered: it answers, its recovery action is NONE, and
/// no row remapping waits for a reset or failed, and it is not being drained. False
/// whenever any of those is not known.
pub fn recovered(g: &GpuFacts) -> bool {
    g.unreachable.is_none()
        && !g.is_lost()
        && g.recovery_action == Reading::Value(NONE)
        && !matches!(g.drain, Reading::Value(true))
        && !matches!(&g.remapped_rows, Reading::Value(r) if r.pending || r.failure)
}

/// The XID probe's verdict once NVML has had its say: a blocking report on a GPU NVML says
/// has recovered no longer blocks.
pub fn after_recovery(xid: Verdict, g: Option<&GpuFacts>) -> Verdict {
    match xid {
        Verdict::Unhealthy(r) if g.is_some_and(recovered) => {
            let r = r
                .detail
                .strip_suffix("; GPU reset or reboot required")
                .unwrap_or(&r.detail);
            Verdict::warn(
                Code::XidRecovered,
                format!(
                    "{r}; no longer blocking: NVML reports recovery action NONE and the GPU answers"
                ),
            )
        }
        v => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::nvml::facts::RemappedRows;
    use crate::gpu::nvml::tests::healthy;

    #[test]
    fn each_action_as_nvidia_defines_it() {
        assert_eq!(action_verdict(NONE, 8), Verdict::Healthy);
        for (a, code) in [
            (GPU_RESET, Code::RecoveryGpuReset),
            (NODE_REBOOT, Code::RecoveryNodeReboot),
            (DRAIN_AND_RESET, Code::RecoveryDrainAndReset),
            (5, Code::RecoveryOther),
            (7, Code::RecoveryOther),
            (99, Code::RecoveryOther),
        ] {
            let v = action_verdict(a, 1);
            assert_eq!(
                (v.status(), v.code()),
                ("unhealthy", Some(code)),
                "action {a}"
            );
        }
        assert!(action_verdict(GPU_RESET, 1)
            .detail()
            .unwrap()
            .contains("nvidia-smi -r"));
        // DRAIN_P2P refuses only a container that could do peer-to-peer
        let v = action_verdict(DRAIN_P2P, 1);
        assert_eq!(
            (v.status(), v.code()),
            ("warn", Some(Code::RecoveryDrainP2p))
        );
        let v = action_verdict(DRAIN_P2P, 2);
        assert_eq!(
            (v.status(), v.code()),
            ("unhealthy", Some(Code::RecoveryDrainP2p))
        );
        assert!(
            v.detail().unwrap().contains("this container's 2 GPUs"),
            "{v:?}"
        );
        let v = drain_verdict(true);
        assert_eq!(
            (v.status(), v.code()),
            ("unhealthy", Some(Code::GpuDraining))
        );
        assert_eq!(drain_verdict(false), Verdict::Healthy);
    }

    #[test]
    fn an_xid_stops_blocking_only_when_nvml_says_the_gpu_recovered() {
        let xid = Verdict::unhealthy(
            Code::XidCritical,
            "xid: xid 79 (GPU has fallen off the bus) on 0000:3b:00 reported 1 time; GPU reset or reboot required"
        );
        let g = healthy(1);
        assert_eq!(
            after_recovery(xid.clone(), Some(&g)),
            Verdict::warn(
                Code::XidRecovered,
                "xid: xid 79 (GPU has fallen off the bus) on 0000:3b:00 reported 1 time; no longer blocking: NVML reports recovery action NONE and the GPU answers"
            )
        );
        // no NVML facts, or facts that do not say "recovered": the report still blocks
        assert_eq!(after_recovery(xid.clone(), None), xid);
        let mut cases = Vec::new();
        let mut c = healthy(1);
        c.recovery_action = Reading::Value(GPU_RESET);
        cases.push(c);
        let mut c = healthy(1);
        c.recovery_action = Reading::NotSupported("not supported".into());
        cases.push(c);
        let mut c = healthy(1);
        c.drain = Reading::Value(true);
        cases.push(c);
        let mut c = healthy(1);
        c.remapped_rows = Reading::Value(RemappedRows {
            correctable: 0,
            uncorrectable: 1,
            pending: true,
            failure: false,
        });
        cases.push(c);
        let mut c = healthy(1);
        c.throttle_reasons = Reading::Lost;
        cases.push(c);
        cases.push(GpuFacts::unreachable(
            1,
            "NVML did not answer".into(),
            false,
        ));
        for c in &cases {
            assert_eq!(after_recovery(xid.clone(), Some(c)), xid, "{c:?}");
        }
        // a warning stays a warning
        let warn = Verdict::warn(Code::RecoveryDrainP2p, "xid: xid 154");
        assert_eq!(after_recovery(warn.clone(), Some(&g)), warn);
    }
}
