//! A `linux.resources.devices` rule's major and minor as every supported runtime reads
//! them (SECURITY.md, "What devgate assumes of each runtime's parser"). The spec's number
//! is a JSON integer read into an int64 by all of them (Go's encoding/json, libocispec's
//! `strtoll`, serde); what each then does with it differs:
//!
//! - runc (opencontainers/cgroups `devicefilter.go`): over MaxUint32 refused; negative a
//!   wildcard; else compared as an `int32` immediate, so 2^31..2^32-1 matches nothing.
//! - crun eBPF (cgroup v2, and its systemd driver's pinned program with bpffs;
//!   `create_dev_bpf`, `bpf_program_append_dev`): copied into a C `int`, the low 32 bits;
//!   negative there a wildcard, so 4294967297 is 1 and 2147483648 any.
//! - crun under systemd without bpffs (`append_device_allow`): the same `int`, and 0 or
//!   less (`IS_WILDCARD`) a wildcard: `c 0:0` is `char-*`, every char device.
//! - youki (`v2/devices/program.rs`): negative int64 a wildcard, else the low 32 bits as
//!   an `i32` immediate: like crun where those are positive, matching nothing elsewhere.
//! - cgroup v1 (runc, crun, youki write the number as text): the kernel refuses a negative
//!   one or one over 2^32-1, and takes 4294967295 (`~0`) as `*`.
//!
//! devgate's reading is the one they agree on: absent, `null` or -1 is any device, 0 to
//! the kernel's largest (4095, 1048575) that number. Every other number some runtime reads
//! as another device or a wildcard, so the rule is refused. And a major and minor each 0
//! or any are any (crun under systemd), the widest reading.

use super::device::{MAX_MAJOR, MAX_MINOR};
use std::fmt;

/// A rule number no two runtimes read alike: the field and the spec's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleNumberError {
    pub field: &'static str,
    pub value: i64,
}

impl fmt::Display for RuleNumberError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let max = if self.field == "major" {
            MAX_MAJOR
        } else {
            MAX_MINOR
        };
        write!(
            f,
            "{} {} is read apart by runtimes (crun keeps its low 32 bits as a C int, runc \
             refuses or matches nothing); a rule number is -1 (any) or 0-{max}",
            self.field, self.value
        )
    }
}

impl std::error::Error for RuleNumberError {}

fn one(field: &'static str, n: Option<i64>, max: i64) -> Result<Option<u32>, RuleNumberError> {
    match n {
        None | Some(-1) => Ok(None),
        Some(v) if (0..=max).contains(&v) => Ok(Some(v as u32)),
        Some(value) => Err(RuleNumberError { field, value }),
    }
}

/// A rule's major and minor, `None` for any: the widest reading any runtime takes, or
/// the number a runtime would read otherwise.
pub fn rule_numbers(
    major: Option<i64>,
    minor: Option<i64>,
) -> Result<(Option<u32>, Option<u32>), RuleNumberError> {
    let major = one("major", major, MAX_MAJOR)?;
    let minor = one("minor", minor, MAX_MINOR)?;
    // crun's DeviceAllow= (systemd, no bpffs): both 0-or-any is `char-*`/`block-*`.
    let loose = |n: Option<u32>| n.map_or(true, |n| n == 0);
    Ok(if loose(major) && loose(minor) {
        (None, None)
    } else {
        (major, minor)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_runtimes_agree_on_are_read_and_the_rest_refused() {
        assert_eq!(rule_numbers(Some(195), Some(1)), Ok((Some(195), Some(1))));
        assert_eq!(rule_numbers(None, Some(-1)), Ok((None, None)));
        assert_eq!(rule_numbers(Some(195), None), Ok((Some(195), None)));
        assert_eq!(rule_numbers(Some(8), Some(0)), Ok((Some(8), Some(0))));
        assert_eq!(rule_numbers(Some(0), Some(5)), Ok((Some(0), Some(5))));
        assert_eq!(rule_numbers(Some(4095), Some(1048575)).map(|_| ()), Ok(()));
        // crun under systemd: 0 is a wildcard, and both wildcards every device
        assert_eq!(rule_numbers(Some(0), Some(0)), Ok((None, None)));
        assert_eq!(rule_numbers(Some(0), None), Ok((None, None)));
        assert_eq!(rule_numbers(None, Some(0)), Ok((None, None)));
        for (major, minor, field, value) in [
            (195, 4294967297, "minor", 4294967297),
            (4294967491, 1, "major", 4294967491),
            (2147483843, 1, "major", 2147483843),
            (4294967295, 1, "major", 4294967295),
            (-2, 1, "major", -2),
            (4096, 1, "major", 4096),
            (195, 1048576, "minor", 1048576),
            (195, i64::MIN, "minor", i64::MIN),
        ] {
            assert_eq!(
                rule_numbers(Some(major), Some(minor)),
                Err(RuleNumberError { field, value })
            );
        }
        let e = rule_numbers(Some(195), Some(4294967297)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "minor 4294967297 is read apart by runtimes (crun keeps its low 32 bits as a C \
             int, runc refuses or matches nothing); a rule number is -1 (any) or 0-1048575"
        );
    }
}
