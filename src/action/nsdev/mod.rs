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
mod child;
mod process;
mod wire;

pub use process::{pidfd_alive, pidfd_open, ContainerProcess, PidfdError};

use child::child;
use process::{pipe, read_report, reap};
use wire::{ChildInput, Found, Step, Wire};

use std::ffi::CString;
use std::os::fd::{AsRawFd, RawFd};
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

fn s_ifmt(t: DevType) -> libc::mode_t {
    match t {
        DevType::Char => libc::S_IFCHR,
        DevType::Block => libc::S_IFBLK,
    }
}

/// Splits a container path into its components, refusing `..`, `.` and anything that is
/// not an absolute path of plain names.
fn components(p: &Path) -> std::result::Result<Vec<CString>, NodePath> {
    if !p.is_absolute() {
        return Err(NodePath::Relative);
    }
    let mut out = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => {
                if n.len() > 255 {
                    return Err(NodePath::LongComponent);
                }
                out.push(CString::new(n.as_bytes()).map_err(|_| NodePath::Nul)?);
            }
            _ => return Err(NodePath::Dots),
        }
    }
    if out.is_empty() || out.len() > 64 {
        return Err(NodePath::Count);
    }
    Ok(out)
}

/// What is wrong with a container path devgate would make a node at; it follows the path
/// in the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodePath {
    Relative,
    LongComponent,
    Nul,
    Dots,
    Count,
}

impl std::fmt::Display for NodePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodePath::Relative => "is not absolute",
            NodePath::LongComponent => "has a component longer than 255 bytes",
            NodePath::Nul => "contains NUL",
            NodePath::Dots => "has a '.' or '..' component",
            NodePath::Count => "has no name or too many components",
        })
    }
}

impl std::error::Error for NodePath {}

/// 16 hex digits from the kernel's random pool: the private directory's name. Not a
/// defence on its own (inotify sees any name); it only keeps names from colliding.
fn random_name() -> CString {
    let mut b = [0u8; 8];
    // SAFETY: fills the buffer; a short read leaves zeros, which is still a valid name.
    unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, b.len(), 0) };
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    CString::new(format!(".devgate-{hex}")).expect("hex has no NUL")
}

/// Replaces the node at `edit.container_path` inside the container with one for the spare:
/// what the child reads is made and held first, then the child forked to edit, then its
/// report read into the outcome.
pub fn replace_node(edit: &NodeEdit) -> Result<Replaced> {
    let ctx = format!("container path {}", edit.container_path.display());
    let held = hold(edit, &ctx)?;
    let w = edit_in_child(edit, &held, &ctx)?;
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
        Some(step) => Err(Error::invalid(
            ctx,
            failure(edit, &held.comps, step, &w, found),
        )),
        None => Err(Error::invalid(
            ctx,
            format!("the /dev edit failed (code {})", w.step),
        )),
    }
}

/// What the forked child reads, made before fork(2) (the child may not allocate) and held
/// until it is reaped. Fields drop in order: the root's fd closes before an owned pidfd.
struct Held {
    comps: Vec<CString>,
    rootfs: CString,
    proc_root_path: PathBuf,
    proc_root: std::fs::File,
    pidfd: RawFd,
    /// The pidfd opened here when the caller had none.
    _owned_pidfd: Option<std::os::fd::OwnedFd>,
    private: CString,
}

/// The path's components, the rootfs, the container's process (by pidfd, checked alive)
/// and its root, and the private directory's name.
fn hold(edit: &NodeEdit, ctx: &str) -> Result<Held> {
    let comps = components(edit.container_path).map_err(|m| Error::invalid(ctx, m.to_string()))?;
    let rootfs = CString::new(edit.rootfs.as_os_str().as_bytes())
        .map_err(|_| Error::invalid(ctx, "rootfs path contains NUL"))?;
    let proc_root_path = PathBuf::from(format!("/proc/{}/root", edit.pid));
    let (pidfd, owned_pidfd) = match edit.pidfd {
        Some(fd) => (fd, None),
        None => {
            let owned = pidfd_open(edit.pid)
                .map_err(|e| Error::io("cannot open a pidfd", &proc_root_path, e))?;
            (owned.as_raw_fd(), Some(owned))
        }
    };
    let proc_root = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(&proc_root_path)
        .map_err(|e| Error::io("cannot open the root of the container", &proc_root_path, e))?;
    if !pidfd_alive(pidfd) {
        return Err(Error::invalid(
            ctx,
            format!(
                "container process {} exited before its /dev could be edited",
                edit.pid
            ),
        ));
    }
    Ok(Held {
        comps,
        rootfs,
        proc_root_path,
        proc_root,
        pidfd,
        _owned_pidfd: owned_pidfd,
        private: random_name(),
    })
}

/// The edit in a forked child, its report read under the deadline; a child that does not
/// report in time is killed. The child is reaped either way.
fn edit_in_child(edit: &NodeEdit, held: &Held, ctx: &str) -> Result<Wire> {
    let (rd, wr) = pipe()?;
    let inp = ChildInput {
        pidfd: held.pidfd,
        proc_root: held.proc_root.as_raw_fd(),
        out: wr.as_raw_fd(),
        rootfs: &held.rootfs,
        comps: &held.comps,
        private: &held.private,
        expect: (
            s_ifmt(edit.expect.typ),
            edit.expect.major,
            edit.expect.minor,
        ),
        spare: (s_ifmt(edit.spare.typ), edit.spare.major, edit.spare.minor),
    };
    let deadline = Instant::now() + edit.timeout;

    // SAFETY: the child only makes async-signal-safe system calls on memory prepared above
    // and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::io(
            "cannot fork",
            &held.proc_root_path,
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
    report.map_err(|m| {
        Error::invalid(
            ctx,
            format!(
                "the /dev edit in the mount namespace of pid {} failed: {m}",
                edit.pid
            ),
        )
    })
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
        fs::remove_dir_all(&r).unwrap();
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
        fs::remove_dir_all(&r).unwrap();
        fs::remove_dir_all(&outside).unwrap();
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
        fs::remove_dir_all(&r).unwrap();
    }

    /// A process sharing the container's /dev swaps every devgate name it sees for a
    /// symlink to a host file, in a loop, over 1000 edits: no host file changes.
    /// Long because the attacker thread, the 1000 edits and the host files' snapshots before
    /// and after are one race: the snapshots must bracket it.
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
