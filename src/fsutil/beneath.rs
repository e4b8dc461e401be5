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
/// still resolve. O_PATH opens nothing: a FIFO or a device cannot block it. A single name
/// (`/dev/nvidia0`: most device nodes) is one lstat instead, the same lookup.
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
    if let Some(name) = one_name(rel) {
        // One name in root's directory, its final link not followed: an lstat of it
        // through root's own path is the same lookup in one system call instead of three,
        // and answers for what root's path names now.
        let meta = fs::symlink_metadata(root.join(name))?;
        if flags & libc::O_NOFOLLOW != 0 || !meta.file_type().is_symlink() {
            return Ok(meta);
        }
        // A link to follow: through openat2 below, which keeps it inside root.
    }
    let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // Opened for this lookup: it answers for the directory `root` names now.
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)?;
    match openat2(&dir, &c, flags | libc::O_PATH | libc::O_CLOEXEC, resolve) {
        Ok(fd) => File::from(fd).metadata(),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => by_component(dir, rel),
        Err(e) => Err(e),
    }
}

/// `rel` when it is one plain name (`null`, `nvidia0`): no `/` anywhere (not even a
/// trailing one, which would make the kernel follow a final link), not `.` or `..`.
// Start-up trick (docs/performance.md). Plain: every name through openat2.
fn one_name(rel: &Path) -> Option<&std::ffi::OsStr> {
    use std::os::unix::ffi::OsStrExt;
    let b = rel.as_os_str().as_bytes();
    (!b.is_empty() && !b.contains(&b'/') && b != b"." && b != b"..").then_some(rel.as_os_str())
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

    /// A temp dir `d` with a root `d/dev` holding the file `s/a` (two names deep, so that
    /// the lookup opens the root), looked up once.
    fn root_with_a_file(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let d = crate::fsutil::tests::tempdir(tag);
        let root = d.join("dev");
        fs::create_dir_all(root.join("s")).unwrap();
        fs::write(root.join("s/a"), b"").unwrap();
        assert!(stat_beneath(&root, &root.join("s/a")).unwrap().is_file());
        (d, root)
    }

    /// A root removed and made again with other nodes: a lookup sees the new one; one
    /// that was there before fails.
    #[test]
    fn a_replaced_root_answers_for_the_new_tree() {
        let (d, root) = root_with_a_file("beneath-kept");
        fs::remove_dir_all(&root).unwrap();
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(root.join("s/b")).unwrap();
        assert!(stat_beneath(&root, &root.join("s/b")).unwrap().is_dir());
        assert!(stat_beneath(&root, &root.join("s/a")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    /// A root renamed away and made again in its place: a lookup answers for the tree
    /// `root` names now, not the renamed-away one.
    #[test]
    fn a_root_renamed_away_never_answers_for_the_new_one() {
        let (d, root) = root_with_a_file("beneath-renamed");
        fs::rename(&root, d.join("old")).unwrap();
        fs::create_dir_all(root.join("s/a")).unwrap();
        let now = stat_beneath(&root, &root.join("s/a")).unwrap();
        assert!(now.is_dir(), "answered from the renamed-away root");
        fs::remove_dir_all(&d).unwrap();
    }

    /// A root mounted over: a lookup answers for what `root` names now, the mount's tree,
    /// not the directory underneath, which keeps its nodes.
    #[test]
    fn a_root_mounted_over_never_answers_from_below_the_mount() {
        struct Unmount(std::path::PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        let (d, root) = root_with_a_file("beneath-mounted");
        // devgate and CI run as root; mounting a tmpfs needs nothing else.
        nix::mount::mount(
            Some("tmpfs"),
            &root,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("mode=0755"),
        )
        .unwrap();
        let guard = Unmount(root.clone());
        assert!(
            stat_beneath(&root, &root.join("s/a")).is_err(),
            "answered from below the mount"
        );
        drop(guard);
        fs::remove_dir_all(&d).unwrap();
    }

    /// A single name is looked up by an lstat through root's path: the same lookup
    /// (one name in root's directory, its link not followed) in one system call, which
    /// answers for what root names now; a link there that is to be followed goes through
    /// openat2 and stays inside root.
    #[test]
    fn a_single_name_is_one_lstat_and_its_link_stays_inside() {
        let d = crate::fsutil::tests::tempdir("beneath-one-name");
        let root = d.join("dev");
        fs::create_dir_all(root.join("s")).unwrap();
        fs::write(root.join("s/a"), b"").unwrap();
        fs::write(d.join("outside"), b"").unwrap();
        std::os::unix::fs::symlink("s/a", root.join("in")).unwrap();
        std::os::unix::fs::symlink(d.join("outside"), root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../outside", root.join("up")).unwrap();
        assert!(stat_beneath(&root, &root.join("s")).unwrap().is_dir());
        assert!(stat_beneath(&root, &root.join("in")).unwrap().is_file());
        for link in ["abs", "up"] {
            assert!(stat_beneath(&root, &root.join(link)).is_err(), "{link}");
            let own = lstat_beneath(&root, &root.join(link)).unwrap();
            assert!(own.file_type().is_symlink(), "{link}");
        }
        // renamed away: a name answers for the new root
        fs::rename(&root, d.join("old")).unwrap();
        fs::create_dir_all(root.join("s/a")).unwrap();
        assert!(stat_beneath(&root, &root.join("s")).unwrap().is_dir());
        assert!(stat_beneath(&root, &root.join("in")).is_err());
        for (rel, one) in [
            ("a", true),
            ("a/", false),
            (".", false),
            ("..", false),
            ("a/b", false),
        ] {
            assert_eq!(one_name(Path::new(rel)).is_some(), one, "{rel}");
        }
        fs::remove_dir_all(&d).unwrap();
    }

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
