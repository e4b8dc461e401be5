//! A device's identity and its discovery from a container's config.json.
//!
//! A device is assigned to a container when the spec lists it (`linux.devices`), bind-mounts
//! it (a mount whose source is a device node), or allows exactly its major:minor of a known
//! class in the device cgroup rules. The devices every runtime gives every container are
//! not assigned devices unless `linux.devices` lists them.

use crate::class::{self, ClassRule};
use crate::error::{Error, Result};
use crate::spec::Spec;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The kernel's dev_t keeps 12 bits of major and 20 of minor.
pub const MAX_MAJOR: i64 = (1 << 12) - 1;
pub const MAX_MINOR: i64 = (1 << 20) - 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DevType {
    #[serde(rename = "c")]
    Char,
    #[serde(rename = "b")]
    Block,
}

impl DevType {
    pub fn letter(self) -> char {
        match self {
            DevType::Char => 'c',
            DevType::Block => 'b',
        }
    }

    pub fn sysfs_dir(self) -> &'static str {
        match self {
            DevType::Char => "char",
            DevType::Block => "block",
        }
    }

    pub fn of_metadata(meta: &fs::Metadata) -> Option<DevType> {
        let ft = meta.file_type();
        if ft.is_char_device() {
            Some(DevType::Char)
        } else if ft.is_block_device() {
            Some(DevType::Block)
        } else {
            None
        }
    }
}

/// Type plus major:minor: what the kernel and the device cgroup know a device by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DevNum {
    #[serde(rename = "type")]
    pub typ: DevType,
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    pub fn from_metadata(meta: &fs::Metadata) -> Option<DevNum> {
        let typ = DevType::of_metadata(meta)?;
        let rdev = meta.rdev();
        Some(DevNum {
            typ,
            major: libc::major(rdev),
            minor: libc::minor(rdev),
        })
    }

    /// `MAJ:MIN` as sysfs and the device cgroup write it.
    pub fn mm(&self) -> String {
        format!("{}:{}", self.major, self.minor)
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    LinuxDevices,
    BindMount,
    CgroupRule,
    /// A GPU named by `NVIDIA_VISIBLE_DEVICES` in the container's process.env.
    NvidiaVisibleDevices,
    /// A GPU named by a CDI annotation (`cdi.k8s.io/…: nvidia.com/gpu=…`).
    CdiAnnotation,
    /// Not a container's: a node on the host (an accelerator, a spare, a quarantined device).
    Host,
}

impl Source {
    /// Named by the container's env or annotations, not granted by the spec.
    pub fn is_selector(self) -> bool {
        matches!(self, Source::NvidiaVisibleDevices | Source::CdiAnnotation)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Source::LinuxDevices => "linux.devices",
            Source::BindMount => "a device bind mount",
            Source::CgroupRule => "a device cgroup rule",
            Source::NvidiaVisibleDevices => "NVIDIA_VISIBLE_DEVICES",
            Source::CdiAnnotation => "a CDI annotation",
            Source::Host => "the host",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    #[serde(flatten)]
    pub num: DevNum,
    pub class: String,
    /// Where the container sees it; a rule-only device may have none.
    pub container_path: Option<PathBuf>,
    /// The node on the host with this major:minor, when one was found.
    pub host_path: Option<PathBuf>,
    pub source: Source,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub file_mode: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub uid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub gid: Option<u32>,
}

impl Device {
    /// A device known by its host node alone, assigned to no container.
    pub fn on_host(num: DevNum, class: &str, host_path: Option<PathBuf>) -> Device {
        Device {
            num,
            class: class.to_string(),
            container_path: None,
            host_path,
            source: Source::Host,
            file_mode: None,
            uid: None,
            gid: None,
        }
    }

    /// How a person names this device: the container path, else the host path, else c MAJ:MIN.
    pub fn name(&self) -> String {
        match (&self.container_path, &self.host_path) {
            (Some(p), _) | (None, Some(p)) => p.display().to_string(),
            (None, None) => format!("{} {}", self.num.typ.letter(), self.num),
        }
    }

