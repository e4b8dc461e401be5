//! Why devgate has no file of kubelet's to put a container's fault lines in: the
//! termination file (`termination`) or the container's log (`pod_log`). A leaf, so both
//! import it and neither imports the other for it.

use crate::error::IoCause;
use crate::oci::spec::AnnotationConflict;
use std::fmt;
use std::path::PathBuf;

/// Why kubelet's file for a container cannot be named: what the spec's CRI annotations
/// lack, or what the directory they name holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// containerd's key and CRI-O's disagree: one is the pod's own.
    Conflict(AnnotationConflict),
    /// No pod uid or no container name annotation.
    NoPodAnnotations,
    /// The pod uid or container name could not be a file name kubelet made.
    PodNamesNotPlain,
    /// No bind mount in the spec comes from kubelet's termination file in `dir`.
    NoTerminationMount { dir: PathBuf },
    /// Neither runtime's key for a path component (`keys`: containerd's, CRI-O's) is set.
    NoAnnotation { keys: (&'static str, &'static str) },
    /// The annotation under `key` could not be a file name kubelet made.
    NotPlainName { key: &'static str },
    /// The container's log directory could not be listed.
    CannotList { dir: PathBuf, source: IoCause },
    /// The container's log directory holds no `<n>.log`.
    NoAttempt { dir: PathBuf },
    /// CRI-O's log path annotation (`key`) is not a `<n>.log` in the directory kubelet
    /// made for the container.
    LogPathElsewhere { key: &'static str, dir: PathBuf },
}

impl From<AnnotationConflict> for TargetError {
    fn from(c: AnnotationConflict) -> Self {
        TargetError::Conflict(c)
    }
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetError::Conflict(c) => c.fmt(f),
            TargetError::NoPodAnnotations => {
                f.write_str("no CRI pod uid and container name annotations")
            }
            TargetError::PodNamesNotPlain => {
                f.write_str("the CRI pod uid or container name is not a plain file name")
            }
            TargetError::NoTerminationMount { dir } => write!(
                f,
                "no bind mount of kubelet's termination file in {}",
                dir.display()
            ),
            TargetError::NoAnnotation { keys } => {
                write!(f, "no {} or {} annotation", keys.0, keys.1)
            }
            TargetError::NotPlainName { key } => write!(f, "{key} is not a plain file name"),
            TargetError::CannotList { dir, source } => {
                write!(f, "cannot list {}: {source}", dir.display())
            }
            TargetError::NoAttempt { dir } => write!(f, "no <n>.log in {}", dir.display()),
            TargetError::LogPathElsewhere { key, dir } => write!(
                f,
                "{key} is not <n>.log in {} (the pod's own?)",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for TargetError {}
