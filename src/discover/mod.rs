//! The devices a container's config.json assigns to it.
//!
//! A device is assigned to a container when the spec lists it (`linux.devices`), bind-mounts
//! it (a mount whose source is a device node), or allows exactly its major:minor of a known
//! class in the device cgroup rules. The devices every runtime gives every container are
//! not assigned devices unless `linux.devices` lists them.

pub(crate) mod devnode;

use crate::error::{Error, Result};
use crate::model::class::{self, ClassRule};
use crate::model::device::{
    check_number, is_default_device, DevNum, DevType, Device, Source, MAX_MAJOR, MAX_MINOR,
};
use crate::model::rule_number::rule_numbers;
use crate::oci::spec::Spec;
use devnode::find_host_node;
use oci_spec::runtime::LinuxDeviceCgroup;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A device found in the spec, before its host node and class are known.
#[derive(Debug, Clone)]
struct Candidate {
    num: DevNum,
    container_path: Option<PathBuf>,
    host_path: Option<PathBuf>,
    source: Source,
    file_mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
}

/// Candidates from `linux.devices`. FIFOs are not devices; an unknown type is an error
/// because no runtime would create it either. In a user namespace the runtime binds the
/// host's node at the entry's path instead of making one (`in_user_namespace`).
fn from_linux_devices(spec: &Spec, dev_root: &Path, out: &mut Vec<Candidate>) -> Result<()> {
    for (i, d) in spec.devices().iter().enumerate() {
        let ctx = format!("config.json linux.devices[{i}] {}", d.path.display());
        let typ = match d.typ.as_str() {
            "c" | "u" => DevType::Char,
            "b" => DevType::Block,
            "p" => continue,
            other => {
                return Err(Error::invalid(
                    ctx,
                    format!("unknown device type {other:?}"),
                ));
            }
        };
        let num = DevNum {
            typ,
            major: check_number("major", d.major, MAX_MAJOR, &ctx)?,
            minor: check_number("minor", d.minor, MAX_MINOR, &ctx)?,
        };
        if !d.path.is_absolute() {
            return Err(Error::invalid(ctx, "device path is not absolute"));
        }
        out.push(Candidate {
            num,
            container_path: Some(d.path.clone()),
            host_path: None,
            source: Source::LinuxDevices,
            file_mode: d.file_mode,
            uid: d.uid,
            gid: d.gid,
        });
        if spec.user_namespace() {
            out.extend(in_user_namespace(&d.path, num, dev_root, &ctx)?);
        }
    }
    Ok(())
}

/// The node a `linux.devices` entry is in a user namespace, where runc and crun cannot
/// mknod and bind the host's node at its path instead (crun's `libcrun_create_dev` with
/// `binds`, runc's `bindMountDeviceNode`), whatever numbers the entry gives: that node,
/// when it is another device. A path below /dev is looked for under dev_root as discovery
/// looks (never leaving it); any other path the runtime would bind from wherever it is,
/// which devgate does not stat (it may be a pod's volume), so the spec is refused.
fn in_user_namespace(
    path: &Path,
    num: DevNum,
    dev_root: &Path,
    ctx: &str,
) -> Result<Option<Candidate>> {
    let Some(rest) = path
        .strip_prefix("/dev")
        .ok()
        .filter(|_| lexically_below(path, Path::new("/dev")))
    else {
        return Err(Error::invalid(
            ctx,
            "in a user namespace the runtime binds the host's node at this path, and devgate \
             reads nodes below /dev only",
        ));
    };
    let host = dev_root.join(rest);
    let Ok(meta) = crate::fsutil::stat_beneath(dev_root, &host) else {
        return Ok(None);
    };
    Ok(DevNum::from_metadata(&meta)
        .filter(|n| *n != num)
        .map(|n| Candidate {
            num: n,
            container_path: Some(path.to_path_buf()),
            host_path: Some(host),
            source: Source::LinuxDevices,
            file_mode: Some(meta.mode() & 0o7777),
            uid: Some(meta.uid()),
            gid: Some(meta.gid()),
        }))
}

/// A path that is lexically below `root`: absolute, no `.` or `..`, and starting with it.
/// Decided on the text alone, without touching the filesystem.
pub(crate) fn lexically_below(path: &Path, root: &Path) -> bool {
    use std::path::Component;
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && path.starts_with(root)
        && path != root
}

/// The metadata of a host device node. One below `dev_root` is reached without leaving it
/// ([`crate::fsutil::stat_beneath`]): /dev/shm is writable by every user, and a link left
/// there must not send the stat to a hung volume. Any other path is devgate's own config's
/// (a spare) and is stat'ed as it is.
pub(crate) fn node_metadata(dev_root: &Path, path: &Path) -> std::io::Result<fs::Metadata> {
    if lexically_below(path, dev_root) {
        crate::fsutil::stat_beneath(dev_root, path)
    } else {
        fs::metadata(path)
    }
}

