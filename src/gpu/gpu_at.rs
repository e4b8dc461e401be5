//! `NVRM: GPU at PCI:0000:3b:00: GPU-9f3e1a2b-…`: the driver names a GPU's UUID beside its
//! PCI address in the kernel log (just before an XID report, among others). That maps a
//! UUID to a PCI slot without NVML, which matters most when the GPU is lost and NVML can
//! no longer say which UUID it had.
//!
//! Trusted only from a driver record (kernel facility, message beginning with `NVRM: `,
//! `kmsg::Record::is_driver`) that matches the whole form: a forged line could otherwise
//! point a container's UUID selector at another GPU.

use super::driver::ProcGpu;
use super::nvml::NvmlAnswer;
use super::pci::PciAddr;
use super::select::KnownGpus;
use crate::gpu::request::GpuSelector;
use crate::gpu::selector::uuid_names;
use crate::model::device::Source;
use serde::{Deserialize, Serialize};

/// One `GPU at` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuAt {
    /// The record's sequence number: the newest record for a slot wins.
    pub seq: u64,
    pub pci: PciAddr,
    /// `GPU-` and 8-4-4-4-12 hex digits, as the driver printed it.
    pub uuid: String,
}

/// More GPU slots than any node has; a log naming more keeps the newest.
pub const MAX_GPU_AT: usize = 256;

/// `NVRM: GPU at PCI:DDDD:BB:DD: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, in full. Not the
/// fallen-off notice `NVRM: GPU at 0000:01:00.0 has fallen off the bus.`, nor a UUID that
/// is not one (`GPU-????…`), nor anything after the UUID.
pub fn parse_gpu_at(msg: &str) -> Option<(PciAddr, String)> {
    let rest = msg.strip_prefix("NVRM: GPU at PCI:")?;
    let (addr, uuid) = rest.split_once(": ")?;
    let pci = PciAddr::parse_exact(addr)?;
    is_gpu_uuid(uuid).then(|| (pci, uuid.to_string()))
}

/// `GPU-` then hex groups of 8, 4, 4, 4 and 12 digits joined by `-`.
pub fn is_gpu_uuid(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Records `at` into `map`, one entry per slot (the newer record replaces the older),
/// at most [`MAX_GPU_AT`] slots (the oldest entry goes).
pub fn remember(map: &mut Vec<GpuAt>, at: GpuAt) {
    map.retain(|g| !g.pci.same_slot(&at.pci));
    if map.len() >= MAX_GPU_AT {
        if let Some(i) = map
            .iter()
            .enumerate()
            .min_by_key(|(_, g)| g.seq)
            .map(|(i, _)| i)
        {
            map.remove(i);
        }
    }
    map.push(at);
}

/// The PCI slot the kernel log last placed the GPU a `uuid` selector names at (compared
/// as NVIDIA compares them: a prefix, without case). When two slots match (a board moved
/// between driver loads), the newer record.
pub fn pci_of_uuid(map: &[GpuAt], uuid: &str) -> Option<PciAddr> {
    map.iter()
        .filter(|g| uuid_names(uuid, &g.uuid))
        .max_by_key(|g| g.seq)
        .map(|g| g.pci)
}

/// The minor (`/dev/nvidiaN`) of the GPU at `pci`: NVML's entry for that slot, else the
/// driver's own list (/proc/driver/nvidia/gpus), which still answers for a lost GPU.
pub fn minor_at(pci: &PciAddr, nvml: Option<&NvmlAnswer>, proc: &[ProcGpu]) -> Option<u32> {
    if let Some(Ok(gpus)) = nvml.map(|n| &n.gpus) {
        let hit = gpus.iter().find(|g| {
            g.pci_bus_id
                .value()
                .and_then(|b| PciAddr::parse(b))
                .is_some_and(|a| a.same_slot(pci))
        });
        if let Some(m) = hit.and_then(|g| g.minor.value()) {
            return Some(*m);
        }
    }
    proc.iter().find(|p| p.pci.same_slot(pci)).map(|p| p.minor)
}

/// What [`place_uuid_selectors`] did with a container's selectors.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Placed {
    /// Minors found through the kernel log, with the selector's source.
    pub minors: Vec<(u32, Source)>,
    /// Selectors left for NVML, in their order.
    pub rest: Vec<(GpuSelector, Source)>,
}

