//! Reference models of how each supported runtime turns one `linux.resources.devices`
//! allow rule (after the spec's deny-all) into access, written apart from
//! `model::rule_number` from the runtimes' source:
//!
//! - crun eBPF (cgroup v2, and the systemd driver's pinned program with bpffs):
//!   `create_dev_bpf` copies the int64 major/minor into `int`s, `bpf_program_append_dev`
//!   takes a negative one as a wildcard and compares the rest as an immediate; the type is
//!   its first letter (`a` any, `b` block, any other char).
//! - crun under systemd without bpffs: `append_devices`/`append_device_allow`, the same
//!   `int`s, `IS_WILDCARD(x)` is `x <= 0`: a wildcard major with a fixed minor is dropped,
//!   both wildcards are `char-*`/`block-*`, a wildcard minor `char-<major>` (a driver name
//!   no driver has); `has_allow_all` reads the untruncated numbers of a last rule of type
//!   `a` the same way (`DevicePolicy=auto`). Types other than `a`, `c`, `b` refused.
//! - runc (opencontainers/cgroups `devicefilter.go`): numbers over MaxUint32 refused;
//!   negative a wildcard; the rest an `int32` immediate compared with the 64-bit register
//!   (so 2^31 and over match nothing); type `a` allows everything (its emulator).
//! - youki (`libcgroups/src/v2/devices/program.rs`): negative int64 a wildcard, else the
//!   low 32 bits as an `i32` immediate.
//! - cgroup v1 (each runtime writes `TYPE MAJOR:MINOR ACCESS`; `devcgroup_update_access`
//!   reads it with `kstrtou32`): a negative number or one over 2^32-1 refused, 2^32-1 (`~0`)
//!   a wildcard; runc writes -1 as `*`.
//!
//! The kernel hands the filter a device's 12-bit major and 20-bit minor. The differential
//! check ([`check`]): for every device a runtime lets the container read, devgate's
//! reading of the rule (`rule_numbers`) covers it, or devgate refuses the rule.

use crate::model::rule_number::rule_numbers;

/// One allow rule as the spec writes it (after a deny-all). `typ` is the JSON string.
#[derive(Debug, Clone)]
pub struct Rule {
    pub typ: Option<String>,
    pub major: Option<i64>,
    pub minor: Option<i64>,
    pub access: String,
}

/// A device the kernel can ask about: char or block, 12-bit major, 20-bit minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dev {
    pub block: bool,
    pub major: u32,
    pub minor: u32,
}

/// What a runtime makes of the rule: it refuses the spec, or a test of which devices the
/// container may read.
pub enum Reading {
    Refused,
    Grants(Box<dyn Fn(Dev) -> bool>),
}

/// C's conversion of an int64 to `int` on Linux (gcc, two's complement): the low 32 bits.
fn c_int(n: i64) -> i32 {
    n as i32
}

/// A 32-bit immediate compared with the zero-extended 32-bit register (`BPF_JMP`, 64-bit):
/// only a non-negative one can be equal.
fn imm_matches(imm: i32, v: u32) -> bool {
    i64::from(imm) == i64::from(v)
}

fn reads(access: &str) -> bool {
    access.contains('r')
}

/// crun's eBPF program (`bpf_program_append_dev`).
pub fn crun_ebpf(r: &Rule) -> Reading {
    // no type is `a`; an empty one's first byte is the NUL, a char rule
    let typ = match r.typ.as_deref().map(|t| t.bytes().next()) {
        None | Some(Some(b'a')) => None,
        Some(Some(b'b')) => Some(true),
        Some(_) => Some(false),
    };
    let major = r.major.map_or(-1, c_int);
    let minor = r.minor.map_or(-1, c_int);
    // letters other than r, w, m are ignored; a read needs `r`
    let read = reads(&r.access);
    Reading::Grants(Box::new(move |d: Dev| {
        read && typ.map_or(true, |b| b == d.block)
            && (major < 0 || imm_matches(major, d.major))
            && (minor < 0 || imm_matches(minor, d.minor))
    }))
}