/// Candidates from bind mounts whose source is a device node under `dev_root`. Any other
/// source is never stat'ed: it may be on a filesystem a pod controls (a volume, a hung
/// NFS server), a stat there cannot be interrupted, and runc waits for the hook.
fn from_bind_mounts(spec: &Spec, dev_root: &Path, out: &mut Vec<Candidate>) {
    for m in spec.mounts.iter().filter(|m| m.is_bind()) {
        let Some(src) = &m.source else { continue };
        if !lexically_below(src, dev_root) {
            continue;
        }
        let Ok(meta) = crate::fsutil::stat_beneath(dev_root, src) else {
            continue;
        };
        let Some(num) = DevNum::from_metadata(&meta) else {
            continue;
        };
        if is_default_device(num) {
            continue;
        }
        out.push(Candidate {
            num,
            container_path: Some(m.destination.clone()),
            host_path: Some(src.clone()),
            source: Source::BindMount,
            file_mode: Some(meta.mode() & 0o7777),
            uid: Some(meta.uid()),
            gid: Some(meta.gid()),
        });
    }
}

/// Whether an allow rule opens NVIDIA's nodes without naming one major:minor. runc reads
/// a rule of type `a`, or of no type, as "allow every device" whatever its numbers (its
/// cgroup emulator drops them), and a missing or -1 number as any; a container that can
/// mknod (CAP_MKNOD is a default capability) then reaches every GPU. On other rules only
/// read or write access counts: `m` alone (containerd's default `c *:* m`) opens nothing,
/// but runc's allow-all is `rwm` whatever the `a` rule's access says.
/// Numbers as every runtime reads them (`rule_number`): a rule with one they read apart
/// counts as reaching NVIDIA's nodes, so that the fast tests send it on to be refused.
fn wildcard_reaches_nvidia(r: &LinuxDeviceCgroup) -> bool {
    use oci_spec::runtime::LinuxDeviceType as T;
    let opens = r
        .access()
        .as_deref()
        .is_some_and(|a| a.contains(['r', 'w']));
    r.allow()
        && match r.typ() {
            None | Some(T::A) => true,
            // crun's device filter takes every type but `a` and `b` for char (`p` too)
            Some(T::C) | Some(T::U) | Some(T::P) if opens => {
                match rule_numbers(r.major(), r.minor()) {
                    Ok((major, minor)) => {
                        (major.is_none() || major == Some(class::NVIDIA_MAJOR))
                            && (major.is_none() || minor.is_none())
                    }
                    Err(_) => true,
                }
            }
            _ => false,
        }
}

/// Every GPU node (`nvidiaN`, NVIDIA's major) directly in `dev_root`, when a wildcard
/// allow rule opens them: each is assigned as a device the rule gives.
fn from_wildcard_rules(spec: &Spec, dev_root: &Path, out: &mut Vec<Candidate>) {
    if !spec.device_rules().iter().any(wildcard_reaches_nvidia) {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dev_root) else {
        return;
    };
    let mut names: Vec<_> = rd
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| {
            n.as_encoded_bytes()
                .strip_prefix(b"nvidia")
                .is_some_and(|d| !d.is_empty() && d.iter().all(u8::is_ascii_digit))
        })
        .collect();
    names.sort();
    for name in names {
        let path = dev_root.join(&name);
        let Ok(meta) = crate::fsutil::stat_beneath(dev_root, &path) else {
            continue;
        };
        let Some(num) = DevNum::from_metadata(&meta) else {
            continue;
        };
        if num.typ != DevType::Char || num.major != class::NVIDIA_MAJOR {
            continue;
        }
        out.push(Candidate {
            num,
            container_path: None,
            host_path: Some(path),
            source: Source::CgroupRule,
            file_mode: None,
            uid: None,
            gid: None,
        });
    }
}

/// Allow rules naming one major:minor; the caller keeps only those of a known class. A
/// rule of any type whose numbers some runtime reads as another device or a wildcard
/// (crun's C `int`: `rule_number`) fails the spec, deny or allow: runc refuses a spec
/// for either, and a deny crun reads as another device's is not the deny it says.
fn from_rules(spec: &Spec, out: &mut Vec<Candidate>) -> Result<()> {
    use oci_spec::runtime::LinuxDeviceType as T;
    for (i, r) in spec.device_rules().iter().enumerate() {
        let numbers = rule_numbers(r.major(), r.minor()).map_err(|e| {
            Error::invalid(
                format!("config.json linux.resources.devices[{i}]"),
                e.to_string(),
            )
        })?;
        if !r.allow() {
            continue;
        }
        let typ = match r.typ() {
            // `p` as crun's device filter reads it: a char rule (runc refuses it)
            Some(T::C) | Some(T::U) | Some(T::P) => DevType::Char,
            Some(T::B) => DevType::Block,
            _ => continue,
        };
        let (Some(major), Some(minor)) = numbers else {
            continue;
        };
        let num = DevNum { typ, major, minor };
        if is_default_device(num) {
            continue;
        }
        out.push(Candidate {
            num,
            container_path: None,
            host_path: None,
            source: Source::CgroupRule,
            file_mode: None,
            uid: None,
            gid: None,
        });
    }
    Ok(())
}

