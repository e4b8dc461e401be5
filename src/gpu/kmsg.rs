//! The kernel log, read once per hook call: non-blocking, bounded, oldest record first.
//! Only the NVIDIA driver's own records are kept: its XID reports, its load records and
//! its `GPU at PCI:…: GPU-…` records (`gpu_at`).
//!
//! Every record costs one read(2) on /dev/kmsg (about 1.8 µs), so the scan per record must
//! cost little beside it: lines are cut out of the read buffer in place, the header
//! (`pri,seq,ts`) is parsed from bytes, and only a kernel-facility record whose message
//! begins with `NVRM: ` is looked at further. Nothing is allocated per record.
//! `xid_history` keeps what a scan found under state_dir so that the next one parses only
//! records it has not seen (and, from a file, does not read them at all).
//!
//! Not syslog(2) `SYSLOG_ACTION_READ_ALL`, though it hands over the whole ring in one call:
//! it does not escape a newline inside a message, so a binary whose file name holds `\n`
//! would turn its segfault report into a line of its own, kernel facility and all.

use super::gpu_at::{self, GpuAt};
pub use super::kmsg_error::{KmsgError, KmsgStep};
pub use super::kmsg_record::{is_driver_load, parse_record, parse_xid, Record};
use super::kmsg_record::{parse_header, DRIVER_TAG};
use super::pci::PciAddr;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// One XID report from the kernel log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// At most `max_events` XID reports, oldest first: the newest of each XID on each PCI
    /// slot ([`keep_newest`]).
    pub events: Vec<XidEvent>,
    /// The sequence number of the newest NVIDIA driver load record.
    pub last_driver_load: Option<u64>,
    /// The driver's `GPU at PCI:…: GPU-…` records, the newest per PCI slot.
    pub gpu_at: Vec<GpuAt>,
    /// The oldest record's sequence number this read saw.
    pub first_seq: Option<u64>,
    /// The newest record's sequence number: where a later reader (poststop) can start.
    pub last_seq: Option<u64>,
    /// The newest record's timestamp.
    pub last_ts_usec: Option<u64>,
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

    /// The PCI slot the driver's `GPU at` records place `uuid` at.
    pub fn pci_of_uuid(&self, uuid: &str) -> Option<PciAddr> {
        gpu_at::pci_of_uuid(&self.gpu_at, uuid)
    }
}

/// Reports kept of one XID on one PCI slot: the newest, which say when it last happened;
/// the count in a reason stops here. Real drivers report a handful of XIDs on a handful of
/// GPUs, so the kinds times this stay well under `max_events`.
pub const MAX_EVENTS_PER_KIND: usize = 32;

/// Cuts `events` (oldest first) to the newest [`MAX_EVENTS_PER_KIND`] of each XID on each
/// PCI slot, then, only if that is still more than `max` (a driver reporting hundreds of
/// kinds), to the newest `max`. A pod makes its own GPU report XID 13, 31 or 43 as often as
/// it likes; a plain "newest `max`" would let that flood push another GPU's XID 48 or 79
/// (or its own) out, and that GPU would pass. A flood now pushes out only older reports of
/// its own kind. The cut composes: cutting a cut list with more reports appended gives
/// what cutting the whole gives, so a cached scan answers as a full one.
pub(crate) fn keep_newest(events: &mut Vec<XidEvent>, max: usize) {
    let kind = |e: &XidEvent| (e.pci.domain, e.pci.bus, e.pci.device, e.xid);
    let mut counts: BTreeMap<(u32, u8, u8, u32), usize> = BTreeMap::new();
    for e in events.iter() {
        *counts.entry(kind(e)).or_default() += 1;
    }
    if counts.values().any(|&c| c > MAX_EVENTS_PER_KIND) {
        for c in counts.values_mut() {
            *c = c.saturating_sub(MAX_EVENTS_PER_KIND);
        }
        // the oldest of a kind go first
        events.retain(|e| match counts.get_mut(&kind(e)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        });
    }
    let over = events.len().saturating_sub(max);
    events.drain(..over);
}

