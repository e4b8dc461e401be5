//! The XID history of this boot: what the driver reported in the kernel log, kept in
//! `state_dir/xid-history.json` after the ring buffer has wrapped past it. A pod can flood
//! the ring with its own GPU's XIDs; another GPU's report, once seen, still counts for the
//! rest of the boot (until a driver load). It also spares the next hook call (a poststop
//! after its prestart, the next start on the node) parsing records it has seen, and, from
//! a regular file, reading them again.
//!
//! /dev/kmsg cannot seek to a sequence number (only to its first record, the last clear or
//! its end), so a scan still reads every record, one read(2) each; records up to the
//! cache's `last_seq` are counted and not parsed. From a regular file the scan starts at
//! the byte where the last one ended.
//!
//! The cache is believed for no more than it proves:
//! - /dev/kmsg: the same boot (`boot_id`), the same device, and a log that continues it:
//!   the record `last_seq`, when still there, has the same timestamp. When the ring has
//!   wrapped past it (the oldest record read is newer), the records between are lost, but
//!   what the cache saw of this boot still stands and is kept: a flood must not erase it.
//! - a file: the same device and inode, at least `offset` bytes long, and the same bytes
//!   at its head and just before `offset` (a fingerprint of each); the first record after
//!   `offset` must be newer than `last_seq`.
//! - a cache that is unreadable, not root's, not 0600, too large or inconsistent (an event
//!   newer than `last_seq`, a bound exceeded) is ignored with a warning and rewritten.
//!
//! A scan with records lost during the read (EPIPE) or a file read cut short writes no
//! cache: the next scan is a full one. state_dir is on tmpfs (/run), so a reboot clears the
//! cache anyway; the boot id covers a state_dir that is not.

use super::gpu_at::{self, GpuAt, MAX_GPU_AT};
use super::kmsg::{
    keep_newest, open_log, read_into, KmsgError, KmsgScan, KmsgStep, ReadLimits, Scanner, XidEvent,
};
pub use super::kmsg_error::CacheError;
use crate::fsutil::{ensure_private_dir, read_bounded, read_regular_file, write_atomic_volatile};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub const HISTORY_FILE: &str = "xid-history.json";
/// An earlier devgate's name for the same file: read, or an upgrade on a running node would
/// forget the reports of this boot the ring has lost since. Removed at the next write.
const EARLIER_HISTORY_FILE: &str = "kmsg-cache.json";
const VERSION: u32 = 1;
/// 4096 events of at most 160 characters of text, and 256 `GPU at` records, fit.
const MAX_CACHE_BYTES: u64 = 4 << 20;
/// Bytes hashed at a file's head and before the cache's offset.
const MARK_BYTES: u64 = 4096;

/// The history file: see the module's comment for what each field proves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub version: u32,
    /// /proc/sys/kernel/random/boot_id when the log is a device; empty for a file.
    pub boot_id: String,
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub rdev: u64,
    /// Every record up to this sequence number has been scanned.
    pub last_seq: u64,
    /// The timestamp of record `last_seq`.
    pub last_ts_usec: u64,
    /// A regular file: where the scan ended, and fingerprints of the bytes before it.
    pub file: Option<FileMark>,
    pub last_driver_load: Option<u64>,
    pub events: Vec<XidEvent>,
    pub gpu_at: Vec<GpuAt>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMark {
    pub offset: u64,
    /// FNV-1a of the first `min(offset, 4096)` bytes and of the 4096 bytes before `offset`.
    pub head: u64,
    pub tail: u64,
}

