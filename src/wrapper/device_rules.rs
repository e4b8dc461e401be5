//! The remap's device rules in the one shape every runtime path accepts: a deny-all, then
//! allows only. runc and crun on cgroupfs (v1 lists, v2 eBPF) take any order, but crun under
//! the systemd driver without bpffs turns the rules into `DeviceAllow=` and refuses a deny
//! after its last deny-all ("systemd does not support deny rules for devices"), and it
//! writes a `c 195:*` as `char-195`, which systemd reads as a driver's name. So the bad
//! device is left out of the allows instead of denied after them, and a wildcard allow
//! over it is split per minor.
//!
//! The spec's own denies after its deny-all are folded into its allows the same way, so
//! the list means what it meant (last match wins) with none left.

use crate::model::device::{DevNum, DevType};
use crate::model::rule_number::rule_numbers;
use serde_json::{json, Value};
use std::fmt;

const R: u8 = 1;
const W: u8 = 2;
const M: u8 = 4;
const RWM: u8 = R | W | M;

/// A wildcard minor is split over these: NVIDIA's GPUs (195:0..=253), nvidia-modeset
/// (195:254) and nvidiactl (195:255) among them. Minors above 255 of a split major are not
/// kept: the container loses them, never gains a device.
const SPLIT_MINORS: std::ops::RangeInclusive<u32> = 0..=255;

/// One `linux.resources.devices` rule; `None` is a wildcard (type `a`, major or minor -1
/// or absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub allow: bool,
    pub typ: Option<DevType>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub access: u8,
}

/// Why the spec's device rules cannot be rewritten: a rule no runtime accepts, or one no
/// list of allows can leave a device out of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleError {
    /// A major or minor beyond any device's.
    OutOfRange(i64),
    /// A major or minor that is not an integer (the JSON value, as written).
    NotInteger(String),
    UnknownAccess(char),
    UnknownType(String),
    /// An allow over every device of a type (`None`: of both): a privileged container.
    AllowsEvery(Option<DevType>),
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleError::OutOfRange(n) => write!(f, "device number {n} out of range"),
            RuleError::NotInteger(v) => write!(f, "device number {v} is not an integer"),
            RuleError::UnknownAccess(c) => write!(
                f,
                "unknown device access {:?}",
                c.escape_default().to_string()
            ),
            RuleError::UnknownType(t) => write!(
                f,
                "unknown device type {:?}",
                t.escape_default().to_string()
            ),
            RuleError::AllowsEvery(typ) => {
                let what = typ.map_or("c and b".to_string(), |t| t.letter().to_string());
                write!(
                    f,
                    "the spec allows every {what} device (a privileged container): no list of \
                     allows can leave one out, and under the systemd driver crun grants them \
                     all (DevicePolicy=auto)"
                )
            }
        }
    }
}

impl std::error::Error for RuleError {}

fn number(v: Option<&Value>) -> Result<Option<i64>, RuleError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| RuleError::NotInteger(v.to_string())),
    }
}

/// Both numbers as every runtime reads them (`rule_number`): a number one reads apart is
/// refused, and a 0-or-any pair is any (crun under systemd), so the rewrite never keeps a
/// rule that grants more than it says.
fn numbers(v: &Value) -> Result<(Option<u32>, Option<u32>), RuleError> {
    rule_numbers(number(v.get("major"))?, number(v.get("minor"))?)
        .map_err(|e| RuleError::OutOfRange(e.value))
}

fn access_bits(s: &str) -> Result<u8, RuleError> {
    s.chars().try_fold(0, |acc, c| match c {
        'r' => Ok(acc | R),
        'w' => Ok(acc | W),
        'm' => Ok(acc | M),
        _ => Err(RuleError::UnknownAccess(c)),
    })
}

impl Rule {
    pub fn exact(allow: bool, num: DevNum, access: u8) -> Rule {
        Rule {
            allow,
            typ: Some(num.typ),
            major: Some(num.major),
            minor: Some(num.minor),
            access,
        }
    }

