//! Where each PCI function's AER counters (and, for a GPU, NVML's PCIe replay counter) stood
//! when devgate last gated a container on it: `state_dir/pcie/<function>.json`
//! (`0000:3b:00.0.json`), root's only (0600), written atomically. The counters are
//! cumulative since boot, so a GPU that had one correctable error last month would warn
//! forever if judged by its absolute count; devgate judges the change since this baseline
//! instead.

use super::json::{read_json, write_json_volatile};
use crate::error::{Error, Result};
use crate::fsutil::ensure_private_dir;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One PCI function's AER totals (`aer_dev_correctable`, `aer_dev_nonfatal`,
/// `aer_dev_fatal`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AerCounts {
    pub correctable: u64,
    pub nonfatal: u64,
    pub fatal: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcieBaseline {
    /// The kernel's name of the function, `0000:3b:00.0`: also the file's name.
    pub function: String,
    /// When the AER counts were taken (or last moved).
    pub time_unix: u64,
    /// None for a function whose AER counters the kernel does not report (a GPU in a VM)
    /// but whose replay counter NVML does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aer: Option<AerCounts>,
    /// NVML's PCIe replay counter of the GPU at this function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayCount>,
}

/// NVML's PCIe replay counter as stored, and when it was taken (or last moved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayCount {
    pub count: u64,
    pub time_unix: u64,
}

/// A baseline is a few dozen bytes; a bigger file is not devgate's.
const MAX_BASELINE_BYTES: u64 = 4096;

pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("pcie")
}

/// The kernel names PCI functions `DDDD:BB:DD.F` in lowercase hex (a wider domain on some
/// hosts): nothing else may become a file name.
pub fn is_function_name(name: &str) -> bool {
    (12..=20).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b':' || b == b'.')
        && name.matches(':').count() == 2
        && name.matches('.').count() == 1
}

fn path(state_dir: &Path, function: &str) -> Result<PathBuf> {
    if !is_function_name(function) {
        return Err(Error::invalid(
            "PCIe baseline",
            format!("{function:?} is not a PCI function name"),
        ));
    }
    Ok(dir(state_dir).join(format!("{function}.json")))
}

/// The stored baseline; None when devgate has not seen the function yet.
pub fn read(state_dir: &Path, function: &str) -> Result<Option<PcieBaseline>> {
    let p = path(state_dir, function)?;
    let b: Option<PcieBaseline> = read_json(&p, MAX_BASELINE_BYTES, "PCIe baseline")?;
    match b {
        Some(b) if b.function != function => Err(Error::invalid(
            format!("PCIe baseline {}", p.display()),
            format!("names function {:?}", b.function),
        )),
        other => Ok(other),
    }
}

pub fn write(state_dir: &Path, baseline: &PcieBaseline) -> Result<()> {
    let p = path(state_dir, &baseline.function)?;
    ensure_private_dir(&dir(state_dir))?;
    write_json_volatile(&p, baseline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn baselines_round_trip_root_only_and_refuse_other_names() {
        let d = std::env::temp_dir().join(format!("devgate-pcie-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        // state_dir is root's own: devgate creates nothing in a directory others can write
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(read(&d, "0000:3b:00.0").unwrap(), None);
        let b = PcieBaseline {
            function: "0000:3b:00.0".into(),
            time_unix: 7,
            aer: Some(AerCounts {
                correctable: 1,
                nonfatal: 2,
                fatal: 3,
            }),
            replay: Some(ReplayCount {
                count: 12,
                time_unix: 8,
            }),
        };
        write(&d, &b).unwrap();
        assert_eq!(read(&d, "0000:3b:00.0").unwrap(), Some(b.clone()));
        // a file written before the replay counter was kept reads as having none
        std::fs::write(
            d.join("pcie/0000:af:00.0.json"),
            r#"{"function":"0000:af:00.0","time_unix":7,"aer":{"correctable":1,"nonfatal":0,"fatal":0}}"#,
        )
        .unwrap();
        let old = read(&d, "0000:af:00.0").unwrap().unwrap();
        assert_eq!(
            (old.aer.map(|a| a.correctable), old.replay),
            (Some(1), None)
        );
        let mode = std::fs::metadata(d.join("pcie/0000:3b:00.0.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        for bad in ["../x", "0000:3b:00.0/../../etc", "", "0000:3B:00.0", "a:b"] {
            assert!(read(&d, bad).is_err(), "{bad:?}");
        }
        // a file whose content names another function is damage, not a baseline
        std::fs::write(
            d.join("pcie/0000:5e:00.0.json"),
            serde_json::to_vec(&b).unwrap(),
        )
        .unwrap();
        assert!(read(&d, "0000:5e:00.0").is_err());
        std::fs::write(d.join("pcie/0000:86:00.0.json"), "x".repeat(10_000)).unwrap();
        assert!(read(&d, "0000:86:00.0").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