/// Reads the log at `path` as [`super::kmsg::read_kmsg`] does, using and then updating
/// the cache in `state_dir`. `proc_root` gives the boot id. Any trouble with the cache
/// falls back to a full scan: the answer never depends on whether the cache was usable.
///
/// Long because it is the one place that decides whether the cache holds; each check sits
/// beside the read it guards, in the order they happen.
pub fn read_with_history(
    path: &Path,
    limits: ReadLimits,
    state_dir: &Path,
    proc_root: &Path,
) -> Result<KmsgScan, KmsgError> {
    // Start-up trick (docs/performance.md). Plain: scan the whole log each call.
    let started = Instant::now();
    let mut f = open_log(path)?;
    let meta = f
        .metadata()
        .map_err(|e| KmsgError::new(KmsgStep::Stat, path, e))?;
    let regular = meta.is_file();
    let boot_id = if regular {
        String::new()
    } else {
        match boot_id(proc_root) {
            Some(b) => b,
            // Without a boot id nothing proves the cache is this boot's.
            None => return full_scan(&mut f, path, limits, started, None),
        }
    };
    let (kept, earlier) = load_kept(state_dir, limits);
    let cached = kept.filter(|c| {
        c.boot_id == boot_id
            && c.path == path
            && (c.dev, c.ino, c.rdev) == (meta.dev(), meta.ino(), meta.rdev())
            && c.file.is_some() == regular
    });
    let here = Here {
        boot_id,
        path: path.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
        rdev: meta.rdev(),
        state_dir,
    };
    let Some(c) = cached else {
        return full_scan(&mut f, path, limits, started, Some(&here));
    };
    let mut s = Scanner::new(limits);
    s.known_through = Some(c.last_seq);
    if let Some(mark) = &c.file {
        if !file_continues(&f, meta.len(), mark) || f.seek(SeekFrom::Start(mark.offset)).is_err() {
            return full_scan(&mut f, path, limits, started, Some(&here));
        }
    }
    let read = read_into(&mut f, path, &mut s, started)?;
    let offset = c.file.as_ref().map_or(0, |m| m.offset) + read;
    let continues = continues(c.file.is_some(), s.scan.first_seq, s.known_ts, &c);
    if !continues {
        // the ring wrapped past the cache, or a file changed: ordinary, not a fault
        log::info!(
            "kernel log {} does not continue what {} saw; reading it whole",
            path.display(),
            here.state_dir.join(HISTORY_FILE).display()
        );
        f.seek(SeekFrom::Start(0))
            .map_err(|e| KmsgError::new(KmsgStep::Seek, path, e))?;
        return full_scan(&mut f, path, limits, started, Some(&here));
    }
    let complete = s.line_complete();
    let mut scan = s.finish();
    merge(&mut scan, &c, limits);
    if earlier || worth_writing(&c, &scan, offset) {
        save(&here, &scan, &mut f, offset, complete, limits);
    }
    Ok(scan)
}

/// /dev/kmsg records seen again cost one read each whatever the cache says; what a rewrite
/// buys there is only a later `last_seq` (fewer driver records parsed again, more room
/// before the ring wraps past it). A write costs more than the scan on some filesystems,
/// so the device's cache is rewritten when its facts changed or it fell this far behind.
const REWRITE_AFTER_RECORDS: u64 = 4096;

/// Whether the scan found anything the cache does not say: a new fact, a file read
/// further, or a device log that moved well past the cache.
fn worth_writing(c: &History, scan: &KmsgScan, offset: u64) -> bool {
    let facts_changed = scan.events != c.events
        || scan.last_driver_load != c.last_driver_load
        || scan.gpu_at != c.gpu_at;
    let moved = match &c.file {
        Some(m) => offset != m.offset,
        None => scan
            .last_seq
            .is_some_and(|l| l >= c.last_seq.saturating_add(REWRITE_AFTER_RECORDS)),
    };
    facts_changed || moved
}

/// Whether this read carries on from what the cache saw. A file: whatever follows the
/// offset is newer. The device: the record the cache ended at, when still in the ring, is
/// the same record (its timestamp), or the ring has moved past it (the oldest record read
/// is newer than `last_seq`). Records that went between the two reads are lost either way,
/// but what the cache read of this boot's log stands: dropping it would let a flood (a pod
/// making its own GPU report XID 31 at will) wrap the ring and erase another GPU's report.
/// A read that never got to the cache's record (cut short) does not carry on.
fn continues(file: bool, first: Option<u64>, known_ts: Option<u64>, c: &History) -> bool {
    match (file, first) {
        (true, first) => first.map_or(true, |seq| seq > c.last_seq),
        (false, Some(first)) => known_ts == Some(c.last_ts_usec) || first > c.last_seq,
        (false, None) => false,
    }
}

/// Where the log is and what it is: what a cache written now will be checked against.
struct Here<'a> {
    boot_id: String,
    path: PathBuf,
    dev: u64,
    ino: u64,
    rdev: u64,
    state_dir: &'a Path,
}

fn full_scan(
    f: &mut File,
    path: &Path,
    limits: ReadLimits,
    started: Instant,
    here: Option<&Here>,
) -> Result<KmsgScan, KmsgError> {
    let mut s = Scanner::new(limits);
    let read = read_into(f, path, &mut s, started)?;
    let complete = s.line_complete();
    let scan = s.finish();
    if let Some(h) = here {
        save(h, &scan, f, read, complete, limits);
    }
    Ok(scan)
}

