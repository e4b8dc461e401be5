//! Device-cgroup edits for a running container: find its cgroup from its pid, then change
//! what it may open. `v1` writes devices.deny / devices.allow; `v2` puts deny-bad and
//! allow-spare in front of every eBPF device program attached to the cgroup (`bpf` emits
//! them). Which of the two is decided the way runc and crun decide it: by the filesystem
//! at /sys/fs/cgroup in devgate's own mount namespace (the runtime's), never by the
//! controllers a process's /proc/PID/cgroup happens to list.

pub mod bpf;
pub mod error;
pub mod path;
pub mod v1;
pub mod v2;

use crate::error::{Error, Result};
use crate::fsutil::read_bounded;
use error::LocateError;
use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceCgroupBuilder};
use std::fs::File;
use std::os::fd::RawFd;
use std::path::{Component, Path, PathBuf};

const MAX_PROC_BYTES: u64 = 1 << 20;

/// Where runtimes look for cgroups.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// How the node's cgroups are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// /sys/fs/cgroup is cgroup2: device policy is eBPF programs.
    Unified,
    /// A tmpfs of v1 hierarchies with cgroup2 beside them at /sys/fs/cgroup/unified: runc
    /// and crun keep device policy in the v1 devices controller.
    Hybrid,
    /// v1 hierarchies only.
    Legacy,
}

impl Layout {
    /// From the statfs f_type of /sys/fs/cgroup and of /sys/fs/cgroup/unified.
    pub fn from_fs_types(
        root: i64,
        unified: Option<i64>,
    ) -> std::result::Result<Layout, LocateError> {
        match root {
            CGROUP2_SUPER_MAGIC => Ok(Layout::Unified),
            TMPFS_MAGIC if unified == Some(CGROUP2_SUPER_MAGIC) => Ok(Layout::Hybrid),
            TMPFS_MAGIC => Ok(Layout::Legacy),
            t => Err(LocateError::NotCgroupFs {
                root: CGROUP_ROOT,
                fs_type: t,
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Layout::Unified => "unified (cgroup v2)",
            Layout::Hybrid => "hybrid (v1 devices controller, cgroup2 beside it)",
            Layout::Legacy => "legacy (cgroup v1)",
        }
    }
}

fn fs_type(path: &Path) -> std::io::Result<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid C string and a zeroed statfs buffer the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between architectures
    Ok(st.f_type as i64)
}

/// The layout of this mount namespace's /sys/fs/cgroup, decided as runc and crun decide it.
pub fn layout() -> Result<Layout> {
    let root = Path::new(CGROUP_ROOT);
    let t = fs_type(root).map_err(|e| Error::io("cannot statfs", root, e))?;
    let unified = fs_type(&root.join("unified")).ok();
    Layout::from_fs_types(t, unified).map_err(|m| Error::invalid("cgroup layout", m.to_string()))
}

/// Where a container's device policy lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The v1 devices controller: `dir` holds devices.allow / devices.deny / devices.list.
    V1 { dir: PathBuf, path: String },
    /// A cgroup2 directory, where the policy is an attached BPF_PROG_TYPE_CGROUP_DEVICE program.
    V2 { dir: PathBuf, path: String },
}

impl Location {
    #[cfg(test)]
    pub fn dir(&self) -> &Path {
        match self {
            Location::V1 { dir, .. } | Location::V2 { dir, .. } => dir,
        }
    }

    /// The cgroup path as /proc/PID/cgroup names it.
    pub fn path(&self) -> &str {
        match self {
            Location::V1 { path, .. } | Location::V2 { path, .. } => path,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Location::V1 { dir, .. } => format!("cgroup v1 {}", dir.display()),
            Location::V2 { dir, .. } => format!("cgroup v2 {}", dir.display()),
        }
    }

    /// The systemd unit that owns this cgroup, when the path ends in a unit name systemd
    /// creates for containers (`….scope`, or a `….slice` a runtime used as a parent).
    pub fn systemd_unit(&self) -> Option<String> {
        systemd_unit(self.path())
    }
}

/// One line of /proc/PID/cgroup: `ID:CONTROLLERS:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcCgroup {
    pub id: u32,
    pub controllers: Vec<String>,
    pub path: String,
}