/// Splits a byte stream into lines, bounded, and parses each as a kernel log record.
pub(crate) struct Scanner {
    limits: ReadLimits,
    /// A line begun in one read and not yet ended; used only when a line straddles reads.
    carry: Vec<u8>,
    /// Inside a line longer than `max_line`: drop bytes up to its newline.
    overlong: bool,
    bytes: u64,
    /// Up to twice `max_events`, cut ([`keep_newest`]) when full and at the end.
    events: Vec<XidEvent>,
    /// Driver records up to this sequence number are known already (`xid_history`): counted
    /// but not parsed again.
    pub(crate) known_through: Option<u64>,
    /// The timestamp of record `known_through`, when this read saw it.
    pub(crate) known_ts: Option<u64>,
    pub(crate) scan: KmsgScan,
}

impl Scanner {
    pub(crate) fn new(limits: ReadLimits) -> Scanner {
        Scanner {
            limits,
            carry: Vec::new(),
            overlong: false,
            bytes: 0,
            events: Vec::new(),
            known_through: None,
            known_ts: None,
            scan: KmsgScan::default(),
        }
    }

    /// Whether the bytes fed so far end at the end of a line.
    pub(crate) fn line_complete(&self) -> bool {
        self.carry.is_empty() && !self.overlong
    }

    /// False when a limit says stop.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> bool {
        self.bytes += chunk.len() as u64;
        let mut rest = chunk;
        // The end of a line an earlier read began.
        if self.overlong || !self.carry.is_empty() {
            let (piece, complete) = match find_newline(rest) {
                Some(i) => (&rest[..i], Some(i + 1)),
                None => (rest, None),
            };
            if !self.overlong {
                if self.carry.len() + piece.len() > self.limits.max_line {
                    self.overlong = true;
                    self.carry.clear();
                    self.scan.skipped += 1;
                } else {
                    self.carry.extend_from_slice(piece);
                }
            }
            let Some(next) = complete else {
                return self.within_bytes();
            };
            if !self.overlong {
                let line = std::mem::take(&mut self.carry);
                self.line(&line);
                self.carry = line;
                self.carry.clear();
            }
            self.overlong = false;
            rest = &rest[next..];
            if self.records_full() {
                return false;
            }
        }
        // Whole lines, straight from the read buffer.
        while let Some(i) = find_newline(rest) {
            if i > self.limits.max_line {
                self.scan.skipped += 1;
            } else {
                self.line(&rest[..i]);
            }
            rest = &rest[i + 1..];
            if self.records_full() {
                return false;
            }
        }
        if rest.len() > self.limits.max_line {
            self.overlong = true;
            self.scan.skipped += 1;
        } else {
            self.carry.extend_from_slice(rest);
        }
        self.within_bytes()
    }

    fn records_full(&mut self) -> bool {
        let full = self.scan.records >= self.limits.max_records;
        self.scan.truncated |= full;
        full
    }

    fn within_bytes(&mut self) -> bool {
        let over = self.bytes >= self.limits.max_bytes;
        self.scan.truncated |= over;
        !over
    }

    /// One line. The order of the checks is the cost order: most records end at the
    /// facility or at the first bytes of their message.
    fn line(&mut self, line: &[u8]) {
        // Continuation lines (` KEY=value`) carry a record's dictionary; not records.
        if line.is_empty() || line[0] == b' ' {
            return;
        }
        let Some(h) = parse_header(line) else {
            self.scan.skipped += 1;
            return;
        };
        self.scan.records += 1;
        self.scan.first_seq.get_or_insert(h.seq);
        self.scan.last_seq = Some(h.seq);
        self.scan.last_ts_usec = Some(h.ts_usec);
        if self.known_through == Some(h.seq) {
            self.known_ts = Some(h.ts_usec);
        }
        let msg = &line[h.msg..];
        // Only the driver's own records are parsed further (and only they cost more).
        if h.pri >> 3 != 0 || !msg.starts_with(DRIVER_TAG.as_bytes()) {
            return;
        }
        if self.known_through.is_some_and(|k| h.seq <= k) {
            return;
        }
        let msg = String::from_utf8_lossy(msg);
        if is_driver_load(&msg) {
            self.scan.last_driver_load = Some(h.seq);
        } else if let Some((pci, xid, text)) = parse_xid(&msg) {
            if self.events.len() >= self.limits.max_events.saturating_mul(2) {
                keep_newest(&mut self.events, self.limits.max_events);
            }
            self.events.push(XidEvent {
                seq: h.seq,
                ts_usec: h.ts_usec,
                pci,
                xid,
                text,
            });
        } else if let Some((pci, uuid)) = gpu_at::parse_gpu_at(&msg) {
            let at = GpuAt {
                seq: h.seq,
                pci,
                uuid,
            };
            gpu_at::remember(&mut self.scan.gpu_at, at);
        }
    }

    pub(crate) fn finish(mut self) -> KmsgScan {
        // A final line without its newline: a file may simply lack the last newline, and a
        // truncated XID line fails to parse as one anyway.
        if !self.overlong && !self.carry.is_empty() {
            let l = std::mem::take(&mut self.carry);
            self.line(&l);
        }
        keep_newest(&mut self.events, self.limits.max_events);
        self.scan.events = self.events;
        self.scan
    }
}