    pub fn parse(v: &Value) -> Result<Rule, RuleError> {
        let typ = match v.get("type").and_then(Value::as_str) {
            None | Some("a") => None,
            Some("c") | Some("u") => Some(DevType::Char),
            Some("b") => Some(DevType::Block),
            Some(t) => return Err(RuleError::UnknownType(t.to_string())),
        };
        let (major, minor) = numbers(v)?;
        Ok(Rule {
            allow: v.get("allow").and_then(Value::as_bool).unwrap_or(false),
            typ,
            major,
            minor,
            access: access_bits(v.get("access").and_then(Value::as_str).unwrap_or("rwm"))?,
        })
    }

    pub fn to_value(self) -> Value {
        let mut v = json!({
            "allow": self.allow,
            "type": self.typ.map_or('a', |t| t.letter()).to_string(),
        });
        if let Some(m) = self.major {
            v["major"] = m.into();
        }
        if let Some(m) = self.minor {
            v["minor"] = m.into();
        }
        v["access"] = access_text(self.access).into();
        v
    }

    fn is_deny_all(&self) -> bool {
        !self.allow
            && self.typ.is_none()
            && self.major.is_none()
            && self.minor.is_none()
            && self.access == RWM
    }

    fn covers(&self, num: DevNum) -> bool {
        meets(self.typ, Some(num.typ))
            && meets(self.major, Some(num.major))
            && meets(self.minor, Some(num.minor))
    }
}

/// `rwm` order, as runtimes and the kernel print it.
pub fn access_text(bits: u8) -> String {
    [(R, 'r'), (W, 'w'), (M, 'm')]
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, c)| *c)
        .collect()
}

fn meets<T: PartialEq>(a: Option<T>, b: Option<T>) -> bool {
    a.is_none() || b.is_none() || a == b
}

/// `a` with what `d` denies taken out, as allows. Fails only where the allows would have
/// to name every major: a rule over every device of a type.
fn minus(a: Rule, d: &Rule) -> Result<Vec<Rule>, RuleError> {
    let overlap = meets(a.typ, d.typ)
        && meets(a.major, d.major)
        && meets(a.minor, d.minor)
        && a.access & d.access != 0;
    if !overlap {
        return Ok(vec![a]);
    }
    if a.typ.is_none() && d.typ.is_some() {
        let mut out = Vec::new();
        for typ in [DevType::Char, DevType::Block] {
            out.extend(minus(
                Rule {
                    typ: Some(typ),
                    ..a
                },
                d,
            )?);
        }
        return Ok(out);
    }
    if a.major.is_none() && d.major.is_some() {
        return Err(RuleError::AllowsEvery(a.typ));
    }
    if a.minor.is_none() && d.minor.is_some() {
        let mut out = Vec::new();
        for minor in SPLIT_MINORS {
            out.extend(minus(
                Rule {
                    minor: Some(minor),
                    ..a
                },
                d,
            )?);
        }
        return Ok(out);
    }
    // d covers a: only the access bits change.
    let access = a.access & !d.access;
    Ok(if access == 0 {
        Vec::new()
    } else {
        vec![Rule { access, ..a }]
    })
}

fn subtract(allows: Vec<Rule>, d: &Rule) -> Result<Vec<Rule>, RuleError> {
    let mut out = Vec::with_capacity(allows.len());
    for a in allows {
        out.extend(minus(a, d)?);
    }
    Ok(out)
}

/// The spec's rules as the allows that follow a deny-all: those after its last deny-all,
/// with each later deny folded in. No deny-all at all starts from denying every device,
/// as cgroup v2's program does: a container can only lose access, never gain it.
pub fn effective_allows(rules: &[Value]) -> Result<Vec<Rule>, RuleError> {
    let parsed = rules
        .iter()
        .map(Rule::parse)
        .collect::<Result<Vec<_>, _>>()?;
    let start = parsed
        .iter()
        .rposition(Rule::is_deny_all)
        .map_or(0, |i| i + 1);
    let mut allows = Vec::new();
    for r in &parsed[start..] {
        if r.allow {
            allows.push(*r);
        } else {
            allows = subtract(allows, r)?;
        }
    }
    Ok(allows)
}

