//! The driver's own list of GPUs, `/proc/driver/nvidia/gpus/<bus>/information`: which PCI
//! function is behind /dev/nvidiaN (`Device Minor:`) and its UUID. The driver writes it
//! when it probes the GPU, so it still answers for a GPU that has fallen off the bus, when
//! NVML can no longer say which minor a lost GPU had.

use super::pci::PciAddr;
use crate::fsutil::read_regular_file;
use std::path::Path;

/// The `information` file is a dozen short lines.
const MAX_INFO_BYTES: u64 = 16 * 1024;
/// More GPU directories than any node has; the rest are not read.
const MAX_GPU_DIRS: usize = 256;

/// One GPU as the driver listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcGpu {
    pub minor: u32,
    pub pci: PciAddr,
    /// `GPU-…`, when the driver could read it.
    pub uuid: Option<String>,
}

impl ProcGpu {
    /// The bus id as NVML takes it: `00000000:3B:00.0`.
    pub fn nvml_bus_id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.pci.domain,
            self.pci.bus,
            self.pci.device,
            self.pci.function.unwrap_or(0)
        )
    }
}

/// The PCI function the driver listed for /dev/nvidia`minor`.
pub fn pci_of_minor(list: &[ProcGpu], minor: u32) -> Option<PciAddr> {
    list.iter().find(|g| g.minor == minor).map(|g| g.pci)
}

/// Every GPU under `<proc_root>/driver/nvidia/gpus`. Empty when the driver is not loaded or
/// the tree is unreadable: then devgate knows only what NVML says.
pub fn read_gpus(proc_root: &Path) -> Vec<ProcGpu> {
    let dir = proc_root.join("driver/nvidia/gpus");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<ProcGpu> = entries
        .take(MAX_GPU_DIRS)
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name();
            let pci = PciAddr::parse(name.to_str()?)?;
            let bytes = read_regular_file(
                &e.path().join("information"),
                MAX_INFO_BYTES,
                "GPU information",
            )
            .ok()?;
            parse_information(&String::from_utf8_lossy(&bytes), pci)
        })
        .collect();
    out.sort_by_key(|g| g.pci);
    out
}

/// The `Device Minor:` and `GPU UUID:` rows of one `information` file; the directory name
/// gives the address (`Bus Location:` says the same). None without a valid minor, and for
/// a GPU the administrator excluded (`GPU Excluded: Yes`, `NVreg_ExcludedGpus`): neither
/// NVML nor the container toolkit counts it, so it has no index and no container gets it
/// (one given its node is judged as the driver listing no usable GPU there).
pub fn parse_information(text: &str, pci: PciAddr) -> Option<ProcGpu> {
    let mut minor = None;
    let mut uuid = None;
    let mut excluded = false;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "Device Minor" => minor = value.parse::<u32>().ok().filter(|m| *m < 255),
            "GPU UUID" if is_uuid(value) => uuid = Some(value.to_string()),
            "GPU Excluded" => excluded = value != "No",
            _ => {}
        }
    }
    if excluded {
        return None;
    }
    Some(ProcGpu {
        minor: minor?,
        pci,
        uuid,
    })
}

/// `GPU-` and a hex-and-dash UUID; anything else (`GPU-????…` on a GPU that could not be
/// read) is not shown as one.
fn is_uuid(s: &str) -> bool {
    s.strip_prefix("GPU-").is_some_and(|rest| {
        rest.len() == 36 && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 200\n\
        GPU UUID: \t GPU-8a4b0a6e-1c51-4a27-9c3c-2a3b8d0f6e11\nVideo BIOS: \t 96.00.89.00.01\n\
        Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n\
        Bus Location: \t 0000:3b:00.0\nDevice Minor: \t 2\nGPU Excluded:\t No\n";

    #[test]
    fn reads_minor_and_uuid() {
        let pci = PciAddr::parse("0000:3b:00.0").unwrap();
        let g = parse_information(INFO, pci).unwrap();
        assert_eq!(g.minor, 2);
        assert_eq!(
            g.uuid.as_deref(),
            Some("GPU-8a4b0a6e-1c51-4a27-9c3c-2a3b8d0f6e11")
        );
        assert_eq!(g.nvml_bus_id(), "00000000:3B:00.0");
        assert_eq!(parse_information("Model: x\n", pci), None);
        let unread = INFO.replace("GPU-8a4b0a6e-1c51-4a27-9c3c-2a3b8d0f6e11", "GPU-????????");
        assert_eq!(parse_information(&unread, pci).unwrap().uuid, None);
    }

    /// A GPU the administrator excluded (`NVreg_ExcludedGpus`, DGX's GPU exclusion of a
    /// failed board) is listed by the driver but counted by neither NVML nor the container
    /// toolkit: NVIDIA's index N is the Nth GPU that is not excluded. Counting it would
    /// make devgate check the wrong GPU for `NVIDIA_VISIBLE_DEVICES=1`.
    #[test]
    fn an_excluded_gpu_is_not_in_the_list() {
        let root = crate::fsutil::tests::tempdir("procfs-excluded");
        for (bus, minor, excluded) in [("1b", 0, "No"), ("3b", 1, "Yes"), ("5e", 2, "No")] {
            let dir = root.join(format!("driver/nvidia/gpus/0000:{bus}:00.0"));
            std::fs::create_dir_all(&dir).unwrap();
            let info = INFO
                .replace("Device Minor: \t 2", &format!("Device Minor: \t {minor}"))
                .replace("GPU Excluded:\t No", &format!("GPU Excluded:\t {excluded}"));
            std::fs::write(dir.join("information"), info).unwrap();
        }
        let minors: Vec<u32> = read_gpus(&root).iter().map(|g| g.minor).collect();
        assert_eq!(minors, vec![0, 2]);
        let _ = std::fs::remove_dir_all(&root);
    }
}
