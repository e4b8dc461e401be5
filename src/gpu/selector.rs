//! One GPU selector as NVIDIA's own tooling reads it: a token of `NVIDIA_VISIBLE_DEVICES`
//! (libnvidia-container, `src/cli/common.c`: `select_devices`) or the name in a CDI
//! annotation's `nvidia.com/gpu=NAME`. devgate must name the GPUs the container will really
//! get: reading a token more leniently checks a GPU the container never sees, more
//! strictly skips one it does. So the rules are NVIDIA's, in NVIDIA's order:
//!
//! 1. `all`, any case: every GPU; tokens after it are not read.
//! 2. `GPU-…` longer than `GPU-`: the first GPU whose UUID it begins, any case
//!    (`strncasecmp` over the token's length): `GPU-1a2b` is a GPU if one's UUID begins so.
//! 3. a PCI bus id, `sscanf("%x:%02x:%02x.0")` with 3 conversions: `0:3b:00.0`,
//!    `00000000:3B:00.0`, `0000:3b:00` all name domain 0, bus 0x3b, device 0.
//! 4. a decimal index, `strtoumax(…, 10)` to the end of the token: `1`, `00001`, `+1`.
//! 5. a MIG device: `MIG-…` by UUID, or `<gpu>:<mig>` (`sscanf("%lu:%lu")`); its parent
//!    GPU is what devgate checks.
//!
//! Each step that finds no GPU falls through to the next (`select_gpu_device`, then
//! `select_mig_device`): a bus id no GPU has is read again as `%lu:%lu`, so `1:0:0` is
//! MIG device 1:0 where no GPU sits at bus 0 of domain 1. A bus id keeps that reading
//! (`or_mig`) for the resolution against the GPU list to take.
//!
//! Anything else NVIDIA refuses (`unknown device`): devgate keeps it as `Invalid` with the
//! reason, so that it is judged unknown (`policy.on_unknown`), never silently nothing.
//! `void`, `none` and empty tokens select nothing (the toolkit's own meaning).
//!
//! The token is what the toolkit hands on: for the variable, trimmed of Unicode white
//! space since v1.12.0 (`gpu::visible_devices_tokens`); a CDI name or a mount's name as it
//! is. This module trims nothing: glibc's own skipping of leading ASCII white space is all.

/// A GPU as NVIDIA's container tooling names it; NVML turns it into a minor number.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GpuSelector {
    All,
    Index(u32),
    /// `GPU-…`: a prefix of the UUID, without regard to case ([`uuid_names`]).
    Uuid(String),
    PciBusId {
        domain: u32,
        bus: u8,
        device: u8,
        /// The same token as `%lu:%lu`, `<gpu>:<mig>`: the MIG device the cli takes when
        /// no GPU has the bus id.
        or_mig: Option<(u32, u32)>,
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
    /// The selectors past `request::MAX_SELECTORS`, not read: any GPU of the node, each
    /// judged as named (never with `all`'s warning alone). Never a token's reading.
    Unread,
}

/// Longer than any device name NVIDIA prints (a MIG UUID is 40 bytes). Only a UUID token is
/// refused for its length: a number may carry any count of leading zeros or white space,
/// and glibc reads it all the same.
pub const MAX_TOKEN: usize = 96;

/// C's `isspace` in the C locale: Rust's `is_ascii_whitespace` lacks the vertical tab, which
/// `strtoumax` and `sscanf` skip like any other.
fn c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// The value `strtoul`/`strtoumax` give for an optional sign and the digits `digits` in
/// `radix`: a magnitude beyond 64 bits is `u64::MAX` whatever the sign; a negative one
/// wraps (`-18446744073709551615` is 1).
fn c_value(neg: bool, digits: &str, radix: u32) -> u64 {
    let magnitude = digits.chars().try_fold(0u64, |v, c| {
        v.checked_mul(u64::from(radix))?
            .checked_add(u64::from(c.to_digit(radix)?))
    });
    match magnitude {
        None => u64::MAX,
        Some(v) if neg => v.wrapping_neg(),
        Some(v) => v,
    }
}

/// `strtoumax(s, &end, 10)` with `*end == '\0'` required: leading white space, one
/// optional sign, at least one digit, nothing after. `None` when it does not parse;
/// `Some(None)` when it parses to `UINTMAX_MAX`, which NVIDIA refuses (overflow, `-1`).
fn c_decimal(s: &str) -> Option<Option<u64>> {
    let t = s.trim_start_matches(c_space);
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'+') => (false, &t[1..]),
        Some(b'-') => (true, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Some(c_value(neg, digits, 10)).filter(|v| *v != u64::MAX))
}