/// The first `\n` in `b` (SIMD: this search is most of a file scan's cost).
fn find_newline(b: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', b)
}

/// Reads the kernel log at `path` from its oldest record to its end, without blocking.
/// /dev/kmsg returns one record per read() and EAGAIN at the end; EPIPE means the kernel
/// overwrote records since the last read, and reading goes on. A regular file (a fixture,
/// a saved log) is read the same way, in large reads.
pub fn read_kmsg(path: &Path, limits: ReadLimits) -> Result<KmsgScan, KmsgError> {
    let mut f = open_log(path)?;
    let mut scanner = Scanner::new(limits);
    read_into(&mut f, path, &mut scanner, Instant::now())?;
    Ok(scanner.finish())
}

/// Opens the log without following a symlink and without blocking on reads.
pub(crate) fn open_log(path: &Path) -> Result<File, KmsgError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| KmsgError::new(KmsgStep::Open, path, e))
}

/// Reads deadline checks apart: a clock read per record would cost a tenth of the read.
const READS_PER_CLOCK: u32 = 32;

/// Feeds `f` from where it stands to its end into `scanner`, within the limits' deadline
/// counted from `started`. Returns the bytes read.
pub(crate) fn read_into(
    f: &mut File,
    path: &Path,
    scanner: &mut Scanner,
    started: Instant,
) -> Result<u64, KmsgError> {
    let regular = f.metadata().is_ok_and(|m| m.is_file());
    // /dev/kmsg: larger than the kernel's largest record, or it answers EINVAL. A file:
    // large reads, few calls.
    let mut buf = vec![0u8; if regular { 1 << 20 } else { 64 << 10 }];
    let mut total = 0u64;
    let mut reads = 0u32;
    loop {
        reads = reads.wrapping_add(1);
        if reads % READS_PER_CLOCK == 0 && started.elapsed() > scanner.limits.deadline {
            scanner.scan.truncated = true;
            break;
        }
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                if !scanner.feed(&buf[..n]) {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => scanner.scan.overwritten += 1,
            Err(e) => return Err(KmsgError::new(KmsgStep::Read, path, e)),
        }
    }
    Ok(total)
}

