//! One kernel log record: its header (`pri,seq,ts_usec[,flags…];`), parsed from bytes, and
//! the NVIDIA driver's record forms that count (a driver load, an XID report). The scanner
//! in `kmsg` calls these once per record, so the header parse allocates nothing and checks
//! no more than the form needs.

use super::pci::PciAddr;

/// A record's header, parsed from bytes: `pri,seq,ts_usec[,flags…];`, and where its
/// message starts.
pub(crate) struct Header {
    pub(crate) pri: u32,
    pub(crate) seq: u64,
    pub(crate) ts_usec: u64,
    pub(crate) msg: usize,
}

/// Decimal digits from `i`: the number and the index of the byte after them. No sign, no
/// spaces, no overflow (19 digits cannot overflow a u64; a 20th is checked, a 21st fails).
fn number(b: &[u8], start: usize) -> Option<(u64, usize)> {
    let digit = |i: usize| {
        b.get(i)
            .filter(|c| c.is_ascii_digit())
            .map(|c| u64::from(c - b'0'))
    };
    let mut n: u64 = 0;
    let mut i = start;
    while i - start < 19 {
        let Some(d) = digit(i) else { break };
        n = n * 10 + d;
        i += 1;
    }
    if let Some(d) = digit(i) {
        n = n.checked_mul(10)?.checked_add(d)?;
        i += 1;
        if digit(i).is_some() {
            return None;
        }
    }
    (i > start).then_some((n, i))
}

pub(crate) fn parse_header(b: &[u8]) -> Option<Header> {
    let (pri, i) = number(b, 0)?;
    let (seq, i) = number(b, next_after(b, i, b',')?)?;
    let (ts_usec, i) = number(b, next_after(b, i, b',')?)?;
    let msg = match b.get(i)? {
        b';' => i + 1,
        b',' => i + 1 + memchr::memchr(b';', &b[i + 1..])? + 1,
        _ => return None,
    };
    Some(Header {
        pri: u32::try_from(pri).ok()?,
        seq,
        ts_usec,
        msg,
    })
}

/// The index after `sep` when `b[i]` is `sep`.
fn next_after(b: &[u8], i: usize, sep: u8) -> Option<usize> {
    (*b.get(i)? == sep).then_some(i + 1)
}

/// `pri,seq,ts_usec,flags[,…];message`, as /dev/kmsg writes each record.
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// `facility << 3 | level`; facility 0 is the kernel's own.
    pub pri: u32,
    pub seq: u64,
    pub ts_usec: u64,
    pub msg: &'a str,
}

impl Record<'_> {
    /// A record the NVIDIA driver itself logged: kernel facility, message beginning with
    /// `NVRM: `. Userspace cannot log with facility 0 (the kernel turns a write to
    /// /dev/kmsg into LOG_USER), and a message that merely contains `NVRM: ` (a segfault
    /// report naming a binary, an OOM kill naming a command) does not begin with it.
    pub fn is_driver(&self) -> bool {
        self.pri >> 3 == 0 && self.msg.starts_with(DRIVER_TAG)
    }
}

pub(crate) const DRIVER_TAG: &str = "NVRM: ";

/// One record line, by the same header parser the scanner uses.
pub fn parse_record(line: &str) -> Option<Record<'_>> {
    let h = parse_header(line.as_bytes())?;
    Some(Record {
        pri: h.pri,
        seq: h.seq,
        ts_usec: h.ts_usec,
        // `;` is ASCII: the byte after it starts a character
        msg: line.get(h.msg..)?,
    })
}
/// `NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  …` or
/// `NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  …`, in full: the
/// tag, an architecture or `Open`, `Kernel Module`, then a version of digits and dots.
/// Only a driver record (`Record::is_driver`) is passed here.
pub fn is_driver_load(msg: &str) -> bool {
    let Some(rest) = msg.strip_prefix("NVRM: loading NVIDIA UNIX ") else {
        return false;
    };
    let Some((_, after)) = rest.split_once("Kernel Module") else {
        return false;
    };
    let after = after.trim_start();
    let after = after
        .strip_prefix("for ")
        .and_then(|a| a.split_once(' ').map(|(_, v)| v.trim_start()))
        .unwrap_or(after);
    let version: &str = after.split(' ').next().unwrap_or("");
    !version.is_empty()
        && version.bytes().any(|b| b.is_ascii_digit())
        && version.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

const MAX_TEXT: usize = 160;

/// A driver record that parses in full as an XID report:
/// `NVRM: Xid (PCI:DOMAIN:BUS:DEV[ GPU-I:n[ GPU-CI:n]]): N[, text]`.
/// Old drivers write the address without `PCI:`. Anything else is not an XID, whatever it
/// contains (`caused by previous Xid`, NVSwitch `SXid`, `_kgspLogXid119:`).
pub fn parse_xid(msg: &str) -> Option<(PciAddr, u32, String)> {
    let rest = msg.strip_prefix("NVRM: Xid (")?;
    let (inside, rest) = rest.split_once("): ")?;
    let mut parts = inside.split(' ');
    let addr = parts.next()?;
    let pci = PciAddr::parse_exact(addr.strip_prefix("PCI:").unwrap_or(addr))?;
    // MIG: ` GPU-I:n`, then optionally ` GPU-CI:n`, in that order and nothing more.
    for tag in ["GPU-I:", "GPU-CI:"] {
        match parts.next() {
            None => break,
            Some(p) => {
                let n = p.strip_prefix(tag)?;
                if n.is_empty() || n.len() > 4 || !n.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
            }
        }
    }
    if parts.next().is_some() {
        return None;
    }
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 6 {
        return None;
    }
    let xid: u32 = rest[..digits].parse().ok()?;
    let tail = &rest[digits..];
    if !(tail.is_empty() || tail.starts_with(',')) {
        return None;
    }
    let text = tail
        .trim_start_matches(',')
        .trim()
        .chars()
        .take(MAX_TEXT)
        .collect();
    Some((pci, xid, text))
}