    /// `/dev/nvidia1 (195:1)`, or `/dev/gpu0 (host /dev/nvidia1, 195:1)` when they differ.
    pub fn describe(&self) -> String {
        match (&self.container_path, &self.host_path) {
            (Some(c), Some(h)) if c != h => {
                format!("{} (host {}, {})", c.display(), h.display(), self.num)
            }
            _ => format!("{} ({})", self.name(), self.num),
        }
    }
}

/// The devices every runtime creates in every container (runc's and crun's defaults, and
/// the pts/tun rules they add). Majors 136–143 are the Unix98 pty slaves.
pub fn is_default_device(n: DevNum) -> bool {
    if n.typ != DevType::Char {
        return false;
    }
    matches!(
        (n.major, n.minor),
        (1, 3) | (1, 5) | (1, 7) | (1, 8) | (1, 9) | (5, 0) | (5, 1) | (5, 2) | (10, 200)
    ) || (136..=143).contains(&n.major)
}

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

fn check_number(what: &str, n: i64, max: i64, ctx: &str) -> Result<u32> {
    if (0..=max).contains(&n) {
        Ok(n as u32)
    } else {
        Err(Error::invalid(
            ctx,
            format!("{what} {n} out of range 0-{max}"),
        ))
    }
}

/// Candidates from `linux.devices`. FIFOs are not devices; an unknown type is an error
/// because no runtime would create it either.
fn from_linux_devices(spec: &Spec, out: &mut Vec<Candidate>) -> Result<()> {
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
    }
    Ok(())
}

