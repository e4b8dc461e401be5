//! The quarantine probe: a device an operator cordoned is unhealthy until uncordoned.

use super::{Probe, Verdict};
use crate::device::Device;
use crate::ledger::quarantine::{Ledger, Lookup};
use crate::policy::one_line;

pub struct QuarantineProbe<'a> {
    pub ledger: &'a Ledger,
}

impl Probe for QuarantineProbe<'_> {
    fn name(&self) -> &'static str {
        "quarantine"
    }

    fn check(&self, device: &Device) -> Verdict {
        match self.ledger.lookup(device.num) {
            Lookup::Clear => Verdict::Healthy,
            Lookup::Cordoned(e) => Verdict::Unhealthy(format!(
                "quarantined by operator: {:?}",
                one_line(&e.reason)
            )),
            Lookup::Damaged { error, .. } => Verdict::Unhealthy(format!(
                "quarantined by operator (entry unreadable: {error})"
            )),
        }
    }
}