/// crun's `DeviceAllow=` (systemd driver, no bpffs).
pub fn crun_systemd(r: &Rule) -> Reading {
    let wild = |x: i64| x <= 0;
    // an absent number is libocispec's zeroed field
    let (raw_major, raw_minor) = (r.major.unwrap_or(0), r.minor.unwrap_or(0));
    // has_allow_all, before anything else: the last rule an allow of type `a`, empty or
    // none with both numbers <= 0 is `DevicePolicy=auto`
    let any_type = r.typ.as_deref().map_or(true, |t| t.is_empty() || t == "a");
    if any_type && wild(raw_major) && wild(raw_minor) {
        return Reading::Grants(Box::new(|_| true));
    }
    let types: Vec<bool> = match r.typ.as_deref() {
        None | Some("a") => vec![false, true],
        Some("c") => vec![false],
        Some("b") => vec![true],
        Some(_) => return Reading::Refused,
    };
    let read = reads(&r.access);
    let major = i64::from(c_int(raw_major));
    let minor = i64::from(c_int(raw_minor));
    Reading::Grants(Box::new(move |d: Dev| {
        read && types.contains(&d.block)
            && match (wild(major), wild(minor)) {
                (true, true) => true,
                // a fixed minor under a wildcard major is dropped; `char-<major>` names a
                // driver no driver is called
                (true, false) | (false, true) => false,
                (false, false) => major == i64::from(d.major) && minor == i64::from(d.minor),
            }
    }))
}

/// runc's device filter (`devicefilter.go`).
pub fn runc(r: &Rule) -> Reading {
    let (major, minor) = (r.major.unwrap_or(-1), r.minor.unwrap_or(-1));
    if major > i64::from(u32::MAX) || minor > i64::from(u32::MAX) {
        return Reading::Refused;
    }
    let typ = match r.typ.as_deref() {
        None | Some("a") => return Reading::Grants(Box::new(|_| true)),
        Some("b") => true,
        Some("c") | Some("u") => false,
        // runc refuses other types (`p` is no device)
        Some(_) => return Reading::Refused,
    };
    let read = reads(&r.access);
    Reading::Grants(Box::new(move |d: Dev| {
        read && d.block == typ
            && (major < 0 || imm_matches(major as i32, d.major))
            && (minor < 0 || imm_matches(minor as i32, d.minor))
    }))
}

/// youki's program (`program.rs`).
pub fn youki(r: &Rule) -> Reading {
    let typ = match r.typ.as_deref() {
        None | Some("a") => None,
        Some("b") => Some(true),
        Some("c") | Some("u") => Some(false),
        Some(_) => return Reading::Refused,
    };
    let (major, minor) = (r.major, r.minor);
    let read = reads(&r.access) || r.access.is_empty();
    let one = |n: Option<i64>, v: u32| match n {
        Some(n) if n >= 0 => imm_matches(n as i32, v),
        _ => true,
    };
    Reading::Grants(Box::new(move |d: Dev| {
        read && typ.map_or(true, |b| b == d.block) && one(major, d.major) && one(minor, d.minor)
    }))
}

/// The cgroup v1 kernel parser over the text a runtime writes.
pub fn cgroup_v1(r: &Rule) -> Reading {
    let typ = match r.typ.as_deref() {
        None | Some("a") => return Reading::Grants(Box::new(|_| true)),
        Some("b") => true,
        Some("c") => false,
        Some(_) => return Reading::Refused,
    };
    // runc writes -1 as `*`; other negatives and numbers past u32 the kernel refuses
    let num = |n: Option<i64>| match n {
        None | Some(-1) => Ok(None),
        Some(n) if n == i64::from(u32::MAX) => Ok(None),
        Some(n) => u32::try_from(n).map(Some).map_err(|_| ()),
    };
    let (Ok(major), Ok(minor)) = (num(r.major), num(r.minor)) else {
        return Reading::Refused;
    };
    let read = reads(&r.access);
    Reading::Grants(Box::new(move |d: Dev| {
        read && d.block == typ
            && major.map_or(true, |m| m == d.major)
            && minor.map_or(true, |m| m == d.minor)
    }))
}