/// The devices an allow rule names by its own major and minor. In a container that holds
/// every device these are the ones handed to it: containerd's CRI and the CDI library add
/// such a rule for each device of a device plugin's allocation or a CDI device (a DRA
/// claim's), next to the allow-all the CRI gives a privileged container.
pub fn allowed_by_number(spec: &Spec) -> Vec<DevNum> {
    let mut c = Vec::new();
    // a rule read apart by runtimes fails discovery before this is asked
    let _ = from_rules(spec, &mut c);
    c.into_iter().map(|c| c.num).collect()
}

/// True when the spec may assign any device by node (GPU selectors aside:
/// `gpu::may_have_devices` adds them): the cheap test that lets a container with no
/// devices skip loading devgate's config at all.
pub fn may_name_devices(spec: &Spec) -> bool {
    if !spec.devices().is_empty() || spec.device_rules().iter().any(wildcard_reaches_nvidia) {
        return true;
    }
    let mut c = Vec::new();
    // a rule read apart by runtimes goes on, to be refused
    if from_rules(spec, &mut c).is_err() || !c.is_empty() {
        return true;
    }
    // Before the config is read dev_root is not known: only binds of nodes under the
    // host's own /dev count here (never a source elsewhere, which is not stat'ed).
    from_bind_mounts(spec, Path::new("/dev"), &mut c);
    !c.is_empty()
}

/// True when the spec may assign an NVIDIA device by node (GPU selectors aside:
/// `gpu::may_name_nvidia` adds them): with them, what sends a hook to the dynamically linked devgate, which can load NVML, before devgate's
/// config is read. Read from the text alone, a superset of the built-in NVIDIA classes as
/// far as the text shows them: a node of NVIDIA's fixed major, or a path under
/// `/dev/nvidia` (nvidia-uvm's and nvidia-caps' majors are given at load time), in
/// `linux.devices`, an allow rule or a bind mount. A config that classes other nodes as
/// NVIDIA's reaches NVML all the same, later and slower (`gpu::nvml::isolate`),
/// as do nodes only a stat shows to be NVIDIA's (a bind of `/dev/char/195:N`, a link to
/// `nvidia1`; an `nvidia-uvm` node under another path).
pub fn may_name_nvidia_nodes(spec: &Spec) -> bool {
    let nvidia_path = |p: &Path| p.as_os_str().as_encoded_bytes().starts_with(b"/dev/nvidia");
    spec.devices()
        .iter()
        .any(|d| d.major == i64::from(class::NVIDIA_MAJOR) || nvidia_path(&d.path))
        || spec.device_rules().iter().any(|r| {
            let numbers = rule_numbers(r.major(), r.minor());
            numbers.is_err()
                || (r.allow() && numbers.is_ok_and(|(m, _)| m == Some(class::NVIDIA_MAJOR)))
                || wildcard_reaches_nvidia(r)
        })
        || spec
            .mounts
            .iter()
            .filter(|m| m.is_bind())
            .any(|m| nvidia_path(&m.destination) || m.source.as_deref().is_some_and(nvidia_path))
}

/// Finds every assigned device, classifies it and finds its host node under `dev_root`.
/// A `host_path` it returns is a node of the device's type and number, as stat'ed below
/// dev_root by this call (the node probe takes that stat: `probe::node::HostNodes`).
pub fn discover(
    spec: &Spec,
    rules: &[ClassRule],
    dev_root: &Path,
    sysfs_root: &Path,
) -> Result<Vec<Device>> {
    let mut cands = Vec::new();
    from_linux_devices(spec, dev_root, &mut cands)?;
    from_bind_mounts(spec, dev_root, &mut cands);
    from_rules(spec, &mut cands)?;
    from_wildcard_rules(spec, dev_root, &mut cands);

    let mut devices: Vec<Device> = Vec::new();
    for c in cands {
        if let Some(existing) = devices.iter_mut().find(|d| d.num == c.num) {
            // A device listed and also allowed by a rule is one device; keep the first
            // (linux.devices, then binds) identity and fill what it lacks.
            if existing.host_path.is_none() {
                existing.host_path = c.host_path;
            }
            continue;
        }
        let host_path = c.host_path.clone().or_else(|| {
            let hints = hints_for(&c, rules, dev_root);
            find_host_node(dev_root, sysfs_root, c.num, &hints)
        });
        // By its number, or its host node's path: never the container path, which the
        // runtime makes a node at whatever it says. The pod chooses it, and a path rule
        // (`/dev/nvidia-uvm`) would otherwise name the class of any device listed there.
        let paths: Vec<&Path> = host_path.as_deref().into_iter().collect();
        let class = class::classify(rules, c.num.typ, c.num.major, c.num.minor, &paths);
        if c.source == Source::CgroupRule && !class.is_known() {
            continue;
        }
        devices.push(Device {
            num: c.num,
            class,
            container_path: c.container_path,
            host_path,
            source: c.source,
            file_mode: c.file_mode,
            uid: c.uid,
            gid: c.gid,
        });
    }
    Ok(devices)
}

