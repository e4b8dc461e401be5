//! The NVIDIA driver's own advice for a GPU: its "GPU recovery action". The driver states it
//! in two places, and both mean the same numbers: XID 154 in the kernel log
//! (`GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)`) and NVML's
//! `nvmlGpuRecoveryAction_t` (`NVML_GPU_RECOVERY_ACTION_*`). The text in parentheses varies
//! between driver branches (`0x2 (Node Reboot Required)`, `0x2 (OS Reboot)`,
//! `0x1 (PF FLR)`), so the number is what is read.

use super::reason::Code;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryAction {
    /// 0: nothing to do; the GPU is usable.
    None,
    /// 1: the GPU needs a reset (`nvidia-smi -r`) before it is usable again.
    GpuReset,
    /// 2: the node needs a reboot.
    NodeReboot,
    /// 3: peer-to-peer traffic must be drained; the GPU itself still works.
    DrainP2p,
    /// 4: drain, then reset the GPU.
    DrainAndReset,
    /// A number this devgate does not know (a newer driver).
    Other(u32),
}

/// What a recovery action means for a container about to start on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryEffect {
    /// Earlier reports for the GPU no longer block: the driver says it is usable.
    Clears,
    /// The GPU cannot take new work until the action is done.
    Blocks,
    /// Worth an operator's look, never a reason to refuse every container.
    Warns,
}

impl RecoveryAction {
    pub fn from_code(code: u32) -> RecoveryAction {
        match code {
            0 => RecoveryAction::None,
            1 => RecoveryAction::GpuReset,
            2 => RecoveryAction::NodeReboot,
            3 => RecoveryAction::DrainP2p,
            4 => RecoveryAction::DrainAndReset,
            n => RecoveryAction::Other(n),
        }
    }

    pub fn code(self) -> u32 {
        match self {
            RecoveryAction::None => 0,
            RecoveryAction::GpuReset => 1,
            RecoveryAction::NodeReboot => 2,
            RecoveryAction::DrainP2p => 3,
            RecoveryAction::DrainAndReset => 4,
            RecoveryAction::Other(n) => n,
        }
    }

    /// DRAIN_P2P asks to stop peer-to-peer traffic, not to stop using the GPU: it warns.
    /// An action devgate does not know blocks, as NVML's does (`gpu::recovery`):
    /// the actions newer drivers add (IMEX domain recovery, bus reset, system reboot) each
    /// ask for work before the GPU takes new work.
    pub fn effect(self) -> RecoveryEffect {
        match self {
            RecoveryAction::None => RecoveryEffect::Clears,
            RecoveryAction::GpuReset
            | RecoveryAction::NodeReboot
            | RecoveryAction::DrainAndReset
            | RecoveryAction::Other(_) => RecoveryEffect::Blocks,
            RecoveryAction::DrainP2p => RecoveryEffect::Warns,
        }
    }

    pub fn describe(self) -> String {
        match self {
            RecoveryAction::None => "none".into(),
            RecoveryAction::GpuReset => "GPU reset required".into(),
            RecoveryAction::NodeReboot => "node reboot required".into(),
            RecoveryAction::DrainP2p => "drain peer-to-peer traffic".into(),
            RecoveryAction::DrainAndReset => "drain, then GPU reset required".into(),
            RecoveryAction::Other(n) => format!("recovery action {n:#x} (unknown to devgate)"),
        }
    }

    /// The reason code of a finding that names this action, from NVML or XID 154 alike.
    /// NONE is no finding: unspecified.
    pub fn reason_code(self) -> Code {
        match self {
            RecoveryAction::None => Code::Unspecified,
            RecoveryAction::GpuReset => Code::RecoveryGpuReset,
            RecoveryAction::NodeReboot => Code::RecoveryNodeReboot,
            RecoveryAction::DrainP2p => Code::RecoveryDrainP2p,
            RecoveryAction::DrainAndReset => Code::RecoveryDrainAndReset,
            RecoveryAction::Other(_) => Code::RecoveryOther,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_effects_follow_the_driver() {
        for n in 0..8 {
            assert_eq!(RecoveryAction::from_code(n).code(), n);
        }
        assert_eq!(
            RecoveryAction::from_code(0).effect(),
            RecoveryEffect::Clears
        );
        assert_eq!(
            RecoveryAction::from_code(1).effect(),
            RecoveryEffect::Blocks
        );
        assert_eq!(
            RecoveryAction::from_code(2).effect(),
            RecoveryEffect::Blocks
        );
        assert_eq!(RecoveryAction::from_code(3).effect(), RecoveryEffect::Warns);
        assert_eq!(
            RecoveryAction::from_code(4).effect(),
            RecoveryEffect::Blocks
        );
        assert_eq!(
            RecoveryAction::from_code(9).effect(),
            RecoveryEffect::Blocks
        );
    }
}