/// UUID selectors the GPU list does not know (`known`: NVML's enumeration or the driver's
/// list; no answer at all, or a lost GPU whose UUID neither can read any more), placed
/// through the kernel log's `GPU at` records and the minor of that slot (from `nvml` where
/// NVML answered, else the driver's list `proc`). A UUID the log does not place is left as
/// it was, so the list's own answer (and its warning) stands.
pub fn place_uuid_selectors(
    selectors: Vec<(GpuSelector, Source)>,
    known: &KnownGpus,
    nvml: Option<&NvmlAnswer>,
    gpu_at: &[GpuAt],
    proc: &[ProcGpu],
) -> Placed {
    let mut out = Placed::default();
    for (sel, source) in selectors {
        if let GpuSelector::Uuid(u) = &sel {
            let minor = (!known.knows_uuid(u))
                .then(|| pci_of_uuid(gpu_at, u))
                .flatten()
                .and_then(|pci| minor_at(&pci, nvml, proc));
            if let Some(m) = minor {
                out.minors.push((m, source));
                continue;
            }
        }
        out.rest.push((sel, source));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::nvml::Reading;

    const U: &str = "GPU-efbdfde9-5798-a6e7-4c46-12518fa15375";

    #[test]
    fn the_real_form_parses_and_near_misses_do_not() {
        let (pci, uuid) = parse_gpu_at(&format!("NVRM: GPU at PCI:0000:00:05: {U}")).unwrap();
        assert_eq!((pci.to_string(), uuid.as_str()), ("0000:00:05".into(), U));
        for bad in [
            "NVRM: GPU at 0000:01:00.0 has fallen off the bus.".to_string(),
            format!("NVRM: GPU at PCI:0000:00:05.0: {U}"),
            format!("NVRM: GPU at PCI:0000:00:05: {U} "),
            format!("NVRM: GPU at PCI:0000:00:05: {U}x"),
            format!("NVRM: GPU at PCI:0000:00:05:  {U}"),
            format!(" NVRM: GPU at PCI:0000:00:05: {U}"),
            "NVRM: GPU at PCI:0000:00:05: GPU-????????-????-????-????-????????????".into(),
            "NVRM: GPU at PCI:0000:00:05: GPU-efbdfde95798-a6e7-4c46-12518fa15375".into(),
            "NVRM: GPU at PCI:0000:00:05: MIG-efbdfde9-5798-a6e7-4c46-12518fa15375".into(),
            "NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa1537".into(),
            format!("NVRM: GPU at PCI:zz:00:05: {U}"),
        ] {
            assert_eq!(parse_gpu_at(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn newest_record_per_slot_wins_and_the_map_stays_bounded() {
        let a = |seq, bus: u8, uuid: &str| GpuAt {
            seq,
            pci: PciAddr {
                domain: 0,
                bus,
                device: 0,
                function: None,
            },
            uuid: uuid.into(),
        };
        let mut m = Vec::new();
        remember(&mut m, a(1, 0x3b, U));
        remember(
            &mut m,
            a(2, 0x3b, "GPU-00000000-0000-0000-0000-000000000001"),
        );
        assert_eq!(m.len(), 1);
        assert_eq!(
            pci_of_uuid(&m, U),
            None,
            "the slot's newer record replaced it"
        );
        remember(&mut m, a(3, 0x5e, U));
        assert_eq!(pci_of_uuid(&m, &U.to_uppercase()).unwrap().bus, 0x5e);
        for i in 0..600u64 {
            remember(&mut m, a(10 + i, (i % 250) as u8, U));
        }
        assert!(m.len() <= MAX_GPU_AT);
        assert_eq!(pci_of_uuid(&m, U).unwrap().bus, (599 % 250) as u8);
    }

    /// Long because it places the same selectors against one NVML answer after another
    /// (down, down without the driver's list, up, the GPU lost); the cases share the setup.
    #[test]
    fn uuid_selectors_nvml_cannot_answer_are_placed_through_the_log() {
        let pci = PciAddr::parse_exact("0000:3b:00").unwrap();
        let map = vec![GpuAt {
            seq: 7,
            pci,
            uuid: U.into(),
        }];
        let proc = vec![ProcGpu {
            minor: 3,
            pci,
            uuid: None,
        }];
        let down = NvmlAnswer {
            gpus: Err(crate::gpu::nvml::QueryError::Timeout {
                ms: 2000,
                one_gpu: false,
            }),
            driver_version: None,
            elapsed_us: 0,
            lookup: crate::gpu::nvml::Lookup::Enumeration,
        };
        let sel = vec![
            (GpuSelector::Uuid(U.to_uppercase()), Source::CdiAnnotation),
            (
                GpuSelector::Uuid("GPU-00000000-0000-0000-0000-00000000000f".into()),
                Source::NvidiaVisibleDevices,
            ),
            (GpuSelector::Index(1), Source::NvidiaVisibleDevices),
        ];
        let p = place_uuid_selectors(
            sel.clone(),
            &KnownGpus::from_answer(&down),
            Some(&down),
            &map,
            &proc,
        );
        assert_eq!(p.minors, vec![(3, Source::CdiAnnotation)]);
        assert_eq!(
            p.rest,
            sel[1..].to_vec(),
            "unplaced selectors stay for NVML"
        );
        // no driver list and no NVML: the slot's minor is unknown, the selector stays
        let p = place_uuid_selectors(
            sel.clone(),
            &KnownGpus::from_answer(&down),
            Some(&down),
            &map,
            &[],
        );
        assert!(p.minors.is_empty());
        assert_eq!(p.rest, sel);
        // NVML answers and knows the UUID: NVML decides
        let mut g = crate::gpu::nvml::tests::healthy(0);
        g.uuid = Reading::Value(U.into());
        let up = NvmlAnswer {
            gpus: Ok(vec![g.clone()]),
            driver_version: None,
            elapsed_us: 0,
            lookup: crate::gpu::nvml::Lookup::Enumeration,
        };
        let p = place_uuid_selectors(
            sel.clone(),
            &KnownGpus::from_answer(&up),
            Some(&up),
            &map,
            &proc,
        );
        assert!(p.minors.is_empty());
        // NVML answers, the GPU is lost (no UUID), its slot is known: placed at NVML's minor
        g.uuid = Reading::Lost;
        g.minor = Reading::Value(5);
        g.pci_bus_id = Reading::Value("00000000:3B:00.0".into());
        let lost = NvmlAnswer {
            gpus: Ok(vec![g]),
            driver_version: None,
            elapsed_us: 0,
            lookup: crate::gpu::nvml::Lookup::Enumeration,
        };
        let p = place_uuid_selectors(
            sel,
            &KnownGpus::from_answer(&lost),
            Some(&lost),
            &map,
            &proc,
        );
        assert_eq!(p.minors, vec![(5, Source::CdiAnnotation)]);
    }
}
