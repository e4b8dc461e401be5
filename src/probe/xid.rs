//! The XID probe: the NVIDIA driver's error reports in the kernel log.
//!
//! The driver logs `NVRM: Xid (PCI:0000:3b:00): 79, pid=…, GPU has fallen off the bus.`
//! for every error it sees. devgate reads the log once per hook call (`kmsg_path`,
//! non-blocking and bounded), keeps the XID records and the driver's load records, and
//! judges each GPU by the XIDs reported for its PCI address since the driver last loaded.
//!
//! "Until the GPU was reset after the event" is decided from the log alone:
//! - the kernel log is per boot (its timestamps count from boot), so a reboot clears
//!   every report;
//! - a driver load (`NVRM: loading NVIDIA UNIX … Kernel Module`) re-initialises every GPU,
//!   so reports logged before the newest load record no longer count.
//!
//! A GPU reset with `nvidia-smi -r` under a loaded driver logs nothing devgate can rely on;
//! README.md (GPUs: NVML and XID reports) says how an operator clears a report then.

use super::{Probe, Verdict};
use crate::class::NVIDIA_GPU;
use crate::device::Device;
use crate::probe::nvml::Snapshot;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// A PCI function's address. The XID line names domain:bus:device (no function); NVML
/// writes `00000000:3B:00.0`; both name the same GPU, so they compare by slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PciAddr {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: Option<u8>,
}

impl PciAddr {
    /// `0000:3b:00`, `0000:3b:00.0`, `00000000:3B:00.0` or `3b:00.0`.
    pub fn parse(s: &str) -> Option<PciAddr> {
        let s = s.trim();
        let parts: Vec<&str> = s.split(':').collect();
        let (domain, bus, rest) = match parts.as_slice() {
            [d, b, r] => (hex(d, 8)?, *b, *r),
            [b, r] => (0, *b, *r),
            _ => return None,
        };
        let (dev, func) = match rest.split_once('.') {
            Some((d, f)) => (d, Some(f)),
            None => (rest, None),
        };
        let device = hex(dev, 2)?;
        let function = match func {
            Some(f) => Some(u8::try_from(hex(f, 1)?).ok()?),
            None => None,
        };
        if device > 0x1f || function.is_some_and(|f| f > 7) {
            return None;
        }
        Some(PciAddr {
            domain,
            bus: u8::try_from(hex(bus, 2)?).ok()?,
            device: device as u8,
            function,
        })
    }

    /// The driver's own form in an XID line: `DDDD:BB:DD` (domain 4 or 8 hex digits), or
    /// the legacy `BB:DD`-less-domain forms old drivers wrote; no function, no spaces.
    pub fn parse_exact(s: &str) -> Option<PciAddr> {
        if s.contains('.') || s.bytes().any(|b| b.is_ascii_whitespace()) {
            return None;
        }
        let a = PciAddr::parse(s)?;
        let parts: Vec<&str> = s.split(':').collect();
        let widths_ok = match parts.as_slice() {
            [d, b, v] => (d.len() == 4 || d.len() == 8) && b.len() == 2 && v.len() == 2,
            [b, v] => b.len() == 2 && v.len() == 2,
            _ => false,
        };
        widths_ok.then_some(a)
    }

    pub fn same_slot(&self, other: &PciAddr) -> bool {
        (self.domain, self.bus, self.device) == (other.domain, other.bus, other.device)
    }
}

fn hex(s: &str, max_digits: usize) -> Option<u32> {
    if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )?;
        if let Some(func) = self.function {
            write!(f, ".{func}")?;
        }
        Ok(())
    }
}

/// One XID report from the kernel log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct XidEvent {
    /// The kernel log's record sequence number: increases by one per record, per boot.
    pub seq: u64,
    /// Microseconds since boot.
    pub ts_usec: u64,
    pub pci: PciAddr,
    pub xid: u32,
    /// The rest of the driver's line, shortened.
    pub text: String,
}

