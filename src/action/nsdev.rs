//! The /dev edit inside a container: replace the node at the container's path with a node
//! for another major:minor, same mode (less set-id bits), uid and gid.
//!
//! The property this module keeps: once the new node exists, no name another process can
//! replace is resolved again, and every step is checked with fstat.
//! - The container's process is held by a pidfd from the start, so a pid reused while
//!   devgate probed can never send the edit into another process.
//! - setns(CLONE_NEWNS) is refused to a multi-threaded process, so the edit runs in a forked
//!   child that enters the namespace with setns(pidfd). The child makes raw system calls only
//!   (no allocation, no locks), which keeps it correct whatever threads the parent had.
//! - The directory is reached with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS), one
//!   component at a time: a container's symlinks are never resolved.
//! - The new node is made in a fresh directory only root can write, with an unpredictable
//!   name, under umask 0 with its final mode (no chmod, which would follow a symlink), owned
//!   through an O_PATH fd (fchownat AT_EMPTY_PATH), checked with fstat, then renamed over the
//!   old node from that private directory. A process sharing the container's /dev (a
//!   sibling container's emptyDir) can swap names in /dev but never the private directory's.
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
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// One node replacement.
#[derive(Debug, Clone)]
pub struct NodeEdit<'a> {
    /// The container's process (runtime state pid).
    pub pid: i32,
    /// A pidfd for `pid` opened before devgate probed, when the caller has one; otherwise
    /// one is opened here.
    pub pidfd: Option<RawFd>,
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

/// The child's last step: where it stopped, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
enum Step {
    Done = 0,
    Already,
    EnterNs,
    ProcRoot,
    Rootfs,
    Symlink,
    NotDir,
    Open,
    Stat,
    Missing,
    NotDev,
    Mismatch,
    PrivateDir,
    Mknod,
    NewNode,
    Chown,
    Verify,
    Rename,
}

impl Step {
    const ALL: [Step; 18] = [
        Step::Done,
        Step::Already,
        Step::EnterNs,
        Step::ProcRoot,
        Step::Rootfs,
        Step::Symlink,
        Step::NotDir,
        Step::Open,
        Step::Stat,
        Step::Missing,
        Step::NotDev,
        Step::Mismatch,
        Step::PrivateDir,
        Step::Mknod,
        Step::NewNode,
        Step::Chown,
        Step::Verify,
        Step::Rename,
    ];

    fn from_code(c: i32) -> Option<Step> {
        Step::ALL.iter().copied().find(|s| *s as i32 == c)
    }
}

/// What the child writes to its pipe: plain integers, because the child cannot allocate.
/// The parent turns it into a `Step` and a `Found` at once.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
struct Wire {
    step: i32,
    errno: i32,
    /// The path component the walk stopped at.
    component: i32,
    mode: u32,
    uid: u32,
    gid: u32,
    major: u32,
    minor: u32,
}

/// What the child saw of the node.
#[derive(Debug, Clone, Copy)]
struct Found {
    mode: u32,
    uid: u32,
    gid: u32,
    major: u32,
    minor: u32,
}

