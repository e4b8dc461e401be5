//! Per-container records under state_dir: `containers/<id>.json` written at start,
//! `exits/<id>.json` at stop, and `decided/<id>.json`, the runtime wrapper's marker. The
//! file layout lives here; what a record holds is `report::record`'s (the marker's is
//! `store::marker`'s).

use super::json::{read_json, write_json_volatile};
use crate::error::{Error, Result};
use crate::fsutil::{ensure_private_dir, is_safe_component, is_temp_name, remove_volatile};
use crate::model::text::one_line;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};

const MAX_RECORD_BYTES: u64 = 4 << 20;

/// Which of a container's two records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// What devgate decided at start: `containers/<id>.json`.
    Start,
    /// What devgate found at stop: `exits/<id>.json`.
    Exit,
    /// The runtime wrapper's "already decided" marker: `decided/<id>.json`.
    Decided,
    /// The last faulted run of a pod's container: `last-faults/<pod uid>_<name>.json`,
    /// keyed by pod, not by container id (report::prior).
    LastFault,
}

impl Kind {
    pub(crate) fn dir(self, state_dir: &Path) -> PathBuf {
        match self {
            Kind::Start => state_dir.join("containers"),
            Kind::Exit => state_dir.join("exits"),
            Kind::Decided => state_dir.join("decided"),
            Kind::LastFault => state_dir.join("last-faults"),
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Start => "container record",
            Kind::Exit => "exit record",
            Kind::Decided => "decided marker",
            Kind::LastFault => "last-fault record",
        }
    }
}

fn checked_id(id: &str) -> Result<&str> {
    if !is_safe_component(id) {
        return Err(Error::invalid(
            "container id",
            format!(
                "{:?} is not usable as a file name",
                one_line(&id.chars().take(80).collect::<String>())
            ),
        ));
    }
    Ok(id)
}

fn path(state_dir: &Path, kind: Kind, id: &str) -> Result<PathBuf> {
    Ok(kind
        .dir(state_dir)
        .join(format!("{}.json", checked_id(id)?)))
}

pub(crate) fn read<T: DeserializeOwned>(
    state_dir: &Path,
    kind: Kind,
    id: &str,
) -> Result<Option<T>> {
    read_json(&path(state_dir, kind, id)?, MAX_RECORD_BYTES, kind.what())
}

pub(crate) fn read_file<T: DeserializeOwned>(path: &Path, kind: Kind) -> Result<Option<T>> {
    read_json(path, MAX_RECORD_BYTES, kind.what())
}

pub(crate) fn write(state_dir: &Path, kind: Kind, id: &str, record: &impl Serialize) -> Result<()> {
    let path = path(state_dir, kind, id)?;
    ensure_private_dir(&kind.dir(state_dir))?;
    write_json_volatile(&path, record)
}

/// As `write`, for a record already serialized by `store::to_json_line`.
pub(crate) fn write_line(state_dir: &Path, kind: Kind, id: &str, line: &[u8]) -> Result<()> {
    let path = path(state_dir, kind, id)?;
    ensure_private_dir(&kind.dir(state_dir))?;
    crate::fsutil::write_atomic_volatile(&path, line, 0o600)
}

pub(crate) fn remove(state_dir: &Path, kind: Kind, id: &str) -> Result<bool> {
    remove_volatile(&path(state_dir, kind, id)?)
}

/// Removes the oldest records (by modification time) beyond `keep`, except those `spare`
/// keeps. This runs on every start and stop, so it must not cost a stat per record (with the
/// default 1000 records that was more than the rest of the hook): it waits until there are
/// `keep + slack(keep)` entries, counted from the directory's own size on tmpfs (where
/// state_dir lives) or from its names elsewhere, then stats, sorts and cuts back to `keep`.
/// So a full pass runs once per `slack` new records, and at most `keep + slack` are kept.
// Start-up trick (docs/performance.md). Plain: list and stat every record each call.
pub(crate) fn prune(state_dir: &Path, kind: Kind, keep: usize, spare: impl Fn(&Path) -> bool) {
    let dir = kind.dir(state_dir);
    let limit = keep.saturating_add(slack(keep));
    if tmpfs_entries(&dir).is_some_and(|n| n < limit) {
        return;
    }
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return;
    };
    let mut names: Vec<std::ffi::OsString> = Vec::new();
    for n in rd.flatten().map(|e| e.file_name()) {
        if is_record_name(&n) {
            names.push(n);
        } else if is_temp_name(&n) {
            remove_if_stale(&dir.join(n));
        }
    }
    if names.len() < limit {
        return;
    }
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = names
        .into_iter()
        .map(|n| dir.join(n))
        .filter_map(|p| Some((std::fs::symlink_metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    if files.len() <= keep {
        return;
    }
    files.sort();
    for (_, p) in &files[..files.len() - keep] {
        if !spare(p) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// How many records past `keep` wait for the next pruning pass.
fn slack(keep: usize) -> usize {
    (keep / 16).max(1)
}

/// A temp file a write left when its hook was killed between create and rename (a
/// runtime's hook timeout) is no record and no pass ever removed it: each kill left one
/// more, counted in a tmpfs directory's size too. A write takes milliseconds, so one older
/// than this is no writer's any more.
const STALE_TEMP: std::time::Duration = std::time::Duration::from_secs(600);

fn remove_if_stale(p: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return;
    };
    let old = meta
        .modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .is_some_and(|age| age > STALE_TEMP);
    if meta.is_file() && old {
        let _ = std::fs::remove_file(p);
    }
}

fn is_record_name(n: &std::ffi::OsStr) -> bool {
    let n = n.to_string_lossy();
    n.ends_with(".json") && !n.starts_with('.')
}

/// The number of entries in `dir` (an upper bound: its temp files, `.` and `..` count too)
/// where the directory's stat tells it exactly: tmpfs adds BOGO_DIRENT_SIZE, 20 bytes, to a
/// directory's size per entry (mm/shmem.c), `.` and `..` included. None on any other
/// filesystem, or for a size that is not what tmpfs makes, and then the caller lists.
fn tmpfs_entries(dir: &Path) -> Option<usize> {
    let fs = nix::sys::statfs::statfs(dir).ok()?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return None;
    }
    let size = std::fs::symlink_metadata(dir).ok()?.len();
    entries_from_tmpfs_size(size)
}

fn entries_from_tmpfs_size(size: u64) -> Option<usize> {
    const BOGO_DIRENT_SIZE: u64 = 20;
    if size < 2 * BOGO_DIRENT_SIZE || size % BOGO_DIRENT_SIZE != 0 {
        return None;
    }
    usize::try_from(size / BOGO_DIRENT_SIZE).ok()
}

/// The container ids that have a record of `kind`.
pub(crate) fn ids(state_dir: &Path, kind: Kind) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(kind.dir(state_dir)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let id = name.to_str()?.strip_suffix(".json")?;
            (!id.starts_with('.')).then(|| id.to_string())
        })
        .collect()
}

