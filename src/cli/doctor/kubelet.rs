//! Where the node's kubelet keeps pods (`<--root-dir>/pods`) and their logs (`podLogsDir`):
//! its flags, its KubeletConfiguration file (and `--config-dir` drop-ins), and the running
//! kubelet found through /proc.
//!
//! Pure readers first, then the I/O. Only a process of root's whose name is `kubelet`, in
//! doctor's own mount namespace (the node's, where an operator runs it), counts, so a process another user or a pod's container
//! names kubelet cannot point doctor at a file or a directory; that process's files are
//! opened inside its own root (openat2 RESOLVE_IN_ROOT, no magic links), non-blocking and
//! bounded, so a symlink in its tree stays in its tree and a FIFO or a huge file cannot
//! hold doctor.

use super::error::ConfigError;
use crate::error::Error;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// kubelet's `--root-dir` default; its pods are in `pods` below it.
pub(crate) const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";
/// kubelet's `podLogsDir` default.
pub(crate) const DEFAULT_POD_LOGS_DIR: &str = "/var/log/pods";
/// A command line is at most a few KiB; the kernel allows megabytes.
const MAX_CMDLINE: u64 = 256 << 10;
/// kubelet's `--config-dir` drop-ins read, at most.
const MAX_DROPINS: usize = 64;

/// The kubelet flags that say where its files are.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Flags {
    pub(crate) config: Option<PathBuf>,
    pub(crate) config_dir: Option<PathBuf>,
    pub(crate) root_dir: Option<PathBuf>,
}

/// kubelet's flags from its arguments after the program name, as pflag reads them:
/// `--name value` or `--name=value`, the last one counting, `--` ending them; an empty
/// value is the flag unset. A name's `_` is `-`, as kubelet's flag set normalizes it
/// (cliflag.WordSepNormalizeFunc).
pub(crate) fn parse_flags(args: &[String]) -> Flags {
    let mut f = Flags::default();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--" {
            break;
        }
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (a, None),
        };
        let slot = match name.replace('_', "-").as_str() {
            "--config" => &mut f.config,
            "--config-dir" => &mut f.config_dir,
            "--root-dir" => &mut f.root_dir,
            _ => {
                i += 1;
                continue;
            }
        };
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                match args.get(i) {
                    Some(v) => v.as_str(),
                    None => break,
                }
            }
        };
        *slot = (!value.is_empty()).then(|| PathBuf::from(value));
        i += 1;
    }
    f
}

/// A kubelet process: its pid, flags, and where its root and working directory are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Running {
    pub(crate) pid: u32,
    pub(crate) flags: Flags,
    /// `/proc/PID/root`: its files are opened inside it.
    pub(crate) root: PathBuf,
    /// Its working directory, inside its root (a relative `--config` is read from there);
    /// None where it is gone.
    pub(crate) cwd: Option<PathBuf>,
}

/// The running kubelet under `proc` (`/proc`): of the processes named `kubelet` that root
/// runs in doctor's own mount namespace (`self`: the node's, where an operator runs
/// doctor; a test node's, where its kubelet runs in one of its own), the one of lowest pid.
///
/// A container's root is uid 0 too: a pod's process named kubelet, its pid below the
/// node's kubelet's once pids wrap, would otherwise choose the directories doctor passes
/// and tells the operator to set. Every container has a mount namespace of its own.
pub(crate) fn find_running(proc: &Path) -> Option<Running> {
    use std::os::unix::ffi::OsStrExt;
    let pids = fs::read_dir(proc).ok()?;
    let node_mnt = fs::read_link(proc.join("self/ns/mnt")).ok()?;
    let mut found: Option<u32> = None;
    for e in pids.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let dir = proc.join(pid.to_string());
        if read_proc(&dir.join("comm"), 64).is_some_and(|c| c == b"kubelet\n")
            && read_proc(&dir.join("status"), 64 << 10).is_some_and(|s| runs_as_root(&s))
            && fs::read_link(dir.join("ns/mnt")).is_ok_and(|m| m == node_mnt)
        {
            found = Some(found.map_or(pid, |f| f.min(pid)));
        }
    }
    let pid = found?;
    let dir = proc.join(pid.to_string());
    let cmdline = read_proc(&dir.join("cmdline"), MAX_CMDLINE)?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .skip(1)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    Some(Running {
        pid,
        flags: parse_flags(&args),
        root: dir.join("root"),
        // A working directory that is gone reads `/dir (deleted)`, a name any user may
        // make anew (in /tmp): no working directory, then.
        cwd: fs::read_link(dir.join("cwd"))
            .ok()
            .filter(|c| c.is_absolute() && !c.as_os_str().as_bytes().ends_with(b" (deleted)")),
    })
}