/// Everything the child needs, prepared before fork.
struct ChildInput<'a> {
    pidfd: RawFd,
    proc_root: RawFd,
    out: RawFd,
    rootfs: &'a CStr,
    comps: &'a [CString],
    private: &'a CStr,
    expect: (libc::mode_t, u32, u32),
    spare: (libc::mode_t, u32, u32),
}

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
unsafe fn child(inp: &ChildInput) -> ! {
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

/// A pidfd for `pid` (pidfd_open, Linux 5.3).
pub fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain system call; the returned fd is owned here.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as RawFd;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The container's process as a hook holds it: the state's pid and a pidfd opened before
/// anything slow (probing) ran. Everything the remap does to "the container" goes through
/// it, so a pid that dies and is reused meanwhile is noticed instead of edited.
#[derive(Debug)]
pub struct ContainerProcess {
    pub pid: i32,
    fd: std::result::Result<OwnedFd, String>,
}

impl ContainerProcess {
    pub fn open(pid: i32) -> ContainerProcess {
        ContainerProcess {
            pid,
            fd: pidfd_open(pid).map_err(|e| {
                format!(
                    "cannot open a pidfd for container process {pid}: {}",
                    e.to_string().to_lowercase()
                )
            }),
        }
    }

    /// The pidfd, or why there is none (the process had exited when the hook started).
    pub fn pidfd(&self) -> std::result::Result<RawFd, String> {
        self.fd
            .as_ref()
            .map(|f| f.as_raw_fd())
            .map_err(Clone::clone)
    }
}

/// True while the process behind `pidfd` has not exited. A file under /proc/PID opened
/// before this returns true belongs to that process, not to a later one with its pid.
pub fn pidfd_alive(pidfd: RawFd) -> bool {
    // SAFETY: signal 0 only checks; null siginfo is allowed.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// Waits up to `deadline` for the pipe to fill `buf`.
fn read_full(fd: &OwnedFd, buf: &mut [u8], deadline: Instant) -> std::result::Result<(), String> {
    let mut got = 0usize;
    while got < buf.len() {
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
        let n = unsafe {
            libc::poll(
                &mut p,
                1,
                left.as_millis().clamp(1, i32::MAX as u128) as i32,
            )
        };
        if n < 0 && errno() != libc::EINTR {
            return Err(format!("poll: {}", std::io::Error::last_os_error()));
        }
        if n <= 0 {
            continue;
        }
        // SAFETY: reads into the buffer's remaining bytes.
        let k = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf[got..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - got,
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
    Ok(())
}

fn read_report(fd: &OwnedFd, deadline: Instant) -> std::result::Result<Wire, String> {
    let mut buf = [0u8; std::mem::size_of::<Wire>()];
    read_full(fd, &mut buf, deadline)?;
    // SAFETY: Wire is repr(C) plain integers; every bit pattern is valid.
    Ok(unsafe { std::ptr::read_unaligned(buf.as_ptr() as *const Wire) })
}

/// Reaps the child, waiting at most a short while: a child stuck in an uninterruptible
/// system call (a hung filesystem) cannot be killed, and devgate must not hang with it.
fn reap(child: i32) {
    const WAIT: Duration = Duration::from_millis(500);
    // A pidfd turns readable when the child exits: wait on it, bounded, instead of sleeping
    // in steps (the child is normally exiting already; a step would cost a whole sleep).
    if let Ok(fd) = pidfd_open(child) {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let until = Instant::now() + WAIT;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as i32) };
            if n >= 0 || errno() != libc::EINTR || left.is_zero() {
                break;
            }
        }
        let mut status = 0;
        // SAFETY: reaps our own child without blocking.
        unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        return;
    }
    let until = Instant::now() + WAIT;
    loop {
        let mut status = 0;
        // SAFETY: reaps our own child without blocking.
        let r = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if r != 0 || Instant::now() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// 16 hex digits from the kernel's random pool: the private directory's name. Not a
/// defence on its own (inotify sees any name); it only keeps names from colliding.
fn random_name() -> CString {
    let mut b = [0u8; 8];
    // SAFETY: fills the buffer; a short read leaves zeros, which is still a valid name.
    unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, b.len(), 0) };
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    CString::new(format!(".devgate-{hex}")).expect("hex has no NUL")
}

/// Replaces the node at `edit.container_path` inside the container with one for the spare.
pub fn replace_node(edit: &NodeEdit) -> Result<Replaced> {
    let ctx = format!("container path {}", edit.container_path.display());
    let comps = components(edit.container_path).map_err(|m| Error::invalid(&ctx, m))?;
    let rootfs = CString::new(edit.rootfs.as_os_str().as_bytes())
        .map_err(|_| Error::invalid(&ctx, "rootfs path contains NUL"))?;
    let proc_root_path = PathBuf::from(format!("/proc/{}/root", edit.pid));
    let owned_pidfd;
    let pidfd = match edit.pidfd {
        Some(fd) => fd,
        None => {
            owned_pidfd = pidfd_open(edit.pid)
                .map_err(|e| Error::io("cannot open a pidfd", &proc_root_path, e))?;
            owned_pidfd.as_raw_fd()
        }
    };
    let proc_root = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(&proc_root_path)
        .map_err(|e| Error::io("cannot open the root of the container", &proc_root_path, e))?;
    if !pidfd_alive(pidfd) {
        return Err(Error::invalid(
            &ctx,
            format!(
                "container process {} exited before its /dev could be edited",
                edit.pid
            ),
        ));
    }
    let private = random_name();
    let inp = ChildInput {
        pidfd,
        proc_root: proc_root.as_raw_fd(),
        out: -1,
        rootfs: &rootfs,
        comps: &comps,
        private: &private,
        expect: (
            s_ifmt(edit.expect.typ),
            edit.expect.major,
            edit.expect.minor,
        ),
        spare: (s_ifmt(edit.spare.typ), edit.spare.major, edit.spare.minor),
    };
    let (rd, wr) = pipe()?;
    let inp = ChildInput {
        out: wr.as_raw_fd(),
        ..inp
    };
    let deadline = Instant::now() + edit.timeout;

    // SAFETY: the child only makes async-signal-safe system calls on memory prepared above
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::io(
            "cannot fork",
            &proc_root_path,
            std::io::Error::last_os_error(),
        ));
    }
    if pid == 0 {
        // SAFETY: in the child of fork.
        unsafe { child(&inp) }
    }
    drop(wr);
    let report = read_report(&rd, deadline);
    if report.is_err() {
        // SAFETY: pid is our child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    reap(pid);
    let w = report.map_err(|m| {
        Error::invalid(
            &ctx,
            format!(
                "the /dev edit in the mount namespace of pid {} failed: {m}",
                edit.pid
            ),
        )
    })?;
    let found = Found {
        mode: w.mode,
        uid: w.uid,
        gid: w.gid,
        major: w.major,
        minor: w.minor,
    };
    match Step::from_code(w.step) {
        Some(Step::Done) | Some(Step::Already) => Ok(Replaced {
            mode: found.mode,
            uid: found.uid,
            gid: found.gid,
            already: w.step == Step::Already as i32,
        }),
        Some(step) => Err(Error::invalid(ctx, failure(edit, &comps, step, &w, found))),
        None => Err(Error::invalid(
            ctx,
            format!("the /dev edit failed (code {})", w.step),
        )),
    }
}

