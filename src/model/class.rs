//! The device class table: data, not code. A class names what kind of device a node is
//! (`nvidia-gpu`, `block`, ...) and is what policy is written against. The built-in table
//! covers the accelerators and fabrics devgate knows; `device_classes` in the config adds
//! more rules, which are tried before the built-in ones.

use crate::model::devtype::DevType;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;

/// What kind of device a node is. The kinds devgate's code acts on are variants; every
/// other class (the rest of the built-in table, an operator's `device_classes`) is
/// `Named`. On the wire and in the config a class is its name: `nvidia-gpu`, `char`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Class {
    /// A char device no rule names.
    Char,
    /// A block device no rule names.
    Block,
    NvidiaGpu,
    NvidiaCtl,
    NvidiaUvm,
    NvidiaCaps,
    Named(String),
}

impl Class {
    pub fn as_str(&self) -> &str {
        match self {
            Class::Char => "char",
            Class::Block => "block",
            Class::NvidiaGpu => "nvidia-gpu",
            Class::NvidiaCtl => "nvidia-ctl",
            Class::NvidiaUvm => "nvidia-uvm",
            Class::NvidiaCaps => "nvidia-caps",
            Class::Named(n) => n,
        }
    }

    /// A class of the NVIDIA driver's nodes: a container with one gets the GPU probes
    /// (NVML, XID).
    pub(crate) fn is_nvidia(&self) -> bool {
        matches!(
            self,
            Class::NvidiaGpu | Class::NvidiaCtl | Class::NvidiaUvm | Class::NvidiaCaps
        )
    }

    /// A class some rule names, not the `char` / `block` fallback.
    pub(crate) fn is_known(&self) -> bool {
        !matches!(self, Class::Char | Class::Block)
    }
}

impl From<&str> for Class {
    fn from(s: &str) -> Class {
        match s {
            "char" => Class::Char,
            "block" => Class::Block,
            "nvidia-gpu" => Class::NvidiaGpu,
            "nvidia-ctl" => Class::NvidiaCtl,
            "nvidia-uvm" => Class::NvidiaUvm,
            "nvidia-caps" => Class::NvidiaCaps,
            other => Class::Named(other.to_string()),
        }
    }
}

impl From<String> for Class {
    fn from(s: String) -> Class {
        Class::from(s.as_str())
    }
}

impl From<Class> for String {
    fn from(c: Class) -> String {
        c.as_str().to_string()
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // pad, not write_str: a table's `{:<12}` lines up only if Display honours it
        f.pad(self.as_str())
    }
}

impl PartialEq<&str> for Class {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// One rule: a device is of `class` when its type matches and either its major:minor falls
/// in the rule's range or its path matches the rule's pattern (for drivers whose major is
/// assigned at load time, such as nvidia-uvm).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClassRule {
    pub class: Class,
    #[serde(rename = "type", default = "default_char")]
    pub typ: DevType,
    #[serde(default)]
    pub major: Option<u32>,
    /// Inclusive range; absent means every minor of `major`.
    #[serde(default)]
    pub minors: Option<[u32; 2]>,
    /// A path such as `/dev/nvidia{N}`: `{N}` stands for a decimal number that is also the
    /// minor, which lets devgate guess a rule-only device's node name.
    #[serde(default)]
    pub path: Option<String>,
    /// Accelerator classes are listed by `devgate status` even when no container uses them.
    #[serde(default)]
    pub accelerator: bool,
}

fn default_char() -> DevType {
    DevType::Char
}

fn rule(
    class: &str,
    major: Option<u32>,
    minors: Option<[u32; 2]>,
    path: Option<&str>,
    accelerator: bool,
) -> ClassRule {
    ClassRule {
        class: Class::from(class),
        typ: DevType::Char,
        major,
        minors,
        path: path.map(str::to_string),
        accelerator,
    }
}

/// NVIDIA's fixed char major: GPUs, nvidiactl and nvidia-modeset.
pub(crate) const NVIDIA_MAJOR: u32 = 195;

/// The built-in table. NVIDIA's char major is fixed at 195: minors 0–253 are GPUs,
/// 254 is nvidia-modeset and 255 nvidiactl. nvidia-uvm and nvidia-caps get a major at load
/// time, so they are known by path.
pub fn builtin() -> Vec<ClassRule> {
    vec![
        rule("nvidia-ctl", Some(195), Some([254, 255]), None, false),
        rule(
            "nvidia-gpu",
            Some(195),
            Some([0, 253]),
            Some("/dev/nvidia{N}"),
            true,
        ),
        rule("nvidia-uvm", None, None, Some("/dev/nvidia-uvm"), false),
        rule(
            "nvidia-uvm",
            None,
            None,
            Some("/dev/nvidia-uvm-tools"),
            false,
        ),
        rule(
            "nvidia-caps",
            None,
            None,
            Some("/dev/nvidia-caps/nvidia-cap{N}"),
            false,
        ),
        rule("dri", Some(226), None, Some("/dev/dri/card{N}"), true),
        rule(
            "rdma",
            Some(231),
            None,
            Some("/dev/infiniband/uverbs{N}"),
            true,
        ),
        rule("vfio", None, None, Some("/dev/vfio/{N}"), true),
        rule("amd-kfd", None, None, Some("/dev/kfd"), true),
        rule("accel", None, None, Some("/dev/accel/accel{N}"), true),
    ]
}

