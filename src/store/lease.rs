//! Spare leases: which container holds which spare. One small JSON file per spare under
//! state_dir/leases (`c-195-7.json`), so damage to one file is confined to one spare; every
//! change is made under an flock on `leases/.lock` and written atomically.
//!
//! A lease file that cannot be read is never overwritten and never reclaimed: it may be
//! the only record that a container uses the spare. The operator removes it.

use super::json::{file_name, num_from_file_name, read_json, write_json_volatile};
use crate::error::{Error, Result};
use crate::fsutil::{ensure_private_dir, remove_volatile};
use crate::model::class::Class;
use crate::model::device::DevNum;
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MAX_LEASE_BYTES: u64 = 64 << 10;
pub(crate) const LOCK_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub spare: DevNum,
    pub spare_path: PathBuf,
    pub class: Class,
    pub container_id: String,
    pub pid: i32,
    /// The holder's start time (/proc/PID/stat field 22), so a reused pid is not taken
    /// for the holder.
    #[serde(default)]
    pub pid_start: Option<u64>,
    /// The device the spare stands in for.
    pub replaces: DevNum,
    #[serde(default)]
    pub container_path: Option<PathBuf>,
    /// The runtime's state directory for the container (`<root>/<id>`), when the lease
    /// was taken before the container had a process (the runtime wrapper): while it
    /// exists the container does, whatever became of `pid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_state: Option<PathBuf>,
    pub since: String,
    pub since_unix: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    Free,
    Held(Lease),
    Damaged { path: PathBuf, error: String },
}

/// What a request for one spare among several came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one per hook call
pub enum Outcome {
    /// `reclaimed` is the lease of a container that no longer exists, taken over.
    Leased {
        lease: Lease,
        reclaimed: Option<Lease>,
        reused: bool,
    },
    /// No candidate was free: why, one clause per candidate.
    NoneFree(Vec<String>),
}

/// /proc/PID/stat is one line of some 50 numbers after a command name of at most 64
/// bytes: well under 1 KiB. A longer one is not the kernel's.
const MAX_PROC_STAT_BYTES: u64 = 4096;

/// The start time of a process, or None when it does not exist. Read through the bounded
/// reader, which gives procfs's size-0 file room for its whole text in the first read(2).
pub(crate) fn pid_start(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    let f = File::open(&path).ok()?;
    let bytes = crate::fsutil::read_bounded(f, MAX_PROC_STAT_BYTES, "process stat", &path).ok()?;
    start_time(&bytes)
}

