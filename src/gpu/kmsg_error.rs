//! Why the kernel log could not be read (`kmsg`), and why the XID history kept from it was
//! not used (`xid_history`). A leaf, so both take it and neither imports the other for it.

use crate::error::{Error, IoCause};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Why the kernel log could not be read: the step that failed on the log at `path`, and
/// the system's answer. Every GPU's XID check is unknown for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsgError {
    pub step: KmsgStep,
    pub path: PathBuf,
    pub source: IoCause,
}

/// The system call on the kernel log that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KmsgStep {
    Open,
    Stat,
    Read,
    Seek,
}

impl KmsgError {
    pub(crate) fn new(step: KmsgStep, path: &Path, source: io::Error) -> KmsgError {
        KmsgError {
            step,
            path: path.to_path_buf(),
            source: source.into(),
        }
    }
}

impl fmt::Display for KmsgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.step {
            KmsgStep::Open => "open",
            KmsgStep::Stat => "stat",
            KmsgStep::Read => "read",
            KmsgStep::Seek => "seek",
        };
        write!(
            f,
            "cannot {verb} kernel log {}: {}",
            self.path.display(),
            self.source
        )
    }
}

impl std::error::Error for KmsgError {}

/// Why the XID history file is not used: it is ignored, with a warning, and rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    Stat(IoCause),
    /// Not a regular file of this process's user (`euid`) with mode 0600.
    NotPrivate {
        euid: u32,
        uid: u32,
        mode: u32,
    },
    Read(Error),
    /// Not JSON of the history's shape: serde_json's words.
    Json(String),
    /// A document no scan writes (another version, a bound exceeded, events out of order).
    Inconsistent {
        version: u32,
    },
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::Stat(e) => e.fmt(f),
            CacheError::NotPrivate { euid, uid, mode } => write!(
                f,
                "not a regular file of uid {euid} with mode 0600 (uid {uid}, mode {mode:o})"
            ),
            CacheError::Read(e) => e.fmt(f),
            CacheError::Json(e) => f.write_str(e),
            CacheError::Inconsistent { version } => write!(
                f,
                "version {version} or its contents are not what a scan writes"
            ),
        }
    }
}

impl std::error::Error for CacheError {}
