//! Why a device cgroup cannot be found, checked or edited: the container's cgroup
//! ([`LocateError`]: the layout, the lookup, the path check), the device rules
//! ([`RuleError`]: a rule no program takes, a v1 list that did not change) and the
//! kernel's eBPF programs ([`ProgramError`]). A leaf, so `cgroup`, `path`, `v1`, `bpf` and
//! `v2` all take it. Where a failure crosses into [`crate::error::Error`], it is the
//! message of an `Invalid` naming the cgroup.

use crate::error::IoCause;
use crate::model::device::{DevNum, DevType};
use std::fmt;
use std::path::PathBuf;

/// Why the container's device cgroup cannot be found, or is not the container's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocateError {
    /// `root` (/sys/fs/cgroup) is neither cgroup2 nor a tmpfs of v1 hierarchies.
    NotCgroupFs { root: &'static str, fs_type: i64 },
    /// /proc/PID/cgroup has no `0::` line.
    NoCgroup2Line,
    /// No cgroup2 hierarchy is mounted at `root`.
    NoCgroup2Mount { root: &'static str },
    /// /proc/PID/cgroup has no v1 devices line.
    NoDevicesLine,
    /// The process has a v1 devices cgroup, and no devices controller is mounted.
    NoDevicesMount,
    /// The process's cgroup is not below the hierarchy's mount (`mount`, its `root`).
    NotUnderMount {
        cgroup: String,
        mount: PathBuf,
        root: String,
    },
    /// The process is in the hierarchy's root cgroup, which holds every process.
    RootCgroup { cgroup: String, mount: PathBuf },
    /// The process's cgroup path has a `..` component.
    DotDot { cgroup: String },
    /// The process's cgroup is not where the spec puts the container.
    Misplaced { cgroup: String, spec: SpecPlace },
}

/// Where a spec puts a container's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecPlace {
    /// Its `cgroupsPath`, and the cgroups systemd makes of it (none: not a systemd one).
    CgroupsPath { path: String, systemd: Vec<String> },
    /// No `cgroupsPath`: a cgroup named after the container id.
    NoPath { id: String },
}

impl fmt::Display for LocateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocateError::NotCgroupFs { root, fs_type } => write!(
                f,
                "{root} is neither cgroup2 nor a tmpfs of v1 hierarchies (filesystem type \
                 {fs_type:#x})"
            ),
            LocateError::NoCgroup2Line => {
                f.write_str("the process has no cgroup2 cgroup (no 0:: line)")
            }
            LocateError::NoCgroup2Mount { root } => {
                write!(f, "no cgroup2 hierarchy is mounted at {root}")
            }
            LocateError::NoDevicesLine => f.write_str("the process has no v1 devices cgroup"),
            LocateError::NoDevicesMount => f.write_str(
                "the process is in a v1 devices cgroup but no devices controller is mounted",
            ),
            LocateError::NotUnderMount {
                cgroup,
                mount,
                root,
            } => write!(
                f,
                "cgroup {cgroup:?} is not under the mount {} (root {root})",
                mount.display()
            ),
            LocateError::RootCgroup { cgroup, mount } => write!(
                f,
                "the process is in the root cgroup {cgroup:?} of {}; devgate never edits the \
                 root cgroup",
                mount.display()
            ),
            LocateError::DotDot { cgroup } => write!(f, "cgroup {cgroup:?} has a '..' component"),
            LocateError::Misplaced { cgroup, spec } => write!(
                f,
                "the container's process is in cgroup {cgroup:?}, not where its spec puts it \
                 ({spec}); its pid may belong to another process now"
            ),
        }
    }
}

impl std::error::Error for LocateError {}