/// Every readable record of `kind`; damaged files and temp files are skipped.
pub(crate) fn list<T: DeserializeOwned>(state_dir: &Path, kind: Kind) -> Vec<T> {
    let Ok(rd) = std::fs::read_dir(kind.dir(state_dir)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| read_file(&e.path(), kind).ok().flatten())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn a_tmpfs_directory_size_counts_its_entries() {
        assert_eq!(entries_from_tmpfs_size(40), Some(2)); // empty: . and ..
        assert_eq!(entries_from_tmpfs_size(140), Some(7));
        assert_eq!(entries_from_tmpfs_size(4096), None); // ext4's block, not tmpfs's count
        assert_eq!(entries_from_tmpfs_size(20), None);
        assert_eq!(entries_from_tmpfs_size(0), None);
    }

    fn records(state: &Path, n: usize) -> Vec<PathBuf> {
        let dir = Kind::Exit.dir(state);
        std::fs::create_dir_all(&dir).unwrap();
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        (0..n)
            .map(|i| {
                let p = dir.join(format!("c{i:03}.json"));
                let f = std::fs::File::create(&p).unwrap();
                f.set_modified(base + Duration::from_secs(i as u64))
                    .unwrap();
                p
            })
            .collect()
    }

    #[test]
    fn pruning_waits_for_its_slack_then_cuts_back_to_keep_oldest_first() {
        let state = crate::fsutil::tests::tempdir("prune");
        let keep = 32; // slack 2
        let files = records(&state, keep + 1);
        std::fs::write(Kind::Exit.dir(&state).join(".c999.json.tmp"), "").unwrap();
        prune(&state, Kind::Exit, keep, |_| false);
        assert!(
            files.iter().all(|p| p.exists()),
            "pruned before the slack was used"
        );

        let files = records(&state, keep + 2);
        prune(&state, Kind::Exit, keep, |_| false);
        assert!(
            !files[0].exists() && !files[1].exists(),
            "the oldest two stay"
        );
        assert!(files[2..].iter().all(|p| p.exists()));

        // a record `spare` keeps is passed over, not replaced by a newer one
        let files = records(&state, keep + 2);
        prune(&state, Kind::Exit, keep, |p| p == files[0]);
        assert!(files[0].exists() && !files[1].exists() && files[2].exists());
        let _ = std::fs::remove_dir_all(&state);
    }

    /// A hook killed between a record's temp file and its rename (a runtime's hook
    /// timeout) left the temp file for good: no record, never pruned, so state grew by one
    /// per kill and each counted in the tmpfs size. A pass removes those no writer can still
    /// hold, and leaves a fresh one (a write in flight) alone.
    #[test]
    fn a_pass_removes_temp_files_a_killed_writer_left() {
        let state = crate::fsutil::tests::tempdir("prune-tmp");
        let keep = 32;
        records(&state, keep + 2);
        let dir = Kind::Exit.dir(&state);
        let long = format!(".{}.tmp.4244", "c".repeat(200));
        let f = std::fs::File::create(dir.join(&long)).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
        let stale = dir.join(".c900.json.tmp.4242");
        let fresh = dir.join(".c901.json.tmp.4243");
        let f = std::fs::File::create(&stale).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
        std::fs::File::create(&fresh).unwrap();
        prune(&state, Kind::Exit, keep, |_| false);
        assert!(!stale.exists(), "a killed writer's temp file stays");
        assert!(!dir.join(&long).exists(), "a temp name cut short stays");
        assert!(fresh.exists(), "a write in flight lost its temp file");
        let _ = std::fs::remove_dir_all(&state);
    }
}
