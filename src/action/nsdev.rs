//! The /dev edit inside a container: replace the node at the container's path with a node
//! for another major:minor, same mode, uid and gid.
//!
//! setns(CLONE_NEWNS) is refused to a multi-threaded process, so the edit runs in a forked
//! child. The child makes raw system calls only (no allocation, no locks), which keeps it
//! correct whatever threads the parent had. It walks the path one component at a time from
//! the container's root with O_PATH|O_NOFOLLOW|O_DIRECTORY and refuses a symlink anywhere:
//! a container's symlinks are never resolved. The new node is made under a temporary name in
//! the same directory and renamed over the old one, so the path always names a node.
//!
//! Where the root is: at runc's prestart/createRuntime the container process has not pivoted
//! yet (its root is still the mount namespace's `/`), and the rootfs sits at its host path
//! inside the namespace with the container's /dev mounted on it; later (createContainer, or
//! a runtime that pivots first) the process root is the rootfs. The child compares
//! /proc/PID/root with its own `/` to tell which.

use crate::error::{Error, Result};
use crate::model::device::{DevNum, DevType};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// One node replacement.
#[derive(Debug, Clone)]
pub struct NodeEdit<'a> {
    /// The container's process (runtime state pid).
    pub pid: i32,
    /// The rootfs as the runtime mounted it (config.json root.path against the bundle).
    pub rootfs: &'a Path,
    pub container_path: &'a Path,
    /// What the node must be now: the device being replaced.
    pub expect: DevNum,
    pub spare: DevNum,
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The node already was the spare (the hook ran twice); nothing was changed.
    pub already: bool,
}

const OK: i32 = 0;
const ALREADY: i32 = 1;
const E_SETNS: i32 = 2;
const E_PROCROOT: i32 = 3;
const E_ROOTFS: i32 = 4;
const E_STAT: i32 = 5;
const E_SYMLINK: i32 = 6;
const E_NOTDIR: i32 = 7;
const E_OPEN: i32 = 8;
const E_MISSING: i32 = 9;
const E_NOTDEV: i32 = 10;
const E_MISMATCH: i32 = 11;
const E_MKNOD: i32 = 12;
const E_CHOWN: i32 = 13;
const E_CHMOD: i32 = 14;
const E_RENAME: i32 = 15;
const E_UMASK: i32 = 16;

/// What the child reports: code, errno, component index, mode, uid, gid, major, minor.
type Report = [i32; 8];

fn s_ifmt(t: DevType) -> libc::mode_t {
    match t {
        DevType::Char => libc::S_IFCHR,
        DevType::Block => libc::S_IFBLK,
    }
}

/// Splits a container path into its components, refusing `..`, `.` and anything that is
/// not an absolute path of plain names.
fn components(p: &Path) -> std::result::Result<Vec<CString>, String> {
    if !p.is_absolute() {
        return Err("is not absolute".into());
    }
    let mut out = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => {
                if n.len() > 255 {
                    return Err("has a component longer than 255 bytes".into());
                }
                out.push(CString::new(n.as_bytes()).map_err(|_| "contains NUL".to_string())?);
            }
            _ => return Err("has a '.' or '..' component".into()),
        }
    }
    if out.is_empty() || out.len() > 64 {
        return Err("has no name or too many components".into());
    }
    Ok(out)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The child. Raw system calls on memory prepared before fork; never returns.
