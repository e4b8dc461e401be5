//! One GPU selector as NVIDIA's own tooling reads it: a token of `NVIDIA_VISIBLE_DEVICES`
//! (libnvidia-container, `src/cli/common.c`: `select_devices`) or the name in a CDI
//! annotation's `nvidia.com/gpu=NAME`. devgate must name the GPUs the container will really
//! get: reading a token more leniently checks a GPU the container never sees, more
//! strictly skips one it does. So the rules are NVIDIA's, in NVIDIA's order:
//!
//! 1. `all`, any case: every GPU; tokens after it are not read.
//! 2. `GPU-…` longer than `GPU-`: a GPU by its full UUID, any case. Never a prefix.
//! 3. a PCI bus id, `sscanf("%x:%02x:%02x.0")` with 3 conversions: `0:3b:00.0`,
//!    `00000000:3B:00.0`, `0000:3b:00` all name domain 0, bus 0x3b, device 0.
//! 4. a decimal index, `strtoumax(…, 10)` to the end of the token: `1`, `00001`, `+1`.
//! 5. a MIG device: `MIG-…` by UUID, or `<gpu>:<mig>` (`sscanf("%lu:%lu")`); its parent
//!    GPU is what devgate checks.
//!
//! Anything else NVIDIA refuses (`unknown device`): devgate keeps it as `Invalid` with the
//! reason, so that it is judged unknown (`policy.on_unknown`), never silently nothing.
//! `void`, `none` and empty tokens select nothing (the toolkit's own meaning).

/// A GPU as NVIDIA's container tooling names it; NVML turns it into a minor number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelector {
    All,
    Index(u32),
    /// `GPU-…`, compared whole without regard to case.
    Uuid(String),
    PciBusId {
        domain: u32,
        bus: u8,
        device: u8,
    },
    /// `<gpu>:<mig>`: MIG instance `mig` of GPU index `gpu`.
    Mig {
        gpu: u32,
        instance: u32,
    },
    /// `MIG-…`.
    MigUuid(String),
    /// A token NVIDIA's tooling refuses, with why (the token is in the reason, shortened).
    Invalid(String),
}

/// Longer than any device name NVIDIA prints (a MIG UUID is 40 bytes).
pub const MAX_TOKEN: usize = 96;

/// `strtoumax(s, &end, 10)` with `*end == '\0'` required: leading white space, one
/// optional sign, at least one digit, nothing after. `None` when it does not parse;
/// `Some(None)` when it parses to a value beyond any index (overflow, or negative and
/// not zero, which C wraps to a huge number).
fn c_decimal(s: &str) -> Option<Option<u64>> {
    let t = s.trim_start_matches(|c: char| c.is_ascii_whitespace());
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'+') => (false, &t[1..]),
        Some(b'-') => (true, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value = digits.bytes().try_fold(0u64, |v, b| {
        v.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    });
    Some(match value {
        Some(0) => Some(0),
        Some(v) if !neg => Some(v),
        _ => None,
    })
}

/// One `%x` (or `%02x` with `width`) conversion: leading white space skipped, then up to
/// `width` characters of an optional sign and hex digits. Returns the value (None when
/// it overflows 32 bits or is negative and not zero) and the rest.
fn c_hex(s: &str, width: Option<usize>) -> Option<(Option<u32>, &str)> {
    let t = s.trim_start_matches(|c: char| c.is_ascii_whitespace());
    let limit = width.unwrap_or(usize::MAX);
    let b = t.as_bytes();
    let mut i = 0;
    let neg = matches!(b.first(), Some(b'-'));
    if matches!(b.first(), Some(b'+' | b'-')) && limit > 1 {
        i = 1;
    }
    let start = i;
    while i < b.len() && i < limit && b[i].is_ascii_hexdigit() {
        i += 1;
    }
    if i == start {
        return None;
    }
    let v = u32::from_str_radix(&t[start..i], 16).ok();
    let v = match v {
        Some(0) => Some(0),
        Some(v) if !neg => Some(v),
        _ => None,
    };
    Some((v, &t[i..]))
}

