//! What the pcie probe read of one PCI function, as data. A leaf: `probe::Findings` holds
//! it, and the probe that fills it (`pcie`) implements the probe trait from there.

use super::aer::AerError;
use crate::error::Error;
use crate::gpu::nvml::facts::Reading;
use crate::store::pcie::{AerCounts, PcieBaseline};
use std::path::PathBuf;

/// What the probe read of one PCI function: the stages after it (the baseline move, the
/// start snapshot) use this rather than read the files again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSeen {
    pub dir: PathBuf,
    /// The kernel's name, `0000:3b:00.0`.
    pub name: String,
    /// None where the kernel reports no AER for the function.
    pub aer: Option<Result<AerCounts, AerError>>,
    /// NVML's PCIe replay counter, for a GPU's own function (None for any other, and when
    /// NVML gave no answer at all).
    pub replay: Option<Reading<u32>>,
    /// The stored baseline, read before the counters; an error names a damaged file.
    pub baseline: Result<Option<PcieBaseline>, Error>,
}