/// The cache's facts, then this read's: the newer driver load, the newest events, the
/// newer `GPU at` record per slot.
fn merge(scan: &mut KmsgScan, c: &History, limits: ReadLimits) {
    let mut events = c.events.clone();
    events.append(&mut scan.events);
    keep_newest(&mut events, limits.max_events);
    scan.events = events;
    scan.last_driver_load = scan.last_driver_load.or(c.last_driver_load);
    let mut at = c.gpu_at.clone();
    for g in std::mem::take(&mut scan.gpu_at) {
        gpu_at::remember(&mut at, g);
    }
    scan.gpu_at = at;
    if scan.last_seq.is_none() {
        // nothing new read: the cache's last record is still the last
        scan.last_seq = Some(c.last_seq);
        scan.last_ts_usec = Some(c.last_ts_usec);
    }
}

/// Writes the cache for what `scan` covers, when it proves something: records were read,
/// none was lost meanwhile, and a file's read ended at a line's end.
fn save(h: &Here, scan: &KmsgScan, f: &mut File, offset: u64, complete: bool, limits: ReadLimits) {
    let (Some(last_seq), Some(last_ts_usec)) = (scan.last_seq, scan.last_ts_usec) else {
        return;
    };
    if scan.overwritten > 0 {
        return;
    }
    let file = if h.boot_id.is_empty() {
        if scan.truncated || !complete {
            return;
        }
        match mark(f, offset) {
            Some(m) => Some(m),
            None => return,
        }
    } else {
        None
    };
    let c = History {
        version: VERSION,
        boot_id: h.boot_id.clone(),
        path: h.path.clone(),
        dev: h.dev,
        ino: h.ino,
        rdev: h.rdev,
        last_seq,
        last_ts_usec,
        file,
        last_driver_load: scan.last_driver_load,
        events: scan.events.clone(),
        gpu_at: scan.gpu_at.clone(),
    };
    let path = h.state_dir.join(HISTORY_FILE);
    let Ok(json) = serde_json::to_vec(&c) else {
        return;
    };
    // Only what reads back: a file can hold records out of order (an event newer than the
    // last record), and a cache of them would be refused at every call.
    if parse(&json, limits).is_err() {
        return;
    }
    let written =
        ensure_private_dir(h.state_dir).and_then(|()| write_atomic_volatile(&path, &json, 0o600));
    match written {
        Ok(()) => drop(std::fs::remove_file(h.state_dir.join(EARLIER_HISTORY_FILE))),
        Err(e) => log::warn!("cannot write the XID history: {e}"),
    }
}

/// The history in `state_dir`, else the one an earlier devgate kept, under the same checks;
/// and whether it is that one.
fn load_kept(state_dir: &Path, limits: ReadLimits) -> (Option<History>, bool) {
    match load(&state_dir.join(HISTORY_FILE), limits) {
        Some(c) => (Some(c), false),
        None => (load(&state_dir.join(EARLIER_HISTORY_FILE), limits), true),
    }
}

/// The cache, when it is root's own file and consistent; None (with a warning for a file
/// that is there but unusable) otherwise.
pub fn load(path: &Path, limits: ReadLimits) -> Option<History> {
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            log::warn!("ignoring the XID history {}: {e}", path.display());
            return None;
        }
    };
    let why = match read_checked(&f, path) {
        Ok(bytes) => match parse(&bytes, limits) {
            Ok(c) => return Some(c),
            Err(why) => why,
        },
        Err(why) => why,
    };
    log::warn!(
        "ignoring the XID history {}: {why}; reading the log whole",
        path.display()
    );
    None
}

fn read_checked(f: &File, path: &Path) -> Result<Vec<u8>, CacheError> {
    let meta = f.metadata().map_err(|e| CacheError::Stat(e.into()))?;
    let euid = nix::unistd::geteuid().as_raw();
    if !meta.is_file() || meta.uid() != euid || meta.mode() & 0o077 != 0 {
        return Err(CacheError::NotPrivate {
            euid,
            uid: meta.uid(),
            mode: meta.mode() & 0o7777,
        });
    }
    read_bounded(
        f.take(MAX_CACHE_BYTES + 1),
        MAX_CACHE_BYTES,
        "XID history",
        path,
    )
    .map_err(CacheError::Read)
}

