//! What NVML answers about one GPU, as plain data: each reading, or why there is none
//! ([`Reading`]), and the GPU's facts ([`GpuFacts`]). The query children fill them
//! (`super::query`); the hook only reads them.

use crate::gpu::pci::PciAddr;
use crate::model::reason::Code;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};

/// What every lost GPU's reason says, whichever way NVML showed it.
/// More GPUs than any node has; a library reporting more is broken or hostile.
pub(crate) const MAX_GPUS: u32 = 256;

pub const LOST: &str = "GPU is lost (fallen off the bus)";

/// A value read from NVML, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "value", rename_all = "snake_case")]
pub enum Reading<T> {
    Value(T),
    /// The GPU or driver does not support it, or the library lacks the function.
    NotSupported(String),
    /// NVML_ERROR_GPU_IS_LOST.
    Lost,
    Failed(String),
}

impl<T> Reading<T> {
    pub(crate) fn from_result(r: Result<T, NvmlError>) -> Reading<T> {
        match r {
            Ok(v) => Reading::Value(v),
            Err(e) => Reading::from_error(e),
        }
    }

    pub(crate) fn from_error(e: NvmlError) -> Reading<T> {
        match e {
            NvmlError::GpuLost => Reading::Lost,
            NvmlError::NotSupported => Reading::NotSupported("not supported".into()),
            NvmlError::FunctionNotFound => {
                Reading::NotSupported("function not found in the driver".into())
            }
            NvmlError::FailedToLoadSymbol(s) => {
                Reading::NotSupported(format!("symbol missing from the NVML library ({s})"))
            }
            other => Reading::Failed(other.to_string()),
        }
    }

    pub fn value(&self) -> Option<&T> {
        match self {
            Reading::Value(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        matches!(self, Reading::Lost)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub current: u32,
    pub max: u32,
}

/// Everything devgate reads about one GPU, as NVML answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFacts {
    pub index: u32,
    /// Why no handle could be had for this index (the GPU is lost or NVML refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<String>,
    /// The reason code of `unreachable`, where the hook itself knows more than the words (a
    /// deadline missed, a query still stuck); never on the wire from a query child.
    #[serde(skip)]
    pub unreachable_code: Option<Code>,
    pub minor: Reading<u32>,
    pub uuid: Reading<String>,
    /// As NVML writes it: `00000000:3B:00.0`.
    pub pci_bus_id: Reading<String>,
    pub remapped_rows: Reading<RemappedRows>,
    pub retired_pages_pending: Reading<bool>,
    pub volatile_uncorrectable_ecc: Reading<u64>,
    pub throttle_reasons: Reading<u64>,
    pub pcie_gen: Reading<Link>,
    pub pcie_width: Reading<Link>,
    /// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: an nvmlDeviceGpuRecoveryAction_t.
    pub recovery_action: Reading<u32>,
    /// nvmlDeviceQueryDrainState: the GPU is being drained.
    pub drain: Reading<bool>,
    /// nvmlDeviceGetPcieReplayCounter: link-level retransmissions, counted since the driver
    /// loaded; judged by its rise since a stored baseline (`probe::pcie`).
    #[serde(default = "not_in_answer")]
    pub pcie_replay: Reading<u32>,
}

/// A reading an answer does not carry (one written before devgate asked for it).
fn not_in_answer<T>() -> Reading<T> {
    Reading::NotSupported("not in the answer".into())
}

impl GpuFacts {
    /// The code a verdict on an unreachable GPU that is not lost carries.
    pub fn unreachable_code(&self) -> Code {
        self.unreachable_code.unwrap_or(Code::NvmlUnanswered)
    }

    pub(crate) fn unreachable(index: u32, why: String, lost: bool) -> GpuFacts {
        fn r<T>(lost: bool) -> Reading<T> {
            if lost {
                Reading::Lost
            } else {
                Reading::Failed("no handle".into())
            }
        }
        GpuFacts {
            index,
            unreachable: Some(why),
            unreachable_code: None,
            minor: r(lost),
            uuid: r(lost),
            pci_bus_id: r(lost),
            remapped_rows: r(lost),
            retired_pages_pending: r(lost),
            volatile_uncorrectable_ecc: r(lost),
            throttle_reasons: r(lost),
            pcie_gen: r(lost),
            pcie_width: r(lost),
            recovery_action: r(lost),
            drain: r(lost),
            pcie_replay: r(lost),
        }
    }

    /// `GPU-1234… (0000:3b:00.0)`, with what is known.
    pub fn label(&self) -> String {
        let id = match self.uuid.value() {
            Some(u) => u.clone(),
            None => format!("index {}", self.index),
        };
        match self.pci_bus_id.value() {
            Some(p) => format!("{id} ({})", display_bus_id(p)),
            None => id,
        }
    }

    /// Whether NVML said GPU_IS_LOST for this GPU, at its handle or at any query. A GPU
    /// that did not answer at all is not lost: nothing is known of it.
    pub fn is_lost(&self) -> bool {
        [
            self.remapped_rows.is_lost(),
            self.retired_pages_pending.is_lost(),
            self.volatile_uncorrectable_ecc.is_lost(),
            self.throttle_reasons.is_lost(),
            self.pcie_gen.is_lost(),
            self.pcie_width.is_lost(),
            self.minor.is_lost(),
            self.recovery_action.is_lost(),
            self.drain.is_lost(),
            self.pcie_replay.is_lost(),
        ]
        .iter()
        .any(|l| *l)
    }
}

/// NVML's `00000000:3B:00.0` as Linux writes it, `0000:3b:00.0`; anything unparsable is
/// shown as it came, lower-cased.
pub fn display_bus_id(nvml: &str) -> String {
    match PciAddr::parse(nvml) {
        Some(a) => a.to_string(),
        None => nvml.to_ascii_lowercase(),
    }
}

/// What NVML reports for a GPU that can change during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuCounters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// NVML answered and the GPU was reachable.
    pub reachable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_volatile_uncorrectable: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_uncorrectable: Option<u64>,
    #[serde(default)]
    pub remap_failure: bool,
}
