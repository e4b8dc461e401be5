//! The quarantine ledger: one file per cordoned device under quarantine_dir, named by type
//! and major:minor (`c-195-1.json`). The file name is the fact; its content says why, when
//! and who. A damaged file still quarantines its device — losing an operator's cordon to a
//! bad write would put a pod back on a broken GPU.

use super::json::{file_name, num_from_file_name, read_json, write_json};
use crate::error::{Error, Result};
use crate::fsutil::{check_dir, ensure_private_dir, remove_durable};
use crate::model::clock;
use crate::model::device::DevNum;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

const MAX_ENTRY_BYTES: u64 = 64 << 10;
pub const MAX_REASON_CHARS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(flatten)]
    pub num: DevNum,
    /// The path the operator named, when a path was named.
    #[serde(default)]
    pub device: Option<PathBuf>,
    pub reason: String,
    pub since: String,
    pub since_unix: u64,
    pub by: String,
}

pub struct Ledger {
    pub dir: PathBuf,
    /// The devices that have a file, listed once on the first lookup: a start asks about
    /// each of its devices twice (probe, then start snapshot), nearly always to hear "no
    /// entry", and one directory read answers them all. None until listed, or after this
    /// process changed the ledger; Some(None) when the directory could not be listed, and
    /// each lookup reads its file.
    listed: RefCell<Option<Option<Vec<DevNum>>>>,
}

/// What the ledger holds for one device: an entry, or a file too damaged to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Clear,
    Cordoned(Entry),
    Damaged { path: PathBuf, error: String },
}

impl Ledger {
    pub fn new(dir: &Path) -> Ledger {
        Ledger {
            dir: dir.to_path_buf(),
            listed: RefCell::new(None),
        }
    }

    /// Whether `num` may have a file: false only when the listing says it has none.
    // Start-up trick (docs/performance.md). Plain: open each file.
    fn may_have(&self, num: DevNum) -> bool {
        let mut listed = self.listed.borrow_mut();
        let names = listed.get_or_insert_with(|| match fs::read_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some(Vec::new()),
            Err(_) => None,
            Ok(rd) => Some(
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().and_then(num_from_file_name))
                    .collect(),
            ),
        });
        names.as_ref().map_or(true, |n| n.contains(&num))
    }

    pub fn path(&self, num: DevNum) -> PathBuf {
        self.dir.join(file_name(num))
    }

    pub fn lookup(&self, num: DevNum) -> Lookup {
        if !self.may_have(num) {
            return Lookup::Clear;
        }
        let path = self.path(num);
        match read_json::<Entry>(&path, MAX_ENTRY_BYTES, "quarantine entry") {
            Ok(None) => Lookup::Clear,
            Ok(Some(e)) => Lookup::Cordoned(e),
            Err(e) => Lookup::Damaged {
                path,
                error: e.to_string(),
            },
        }
    }

    pub fn cordon(
        &self,
        num: DevNum,
        device: Option<PathBuf>,
        reason: &str,
        by: &str,
    ) -> Result<Entry> {
        if reason.trim().is_empty() {
            return Err(Error::Usage("cordon needs --reason TEXT".into()));
        }
        ensure_private_dir(&self.dir)?;
        self.listed.take();
        let (since_unix, since) = clock::now();
        let entry = Entry {
            num,
            device,
            reason: reason.chars().take(MAX_REASON_CHARS).collect(),
            since,
            since_unix,
            by: by.to_string(),
        };
        write_json(&self.path(num), &entry)?;
        Ok(entry)
    }

    /// True when an entry was removed.
    pub fn uncordon(&self, num: DevNum) -> Result<bool> {
        if !self.dir.exists() {
            return Ok(false);
        }
        check_dir(&self.dir)?;
        self.listed.take();
        remove_durable(&self.path(num))
    }

    /// Every quarantined device, damaged entries included; temp files are skipped.
    pub fn list(&self) -> Result<Vec<(DevNum, Lookup)>> {
        let rd = match fs::read_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("cannot list", &self.dir, e)),
            Ok(rd) => rd,
        };
        let mut out = Vec::new();
        for entry in rd.flatten() {
            let name = entry.file_name();
            let Some(num) = name.to_str().and_then(num_from_file_name) else {
                continue;
            };
            out.push((num, self.lookup(num)));
        }
        out.sort_by_key(|(n, _)| *n);
        Ok(out)
    }
}

