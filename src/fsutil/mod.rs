//! The few file primitives every writer and reader in devgate shares: bounded reads,
//! checked directories and atomic replacement (write + fsync + rename + fsync dir).

use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

mod beneath;
pub mod pidfd;
pub mod program;
#[cfg(test)]
pub(crate) mod test_dirs;
pub use beneath::{lstat_beneath, openat2, stat_beneath};

/// Reads at most `limit` bytes; one byte more is an error rather than a silent truncation.
pub fn read_bounded(r: impl Read, limit: u64, what: &str, path: &Path) -> Result<Vec<u8>> {
    read_bounded_sized(r, limit, 0, what, path)
}

/// Room for the first read of a file whose size is not known up front: procfs and sysfs
/// files stat as 0 bytes (and a pipe has no size). procfs makes a file's whole text again
/// on every read(2), so std's start at 32 bytes, doubling, was five reads of
/// /proc/PID/stat (about 300 bytes) where one does.
const UNKNOWN_SIZE_START: u64 = 1024;

/// [`read_bounded`] into a buffer sized for `expect` bytes up front (0: not known, then
/// [`UNKNOWN_SIZE_START`]): std's read_to_end starts at 32 bytes and doubles, which for a
/// config.json of a few KB is a dozen reads.
// Start-up trick (docs/performance.md). Plain: `read_to_end` from empty.
fn read_bounded_sized(
    mut r: impl Read,
    limit: u64,
    expect: u64,
    what: &str,
    path: &Path,
) -> Result<Vec<u8>> {
    let expect = if expect == 0 {
        UNKNOWN_SIZE_START
    } else {
        expect
    };
    // One byte more than expected, so that the read which sees the end needs no growth.
    let mut buf = Vec::with_capacity(expect.min(limit).saturating_add(1) as usize);
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
    let (f, meta) = open_regular(path, limit, what)?;
    read_bounded_sized(f, limit, meta.len(), what, path)
}

/// [`read_regular_file`] for a file another root program writes for devgate to act on (the
/// node agent's cluster taints): the file must also be root's (or this user's) and
/// writable by nobody else, in a directory safe along its whole path ([`check_dir`]),
/// since whoever could write either could choose what devgate reads. A missing file is
/// one failed open, its directory not checked.
pub fn read_trusted_file(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    let (f, meta) = open_regular(path, limit, what)?;
    judge_owner(path, meta.uid(), nix::unistd::geteuid().as_raw())?;
    if meta.mode() & 0o022 != 0 {
        return Err(Error::unsafe_path(
            path,
            format!(
                "is writable by group or others (mode {:o})",
                meta.mode() & 0o7777
            ),
        ));
    }
    check_dir(path.parent().unwrap_or(Path::new("/")))?;
    read_bounded_sized(f, limit, meta.len(), what, path)
}

/// The open and the checks [`read_regular_file`] makes before it reads: no final symlink,
/// a regular file, at most `limit` bytes by its size.
fn open_regular(path: &Path, limit: u64, what: &str) -> Result<(File, fs::Metadata)> {
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
    Ok((f, meta))
}

/// A small sysfs attribute, trimmed. Sysfs files report a size of 4096 whatever they hold,
/// so the bound is the only defence against a hostile or broken tree.
pub fn read_attr(path: &Path) -> io::Result<String> {
    let f = File::open(path)?;
    let mut buf = Vec::with_capacity(64);
    f.take(4096).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).trim().to_string())
}

/// The temp file an atomic write of `name` goes through: `.<name>.tmp.<pid>`, keeping at
/// most 200 bytes of `name`, so that a final name near NAME_MAX (255 bytes: a long
/// container id) still has a temp name that fits.
fn temp_name(name: &std::ffi::OsStr) -> std::ffi::OsString {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let stem = &name.as_bytes()[..name.len().min(200)];
    let mut t = b".".to_vec();
    t.extend_from_slice(stem);
    t.extend_from_slice(format!(".tmp.{}", std::process::id()).as_bytes());
    std::ffi::OsString::from_vec(t)
}

