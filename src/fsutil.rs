//! The few file primitives every writer and reader in devgate shares: bounded reads,
//! checked directories and atomic replacement (write + fsync + rename + fsync dir).

use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Reads at most `limit` bytes; one byte more is an error rather than a silent truncation.
pub fn read_bounded(mut r: impl Read, limit: u64, what: &str, path: &Path) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.by_ref()
        .take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(format!("cannot read {what}"), path, e))?;
    if buf.len() as u64 > limit {
        return Err(Error::TooLarge {
            what: format!("{what} {}", path.display()),
            limit,
        });
    }
    Ok(buf)
}

/// Opens a regular file without following a final symlink and reads it, bounded.
/// Refusing FIFOs and devices keeps a hostile path from blocking the hook forever.
pub fn read_regular_file(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(format!("cannot open {what}"), path, e))?;
    let meta = f
        .metadata()
        .map_err(|e| Error::io(format!("cannot stat {what}"), path, e))?;
    if !meta.is_file() {
        return Err(Error::invalid(
            format!("{what} {}", path.display()),
            "not a regular file",
        ));
    }
    if meta.len() > limit {
        return Err(Error::TooLarge {
            what: format!("{what} {}", path.display()),
            limit,
        });
    }
    read_bounded(f, limit, what, path)
}

/// A small sysfs attribute, trimmed. Sysfs files report a size of 4096 whatever they hold,
/// so the bound is the only defence against a hostile or broken tree.
pub fn read_attr(path: &Path) -> io::Result<String> {
    let f = File::open(path)?;
    let mut buf = Vec::with_capacity(64);
    f.take(4096).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).trim().to_string())
}

/// Makes sure `dir` exists as a real directory owned by us and writable by nobody else,
/// creating it (and missing parents) with mode 0755 when absent. Anything else — a symlink,
/// a file, a directory another user could write to — is refused: devgate runs as root and a
/// planted directory would let someone else choose what root writes.
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| Error::io("cannot create directory", dir, e))?;
            check_dir(dir)
        }
        Err(e) => Err(Error::io("cannot stat directory", dir, e)),
        Ok(_) => check_dir(dir),
    }
}

/// Checks without creating: see [`ensure_private_dir`].
pub fn check_dir(dir: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(dir).map_err(|e| Error::io("cannot stat directory", dir, e))?;
    if meta.file_type().is_symlink() {
        return Err(Error::unsafe_path(dir, "is a symlink"));
    }
    if !meta.is_dir() {
        return Err(Error::unsafe_path(dir, "is not a directory"));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(Error::unsafe_path(
            dir,
            format!("owned by uid {}, not {}", meta.uid(), euid),
        ));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(Error::unsafe_path(
            dir,
            format!(
                "writable by group or others (mode {:o})",
                meta.permissions().mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Replaces `path` with `data` so that a reader sees the old or the new content, never a
/// mix, and a crash at any point leaves one of the two (plus at most a stray temp file,
/// which readers ignore because it starts with '.').
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    replace_file(path, data, mode, None, true)
}

/// Like `write_atomic`, for a file that is not devgate's own (a bundle's config.json): the
/// new file gets exactly `mode` and the given owner, set through its fd before it is
/// renamed into place.
pub fn write_atomic_owned(path: &Path, data: &[u8], mode: u32, uid: u32, gid: u32) -> Result<()> {
    replace_file(path, data, mode, Some((uid, gid)), true)
}

/// Like `write_atomic` but without the fsyncs: for files on tmpfs (state_dir under /run),
/// where fsync does nothing and a crash loses the whole filesystem anyway. Readers still see
/// the old or the new content, never a mix.
pub fn write_atomic_volatile(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    replace_file(path, data, mode, None, false)
}

fn replace_file(
    path: &Path,
    data: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
    durable: bool,
) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::invalid("path", format!("{} has no parent", path.display())))?;
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid("path", format!("{} has no file name", path.display())))?;
    let tmp: PathBuf = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    // A writer killed mid-write leaves its temp file; a later writer with the same pid must
    // not be blocked by it. The directory is root's (checked by the caller), so the name is.
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| Error::io("cannot create", &tmp, e))?;
        if let Some((uid, gid)) = owner {
            use std::os::fd::AsRawFd;
            nix::unistd::fchown(
                f.as_raw_fd(),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .map_err(|e| Error::io("cannot chown", &tmp, e.into()))?;
            // The umask narrowed the mode at create, and chown may clear set-id bits.
            f.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(|e| Error::io("cannot chmod", &tmp, e))?;
        }
        f.write_all(data)
            .map_err(|e| Error::io("cannot write", &tmp, e))?;
        if durable {
            f.sync_all()
                .map_err(|e| Error::io("cannot fsync", &tmp, e))?;
        }
        fs::rename(&tmp, path).map_err(|e| Error::io("cannot rename into place", path, e))?;
        if durable {
            sync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io("cannot open directory", dir, e))?;
    d.sync_all()
        .map_err(|e| Error::io("cannot fsync directory", dir, e))
}

/// Removes a file and makes the removal durable; a file already gone is not an error.
pub fn remove_durable(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                sync_dir(dir)?;
            }
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("cannot remove", path, e)),
    }
}

/// Removes a file on tmpfs (state_dir): no fsync, as in `write_atomic_volatile`; a file
/// already gone is not an error.
pub fn remove_volatile(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("cannot remove", path, e)),
    }
}

/// A file name derived from input (a container id) must stay one path component.
pub fn is_safe_component(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s != "."
        && s != ".."
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'+' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tempdir(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "devgate-unit-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn bounded_read_refuses_one_byte_more() {
        let data = [b'x'; 11];
        let err = read_bounded(&data[..], 10, "state", Path::new("stdin")).unwrap_err();
        assert!(err.to_string().contains("exceeds 10 bytes"), "{err}");
        assert_eq!(
            read_bounded(&data[..10], 10, "state", Path::new("stdin")).unwrap(),
            vec![b'x'; 10]
        );
    }

    #[test]
    fn read_regular_file_refuses_symlink_and_fifo() {
        let d = tempdir("rrf");
        fs::write(d.join("real"), b"{}").unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
        nix::unistd::mkfifo(
            &d.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert_eq!(read_regular_file(&d.join("real"), 10, "x").unwrap(), b"{}");
        assert!(read_regular_file(&d.join("link"), 10, "x").is_err());
        let e = read_regular_file(&d.join("fifo"), 10, "x").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let d = tempdir("aw");
        let p = d.join("f.json");
        write_atomic(&p, b"one", 0o644).unwrap();
        write_atomic(&p, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn private_dir_refuses_symlink_and_world_writable() {
        let d = tempdir("pd");
        let target = d.join("target");
        fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, d.join("link")).unwrap();
        assert!(ensure_private_dir(&d.join("link")).is_err());
        fs::set_permissions(&target, fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_private_dir(&target).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        ensure_private_dir(&d.join("new/nested")).unwrap();
        assert!(d.join("new/nested").is_dir());
    }

    #[test]
    fn safe_component() {
        assert!(is_safe_component("abc123-x_y.z"));
        for bad in ["", ".", "..", "a/b", ".hidden", "a\0b", &"x".repeat(256)] {
            assert!(!is_safe_component(bad), "{bad:?}");
        }
    }
}