/// Every runtime's reading, named.
pub fn readings(r: &Rule) -> [(&'static str, Reading); 5] {
    [
        ("crun eBPF", crun_ebpf(r)),
        ("crun systemd", crun_systemd(r)),
        ("runc", runc(r)),
        ("youki", youki(r)),
        ("cgroup v1", cgroup_v1(r)),
    ]
}

/// devgate's reading: whether it covers `d`, or `None` where it refuses the rule.
fn devgate(r: &Rule) -> Option<impl Fn(Dev) -> bool> {
    let (major, minor) = rule_numbers(r.major, r.minor).ok()?;
    // discover's type reading: `a` or none every device whatever the numbers (runc's
    // emulator), `b` block, `c`, `u` and `p` char; any other the spec does not parse
    let typ = match r.typ.as_deref() {
        None | Some("a") => None,
        Some("b") => Some(true),
        Some("c" | "u" | "p") => Some(false),
        Some(_) => return None,
    };
    Some(move |d: Dev| match typ {
        None => true,
        Some(b) => {
            b == d.block
                && major.map_or(true, |m| m == d.major)
                && minor.map_or(true, |m| m == d.minor)
        }
    })
}

/// Devices worth asking about for a rule: NVIDIA's GPUs and whatever each runtime's
/// truncation of its numbers could land on, within the kernel's range.
fn probes(r: &Rule) -> Vec<Dev> {
    let cut = |n: Option<i64>, bits: u32| {
        let n = n.unwrap_or(0);
        [n, n & 0xffff_ffff, n & ((1 << bits) - 1), 0, 1]
    };
    let mut out = Vec::new();
    for major in cut(r.major, 12).into_iter().chain([195]) {
        for minor in cut(r.minor, 20) {
            for block in [false, true] {
                if let (Ok(major), Ok(minor)) = (u32::try_from(major), u32::try_from(minor)) {
                    if major < 1 << 12 && minor < 1 << 20 {
                        out.push(Dev {
                            block,
                            major,
                            minor,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The device a runtime grants that devgate's reading of the rule does not cover.
pub fn missed(r: &Rule) -> Option<(&'static str, Dev)> {
    missed_by(r, &devgate(r)?)
}

/// The device a runtime grants that a reading (`ours`: whether it covers a device) lacks.
fn missed_by(r: &Rule, ours: &dyn Fn(Dev) -> bool) -> Option<(&'static str, Dev)> {
    for (name, reading) in readings(r) {
        let Reading::Grants(grants) = reading else {
            continue;
        };
        if let Some(d) = probes(r).into_iter().find(|d| grants(*d) && !ours(*d)) {
            return Some((name, d));
        }
    }
    None
}

/// The differential check: every device any runtime lets the container read through the
/// rule, devgate's reading covers (or devgate refuses the rule).
pub fn check(r: &Rule) {
    if let Some((runtime, d)) = missed(r) {
        panic!("{r:?}: {runtime} grants {d:?}, which devgate's reading does not cover");
    }
}

/// A rule from fuzz bytes: a type byte, an access byte, then two numbers, each a kind byte
/// (absent, small, near a 32-bit edge, any) and eight bytes.
pub fn rule_from(data: &[u8]) -> Rule {
    let b = |i: usize| data.get(i).copied().unwrap_or(0);
    let word = |at: usize| {
        let mut w = [0u8; 8];
        for (k, x) in w.iter_mut().enumerate() {
            *x = b(at + k);
        }
        i64::from_le_bytes(w)
    };
    let number = |at: usize| {
        let raw = word(at + 1);
        match b(at) % 4 {
            0 => None,
            1 => Some(raw % 300 - 2),
            // 2^31 and 2^32 neighbours, either sign
            2 => Some((1i64 << (31 + (raw & 1))) + (raw >> 1) % 512 - 256),
            _ => Some(raw),
        }
    };
    let types = [
        None,
        Some("a"),
        Some("c"),
        Some("b"),
        Some("u"),
        Some("p"),
        Some("x"),
    ];
    let access = ["rwm", "rw", "r", "m", "w", "", "rx"];
    Rule {
        typ: types[usize::from(b(0)) % types.len()].map(str::to_string),
        major: number(2),
        minor: number(11),
        access: access[usize::from(b(1)) % access.len()].to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(typ: &str, major: i64, minor: i64) -> Rule {
        Rule {
            typ: Some(typ.into()),
            major: Some(major),
            minor: Some(minor),
            access: "rwm".into(),
        }
    }

    fn gpu(minor: u32) -> Dev {
        Dev {
            block: false,
            major: 195,
            minor,
        }
    }

    fn grants(reading: Reading, d: Dev) -> Option<bool> {
        match reading {
            Reading::Grants(g) => Some(g(d)),
            Reading::Refused => None,
        }
    }

    #[test]
    fn the_models_read_numbers_as_the_runtimes_source_does() {
        let r = rule("c", 195, 4294967297);
        assert_eq!(grants(crun_ebpf(&r), gpu(1)), Some(true));
        assert_eq!(grants(crun_systemd(&r), gpu(1)), Some(true));
        assert_eq!(grants(youki(&r), gpu(1)), Some(true));
        assert_eq!(grants(runc(&r), gpu(1)), None);
        assert_eq!(grants(cgroup_v1(&r), gpu(1)), None);
        let r = rule("c", 2147483843, 1);
        assert_eq!(
            grants(crun_ebpf(&r), gpu(1)),
            Some(true),
            "a wildcard major"
        );
        assert_eq!(grants(runc(&r), gpu(1)), Some(false));
        let r = rule("c", 4294967295, 1);
        assert_eq!(grants(cgroup_v1(&r), gpu(1)), Some(true), "~0 is *");
        let r = rule("c", 0, 0);
        assert_eq!(grants(crun_systemd(&r), gpu(7)), Some(true), "char-*");
        assert_eq!(grants(crun_ebpf(&r), gpu(7)), Some(false));
        let r = rule("c", 195, 0);
        assert_eq!(grants(crun_systemd(&r), gpu(0)), Some(false), "char-195");
        assert_eq!(grants(crun_ebpf(&r), gpu(0)), Some(true));
    }

    /// The check holds devgate to the models: the attacker's rules are refused, and a
    /// reading that skips an out-of-range number as matching nothing (devgate before)
    /// misses the GPU crun grants.
    #[test]
    fn devgate_covers_what_every_runtime_grants() {
        for (t, major, minor) in [
            ("c", 195, 4294967297),
            ("c", 4294967491, 1),
            ("c", 2147483843, 1),
            ("c", 0, 0),
            ("c", 195, 0),
            ("b", 8, 0),
            ("a", 5, 5),
            ("p", 195, 3),
            ("c", -2, 1),
            ("c", 4294967295, 4294967295),
        ] {
            check(&rule(t, major, minor));
        }
        // devgate before: an out-of-range number matched nothing, 0 was 0
        let r = rule("c", 195, 4294967297);
        assert!(devgate(&r).is_none(), "refused");
        assert_eq!(missed_by(&r, &|_| false), Some(("crun eBPF", gpu(1))));
        let r = rule("c", 0, 0);
        let exact = |d: Dev| d.major == 0 && d.minor == 0;
        assert_eq!(missed_by(&r, &exact).map(|m| m.0), Some("crun systemd"));
    }
}
