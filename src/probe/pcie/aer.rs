//! A PCI function's AER counter files (`aer_dev_correctable`, `aer_dev_nonfatal`,
//! `aer_dev_fatal`): outside input, read bounded and parsed in both kernel formats.

use crate::fsutil::read_attr;
use crate::store::pcie::AerCounts;
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
pub fn parse_aer(text: &str, total_key: &str) -> Result<u64, String> {
    let mut sum: u64 = 0;
    let mut seen = false;
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        if i >= MAX_AER_LINES {
            return Err(format!("more than {MAX_AER_LINES} lines"));
        }
        let line = line.trim();
        let Some((name, count)) = line.rsplit_once(|c: char| c.is_ascii_whitespace()) else {
            return Err(format!("unexpected line {:?}", shorten(line)));
        };
        let name = name.trim_end();
        if name.is_empty() {
            return Err(format!("unexpected line {:?}", shorten(line)));
        }
        let n: u64 = count
            .parse()
            .map_err(|_| format!("bad count {:?} for {:?}", shorten(count), shorten(name)))?;
        if name == total_key {
            return Ok(n);
        }
        sum = sum.saturating_add(n);
        seen = true;
    }
    if seen {
        Ok(sum)
    } else {
        Err("empty".into())
    }
}

/// A PCI function's three AER totals; None where the kernel reports no AER for it
/// (no `aer_dev_fatal`: AER not supported, or a kernel before 4.19). A file that is there
/// but cannot be read is an error, never a zero: a zero below the baseline reads as
/// counters that restarted (`rules`).
pub fn read_aer(pci: &Path) -> Option<Result<AerCounts, String>> {
    // Ok(None): the file is not there.
    let read = |file: &str| match read_attr(&pci.join(file)) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{file}: cannot read: {e}")),
    };
    let fatal = match read("aer_dev_fatal") {
        Ok(None) => return None,
        other => other,
    };
    let one = |file: &str, key: &str, text: Result<Option<String>, String>| match text? {
        None => Ok(0),
        Some(t) => parse_aer(&t, key).map_err(|e| format!("{file}: {e}")),
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