/// The cache file's bytes, checked for what no scan could have written.
pub fn parse(bytes: &[u8], limits: ReadLimits) -> Result<History, CacheError> {
    let c: History = serde_json::from_slice(bytes).map_err(|e| CacheError::Json(e.to_string()))?;
    let fits = |seq: u64| seq <= c.last_seq;
    let ok = c.version == VERSION
        && c.events.len() <= limits.max_events
        && c.gpu_at.len() <= MAX_GPU_AT
        && c.last_driver_load.map_or(true, fits)
        && c.events.windows(2).all(|w| w[0].seq < w[1].seq)
        && c.events.iter().all(|e| {
            fits(e.seq)
                && e.text.chars().count() <= 160
                && e.pci.function.is_none()
                && round_trips(&e.pci)
        })
        && c.gpu_at.iter().all(|g| {
            fits(g.seq)
                && gpu_at::is_gpu_uuid(&g.uuid)
                && g.pci.function.is_none()
                && round_trips(&g.pci)
        })
        && c.file
            .as_ref()
            .map_or(true, |m| c.boot_id.is_empty() && m.offset > 0);
    if ok {
        Ok(c)
    } else {
        Err(CacheError::Inconsistent { version: c.version })
    }
}

fn round_trips(pci: &super::pci::PciAddr) -> bool {
    super::pci::PciAddr::parse_exact(&pci.to_string()) == Some(*pci)
}

fn boot_id(proc_root: &Path) -> Option<String> {
    let p = proc_root.join("sys/kernel/random/boot_id");
    let b = read_regular_file(&p, 64, "boot id").ok()?;
    let s = String::from_utf8(b).ok()?.trim().to_string();
    (s.len() == 36 && s.bytes().all(|c| c.is_ascii_hexdigit() || c == b'-')).then_some(s)
}

/// Whether the file still holds, at its head and before `mark.offset`, the bytes the cache
/// saw there.
fn file_continues(f: &File, len: u64, mark: &FileMark) -> bool {
    len >= mark.offset && self::mark(f, mark.offset).is_some_and(|m| m == *mark)
}