/// The access the allows grant `num`, for its spare: `rwm` when they grant it no read or
/// write (a `linux.devices` entry alone is granted `rwm` by runtimes).
pub fn granted(allows: &[Rule], num: DevNum) -> u8 {
    let bits = allows
        .iter()
        .filter(|r| r.covers(num))
        .fold(0, |acc, r| acc | r.access);
    if bits & (R | W) == 0 {
        RWM
    } else {
        bits
    }
}

/// `allows` without read and write of `bad`. `m` stays: runc and crun allow `c *:* m` and
/// `b *:* m` to every container after the spec's rules, so no spec can take it away.
/// A rule naming `bad` alone that is left with `m` only is dropped: it grants nothing
/// the runtime does not.
pub fn without(allows: Vec<Rule>, bad: DevNum) -> Result<Vec<Rule>, RuleError> {
    let mut left = subtract(allows, &Rule::exact(false, bad, R | W))?;
    left.retain(|r| !(r.access == M && *r == Rule::exact(true, bad, M)));
    Ok(left)
}

/// The full list: a deny-all, then `allows`.
pub fn to_values(allows: &[Rule]) -> Vec<Value> {
    let deny_all = Rule {
        allow: false,
        typ: None,
        major: None,
        minor: None,
        access: RWM,
    };
    std::iter::once(deny_all)
        .chain(allows.iter().copied())
        .map(Rule::to_value)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(major: u32, minor: u32) -> DevNum {
        DevNum {
            typ: DevType::Char,
            major,
            minor,
        }
    }

    #[test]
    fn parse_and_print_round_trip() {
        for v in [
            json!({"allow": false, "type": "a", "access": "rwm"}),
            json!({"allow": true, "type": "c", "major": 195, "access": "rw"}),
            json!({"allow": true, "type": "b", "major": 7, "minor": 1, "access": "m"}),
        ] {
            assert_eq!(Rule::parse(&v).unwrap().to_value(), v);
        }
        let r = Rule::parse(&json!({"allow": true, "major": -1, "minor": -1})).unwrap();
        assert_eq!(
            r.to_value(),
            json!({"allow": true, "type": "a", "access": "rwm"})
        );
        let e = Rule::parse(&json!({"type": "p"})).unwrap_err();
        assert_eq!(e, RuleError::UnknownType("p".into()));
        assert_eq!(e.to_string(), "unknown device type \"p\"");
        let e = Rule::parse(&json!({"access": "r\nx"})).unwrap_err();
        assert_eq!(e, RuleError::UnknownAccess('\n'));
        assert_eq!(e.to_string(), "unknown device access \"\\\\n\"");
        let e = Rule::parse(&json!({"major": 1u64 << 40})).unwrap_err();
        assert_eq!(e.to_string(), "device number 1099511627776 out of range");
        // crun's C int: 2^32 + 1 is 1, 2^31 a wildcard; systemd's 0 a wildcard
        for n in [4294967297i64, 2147483648, 4294967295, 1048576, -2] {
            let e = Rule::parse(&json!({"type": "c", "major": 195, "minor": n})).unwrap_err();
            assert_eq!(e, RuleError::OutOfRange(n));
        }
        let r = Rule::parse(&json!({"allow": true, "type": "c", "major": 0, "minor": 0})).unwrap();
        assert_eq!((r.major, r.minor), (None, None));
        let e = Rule::parse(&json!({"minor": "7"})).unwrap_err();
        assert_eq!(e.to_string(), "device number \"7\" is not an integer");
    }

    #[test]
    fn mknod_is_the_runtimes_to_give_and_stays() {
        let allows = vec![Rule::exact(true, c(10, 229), RWM)];
        let left = without(allows, c(10, 229)).unwrap();
        assert_eq!(left, []);
        let allows =
            vec![Rule::parse(&json!({"allow": true, "type": "c", "access": "m"})).unwrap()];
        let left = without(allows.clone(), c(10, 229)).unwrap();
        assert_eq!(left, allows);
        assert_eq!(granted(&left, c(10, 229)), RWM);
    }
}
