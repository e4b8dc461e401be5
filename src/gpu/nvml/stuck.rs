//! Which GPUs have an NVML query process still stuck from an earlier hook call.
//!
//! A GPU that hangs in an uninterruptible driver call keeps its query process as long as
//! the call lasts, maybe until reboot, and no signal ends it. Asking that GPU again on every
//! container start would leave one more stuck process each time (kubelet retries a pod for
//! as long as it exists). So the hook notes a query that missed its deadline in
//! `<state_dir>/nvml-stuck/<pci address>` (`PID STARTTIME SINCE`: the process, its start
//! time in clock ticks after boot from /proc/PID/stat, which tells it from a later process
//! with the same pid, and the Unix second it was noted), and does not ask that GPU again
//! while that process lives: the GPU is unknown at once, with the reason. At most one stuck
//! process per GPU; the file goes when the process has ended.

use super::super::pci::PciAddr;
use super::error::QueryError;
use crate::fsutil::{
    ensure_private_dir, read_regular_file, remove_volatile, write_atomic_volatile,
};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The notes of stuck queries, one per GPU.
pub struct Stuck {
    dir: PathBuf,
}

impl Stuck {
    pub fn new(state_dir: &Path) -> Stuck {
        Stuck {
            dir: state_dir.join("nvml-stuck"),
        }
    }

    fn path(&self, pci: &PciAddr) -> PathBuf {
        self.dir.join(pci.to_string())
    }

    /// Why GPU `pci` is not asked now: an earlier query of it is still stuck. A note whose
    /// process has ended (or is a zombie) is removed.
    pub fn still_stuck(&self, pci: &PciAddr) -> Option<QueryError> {
        let path = self.path(pci);
        let bytes = read_regular_file(&path, 128, "stuck NVML query note").ok()?;
        let note = parse(&String::from_utf8_lossy(&bytes));
        match note {
            Some((pid, start, since)) if started_at(pid) == Some(start) => {
                let secs = now().saturating_sub(since);
                Some(QueryError::Stuck { secs, pid })
            }
            _ => {
                let _ = remove_volatile(&path);
                None
            }
        }
    }

    /// Notes that process `pid` missed its deadline on GPU `pci`.
    pub fn record(&self, pci: &PciAddr, pid: i32) {
        let Some(start) = started_at(pid) else {
            return;
        };
        if ensure_private_dir(&self.dir).is_err() {
            return;
        }
        let note = format!("{pid} {start} {}\n", now());
        if let Err(e) = write_atomic_volatile(&self.path(pci), note.as_bytes(), 0o600) {
            log::warn!("cannot note the stuck NVML query on {pci}: {e}");
        }
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `PID STARTTIME SINCE`.
fn parse(s: &str) -> Option<(i32, u64, u64)> {
    let mut it = s.split_ascii_whitespace();
    let pid = it.next()?.parse().ok().filter(|p| *p > 0)?;
    let start = it.next()?.parse().ok()?;
    let since = it.next()?.parse().ok()?;
    it.next().is_none().then_some((pid, start, since))
}

/// Process `pid`'s start time (field 22 of /proc/PID/stat), None when it is gone or a
/// zombie.
fn started_at(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    start_of_stat(&stat)
}

/// Field 22 of a /proc/PID/stat line; the command name (field 2) may hold spaces and
/// parentheses, so the fields are counted after its last `)`.
fn start_of_stat(stat: &str) -> Option<u64> {
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // fields[0] is field 3, the state
    if matches!(fields.first(), Some(&"Z") | Some(&"X") | None) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_holds_while_its_process_lives_and_goes_with_it() {
        let dir = crate::fsutil::tests::tempdir("stuck");
        let s = Stuck::new(&dir);
        let pci = PciAddr::parse("0000:86:00.0").unwrap();
        assert_eq!(s.still_stuck(&pci), None);
        // this test process stands for the stuck one
        s.record(&pci, std::process::id() as i32);
        // root's alone, as every record devgate writes (SECURITY.md)
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(s.path(&pci))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let why = s.still_stuck(&pci).unwrap();
        assert!(
            matches!(why, QueryError::Stuck { pid, .. } if pid == std::process::id() as i32),
            "{why:?}"
        );
        assert!(
            why.to_string()
                .contains(&format!("(pid {})", std::process::id())),
            "{why}"
        );
        // a note naming a pid whose start time differs (a reused pid) is stale
        let me = started_at(std::process::id() as i32).unwrap();
        let stale = format!("{} {} 0\n", std::process::id(), me + 1);
        std::fs::write(s.path(&pci), stale).unwrap();
        assert_eq!(s.still_stuck(&pci), None);
        assert!(!s.path(&pci).exists());
        // garbage is stale too
        std::fs::write(s.path(&pci), "1 2\n").unwrap();
        assert_eq!(s.still_stuck(&pci), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10";
        assert_eq!(start_of_stat(line), Some(123456));
        let zombie = "42 (x) Z 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 0 0";
        assert_eq!(start_of_stat(zombie), None);
        assert_eq!(parse("12 345 678\n"), Some((12, 345, 678)));
        assert_eq!(parse("0 1 2"), None);
        assert_eq!(parse("1 2 3 4"), None);
    }
}