/// Candidates from bind mounts whose source is a device node. The source is a host path
/// chosen by the runtime or kubelet, never a path inside the container, so stat may follow it.
fn from_bind_mounts(spec: &Spec, out: &mut Vec<Candidate>) {
    for m in spec.mounts.iter().filter(|m| m.is_bind()) {
        let Some(src) = &m.source else { continue };
        let Ok(meta) = fs::metadata(src) else {
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

/// Allow rules naming one major:minor; the caller keeps only those of a known class.
fn from_rules(spec: &Spec, out: &mut Vec<Candidate>) {
    use oci_spec::runtime::LinuxDeviceType as T;
    for r in spec.device_rules() {
        if !r.allow() {
            continue;
        }
        let typ = match r.typ() {
            Some(T::C) | Some(T::U) => DevType::Char,
            Some(T::B) => DevType::Block,
            _ => continue,
        };
        let (Some(major), Some(minor)) = (r.major(), r.minor()) else {
            continue;
        };
        if !(0..=MAX_MAJOR).contains(&major) || !(0..=MAX_MINOR).contains(&minor) {
            continue; // -1 is runc's wildcard; other out-of-range values match nothing
        }
        let num = DevNum {
            typ,
            major: major as u32,
            minor: minor as u32,
        };
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
}

/// True when the spec may assign any device: the cheap test that lets a container with no
/// devices skip loading devgate's config at all.
pub fn may_have_devices(spec: &Spec) -> bool {
    if !spec.devices().is_empty() || !gpu_selectors(spec).is_empty() {
        return true;
    }
    let mut c = Vec::new();
    from_rules(spec, &mut c);
    if !c.is_empty() {
        return true;
    }
    from_bind_mounts(spec, &mut c);
    !c.is_empty()
}

/// Finds every assigned device, classifies it and finds its host node under `dev_root`.
pub fn discover(
    spec: &Spec,
    rules: &[ClassRule],
    dev_root: &Path,
    sysfs_root: &Path,
) -> Result<Vec<Device>> {
    let mut cands = Vec::new();
    from_linux_devices(spec, &mut cands)?;
    from_bind_mounts(spec, &mut cands);
    from_rules(spec, &mut cands);

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
        let paths: Vec<&Path> = [c.container_path.as_deref(), host_path.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        let class = class::classify(rules, c.num.typ, c.num.major, c.num.minor, &paths);
        if c.source == Source::CgroupRule && !class::is_known_class(class) {
            continue;
        }
        devices.push(Device {
            num: c.num,
            class: class.to_string(),
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

/// A GPU as NVIDIA's container tooling names it; NVML turns it into a minor number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelector {
    All,
    Index(u32),
    /// `GPU-…`, compared without regard to case.
    Uuid(String),
}

pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
const CDI_GPU_KIND: &str = "nvidia.com/gpu=";
/// More selectors than GPUs on any node is a hostile spec; the rest are ignored.
const MAX_SELECTORS: usize = 256;

/// The GPUs a container selects through `NVIDIA_VISIBLE_DEVICES` or CDI annotations in
/// config.json. This is the only way a container's environment reaches devgate: as a list
/// of GPUs to check, never as configuration. `void`, `none` and empty select nothing;
/// MIG instances (`0:1`) select their parent GPU; MIG UUIDs are not resolvable and skipped.
pub fn gpu_selectors(spec: &Spec) -> Vec<(GpuSelector, Source)> {
    let mut out = Vec::new();
    if let Some(v) = spec.env(NVIDIA_VISIBLE_DEVICES) {
        for token in v.split(',') {
            if let Some(s) = parse_selector(token) {
                out.push((s, Source::NvidiaVisibleDevices));
            }
        }
    }
    for (k, v) in &spec.annotations {
        if !k.starts_with(CDI_ANNOTATION_PREFIX) {
            continue;
        }
        for token in v.split(',') {
            if let Some(name) = token.trim().strip_prefix(CDI_GPU_KIND) {
                if let Some(s) = parse_selector(name) {
                    out.push((s, Source::CdiAnnotation));
                }
            }
        }
    }
    out.truncate(MAX_SELECTORS);
    out
}

fn parse_selector(token: &str) -> Option<GpuSelector> {
    let t = token.trim();
    if t.is_empty() || t.len() > 96 {
        return None;
    }
    match t {
        "all" => return Some(GpuSelector::All),
        "void" | "none" => return None,
        _ => {}
    }
    // `2` or the MIG form `2:1`: both mean GPU index 2.
    let index = t.split_once(':').map(|(gpu, _)| gpu).unwrap_or(t);
    if !index.is_empty() && index.len() <= 4 && index.bytes().all(|b| b.is_ascii_digit()) {
        return index.parse().ok().map(GpuSelector::Index);
    }
    // Compared as bytes: the token is the container's and may split a UTF-8 character.
    if t.len() > 4 && t.as_bytes()[..4].eq_ignore_ascii_case(b"GPU-") {
        return Some(GpuSelector::Uuid(t.to_string()));
    }
    None
}

/// A GPU a selector chose, once NVML has said which minor it has: `/dev/nvidiaN`.
pub fn selected_gpu(
    minor: u32,
    source: Source,
    rules: &[ClassRule],
    dev_root: &Path,
    sysfs_root: &Path,
) -> Device {
    let num = DevNum {
        typ: DevType::Char,
        major: class::NVIDIA_MAJOR,
        minor,
    };
    let container_path = PathBuf::from(format!("/dev/nvidia{minor}"));
    let hints = vec![dev_root.join(format!("nvidia{minor}"))];
    let host_path = find_host_node(dev_root, sysfs_root, num, &hints);
    let class = {
        let paths: Vec<&Path> = [Some(container_path.as_path()), host_path.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        class::classify(rules, num.typ, num.major, num.minor, &paths).to_string()
    };
    Device {
        num,
        class,
        container_path: Some(container_path),
        host_path,
        source,
        file_mode: None,
        uid: None,
        gid: None,
    }
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

fn node_is(path: &Path, num: DevNum) -> bool {
    fs::symlink_metadata(path)
        .ok()
        .and_then(|m| DevNum::from_metadata(&m))
        == Some(num)
}

/// The host node for a major:minor. Tries the hints, then the kernel's own name for it
/// (DEVNAME in sysfs uevent), then a bounded scan of dev_root. Symlinks are never taken
/// as the node: /dev/disk/by-id links would otherwise shadow the real name.
pub fn find_host_node(
    dev_root: &Path,
    sysfs_root: &Path,
    num: DevNum,
    hints: &[PathBuf],
) -> Option<PathBuf> {
    if let Some(h) = hints.iter().find(|h| node_is(h, num)) {
        return Some(h.clone());
    }
    let uevent = sysfs_root
        .join("dev")
        .join(num.typ.sysfs_dir())
        .join(num.mm())
        .join("uevent");
    if let Ok(text) = crate::fsutil::read_attr(&uevent) {
        if let Some(name) = text.lines().find_map(|l| l.strip_prefix("DEVNAME=")) {
            let p = dev_root.join(name);
            if !name.contains("..") && node_is(&p, num) {
                return Some(p);
            }
        }
    }
    scan_for_node(dev_root, num)
}

const SCAN_MAX_ENTRIES: usize = 8192;
const SCAN_MAX_DEPTH: usize = 3;

fn scan_for_node(dev_root: &Path, num: DevNum) -> Option<PathBuf> {
    let mut budget = SCAN_MAX_ENTRIES;
    let mut stack = vec![(dev_root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for entry in rd.flatten() {
            if budget == 0 {
                return None;
            }
            budget -= 1;
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() && depth + 1 < SCAN_MAX_DEPTH {
                stack.push((entry.path(), depth + 1));
            } else if (ft.is_char_device() || ft.is_block_device()) && node_is(&entry.path(), num) {
                return Some(entry.path());
            }
        }
    }
    None
}

/// Parses an operator's DEVICE argument: a path to a node, or `MAJ:MIN` (optionally
/// prefixed `c ` / `b ` or `c:` / `b:`). A bare MAJ:MIN is a block device only when sysfs
/// knows a block device by that number and no char device.
pub fn parse_device_arg(arg: &str, sysfs_root: &Path) -> Result<(DevNum, Option<PathBuf>)> {
    if arg.starts_with('/') {
        let meta = fs::metadata(arg).map_err(|e| Error::io("cannot stat device", arg, e))?;
        let num = DevNum::from_metadata(&meta)
            .ok_or_else(|| Error::invalid(format!("device {arg}"), "not a device node"))?;
        return Ok((num, Some(PathBuf::from(arg))));
    }
    let (typ, mm) = match arg.split_at_checked(2) {
        Some(("c:", rest)) | Some(("c ", rest)) => (Some(DevType::Char), rest),
        Some(("b:", rest)) | Some(("b ", rest)) => (Some(DevType::Block), rest),
        _ => (None, arg),
    };
    let bad = || {
        Error::invalid(
            format!("device {arg:?}"),
            "expected a path under /dev or MAJ:MIN",
        )
    };
    let (ma, mi) = mm.split_once(':').ok_or_else(bad)?;
    let major: i64 = ma.trim().parse().map_err(|_| bad())?;
    let minor: i64 = mi.trim().parse().map_err(|_| bad())?;
    let ctx = format!("device {arg:?}");
    let major = check_number("major", major, MAX_MAJOR, &ctx)?;
    let minor = check_number("minor", minor, MAX_MINOR, &ctx)?;
    let typ = typ.unwrap_or_else(|| {
        let has = |t: &str| {
            sysfs_root
                .join("dev")
                .join(t)
                .join(format!("{major}:{minor}"))
                .exists()
        };
        if has("block") && !has("char") {
            DevType::Block
        } else {
            DevType::Char
        }
    });
    Ok((DevNum { typ, major, minor }, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_with_multibyte_characters_do_not_panic() {
        for t in ["aé€x", "GPé-x", "€€€€€", "GPU-é"] {
            let _ = parse_selector(t);
        }
        assert!(matches!(
            parse_selector("gpu-1234"),
            Some(GpuSelector::Uuid(_))
        ));
        let s = Spec::parse(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=aé€x"]},
                "annotations":{"cdi.k8s.io/x":"nvidia.com/gpu=aé€x"}}"#
                .as_bytes(),
            Path::new("/c"),
        )
        .unwrap();
        assert!(gpu_selectors(&s).is_empty());
    }
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
            !may_have_devices(&s),
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
    fn no_devices_fast_test() {
        assert!(!may_have_devices(&spec(
            r#"{"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"},
                {"allow":true,"type":"c","major":1,"minor":5,"access":"rwm"}]}}}"#
        )));
        assert!(may_have_devices(&spec(
            r#"{"linux":{"resources":{"devices":[{"allow":true,"type":"c","major":195,"minor":1}]}}}"#
        )));
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

    #[test]
    fn gpu_selectors_from_env_and_cdi() {
        let s = spec(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0, GPU-AbC-1,3:1,MIG-xyz,,junk,99999"]},
                "annotations":{"cdi.k8s.io/devgate":"nvidia.com/gpu=2,vendor.com/x=1, nvidia.com/gpu=all",
                               "other/key":"nvidia.com/gpu=5"}}"#,
        );
        assert_eq!(
            gpu_selectors(&s),
            vec![
                (GpuSelector::Index(0), Source::NvidiaVisibleDevices),
                (
                    GpuSelector::Uuid("GPU-AbC-1".into()),
                    Source::NvidiaVisibleDevices
                ),
                (GpuSelector::Index(3), Source::NvidiaVisibleDevices),
                (GpuSelector::Index(2), Source::CdiAnnotation),
                (GpuSelector::All, Source::CdiAnnotation),
            ]
        );
        assert!(may_have_devices(&s));
        for none in ["void", "none", ""] {
            let s = spec(&format!(
                r#"{{"process":{{"env":["NVIDIA_VISIBLE_DEVICES={none}"]}}}}"#
            ));
            assert!(gpu_selectors(&s).is_empty(), "{none:?}");
            assert!(!may_have_devices(&s));
        }
        // the last assignment wins, as in execve's environment
        let s = spec(
            r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=all","NVIDIA_VISIBLE_DEVICES=void"]}}"#,
        );
        assert!(gpu_selectors(&s).is_empty());
    }

    #[test]
    fn selected_gpu_is_an_nvidia_gpu_device() {
        let d = selected_gpu(
            3,
            Source::CdiAnnotation,
            &class::builtin(),
            Path::new("/nonexistent-dev"),
            Path::new("/nonexistent-sys"),
        );
        assert_eq!(d.class, "nvidia-gpu");
        assert_eq!(d.describe(), "/dev/nvidia3 (195:3)");
        assert_eq!(d.host_path, None);
        assert_eq!(
            serde_json::to_value(d.source).unwrap(),
            serde_json::json!("cdi-annotation")
        );
    }

    #[test]
    fn device_arg_parsing() {
        let sys = Path::new("/nonexistent");
        assert_eq!(
            parse_device_arg("195:1", sys).unwrap().0,
            DevNum {
                typ: DevType::Char,
                major: 195,
                minor: 1
            }
        );
        assert_eq!(
            parse_device_arg("b:8:0", sys).unwrap().0.typ,
            DevType::Block
        );
        assert!(parse_device_arg("195", sys).is_err());
        assert!(parse_device_arg("195:x", sys).is_err());
        assert!(parse_device_arg("5000:1", sys).is_err());
        assert!(parse_device_arg("/etc/hostname", sys).is_err());
        assert_eq!(parse_device_arg("/dev/zero", sys).unwrap().0.mm(), "1:5");
    }
}