/// Whether `name` is one of [`temp_name`]'s: what a writer killed between create and rename
/// leaves behind (the stem may have lost its `.json` to the 200-byte cut).
pub fn is_temp_name(name: &std::ffi::OsStr) -> bool {
    let n = name.to_string_lossy();
    n.starts_with('.')
        && n.rsplit_once(".tmp.")
            .is_some_and(|(_, pid)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Makes sure `dir` exists as a real directory owned by us and writable by nobody else,
/// along its whole path (see [`check_path`]), creating it (and missing parents) with mode
/// 0755 when absent. Anything else — a symlink, a file, a directory another user could
/// write to or rename — is refused: devgate runs as root and a planted directory would let
/// someone else choose what root writes.
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    match check_path(dir)? {
        DirState::Present => Ok(()),
        DirState::Absent => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| Error::io("cannot create directory", dir, e))?;
            check_last(dir)
        }
    }
}

/// Checks without creating: the directory must exist, and be safe along its whole path.
pub fn check_dir(dir: &Path) -> Result<()> {
    match check_path(dir)? {
        DirState::Present => Ok(()),
        // ENOENT, not ErrorKind::NotFound: that one prints "entity not found", unlike
        // every other missing file devgate reports
        DirState::Absent => Err(Error::io(
            "cannot stat directory",
            dir,
            io::Error::from_raw_os_error(libc::ENOENT),
        )),
    }
}

/// What [`check_path`] found at the end of a safe path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirState {
    Present,
    /// Missing, below a last existing directory nobody else can write, so devgate can
    /// create it before anyone else does.
    Absent,
}

/// Checks every directory from `/` down to `dir`: each must be ours (root's, or the
/// effective user's) and not writable by group or others, because whoever can write any
/// one of them can rename the rest of the path away and put their own in its place. Two
/// exceptions, both as the kernel enforces them: a sticky ancestor (like /tmp), where
/// nobody can rename or remove our entry; and a root-owned symlink on the way (/var/run →
/// /run), whose target is checked the same way. `dir` itself must not be a symlink.
pub fn check_path(dir: &Path) -> Result<DirState> {
    check_chain(dir, 0)
}

/// [`check_path`]'s walk, `depth` symlinks deep.
/// Long because it is one walk from `/` down, carrying the last existing directory
/// (`parent`) from step to step and recursing into a symlink's target.
fn check_chain(dir: &Path, depth: u32) -> Result<DirState> {
    if depth > 8 {
        return Err(Error::unsafe_path(dir, "too many symlinks on the way"));
    }
    if !dir.is_absolute() {
        return Err(Error::unsafe_path(dir, "not an absolute path"));
    }
    // lstat(2) follows a final symlink when the path ends in `/` or `/.`: judge the path
    // as its components spell it, without either.
    let dir = &normalized(dir);
    let euid = nix::unistd::geteuid().as_raw();
    let mut chain: Vec<&Path> = dir.ancestors().collect();
    chain.reverse();
    // The last existing directory and its mode: whoever can write it could create the
    // missing rest of the path first.
    let mut parent: (PathBuf, u32) = ("/".into(), 0o755);
    for (i, p) in chain.iter().enumerate() {
        let last = i + 1 == chain.len();
        let meta = match fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (pdir, mode) = parent;
                if mode & 0o022 != 0 {
                    return Err(Error::unsafe_path(
                        dir,
                        format!(
                            "is absent and {} is writable by others (mode {:o}), who could \
                             create it first",
                            pdir.display(),
                            mode & 0o7777
                        ),
                    ));
                }
                return Ok(DirState::Absent);
            }
            Err(e) => return Err(Error::io("cannot stat directory", p, e)),
        };
        if meta.file_type().is_symlink() {
            if last {
                return Err(Error::unsafe_path(p, "is a symlink"));
            }
            judge_owner(p, meta.uid(), euid)?;
            // The kernel walks the link's own text, relative to the link's directory, and
            // so does the check: a canonical target would skip a link someone else owns on
            // the way, which they can repoint once the check has passed.
            let text = fs::read_link(p).map_err(|e| Error::io("cannot read symlink", p, e))?;
            let target = p.parent().unwrap_or(Path::new("/")).join(text);
            if check_chain(&target, depth + 1)? == DirState::Absent {
                return Err(Error::unsafe_path(p, "is a dangling symlink"));
            }
            let mode = fs::metadata(&target)
                .map_err(|e| Error::io("cannot stat directory", &target, e))?
                .mode();
            parent = (target, mode);
            continue;
        }
        if !meta.is_dir() {
            return Err(Error::unsafe_path(p, "is not a directory"));
        }
        judge_dir(p, meta.uid(), euid, meta.mode(), !last)?;
        parent = (p.to_path_buf(), meta.mode());
    }
    Ok(DirState::Present)
}

