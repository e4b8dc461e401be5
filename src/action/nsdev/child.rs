//! The forked child of the /dev edit: it enters the container's mount namespace, walks to
//! the node with openat2 one component at a time, and swaps in the spare's node. Raw
//! system calls only, on memory prepared before fork: no allocation, no locks.

use super::wire::{ChildInput, Step, Wire};
use std::ffi::{CStr, CString};
use std::os::fd::RawFd;

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

const NEW: &CStr = c"n";

/// struct open_how of openat2(2); libc's is non-exhaustive.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// openat2(2) of one plain name below `dir`, never through a symlink or a magic link.
///
/// # Safety
/// `name` is a valid C string; raw system call only.
unsafe fn open_beneath(dir: RawFd, name: &CStr, flags: i32) -> RawFd {
    let how = OpenHow {
        flags: (flags | libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    };
    libc::syscall(
        libc::SYS_openat2,
        dir,
        name.as_ptr(),
        &how as *const OpenHow,
        std::mem::size_of::<OpenHow>(),
    ) as RawFd
}

/// The base directory of the walk: the process's root once it has pivoted, else the
/// rootfs at its path in the namespace. Called after setns.
///
/// # Safety
/// Raw system calls on valid fds and C strings.
unsafe fn base_dir(inp: &ChildInput, w: &mut Wire) -> std::result::Result<RawFd, Step> {
    let mut a: libc::stat = std::mem::zeroed();
    let mut b: libc::stat = std::mem::zeroed();
    if libc::fstat(inp.proc_root, &mut a) != 0 || libc::stat(c"/".as_ptr(), &mut b) != 0 {
        w.errno = errno();
        return Err(Step::ProcRoot);
    }
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
        return Ok(inp.proc_root);
    }
    // The rootfs path is the runtime's (bundle + root.path), a host path: it may hold the
    // host's own symlinks. Everything below it is the container's.
    let fd = libc::open(
        inp.rootfs.as_ptr(),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if fd < 0 {
        w.errno = errno();
        return Err(Step::Rootfs);
    }
    Ok(fd)
}

/// Walks to the directory holding the node, one openat2 per component.
///
/// # Safety
/// Raw system calls on valid fds and C strings.
unsafe fn walk_to_parent(
    mut dir: RawFd,
    comps: &[CString],
    w: &mut Wire,
) -> std::result::Result<RawFd, Step> {
    for (i, c) in comps[..comps.len() - 1].iter().enumerate() {
        w.component = i as i32;
        let fd = open_beneath(dir, c, libc::O_DIRECTORY);
        if fd < 0 {
            w.errno = errno();
            return Err(match w.errno {
                libc::ELOOP => Step::Symlink,
                libc::ENOTDIR => Step::NotDir,
                _ => Step::Open,
            });
        }
        dir = fd;
    }
    w.component = comps.len() as i32 - 1;
    Ok(dir)
}

/// Makes the spare's node in a private directory of `dir`, owned and checked through its
/// fd, and renames it over `name`. Nothing here resolves a name another process can
/// replace: `private` is a fresh root-only directory, reached through its own fd.
///
/// Long because it runs in the forked child: one raw system call after another, each
/// failure naming its step and undone through `fail`, in the order the node is built.
///
/// # Safety
/// Raw system calls on valid fds and C strings.
unsafe fn swap_in(
    dir: RawFd,
    name: &CStr,
    inp: &ChildInput,
    st: &libc::stat,
    w: &mut Wire,
) -> Step {
    // Set-id and sticky bits mean nothing on a device node, and chown would clear them.
    let mode = st.st_mode & 0o777;
    let spare = inp.spare;
    if libc::mkdirat(dir, inp.private.as_ptr(), 0o700) != 0 {
        w.errno = errno();
        return Step::PrivateDir;
    }
    let fail = |w: &mut Wire, step: Step, pd: RawFd| {
        w.errno = errno();
        if pd >= 0 {
            libc::unlinkat(pd, NEW.as_ptr(), 0);
        }
        libc::unlinkat(dir, inp.private.as_ptr(), libc::AT_REMOVEDIR);
        step
    };
    let pd = open_beneath(dir, inp.private, libc::O_DIRECTORY);
    if pd < 0 {
        return fail(w, Step::PrivateDir, -1);
    }
    let mut ps: libc::stat = std::mem::zeroed();
    if libc::fstat(pd, &mut ps) != 0
        || ps.st_mode & libc::S_IFMT != libc::S_IFDIR
        || ps.st_mode & 0o7777 != 0o700
        || ps.st_uid != 0
    {
        return fail(w, Step::PrivateDir, -1);
    }
    // umask is 0: the node is born with its final mode.
    if libc::mknodat(
        pd,
        NEW.as_ptr(),
        spare.0 | mode,
        libc::makedev(spare.1, spare.2),
    ) != 0
    {
        return fail(w, Step::Mknod, pd);
    }
    let nd = open_beneath(pd, NEW, 0);
    let mut ns: libc::stat = std::mem::zeroed();
    let is_spare = |s: &libc::stat| {
        s.st_mode & libc::S_IFMT == spare.0
            && libc::major(s.st_rdev) == spare.1
            && libc::minor(s.st_rdev) == spare.2
    };
    if nd < 0 || libc::fstat(nd, &mut ns) != 0 || !is_spare(&ns) {
        return fail(w, Step::NewNode, pd);
    }
    if libc::fchownat(nd, c"".as_ptr(), st.st_uid, st.st_gid, libc::AT_EMPTY_PATH) != 0 {
        return fail(w, Step::Chown, pd);
    }
    if libc::fstat(nd, &mut ns) != 0
        || !is_spare(&ns)
        || ns.st_mode & 0o7777 != mode
        || (ns.st_uid, ns.st_gid) != (st.st_uid, st.st_gid)
        || ns.st_nlink != 1
    {
        return fail(w, Step::Verify, pd);
    }
    // rename never follows its last component; both ends are relative to fds checked above.
    if libc::renameat(pd, NEW.as_ptr(), dir, name.as_ptr()) != 0 {
        return fail(w, Step::Rename, pd);
    }
    libc::unlinkat(dir, inp.private.as_ptr(), libc::AT_REMOVEDIR);
    w.mode = mode;
    Step::Done
}

/// The child. Raw system calls on memory prepared before fork; never returns.
///
/// # Safety
/// Called only in the child of fork(2).
pub(super) unsafe fn child(inp: &ChildInput) -> ! {
    let mut w = Wire::default();
    let step = 'run: {
        libc::umask(0);
        if libc::setns(inp.pidfd, libc::CLONE_NEWNS) != 0 {
            w.errno = errno();
            break 'run Step::EnterNs;
        }
        let base = match base_dir(inp, &mut w) {
            Ok(fd) => fd,
            Err(s) => break 'run s,
        };
        let dir = match walk_to_parent(base, inp.comps, &mut w) {
            Ok(fd) => fd,
            Err(s) => break 'run s,
        };
        let name = &inp.comps[inp.comps.len() - 1];
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) != 0 {
            w.errno = errno();
            break 'run if w.errno == libc::ENOENT {
                Step::Missing
            } else {
                Step::Stat
            };
        }
        let fmt = st.st_mode & libc::S_IFMT;
        (w.mode, w.uid, w.gid) = (st.st_mode & 0o7777, st.st_uid, st.st_gid);
        (w.major, w.minor) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
        if fmt == libc::S_IFLNK {
            break 'run Step::Symlink;
        }
        if fmt != libc::S_IFCHR && fmt != libc::S_IFBLK {
            break 'run Step::NotDev;
        }
        let is = |d: (libc::mode_t, u32, u32)| fmt == d.0 && (w.major, w.minor) == (d.1, d.2);
        if is(inp.spare) {
            break 'run Step::Already;
        }
        if !is(inp.expect) {
            break 'run Step::Mismatch;
        }
        swap_in(dir, name, inp, &st, &mut w)
    };
    w.step = step as i32;
    libc::write(
        inp.out,
        &w as *const Wire as *const libc::c_void,
        std::mem::size_of::<Wire>(),
    );
    libc::_exit(0)
}