/// The class of a device, from the first matching rule; otherwise `char` or `block`.
pub(crate) fn classify(
    rules: &[ClassRule],
    typ: DevType,
    major: u32,
    minor: u32,
    paths: &[&Path],
) -> Class {
    // The paths as text, made once at the first rule that matches by path rather than
    // for every rule (a UTF-8 check per path per rule was a third of this function).
    let mut texts: Option<Vec<&str>> = None;
    for r in rules {
        if r.typ != typ {
            continue;
        }
        let by_number = r.major == Some(major)
            && r.minors
                .map(|[lo, hi]| (lo..=hi).contains(&minor))
                .unwrap_or(true);
        let by_path = r.major.is_none()
            && r.path.as_deref().is_some_and(|pat| {
                texts
                    .get_or_insert_with(|| paths.iter().filter_map(|p| p.to_str()).collect())
                    .iter()
                    .any(|p| text_matches(pat, p))
            });
        if by_number || by_path {
            return r.class.clone();
        }
    }
    match typ {
        DevType::Char => Class::Char,
        DevType::Block => Class::Block,
    }
}

#[cfg(test)]
pub fn rule_for<'a>(rules: &'a [ClassRule], class: &str) -> Option<&'a ClassRule> {
    rules.iter().find(|r| r.class == class)
}

/// `/dev/nvidia{N}` matches `/dev/nvidia12` but not `/dev/nvidiactl`.
pub fn path_matches(pattern: &str, path: &Path) -> bool {
    path.to_str().is_some_and(|p| text_matches(pattern, p))
}

/// [`path_matches`] on a path already checked to be text.
fn text_matches(pattern: &str, path: &str) -> bool {
    // Every device is tried against every rule: a plain scan of these short patterns
    // costs less than setting up str's substring searcher.
    let split = pattern
        .as_bytes()
        .windows(3)
        .position(|w| w == b"{N}")
        .map(|i| (&pattern[..i], &pattern[i + 3..]));
    match split {
        None => pattern == path,
        Some((prefix, suffix)) => path
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
            .is_some_and(|n| {
                !n.is_empty() && n.len() <= 10 && n.bytes().all(|b| b.is_ascii_digit())
            }),
    }
}

/// The node path a rule suggests for a minor (`/dev/nvidia{N}` → `/dev/nvidia3`).
pub fn node_for_minor(rule: &ClassRule, minor: u32) -> Option<String> {
    let pat = rule.path.as_deref()?;
    pat.contains("{N}")
        .then(|| pat.replace("{N}", &minor.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cls(typ: DevType, major: u32, minor: u32, path: &str) -> String {
        classify(&builtin(), typ, major, minor, &[Path::new(path)]).to_string()
    }

    #[test]
    fn nvidia_numbers_and_paths() {
        assert_eq!(cls(DevType::Char, 195, 0, "/dev/nvidia0"), "nvidia-gpu");
        assert_eq!(cls(DevType::Char, 195, 7, "/dev/gpu-renamed"), "nvidia-gpu");
        assert_eq!(cls(DevType::Char, 195, 255, "/dev/nvidiactl"), "nvidia-ctl");
        assert_eq!(
            cls(DevType::Char, 195, 254, "/dev/nvidia-modeset"),
            "nvidia-ctl"
        );
        assert_eq!(cls(DevType::Char, 508, 0, "/dev/nvidia-uvm"), "nvidia-uvm");
        assert_eq!(
            cls(DevType::Char, 509, 1, "/dev/nvidia-caps/nvidia-cap1"),
            "nvidia-caps"
        );
    }

    #[test]
    fn fallbacks_by_type() {
        assert_eq!(cls(DevType::Char, 1, 5, "/dev/zero"), "char");
        assert_eq!(cls(DevType::Block, 8, 0, "/dev/sda"), "block");
        // a block device on major 195 is not a GPU
        assert_eq!(cls(DevType::Block, 195, 0, "/dev/nvidia0"), "block");
    }

    #[test]
    fn extra_rules_come_first() {
        let mut rules = vec![ClassRule {
            class: "fpga".into(),
            typ: DevType::Char,
            major: Some(240),
            minors: None,
            path: None,
            accelerator: true,
        }];
        rules.extend(builtin());
        assert_eq!(classify(&rules, DevType::Char, 240, 3, &[]), "fpga");
    }

    #[test]
    fn pattern_matching() {
        assert!(path_matches("/dev/nvidia{N}", Path::new("/dev/nvidia12")));
        assert!(!path_matches("/dev/nvidia{N}", Path::new("/dev/nvidiactl")));
        assert!(!path_matches("/dev/nvidia{N}", Path::new("/dev/nvidia")));
        assert!(path_matches("/dev/kfd", Path::new("/dev/kfd")));
        let r = rule_for(&builtin(), "nvidia-gpu").unwrap().clone();
        assert_eq!(node_for_minor(&r, 3).as_deref(), Some("/dev/nvidia3"));
    }
}