pub fn parse_proc_cgroup(text: &str) -> Vec<ProcCgroup> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let id = it.next()?.parse().ok()?;
            let ctrl = it.next()?;
            let path = it.next()?;
            Some(ProcCgroup {
                id,
                controllers: ctrl
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect()
}

/// The fields of one /proc/self/mountinfo line devgate needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub root: String,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub super_options: Vec<String>,
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            if pre.len() < 5 || post.len() < 3 {
                return None;
            }
            Some(MountEntry {
                root: unescape(pre[3]),
                mount_point: PathBuf::from(unescape(pre[4])),
                fstype: post[0].to_string(),
                super_options: post[2].split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// A cgroup path from the kernel, made relative to a mount whose root is `root`, refusing
/// anything that is not a plain downward path.
fn join_under(mount: &MountEntry, path: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        path
    } else {
        let r = path.strip_prefix(mount.root.as_str())?;
        if !(r.is_empty() || r.starts_with('/')) {
            return None;
        }
        r
    };
    let rel = Path::new(rel.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(mount.mount_point.join(rel))
}

/// The last mount in `mounts` that `want` accepts: a later mount on the same place hides an
/// earlier one (in a private namespace a cgroup2 mount over /sys/fs/cgroup hides the v1
/// hierarchies still listed below it).
fn last_mount(mounts: &[MountEntry], want: impl Fn(&MountEntry) -> bool) -> Option<&MountEntry> {
    mounts.iter().rev().find(|m| want(m))
}

/// Finds the device cgroup from /proc/PID/cgroup and the mounts: on a unified layout the
/// cgroup2 cgroup under /sys/fs/cgroup, else the v1 devices controller's cgroup. The
/// hierarchy's root is refused: it holds every process on the node.
pub fn locate_from(
    layout: Layout,
    proc_cgroup: &str,
    mountinfo: &str,
) -> std::result::Result<Location, LocateError> {
    let lines = parse_proc_cgroup(proc_cgroup);
    let mounts = parse_mountinfo(mountinfo);
    let under_root = |m: &MountEntry| m.mount_point.starts_with(CGROUP_ROOT);
    let (line, mount) = match layout {
        Layout::Unified => {
            let l = lines
                .iter()
                .find(|l| l.id == 0 && l.controllers.is_empty())
                .ok_or(LocateError::NoCgroup2Line)?;
            let m = last_mount(&mounts, |m| {
                m.fstype == "cgroup2" && m.mount_point == Path::new(CGROUP_ROOT)
            })
            .ok_or(LocateError::NoCgroup2Mount { root: CGROUP_ROOT })?;
            (l, m)
        }
        Layout::Hybrid | Layout::Legacy => {
            let l = lines
                .iter()
                .find(|l| l.id != 0 && l.controllers.iter().any(|c| c == "devices"))
                .ok_or(LocateError::NoDevicesLine)?;
            let m = last_mount(&mounts, |m| {
                m.fstype == "cgroup"
                    && under_root(m)
                    && m.super_options.iter().any(|o| o == "devices")
            })
            .ok_or(LocateError::NoDevicesMount)?;
            (l, m)
        }
    };
    let dir = join_under(mount, &line.path).ok_or_else(|| LocateError::NotUnderMount {
        cgroup: line.path.clone(),
        mount: mount.mount_point.clone(),
        root: mount.root.clone(),
    })?;
    if dir == mount.mount_point {
        return Err(LocateError::RootCgroup {
            cgroup: line.path.clone(),
            mount: mount.mount_point.clone(),
        });
    }
    let path = line.path.clone();
    Ok(match layout {
        Layout::Unified => Location::V2 { dir, path },
        Layout::Hybrid | Layout::Legacy => Location::V1 { dir, path },
    })
}

fn read_proc(path: &Path) -> Result<String> {
    let f = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let b = read_bounded(f, MAX_PROC_BYTES, "proc file", path)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// The device cgroup of process `pid`, held by `pidfd`: /proc/PID/cgroup is read by number,
/// so the pidfd is checked after the read (a live process still owns its pid), and the
/// layout and mounts are devgate's own, which are the runtime's.
pub fn locate(pid: i32, pidfd: RawFd) -> Result<Location> {
    let layout = layout()?;
    let cg = read_proc(&PathBuf::from(format!("/proc/{pid}/cgroup")))?;
    if !crate::action::nsdev::pidfd_alive(pidfd) {
        return Err(Error::invalid(
            format!("device cgroup of pid {pid}"),
            "the container process exited; its pid may belong to another process now",
        ));
    }
    let mi = read_proc(Path::new("/proc/self/mountinfo"))?;
    locate_from(layout, &cg, &mi).map_err(|m| {
        Error::invalid(
            format!("device cgroup of pid {pid} ({})", layout.name()),
            m.to_string(),
        )
    })
}

/// `….scope` (runc's and crun's systemd driver, `cri-containerd-ID.scope`,
/// `docker-ID.scope`, `crio-ID.scope`) names a unit systemd manages.
pub fn systemd_unit(path: &str) -> Option<String> {
    let last = path.rsplit('/').next()?;
    (last.ends_with(".scope") && last.len() > ".scope".len()).then(|| last.to_string())
}

/// The rules runc 1.1 appends to every container's device rules (specconv.AllowedDevices):
/// mknod of anything, the standard nodes, pts, ptmx and tun. A v2 program replacing
/// runc's must keep them or the container loses /dev/null.
pub fn runtime_default_rules() -> Vec<LinuxDeviceCgroup> {
    use oci_spec::runtime::LinuxDeviceType::{B, C};
    let r = |t, major: Option<i64>, minor: Option<i64>, access: &str| {
        let mut b = LinuxDeviceCgroupBuilder::default()
            .allow(true)
            .typ(t)
            .access(access);
        if let Some(m) = major {
            b = b.major(m);
        }
        if let Some(m) = minor {
            b = b.minor(m);
        }
        b.build().expect("a complete device rule")
    };
    vec![
        r(C, None, None, "m"),
        r(B, None, None, "m"),
        r(C, Some(1), Some(3), "rwm"),
        r(C, Some(1), Some(8), "rwm"),
        r(C, Some(1), Some(7), "rwm"),
        r(C, Some(5), Some(0), "rwm"),
        r(C, Some(1), Some(5), "rwm"),
        r(C, Some(1), Some(9), "rwm"),
        r(C, Some(136), None, "rwm"),
        r(C, Some(5), Some(2), "rwm"),
        r(C, Some(10), Some(200), "rwm"),
    ]
}

/// One rule for a single device.
pub fn device_rule(
    allow: bool,
    num: crate::model::device::DevNum,
    access: &str,
) -> LinuxDeviceCgroup {
    use oci_spec::runtime::LinuxDeviceType::{B, C};
    LinuxDeviceCgroupBuilder::default()
        .allow(allow)
        .typ(match num.typ {
            crate::model::device::DevType::Char => C,
            crate::model::device::DevType::Block => B,
        })
        .major(i64::from(num.major))
        .minor(i64::from(num.minor))
        .access(access)
        .build()
        .expect("a complete device rule")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// The private namespace of the tests' v2 node: cgroup2 mounted over the hybrid tmpfs.
    const MOUNTINFO_V2_OVER_HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
900 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 none rw
";

    #[test]
    fn layout_from_filesystem_types() {
        assert_eq!(
            Layout::from_fs_types(CGROUP2_SUPER_MAGIC, None),
            Ok(Layout::Unified)
        );
        assert_eq!(
            Layout::from_fs_types(TMPFS_MAGIC, Some(CGROUP2_SUPER_MAGIC)),
            Ok(Layout::Hybrid)
        );
        assert_eq!(Layout::from_fs_types(TMPFS_MAGIC, None), Ok(Layout::Legacy));
        assert_eq!(
            Layout::from_fs_types(TMPFS_MAGIC, Some(TMPFS_MAGIC)),
            Ok(Layout::Legacy)
        );
        let e = Layout::from_fs_types(0xef53, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/sys/fs/cgroup is neither cgroup2 nor a tmpfs of v1 hierarchies (filesystem type \
             0xef53)"
        );
    }

    #[test]
    fn this_machine_has_a_layout() {
        let l = layout().unwrap();
        let t = fs_type(Path::new(CGROUP_ROOT)).unwrap();
        assert_eq!(l == Layout::Unified, t == CGROUP2_SUPER_MAGIC, "{l:?}");
    }

    #[test]
    fn v1_cgroupfs_and_systemd_paths() {
        let cg = "5:devices:/t1\n0::/t1\n";
        for layout in [Layout::Hybrid, Layout::Legacy] {
            assert_eq!(
                locate_from(layout, cg, MOUNTINFO).unwrap(),
                Location::V1 {
                    dir: "/sys/fs/cgroup/devices/t1".into(),
                    path: "/t1".into()
                }
            );
        }
        let cg = "11:devices:/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n";
        let l = locate_from(Layout::Hybrid, cg, MOUNTINFO).unwrap();
        assert_eq!(
            l.dir(),
            Path::new(
                "/sys/fs/cgroup/devices/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope"
            )
        );
        assert_eq!(
            l.systemd_unit().as_deref(),
            Some("cri-containerd-abc.scope")
        );
        let cg = "5:devices:/docker/abc\n";
        assert_eq!(
            locate_from(Layout::Hybrid, cg, MOUNTINFO)
                .unwrap()
                .systemd_unit(),
            None
        );
    }

    #[test]
    fn unified_is_decided_by_the_layout_not_by_the_listed_controllers() {
        // runc on the private v2 node: the process still lists its (root) v1 devices cgroup,
        // and the v1 mounts are still in mountinfo, hidden under the cgroup2 mount.
        let cg = "5:devices:/\n0::/t1\n";
        assert_eq!(
            locate_from(Layout::Unified, cg, MOUNTINFO_V2_OVER_HYBRID).unwrap(),
            Location::V2 {
                dir: "/sys/fs/cgroup/t1".into(),
                path: "/t1".into()
            }
        );
        // hybrid: v1 devices even when cgroup2 lists a deeper cgroup
        let cg = "5:devices:/t1\n0::/t1/x\n";
        assert_eq!(
            locate_from(Layout::Hybrid, cg, MOUNTINFO).unwrap().dir(),
            Path::new("/sys/fs/cgroup/devices/t1")
        );
        // unified needs the cgroup2 at /sys/fs/cgroup itself, not the hybrid's unified/
        let e = locate_from(Layout::Unified, "0::/t1\n", MOUNTINFO).unwrap_err();
        assert_eq!(
            e,
            LocateError::NoCgroup2Mount {
                root: "/sys/fs/cgroup"
            }
        );
        assert_eq!(
            e.to_string(),
            "no cgroup2 hierarchy is mounted at /sys/fs/cgroup"
        );
    }

    #[test]
    fn v2_paths_and_nested_mount_root() {
        let mi = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            locate_from(Layout::Unified, "0::/system.slice/x.scope\n", mi).unwrap(),
            Location::V2 {
                dir: "/sys/fs/cgroup/system.slice/x.scope".into(),
                path: "/system.slice/x.scope".into()
            }
        );
        // a mount whose root is a sub-cgroup (inside a cgroup namespace's parent view)
        let mi = "25 1 0:22 /kube /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            locate_from(Layout::Unified, "0::/kube/pod/c1\n", mi)
                .unwrap()
                .dir(),
            Path::new("/sys/fs/cgroup/pod/c1")
        );
        assert!(locate_from(Layout::Unified, "0::/kubelet/c1\n", mi).is_err());
        assert!(locate_from(Layout::Unified, "0::/kubex/c1\n", mi).is_err());
    }

    #[test]
    fn the_root_cgroup_is_never_a_container_cgroup() {
        let e = locate_from(Layout::Unified, "0::/\n", MOUNTINFO_V2_OVER_HYBRID).unwrap_err();
        assert!(matches!(e, LocateError::RootCgroup { .. }), "{e:?}");
        let e = locate_from(Layout::Hybrid, "5:devices:/\n0::/t1\n", MOUNTINFO).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the process is in the root cgroup \"/\" of /sys/fs/cgroup/devices; devgate never \
             edits the root cgroup"
        );
        let mi = "25 1 0:22 /kube /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert!(locate_from(Layout::Unified, "0::/kube\n", mi).is_err());
    }

    #[test]
    fn refuses_odd_paths_and_missing_mounts() {
        assert!(locate_from(Layout::Hybrid, "5:devices:/a/../../etc\n", MOUNTINFO).is_err());
        let e = locate_from(
            Layout::Hybrid,
            "5:devices:/t\n",
            "41 31 0:38 / /u rw - cgroup2 cgroup2 rw\n",
        )
        .unwrap_err();
        assert_eq!(e, LocateError::NoDevicesMount);
        assert!(
            e.to_string().contains("no devices controller is mounted"),
            "{e}"
        );
        let e = locate_from(Layout::Legacy, "0::/t\n", MOUNTINFO).unwrap_err();
        assert_eq!(e, LocateError::NoDevicesLine);
        assert_eq!(e.to_string(), "the process has no v1 devices cgroup");
        assert!(locate_from(Layout::Hybrid, "garbage\n", MOUNTINFO).is_err());
        assert!(locate_from(Layout::Unified, "", "").is_err());
    }

    #[test]
    fn mountinfo_unescapes_and_tolerates_garbage() {
        let m =
            parse_mountinfo("1 2 0:1 / /a\\040b rw shared:1 - cgroup cg rw,devices\nbad line\n");
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].mount_point, PathBuf::from("/a b"));
        assert_eq!(unescape("x\\"), "x\\");
        assert_eq!(unescape("\\0"), "\\0");
    }

    #[test]
    fn real_self_cgroup_is_found_or_refused_as_the_root() {
        // Every Linux process is in some cgroup; this one is either found or, in a root
        // cgroup, refused for it.
        let me = crate::action::nsdev::pidfd_open(std::process::id() as i32).unwrap();
        use std::os::fd::AsRawFd;
        match locate(std::process::id() as i32, me.as_raw_fd()) {
            Ok(l) => assert!(l.dir().is_dir(), "{l:?}"),
            Err(e) => assert!(e.to_string().contains("never edits the root cgroup"), "{e}"),
        }
    }
}
