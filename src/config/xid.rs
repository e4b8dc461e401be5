//! The XID table: what each NVIDIA XID number means for a GPU's health. Data, not code:
//! the built-in table comes from NVIDIA's catalogue and the operator's `gpu.xid_actions`
//! overrides it; config validation builds it once so a bad override fails at load.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XidAction {
    /// The GPU needs a reset or the node a reboot: unhealthy until the driver reloads.
    Unhealthy,
    /// Reported, never blocking.
    Warn,
    /// An application's own fault; the GPU is fine.
    Ignore,
}

/// The built-in table. The reset/reboot class follows NVIDIA's XID catalogue; the ignored
/// ones are the application XIDs NVIDIA's k8s device plugin also ignores. An XID not listed
/// is a warning: new driver versions add XIDs, and an unknown one should be seen, not block.
pub const XID_TABLE: &[(u32, XidAction, &str)] = &[
    (13, XidAction::Ignore, "graphics engine exception"),
    (31, XidAction::Ignore, "GPU memory page fault"),
    (43, XidAction::Ignore, "GPU stopped processing"),
    (45, XidAction::Ignore, "preemptive cleanup"),
    (68, XidAction::Ignore, "video processor exception"),
    (109, XidAction::Ignore, "context switch timeout"),
    (48, XidAction::Unhealthy, "double-bit ECC error"),
    (62, XidAction::Unhealthy, "internal micro-controller halt"),
    (
        63,
        XidAction::Unhealthy,
        "row remapping or page retirement event",
    ),
    (
        64,
        XidAction::Unhealthy,
        "row remapping or page retirement failure",
    ),
    (74, XidAction::Unhealthy, "NVLink error"),
    (79, XidAction::Unhealthy, "GPU has fallen off the bus"),
    (92, XidAction::Unhealthy, "high single-bit ECC error rate"),
    (94, XidAction::Unhealthy, "contained ECC error"),
    (95, XidAction::Unhealthy, "uncontained ECC error"),
    (119, XidAction::Unhealthy, "GSP RPC timeout"),
    (120, XidAction::Unhealthy, "GSP error"),
    (140, XidAction::Unhealthy, "unrecovered ECC error"),
];

/// The built-in table with the operator's `gpu.xid_actions` over it.
#[derive(Debug, Clone, Default)]
pub struct XidTable {
    overrides: BTreeMap<u32, XidAction>,
}

impl XidTable {
    /// Keys are XID numbers as strings, values `unhealthy`, `warn` or `ignore`.
    pub fn new(overrides: &BTreeMap<String, String>) -> Result<XidTable, String> {
        let mut t = XidTable::default();
        for (k, v) in overrides {
            let xid: u32 = k
                .trim()
                .parse()
                .map_err(|_| format!("gpu.xid_actions: {k:?} is not an XID number"))?;
            let action = match v.as_str() {
                "unhealthy" => XidAction::Unhealthy,
                "warn" => XidAction::Warn,
                "ignore" => XidAction::Ignore,
                other => {
                    return Err(format!(
                        "gpu.xid_actions.{k}: {other:?} is not one of unhealthy, warn, ignore"
                    ))
                }
            };
            t.overrides.insert(xid, action);
        }
        Ok(t)
    }

    pub fn action(&self, xid: u32) -> XidAction {
        if let Some(a) = self.overrides.get(&xid) {
            return *a;
        }
        XID_TABLE
            .iter()
            .find(|(x, _, _)| *x == xid)
            .map(|(_, a, _)| *a)
            .unwrap_or(XidAction::Warn)
    }
}

pub fn describe_xid(xid: u32) -> Option<&'static str> {
    XID_TABLE
        .iter()
        .find(|(x, _, _)| *x == xid)
        .map(|(_, _, d)| *d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_overrides_are_errors() {
        let mut o = BTreeMap::new();
        o.insert("x79".to_string(), "warn".to_string());
        assert!(XidTable::new(&o).unwrap_err().contains("not an XID number"));
        let mut o = BTreeMap::new();
        o.insert("79".to_string(), "explode".to_string());
        assert!(XidTable::new(&o).unwrap_err().contains("not one of"));
    }
}
