//! What every probe shares: the [`Probe`] trait and the [`Findings`] it leaves beside its
//! verdict. A leaf, so the probes import it and not the `probe` module that runs them.

use crate::model::device::Device;
use crate::model::verdict::Verdict;
use crate::probe::pcie::seen::FunctionSeen;
use std::path::PathBuf;

pub trait Probe {
    fn name(&self) -> &'static str;
    /// The verdict on `device`; what the probe read that later stages use goes into
    /// `found`, and what an earlier probe put there may be used instead of reading again.
    fn check(&self, device: &Device, found: &mut Findings) -> Verdict;
}

/// What the probes read about one device. Each field is None until the probe that reads
/// it ran on the device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// The node probe: the host node is there and is this device's.
    pub node_present: Option<bool>,
    /// The sysfs probe: the PCI function behind the device by the kernel's device model
    /// (`Some(None)`: none, a virtual device or no sysfs entry).
    pub device_pci: Option<Option<PathBuf>>,
    /// The pcie probe: the functions it judged, the device's own first, then its upstream
    /// port; empty when the device has no PCI function.
    pub pcie: Option<Vec<FunctionSeen>>,
}