fn mark(f: &File, offset: u64) -> Option<FileMark> {
    let hash_at = |from: u64, n: u64| -> Option<u64> {
        let mut buf = vec![0u8; n as usize];
        f.read_exact_at(&mut buf, from).ok()?;
        Some(fnv1a(&buf))
    };
    let n = offset.min(MARK_BYTES);
    (offset > 0).then_some(())?;
    Some(FileMark {
        offset,
        head: hash_at(0, n)?,
        tail: hash_at(offset - n, n)?,
    })
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &c| {
        (h ^ u64::from(c)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kmsg::read_kmsg;
    use std::fs;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("dg-kmsgcache-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("state")).unwrap();
        Dir(d)
    }

    fn chatter(from: u64, to: u64) -> String {
        (from..to)
            .map(|i| format!("6,{i},{i}000,-;usb 1-1: chatter {i}\n"))
            .collect()
    }

    const XID: &str =
        "4,5,5000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n";
    const AT: &str =
        "4,4,4000,-;NVRM: GPU at PCI:0000:3b:00: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375\n";

    fn no_proc() -> PathBuf {
        PathBuf::from("/nonexistent/devgate-proc")
    }

    /// The answer with a cache is the answer without one.
    fn same(a: &KmsgScan, b: &KmsgScan) {
        assert_eq!(a.events, b.events);
        assert_eq!(a.last_driver_load, b.last_driver_load);
        assert_eq!(a.gpu_at, b.gpu_at);
        assert_eq!(a.last_seq, b.last_seq);
        assert_eq!(a.truncated, b.truncated);
    }

    #[test]
    fn a_file_is_read_once_then_only_what_was_appended() {
        let d = dir("append");
        let log = d.0.join("kmsg");
        let state = d.0.join("state");
        fs::write(&log, chatter(0, 4) + AT + XID + &chatter(6, 100)).unwrap();
        let lim = ReadLimits::default();
        let first = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        same(&first, &read_kmsg(&log, lim).unwrap());
        assert_eq!(first.records, 100);
        let meta = fs::metadata(state.join(HISTORY_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);

        // poststop after prestart, nothing new: nothing read, the same answer
        let again = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        assert_eq!(again.records, 0);
        same(&again, &first);

        let mut f = fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"4,100,100000,-;NVRM: Xid (PCI:0000:5e:00): 48, DBE\n")
            .unwrap();
        f.write_all(chatter(101, 110).as_bytes()).unwrap();
        let later = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        assert_eq!(later.records, 10, "only the appended records were read");
        same(&later, &read_kmsg(&log, lim).unwrap());
        assert_eq!(later.events.len(), 2);
        assert_eq!(
            later
                .pci_of_uuid("GPU-EFBDFDE9-5798-A6E7-4C46-12518FA15375")
                .map(|p| p.bus),
            Some(0x3b)
        );
    }

    #[test]
    fn a_rewritten_file_is_read_whole() {
        let d = dir("rewrite");
        let log = d.0.join("kmsg");
        let state = d.0.join("state");
        let lim = ReadLimits::default();
        fs::write(&log, chatter(0, 5) + XID + &chatter(6, 50)).unwrap();
        read_with_history(&log, lim, &state, &no_proc()).unwrap();
        // same inode, other content, longer: the driver reloaded, the XID is gone
        let reloaded = "4,0,1,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n".to_string() + &chatter(1, 80);
        fs::write(&log, &reloaded).unwrap();
        let s = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        same(&s, &read_kmsg(&log, lim).unwrap());
        assert!(s.events.is_empty());
        // truncated below the cache's offset
        fs::write(&log, XID).unwrap();
        let s = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        same(&s, &read_kmsg(&log, lim).unwrap());
        // replaced by another file (new inode) with the same head
        let tmp = d.0.join("kmsg.new");
        fs::write(&tmp, XID.to_string() + &chatter(6, 9)).unwrap();
        fs::rename(&tmp, &log).unwrap();
        let s = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        same(&s, &read_kmsg(&log, lim).unwrap());
        assert_eq!(s.records, 4);
    }

    #[test]
    fn a_corrupt_or_foreign_cache_is_ignored_and_rewritten() {
        let d = dir("corrupt");
        let log = d.0.join("kmsg");
        let state = d.0.join("state");
        let cache = state.join(HISTORY_FILE);
        let lim = ReadLimits::default();
        fs::write(&log, chatter(0, 5) + XID + &chatter(6, 20)).unwrap();
        let truth = read_kmsg(&log, lim).unwrap();
        read_with_history(&log, lim, &state, &no_proc()).unwrap();
        let good = fs::read(&cache).unwrap();

        // garbage
        fs::write(&cache, b"{\"version\":1,").unwrap();
        same(
            &read_with_history(&log, lim, &state, &no_proc()).unwrap(),
            &truth,
        );
        assert_eq!(fs::read(&cache).unwrap(), good, "rewritten");

        // an event the scan could not have written (newer than last_seq) hides nothing and
        // adds nothing
        let mut c: History = serde_json::from_slice(&good).unwrap();
        let mut forged = c.events[0].clone();
        forged.seq = c.last_seq + 10;
        c.events.push(forged);
        fs::write(&cache, serde_json::to_vec(&c).unwrap()).unwrap();
        fs::set_permissions(&cache, fs::Permissions::from_mode(0o600)).unwrap();
        same(
            &read_with_history(&log, lim, &state, &no_proc()).unwrap(),
            &truth,
        );

        // a well-formed cache another user could have written (mode 0644) is not believed:
        // it claims an XID on a GPU the log never named
        let mut c: History = serde_json::from_slice(&good).unwrap();
        c.events[0].pci.bus = 0x99;
        fs::write(&cache, serde_json::to_vec(&c).unwrap()).unwrap();
        fs::set_permissions(&cache, fs::Permissions::from_mode(0o644)).unwrap();
        let s = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        same(&s, &truth);
        // the same cache as root's 0600 file is believed: the file's bytes did not change
        fs::write(&cache, serde_json::to_vec(&c).unwrap()).unwrap();
        fs::set_permissions(&cache, fs::Permissions::from_mode(0o600)).unwrap();
        let s = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        assert_eq!(
            s.events[0].pci.bus, 0x99,
            "a root-owned 0600 cache is trusted"
        );

        // a symlink in place of the cache is not followed, even to a cache it would trust
        let elsewhere = d.0.join("elsewhere.json");
        fs::rename(&cache, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &cache).unwrap();
        same(
            &read_with_history(&log, lim, &state, &no_proc()).unwrap(),
            &truth,
        );
    }

    /// A file with records out of order (an XID newer than the last record) would make a
    /// cache that does not read back: none is written, and every read is a full one.
    #[test]
    fn a_file_out_of_order_writes_no_cache() {
        let d = dir("order");
        let log = d.0.join("kmsg");
        let state = d.0.join("state");
        let lim = ReadLimits::default();
        fs::write(
            &log,
            "4,50,1,-;NVRM: Xid (PCI:0000:3b:00): 79, x\n6,10,2,-;chatter\n",
        )
        .unwrap();
        for _ in 0..2 {
            let s = read_with_history(&log, lim, &state, &no_proc()).unwrap();
            same(&s, &read_kmsg(&log, lim).unwrap());
            assert_eq!(s.records, 2);
        }
        assert!(!state.join(HISTORY_FILE).exists());
    }

    #[test]
    fn a_device_cache_holds_only_while_the_log_carries_on() {
        let c = History {
            version: VERSION,
            boot_id: "b".into(),
            path: "/dev/kmsg".into(),
            dev: 0,
            ino: 0,
            rdev: 0,
            last_seq: 100,
            last_ts_usec: 5000,
            file: None,
            last_driver_load: None,
            events: vec![],
            gpu_at: vec![],
        };
        // record 100 still in the ring, same timestamp
        assert!(continues(false, Some(0), Some(5000), &c));
        // another record 100: not this log
        assert!(!continues(false, Some(0), Some(5001), &c));
        // the ring wrapped exactly to 101: nothing lost
        assert!(continues(false, Some(101), None, &c));
        // wrapped past 101: records nobody read are lost, but what the cache read of this
        // boot's log still stands (a pod flooding the ring with its own GPU's XIDs must not
        // erase another GPU's report the cache holds)
        assert!(continues(false, Some(102), None, &c));
        assert!(continues(false, Some(1_000_000), None, &c));
        // the read stopped before record 100
        assert!(!continues(false, Some(0), None, &c));
        assert!(!continues(false, None, None, &c));
        // a file: what follows the offset must be newer
        assert!(continues(true, Some(101), None, &c));
        assert!(continues(true, None, None, &c));
        assert!(!continues(true, Some(100), None, &c));
    }

    #[test]
    fn the_real_kmsg_with_a_cache_answers_as_without() {
        let dev = Path::new("/dev/kmsg");
        let Ok(meta) = fs::metadata(dev) else {
            return;
        };
        if read_kmsg(dev, ReadLimits::default()).is_err() {
            return; // not root: the other tests cover the logic
        }
        let d = dir("dev");
        let state = d.0.join("state");
        let proc = d.0.join("proc");
        fs::create_dir_all(proc.join("sys/kernel/random")).unwrap();
        fs::write(
            proc.join("sys/kernel/random/boot_id"),
            "ee26c32a-fe11-4c23-b5a0-f65ca4b20c1b\n",
        )
        .unwrap();
        let lim = ReadLimits::default();
        let a = read_with_history(dev, lim, &state, &proc).unwrap();
        let c = load(&state.join(HISTORY_FILE), lim).expect("a cache was written");
        assert_eq!(c.rdev, meta.rdev());
        assert_eq!(Some(c.last_seq), a.last_seq);
        let b = read_with_history(dev, lim, &state, &proc).unwrap();
        assert_eq!(a.events, b.events);
        assert!(b.last_seq >= a.last_seq);

        // a cache whose last record has another timestamp is another log's: dropped
        let mut forged = c.clone();
        forged.last_ts_usec = forged.last_ts_usec.wrapping_add(1);
        forged.events = vec![XidEvent {
            seq: 0,
            ts_usec: 0,
            pci: crate::gpu::pci::PciAddr::parse_exact("0000:99:00").unwrap(),
            xid: 79,
            text: "forged".into(),
        }];
        fs::write(
            state.join(HISTORY_FILE),
            serde_json::to_vec(&forged).unwrap(),
        )
        .unwrap();
        let s = read_with_history(dev, lim, &state, &proc).unwrap();
        assert!(s.events.iter().all(|e| e.text != "forged"));
        // another boot's cache: dropped
        forged.last_ts_usec = c.last_ts_usec;
        forged.boot_id = "00000000-0000-0000-0000-000000000000".into();
        fs::write(
            state.join(HISTORY_FILE),
            serde_json::to_vec(&forged).unwrap(),
        )
        .unwrap();
        let s = read_with_history(dev, lim, &state, &proc).unwrap();
        assert!(s.events.iter().all(|e| e.text != "forged"));
    }

    /// The cache's reports and a scan's are bounded together the same way: another
    /// GPU's flood since the cache does not push the cache's report out.
    #[test]
    fn a_flood_after_the_cache_keeps_the_caches_report_of_another_gpu() {
        let d = dir("flood");
        let log = d.0.join("kmsg");
        let mut text = format!("{AT}{XID}");
        fs::write(&log, &text).unwrap();
        let state = d.0.join("state");
        let first = read_with_history(&log, ReadLimits::default(), &state, &no_proc()).unwrap();
        assert_eq!(first.events.len(), 1);
        for i in 6..5_000u64 {
            text.push_str(&format!(
                "4,{i},{i}000,-;NVRM: Xid (PCI:0000:5e:00): 13, pid=66, Graphics Exception\n"
            ));
        }
        fs::write(&log, &text).unwrap();
        let cached = read_with_history(&log, ReadLimits::default(), &state, &no_proc()).unwrap();
        let whole = read_kmsg(&log, ReadLimits::default()).unwrap();
        for s in [&cached, &whole] {
            assert_eq!(s.events.len(), 1 + super::super::kmsg::MAX_EVENTS_PER_KIND);
            assert_eq!((s.events[0].seq, s.events[0].xid), (5, 79));
        }
        same(&cached, &whole);
    }

    /// devgate kept this history as `kmsg-cache.json` before it was `xid-history.json`, in
    /// the same form. An upgrade lands on a running node (the next container runs the new
    /// binary; /run is kept): the history an earlier devgate kept of this boot must still
    /// count, or a report the ring has since lost (a pod's flood of its own XIDs wraps it)
    /// is forgotten at the upgrade and its GPU passes. Once read, it is kept under the new
    /// name only.
    #[test]
    fn an_upgrade_keeps_the_history_an_earlier_devgate_kept() {
        let d = dir("legacy");
        let log = d.0.join("kmsg");
        let state = d.0.join("state");
        let lim = ReadLimits::default();
        fs::write(&log, chatter(0, 4) + AT + XID + &chatter(6, 20)).unwrap();
        read_with_history(&log, lim, &state, &no_proc()).unwrap();
        // what the earlier devgate kept: a report on 0000:99:00 the log no longer holds
        let mut c: History =
            serde_json::from_slice(&fs::read(state.join(HISTORY_FILE)).unwrap()).unwrap();
        c.events[0].pci.bus = 0x99;
        fs::remove_file(state.join(HISTORY_FILE)).unwrap();
        let legacy = state.join("kmsg-cache.json");
        fs::write(&legacy, serde_json::to_vec(&c).unwrap()).unwrap();
        fs::set_permissions(&legacy, fs::Permissions::from_mode(0o600)).unwrap();
        let s = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        assert_eq!(
            s.events.iter().map(|e| e.pci.bus).collect::<Vec<_>>(),
            [0x99],
            "the earlier devgate's history was dropped"
        );
        assert!(!legacy.exists(), "the old name is left behind");
        let kept = load(&state.join(HISTORY_FILE), lim).expect("kept under the new name");
        assert_eq!(kept.events, s.events);
        // the new name, once there, is the history: a stale old file is not read
        fs::write(&legacy, b"{}").unwrap();
        let again = read_with_history(&log, lim, &state, &no_proc()).unwrap();
        assert_eq!(again.events, s.events);
    }

    /// The fuzz seeds are the parser's own cases: the two a scan writes parse, the rest
    /// do not.
    #[test]
    fn fuzz_seeds_parse_as_named() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/xid_history");
        let lim = ReadLimits::default();
        for (name, ok) in [
            ("device.json", true),
            ("file.json", true),
            ("event_after_last_seq.json", false),
            ("truncated.json", false),
            ("other_version.json", false),
        ] {
            let bytes = fs::read(dir.join(name)).unwrap();
            assert_eq!(
                parse(&bytes, lim).is_ok(),
                ok,
                "{name}: {:?}",
                parse(&bytes, lim)
            );
        }
        let c = parse(&fs::read(dir.join("device.json")).unwrap(), lim).unwrap();
        assert_eq!(
            gpu_at::pci_of_uuid(&c.gpu_at, "GPU-efbdfde9-5798-a6e7-4c46-12518fa15375")
                .map(|p| p.to_string()),
            Some("0000:3b:00".into())
        );
    }
}