///
/// # Safety
/// Called only in the child of fork(2).
#[allow(clippy::too_many_arguments)]
unsafe fn child(
    ns: RawFd,
    out: RawFd,
    proc_root: &CStr,
    rootfs: &CStr,
    comps: &[CString],
    tmp: &CStr,
    expect: (libc::mode_t, u32, u32),
    spare: (libc::mode_t, u32, u32),
) -> ! {
    let mut r: Report = [0; 8];
    let code = 'run: {
        libc::umask(0);
        if libc::setns(ns, libc::CLONE_NEWNS) != 0 {
            r[1] = errno();
            break 'run E_SETNS;
        }
        let pr = libc::open(
            proc_root.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if pr < 0 {
            r[1] = errno();
            break 'run E_PROCROOT;
        }
        let mut a: libc::stat = std::mem::zeroed();
        let mut b: libc::stat = std::mem::zeroed();
        if libc::fstat(pr, &mut a) != 0 || libc::stat(c"/".as_ptr(), &mut b) != 0 {
            r[1] = errno();
            break 'run E_PROCROOT;
        }
        let mut dir = if a.st_dev == b.st_dev && a.st_ino == b.st_ino {
            let fd = libc::open(
                rootfs.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            if fd < 0 {
                r[1] = errno();
                break 'run E_ROOTFS;
            }
            fd
        } else {
            pr
        };
        let last = comps.len() - 1;
        for (i, c) in comps.iter().enumerate() {
            r[2] = i as i32;
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) != 0 {
                r[1] = errno();
                break 'run if r[1] == libc::ENOENT && i == last {
                    E_MISSING
                } else {
                    E_STAT
                };
            }
            let fmt = st.st_mode & libc::S_IFMT;
            if fmt == libc::S_IFLNK {
                break 'run E_SYMLINK;
            }
            if i < last {
                if fmt != libc::S_IFDIR {
                    break 'run E_NOTDIR;
                }
                let fd = libc::openat(
                    dir,
                    c.as_ptr(),
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC,
                );
                if fd < 0 {
                    r[1] = errno();
                    break 'run if r[1] == libc::ELOOP || r[1] == libc::ENOTDIR {
                        E_SYMLINK
                    } else {
                        E_OPEN
                    };
                }
                dir = fd;
                continue;
            }
            // The node itself.
            r[3] = (st.st_mode & 0o7777) as i32;
            r[4] = st.st_uid as i32;
            r[5] = st.st_gid as i32;
            r[6] = libc::major(st.st_rdev) as i32;
            r[7] = libc::minor(st.st_rdev) as i32;
            if fmt != libc::S_IFCHR && fmt != libc::S_IFBLK {
                break 'run E_NOTDEV;
            }
            let is = |d: (libc::mode_t, u32, u32)| {
                fmt == d.0 && libc::major(st.st_rdev) == d.1 && libc::minor(st.st_rdev) == d.2
            };
            if is(spare) {
                break 'run ALREADY;
            }
            if !is(expect) {
                break 'run E_MISMATCH;
            }
            let mode = st.st_mode & 0o7777;
            libc::unlinkat(dir, tmp.as_ptr(), 0);
            if libc::mknodat(
                dir,
                tmp.as_ptr(),
                spare.0 | mode,
                libc::makedev(spare.1, spare.2),
            ) != 0
            {
                r[1] = errno();
                break 'run E_MKNOD;
            }
            if libc::fchownat(
                dir,
                tmp.as_ptr(),
                st.st_uid,
                st.st_gid,
                libc::AT_SYMLINK_NOFOLLOW,
            ) != 0
            {
                r[1] = errno();
                libc::unlinkat(dir, tmp.as_ptr(), 0);
                break 'run E_CHOWN;
            }
            // chown may clear mode bits; the temp name is a node this child just made.
            if libc::fchmodat(dir, tmp.as_ptr(), mode, 0) != 0 {
                r[1] = errno();
                libc::unlinkat(dir, tmp.as_ptr(), 0);
                break 'run E_CHMOD;
            }
            if libc::renameat(dir, tmp.as_ptr(), dir, c.as_ptr()) != 0 {
                r[1] = errno();
                libc::unlinkat(dir, tmp.as_ptr(), 0);
                break 'run E_RENAME;
            }
            break 'run OK;
        }
        E_UMASK
    };
    r[0] = code;
    libc::write(
        out,
        r.as_ptr() as *const libc::c_void,
        std::mem::size_of::<Report>(),
    );
    libc::_exit(0)
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::io(
            "cannot create pipe",
            "pipe2",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: both fds were just created and are owned only here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Reads the child's report, or gives up at the deadline.
fn read_report(fd: &OwnedFd, deadline: Instant) -> std::result::Result<Report, String> {
    let mut r: Report = [0; 8];
    let want = std::mem::size_of::<Report>();
    let mut got = 0usize;
    while got < want {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out".into());
        }
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(format!("poll: {}", std::io::Error::last_os_error()));
        }
        if n == 0 {
            continue;
        }
        // SAFETY: reads into the report's remaining bytes.
        let k = unsafe {
            libc::read(
                fd.as_raw_fd(),
                (r.as_mut_ptr() as *mut u8).add(got) as *mut libc::c_void,
                want - got,
            )
        };
        if k < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(format!("read: {}", std::io::Error::last_os_error()));
        }
        if k == 0 {
            return Err("the child exited without a report".into());
        }
        got += k as usize;
    }
    Ok(r)
}