/// One `%x` (or `%02x` with `width`) conversion as glibc's scanf makes it: leading white
/// space skipped (not counted in the width), then within the width an optional sign, a
/// `0x`/`0X` prefix (its `0` counts as a digit: `0x` alone reads as 0) and hex digits. The
/// value is `strtoul`'s, stored into an `unsigned int`: truncated to 32 bits
/// (`100000000` reads as 0). Returns it and the rest; `None` without a digit.
fn c_hex(s: &str, width: Option<usize>) -> Option<(u32, &str)> {
    let t = s.trim_start_matches(c_space);
    let mut left = width.unwrap_or(usize::MAX);
    let b = t.as_bytes();
    let mut i = 0;
    let neg = matches!(b.first(), Some(b'-'));
    if matches!(b.first(), Some(b'+' | b'-')) {
        i = 1;
        left -= 1;
    }
    let start = i;
    if left > 0 && b.get(i) == Some(&b'0') {
        i += 1;
        left -= 1;
        if left > 0 && matches!(b.get(i), Some(b'x' | b'X')) {
            i += 1;
            left -= 1;
        }
    }
    let digits_from = i;
    while left > 0 && i < b.len() && b[i].is_ascii_hexdigit() {
        i += 1;
        left -= 1;
    }
    if i == start {
        return None;
    }
    // the prefix's `0` is a digit of its own; the `x` is not
    let digits = if digits_from > start + 1 {
        &t[digits_from..i]
    } else {
        &t[start..i]
    };
    let digits = if digits.is_empty() { "0" } else { digits };
    Some((c_value(neg, digits, 16) as u32, &t[i..]))
}

/// `sscanf(token, "%x:%02x:%02x.0")` returning 3: the text after the third conversion
/// does not matter to the count, so `0:3b:00` and `0:3b:00.7` pass as NVIDIA's do.
/// [`BusId::NoGpuHas`] for a bus id whose numbers cannot be any GPU's (a bus or device that
/// `%02x` prints wider than two digits: a negative one).
fn pci_bus_id(t: &str) -> Option<BusId> {
    let (domain, rest) = c_hex(t, None)?;
    let rest = rest.strip_prefix(':')?;
    let (bus, rest) = c_hex(rest, Some(2))?;
    let rest = rest.strip_prefix(':')?;
    let (device, _) = c_hex(rest, Some(2))?;
    Some(match (u8::try_from(bus), u8::try_from(device)) {
        (Ok(b), Ok(v)) => BusId::Gpu(domain, b, v),
        _ => BusId::NoGpuHas,
    })
}

/// A token read as a PCI bus id.
enum BusId {
    /// Domain, bus and device.
    Gpu(u32, u8, u8),
    /// The form of one, with numbers no GPU has.
    NoGpuHas,
}

