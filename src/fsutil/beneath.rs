//! Metadata of a path below a root, reached without leaving it: for device nodes below
//! dev_root, where /dev/shm and /dev/mqueue let any user leave a link.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// struct open_how of openat2(2); libc's is non-exhaustive.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// The metadata of `path`, which must be lexically below `root`, reached without leaving
/// `root`: openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) refuses an absolute symlink, a
/// relative one climbing out and /proc's magic links on the way, so a link any user can
/// leave in a world-writable directory under /dev (/dev/shm) cannot send the stat to a
/// filesystem a pod controls. Links that stay inside (`/dev/char/195:0 -> ../nvidia0`)
/// still resolve. O_PATH opens nothing: a FIFO or a device cannot block it.
pub fn stat_beneath(root: &Path, path: &Path) -> io::Result<fs::Metadata> {
    beneath(root, path, 0)
}

/// [`stat_beneath`] that does not follow a final symlink either: a node's own metadata.
pub fn lstat_beneath(root: &Path, path: &Path) -> io::Result<fs::Metadata> {
    beneath(root, path, libc::O_NOFOLLOW)
}

/// openat2(2) of `path` relative to `dir`: the one wrapper around the system call (libc has
/// no function for it). The fd returned is owned by the caller.
pub fn openat2(
    dir: &impl std::os::fd::AsRawFd,
    path: &std::ffi::CStr,
    flags: libc::c_int,
    resolve: u64,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: valid fd, NUL-terminated path and an open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    } as libc::c_int;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by openat2 and is owned nowhere else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

fn beneath(root: &Path, path: &Path, flags: libc::c_int) -> io::Result<fs::Metadata> {
    use std::os::unix::ffi::OsStrExt;
    let rel = path
        .strip_prefix(root)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)?;
    let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    match openat2(&dir, &c, flags | libc::O_PATH | libc::O_CLOEXEC, resolve) {
        Ok(fd) => File::from(fd).metadata(),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => by_component(dir, rel),
        Err(e) => Err(e),
    }
}

/// [`beneath`] for kernels before 5.6, which have no openat2: one component at a time,
/// each opened O_PATH|O_NOFOLLOW below the last, so no symlink is followed at all (not even
/// one that stays inside: a link at the end is its own metadata, not a node's, and one on
/// the way is not a directory to go on from). Race-free like openat2, only stricter.
fn by_component(dir: File, rel: &Path) -> io::Result<fs::Metadata> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Component;
    let mut cur = OwnedFd::from(dir);
    for c in rel.components() {
        let Component::Normal(name) = c else {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        };
        let name = std::ffi::CString::new(name.as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: valid fd and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                cur.as_raw_fd(),
                name.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by openat and is owned nowhere else.
        cur = unsafe { OwnedFd::from_raw_fd(fd) };
    }
    File::from(cur).metadata()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without openat2 (before 5.6) the walk below dev_root goes one component at a time
    /// and follows no symlink: a link planted in /dev/shm leads nowhere.
    #[test]
    fn the_walk_without_openat2_follows_no_link() {
        let d = crate::fsutil::tests::tempdir("by-component");
        fs::create_dir_all(d.join("shm")).unwrap();
        fs::write(d.join("file"), b"").unwrap();
        std::os::unix::fs::symlink("/dev/null", d.join("shm/abs")).unwrap();
        std::os::unix::fs::symlink("../file", d.join("shm/rel")).unwrap();
        std::os::unix::fs::symlink("/dev", d.join("shm/dir")).unwrap();
        let walk = |rel: &str| by_component(File::open(&d).unwrap(), Path::new(rel));
        assert!(walk("file").unwrap().is_file());
        for link in ["shm/abs", "shm/rel"] {
            assert!(walk(link).unwrap().file_type().is_symlink(), "{link}");
        }
        assert!(walk("shm/dir/null").is_err());
        assert!(walk("shm/../file").is_err());
        fs::remove_dir_all(&d).unwrap();
    }
}
