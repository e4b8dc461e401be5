//! Why a probe said what it said: a stable code a tool can group by, and the detail a
//! person reads. The detail is the text devgate has always printed (the reject line, the
//! warning lines, `devgate explain`); the code rides beside it in the records, in
//! `explain --json`, in `status --json`, in the metrics and in the exit record's faults.
//!
//! A code's string is a contract: once released it never changes meaning or spelling.
//! A new meaning gets a new code. A string this devgate does not know (a record written by
//! a newer one) reads as [`Code::Unspecified`], as does a record written before codes
//! existed: a record is never lost for its code.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;

/// The codes, each with its wire string: the enum, its string and its parsing come from
/// this one list, so a variant renamed in the source keeps its string.
macro_rules! codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal,)*) => {
        /// What a verdict means, one variant per meaning a probe reports.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub enum Code {
            /// A record written before codes existed, or a code this devgate does not know.
            #[default]
            Unspecified,
            $($(#[doc = $doc])* $variant,)*
        }

        impl Code {
            /// Every code, [`Code::Unspecified`] first.
            pub const ALL: &'static [Code] = &[Code::Unspecified, $(Code::$variant,)*];

            /// The stable snake_case string records, `explain --json` and metrics carry.
            pub fn as_str(self) -> &'static str {
                match self {
                    Code::Unspecified => "unspecified",
                    $(Code::$variant => $name,)*
                }
            }

            /// The code a string names; one this devgate does not know is unspecified.
            pub fn parse(s: &str) -> Code {
                match s {
                    $($name => Code::$variant,)*
                    _ => Code::Unspecified,
                }
            }
        }
    };
}