/// Whether a /proc/PID/status says root runs the process: real and effective uid 0. Not the
/// owner of /proc/PID, which is root's for any process that made itself non-dumpable.
fn runs_as_root(status: &[u8]) -> bool {
    String::from_utf8_lossy(status)
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .is_some_and(|ids| {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            ids.len() >= 2 && ids[0] == "0" && ids[1] == "0"
        })
}

/// A /proc file, at most `max` bytes (None past it or where it cannot be read).
fn read_proc(path: &Path, max: u64) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    File::open(path)
        .ok()?
        .take(max + 1)
        .read_to_end(&mut buf)
        .ok()?;
    (buf.len() as u64 <= max).then_some(buf)
}

/// The text of `path` as the process whose root is `root` sees it: opened inside that root,
/// symlinks resolved inside it and magic links refused, non-blocking, a regular file of at
/// most a MiB. Errors name `path`.
pub(crate) fn read_in_root(root: &Path, path: &Path) -> Result<String, ConfigError> {
    use std::os::unix::ffi::OsStrExt;
    let io = |what: &str, e| ConfigError::Io(Error::io(what.to_string(), path, e));
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)
        .map_err(|e| ConfigError::Io(Error::io("cannot open", root, e)))?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| ConfigError::NotRegular(path.to_path_buf()))?;
    let fd = crate::fsutil::openat2(
        &dir,
        &c,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|e| io("cannot open", e))?;
    super::runtimes::read_opened(File::from(fd), path)
}

/// The `.conf` drop-ins of `dir` inside `root` as kubelet's filepath.WalkDir finds them:
/// every file (not directory) whose name ends `.conf`, hidden ones too, in the directories
/// below as well, in the walk's order (by name, a directory's files where its name sorts).
/// At most [`MAX_DROPINS`] entries are looked at; more is an error, not a silent cut.
pub(crate) fn dropins_in_root(root: &Path, dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let rootfd = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)
        .map_err(|e| ConfigError::Io(Error::io("cannot list", dir, e)))?;
    let mut names: Vec<PathBuf> = Vec::new();
    let mut seen = 0;
    walk_in_root(&rootfd, dir, dir, &mut names, &mut seen)?;
    // Path order is by component: a directory's files sort where its name does, as the
    // walk visits them.
    names.sort();
    Ok(names)
}