/// The scanner over reads already made (the fuzz targets use it: read_kmsg's loop without
/// the file).
pub(crate) fn scan_chunks<'a>(
    chunks: impl Iterator<Item = &'a [u8]>,
    limits: ReadLimits,
) -> KmsgScan {
    let mut s = Scanner::new(limits);
    for chunk in chunks {
        if !s.feed(chunk) {
            break;
        }
    }
    s.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    pub(crate) fn scan_bytes(bytes: &[u8], limits: ReadLimits) -> KmsgScan {
        // feed in odd-sized pieces: records straddle reads in a regular file
        scan_chunks(bytes.chunks(7), limits)
    }

    pub(crate) const FIXTURE: &str = "\
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

    /// A pod makes its own GPU report XID 13, 31 or 43 as often as it likes (an illegal
    /// address in a kernel it launches). The bound on kept reports must not let that flood
    /// push another GPU's report out, nor an earlier report of another XID on its own GPU.
    #[test]
    fn a_flood_of_one_xid_never_pushes_out_another_report() {
        let mut log = String::from(
            "4,1,1,-;NVRM: Xid (PCI:0000:86:00): 48, pid=9, An uncorrectable double bit error\n\
             4,2,2,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=9, GPU has fallen off the bus.\n",
        );
        for i in 3..10_000u64 {
            log.push_str(&format!(
                "4,{i},{i},-;NVRM: Xid (PCI:0000:3b:00): 31, pid=66, Ch 00000008, intr 10000000\n"
            ));
        }
        let s = scan_bytes(log.as_bytes(), ReadLimits::default());
        let first: Vec<(u64, u32)> = s.events.iter().take(3).map(|e| (e.seq, e.xid)).collect();
        assert_eq!(first, vec![(1, 48), (2, 79), (9_999 - 31, 31)]);
        // the flood keeps its newest reports, in log order
        assert_eq!(s.events.len(), 2 + MAX_EVENTS_PER_KIND);
        assert_eq!(s.events.last().map(|e| e.seq), Some(9_999));
        assert!(s.events.windows(2).all(|w| w[0].seq < w[1].seq));
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
    fn reads_a_file_and_reports_open_errors() {
        let dir = crate::fsutil::tests::tempdir("xid");
        let p = dir.join("kmsg");
        std::fs::File::create(&p)
            .unwrap()
            .write_all(FIXTURE.as_bytes())
            .unwrap();
        let s = read_kmsg(&p, ReadLimits::default()).unwrap();
        assert_eq!(s.events.len(), 6);
        assert_eq!(s.events.len(), 6);
        let e = read_kmsg(&dir.join("absent"), ReadLimits::default()).unwrap_err();
        assert_eq!(e.step, KmsgStep::Open);
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
        assert_eq!(
            e.to_string(),
            format!(
                "cannot open kernel log {}: No such file or directory (os error 2)",
                dir.join("absent").display()
            )
        );
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
            Err(e) => assert_eq!(e.path, Path::new("/dev/kmsg"), "{e}"),
        }
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn newline_search_agrees_with_a_plain_one() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..200 {
            let mut b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // few newlines, and bytes next to b'\n' (0x0a ^ 0x80, 0x0b, 0x09)
                    [b'a', 0x8a, 0x0b, 0x09, 0xff, 0x00, b'\n'][(x % 7) as usize]
                })
                .collect();
            let plain = b.iter().position(|&c| c == b'\n');
            assert_eq!(find_newline(&b), plain, "{b:?}");
            b.retain(|&c| c != b'\n');
            assert_eq!(find_newline(&b), None);
        }
    }

    #[test]
    fn the_header_is_digits_and_commas_only() {
        for bad in [
            "+4,1,1,-;NVRM: x",
            "4,+1,1,-;NVRM: x",
            "4, 1,1,-;NVRM: x",
            "4,1,1-;NVRM: x",
            "4,1;NVRM: x",
            "4294967296,1,1,-;NVRM: x",
            "4,18446744073709551616,1,-;x",
            "4,1,1,-",
            "",
        ] {
            assert_eq!(parse_record(bad), None, "{bad:?}");
        }
        let r = parse_record("4,18446744073709551615,7;NVRM: a;b").unwrap();
        assert_eq!(
            (r.pri, r.seq, r.ts_usec, r.msg),
            (4, u64::MAX, 7, "NVRM: a;b")
        );
        let r = parse_record("6,2,3,-,caller=T1;x").unwrap();
        assert_eq!(r.msg, "x");
    }

    /// `GPU at` lines count from the driver only, like XIDs.
    #[test]
    fn gpu_at_records_count_only_from_the_driver() {
        let uuid = "GPU-efbdfde9-5798-a6e7-4c46-12518fa15375";
        let log = format!(
            "14,1,1,-;NVRM: GPU at PCI:0000:3b:00: {uuid}\n\
             6,2,2,-;x[1]: segfault at 0 ip 0 sp 0 error 4 in NVRM: GPU at PCI:0000:5e:00: {uuid}[1+1]\n\
             4,3,3,-;NVRM: GPU at PCI:0000:86:00: {uuid}\n"
        );
        let s = scan_bytes(log.as_bytes(), ReadLimits::default());
        assert_eq!(s.gpu_at.len(), 1);
        assert_eq!(s.pci_of_uuid(uuid).map(|p| p.bus), Some(0x86));
        let forged_only = scan_bytes(
            &log.as_bytes()[..log.rfind("4,3").unwrap()],
            ReadLimits::default(),
        );
        assert!(forged_only.gpu_at.is_empty());
        assert_eq!(forged_only.pci_of_uuid(uuid), None);
    }

    /// A binary whose file name holds newlines, each followed by a whole forged record (an
    /// XID, a driver load that would hide the real XID before it, a `GPU at` line), run as
    /// any user until it segfaults. /dev/kmsg hands the kernel's report of it as one record,
    /// each newline escaped as `\x0a` (the reports below are shaped as a 6.x kernel wrote
    /// one for such a binary); syslog(2) `READ_ALL` would have handed the newlines raw, the
    /// forged records as lines of their own. None counts.
    #[test]
    fn a_newline_in_a_crashing_binarys_name_starts_no_record() {
        let report = |forged: &str| {
            format!(
                "gpujob[28709]: segfault at 0 ip 0000000000401009 sp 00007ffc62906b68 error 6 \
                 in a\\x0a{forged}\\x0a[1009,401000+1000] likely on CPU 1 (core 1, socket 0)"
            )
        };
        let log = [
            "4,1,1,-;NVRM: Xid (PCI:0000:86:00): 48, pid=9, An uncorrectable double bit error"
                .to_string(),
            format!(
                "6,2,2,-;{}",
                report("0,3,3,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=424242, GPU has fallen off the bus.")
            ),
            format!(
                "6,4,4,-;{}",
                report("0,5,5,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023")
            ),
            format!(
                "6,6,6,-;{}",
                report("0,7,7,-;NVRM: GPU at PCI:0000:5e:00: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375")
            ),
        ]
        .join("\n")
            + "\n";
        let dir = crate::fsutil::tests::tempdir("kmsg-newline");
        let p = dir.join("kmsg");
        std::fs::write(&p, &log).unwrap();
        let s = read_kmsg(&p, ReadLimits::default()).unwrap();
        let xids: Vec<(u64, u32)> = s.active().map(|e| (e.seq, e.xid)).collect();
        assert_eq!(xids, vec![(1, 48)], "only the driver's own report");
        assert_eq!(s.last_driver_load, None);
        assert!(s.gpu_at.is_empty(), "{:?}", s.gpu_at);
        assert_eq!((s.records, s.skipped), (4, 0));
    }

    /// Whatever the read sizes, the scan is the same: records straddle reads in a file,
    /// and a line may end exactly at a read's end.
    #[test]
    fn read_sizes_do_not_change_the_scan() {
        let whole = scan_chunks(std::iter::once(FIXTURE.as_bytes()), ReadLimits::default());
        for size in [1, 2, 3, 8, 63, 64, 65, 4096] {
            let s = scan_chunks(FIXTURE.as_bytes().chunks(size), ReadLimits::default());
            assert_eq!(s, whole, "reads of {size}");
        }
    }
}
