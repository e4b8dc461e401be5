//! devgate's GPU selector grammar against glibc's own `sscanf` and `strtoumax`: the
//! reading of each token libnvidia-container's `select_devices` makes, including where it
//! falls through from a bus id to a MIG device.

use crate::gpu::request::GpuSelector;

/// devgate's reading of one selector token against glibc's: where NVIDIA's tooling takes
/// it as a GPU index or bus id, devgate takes the same GPU; where NVIDIA refuses it,
/// devgate checks no GPU by index or bus id for it.
pub(super) fn selector_agrees_with_glibc(token: &str) {
    let b = token.as_bytes();
    if token.eq_ignore_ascii_case("all") || (b.len() > 4 && b[..4].eq_ignore_ascii_case(b"GPU-")) {
        return;
    }
    let ours = crate::gpu::selector::parse(token);
    match glibc_reading(token) {
        Some(Ok(sel)) => assert_eq!(ours, Some(sel), "{token:?}"),
        Some(Err(())) => assert!(
            matches!(ours, Some(GpuSelector::Invalid(_))),
            "{token:?}: {ours:?}"
        ),
        None => assert!(
            !matches!(
                ours,
                Some(GpuSelector::Index(_) | GpuSelector::PciBusId { .. })
            ),
            "{token:?}: {ours:?}"
        ),
    }
}

/// glibc's `sscanf(token, "%lu:%lu")` when it converts both and each fits a GPU or MIG
/// index (`select_mig_device`'s reading, where the cli falls through to it).
fn glibc_mig(c: &std::ffi::CStr) -> Option<(u32, u32)> {
    let (mut g, mut m): (libc::c_ulong, libc::c_ulong) = (0, 0);
    // SAFETY: a NUL-terminated string, a NUL-terminated format and two c_ulong
    // out-pointers for its two %lu conversions.
    let n = unsafe {
        libc::sscanf(
            c.as_ptr(),
            c"%lu:%lu".as_ptr(),
            &mut g as *mut libc::c_ulong,
            &mut m as *mut libc::c_ulong,
        )
    };
    (n == 2)
        .then(|| u32::try_from(g).ok().zip(u32::try_from(m).ok()))
        .flatten()
}

/// What libnvidia-container's `select_devices` makes of a token that is not `all` or
/// `GPU-…`, by glibc's own `sscanf` and `strtoull` (`strtoumax` on Linux): `Some(Ok(pci))`
/// for `%x:%02x:%02x.0` read as a bus id a GPU can have (the `%02x` values fit two digits),
/// with the `%lu:%lu` MIG device the cli falls through to where no GPU has it;
/// `Some(Ok(Index))` for a whole-token number below `UINTMAX_MAX`; for a bus id no GPU
/// has, the MIG device, or `Some(Err(()))` without one; `None` when NVIDIA refuses the
/// token.
fn glibc_reading(token: &str) -> Option<Result<GpuSelector, ()>> {
    let c = std::ffi::CString::new(token).ok()?;
    let mig = glibc_mig(&c);
    let (mut d, mut b, mut v) = (0u32, 0u32, 0u32);
    // SAFETY: a NUL-terminated string, a NUL-terminated format and three u32 out-pointers
    // for its three %x conversions.
    let n = unsafe {
        libc::sscanf(
            c.as_ptr(),
            c"%x:%02x:%02x.0".as_ptr(),
            &mut d as *mut u32,
            &mut b as *mut u32,
            &mut v as *mut u32,
        )
    };
    if n == 3 {
        return Some(match (u8::try_from(b), u8::try_from(v), mig) {
            (Ok(bus), Ok(device), _) => Ok(GpuSelector::PciBusId {
                domain: d,
                bus,
                device,
                or_mig: mig,
            }),
            (_, _, Some((gpu, instance))) => Ok(GpuSelector::Mig { gpu, instance }),
            _ => Err(()),
        });
    }
    let mut end: *mut libc::c_char = std::ptr::null_mut();
    // SAFETY: a NUL-terminated string and a local end pointer.
    let n = unsafe { libc::strtoull(c.as_ptr(), &mut end, 10) };
    // SAFETY: strtoull leaves `end` inside the string it read.
    let whole = unsafe { *end } == 0 && end.cast_const() != c.as_ptr();
    (whole && n < u64::MAX).then(|| u32::try_from(n).map(GpuSelector::Index).map_err(|_| ()))
}

/// devgate's reading against glibc's own `sscanf` and `strtoumax` (through `libc`), the
/// functions libnvidia-container calls: wherever NVIDIA's tooling takes a token as a GPU
/// index or a PCI bus id, devgate must take it as the same GPU, or a pod could hide the GPU
/// it gets behind a spelling devgate reads otherwise (an unknown under the default
/// `on_unknown: allow`).
#[cfg(test)]
mod tests {
    use super::selector_agrees_with_glibc as agree;

    #[test]
    fn spellings_read_as_glibc_reads_them() {
        let long_zeros = format!("{}1", "0".repeat(200));
        let long_space = format!("{}2", " ".repeat(120));
        let long_domain = format!("{}:3b:00.0", "0".repeat(150));
        for t in [
            "\x0b1",
            "\x0c\r\n\t 3",
            "-18446744073709551615",
            "-18446744073709551614",
            "18446744073709551615",
            "18446744073709551616",
            "-18446744073709551616",
            long_zeros.as_str(),
            long_space.as_str(),
            long_domain.as_str(),
            "0x0:3b:00.0",
            "0X3b:00:00",
            "0x:3b:00.0",
            "0:0x:00.0",
            "0:0x3b:00.0",
            "0:3b:0x.0",
            "100000000:3b:00.0",
            "-100000000:3b:00.0",
            "-ffffffff:3b:00.0",
            "-0x1:3b:00.0",
            "fffffffffffffffffffff:3b:00.0",
            "-1:3b:00.0",
            "0:-1:00.0",
            "0:+3b:00.0",
            "0:+b:00.0",
            "+0x:1:2",
            "\x0b0:\x0b3b:\x0b00.0",
            "0:x3:00",
            "0x1",
            "+-1",
            "- 1",
        ] {
            agree(t);
        }
    }

    /// Every short token over the characters that matter to the two grammars, in a fixed
    /// pseudo-random order (the same tokens at every run).
    #[test]
    fn random_short_tokens_read_as_glibc_reads_them() {
        const ALPHABET: &[u8] = b"0123456789abfxX+-:. \x0b\t";
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..200_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let len = (state >> 60) as usize + 1;
            let mut s = state;
            let token: String = (0..len)
                .map(|_| {
                    s = s.rotate_left(5) ^ (s >> 3).wrapping_mul(31);
                    ALPHABET[(s % ALPHABET.len() as u64) as usize] as char
                })
                .collect();
            agree(&token);
        }
    }
}