/// The one-line cause of a failed edit.
fn failure(edit: &NodeEdit, comps: &[CString], step: Step, w: &Wire, found: Found) -> String {
    let upto = |i: i32| {
        let mut p = PathBuf::from("/");
        for c in comps.iter().take(i.max(0) as usize + 1) {
            p.push(std::ffi::OsStr::from_bytes(c.as_bytes()));
        }
        p.display().to_string()
    };
    let os = std::io::Error::from_raw_os_error(w.errno)
        .to_string()
        .to_lowercase();
    match step {
        Step::Done | Step::Already => String::new(),
        Step::EnterNs => format!("cannot enter the mount namespace of pid {}: {os}", edit.pid),
        Step::ProcRoot => format!("cannot open the root of pid {}: {os}", edit.pid),
        Step::Rootfs => format!(
            "cannot open the rootfs {} in the container's mount namespace: {os}",
            edit.rootfs.display()
        ),
        Step::Symlink => format!(
            "{} is a symlink in the container's rootfs; devgate never follows a container's symlinks",
            upto(w.component)
        ),
        Step::NotDir => format!(
            "{} is not a directory in the container's rootfs",
            upto(w.component)
        ),
        Step::Open | Step::Stat => {
            format!("cannot open {} in the container: {os}", upto(w.component))
        }
        Step::Missing => "the container has no node at this path".to_string(),
        Step::NotDev => "the container's node is not a device node".to_string(),
        Step::Mismatch => format!(
            "the container's node is {}:{}, not the device being replaced ({})",
            found.major, found.minor, edit.expect
        ),
        Step::PrivateDir => format!(
            "cannot make a private directory beside the node: {os} (or it was tampered with)"
        ),
        Step::Mknod => format!("cannot create the spare's node: {os}"),
        Step::NewNode => "the spare's new node changed under devgate; edit abandoned".to_string(),
        Step::Chown => format!("cannot set the owner of the spare's node: {os}"),
        Step::Verify => {
            "the spare's new node is not as made (mode, owner or links); edit abandoned".to_string()
        }
        Step::Rename => format!(
            "cannot rename the spare's node over the old one: {os}{}",
            if w.errno == libc::EBUSY {
                " (the node is a mount point, e.g. a bind-mounted device)"
            } else {
                ""
            }
        ),
    }
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
            pidfd: None,
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

    /// A process sharing the container's /dev swaps every devgate name it sees for a
    /// symlink to a host file, in a loop, over 1000 edits: no host file changes.
    #[test]
    fn racing_swaps_never_reach_a_host_file() {
        if !root_only() {
            return;
        }
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let r = rootfs("race");
        let outside = r.with_extension("host");
        let _ = fs::remove_dir_all(&outside);
        fs::create_dir_all(&outside).unwrap();
        let host_file = outside.join("shadow");
        fs::write(&host_file, b"root:x:0:0\n").unwrap();
        fs::set_permissions(&host_file, fs::Permissions::from_mode(0o600)).unwrap();
        mknod(&outside.join("zero"), 1, 5, 0o600);
        mknod(&r.join("dev/zero"), 1, 5, 0o666);
        let snapshot = |p: &Path| {
            let m = fs::symlink_metadata(p).unwrap();
            (m.mode(), m.uid(), m.gid(), m.nlink(), m.rdev())
        };
        let before = (
            snapshot(&host_file),
            snapshot(&outside.join("zero")),
            snapshot(&outside),
        );

        let stop = Arc::new(AtomicBool::new(false));
        let attacker = {
            let (stop, dev, outside) = (stop.clone(), r.join("dev"), outside.clone());
            std::thread::spawn(move || {
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let Ok(rd) = fs::read_dir(&dev) else { continue };
                    for e in rd.flatten() {
                        let name = e.file_name();
                        if !name.to_string_lossy().starts_with(".devgate-") {
                            continue;
                        }
                        let p = e.path();
                        // a temp node made directly in /dev (what an unsafe edit does)
                        if e.file_type().is_ok_and(|t| !t.is_dir() && !t.is_symlink())
                            && fs::remove_file(&p).is_ok()
                        {
                            let _ = std::os::unix::fs::symlink(outside.join("shadow"), &p);
                            swaps += 1;
                            continue;
                        }
                        // the new node inside the private directory
                        let n = p.join("n");
                        if fs::remove_file(&n).is_ok() {
                            let _ = std::os::unix::fs::symlink(outside.join("shadow"), &n);
                            swaps += 1;
                        }
                        // the private directory itself
                        let away = dev.join(format!("moved-{swaps}"));
                        if fs::rename(&p, &away).is_ok() {
                            let _ = std::os::unix::fs::symlink(&outside, &p);
                            swaps += 1;
                        }
                    }
                }
                swaps
            })
        };
        let mut ok = 0;
        for i in 0..1000 {
            let (from, to) = if i % 2 == 0 { (5, 7) } else { (7, 5) };
            let e = NodeEdit {
                expect: num(1, from),
                spare: num(1, to),
                ..edit(&r, Path::new("/dev/zero"))
            };
            match replace_node(&e) {
                Ok(_) => ok += 1,
                Err(_) => {
                    // Put the expected node back so the next round has work to do.
                    let z = r.join("dev/zero");
                    let _ = fs::remove_file(&z);
                    mknod(&z, 1, to, 0o666);
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = attacker.join().unwrap();
        let after = (
            snapshot(&host_file),
            snapshot(&outside.join("zero")),
            snapshot(&outside),
        );
        assert_eq!(
            before, after,
            "a host file changed ({ok} edits, {swaps} swaps)"
        );
        assert_eq!(fs::read(&host_file).unwrap(), b"root:x:0:0\n");
        let names: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "nothing new outside: {names:?}");
        assert!(ok > 0, "no edit succeeded at all");
        let _ = fs::remove_dir_all(&r);
        let _ = fs::remove_dir_all(&outside);
    }
}