/// Bounds on one read of the kernel log. The kernel's ring buffer is at most 32 MiB
/// (CONFIG_LOG_BUF_SHIFT ≤ 25); the defaults cover it.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    pub max_bytes: u64,
    pub max_records: usize,
    /// Longer lines are skipped whole; the kernel's own records are at most 8 KiB.
    pub max_line: usize,
    pub max_events: usize,
    pub deadline: Duration,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            max_bytes: 32 << 20,
            max_records: 1 << 20,
            max_line: 16 << 10,
            max_events: 4096,
            deadline: Duration::from_secs(2),
        }
    }
}

/// What one read of the kernel log found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KmsgScan {
    /// The newest `max_events` XID reports, oldest first.
    pub events: Vec<XidEvent>,
    /// The sequence number of the newest NVIDIA driver load record.
    pub last_driver_load: Option<u64>,
    /// The newest record's sequence number: where a later reader (poststop) can start.
    pub last_seq: Option<u64>,
    pub records: usize,
    /// Lines that were not kernel log records, or too long to be.
    pub skipped: usize,
    /// Records the kernel overwrote while devgate read (EPIPE).
    pub overwritten: usize,
    /// A limit stopped the read before the end of the log.
    pub truncated: bool,
}

impl KmsgScan {
    /// Reports that still count: those after the newest driver load.
    pub fn active(&self) -> impl Iterator<Item = &XidEvent> {
        let after = self.last_driver_load;
        self.events.iter().filter(move |e| match after {
            Some(load) => e.seq > load,
            None => true,
        })
    }
}

/// Splits a byte stream into lines, bounded, and parses each as a kernel log record.
struct Scanner {
    limits: ReadLimits,
    carry: Vec<u8>,
    /// Inside a line longer than `max_line`: drop bytes up to its newline.
    overlong: bool,
    bytes: u64,
    events: VecDeque<XidEvent>,
    scan: KmsgScan,
}

impl Scanner {
    fn new(limits: ReadLimits) -> Scanner {
        Scanner {
            limits,
            carry: Vec::new(),
            overlong: false,
            bytes: 0,
            events: VecDeque::new(),
            scan: KmsgScan::default(),
        }
    }