/// One directory of [`dropins_in_root`]'s walk, opened inside the root (a link to a
/// directory is not followed: the walk lstats, and kubelet then fails to read it as a file).
fn walk_in_root(
    rootfd: &File,
    top: &Path,
    dir: &Path,
    names: &mut Vec<PathBuf>,
    seen: &mut usize,
) -> Result<(), ConfigError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let io = |e| ConfigError::Io(Error::io("cannot list", dir, e));
    let rel = dir.strip_prefix("/").unwrap_or(dir);
    let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| ConfigError::NotRegular(dir.to_path_buf()))?;
    let fd = crate::fsutil::openat2(
        rootfd,
        &c,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(io)?;
    let listed = fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(io)?;
    for e in listed {
        let e = e.map_err(io)?;
        *seen += 1;
        if *seen > MAX_DROPINS {
            return Err(ConfigError::Kubelet {
                path: top.to_path_buf(),
                msg: format!("more than {MAX_DROPINS} drop-ins and directories"),
            });
        }
        let path = dir.join(e.file_name());
        if e.file_type().map_err(io)?.is_dir() {
            walk_in_root(rootfd, top, &path, names, seen)?;
        } else if e.file_name().as_bytes().ends_with(b".conf") {
            // filepath.Ext(name) == ".conf": a name that ends so, `.conf` itself too.
            names.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn flags_as_pflag_reads_them() {
        let f = parse_flags(&args(
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
             --kubeconfig=/etc/kubernetes/kubelet.conf --config=/var/lib/kubelet/config.yaml \
             --container-runtime-endpoint=unix:///var/run/containerd/containerd.sock \
             --node-ip 127.0.0.1 --root-dir /data/kubelet --root-dir=/srv/kubelet",
        ));
        assert_eq!(
            f.config.as_deref(),
            Some(Path::new("/var/lib/kubelet/config.yaml"))
        );
        assert_eq!(f.root_dir.as_deref(), Some(Path::new("/srv/kubelet")));
        assert_eq!(f.config_dir, None);
        let f = parse_flags(&args("--config-dir /etc/kubelet.conf.d -- --root-dir /x"));
        assert_eq!(
            f.config_dir.as_deref(),
            Some(Path::new("/etc/kubelet.conf.d"))
        );
        assert_eq!(f.root_dir, None, "after --");
        assert_eq!(parse_flags(&args("--root-dir")), Flags::default());
        assert_eq!(parse_flags(&args("--config= --v=2")), Flags::default());
    }

    /// kubelet's flag set normalizes `_` in a flag's name to `-`
    /// (cliflag.WordSepNormalizeFunc): `--root_dir` is `--root-dir`. Read as another flag,
    /// doctor would pass /var/lib/kubelet/pods for a kubelet that keeps its pods elsewhere.
    #[test]
    fn flag_names_as_kubelet_normalizes_them() {
        let f = parse_flags(&args(
            "--root-dir /a --root_dir=/data/kubelet --config_dir /etc/k.d --config=/c.yaml",
        ));
        assert_eq!(f.root_dir.as_deref(), Some(Path::new("/data/kubelet")));
        assert_eq!(f.config_dir.as_deref(), Some(Path::new("/etc/k.d")));
        assert_eq!(f.config.as_deref(), Some(Path::new("/c.yaml")));
    }

    /// A fake /proc: a kubelet of root's, and one of another user's that must not count.
    /// Long because each case builds on the /proc the one before it left.
    #[test]
    fn the_running_kubelet_is_roots() {
        let d = crate::fsutil::tests::tempdir("doctor-kubelet-proc");
        let proc = d.join("proc");
        let mk = |pid: u32, comm: &str, cmdline: &[&str]| {
            let p = proc.join(pid.to_string());
            fs::create_dir_all(&p).unwrap();
            fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(p.join("cmdline"), cmdline.join("\0") + "\0").unwrap();
            fs::write(
                p.join("status"),
                "Name:\tx\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n",
            )
            .unwrap();
            fs::create_dir_all(p.join("ns")).unwrap();
            symlink("mnt:[4026531841]", p.join("ns/mnt")).unwrap();
            p
        };
        mk(1, "systemd", &["/sbin/init"]);
        // doctor, in the same namespace.
        symlink("1", proc.join("self")).unwrap();
        assert_eq!(find_running(&proc), None);
        // Another user's kubelet: its /proc entry may be root's (a non-dumpable process's
        // is), its status says who runs it.
        let other = mk(7, "kubelet", &["/tmp/kubelet", "--root-dir", "/tmp/evil"]);
        fs::write(other.join("status"), "Uid:\t1000\t1000\t1000\t1000\n").unwrap();
        assert_eq!(find_running(&proc), None, "another user's kubelet");
        fs::write(other.join("status"), "Uid:\t1000\t0\t0\t0\n").unwrap();
        assert_eq!(
            find_running(&proc),
            None,
            "a set-uid kubelet run by another user"
        );
        mk(
            40,
            "kubelet",
            &[
                "/usr/bin/kubelet",
                "--config=/etc/k.yaml",
                "--root-dir",
                "/srv/k",
            ],
        );
        mk(
            41,
            "kubelet",
            &["/usr/bin/kubelet", "--root-dir", "/second"],
        );
        let r = find_running(&proc).unwrap();
        assert_eq!(r.pid, 40);
        assert_eq!(r.flags.root_dir.as_deref(), Some(Path::new("/srv/k")));
        assert_eq!(r.flags.config.as_deref(), Some(Path::new("/etc/k.yaml")));
        assert_eq!(r.root, proc.join("40/root"));
        // A command line past the bound is not read at all.
        fs::remove_dir_all(proc.join("41")).unwrap();
        fs::write(
            proc.join("40/cmdline"),
            vec![b'x'; (MAX_CMDLINE + 1) as usize],
        )
        .unwrap();
        assert_eq!(find_running(&proc), None);
        fs::remove_dir_all(&d).unwrap();
    }

    /// kubelet walks its --config-dir (filepath.WalkDir): every file whose extension is
    /// `.conf`, a hidden one too, and those in directories below, in the walk's order. A
    /// drop-in doctor skipped could set podLogsDir unseen, and doctor would pass the
    /// directory the file before it named.
    #[test]
    fn dropins_are_the_files_kubelets_walk_finds() {
        let d = crate::fsutil::tests::tempdir("doctor-kubelet-walk");
        let root = d.join("root");
        let k = root.join("etc/k.d");
        fs::create_dir_all(k.join("50.d/deeper")).unwrap();
        fs::create_dir_all(k.join("dir.conf")).unwrap();
        for n in [
            "10.conf",
            ".99-hidden.conf",
            ".conf",
            "notes.txt",
            "50.d/x.conf",
            "50.d/deeper/y.conf",
            "dir.conf/z.conf",
            "60.conf",
        ] {
            fs::write(k.join(n), "").unwrap();
        }
        // A link to a directory is a file to the walk, which kubelet then fails to read.
        symlink("50.d", k.join("70-link.conf")).unwrap();
        let want: Vec<PathBuf> = [
            ".99-hidden.conf",
            ".conf",
            "10.conf",
            "50.d/deeper/y.conf",
            "50.d/x.conf",
            "60.conf",
            "70-link.conf",
            "dir.conf/z.conf",
        ]
        .iter()
        .map(|n| Path::new("/etc/k.d").join(n))
        .collect();
        assert_eq!(dropins_in_root(&root, Path::new("/etc/k.d")).unwrap(), want);
        // A tree past the bound is refused, not cut short.
        for i in 0..MAX_DROPINS {
            fs::create_dir_all(k.join(format!("many/{i}"))).unwrap();
        }
        assert!(dropins_in_root(&root, Path::new("/etc/k.d")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    /// A pod's container runs as root, and may name its process kubelet and give it a pid
    /// below the node's kubelet's (pids wrap): its flags are the pod author's, and doctor
    /// would pass, or tell the operator to set, the directories it names. Only a kubelet in
    /// doctor's own mount namespace (`self`) counts.
    #[test]
    fn a_kubelet_in_a_containers_mount_namespace_does_not_count() {
        let d = crate::fsutil::tests::tempdir("doctor-kubelet-ns");
        let proc = d.join("proc");
        let mk = |pid: u32, comm: &str, mnt: Option<&str>, cmdline: &[&str]| {
            let p = proc.join(pid.to_string());
            fs::create_dir_all(p.join("ns")).unwrap();
            fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(p.join("cmdline"), cmdline.join("\0") + "\0").unwrap();
            fs::write(p.join("status"), "Uid:\t0\t0\t0\t0\n").unwrap();
            if let Some(m) = mnt {
                symlink(m, p.join("ns/mnt")).unwrap();
            }
        };
        mk(1, "systemd", Some("mnt:[4026531841]"), &["/sbin/init"]);
        // doctor itself, in the node's namespace.
        fs::create_dir_all(proc.join("self/ns")).unwrap();
        symlink("mnt:[4026531841]", proc.join("self/ns/mnt")).unwrap();
        mk(
            7,
            "kubelet",
            Some("mnt:[4026532999]"),
            &["kubelet", "--root-dir", "/pod-chosen"],
        );
        assert_eq!(find_running(&proc), None, "a container's root kubelet");
        mk(8, "kubelet", None, &["kubelet", "--root-dir", "/no-ns"]);
        assert_eq!(
            find_running(&proc),
            None,
            "a kubelet whose namespace is unread"
        );
        mk(
            900,
            "kubelet",
            Some("mnt:[4026531841]"),
            &["/usr/bin/kubelet", "--root-dir", "/srv/k"],
        );
        let r = find_running(&proc).unwrap();
        assert_eq!(r.pid, 900);
        assert_eq!(r.flags.root_dir.as_deref(), Some(Path::new("/srv/k")));
        fs::remove_dir_all(&d).unwrap();
    }

    /// kubelet's files are read inside its root: a symlink to / leads to its own root, a
    /// FIFO does not block, and a huge file is refused.
    #[test]
    fn files_are_read_inside_the_kubelets_root() {
        let d = crate::fsutil::tests::tempdir("doctor-kubelet-root");
        let root = d.join("root");
        fs::create_dir_all(root.join("etc/conf.d")).unwrap();
        fs::write(root.join("etc/k.yaml"), "podLogsDir: /in-root\n").unwrap();
        assert_eq!(
            read_in_root(&root, Path::new("/etc/k.yaml")).unwrap(),
            "podLogsDir: /in-root\n"
        );
        // Outside the root, a file doctor could read; a link to it resolves inside.
        fs::write(d.join("secret"), "podLogsDir: /outside\n").unwrap();
        symlink(d.join("secret"), root.join("etc/abs")).unwrap();
        symlink("../../secret", root.join("etc/rel")).unwrap();
        for l in ["/etc/abs", "/etc/rel", "/../secret"] {
            assert!(read_in_root(&root, Path::new(l)).is_err(), "{l}");
        }
        symlink("/etc/k.yaml", root.join("etc/inside")).unwrap();
        assert!(read_in_root(&root, Path::new("/etc/inside")).is_ok());
        nix::unistd::mkfifo(
            &root.join("etc/fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert_eq!(
            read_in_root(&root, Path::new("/etc/fifo")).unwrap_err(),
            ConfigError::NotRegular("/etc/fifo".into())
        );
        fs::write(
            root.join("etc/huge"),
            vec![b'#'; (super::super::runtimes::MAX_SMALL_FILE + 1) as usize],
        )
        .unwrap();
        assert!(matches!(
            read_in_root(&root, Path::new("/etc/huge")).unwrap_err(),
            ConfigError::TooLarge { .. }
        ));
        // Drop-ins: `.conf` files by name, not others.
        for n in ["20-b.conf", "10-a.conf", "notes.txt"] {
            fs::write(root.join("etc/conf.d").join(n), "").unwrap();
        }
        assert_eq!(
            dropins_in_root(&root, Path::new("/etc/conf.d")).unwrap(),
            [
                PathBuf::from("/etc/conf.d/10-a.conf"),
                "/etc/conf.d/20-b.conf".into()
            ]
        );
        for i in 0..MAX_DROPINS {
            fs::write(root.join(format!("etc/conf.d/x{i}.conf")), "").unwrap();
        }
        assert!(dropins_in_root(&root, Path::new("/etc/conf.d")).is_err());
        fs::remove_dir_all(&d).unwrap();
    }
}