/// `sscanf(token, "%lu:%lu") == 2`.
fn mig_index(t: &str) -> Option<(Option<u64>, Option<u64>)> {
    let (a, b) = t.split_once(':')?;
    let lead = |s: &str| -> Option<Option<u64>> {
        // %lu stops at the first non-digit; what follows the second number is ignored.
        let s = s.trim_start_matches(c_space);
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

/// Whether a `GPU-…` token names the GPU whose UUID is `uuid`, as libnvidia-container
/// compares them (`strncasecmp(uuid, token, strlen(token))`): the token begins the UUID,
/// in any case. Of several GPUs it begins, NVIDIA gives the first in index order.
pub fn uuid_names(token: &str, uuid: &str) -> bool {
    uuid.len() >= token.len()
        && uuid.as_bytes()[..token.len()].eq_ignore_ascii_case(token.as_bytes())
}

/// What one token selects: `None` for nothing (`void`, `none`, empty).
/// Long because it tries the forms in NVIDIA's order (the module's list), one early
/// return each; split, that order would be spread over functions.
pub fn parse(token: &str) -> Option<GpuSelector> {
    if token.is_empty() || token == "void" || token == "none" {
        return None;
    }
    let invalid = |why: &str| Some(GpuSelector::Invalid(format!("{} is {why}", shown(token))));
    // A NUL ends the token for every C reader (execve's environment, the toolkit's
    // arguments to nvidia-container-cli, which Go's exec refuses outright), so no reading of
    // the bytes after it is NVIDIA's: the token selects no GPU devgate could name.
    if token.contains('\0') {
        return invalid("holding a NUL byte");
    }
    let long = token.len() > MAX_TOKEN;
    if token.eq_ignore_ascii_case("all") {
        return Some(GpuSelector::All);
    }
    // Compared as bytes: the token is the container's and may split a UTF-8 character.
    let b = token.as_bytes();
    if b.len() > 4 && b[..4].eq_ignore_ascii_case(b"GPU-") {
        if long {
            return invalid("longer than any GPU name");
        }
        return Some(GpuSelector::Uuid(token.to_string()));
    }
    let mig = mig_index(token);
    let bus_id = pci_bus_id(token);
    if let Some(BusId::Gpu(domain, bus, device)) = bus_id {
        return Some(GpuSelector::PciBusId {
            domain,
            bus,
            device,
            or_mig: match mig {
                Some((Some(g), Some(m))) => u32::try_from(g).ok().zip(u32::try_from(m).ok()),
                _ => None,
            },
        });
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
        if long {
            return invalid("longer than any GPU name");
        }
        return Some(GpuSelector::MigUuid(token.to_string()));
    }
    // a bus id no GPU can have falls through to here too (`1:2:-1` is MIG 1:2)
    match (mig, bus_id) {
        (Some((Some(g), Some(m))), _) => match (u32::try_from(g), u32::try_from(m)) {
            (Ok(gpu), Ok(instance)) => Some(GpuSelector::Mig { gpu, instance }),
            _ => invalid("a MIG index beyond any node's GPUs"),
        },
        (_, Some(BusId::NoGpuHas)) => invalid("a PCI bus id whose numbers no GPU has"),
        (Some(_), _) => invalid("a MIG index beyond any node's GPUs"),
        (None, _) => invalid(
            "not a GPU index, GPU-/MIG- UUID, PCI bus id, MIG <gpu>:<mig>, all, none or void",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GpuSelector::*;

    /// A token's bus id, whatever MIG device it also reads as.
    fn bus_of(t: &str) -> Option<(u32, u8, u8)> {
        match parse(t) {
            Some(PciBusId {
                domain,
                bus,
                device,
                ..
            }) => Some((domain, bus, device)),
            _ => None,
        }
    }

    /// The cli's fall-through: a token read as a bus id is also read as `%lu:%lu`, and a
    /// bus id no GPU can have is the MIG device alone.
    #[test]
    fn a_bus_id_carries_the_mig_device_the_cli_falls_through_to() {
        let or_mig = |t: &str| match parse(t) {
            Some(PciBusId { or_mig, .. }) => or_mig,
            other => panic!("{t:?}: {other:?}"),
        };
        assert_eq!(or_mig("1:0:0"), Some((1, 0)));
        assert_eq!(or_mig("+1:0:0"), Some((1, 0)));
        assert_eq!(or_mig("0:1:ff"), Some((0, 1)));
        assert_eq!(or_mig("0000:3b:00.0"), Some((0, 3)));
        assert_eq!(or_mig("0:3b:00.0"), Some((0, 3)));
        assert_eq!(or_mig("a:3b:00.0"), None);
        assert_eq!(or_mig("99999999999:3b:00.0"), None);
        assert_eq!(
            parse("1:2:-1"),
            Some(Mig {
                gpu: 1,
                instance: 2
            })
        );
        assert_eq!(
            parse("0:-1:00.0"),
            Some(Invalid(
                "\"0:-1:00.0\" is a PCI bus id whose numbers no GPU has".into()
            ))
        );
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
        assert_eq!(bus_of("0:3b:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(bus_of("00000000:3B:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(bus_of("0000:3b:00"), Some((0, 0x3b, 0)));
        assert_eq!(bus_of("0009:01:1c.0"), Some((9, 1, 0x1c)));
        // sscanf stops counting at the third number: NVIDIA takes these as device 0
        assert_eq!(bus_of("0:3b:00.7"), Some((0, 0x3b, 0)));
        assert_eq!(bus_of("0:3b:000"), Some((0, 0x3b, 0)));
        // glibc's strtoul and strtoumax: 0x, \v, 32-bit truncation, negation that wraps
        assert_eq!(bus_of("0x0:3b:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(bus_of("100000000:3b:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(bus_of("fffffffff:3b:00.0"), Some((u32::MAX, 0x3b, 0)));
        assert_eq!(parse("\x0b1"), Some(Index(1)));
        assert_eq!(parse("-18446744073709551615"), Some(Index(1)));
        assert_eq!(parse(&format!("{}7", "0".repeat(200))), Some(Index(7)));
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
            ("0:-1:00.0", "a PCI bus id whose numbers no GPU has"),
            ("VOID", "not a GPU index"),
            ("None", "not a GPU index"),
            // the fuzzer's find: sscanf would stop at the NUL and read a bus id
            ("00000000:3B:00.0\u{2}\0\0", "holding a NUL byte"),
            ("1\0", "holding a NUL byte"),
            ("GPU-1\0", "holding a NUL byte"),
        ] {
            match parse(t) {
                Some(Invalid(r)) => {
                    assert!(r.contains(why), "{t:?}: {r}");
                    assert!(r.starts_with(&format!("{t:?}")), "{t:?}: {r}");
                }
                other => panic!("{t:?}: {other:?}"),
            }
        }
        let long = format!("GPU-{}", "x".repeat(200));
        match parse(&long) {
            Some(Invalid(r)) => assert!(r.len() < 160 && r.contains("longer than"), "{r}"),
            other => panic!("{other:?}"),
        }
        for t in ["aé€x", "GPé-x", "€€€€€", "GPU-é", "0:é", "é:1"] {
            assert!(parse(t).is_some(), "{t:?}");
        }
    }
}