/// `sscanf(token, "%x:%02x:%02x.0")` returning 3: the text after the third conversion
/// does not matter to the count, so `0:3b:00` and `0:3b:00.7` pass as NVIDIA's do.
/// `Some(Err)` for a bus id whose numbers cannot be any GPU's.
fn pci_bus_id(t: &str) -> Option<Result<(u32, u8, u8), String>> {
    let (domain, rest) = c_hex(t, None)?;
    let rest = rest.strip_prefix(':')?;
    let (bus, rest) = c_hex(rest, Some(2))?;
    let rest = rest.strip_prefix(':')?;
    let (device, _) = c_hex(rest, Some(2))?;
    Some(match (domain, bus, device) {
        (Some(d), Some(b), Some(v)) => Ok((d, b as u8, v as u8)),
        _ => Err("a PCI bus id whose numbers no GPU has".into()),
    })
}

/// `sscanf(token, "%lu:%lu") == 2`.
fn mig_index(t: &str) -> Option<(Option<u64>, Option<u64>)> {
    let (a, b) = t.split_once(':')?;
    let lead = |s: &str| -> Option<Option<u64>> {
        // %lu stops at the first non-digit; what follows the second number is ignored.
        let s = s.trim_start_matches(|c: char| c.is_ascii_whitespace());
        let sign = usize::from(matches!(s.as_bytes().first(), Some(b'+' | b'-')));
        let n = s[sign..].bytes().take_while(u8::is_ascii_digit).count();
        c_decimal(&s[..sign + n])
    };
    // the first number must end right at the ':'
    let first = c_decimal(a)?;
    Some((first, lead(b)?))
}

fn shown(t: &str) -> String {
    let mut end = t.len().min(MAX_TOKEN);
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    if end < t.len() {
        format!("{:?}…", &t[..end])
    } else {
        format!("{t:?}")
    }
}