    /// False when a limit says stop.
    fn feed(&mut self, mut chunk: &[u8]) -> bool {
        self.bytes += chunk.len() as u64;
        while !chunk.is_empty() {
            let (line, rest, complete) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                None => (chunk, &[][..], false),
            };
            chunk = rest;
            if !self.overlong {
                if self.carry.len() + line.len() > self.limits.max_line {
                    self.overlong = true;
                    self.carry.clear();
                    self.scan.skipped += 1;
                } else {
                    self.carry.extend_from_slice(line);
                }
            }
            if complete {
                if !self.overlong {
                    let l = std::mem::take(&mut self.carry);
                    self.line(&l);
                }
                self.overlong = false;
                if self.scan.records >= self.limits.max_records {
                    self.scan.truncated = true;
                    return false;
                }
            }
        }
        if self.bytes >= self.limits.max_bytes {
            self.scan.truncated = true;
            return false;
        }
        true
    }

    fn line(&mut self, line: &[u8]) {
        // Continuation lines (` KEY=value`) carry a record's dictionary; not records.
        if line.is_empty() || line[0] == b' ' {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let Some(rec) = parse_record(&text) else {
            self.scan.skipped += 1;
            return;
        };
        self.scan.records += 1;
        self.scan.last_seq = Some(rec.seq);
        // Only the driver's own records are parsed further (and only they cost more).
        if !rec.is_driver() {
            return;
        }
        if is_driver_load(rec.msg) {
            self.scan.last_driver_load = Some(rec.seq);
        }
        if let Some((pci, xid, text)) = parse_xid(rec.msg) {
            if self.events.len() >= self.limits.max_events {
                self.events.pop_front();
            }
            self.events.push_back(XidEvent {
                seq: rec.seq,
                ts_usec: rec.ts_usec,
                pci,
                xid,
                text,
            });
        }
    }

    fn finish(mut self) -> KmsgScan {
        // A final line without its newline: a file may simply lack the last newline, and a
        // truncated XID line fails to parse as one anyway.
        if !self.overlong && !self.carry.is_empty() {
            let l = std::mem::take(&mut self.carry);
            self.line(&l);
        }
        self.scan.events = self.events.into();
        self.scan
    }
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

const DRIVER_TAG: &str = "NVRM: ";

pub fn parse_record(line: &str) -> Option<Record<'_>> {
    let (prefix, msg) = line.split_once(';')?;
    let mut f = prefix.split(',');
    let pri: u32 = f.next()?.parse().ok()?;
    let seq: u64 = f.next()?.parse().ok()?;
    let ts_usec: u64 = f.next()?.parse().ok()?;
    Some(Record {
        pri,
        seq,
        ts_usec,
        msg,
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

/// Reads the kernel log at `path` from its oldest record to its end, without blocking.
/// /dev/kmsg returns one record per read() and EAGAIN at the end; EPIPE means the kernel
/// overwrote records since the last read, and reading goes on. A regular file (a fixture,
/// a saved log) is read the same way.
pub fn read_kmsg(path: &Path, limits: ReadLimits) -> Result<KmsgScan, String> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open kernel log {}: {e}", path.display()))?;
    let started = Instant::now();
    let mut scanner = Scanner::new(limits);
    // Larger than the kernel's largest record, or /dev/kmsg answers EINVAL.
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if started.elapsed() > limits.deadline {
            scanner.scan.truncated = true;
            break;
        }
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if !scanner.feed(&buf[..n]) {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => scanner.scan.overwritten += 1,
            Err(e) => return Err(format!("cannot read kernel log {}: {e}", path.display())),
        }
    }
    Ok(scanner.finish())
}

/// `read_kmsg` for callers that want the XID reports only.
pub fn read_xids(path: &Path, limits: ReadLimits) -> Result<Vec<XidEvent>, String> {
    read_kmsg(path, limits).map(|s| s.events)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XidAction {
    /// The GPU needs a reset or the node a reboot: unhealthy until the driver reloads.
    Unhealthy,
    /// Reported, never blocking.
    Warn,
    /// An application's own fault; the GPU is fine.
    Ignore,
}

/// The built-in table. The reset/reboot class follows NVIDIA's XID catalogue; the ignored
/// ones are the application XIDs NVIDIA's k8s device plugin also ignores. An XID not listed
/// is a warning: new driver versions add XIDs, and an unknown one should be seen, not block.
pub const XID_TABLE: &[(u32, XidAction, &str)] = &[
    (13, XidAction::Ignore, "graphics engine exception"),
    (31, XidAction::Ignore, "GPU memory page fault"),
    (43, XidAction::Ignore, "GPU stopped processing"),
    (45, XidAction::Ignore, "preemptive cleanup"),
    (68, XidAction::Ignore, "video processor exception"),
    (109, XidAction::Ignore, "context switch timeout"),
    (48, XidAction::Unhealthy, "double-bit ECC error"),
    (62, XidAction::Unhealthy, "internal micro-controller halt"),
    (
        63,
        XidAction::Unhealthy,
        "row remapping or page retirement event",
    ),
    (
        64,
        XidAction::Unhealthy,
        "row remapping or page retirement failure",
    ),
    (74, XidAction::Unhealthy, "NVLink error"),
    (79, XidAction::Unhealthy, "GPU has fallen off the bus"),
    (92, XidAction::Unhealthy, "high single-bit ECC error rate"),
    (94, XidAction::Unhealthy, "contained ECC error"),
    (95, XidAction::Unhealthy, "uncontained ECC error"),
    (119, XidAction::Unhealthy, "GSP RPC timeout"),
    (120, XidAction::Unhealthy, "GSP error"),
    (140, XidAction::Unhealthy, "unrecovered ECC error"),
];

/// The built-in table with the operator's `gpu.xid_actions` over it.
#[derive(Debug, Clone, Default)]
pub struct XidTable {
    overrides: BTreeMap<u32, XidAction>,
}

impl XidTable {
    /// Keys are XID numbers as strings, values `unhealthy`, `warn` or `ignore`.
    pub fn new(overrides: &BTreeMap<String, String>) -> Result<XidTable, String> {
        let mut t = XidTable::default();
        for (k, v) in overrides {
            let xid: u32 = k
                .trim()
                .parse()
                .map_err(|_| format!("gpu.xid_actions: {k:?} is not an XID number"))?;
            let action = match v.as_str() {
                "unhealthy" => XidAction::Unhealthy,
                "warn" => XidAction::Warn,
                "ignore" => XidAction::Ignore,
                other => {
                    return Err(format!(
                        "gpu.xid_actions.{k}: {other:?} is not one of unhealthy, warn, ignore"
                    ))
                }
            };
            t.overrides.insert(xid, action);
        }
        Ok(t)
    }

    pub fn action(&self, xid: u32) -> XidAction {
        if let Some(a) = self.overrides.get(&xid) {
            return *a;
        }
        XID_TABLE
            .iter()
            .find(|(x, _, _)| *x == xid)
            .map(|(_, a, _)| *a)
            .unwrap_or(XidAction::Warn)
    }
}

pub fn describe_xid(xid: u32) -> Option<&'static str> {
    XID_TABLE
        .iter()
        .find(|(x, _, _)| *x == xid)
        .map(|(_, _, d)| *d)
}

/// Judges one GPU by the reports that still count for its slot. Pure.
pub fn evaluate<'a>(
    events: impl Iterator<Item = &'a XidEvent>,
    pci: &PciAddr,
    table: &XidTable,
) -> Verdict {
    // xid → (count, newest report)
    let mut seen: BTreeMap<u32, (usize, &XidEvent)> = BTreeMap::new();
    for e in events.filter(|e| e.pci.same_slot(pci)) {
        if table.action(e.xid) == XidAction::Ignore {
            continue;
        }
        let entry = seen.entry(e.xid).or_insert((0, e));
        entry.0 += 1;
        entry.1 = e;
    }
    let mut findings = Vec::new();
    for (xid, (count, last)) in &seen {
        let what = describe_xid(*xid)
            .map(|d| format!("xid {xid} ({d})"))
            .unwrap_or_else(|| format!("xid {xid}"));
        let reason = format!(
            "{what} on {} reported {count} time{} since the driver loaded, last at {}.{:06} s after boot (kmsg seq {}): {:?}",
            last.pci,
            if *count == 1 { "" } else { "s" },
            last.ts_usec / 1_000_000,
            last.ts_usec % 1_000_000,
            last.seq,
            last.text
        );
        findings.push(match table.action(*xid) {
            XidAction::Unhealthy => {
                Verdict::Unhealthy(format!("{reason}; GPU reset or reboot required"))
            }
            _ => Verdict::Warn(reason),
        });
    }
    match Verdict::worst(findings) {
        Verdict::Unhealthy(r) => Verdict::Unhealthy(format!("xid: {r}")),
        Verdict::Warn(r) => Verdict::Warn(format!("xid: {r}")),
        _ => Verdict::Healthy,
    }
}