codes! {
    // node
    /// No node on the host has the device's number, or the node is gone.
    NodeMissing = "node_missing",
    /// The host path is no device node, or one of another type or number.
    NodeMismatch = "node_mismatch",
    /// The node could not be stat'ed.
    NodeUnreadable = "node_unreadable",
    // sysfs
    /// Sysfs has no entry for the device number (not applicable).
    NoSysfsEntry = "no_sysfs_entry",
    /// A device with no hardware behind it (not applicable).
    VirtualDevice = "virtual_device",
    /// The sysfs entry could not be resolved.
    SysfsUnreadable = "sysfs_unreadable",
    /// The hardware has no driver bound.
    DriverUnbound = "driver_unbound",
    /// A block device's state is not `running`.
    BlockNotRunning = "block_not_running",
    /// The hardware or driver does not report this (not applicable).
    NotReported = "not_reported",
    // quarantine
    /// An operator cordoned the device.
    Quarantined = "quarantined",
    /// The device's quarantine entry is damaged; it still quarantines.
    QuarantineEntryDamaged = "quarantine_entry_damaged",
    // cluster
    /// A taint in the cluster (a DRA DeviceTaintRule or ResourceSlice taint, NoSchedule
    /// or NoExecute) on the GPU, not tolerated by the container's pod.
    ClusterTaint = "cluster_taint",
    /// The node agent's cluster taints file is unsafe, over its bounds or damaged.
    ClusterTaintsUnreadable = "cluster_taints_unreadable",
    /// The node agent's taints file is older than `cluster_taints_max_age_s` (unknown).
    ClusterTaintsStale = "cluster_taints_stale",
    // PCIe
    /// The device has no PCI function (not applicable).
    NoPciFunction = "no_pci_function",
    /// A link width or AER counter file would not read or parse.
    PcieUnreadable = "pcie_unreadable",
    /// The stored PCIe baseline is damaged.
    PcieBaselineDamaged = "pcie_baseline_damaged",
    /// The function no longer answers config reads.
    PcieNoResponse = "pcie_no_response",
    /// The link is not trained (x0).
    PcieLinkUntrained = "pcie_link_untrained",
    /// The link trained narrower than both ends support (the pcie probe or NVML).
    PcieLinkDegraded = "pcie_link_degraded",
    /// Fatal AER errors since the baseline.
    AerFatal = "aer_fatal",
    /// Non-fatal AER errors since the baseline.
    AerNonfatal = "aer_nonfatal",
    /// Correctable AER errors since the baseline.
    AerCorrectable = "aer_correctable",
    /// PCIe replays since the baseline.
    PcieReplay = "pcie_replay",
    // NVML
    /// The device is not an NVIDIA GPU (not applicable).
    NotNvidiaGpu = "not_nvidia_gpu",
    /// NVML gave no answer for the GPU: the library missing, its init failing, the query
    /// crashed, no handle for a GPU that is not lost.
    NvmlUnanswered = "nvml_unanswered",
    /// NVML did not answer by `probe_timeout_ms`: often a GPU hanging in the driver.
    NvmlTimeout = "nvml_timeout",
    /// An earlier hook's NVML query of the GPU is still stuck, so it was not asked again.
    NvmlStuck = "nvml_stuck",
    /// One NVML reading failed.
    NvmlReadFailed = "nvml_read_failed",
    /// NVML or the driver knows no GPU with the node's minor number.
    GpuMissing = "gpu_missing",
    /// The GPU is lost (fallen off the bus).
    GpuLost = "gpu_lost",
    /// Row remapping failed.
    RowRemapFailed = "row_remap_failed",
    /// A row remap waits for a GPU reset.
    RowRemapPending = "row_remap_pending",
    /// Page retirement waits for a reboot.
    RetiredPagesPending = "retired_pages_pending",
    /// Volatile uncorrectable ECC errors over the limit.
    EccVolatileUncorrectable = "ecc_volatile_uncorrectable",
    /// The hardware throttles its clocks (thermal, power brake).
    Throttled = "throttled",
    /// The driver's recovery action is a GPU reset (NVML or XID 154).
    RecoveryGpuReset = "recovery_gpu_reset",
    /// The driver's recovery action is a node reboot (NVML or XID 154).
    RecoveryNodeReboot = "recovery_node_reboot",
    /// The driver's recovery action is to drain peer-to-peer traffic (NVML or XID 154).
    RecoveryDrainP2p = "recovery_drain_p2p",
    /// The driver's recovery action is to drain, then reset (NVML or XID 154).
    RecoveryDrainAndReset = "recovery_drain_and_reset",
    /// A recovery action newer than devgate knows (NVML or XID 154).
    RecoveryOther = "recovery_other",
    /// An administrator is draining the GPU.
    GpuDraining = "gpu_draining",
    // XID
    /// The kernel log could not be read.
    KernelLogUnreadable = "kernel_log_unreadable",
    /// The kernel log read stopped at its bounds; newer reports not seen.
    KernelLogTruncated = "kernel_log_truncated",
    /// An XID that blocks its GPU (reset- or reboot-class, or set `unhealthy`).
    XidCritical = "xid_critical",
    /// An XID worth a look that does not block.
    XidWarning = "xid_warning",
    /// An XID not in the catalog devgate carries.
    XidUnknown = "xid_unknown",
    /// A blocking XID no longer blocks: NVML says the GPU recovered.
    XidRecovered = "xid_recovered",
    /// Blocking XIDs on the node, and the GPU's PCI address is unknown.
    GpuAddressUnknown = "gpu_address_unknown",
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Read from a borrowed string where the input allows: no allocation per verdict.
impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Code, D::Error> {
        struct CodeVisitor;
        impl Visitor<'_> for CodeVisitor {
            type Value = Code;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a reason code")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Code, E> {
                Ok(Code::parse(s))
            }
        }
        d.deserialize_str(CodeVisitor)
    }
}

/// A typed reason: which meaning, and the words for a person. Rendered, it is the detail
/// alone, exactly the line devgate printed before codes existed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    pub code: Code,
    pub detail: String,
}

impl Reason {
    pub fn new(code: Code, detail: impl Into<String>) -> Reason {
        Reason {
            code,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_own_string_and_reads_back() {
        let mut seen = std::collections::BTreeSet::new();
        for &c in Code::ALL {
            let s = c.as_str();
            assert!(seen.insert(s), "{s} twice");
            let word = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
            assert!(
                s.starts_with(|c: char| c.is_ascii_lowercase()) && s.bytes().all(word),
                "{s} is not snake_case"
            );
            assert_eq!(Code::parse(s), c);
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<Code>(&json).unwrap(), c);
            assert_eq!(c.to_string(), s);
        }
        assert!(Code::ALL.len() > 40, "{}", Code::ALL.len());
    }

    #[test]
    fn a_code_from_a_newer_devgate_reads_as_unspecified() {
        assert_eq!(
            serde_json::from_str::<Code>("\"gpu_on_fire\"").unwrap(),
            Code::Unspecified
        );
        assert!(serde_json::from_str::<Code>("7").is_err());
    }

    #[test]
    fn a_reason_renders_as_its_detail() {
        let r = Reason::new(Code::GpuLost, "GPU is lost (fallen off the bus)");
        assert_eq!(r.to_string(), "GPU is lost (fallen off the bus)");
    }
}