/// Replaces the node at `edit.container_path` inside the container with one for the spare.
pub fn replace_node(edit: &NodeEdit) -> Result<Replaced> {
    let shown = edit.container_path.display().to_string();
    let ctx = format!("container path {shown}");
    let comps = components(edit.container_path).map_err(|m| Error::invalid(&ctx, m))?;
    let ns_path = PathBuf::from(format!("/proc/{}/ns/mnt", edit.pid));
    let ns = std::fs::File::open(&ns_path)
        .map_err(|e| Error::io("cannot open mount namespace", &ns_path, e))?;
    let proc_root = CString::new(format!("/proc/{}/root", edit.pid)).expect("no NUL");
    let rootfs = CString::new(edit.rootfs.as_os_str().as_bytes())
        .map_err(|_| Error::invalid(&ctx, "rootfs path contains NUL"))?;
    let tmp = CString::new(format!(".devgate-remap-{}", std::process::id())).expect("no NUL");
    let expect = (
        s_ifmt(edit.expect.typ),
        edit.expect.major,
        edit.expect.minor,
    );
    let spare = (s_ifmt(edit.spare.typ), edit.spare.major, edit.spare.minor);
    let (rd, wr) = pipe()?;
    let deadline = Instant::now() + edit.timeout;

    // SAFETY: the child only makes async-signal-safe system calls on memory prepared above
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::io(
            "cannot fork",
            &ns_path,
            std::io::Error::last_os_error(),
        ));
    }
    if pid == 0 {
        // SAFETY: in the child of fork.
        unsafe {
            child(
                ns.as_raw_fd(),
                wr.as_raw_fd(),
                &proc_root,
                &rootfs,
                &comps,
                &tmp,
                expect,
                spare,
            )
        }
    }
    drop(wr);
    let report = read_report(&rd, deadline);
    if report.is_err() {
        // SAFETY: pid is our child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: reaps our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let r = report.map_err(|m| {
        Error::invalid(
            &ctx,
            format!(
                "the /dev edit in the mount namespace of pid {} failed: {m}",
                edit.pid
            ),
        )
    })?;

    let upto = |i: i32| {
        let mut p = PathBuf::from("/");
        for c in comps.iter().take(i.max(0) as usize + 1) {
            p.push(std::ffi::OsStr::from_bytes(c.as_bytes()));
        }
        p.display().to_string()
    };
    let os = |e: i32| {
        std::io::Error::from_raw_os_error(e)
            .to_string()
            .to_lowercase()
    };
    let found = format!("{}:{}", r[6], r[7]);
    let msg = match r[0] {
        OK | ALREADY => {
            return Ok(Replaced {
                mode: r[3] as u32,
                uid: r[4] as u32,
                gid: r[5] as u32,
                already: r[0] == ALREADY,
            })
        }
        E_SETNS => format!("cannot enter the mount namespace of pid {}: {}", edit.pid, os(r[1])),
        E_PROCROOT => format!("cannot open the root of pid {}: {}", edit.pid, os(r[1])),
        E_ROOTFS => format!(
            "cannot open the rootfs {} in the container's mount namespace: {}",
            edit.rootfs.display(),
            os(r[1])
        ),
        E_SYMLINK => format!(
            "{} is a symlink in the container's rootfs; devgate never follows a container's symlinks",
            upto(r[2])
        ),
        E_NOTDIR => format!("{} is not a directory in the container's rootfs", upto(r[2])),
        E_STAT | E_OPEN => format!("cannot open {} in the container: {}", upto(r[2]), os(r[1])),
        E_MISSING => "the container has no node at this path".to_string(),
        E_NOTDEV => "the container's node is not a device node".to_string(),
        E_MISMATCH => format!(
            "the container's node is {found}, not the device being replaced ({})",
            edit.expect
        ),
        E_MKNOD => format!("cannot create the spare's node: {}", os(r[1])),
        E_CHOWN => format!("cannot set the owner of the spare's node: {}", os(r[1])),
        E_CHMOD => format!("cannot set the mode of the spare's node: {}", os(r[1])),
        E_RENAME => format!(
            "cannot rename the spare's node over the old one: {}{}",
            os(r[1]),
            if r[1] == libc::EBUSY {
                " (the node is a mount point, e.g. a bind-mounted device)"
            } else {
                ""
            }
        ),
        other => format!("the /dev edit failed (code {other})"),
    };
    Err(Error::invalid(ctx, msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn num(major: u32, minor: u32) -> DevNum {
        DevNum {
            typ: DevType::Char,
            major,
            minor,
        }
    }

    fn root_only() -> bool {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return false;
        }
        true
    }

    fn rootfs(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("devgate-nsdev-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("dev")).unwrap();
        d
    }

    fn edit<'a>(root: &'a Path, path: &'a Path) -> NodeEdit<'a> {
        NodeEdit {
            pid: std::process::id() as i32,
            rootfs: root,
            container_path: path,
            expect: num(1, 5),
            spare: num(1, 7),
            timeout: Duration::from_secs(5),
        }
    }

    fn mknod(p: &Path, major: u32, minor: u32, mode: u32) {
        nix::sys::stat::mknod(
            p,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(mode),
            nix::sys::stat::makedev(major.into(), minor.into()),
        )
        .unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn replaces_node_keeping_mode_and_owner() {
        if !root_only() {
            return;
        }
        let r = rootfs("ok");
        mknod(&r.join("dev/zero"), 1, 5, 0o640);
        std::os::unix::fs::chown(r.join("dev/zero"), Some(7), Some(9)).unwrap();
        let out = replace_node(&edit(&r, Path::new("/dev/zero"))).unwrap();
        assert_eq!(
            out,
            Replaced {
                mode: 0o640,
                uid: 7,
                gid: 9,
                already: false
            }
        );
        let m = fs::symlink_metadata(r.join("dev/zero")).unwrap();
        assert_eq!(DevNum::from_metadata(&m), Some(num(1, 7)));
        assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o640, 7, 9));
        assert_eq!(
            fs::read_dir(r.join("dev")).unwrap().count(),
            1,
            "no temp left"
        );
        // twice is a no-op
        assert!(
            replace_node(&edit(&r, Path::new("/dev/zero")))
                .unwrap()
                .already
        );
    }

    #[test]
    fn refuses_symlinks_anywhere_and_touches_nothing_outside() {
        if !root_only() {
            return;
        }
        let r = rootfs("sym");
        let outside = r.with_extension("outside");
        let _ = fs::remove_dir_all(&outside);
        fs::create_dir_all(&outside).unwrap();
        mknod(&outside.join("zero"), 1, 5, 0o666);
        fs::remove_dir(r.join("dev")).unwrap();
        std::os::unix::fs::symlink(&outside, r.join("dev")).unwrap();
        let e = replace_node(&edit(&r, Path::new("/dev/zero")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev is a symlink in the container's rootfs"),
            "{e}"
        );
        // the final node a symlink to a host-looking path
        fs::remove_file(r.join("dev")).unwrap();
        fs::create_dir(r.join("dev")).unwrap();
        std::os::unix::fs::symlink(outside.join("zero"), r.join("dev/zero")).unwrap();
        let e = replace_node(&edit(&r, Path::new("/dev/zero")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/zero is a symlink"), "{e}");
        let m = fs::symlink_metadata(outside.join("zero")).unwrap();
        assert_eq!(
            DevNum::from_metadata(&m),
            Some(num(1, 5)),
            "outside untouched"
        );
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 1);
    }

    #[test]
    fn refuses_wrong_node_missing_node_and_dotdot() {
        if !root_only() {
            return;
        }
        let r = rootfs("wrong");
        mknod(&r.join("dev/zero"), 1, 3, 0o666);
        let e = replace_node(&edit(&r, Path::new("/dev/zero")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("node is 1:3, not the device being replaced (1:5)"),
            "{e}"
        );
        let e = replace_node(&edit(&r, Path::new("/dev/nope")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no node at this path"), "{e}");
        fs::write(r.join("dev/file"), b"").unwrap();
        let e = replace_node(&edit(&r, Path::new("/dev/file/x")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/file is not a directory"), "{e}");
        let e = replace_node(&edit(&r, Path::new("/dev/../../etc/passwd")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'..'"), "{e}");
    }
}
