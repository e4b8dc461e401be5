//! The quarantine probe: a device an operator cordoned is unhealthy until uncordoned.

use crate::model::device::Device;
use crate::model::text::one_line;
use crate::model::verdict::{Code, Verdict};
use crate::probe::findings::{Findings, Probe};
use crate::store::quarantine::{Ledger, Lookup};

pub struct QuarantineProbe<'a> {
    pub ledger: &'a Ledger,
}

impl Probe for QuarantineProbe<'_> {
    fn name(&self) -> &'static str {
        "quarantine"
    }

    fn check(&self, device: &Device, _: &mut Findings) -> Verdict {
        match self.ledger.lookup(device.num) {
            Lookup::Clear => Verdict::Healthy,
            Lookup::Cordoned(e) => Verdict::unhealthy(
                Code::Quarantined,
                format!("quarantined by operator: \"{}\"", one_line(&e.reason)),
            ),
            Lookup::Damaged { error, .. } => Verdict::unhealthy(
                Code::QuarantineEntryDamaged,
                format!("quarantined by operator (entry unreadable: {error})"),
            ),
        }
    }
}