pub struct XidProbe<'a> {
    pub scan: &'a Result<KmsgScan, String>,
    pub table: &'a XidTable,
    /// Where the GPUs' PCI addresses come from.
    pub nvml: &'a Snapshot,
}

impl Probe for XidProbe<'_> {
    fn name(&self) -> &'static str {
        "xid"
    }

    fn check(&self, device: &Device) -> Verdict {
        if device.class != NVIDIA_GPU {
            return Verdict::NotApplicable("not an NVIDIA GPU".into());
        }
        let scan = match self.scan {
            Ok(s) => s,
            Err(e) => return Verdict::Unknown(e.clone()),
        };
        if let Some(pci) = self.nvml.pci_of_minor(device.num.minor) {
            return match evaluate(scan.active(), &pci, self.table) {
                // The log is read oldest first: a read cut short missed the newest
                // records, which are the ones that matter.
                Verdict::Healthy if scan.truncated => Verdict::Unknown(format!(
                    "kernel log read stopped after {} records; newer XID reports not seen",
                    scan.records
                )),
                v => v,
            };
        }
        // Without the GPU's address a report cannot be pinned on it; only reports that
        // would block make that matter.
        let blocking: Vec<String> = scan
            .active()
            .filter(|e| self.table.action(e.xid) == XidAction::Unhealthy)
            .map(|e| format!("xid {} on {}", e.xid, e.pci))
            .collect();
        if blocking.is_empty() {
            Verdict::Healthy
        } else {
            let mut shown = blocking.clone();
            shown.sort();
            shown.dedup();
            shown.truncate(8);
            Verdict::Unknown(format!(
                "{} reset-class XID reports on the node ({}) and the PCI address of minor {} is unknown",
                blocking.len(),
                shown.join(", "),
                device.num.minor
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn scan_bytes(bytes: &[u8], limits: ReadLimits) -> KmsgScan {
        let mut s = Scanner::new(limits);
        // feed in odd-sized pieces: records straddle reads in a regular file
        for chunk in bytes.chunks(7) {
            if !s.feed(chunk) {
                break;
            }
        }
        s.finish()
    }

    const FIXTURE: &str = "\
6,100,5000000,-;Linux version 6.1.0 (gcc)\n\
\x20SUBSYSTEM=pci\n\
\x20DEVICE=+pci:0000:3b:00.0\n\
4,200,9000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n\
4,250,9500000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n\
garbage without a prefix\n\
x,y,z;not numbers\n\
4,300,12345678,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n\
4,301,12345679,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, Graphics Exception\n\
4,302,12400000,c;NVRM: Xid (PCI:0000:5e:00): 31, pid=77, name=train, Ch 00000008, intr 10000000\n\
4,303,12500000,-;NVRM: Xid (0000:86:00): 48, An uncorrectable double bit error\n\
4,304,12600000,-;NVRM: Xid (PCI:0000:af:00): 154, GPU recovery action changed\n\
4,305,12700000,-;NVRM: Xid (PCI:zzzz:af:00): 79, bad address\n\
4,306,12800000,-;NVRM: Xid (PCI:0000:af:00): 99999999, absurd number\n\
4,307,12900000,-;NVRM: Xid (PCI:0000:af:00";

    /// Lines an attacker can get into the kernel log: a segfault report naming a binary
    /// whose file name is an NVRM line, an OOM kill, a userspace write to /dev/kmsg (any
    /// facility but 0), and near-misses of the XID grammar. None counts.
    #[test]
    fn forged_and_near_miss_lines_never_count() {
        let log = "\
6,1,1,-;gpujob[3700]: segfault at 0 ip 0000000000401000 sp 00007ffd error 4 in NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus[401000+1000]\n\
3,2,2,-;Out of memory: Killed process 77 (NVRM: Xid (PCI:0000:3b:00): 79, x)\n\
14,3,3,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n\
12,4,4,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE\n\
4,5,5,-; NVRM: Xid (PCI:0000:3b:00): 79, leading space\n\
4,6,6,-;NVRM: Xid (PCI:0000:3b:00): 79x, trailing junk\n\
4,7,7,-;NVRM: Xid (PCI:0000:3b:00 evil): 79, extra token\n\
4,8,8,-;NVRM: Xid (PCI:0000:3b:00.0): 79, function given\n\
4,9,9,-;NVRM: GPU at PCI:0000:3b:00: GPU-5b4b8bd5-52a5-4e0c-8a2b-3d0b0e0ea3d1\n\
4,10,10,-;NVRM: Xid (PCI:0000:3b:00): 13, caused by previous Xid 79\n\
4,11,11,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 04 egress\n\
";
        let s = scan_bytes(log.as_bytes(), ReadLimits::default());
        assert_eq!(s.records, 11);
        let xids: Vec<(u64, u32)> = s.events.iter().map(|e| (e.seq, e.xid)).collect();
        // Only seq 10 is a real driver XID report (13); its text mentions 79 harmlessly.
        assert_eq!(xids, vec![(10, 13)]);
        assert_eq!(s.last_driver_load, None);
    }

    #[test]
    fn a_forged_driver_load_hides_nothing() {
        let log = "\
4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n\
6,2,2,-;NVRM: loading N[99]: segfault at 0 ip 0 sp 0 error 4 in NVRM: loading NVIDIA UNIX x86_64 Kernel Module 1[1+1]\n\
14,3,3,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n\
4,4,4,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n\
";
        let s = scan_bytes(log.as_bytes(), ReadLimits::default());
        assert_eq!(s.last_driver_load, None);
        assert_eq!(s.active().count(), 1);
        assert!(is_driver_load(
            "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:15:33 UTC 2024"
        ));
        assert!(is_driver_load(
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023"
        ));
    }

    #[test]
    fn mig_suffixes_and_legacy_addresses_parse() {
        let (pci, xid, _) =
            parse_xid("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 43, pid=1, Ch 00000010").unwrap();
        assert_eq!((pci.bus, xid), (1, 43));
        let (_, xid, _) =
            parse_xid("NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 31, pid=2").unwrap();
        assert_eq!(xid, 31);
        assert!(parse_xid("NVRM: Xid (PCI:0000:01:00 GPU-CI:01): 31, pid=2").is_none());
        let (pci, xid, _) = parse_xid("NVRM: Xid (0000:86:00): 48, DBE").unwrap();
        assert_eq!((pci.bus, xid), (0x86, 48));
        assert_eq!(
            parse_xid("NVRM: Xid (PCI:0000:86:00): 79").map(|x| x.1),
            Some(79)
        );
    }

    #[test]
    fn fixture_parses_records_xids_and_driver_loads() {
        let s = scan_bytes(FIXTURE.as_bytes(), ReadLimits::default());
        let xids: Vec<(u64, u32, String)> = s
            .events
            .iter()
            .map(|e| (e.seq, e.xid, e.pci.to_string()))
            .collect();
        assert_eq!(
            xids,
            vec![
                (250, 79, "0000:3b:00".into()),
                (300, 79, "0000:3b:00".into()),
                (301, 13, "0000:3b:00".into()),
                (302, 31, "0000:5e:00".into()),
                (303, 48, "0000:86:00".into()),
                (304, 154, "0000:af:00".into()),
            ]
        );
        assert_eq!(s.last_driver_load, Some(200));
        assert_eq!(
            s.last_seq,
            Some(307),
            "a truncated record still counts as one"
        );
        assert_eq!(s.skipped, 2, "two garbage lines");
        assert_eq!(s.records, 11);
        assert!(!s.truncated);
        assert_eq!(
            s.events[1].text,
            "pid=1234, name=python3, GPU has fallen off the bus."
        );
        assert_eq!(s.events[1].ts_usec, 12345678);
    }

    #[test]
    fn reports_before_the_newest_driver_load_do_not_count() {
        let log = "\
4,10,1000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n\
4,11,2000,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15\n\
4,12,3000,-;NVRM: Xid (PCI:0000:5e:00): 48, DBE\n";
        let s = scan_bytes(log.as_bytes(), ReadLimits::default());
        let active: Vec<u32> = s.active().map(|e| e.xid).collect();
        assert_eq!(active, vec![48]);
        let t = XidTable::default();
        let gpu3b = PciAddr::parse("00000000:3B:00.0").unwrap();
        assert_eq!(evaluate(s.active(), &gpu3b, &t), Verdict::Healthy);
        // without the load record the same report still counts
        let s = scan_bytes(
            log.lines().next().unwrap().as_bytes(),
            ReadLimits::default(),
        );
        assert_eq!(evaluate(s.active(), &gpu3b, &t).status(), "unhealthy");
    }

    #[test]
    fn classification_and_reason_carry_the_figures() {
        let s = scan_bytes(FIXTURE.as_bytes(), ReadLimits::default());
        let t = XidTable::default();
        let v = evaluate(s.active(), &PciAddr::parse("00000000:3B:00.0").unwrap(), &t);
        assert_eq!(
            v,
            Verdict::Unhealthy(
                "xid: xid 79 (GPU has fallen off the bus) on 0000:3b:00 reported 2 times since the driver loaded, last at 12.345678 s after boot (kmsg seq 300): \"pid=1234, name=python3, GPU has fallen off the bus.\"; GPU reset or reboot required".into()
            )
        );
        // application XID 31 alone: ignored
        let v = evaluate(s.active(), &PciAddr::parse("0000:5e:00.0").unwrap(), &t);
        assert_eq!(v, Verdict::Healthy);
        // unknown XID 154: a warning
        let v = evaluate(s.active(), &PciAddr::parse("0000:af:00.0").unwrap(), &t);
        assert_eq!(v.status(), "warn", "{v:?}");
        // old-format address, DBE
        let v = evaluate(s.active(), &PciAddr::parse("0000:86:00.0").unwrap(), &t);
        assert!(
            v.reason()
                .unwrap()
                .contains("xid 48 (double-bit ECC error)"),
            "{v:?}"
        );
        // the operator's table wins
        let mut o = BTreeMap::new();
        o.insert("79".to_string(), "warn".to_string());
        o.insert("31".to_string(), "unhealthy".to_string());
        let t = XidTable::new(&o).unwrap();
        let v = evaluate(s.active(), &PciAddr::parse("0000:3b:00.0").unwrap(), &t);
        assert_eq!(v.status(), "warn");
        let v = evaluate(s.active(), &PciAddr::parse("0000:5e:00.0").unwrap(), &t);
        assert_eq!(v.status(), "unhealthy");
    }

    #[test]
    fn bad_overrides_are_errors() {
        let mut o = BTreeMap::new();
        o.insert("x79".to_string(), "warn".to_string());
        assert!(XidTable::new(&o).unwrap_err().contains("not an XID number"));
        let mut o = BTreeMap::new();
        o.insert("79".to_string(), "explode".to_string());
        assert!(XidTable::new(&o).unwrap_err().contains("not one of"));
    }

    #[test]
    fn enormous_lines_are_skipped_and_limits_stop_the_read() {
        let mut log = Vec::new();
        log.extend_from_slice(b"4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, ");
        log.extend(vec![b'A'; 100_000]);
        log.extend_from_slice(b"\n4,2,2,-;NVRM: Xid (PCI:0000:3b:00): 48, after\n");
        let s = scan_bytes(&log, ReadLimits::default());
        assert_eq!(s.skipped, 1);
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.events[0].xid, 48);

        let many: String = (0..100)
            .map(|i| format!("4,{i},{i},-;NVRM: Xid (PCI:0000:3b:00): 79, n\n"))
            .collect();
        let lim = ReadLimits {
            max_records: 10,
            ..ReadLimits::default()
        };
        let s = scan_bytes(many.as_bytes(), lim);
        assert!(s.truncated);
        assert_eq!(s.records, 10);
        let lim = ReadLimits {
            max_events: 3,
            ..ReadLimits::default()
        };
        let s = scan_bytes(many.as_bytes(), lim);
        let seqs: Vec<u64> = s.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![97, 98, 99], "the newest reports are kept");
        let lim = ReadLimits {
            max_bytes: 100,
            ..ReadLimits::default()
        };
        assert!(scan_bytes(many.as_bytes(), lim).truncated);
    }

    #[test]
    fn binary_garbage_never_panics() {
        let mut junk: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        junk.extend_from_slice("\n4,9,9,-;NVRM: Xid (PCI:ffff:ff:1f): 79, é\u{0}\n".as_bytes());
        junk.extend_from_slice(b"4,10,10,-;NVRM: Xid (PCI:0000:3b:00): \n");
        junk.extend_from_slice(b"4,11,10,-;NVRM: Xid (PCI:0000:3b:00)\n");
        junk.extend_from_slice(b";;;\n,,,;\n18446744073709551616,1,1,-;x\n");
        let s = scan_bytes(&junk, ReadLimits::default());
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.events[0].pci.to_string(), "ffff:ff:1f");
    }

    #[test]
    fn probe_needs_the_gpus_address_only_when_a_report_would_block() {
        use crate::device::{DevNum, DevType, Source};
        let gpu = Device {
            num: DevNum {
                typ: DevType::Char,
                major: 195,
                minor: 1,
            },
            class: NVIDIA_GPU.into(),
            container_path: Some("/dev/nvidia1".into()),
            host_path: None,
            source: Source::LinuxDevices,
            file_mode: None,
            uid: None,
            gid: None,
        };
        let no_nvml = Snapshot {
            gpus: Err("cannot load x".into()),
            driver_version: None,
            elapsed_us: 0,
        };
        let table = XidTable::default();
        let scan = Ok(scan_bytes(FIXTURE.as_bytes(), ReadLimits::default()));
        let p = XidProbe {
            scan: &scan,
            table: &table,
            nvml: &no_nvml,
        };
        assert_eq!(
            p.check(&gpu),
            Verdict::Unknown(
                "3 reset-class XID reports on the node (xid 48 on 0000:86:00, xid 79 on 0000:3b:00) and the PCI address of minor 1 is unknown".into()
            )
        );
        let quiet = Ok(scan_bytes(
            b"4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 13, app\n",
            ReadLimits::default(),
        ));
        let p = XidProbe {
            scan: &quiet,
            table: &table,
            nvml: &no_nvml,
        };
        assert_eq!(p.check(&gpu), Verdict::Healthy);
        let unreadable = Err("cannot open kernel log /dev/kmsg: permission denied".to_string());
        let p = XidProbe {
            scan: &unreadable,
            table: &table,
            nvml: &no_nvml,
        };
        assert_eq!(p.check(&gpu).status(), "unknown");
        let mut ctl = gpu.clone();
        ctl.class = "nvidia-ctl".into();
        assert_eq!(p.check(&ctl).status(), "not_applicable");
    }

    #[test]
    fn a_cut_short_read_is_unknown_not_healthy() {
        use crate::device::{DevNum, DevType};
        let num = DevNum {
            typ: DevType::Char,
            major: 195,
            minor: 1,
        };
        let gpu = Device::on_host(num, NVIDIA_GPU, None);
        let nvml = Snapshot {
            gpus: Ok(vec![crate::probe::nvml::tests::healthy(1)]),
            driver_version: None,
            elapsed_us: 0,
        };
        let table = XidTable::default();
        let mut scan = scan_bytes(
            b"4,1,1,-;NVRM: Xid (PCI:0000:2b:00): 13, app\n",
            ReadLimits::default(),
        );
        let p = |scan: &Result<KmsgScan, String>| {
            XidProbe {
                scan,
                table: &table,
                nvml: &nvml,
            }
            .check(&gpu)
        };
        assert_eq!(p(&Ok(scan.clone())), Verdict::Healthy);
        scan.truncated = true;
        assert_eq!(
            p(&Ok(scan)),
            Verdict::Unknown(
                "kernel log read stopped after 1 records; newer XID reports not seen".into()
            )
        );
    }

    #[test]
    fn pci_addresses_normalise() {
        let a = PciAddr::parse("00000000:3B:00.0").unwrap();
        let b = PciAddr::parse("0000:3b:00").unwrap();
        assert!(a.same_slot(&b));
        assert_eq!(a.to_string(), "0000:3b:00.0");
        assert_eq!(
            PciAddr::parse("3b:00.1").unwrap().to_string(),
            "0000:3b:00.1"
        );
        for bad in [
            "",
            "3b",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "000000000:3b:00",
            "0:1:2:3",
            "g0:00.0",
        ] {
            assert_eq!(PciAddr::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn reads_a_file_and_reports_open_errors() {
        let dir = std::env::temp_dir().join(format!("dg-xid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("kmsg");
        std::fs::File::create(&p)
            .unwrap()
            .write_all(FIXTURE.as_bytes())
            .unwrap();
        let s = read_kmsg(&p, ReadLimits::default()).unwrap();
        assert_eq!(s.events.len(), 6);
        assert_eq!(read_xids(&p, ReadLimits::default()).unwrap().len(), 6);
        let e = read_kmsg(&dir.join("absent"), ReadLimits::default()).unwrap_err();
        assert!(e.starts_with("cannot open kernel log /"), "{e}");
        // a device that never ends stops at the byte bound
        let lim = ReadLimits {
            max_bytes: 1 << 20,
            ..ReadLimits::default()
        };
        let s = read_kmsg(Path::new("/dev/zero"), lim).unwrap();
        assert!(s.truncated);
        assert_eq!(s.records, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn real_kmsg_reads_without_blocking() {
        // /dev/kmsg ends with EAGAIN, not EOF: a blocking read would hang the test.
        if !Path::new("/dev/kmsg").exists() {
            return;
        }
        let started = Instant::now();
        match read_kmsg(Path::new("/dev/kmsg"), ReadLimits::default()) {
            Ok(s) => assert!(s.records > 0 || s.last_seq.is_none()),
            Err(e) => assert!(e.contains("/dev/kmsg"), "{e}"),
        }
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
