//! A PCI function's AER counter files (`aer_dev_correctable`, `aer_dev_nonfatal`,
//! `aer_dev_fatal`): outside input, read bounded and parsed in both kernel formats.

use crate::error::IoCause;
use crate::fsutil::read_attr;
use crate::store::pcie::AerCounts;
use std::fmt;
use std::path::Path;

/// An AER file has under 30 lines; more is not the kernel's.
const MAX_AER_LINES: usize = 64;

pub(super) fn shorten(s: &str) -> String {
    s.chars().take(64).collect()
}

/// One AER counter file: lines `NAME COUNT`, where NAME may hold spaces (kernels before
/// 5.x print `Receiver Error 2`, later ones `RxErr 2`, and `…_bit[N] 1` for unnamed bits),
/// ending with `TOTAL_ERR_COR` / `TOTAL_ERR_NONFATAL` / `TOTAL_ERR_FATAL`. The total is
/// the answer; without one, the lines are summed.
pub fn parse_aer(text: &str, total_key: &str) -> Result<u64, AerFault> {
    let mut sum: u64 = 0;
    let mut seen = false;
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        if i >= MAX_AER_LINES {
            return Err(AerFault::TooManyLines { max: MAX_AER_LINES });
        }
        let line = line.trim();
        let Some((name, count)) = line.rsplit_once(|c: char| c.is_ascii_whitespace()) else {
            return Err(AerFault::UnexpectedLine(shorten(line)));
        };
        let name = name.trim_end();
        if name.is_empty() {
            return Err(AerFault::UnexpectedLine(shorten(line)));
        }
        let n: u64 = count.parse().map_err(|_| AerFault::BadCount {
            count: shorten(count),
            name: shorten(name),
        })?;
        if name == total_key {
            return Ok(n);
        }
        sum = sum.saturating_add(n);
        seen = true;
    }
    if seen {
        Ok(sum)
    } else {
        Err(AerFault::Empty)
    }
}

/// What is wrong with the text of an AER counter file. Its pieces are shortened to 64
/// characters: the file is the kernel's, or whoever faked it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AerFault {
    /// More lines than any kernel prints (`max`).
    TooManyLines { max: usize },
    /// A line that is not `NAME COUNT`.
    UnexpectedLine(String),
    /// A count that is not a number.
    BadCount { count: String, name: String },
    /// No counter at all.
    Empty,
}

impl fmt::Display for AerFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AerFault::TooManyLines { max } => write!(f, "more than {max} lines"),
            AerFault::UnexpectedLine(l) => write!(f, "unexpected line {l:?}"),
            AerFault::BadCount { count, name } => write!(f, "bad count {count:?} for {name:?}"),
            AerFault::Empty => f.write_str("empty"),
        }
    }
}

impl std::error::Error for AerFault {}

/// Why a PCI function's AER counters could not be had: which file, and what failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AerError {
    Read { file: &'static str, source: IoCause },
    Parse { file: &'static str, fault: AerFault },
}

impl fmt::Display for AerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AerError::Read { file, source } => write!(f, "{file}: cannot read: {source}"),
            AerError::Parse { file, fault } => write!(f, "{file}: {fault}"),
        }
    }
}

impl std::error::Error for AerError {}

/// A PCI function's three AER totals; None where the kernel reports no AER for it
/// (no `aer_dev_fatal`: AER not supported, or a kernel before 4.19). A file that is there
/// but cannot be read is an error, never a zero: a zero below the baseline reads as
/// counters that restarted (`rules`).
pub fn read_aer(pci: &Path) -> Option<Result<AerCounts, AerError>> {
    // Ok(None): the file is not there.
    let read = |file: &'static str| match read_attr(&pci.join(file)) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(AerError::Read {
            file,
            source: e.into(),
        }),
    };
    let fatal = match read("aer_dev_fatal") {
        Ok(None) => return None,
        other => other,
    };
    let one = |file: &'static str, key: &str, text: Result<Option<String>, AerError>| match text? {
        None => Ok(0),
        Some(t) => parse_aer(&t, key).map_err(|fault| AerError::Parse { file, fault }),
    };
    let counts = (|| {
        Ok(AerCounts {
            fatal: one("aer_dev_fatal", "TOTAL_ERR_FATAL", fatal)?,
            nonfatal: one(
                "aer_dev_nonfatal",
                "TOTAL_ERR_NONFATAL",
                read("aer_dev_nonfatal"),
            )?,
            correctable: one(
                "aer_dev_correctable",
                "TOTAL_ERR_COR",
                read("aer_dev_correctable"),
            )?,
        })
    })();
    Some(counts)
}
