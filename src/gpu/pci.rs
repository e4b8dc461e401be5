//! PCI addresses as the kernel log and NVML write them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A PCI function's address. The XID line names domain:bus:device (no function); NVML
/// writes `00000000:3B:00.0`; both name the same GPU, so they compare by slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PciAddr {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: Option<u8>,
}

impl PciAddr {
    /// `0000:3b:00`, `0000:3b:00.0`, `00000000:3B:00.0` or `3b:00.0`.
    pub fn parse(s: &str) -> Option<PciAddr> {
        let s = s.trim();
        let parts: Vec<&str> = s.split(':').collect();
        let (domain, bus, rest) = match parts.as_slice() {
            [d, b, r] => (hex(d, 8)?, *b, *r),
            [b, r] => (0, *b, *r),
            _ => return None,
        };
        let (dev, func) = match rest.split_once('.') {
            Some((d, f)) => (d, Some(f)),
            None => (rest, None),
        };
        let device = hex(dev, 2)?;
        let function = match func {
            Some(f) => Some(u8::try_from(hex(f, 1)?).ok()?),
            None => None,
        };
        if device > 0x1f || function.is_some_and(|f| f > 7) {
            return None;
        }
        Some(PciAddr {
            domain,
            bus: u8::try_from(hex(bus, 2)?).ok()?,
            device: device as u8,
            function,
        })
    }

    /// The driver's own form in an XID line: `DDDD:BB:DD` (domain 4 to 8 hex digits: the
    /// kernel and NVRM print it with `%04x`, so a domain above 0xffff, as VMD gives, is 5
    /// to 8 digits wide; NVML pads to 8), or
    /// the legacy `BB:DD`-less-domain forms old drivers wrote; no function, no spaces.
    pub fn parse_exact(s: &str) -> Option<PciAddr> {
        if s.contains('.') || s.bytes().any(|b| b.is_ascii_whitespace()) {
            return None;
        }
        let a = PciAddr::parse(s)?;
        let parts: Vec<&str> = s.split(':').collect();
        let widths_ok = match parts.as_slice() {
            [d, b, v] => (4..=8).contains(&d.len()) && b.len() == 2 && v.len() == 2,
            [b, v] => b.len() == 2 && v.len() == 2,
            _ => false,
        };
        widths_ok.then_some(a)
    }

    pub fn same_slot(&self, other: &PciAddr) -> bool {
        (self.domain, self.bus, self.device) == (other.domain, other.bus, other.device)
    }
}

/// What names one GPU outside NVML's own index: its UUID (`GPU-…`) and PCI address, as a
/// cluster taint, a DRA device or NVML gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuKey<'a> {
    pub uuid: Option<&'a str>,
    pub pci: Option<PciAddr>,
}

impl<'a> GpuKey<'a> {
    /// From text: the PCI address as [`PciAddr::parse`] reads it.
    pub fn of(uuid: Option<&'a str>, pci: Option<&str>) -> GpuKey<'a> {
        GpuKey {
            uuid,
            pci: pci.and_then(PciAddr::parse),
        }
    }

    /// Whether both name one GPU: by UUID (any case) where both have one, else by PCI
    /// address (a missing function read as `.0`) where both have one. A UUID that differs
    /// is another GPU, whatever its address. A blank UUID (`""`, as a driver may publish
    /// one it could not read) is none, and whitespace around one is not part of it: else a
    /// taint with `uuid: ""` and the right address would skip the GPU it names.
    pub fn same_gpu(&self, other: &GpuKey) -> bool {
        if let (Some(a), Some(b)) = (named(self.uuid), named(other.uuid)) {
            return a.eq_ignore_ascii_case(b);
        }
        match (self.pci, other.pci) {
            (Some(a), Some(b)) => {
                a.same_slot(&b) && a.function.unwrap_or(0) == b.function.unwrap_or(0)
            }
            _ => false,
        }
    }
}

/// A UUID as it names a GPU: trimmed; blank is none.
fn named(uuid: Option<&str>) -> Option<&str> {
    uuid.map(str::trim).filter(|u| !u.is_empty())
}

fn hex(s: &str, max_digits: usize) -> Option<u32> {
    if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )?;
        if let Some(func) = self.function {
            write!(f, ".{func}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn wide_domains_round_trip() {
        // Found by the kmsg_record fuzz target: `09551615` parsed, printed as `9551615`,
        // and the printed form no longer parsed.
        for s in [
            "09551615:3b:00",
            "10000:e1:00",
            "0000:3b:00",
            "00000000:3b:00",
        ] {
            let a = PciAddr::parse_exact(s).unwrap_or_else(|| panic!("{s}"));
            assert_eq!(PciAddr::parse_exact(&a.to_string()), Some(a), "{s}");
        }
        assert_eq!(PciAddr::parse_exact("123:3b:00"), None);
        assert_eq!(PciAddr::parse_exact("000000000:3b:00"), None);
    }

    use super::*;

    #[test]
    fn pci_addresses_normalise() {
        let a = PciAddr::parse("00000000:3B:00.0").unwrap();
        let b = PciAddr::parse("0000:3b:00").unwrap();
        assert!(a.same_slot(&b));
        assert_eq!(a.to_string(), "0000:3b:00.0");
        assert_eq!(
            PciAddr::parse("3b:00.1").unwrap().to_string(),
            "0000:3b:00.1"
        );
        for bad in [
            "",
            "3b",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "000000000:3b:00",
            "0:1:2:3",
            "g0:00.0",
        ] {
            assert_eq!(PciAddr::parse(bad), None, "{bad:?}");
        }
    }

    /// A blank UUID (`""`, spaces) names no GPU: the PCI address decides, as when the
    /// UUID is absent. Padding around a UUID is not part of it.
    #[test]
    fn a_blank_or_padded_uuid_is_no_other_gpu() {
        let gpu = GpuKey::of(Some("GPU-2"), Some("00000000:03:00.0"));
        assert!(GpuKey::of(Some(""), Some("0000:03:00.0")).same_gpu(&gpu));
        assert!(gpu.same_gpu(&GpuKey::of(Some("  "), Some("0000:03:00.0"))));
        assert!(GpuKey::of(Some(" GPU-2\n"), None).same_gpu(&gpu));
        assert!(!GpuKey::of(Some(""), None).same_gpu(&GpuKey::of(Some(""), None)));
        assert!(!GpuKey::of(Some(""), Some("0000:04:00.0")).same_gpu(&gpu));
    }
}
