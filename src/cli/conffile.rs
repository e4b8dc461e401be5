//! Files install-host lays that an operator may edit (containerd's base spec): a reinstall
//! keeps an edit and writes its own version beside it as `.new`, as packages and
//! `make install` do. What was last laid is recorded under the host's
//! /var/lib/devgate/installed, so an edit is told from an older installer's version.

use crate::error::{Error, Result};
use crate::fsutil::write_atomic;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Where install-host records what it last laid, under the host root.
pub(super) const RECORD_DIR: &str = "/var/lib/devgate/installed";

/// The most a laid file may hold when read back: far more than a runtime spec.
const MAX_READ: u64 = 1 << 20;

/// What `lay` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Laid {
    Written(PathBuf),
    /// The file on the host is not what was last laid: kept; ours is at `new`.
    KeptEdited {
        kept: PathBuf,
        new: PathBuf,
    },
}

/// A conffile at `path` whose last laid content is recorded at `record`.
pub(super) struct Conffile<'a> {
    pub path: &'a Path,
    pub record: &'a Path,
}

/// `path` with `.new` appended to its file name.
pub(super) fn new_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".new");
    PathBuf::from(s)
}

/// The file's bytes, `None` where it is not there; never follows a symlink at `p`.
pub(super) fn read_opt(p: &Path) -> Result<Option<Vec<u8>>> {
    match fs::symlink_metadata(p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("cannot stat", p, e)),
        Ok(m) if !m.is_file() => return Err(Error::invalid(p.display().to_string(), "not a file")),
        Ok(m) if m.len() > MAX_READ => {
            return Err(Error::invalid(p.display().to_string(), "too large"))
        }
        Ok(_) => {}
    }
    fs::read(p)
        .map(Some)
        .map_err(|e| Error::io("cannot read", p, e))
}

impl Conffile<'_> {
    /// Whether the file on the host is the operator's: there, and neither `ours` nor what
    /// was last laid (with no record, a file that differs is kept: it may be an edit).
    pub(super) fn edited(&self, ours: &[u8]) -> Result<bool> {
        let Some(current) = read_opt(self.path)? else {
            return Ok(false);
        };
        Ok(current != ours && read_opt(self.record)?.as_deref() != Some(&current[..]))
    }

    /// Lays `ours` unless the host's file is an edit; records what it laid.
    pub(super) fn lay(&self, ours: &[u8]) -> Result<Laid> {
        let new = new_path(self.path);
        if self.edited(ours)? {
            write_atomic(&new, ours, 0o644)?;
            return Ok(Laid::KeptEdited {
                kept: self.path.to_path_buf(),
                new,
            });
        }
        write_atomic(self.path, ours, 0o644)?;
        self.record(ours)?;
        // A .new an earlier run left is stale now that the file is ours again.
        match fs::remove_file(&new) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(Error::io("cannot remove", &new, e))
            }
            _ => {}
        }
        Ok(Laid::Written(self.path.to_path_buf()))
    }

    pub(super) fn record(&self, ours: &[u8]) -> Result<()> {
        if let Some(dir) = self.record.parent() {
            super::hooks_config::ensure_dir(dir)?;
        }
        write_atomic(self.record, ours, 0o644)
    }
}

/// Says what `lay` did, one line.
pub(super) fn say_laid(laid: &Laid) {
    match laid {
        Laid::Written(p) => say!("devgate: installed {}", p.display()),
        Laid::KeptEdited { kept, new } => say!(
            "devgate: kept edited {}; the installer's version is {}",
            kept.display(),
            new.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("devgate-conffile-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn lays_records_keeps_an_edit_and_writes_new() {
        let d = dir("lay");
        let (path, record) = (d.join("f"), d.join("rec/f"));
        let c = Conffile {
            path: &path,
            record: &record,
        };
        assert_eq!(c.lay(b"v1").unwrap(), Laid::Written(path.clone()));
        assert_eq!(c.lay(b"v2").unwrap(), Laid::Written(path.clone()));
        assert_eq!(fs::read(&path).unwrap(), b"v2");
        fs::write(&path, b"mine").unwrap();
        let laid = c.lay(b"v3").unwrap();
        assert!(matches!(laid, Laid::KeptEdited { .. }), "{laid:?}");
        assert_eq!(fs::read(&path).unwrap(), b"mine");
        assert_eq!(fs::read(new_path(&path)).unwrap(), b"v3");
    }

    #[test]
    fn a_file_with_no_record_that_differs_is_kept() {
        let d = dir("norecord");
        let (path, record) = (d.join("f"), d.join("rec/f"));
        fs::write(&path, b"old").unwrap();
        let c = Conffile {
            path: &path,
            record: &record,
        };
        assert!(c.edited(b"v1").unwrap());
        fs::write(&path, b"v1").unwrap();
        assert!(!c.edited(b"v1").unwrap());
    }
}