/// Paths to try first for a device's host node: its container path re-rooted under
/// dev_root, and the node a class rule names for its minor.
fn hints_for(c: &Candidate, rules: &[ClassRule], dev_root: &Path) -> Vec<PathBuf> {
    let mut hints = Vec::new();
    if let Some(p) = &c.container_path {
        if let Ok(rest) = p.strip_prefix("/dev") {
            hints.push(dev_root.join(rest));
        }
    }
    for r in rules.iter().filter(|r| {
        r.typ == c.num.typ
            && r.major == Some(c.num.major)
            && r.minors
                .map(|[lo, hi]| (lo..=hi).contains(&c.num.minor))
                .unwrap_or(true)
    }) {
        if let Some(node) = class::node_for_minor(r, c.num.minor) {
            if let Ok(rest) = Path::new(&node).strip_prefix("/dev") {
                hints.push(dev_root.join(rest));
            }
        }
    }
    hints
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn spec(json: &str) -> Spec {
        Spec::parse(json.as_bytes(), Path::new("/b/config.json")).unwrap()
    }

    fn disc(json: &str) -> Result<Vec<Device>> {
        discover(
            &spec(json),
            &class::builtin(),
            Path::new("/nonexistent-dev"),
            Path::new("/nonexistent-sys"),
        )
    }

    #[test]
    fn linux_devices_are_assigned_even_when_default() {
        let d = disc(
            r#"{"linux":{"devices":[
                {"path":"/dev/null","type":"c","major":1,"minor":3},
                {"path":"/dev/nvidia1","type":"c","major":195,"minor":1},
                {"path":"/dev/sdb","type":"b","major":8,"minor":16},
                {"path":"/dev/fifo","type":"p"}]}}"#,
        )
        .unwrap();
        let got: Vec<_> = d.iter().map(|d| (d.name(), d.class.clone())).collect();
        assert_eq!(
            got,
            vec![
                ("/dev/null".into(), "char".into()),
                ("/dev/nvidia1".into(), "nvidia-gpu".into()),
                ("/dev/sdb".into(), "block".into())
            ]
        );
    }

    /// The runtime makes a `linux.devices` node at whatever path the entry gives: only its
    /// numbers say which device the container gets. The class (and with it the policy's
    /// action, the probes and the spares) came from the first rule matching either path,
    /// and the path-only rules (`nvidia-uvm`, `nvidia-caps`, …) come before the numbered
    /// `dri` and `rdma`: an RDMA device listed at `/dev/nvidia-uvm` was judged, reported
    /// and remapped as nvidia-uvm. The class is the number's, or its host node's path.
    #[test]
    fn a_container_path_does_not_choose_a_devices_class() {
        let d = disc(
            r#"{"linux":{"devices":[
                {"path":"/dev/nvidia-uvm","type":"c","major":231,"minor":0},
                {"path":"/dev/nvidia-caps/nvidia-cap1","type":"c","major":226,"minor":0},
                {"path":"/dev/nvidia-uvm-tools","type":"c","major":243,"minor":7}]}}"#,
        )
        .unwrap();
        let got: Vec<_> = d
            .iter()
            .map(|d| (d.num.major, d.class.to_string()))
            .collect();
        assert_eq!(
            got,
            vec![
                (231, "rdma".to_string()),
                (226, "dri".to_string()),
                (243, "char".to_string())
            ]
        );
    }

    #[test]
    fn rules_give_known_classes_only_and_skip_wildcards_and_defaults() {
        let d = disc(
            r#"{"linux":{"resources":{"devices":[
                {"allow":false,"access":"rwm"},
                {"allow":true,"type":"c","major":1,"minor":3,"access":"rwm"},
                {"allow":true,"type":"c","major":136,"access":"rwm"},
                {"allow":true,"type":"c","major":-1,"minor":-1,"access":"m"},
                {"allow":true,"type":"c","major":10,"minor":200,"access":"rwm"},
                {"allow":true,"type":"c","major":4,"minor":64,"access":"rwm"},
                {"allow":true,"type":"c","major":195,"minor":3,"access":"rw"},
                {"allow":false,"type":"c","major":195,"minor":4,"access":"rw"}]}}}"#,
        )
        .unwrap();
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].class, "nvidia-gpu");
        assert_eq!(d[0].num.minor, 3);
        assert_eq!(d[0].source, Source::CgroupRule);
        assert_eq!(d[0].name(), "c 195:3");
    }

    #[test]
    fn listed_and_allowed_is_one_device() {
        let d = disc(
            r#"{"linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}],
                "resources":{"devices":[{"allow":true,"type":"c","major":195,"minor":0,"access":"rwm"}]}}}"#,
        )
        .unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].source, Source::LinuxDevices);
    }

    #[test]
    fn absurd_numbers_and_types_are_errors_naming_the_entry() {
        let e = disc(
            r#"{"linux":{"devices":[{"path":"/dev/x","type":"c","major":99999999999,"minor":1}]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "config.json linux.devices[0] /dev/x: major 99999999999 out of range 0-4095"
        );
        let e =
            disc(r#"{"linux":{"devices":[{"path":"/dev/x","type":"c","major":1,"minor":-4}]}}"#)
                .unwrap_err()
                .to_string();
        assert!(e.contains("minor -4 out of range"), "{e}");
        let e = disc(r#"{"linux":{"devices":[{"path":"/dev/x","type":"z","major":1,"minor":1}]}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown device type \"z\""), "{e}");
    }

    #[test]
    fn bind_mounted_device_node_is_found() {
        // /dev/full is on every Linux host and is a char device 1:7 (a default, skipped);
        // /dev/zero likewise; use the fast test only for the negative and positive cases.
        let s = spec(
            r#"{"mounts":[{"destination":"/dev/termination-log","source":"/etc/hostname","options":["rbind"]},
                                    {"destination":"/dev/z","source":"/dev/zero","options":["bind"]}]}"#,
        );
        assert!(
            !may_name_devices(&s),
            "default devices and files are not assigned devices"
        );
        let s = spec(
            r#"{"mounts":[{"destination":"/x","source":"/dev/loop-control","options":["bind"]}]}"#,
        );
        if Path::new("/dev/loop-control").exists() {
            let d = discover(&s, &class::builtin(), Path::new("/dev"), Path::new("/sys")).unwrap();
            assert_eq!(d.len(), 1);
            assert_eq!(d[0].source, Source::BindMount);
            assert_eq!(
                d[0].host_path.as_deref(),
                Some(Path::new("/dev/loop-control"))
            );
            assert_eq!(d[0].container_path.as_deref(), Some(Path::new("/x")));
        }
    }

    #[test]
    fn bind_sources_outside_dev_root_are_never_stated() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root for mknod (CI runs as root)");
            return;
        }
        let d = std::env::temp_dir().join(format!("devgate-binddev-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let (dev, outside) = (d.join("dev"), d.join("outside"));
        fs::create_dir_all(&dev).unwrap();
        fs::create_dir_all(&outside).unwrap();
        // loop-control, 10:237: not a device every container gets
        for dir in [&dev, &outside] {
            nix::sys::stat::mknod(
                &dir.join("node"),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(10, 237),
            )
            .unwrap();
        }
        let with_source = |src: &Path| {
            spec(&format!(
                r#"{{"mounts":[{{"destination":"/x","source":"{}","options":["bind"]}}]}}"#,
                src.display()
            ))
        };
        let found = |src: &Path| {
            discover(
                &with_source(src),
                &class::builtin(),
                &dev,
                Path::new("/sys"),
            )
            .unwrap()
        };
        assert_eq!(found(&dev.join("node")).len(), 1, "a node under dev_root");
        for src in [
            outside.join("node"),
            dev.join("../outside/node"),
            Path::new("/dev/loop-control").to_path_buf(),
        ] {
            assert!(found(&src).is_empty(), "{} was stat'ed", src.display());
        }
        // the fast test looks only under /dev
        assert!(!may_name_devices(&with_source(&outside.join("node"))));
        let _ = fs::remove_dir_all(&d);
    }

    /// Lexically below dev_root is not enough: /dev/shm (and /dev/mqueue) are writable by
    /// every user, who can leave a symlink there pointing anywhere — a pod's volume on a
    /// hung NFS server, where the stat cannot be interrupted. A bind source is reached
    /// without leaving dev_root; links that stay inside it (/dev/char/M:m) still resolve.
    #[test]
    fn a_symlink_under_dev_root_does_not_lead_the_stat_out_of_it() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root for mknod (CI runs as root)");
            return;
        }
        let d = std::env::temp_dir().join(format!("devgate-bindlink-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let (dev, outside) = (d.join("dev"), d.join("outside"));
        fs::create_dir_all(dev.join("shm")).unwrap();
        fs::create_dir_all(dev.join("char")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        for dir in [&dev, &outside] {
            nix::sys::stat::mknod(
                &dir.join("node"),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(10, 237),
            )
            .unwrap();
        }
        use std::os::unix::fs::symlink;
        symlink(outside.join("node"), dev.join("shm/abs")).unwrap();
        symlink("../../outside/node", dev.join("shm/rel")).unwrap();
        symlink(&outside, dev.join("shm/dir")).unwrap();
        symlink("/proc/self/root", dev.join("shm/magic")).unwrap();
        symlink("../node", dev.join("char/10:237")).unwrap();
        let found = |src: &Path| {
            let s = spec(&format!(
                r#"{{"mounts":[{{"destination":"/x","source":"{}","options":["bind"]}}]}}"#,
                src.display()
            ));
            discover(&s, &class::builtin(), &dev, Path::new("/sys")).unwrap()
        };
        for src in [
            dev.join("shm/abs"),
            dev.join("shm/rel"),
            dev.join("shm/dir/node"),
            dev.join("shm/magic")
                .join(outside.strip_prefix("/").unwrap())
                .join("node"),
        ] {
            assert!(found(&src).is_empty(), "{} was stat'ed", src.display());
        }
        assert_eq!(
            found(&dev.join("char/10:237")).len(),
            1,
            "a link inside dev_root"
        );
        assert_eq!(found(&dev.join("node")).len(), 1);
        let _ = fs::remove_dir_all(&d);
    }

    /// The host node of a listed device is looked for under dev_root only: a container
    /// path climbing out with `..`, or through a link someone left in /dev/shm, is no
    /// hint; and the walk of dev_root does not go into a directory other users can write
    /// (/dev/shm, /dev/mqueue), where a user's FUSE mount can answer with any node it likes
    /// or never answer at all.
    #[test]
    fn the_host_node_is_never_looked_for_outside_dev_root() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root for mknod (CI runs as root)");
            return;
        }
        let d = std::env::temp_dir().join(format!("devgate-hint-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let (dev, outside) = (d.join("dev"), d.join("outside"));
        fs::create_dir_all(dev.join("shm/u")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dev.join("shm"), fs::Permissions::from_mode(0o1777)).unwrap();
        std::os::unix::fs::chown(dev.join("shm/u"), Some(65534), None).unwrap();
        std::os::unix::fs::symlink(&outside, dev.join("shm/dir")).unwrap();
        let mknod = |p: &Path| {
            nix::sys::stat::mknod(
                p,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(10, 237),
            )
            .unwrap()
        };
        mknod(&outside.join("node"));
        let up = "/..".repeat(dev.components().count() - 1);
        let listed = |path: &str| {
            let s = spec(&format!(
                r#"{{"linux":{{"devices":[{{"path":"{path}","type":"c","major":10,"minor":237}}]}}}}"#
            ));
            discover(&s, &class::builtin(), &dev, Path::new("/nonexistent-sys")).unwrap()
        };
        for path in [
            format!("/dev{up}{}", outside.join("node").display()),
            "/dev/shm/dir/node".to_string(),
        ] {
            let got = listed(&path);
            assert_eq!(got[0].host_path, None, "{path}");
        }
        // A node in a directory another user owns, below a world-writable one.
        mknod(&dev.join("shm/u/node"));
        assert_eq!(listed("/dev/elsewhere")[0].host_path, None);
        // The same node in a directory of root's is found by the walk.
        fs::create_dir(dev.join("caps")).unwrap();
        mknod(&dev.join("caps/node"));
        assert_eq!(
            listed("/dev/elsewhere")[0].host_path.as_deref(),
            Some(dev.join("caps/node").as_path())
        );
        let _ = fs::remove_dir_all(&d);
    }

    /// runc reads an allow rule of type `a`, or of no type, as "allow every device", whatever
    /// its numbers, and a missing or -1 number as any: such a rule with read or write access
    /// opens every GPU to a container that can mknod (CAP_MKNOD is a default capability), so
    /// every GPU node under dev_root is assigned, and both fast tests send the spec on.
    /// `m` alone (containerd's default `c *:* m`) opens nothing, except on a rule of type
    /// `a`, whose access runc ignores. Long because each rule form is one table entry.
    #[test]
    fn a_wildcard_allow_reaching_nvidia_assigns_every_gpu() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root for mknod (CI runs as root)");
            return;
        }
        let d = std::env::temp_dir().join(format!("devgate-wild-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        for (name, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
            nix::sys::stat::mknod(
                &d.join(name),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(195, minor),
            )
            .unwrap();
        }
        let rules = |r: &str| {
            spec(&format!(
                r#"{{"linux":{{"resources":{{"devices":[{{"allow":false,"access":"rwm"}},{r}]}}}}}}"#
            ))
        };
        for r in [
            r#"{"allow":true,"access":"rwm"}"#,
            r#"{"allow":true,"type":"a","major":195,"minor":3,"access":"rw"}"#,
            r#"{"allow":true,"type":"a","major":1,"minor":3,"access":"rw"}"#,
            r#"{"allow":true,"type":"c","major":195,"access":"rw"}"#,
            r#"{"allow":true,"type":"c","major":195,"minor":-1,"access":"r"}"#,
            r#"{"allow":true,"type":"c","access":"rwm"}"#,
            r#"{"allow":true,"type":"c","minor":1,"access":"w"}"#,
            // runc's emulator makes an allow of type `a` allow-all, `rwm`, whatever its
            // access says.
            r#"{"allow":true,"access":"m"}"#,
            r#"{"allow":true,"type":"a","major":195,"minor":0,"access":"m"}"#,
        ] {
            let s = rules(r);
            assert!(may_name_devices(&s), "{r}");
            assert!(may_name_nvidia_nodes(&s), "{r}");
            let got = discover(&s, &class::builtin(), &d, Path::new("/nonexistent-sys")).unwrap();
            let mut gpus: Vec<_> = got
                .iter()
                .filter(|x| x.class == "nvidia-gpu")
                .map(|x| (x.num.minor, x.host_path.clone()))
                .collect();
            gpus.sort();
            assert_eq!(
                gpus,
                vec![(0, Some(d.join("nvidia0"))), (1, Some(d.join("nvidia1")))],
                "{r}"
            );
        }
        for r in [
            r#"{"allow":true,"type":"c","access":"m"}"#,
            r#"{"allow":true,"type":"c","major":136,"access":"rwm"}"#,
            r#"{"allow":true,"type":"b","access":"rwm"}"#,
            r#"{"allow":false,"type":"c","major":195,"access":"rwm"}"#,
        ] {
            let s = rules(r);
            assert!(!may_name_nvidia_nodes(&s), "{r}");
            let got = discover(&s, &class::builtin(), &d, Path::new("/nonexistent-sys")).unwrap();
            assert!(got.is_empty(), "{r}: {got:?}");
        }
        let _ = fs::remove_dir_all(&d);
    }

    /// crun's device filter (cgroup v2, eBPF) reads a rule's type by its first letter: `b`
    /// is a block rule, `a` any device, and every other letter a char rule, so an allow of
    /// type `p` (a FIFO, which the filter never sees) opens the char device of its numbers.
    #[test]
    fn a_fifo_type_allow_rule_opens_char_devices_as_crun_reads_it() {
        let d = disc(
            r#"{"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"},
                {"allow":true,"type":"p","major":195,"minor":3,"access":"rw"}]}}}"#,
        )
        .unwrap();
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].name(), "c 195:3");
        assert_eq!(d[0].class, "nvidia-gpu");
        let wild = spec(
            r#"{"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"},
                {"allow":true,"type":"p","major":195,"access":"rw"}]}}}"#,
        );
        assert!(may_name_devices(&wild));
        assert!(may_name_nvidia_nodes(&wild));
        assert!(wild.device_rules().iter().any(wildcard_reaches_nvidia));
    }

    /// An attacker's rule numbers, each read otherwise by some runtime: crun copies a
    /// rule's major and minor into a C `int` (`create_dev_bpf`), so 4294967297 is 1 and
    /// 4294967491 is 195 to its eBPF filter, and one whose low 32 bits are negative
    /// (2147483843, -2) a wildcard; runc refuses numbers over MaxUint32 and matches none
    /// over 4095. No reading devgate could take is the runtimes' one: the spec is refused,
    /// naming the rule, and both fast tests send it on to be refused.
    #[test]
    fn a_rule_number_a_runtime_truncates_or_widens_is_refused() {
        for (major, minor) in [
            ("195", "4294967297"),
            ("4294967491", "1"),
            ("2147483843", "1"),
            ("195", "2147483649"),
            ("4294967295", "1"),
            ("-2", "1"),
            ("4096", "1"),
            ("195", "1048576"),
        ] {
            let json = format!(
                r#"{{"linux":{{"resources":{{"devices":[{{"allow":false,"access":"rwm"}},
                    {{"allow":true,"type":"c","major":{major},"minor":{minor},"access":"rwm"}}]}}}}}}"#
            );
            let s = spec(&json);
            assert!(may_name_devices(&s), "{major}:{minor}");
            assert!(may_name_nvidia_nodes(&s), "{major}:{minor}");
            let e = disc(&json)
                .map(|d| format!("{d:?}"))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("config.json linux.resources.devices[1]: "),
                "{major}:{minor}: {e}"
            );
            assert!(e.contains(major) || e.contains(minor), "{e}");
        }
    }

    /// crun under the systemd driver without bpffs writes `DeviceAllow=` and takes a
    /// number of 0 or less as a wildcard (`IS_WILDCARD`): a `c 0:0` allow, or `c 0:*`, is
    /// `char-*`, every char device. So such a rule reaches every GPU.
    #[test]
    fn a_zero_major_and_minor_allow_every_device_as_crun_under_systemd_reads_them() {
        for r in [
            r#"{"allow":true,"type":"c","major":0,"minor":0,"access":"rw"}"#,
            r#"{"allow":true,"type":"c","major":0,"access":"rw"}"#,
            r#"{"allow":true,"type":"c","minor":0,"access":"rw"}"#,
        ] {
            let s = spec(&format!(
                r#"{{"linux":{{"resources":{{"devices":[{{"allow":false,"access":"rwm"}},{r}]}}}}}}"#
            ));
            assert!(s.device_rules().iter().any(wildcard_reaches_nvidia), "{r}");
            assert!(may_name_nvidia_nodes(&s), "{r}");
        }
        // a GPU's minor 0 with its major is that GPU alone
        let s = spec(
            r#"{"linux":{"resources":{"devices":[{"allow":true,"type":"c","major":195,"minor":0,"access":"rw"}]}}}"#,
        );
        assert!(!s.device_rules().iter().any(wildcard_reaches_nvidia));
    }

    /// In a user namespace runc and crun cannot mknod: they bind the host's node at a
    /// `linux.devices` entry's path (crun's `libcrun_create_dev` with `binds`), whatever
    /// numbers the entry gives. `/dev/nvidia1` listed as `c 1:3` is GPU 1 there.
    #[test]
    fn in_a_user_namespace_a_listed_path_is_the_hosts_node_there() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root for mknod (CI runs as root)");
            return;
        }
        let d = std::env::temp_dir().join(format!("devgate-userns-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        nix::sys::stat::mknod(
            &d.join("nvidia1"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(195, 1),
        )
        .unwrap();
        let listed = |ns: &str, path: &str| {
            spec(&format!(
                r#"{{"linux":{{"namespaces":[{ns}],
                    "devices":[{{"path":"{path}","type":"c","major":1,"minor":3}}]}}}}"#
            ))
        };
        let gpus = |s: &Spec| -> Result<Vec<String>> {
            let got = discover(s, &class::builtin(), &d, Path::new("/nonexistent-sys"))?;
            Ok(got
                .iter()
                .filter(|x| x.class == "nvidia-gpu")
                .map(|x| x.num.to_string())
                .collect())
        };
        let userns = r#"{"type":"user"}"#;
        assert_eq!(gpus(&listed(userns, "/dev/nvidia1")).unwrap(), ["195:1"]);
        assert!(gpus(&listed(r#"{"type":"pid"}"#, "/dev/nvidia1"))
            .unwrap()
            .is_empty());
        // a host path outside /dev is no node devgate may stat: refused, named
        let e = gpus(&listed(userns, "/tmp/nvidia1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config.json linux.devices[0] /tmp/nvidia1: "),
            "{e}"
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn no_devices_fast_test() {
        assert!(!may_name_devices(&spec(
            r#"{"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"},
                {"allow":true,"type":"c","major":1,"minor":5,"access":"rwm"}]}}}"#
        )));
        assert!(may_name_devices(&spec(
            r#"{"linux":{"resources":{"devices":[{"allow":true,"type":"c","major":195,"minor":1}]}}}"#
        )));
    }

    #[test]
    fn nvidia_is_named_by_number_path_or_rule() {
        let named = |json: &str| may_name_nvidia_nodes(&spec(json));
        // Plain devices, the default ones and no devices at all: this process gates them.
        assert!(!named(r#"{}"#));
        assert!(!named(
            r#"{"linux":{"devices":[{"path":"/dev/null","type":"c","major":1,"minor":3},
                {"path":"/dev/sdb","type":"b","major":8,"minor":16}]}}"#
        ));
        // A GPU, nvidiactl, or any node of NVIDIA's fixed major, whatever its path.
        assert!(named(
            r#"{"linux":{"devices":[{"path":"/dev/gpu0","type":"c","major":195,"minor":1}]}}"#
        ));
        assert!(named(
            r#"{"linux":{"devices":[{"path":"/dev/nvidiactl","type":"c","major":195,"minor":255}]}}"#
        ));
        // nvidia-uvm's major is given at load time: its path names it.
        assert!(named(
            r#"{"linux":{"devices":[{"path":"/dev/nvidia-uvm","type":"c","major":509,"minor":0}]}}"#
        ));
        // A cgroup rule alone. (A selector alone: `gpu::assign`'s tests.)
        assert!(named(
            r#"{"linux":{"resources":{"devices":[{"allow":true,"type":"c","major":195,"minor":0}]}}}"#
        ));
        assert!(!named(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#
        ));
        // A bind mount of the device plugin's kind, by its path.
        assert!(named(
            r#"{"mounts":[{"destination":"/dev/nvidia0","source":"/dev/nvidia0","options":["rbind"]}]}"#
        ));
    }

    #[test]
    fn describe_formats() {
        let mut d = disc(
            r#"{"linux":{"devices":[{"path":"/dev/gpu0","type":"c","major":195,"minor":1}]}}"#,
        )
        .unwrap()
        .remove(0);
        assert_eq!(d.describe(), "/dev/gpu0 (195:1)");
        d.host_path = Some("/dev/nvidia1".into());
        assert_eq!(d.describe(), "/dev/gpu0 (host /dev/nvidia1, 195:1)");
    }
}