/// What one token selects: `None` for nothing (`void`, `none`, empty).
pub fn parse(token: &str) -> Option<GpuSelector> {
    if token.is_empty() || token == "void" || token == "none" {
        return None;
    }
    let invalid = |why: &str| Some(GpuSelector::Invalid(format!("{} is {why}", shown(token))));
    if token.len() > MAX_TOKEN {
        return invalid("longer than any GPU name");
    }
    if token.eq_ignore_ascii_case("all") {
        return Some(GpuSelector::All);
    }
    // Compared as bytes: the token is the container's and may split a UTF-8 character.
    let b = token.as_bytes();
    if b.len() > 4 && b[..4].eq_ignore_ascii_case(b"GPU-") {
        return Some(GpuSelector::Uuid(token.to_string()));
    }
    match pci_bus_id(token) {
        Some(Ok((domain, bus, device))) => {
            return Some(GpuSelector::PciBusId {
                domain,
                bus,
                device,
            })
        }
        Some(Err(why)) => return invalid(&why),
        None => {}
    }
    match c_decimal(token) {
        Some(Some(n)) => {
            return match u32::try_from(n) {
                Ok(n) => Some(GpuSelector::Index(n)),
                Err(_) => invalid("an index beyond any node's GPUs"),
            }
        }
        Some(None) => return invalid("an index beyond any node's GPUs"),
        None => {}
    }
    if b.len() > 4 && b[..4].eq_ignore_ascii_case(b"MIG-") {
        return Some(GpuSelector::MigUuid(token.to_string()));
    }
    match mig_index(token) {
        Some((Some(g), Some(m))) => match (u32::try_from(g), u32::try_from(m)) {
            (Ok(gpu), Ok(instance)) => Some(GpuSelector::Mig { gpu, instance }),
            _ => invalid("a MIG index beyond any node's GPUs"),
        },
        Some(_) => invalid("a MIG index beyond any node's GPUs"),
        None => invalid(
            "not a GPU index, GPU-/MIG- UUID, PCI bus id, MIG <gpu>:<mig>, all, none or void",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GpuSelector::*;

    fn pci(domain: u32, bus: u8, device: u8) -> Option<GpuSelector> {
        Some(PciBusId {
            domain,
            bus,
            device,
        })
    }

    #[test]
    fn every_form_nvidia_accepts() {
        assert_eq!(parse("all"), Some(All));
        assert_eq!(parse("ALL"), Some(All));
        assert_eq!(parse("1"), Some(Index(1)));
        assert_eq!(parse("00001"), Some(Index(1)));
        assert_eq!(parse("+1"), Some(Index(1)));
        assert_eq!(parse(" 2"), Some(Index(2)));
        assert_eq!(parse("-0"), Some(Index(0)));
        assert_eq!(parse("4294967295"), Some(Index(u32::MAX)));
        let uuid = "GPU-1a2b3c4d-0000-1111-2222-333344445555";
        assert_eq!(parse(uuid), Some(Uuid(uuid.into())));
        assert_eq!(parse("gpu-1a2b"), Some(Uuid("gpu-1a2b".into())));
        assert_eq!(parse("0:3b:00.0"), pci(0, 0x3b, 0));
        assert_eq!(parse("00000000:3B:00.0"), pci(0, 0x3b, 0));
        assert_eq!(parse("0000:3b:00"), pci(0, 0x3b, 0));
        assert_eq!(parse("0009:01:1c.0"), pci(9, 1, 0x1c));
        // sscanf stops counting at the third number: NVIDIA takes these as device 0
        assert_eq!(parse("0:3b:00.7"), pci(0, 0x3b, 0));
        assert_eq!(parse("0:3b:000"), pci(0, 0x3b, 0));
        assert_eq!(
            parse("0:1"),
            Some(Mig {
                gpu: 0,
                instance: 1
            })
        );
        assert_eq!(
            parse("3:12"),
            Some(Mig {
                gpu: 3,
                instance: 12
            })
        );
        let mig = "MIG-5e2a7c3d-1111-2222-3333-444455556666";
        assert_eq!(parse(mig), Some(MigUuid(mig.into())));
        for nothing in ["", "void", "none"] {
            assert_eq!(parse(nothing), None, "{nothing:?}");
        }
    }

    #[test]
    fn what_nvidia_refuses_is_invalid_with_a_reason_never_nothing() {
        for (t, why) in [
            ("junk", "not a GPU index"),
            ("GPU-", "not a GPU index"),
            ("MIG-", "not a GPU index"),
            ("1 ", "not a GPU index"),
            ("1.0", "not a GPU index"),
            ("0x1", "not a GPU index"),
            ("3b:00.0", "not a GPU index"),
            ("-1", "an index beyond"),
            ("99999999999", "an index beyond"),
            ("99999999999999999999999", "an index beyond"),
            ("1:99999999999", "a MIG index beyond"),
            ("fffffffff:3b:00.0", "a PCI bus id whose numbers no GPU has"),
            ("VOID", "not a GPU index"),
            ("None", "not a GPU index"),
        ] {
            match parse(t) {
                Some(Invalid(r)) => {
                    assert!(r.contains(why), "{t:?}: {r}");
                    assert!(r.starts_with(&format!("{t:?}")), "{t:?}: {r}");
                }
                other => panic!("{t:?}: {other:?}"),
            }
        }
        let long = "x".repeat(200);
        match parse(&long) {
            Some(Invalid(r)) => assert!(r.len() < 160 && r.contains("longer than"), "{r}"),
            other => panic!("{other:?}"),
        }
        for t in ["aé€x", "GPé-x", "€€€€€", "GPU-é", "0:é", "é:1"] {
            assert!(parse(t).is_some(), "{t:?}");
        }
    }
}