/// The start time (field 22) in the text of /proc/PID/stat. The command name (field 2,
/// in parentheses) is the process's own to choose (prctl PR_SET_NAME, the name it was
/// exec'd by): any bytes, `)` and invalid UTF-8 included. So the fields are counted from
/// the last `)`, and only what follows it, the kernel's numbers, has to be text: a name
/// that is not UTF-8 made a live process look gone (its record pruned as a dead
/// container's, its spare's lease free for another).
pub(crate) fn start_time(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    std::str::from_utf8(&stat[close + 1..])
        .ok()?
        .split_ascii_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Whether `pid` is alive and, where its start time was kept (`start`), still the same
/// process: the kernel reuses pids. Without a kept start time, the pid alone decides.
pub(crate) fn same_process(pid: i32, start: Option<u64>) -> bool {
    match (pid_start(pid), start) {
        (None, _) => false,
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
    }
}

/// Whether the lease's holder still exists: its pid is alive and is the same process, or
/// the runtime still keeps state for its container.
pub(crate) fn holder_alive(l: &Lease) -> bool {
    same_process(l.pid, l.pid_start) || l.runtime_state.as_deref().is_some_and(Path::exists)
}

/// Holds the ledger lock until dropped.
pub struct Locked {
    _file: File,
}

pub struct Leases {
    pub dir: PathBuf,
}

impl Leases {
    pub fn new(state_dir: &Path) -> Leases {
        Leases {
            dir: state_dir.join("leases"),
        }
    }

    pub fn path(&self, num: DevNum) -> PathBuf {
        self.dir.join(file_name(num))
    }

    /// Takes the ledger lock, waiting at most `timeout`.
    pub(crate) fn lock(&self, timeout: Duration) -> Result<Locked> {
        ensure_private_dir(&self.dir)?;
        let path = self.dir.join(".lock");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| Error::io("cannot open lease lock", &path, e))?;
        let deadline = Instant::now() + timeout;
        loop {
            // SAFETY: flock on an fd this function owns.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) && e.raw_os_error() != Some(libc::EINTR)
            {
                return Err(Error::io("cannot lock", &path, e));
            }
            if Instant::now() >= deadline {
                return Err(Error::invalid(
                    format!("lease lock {}", path.display()),
                    format!(
                        "still held by another devgate after {} s",
                        timeout.as_secs()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // Under the lock no other writer is running: a temp file left now is a dead
        // writer's and will never be renamed into place.
        if let Ok(rd) = fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                if crate::fsutil::is_temp_name(&e.file_name()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        Ok(Locked { _file: f })
    }

    pub(crate) fn lookup(&self, num: DevNum) -> Slot {
        let path = self.path(num);
        match read_json::<Lease>(&path, MAX_LEASE_BYTES, "lease") {
            Ok(None) => Slot::Free,
            Ok(Some(l)) if l.spare == num => Slot::Held(l),
            Ok(Some(l)) => Slot::Damaged {
                error: format!("names spare {} in the file for {}", l.spare, num),
                path,
            },
            Err(e) => Slot::Damaged {
                path,
                error: e.to_string(),
            },
        }
    }

    /// Every lease file, damaged ones included.
    pub fn list(&self) -> Result<Vec<(DevNum, Slot)>> {
        let rd = match fs::read_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("cannot list", &self.dir, e)),
            Ok(rd) => rd,
        };
        let mut out: Vec<(DevNum, Slot)> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(num_from_file_name))
            .map(|n| (n, self.lookup(n)))
            .collect();
        out.sort_by_key(|(n, _)| *n);
        Ok(out)
    }

    fn write(&self, lease: &Lease) -> Result<()> {
        write_json_volatile(&self.path(lease.spare), lease)
    }

    /// Leases the first free candidate to `want.container_id`, under the lock. A spare
    /// already leased to this same container for this same device is returned as it is (the
    /// hook ran twice); one leased to a container that is gone is reclaimed.
    pub(crate) fn acquire(
        &self,
        candidates: &[(DevNum, PathBuf)],
        want: &Lease,
    ) -> Result<Outcome> {
        let _g = self.lock(LOCK_TIMEOUT)?;
        // The same container asking again (prestart and createRuntime both configured, or
        // a rerun) gets the spare it already holds, wherever it stands in the list: taking
        // an earlier one that has come free since would lease two and mismatch the node.
        for (num, _) in candidates {
            if let Slot::Held(h) = self.lookup(*num) {
                if h.container_id == want.container_id
                    && h.replaces == want.replaces
                    && holder_alive(&h)
                {
                    return Ok(Outcome::Leased {
                        lease: h,
                        reclaimed: None,
                        reused: true,
                    });
                }
            }
        }
        let mut why = Vec::new();
        for (num, path) in candidates {
            let mut lease = want.clone();
            lease.spare = *num;
            lease.spare_path = path.clone();
            let reclaimed = match self.lookup(*num) {
                Slot::Free => None,
                Slot::Damaged { path: p, error } => {
                    why.push(format!(
                        "{}: lease file {} is damaged ({error}); remove it once no container uses the spare",
                        path.display(),
                        p.display()
                    ));
                    continue;
                }
                Slot::Held(h) if holder_alive(&h) => {
                    why.push(format!(
                        "{} leased to {} since {}",
                        path.display(),
                        h.container_id,
                        h.since
                    ));
                    continue;
                }
                Slot::Held(h) => Some(h),
            };
            self.write(&lease)?;
            return Ok(Outcome::Leased {
                lease,
                reclaimed,
                reused: false,
            });
        }
        Ok(Outcome::NoneFree(why))
    }

    /// The leases `container_id` holds (read without the lock: each file is replaced
    /// atomically).
    pub fn held_by(&self, container_id: &str) -> Result<Vec<Lease>> {
        Ok(self
            .list()?
            .into_iter()
            .filter_map(|(_, s)| match s {
                Slot::Held(l) if l.container_id == container_id => Some(l),
                _ => None,
            })
            .collect())
    }

    /// Points `container_id`'s leases at its process once it has one (a lease the runtime
    /// wrapper took names the runtime's pid); returns how many changed.
    pub fn adopt(&self, container_id: &str, pid: i32) -> Result<usize> {
        let _g = self.lock(LOCK_TIMEOUT)?;
        let mut n = 0;
        for mut l in self.held_by(container_id)? {
            if l.pid == pid {
                continue;
            }
            l.pid = pid;
            l.pid_start = pid_start(pid);
            self.write(&l)?;
            n += 1;
        }
        Ok(n)
    }

    /// Releases one spare if `container_id` holds it; true when a lease was removed.
    pub(crate) fn release(&self, num: DevNum, container_id: &str) -> Result<bool> {
        let _g = self.lock(LOCK_TIMEOUT)?;
        match self.lookup(num) {
            Slot::Held(l) if l.container_id == container_id => remove_volatile(&self.path(num)),
            _ => Ok(false),
        }
    }

    /// Releases every lease `container_id` holds; idempotent.
    pub(crate) fn release_container(&self, container_id: &str) -> Result<Vec<Lease>> {
        if !self.dir.exists() {
            return Ok(Vec::new());
        }
        let _g = self.lock(LOCK_TIMEOUT)?;
        let mut out = Vec::new();
        for (num, slot) in self.list()? {
            if let Slot::Held(l) = slot {
                if l.container_id == container_id {
                    remove_volatile(&self.path(num))?;
                    out.push(l);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::DevType;

    fn leases(tag: &str) -> Leases {
        let d = crate::fsutil::tests::tempdir(&format!("devgate-lease-{tag}"));
        Leases::new(&d)
    }

    fn num(minor: u32) -> DevNum {
        DevNum {
            typ: DevType::Char,
            major: 195,
            minor,
        }
    }

    fn want(id: &str, pid: i32) -> Lease {
        Lease {
            spare: num(0),
            spare_path: PathBuf::new(),
            class: "nvidia-gpu".into(),
            container_id: id.into(),
            pid,
            pid_start: pid_start(pid),
            replaces: num(1),
            container_path: Some("/dev/nvidia1".into()),
            runtime_state: None,
            since: "t".into(),
            since_unix: 0,
        }
    }

    fn cands() -> Vec<(DevNum, PathBuf)> {
        vec![
            (num(6), "/dev/nvidia6".into()),
            (num(7), "/dev/nvidia7".into()),
        ]
    }

    fn leased(o: Outcome) -> Lease {
        match o {
            Outcome::Leased { lease, .. } => lease,
            Outcome::NoneFree(w) => panic!("none free: {w:?}"),
        }
    }

    #[test]
    fn asking_again_returns_the_held_spare_even_when_an_earlier_one_came_free() {
        let l = leases("again");
        let me = std::process::id() as i32;
        assert_eq!(
            leased(l.acquire(&cands(), &want("a", me)).unwrap()).spare,
            num(6)
        );
        assert_eq!(
            leased(l.acquire(&cands(), &want("b", me)).unwrap()).spare,
            num(7)
        );
        l.release_container("a").unwrap(); // 6 comes free
        match l.acquire(&cands(), &want("b", me)).unwrap() {
            Outcome::Leased { lease, reused, .. } => assert!(reused && lease.spare == num(7)),
            o => panic!("{o:?}"),
        }
        let held: Vec<DevNum> = l
            .list()
            .unwrap()
            .into_iter()
            .filter(|(_, s)| matches!(s, Slot::Held(_)))
            .map(|(n, _)| n)
            .collect();
        assert_eq!(held, [num(7)], "b must not hold two spares");
    }

    #[test]
    fn leases_each_spare_once_and_releases() {
        let l = leases("once");
        let me = std::process::id() as i32;
        let a = leased(l.acquire(&cands(), &want("a", me)).unwrap());
        assert_eq!(a.spare, num(6));
        let b = leased(l.acquire(&cands(), &want("b", me)).unwrap());
        assert_eq!(b.spare, num(7));
        match l.acquire(&cands(), &want("c", me)).unwrap() {
            Outcome::NoneFree(w) => {
                assert_eq!(w.len(), 2);
                assert!(w[0].starts_with("/dev/nvidia6 leased to a since"), "{w:?}");
            }
            o => panic!("{o:?}"),
        }
        // the same container asking again gets its own lease back
        match l.acquire(&cands(), &want("a", me)).unwrap() {
            Outcome::Leased { lease, reused, .. } => assert!(reused && lease.spare == num(6)),
            o => panic!("{o:?}"),
        }
        assert!(!l.release(num(6), "b").unwrap(), "b does not hold 6");
        assert_eq!(l.release_container("a").unwrap().len(), 1);
        assert!(l.release_container("a").unwrap().is_empty(), "idempotent");
        assert_eq!(
            leased(l.acquire(&cands(), &want("c", me)).unwrap()).spare,
            num(6)
        );
    }

    /// A lease names a pod's container, its pid and the devices it holds: another local
    /// user reads neither it nor the ledger's lock.
    #[test]
    fn a_lease_is_readable_by_root_alone() {
        use std::os::unix::fs::PermissionsExt;
        let l = leases("private");
        leased(
            l.acquire(&cands(), &want("a", std::process::id() as i32))
                .unwrap(),
        );
        for p in [l.path(num(6)), l.dir.join(".lock")] {
            let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(format!("{mode:o}"), "600", "{}", p.display());
        }
    }

    #[test]
    fn dead_holder_is_reclaimed_damaged_file_is_kept() {
        let l = leases("reclaim");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id() as i32;
        child.wait().unwrap();
        let mut w = want("gone", dead);
        w.pid_start = Some(1);
        leased(l.acquire(&cands()[..1], &w).unwrap());
        match l
            .acquire(&cands()[..1], &want("new", std::process::id() as i32))
            .unwrap()
        {
            Outcome::Leased {
                lease, reclaimed, ..
            } => {
                assert_eq!(lease.container_id, "new");
                assert_eq!(reclaimed.unwrap().container_id, "gone");
            }
            o => panic!("{o:?}"),
        }
        fs::write(l.path(num(7)), b"{\"spare\": ").unwrap();
        match l
            .acquire(&cands()[1..], &want("x", std::process::id() as i32))
            .unwrap()
        {
            Outcome::NoneFree(w) => assert!(w[0].contains("is damaged"), "{w:?}"),
            o => panic!("{o:?}"),
        }
        assert_eq!(
            fs::read(l.path(num(7))).unwrap(),
            b"{\"spare\": ",
            "never overwritten"
        );
        assert!(matches!(l.list().unwrap()[1].1, Slot::Damaged { .. }));
        // a stray temp file of a dead writer is swept under the lock
        fs::write(l.dir.join(".c-195-6.json.tmp.99999"), b"x").unwrap();
        drop(l.lock(LOCK_TIMEOUT).unwrap());
        assert!(!l.dir.join(".c-195-6.json.tmp.99999").exists());
    }

    #[test]
    fn runtime_state_keeps_a_lease_of_a_gone_pid_and_adopt_repoints_it() {
        let l = leases("witness");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id() as i32;
        child.wait().unwrap();
        let state = l.dir.parent().unwrap().join("runtime-root/c1");
        fs::create_dir_all(&state).unwrap();
        let mut w = want("c1", dead);
        w.pid_start = Some(1);
        w.runtime_state = Some(state.clone());
        leased(l.acquire(&cands()[..1], &w).unwrap());
        let me = std::process::id() as i32;
        match l.acquire(&cands()[..1], &want("c2", me)).unwrap() {
            Outcome::NoneFree(why) => assert!(why[0].contains("leased to c1"), "{why:?}"),
            o => panic!("the runtime still has c1: {o:?}"),
        }
        assert_eq!(l.adopt("c1", me).unwrap(), 1);
        assert_eq!(l.adopt("c1", me).unwrap(), 0, "already pointed");
        let held = l.held_by("c1").unwrap();
        assert_eq!((held[0].pid, held[0].pid_start), (me, pid_start(me)));
        // gone from the runtime and from the process table: reclaimable
        fs::remove_dir(&state).unwrap();
        let mut w = held[0].clone();
        w.pid = dead;
        w.pid_start = Some(1);
        l.write(&w).unwrap();
        assert!(!holder_alive(&w));
        assert!(matches!(
            l.acquire(&cands()[..1], &want("c2", me)).unwrap(),
            Outcome::Leased {
                reclaimed: Some(_),
                ..
            }
        ));
    }

    /// The command name is the process's to choose: `)`, spaces and bytes that are not
    /// UTF-8 in it do not move or hide the start time.
    #[test]
    fn the_start_time_is_found_whatever_the_command_name() {
        let rest = b" S 1 2 3 4 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        for comm in [&b"sh"[..], b"a) S 1 2 3", b"\xff\xfe)(", b"", b"x y  z"] {
            let mut line = b"42 (".to_vec();
            line.extend_from_slice(comm);
            line.push(b')');
            line.extend_from_slice(rest);
            assert_eq!(start_time(&line), Some(987654), "{line:?}");
        }
        assert_eq!(start_time(b"42 (sh) S 1 2"), None);
        assert_eq!(start_time(b"42 sh S"), None);
    }

    #[test]
    fn pid_start_of_self_and_of_nothing() {
        assert!(pid_start(std::process::id() as i32).is_some());
        assert_eq!(pid_start(0), None);
        assert_eq!(pid_start(i32::MAX), None);
    }
}