/// Who is running the command, for the ledger: the sudo user where there is one.
pub fn who() -> String {
    let uid = nix::unistd::getuid().as_raw();
    let name = std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_default();
    let name: String = name.chars().filter(|c| !c.is_control()).take(64).collect();
    if name.is_empty() {
        format!("uid {uid}")
    } else {
        format!("{name} (uid {uid})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::DevType;
    use std::os::unix::fs::PermissionsExt;

    fn ledger(tag: &str) -> Ledger {
        let d = crate::fsutil::tests::tempdir(&format!("devgate-q-{tag}"));
        Ledger::new(&d.join("quarantine"))
    }

    const GPU1: DevNum = DevNum {
        typ: DevType::Char,
        major: 195,
        minor: 1,
    };

    /// One listing answers a process's lookups (a start asks twice per device); changes
    /// this ledger makes are seen at once; a new ledger (the next start) sees the rest.
    #[test]
    fn one_listing_answers_lookups() {
        let l = ledger("listing");
        let other = DevNum { minor: 2, ..GPU1 };
        l.cordon(GPU1, None, "bad", "me").unwrap();
        assert!(matches!(l.lookup(GPU1), Lookup::Cordoned(_)));
        assert_eq!(l.lookup(other), Lookup::Clear);
        // Written behind this ledger's back after it listed: the next start sees it.
        fs::write(l.path(other), b"{ damaged").unwrap();
        assert_eq!(l.lookup(other), Lookup::Clear);
        assert!(matches!(
            Ledger::new(&l.dir).lookup(other),
            Lookup::Damaged { .. }
        ));
        // A damaged file still quarantines; a temp file is no entry.
        fs::write(l.dir.join(".c-195-3.json.tmp"), b"{}").unwrap();
        let fresh = Ledger::new(&l.dir);
        assert_eq!(fresh.lookup(DevNum { minor: 3, ..GPU1 }), Lookup::Clear);
        assert!(fresh.uncordon(other).unwrap());
        assert_eq!(fresh.lookup(other), Lookup::Clear);
        // A directory that cannot be listed: every lookup reads its own file, and one that
        // cannot be read quarantines, as before there was a listing.
        let not_dir = Ledger::new(&l.path(GPU1));
        assert!(matches!(not_dir.lookup(GPU1), Lookup::Damaged { .. }));
    }

    #[test]
    fn cordon_lookup_uncordon_roundtrip() {
        let l = ledger("rt");
        assert_eq!(l.lookup(GPU1), Lookup::Clear);
        let e = l
            .cordon(
                GPU1,
                Some("/dev/nvidia1".into()),
                "xid 79 seen",
                "alice (uid 0)",
            )
            .unwrap();
        assert_eq!(l.lookup(GPU1), Lookup::Cordoned(e.clone()));
        assert!(l.path(GPU1).ends_with("c-195-1.json"));
        let mode = fs::metadata(l.path(GPU1)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(l.list().unwrap(), vec![(GPU1, Lookup::Cordoned(e))]);
        assert!(l.uncordon(GPU1).unwrap());
        assert!(!l.uncordon(GPU1).unwrap());
        assert_eq!(l.lookup(GPU1), Lookup::Clear);
    }

    #[test]
    fn damaged_entry_still_quarantines() {
        let l = ledger("dmg");
        l.cordon(GPU1, None, "r", "me").unwrap();
        fs::write(l.path(GPU1), b"{\"reason\": ").unwrap();
        assert!(matches!(l.lookup(GPU1), Lookup::Damaged { .. }));
        fs::write(l.dir.join(".c-195-1.json.tmp.1"), b"x").unwrap();
        fs::write(l.dir.join("notes.txt"), b"x").unwrap();
        assert_eq!(l.list().unwrap().len(), 1);
    }

    #[test]
    fn empty_reason_is_refused_and_long_reason_trimmed() {
        let l = ledger("reason");
        assert!(l.cordon(GPU1, None, "  ", "me").is_err());
        let e = l.cordon(GPU1, None, &"r".repeat(5000), "me").unwrap();
        assert_eq!(e.reason.len(), MAX_REASON_CHARS);
    }

    #[test]
    fn file_names_roundtrip() {
        let b = DevNum {
            typ: DevType::Block,
            major: 8,
            minor: 16,
        };
        assert_eq!(num_from_file_name(&file_name(b)), Some(b));
        assert_eq!(num_from_file_name("x-1-2.json"), None);
        assert_eq!(num_from_file_name("c-1.json"), None);
    }
}