impl fmt::Display for SpecPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecPlace::CgroupsPath { path, systemd } if systemd.is_empty() => {
                write!(f, "cgroupsPath {path:?}")
            }
            SpecPlace::CgroupsPath { path, systemd } => {
                write!(f, "cgroupsPath {path:?}, that is {}", systemd.join(" or "))
            }
            SpecPlace::NoPath { id } => {
                write!(
                    f,
                    "no cgroupsPath: a cgroup named after the container id {id:?}"
                )
            }
        }
    }
}

/// What is wrong with device rules: one no program can take, or a v1 list that does not
/// say what a remap wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleError {
    /// A rule's access holds a letter that is not r, w or m.
    UnknownAccess { access: String, letter: char },
    /// A rule's major or minor (`what`) is beyond any device's.
    OutOfRange { what: &'static str, n: i64 },
    /// After a remap, devices.list still lets the container open `bad`, by this rule.
    StillAllowed { bad: DevNum, rule: ListRule },
    /// After a remap, devices.list does not let the container read and write `spare`.
    SpareNotAllowed { spare: DevNum },
}

/// A devices.list line: a wildcard is None.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRule {
    pub typ: Option<DevType>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub access: String,
}

impl fmt::Display for ListRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let star = |n: Option<u32>| n.map_or("*".to_string(), |n| n.to_string());
        write!(
            f,
            "{} {}:{} {}",
            self.typ.map_or('a', |t| t.letter()),
            star(self.major),
            star(self.minor),
            self.access
        )
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleError::UnknownAccess { access, letter } => write!(
                f,
                "device rule access {access:?}: unknown access {letter:?}"
            ),
            RuleError::OutOfRange { what, n } => write!(f, "device rule {what} {n} out of range"),
            RuleError::StillAllowed { bad, rule } => write!(
                f,
                "{} {bad} is still allowed by the rule {rule}",
                bad.typ.letter()
            ),
            RuleError::SpareNotAllowed { spare } => write!(
                f,
                "{} {spare} is not allowed for read and write",
                spare.typ.letter()
            ),
        }
    }
}

impl std::error::Error for RuleError {}

/// Why the kernel would not load a device program, or an attached one cannot be copied
/// into a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramError {
    /// The kernel refused a program of `insns` instructions; the verifier's last lines,
    /// where it wrote any.
    Load {
        insns: usize,
        source: IoCause,
        verifier: Option<String>,
    },
    /// BPF_OBJ_GET_INFO_BY_FD failed on an attached program.
    Info(IoCause),
    /// The program uses maps, which a copy would not have.
    UsesMaps(u32),
    /// The kernel gives no instructions of the program, or more than any has.
    InstructionBytes(u32),
    /// The program's instructions changed between two reads.
    InstructionsChanged,
    /// The kernel returned no instructions.
    NoInstructions,
    /// Instruction `at` is a call, which a copy cannot make.
    Call { at: usize },
    /// Instruction `at` loads a map or object reference.
    ObjectReference { at: usize },
}

impl fmt::Display for ProgramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramError::Load {
                insns,
                source,
                verifier,
            } => {
                write!(
                    f,
                    "BPF_PROG_LOAD of a {insns}-instruction device program: {source}"
                )?;
                match verifier {
                    Some(v) => write!(f, ": verifier: {v}"),
                    None => Ok(()),
                }
            }
            ProgramError::Info(e) => write!(f, "BPF_OBJ_GET_INFO_BY_FD: {e}"),
            ProgramError::UsesMaps(n) => write!(f, "it uses {n} map(s)"),
            ProgramError::InstructionBytes(n) => {
                write!(f, "the kernel gives {n} bytes of its instructions")
            }
            ProgramError::InstructionsChanged => f.write_str("its instructions changed while read"),
            ProgramError::NoInstructions => f.write_str("the kernel returned no instructions"),
            ProgramError::Call { at } => write!(f, "instruction {at} is a call"),
            ProgramError::ObjectReference { at } => {
                write!(f, "instruction {at} loads a map or object reference")
            }
        }
    }
}

impl std::error::Error for ProgramError {}
