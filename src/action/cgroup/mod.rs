//! Device-cgroup edits for a running container: find its cgroup from its pid, then change
//! what it may open. `v1` writes devices.deny / devices.allow; `v2` replaces the eBPF
//! program the runtime attached with one `bpf` builds from the rule list.

pub mod bpf;
pub mod v1;
pub mod v2;

use crate::error::{Error, Result};
use crate::fsutil::read_bounded;
use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceCgroupBuilder};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

const MAX_PROC_BYTES: u64 = 1 << 20;

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

/// Finds the device cgroup from /proc/PID/cgroup and the mounts: the v1 devices controller
/// when it is mounted and the process is in it (the hybrid layout runc uses it on), else the
/// cgroup2 hierarchy.
pub fn locate_from(proc_cgroup: &str, mountinfo: &str) -> std::result::Result<Location, String> {
    let lines = parse_proc_cgroup(proc_cgroup);
    let mounts = parse_mountinfo(mountinfo);
    if let Some(l) = lines
        .iter()
        .find(|l| l.id != 0 && l.controllers.iter().any(|c| c == "devices"))
    {
        let m = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == "devices"))
            .ok_or_else(|| {
                "the process is in a v1 devices cgroup but no devices controller is mounted"
                    .to_string()
            })?;
        let dir = join_under(m, &l.path).ok_or_else(|| {
            format!(
                "devices cgroup {:?} is not under the mount {} (root {})",
                l.path,
                m.mount_point.display(),
                m.root
            )
        })?;
        return Ok(Location::V1 {
            dir,
            path: l.path.clone(),
        });
    }
    if let Some(l) = lines.iter().find(|l| l.id == 0 && l.controllers.is_empty()) {
        let m = mounts
            .iter()
            .find(|m| m.fstype == "cgroup2")
            .ok_or_else(|| "no cgroup2 hierarchy is mounted".to_string())?;
        let dir = join_under(m, &l.path).ok_or_else(|| {
            format!(
                "cgroup {:?} is not under the cgroup2 mount {} (root {})",
                l.path,
                m.mount_point.display(),
                m.root
            )
        })?;
        return Ok(Location::V2 {
            dir,
            path: l.path.clone(),
        });
    }
    Err("the process is in neither a v1 devices cgroup nor a cgroup2 cgroup".into())
}

fn read_proc(path: &Path) -> Result<String> {
    let f = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let b = read_bounded(f, MAX_PROC_BYTES, "proc file", path)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// The device cgroup of process `pid`, read from /proc/PID/cgroup and devgate's mounts.
pub fn locate(pid: i32) -> Result<Location> {
    let cg = read_proc(&PathBuf::from(format!("/proc/{pid}/cgroup")))?;
    let mi = read_proc(Path::new("/proc/self/mountinfo"))?;
    locate_from(&cg, &mi).map_err(|m| Error::invalid(format!("device cgroup of pid {pid}"), m))
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

    #[test]
    fn v1_cgroupfs_and_systemd_paths() {
        let cg = "5:devices:/t1\n0::/t1\n";
        assert_eq!(
            locate_from(cg, MOUNTINFO).unwrap(),
            Location::V1 {
                dir: "/sys/fs/cgroup/devices/t1".into(),
                path: "/t1".into()
            }
        );
        let cg = "11:devices:/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n";
        let l = locate_from(cg, MOUNTINFO).unwrap();
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
        assert_eq!(locate_from(cg, MOUNTINFO).unwrap().systemd_unit(), None);
    }

    #[test]
    fn v2_only_and_nested_mount_root() {
        let mi = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            locate_from("0::/system.slice/x.scope\n", mi).unwrap(),
            Location::V2 {
                dir: "/sys/fs/cgroup/system.slice/x.scope".into(),
                path: "/system.slice/x.scope".into()
            }
        );
        // a mount whose root is a sub-cgroup (inside a cgroup namespace's parent view)
        let mi = "25 1 0:22 /kube /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            locate_from("0::/kube/pod/c1\n", mi).unwrap().dir(),
            Path::new("/sys/fs/cgroup/pod/c1")
        );
        assert!(locate_from("0::/kubelet/c1\n", mi).is_err());
        assert!(locate_from("0::/kubex/c1\n", mi).is_err());
    }

    #[test]
    fn refuses_odd_paths_and_missing_mounts() {
        assert!(locate_from("5:devices:/a/../../etc\n", MOUNTINFO).is_err());
        let e = locate_from(
            "5:devices:/t\n",
            "41 31 0:38 / /u rw - cgroup2 cgroup2 rw\n",
        )
        .unwrap_err();
        assert!(e.contains("no devices controller is mounted"), "{e}");
        assert!(locate_from("garbage\n", MOUNTINFO).is_err());
        assert!(locate_from("", "").is_err());
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
    fn real_self_cgroup_is_found() {
        // Every Linux process is in some cgroup; this machine must locate its own.
        let l = locate(std::process::id() as i32).unwrap();
        assert!(l.dir().is_dir(), "{l:?}");
    }
}
