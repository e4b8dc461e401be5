//! Test temp directories removed when the test process exits. Test-only: compiled into the
//! crate's unit tests (`fsutil::tests::tempdir`) and, through `#[path]`, into the
//! integration tests' `tests/common::tempdir`, so both remove theirs the same way. Left
//! behind, a thousand per `make test` (some holding a busybox rootfs) filled the build
//! machine's disk across runs.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

/// Set to keep the test directories for a look after a failure.
pub const KEEP_ENV: &str = "DEVGATE_KEEP_TEST_DIRS";

static CREATED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static AT_EXIT: Once = Once::new();

/// Removes `dir` when the process exits (not when the test ends: a runtime or a stray
/// child may still use it), unless `DEVGATE_KEEP_TEST_DIRS` is set then.
pub fn remove_at_exit(dir: &Path) {
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain function; libtest ends the process through exit(3).
        unsafe { libc::atexit(remove_created) };
    });
    CREATED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.to_path_buf());
}

extern "C" fn remove_created() {
    if std::env::var_os(KEEP_ENV).is_some() {
        return;
    }
    let dirs = std::mem::take(&mut *CREATED.lock().unwrap_or_else(|e| e.into_inner()));
    let mounts = mount_points();
    for d in dirs {
        remove_tree(&d, &mounts);
    }
}

/// Every mount point in this process's mount namespace.
pub fn mount_points() -> Vec<PathBuf> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .collect()
}

/// Removes `path` and what is below it, never following a symlink and never entering a
/// mount point (a test that left a bind mount of a host directory there must not have it
/// emptied): what is mounted stays, with the directories above it.
pub fn remove_tree(path: &Path, mounts: &[PathBuf]) {
    if mounts.iter().any(|m| m == path) {
        return;
    }
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        if let Ok(entries) = fs::read_dir(path) {
            for e in entries.flatten() {
                remove_tree(&e.path(), mounts);
            }
        }
        let _ = fs::remove_dir(path);
    } else {
        let _ = fs::remove_file(path);
    }
}