/// `path` without a trailing `/`, `/.` or inner `.` components (`..` is kept: the kernel
/// resolves it, and each prefix is checked as it resolves).
fn normalized(path: &Path) -> PathBuf {
    path.components().collect()
}

/// The last component again, after devgate created it: no symlink, ours, not writable.
fn check_last(dir: &Path) -> Result<()> {
    let dir = &normalized(dir);
    let meta = fs::symlink_metadata(dir).map_err(|e| Error::io("cannot stat directory", dir, e))?;
    if !meta.is_dir() {
        return Err(Error::unsafe_path(dir, "is not a directory"));
    }
    judge_dir(
        dir,
        meta.uid(),
        nix::unistd::geteuid().as_raw(),
        meta.mode(),
        false,
    )
}

fn judge_owner(path: &Path, uid: u32, euid: u32) -> Result<()> {
    if uid == 0 || uid == euid {
        return Ok(());
    }
    Err(Error::unsafe_path(
        path,
        format!("is owned by uid {uid}, not root"),
    ))
}

/// One existing directory on the way (`ancestor`) or at the end of a path devgate writes
/// into. Pure, so each rule is tested on its own.
pub fn judge_dir(path: &Path, uid: u32, euid: u32, mode: u32, ancestor: bool) -> Result<()> {
    judge_owner(path, uid, euid)?;
    let others_write = mode & 0o022 != 0;
    // In a sticky directory (like /tmp) nobody else can rename or remove our entries, so
    // an existing directory of ours below it stays ours.
    if others_write && !(ancestor && mode & 0o1000 != 0) {
        return Err(Error::unsafe_path(
            path,
            format!("is writable by group or others (mode {:o})", mode & 0o7777),
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

/// The one writer behind the `write_atomic*` functions.
/// Long because it is create, chown, write, fsync, rename, fsync the directory, in that
/// order, under one removal of the temp file on any error.
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
    let tmp = dir.join(temp_name(name));
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
    };
    let result = (|| {
        // A writer killed mid-write leaves its temp file; a later writer with the same pid
        // must not be blocked by it. The directory is root's (checked by the caller), so the
        // name is: removed, then created anew (never opened as it is).
        let mut f = match create() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let _ = fs::remove_file(&tmp);
                create()
            }
            r => r,
        }
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
pub(crate) mod tests {
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
        super::test_dirs::remove_at_exit(&p);
        p
    }

    /// Each of `files` (a path below `root`, its text), with the directories above it.
    pub(crate) fn write_tree(root: &Path, files: &[(&str, &str)]) {
        for (p, text) in files {
            let f = root.join(p);
            fs::create_dir_all(f.parent().unwrap()).unwrap();
            fs::write(f, text).unwrap();
        }
    }

    #[test]
    fn every_temp_name_a_write_makes_is_known_as_one() {
        use std::ffi::OsStr;
        for name in [
            "c1.json".to_string(),
            "x".repeat(255),
            "c-195-6.json".into(),
        ] {
            let t = temp_name(OsStr::new(&name));
            assert!(t.len() <= 255, "{}", t.len());
            assert!(is_temp_name(&t), "{t:?}");
        }
        for name in [
            "c1.json",
            ".c1.json",
            ".c1.json.tmp.",
            ".c1.json.tmp.12x",
            "c.tmp.1",
        ] {
            assert!(!is_temp_name(OsStr::new(name)), "{name}");
        }
    }

    /// A temp file a killed writer with this pid left (here: a symlink to a file that must
    /// not be written through) does not block the write, and is never opened.
    #[test]
    fn a_temp_file_left_by_a_killed_writer_is_replaced_not_written_through() {
        let d = tempdir("left-temp");
        let target = d.join("c1.json");
        let victim = d.join("victim");
        fs::write(&victim, b"keep").unwrap();
        let tmp = d.join(temp_name(std::ffi::OsStr::new("c1.json")));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        write_atomic_volatile(&target, b"new", 0o600).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert!(fs::symlink_metadata(&tmp).is_err(), "the temp name is gone");
        fs::remove_dir_all(&d).unwrap();
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

    /// A source of unknown size (procfs, where every read(2) makes the whole text again)
    /// is read in one read and the one that sees its end, not from 32 bytes up; the bound
    /// holds all the same.
    #[test]
    fn a_small_text_of_unknown_size_takes_one_read() {
        struct Counted<'a>(&'a [u8], usize);
        impl Read for Counted<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.1 += 1;
                self.0.read(buf)
            }
        }
        let text = [b'1'; 300];
        let mut r = Counted(&text, 0);
        let got = read_bounded(&mut r, 4096, "stat", Path::new("/proc/1/stat")).unwrap();
        assert_eq!(got.len(), 300);
        assert_eq!(r.1, 2, "reads");
        let e = read_bounded(Counted(&text, 0), 299, "stat", Path::new("/proc/1/stat"));
        assert!(e.unwrap_err().to_string().contains("exceeds 299 bytes"));
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

    /// A sysfs attribute of a hostile or broken tree (a test `sysfs_root`, a driver bug)
    /// is read to 4 KiB at most, however much the file holds.
    #[test]
    fn a_sysfs_attribute_is_read_to_4_kib_at_most() {
        let d = tempdir("attr");
        fs::write(d.join("state"), vec![b'x'; 1 << 20]).unwrap();
        let attr = read_attr(&d.join("state")).unwrap();
        assert_eq!(attr.len(), 4096);
    }

    #[test]
    fn a_name_at_name_max_is_written_too() {
        let d = tempdir("long");
        let p = d.join("x".repeat(255));
        write_atomic_volatile(&p, b"one", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"one");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
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
    fn dir_rules() {
        let p = Path::new("/x");
        assert!(judge_dir(p, 0, 0, 0o40755, false).is_ok());
        assert_eq!(
            judge_dir(p, 1000, 0, 0o40755, true)
                .unwrap_err()
                .to_string(),
            "unsafe path /x: is owned by uid 1000, not root"
        );
        assert_eq!(
            judge_dir(p, 0, 0, 0o40775, true).unwrap_err().to_string(),
            "unsafe path /x: is writable by group or others (mode 775)"
        );
        // /tmp: sticky, so our entries below it stay ours; never for the dir itself.
        assert!(judge_dir(p, 0, 0, 0o41777, true).is_ok());
        assert!(judge_dir(p, 0, 0, 0o41777, false).is_err());
        // Run as a user, that user's own directories are as good as root's.
        assert!(judge_dir(p, 1000, 1000, 0o40755, false).is_ok());
    }

    /// The whole path, not only the last component: the attacker owns or can write a
    /// directory above devgate's and would swap what is below it.
    #[test]
    fn an_absent_directory_reads_like_any_missing_file() {
        let d = tempdir("absent");
        let e = check_dir(&d.join("textfile")).unwrap_err().to_string();
        assert!(
            e.ends_with("/textfile: no such file or directory (os error 2)"),
            "{e}"
        );
    }

    #[test]
    fn whole_path_is_checked() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (CI runs as root) to own dirs as another uid");
            return;
        }
        let d = tempdir("chain");
        fs::create_dir_all(d.join("open/state")).unwrap();
        fs::set_permissions(d.join("open"), fs::Permissions::from_mode(0o775)).unwrap();
        let e = ensure_private_dir(&d.join("open/state")).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("open: is writable by group or others (mode 775)"),
            "{e}"
        );
        assert!(check_dir(&d.join("open/state")).is_err());
        // An ancestor owned by another user, even with mode 0755.
        fs::set_permissions(d.join("open"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(d.join("open"), Some(65534), None).unwrap();
        let e = ensure_private_dir(&d.join("open/state")).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        std::os::unix::fs::chown(d.join("open"), Some(0), None).unwrap();
        assert_eq!(
            check_path(&d.join("open/state")).unwrap(),
            DirState::Present
        );
        // Sticky and world-writable, like /tmp: an existing root directory below it is
        // safe, a missing one could be created first by anyone.
        fs::create_dir_all(d.join("sticky/mine")).unwrap();
        fs::set_permissions(d.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(
            check_path(&d.join("sticky/mine")).unwrap(),
            DirState::Present
        );
        let e = ensure_private_dir(&d.join("sticky/new")).unwrap_err();
        assert!(e.to_string().contains("who could create it first"), "{e}");
        assert!(!d.join("sticky/new").exists());
        assert_eq!(
            check_path(&d.join("open/new/deeper")).unwrap(),
            DirState::Absent
        );
        // A root-owned symlink on the way is followed and its target checked; a symlink
        // at the end, or one owned by someone else, is refused.
        std::os::unix::fs::symlink(d.join("open"), d.join("link")).unwrap();
        assert_eq!(
            check_path(&d.join("link/state")).unwrap(),
            DirState::Present
        );
        assert!(check_path(&d.join("link"))
            .unwrap_err()
            .to_string()
            .contains("is a symlink"));
        std::os::unix::fs::symlink(d.join("open"), d.join("theirs")).unwrap();
        std::os::unix::fs::lchown(d.join("theirs"), Some(65534), None).unwrap();
        let e = check_path(&d.join("theirs/state")).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        fs::set_permissions(d.join("open"), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_path(&d.join("link/state")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    /// A trailing `/` or `/.` makes the kernel follow a final symlink even in lstat(2): the
    /// rule "the directory itself is not a symlink" must hold however the path is spelled.
    #[test]
    fn a_trailing_slash_does_not_hide_a_final_symlink() {
        let d = tempdir("slash");
        fs::create_dir(d.join("target")).unwrap();
        std::os::unix::fs::symlink(d.join("target"), d.join("link")).unwrap();
        for spelled in ["link", "link/", "link/.", "link//", "link/./"] {
            let p = PathBuf::from(format!("{}/{spelled}", d.display()));
            let e = check_path(&p).expect_err(spelled);
            assert!(e.to_string().contains("is a symlink"), "{spelled}: {e}");
            assert!(ensure_private_dir(&p).is_err(), "{spelled}");
        }
        fs::remove_dir_all(&d).unwrap();
    }

    /// The attacker's case for the trailing slash: in a sticky world-writable directory
    /// (/tmp, /dev/shm) a user plants a symlink of theirs where a root directory is
    /// expected, pointing at a root directory of their choice; with `state_dir = "/tmp/x/"`
    /// root would write there, and the user can repoint the link at any time.
    #[test]
    fn someone_elses_symlink_in_a_sticky_dir_is_refused_with_a_trailing_slash() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (CI runs as root) to own a symlink as another uid");
            return;
        }
        let d = tempdir("sticky-slash");
        fs::create_dir_all(d.join("sticky")).unwrap();
        fs::set_permissions(d.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
        fs::create_dir(d.join("roots")).unwrap();
        std::os::unix::fs::symlink(d.join("roots"), d.join("sticky/state")).unwrap();
        std::os::unix::fs::lchown(d.join("sticky/state"), Some(65534), None).unwrap();
        let p = PathBuf::from(format!("{}/sticky/state/", d.display()));
        assert!(check_path(&p).is_err(), "{} passed", p.display());
        assert!(ensure_private_dir(&p).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    /// A root-owned symlink is followed as the kernel follows it: through the link's own
    /// text, not through its canonical target. A root link whose text goes through a link
    /// another user owns (and so can repoint after the check) is refused.
    #[test]
    fn a_root_symlink_through_someone_elses_symlink_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (CI runs as root) to own a symlink as another uid");
            return;
        }
        let d = tempdir("link-chain");
        fs::create_dir_all(d.join("safe/state")).unwrap();
        fs::create_dir(d.join("user")).unwrap();
        std::os::unix::fs::chown(d.join("user"), Some(65534), None).unwrap();
        std::os::unix::fs::symlink(d.join("safe"), d.join("user/l")).unwrap();
        std::os::unix::fs::lchown(d.join("user/l"), Some(65534), None).unwrap();
        // Root's link, absolute and relative, each through the user's link.
        std::os::unix::fs::symlink(d.join("user/l"), d.join("rootlink")).unwrap();
        std::os::unix::fs::symlink("user/l", d.join("rellink")).unwrap();
        for link in ["rootlink", "rellink"] {
            let e = check_path(&d.join(link).join("state")).expect_err(link);
            assert!(e.to_string().contains("owned by uid 65534"), "{link}: {e}");
        }
        // Root's relative link to a safe place is followed as before.
        std::os::unix::fs::symlink("safe", d.join("good")).unwrap();
        assert_eq!(
            check_path(&d.join("good/state")).unwrap(),
            DirState::Present
        );
        std::os::unix::fs::symlink("../loop2", d.join("loop1")).unwrap();
        std::os::unix::fs::symlink("../loop1", d.join("loop2")).unwrap();
        assert!(check_path(&d.join("loop1/state")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn safe_component() {
        assert!(is_safe_component("abc123-x_y.z"));
        for bad in ["", ".", "..", "a/b", ".hidden", "a\0b", &"x".repeat(256)] {
            assert!(!is_safe_component(bad), "{bad:?}");
        }
    }
}
