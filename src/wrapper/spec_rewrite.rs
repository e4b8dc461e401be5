//! A remap written into the container's spec before the runtime reads it, so that runc or
//! crun create the spare's node and grant it in the device cgroup themselves, on every
//! cgroup version and driver (under systemd, runc's DeviceAllow= carries the spare).
//!
//! The document is edited in place as JSON so that every field devgate does not know
//! reaches the runtime as it was; only these change, for each swap of a bad device for
//! its spare:
//! - `linux.devices` entries with the bad device's number get the spare's number (path,
//!   mode, uid and gid stay: the container sees the same name);
//! - device bind mounts whose source is the bad device's node get the spare's node;
//! - `linux.resources.devices` becomes a deny-all, the spec's allows without the bad
//!   device, and an allow for the spare: no deny after an allow, the one shape crun accepts
//!   under the systemd driver without bpffs (device_rules.rs).
//!
//! The same rule edit is applied to the resources `update` passes on (see update.rs).

use super::device_rules::{self, RuleError};
use crate::error::{Error, Result};
use crate::model::device::{DevNum, DevType};
use serde_json::Value;
use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One bad device and the spare that stands in for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swap {
    pub bad: DevNum,
    pub spare: DevNum,
    pub spare_path: PathBuf,
}

/// Why a config.json cannot take a remap: a part of it that is not the shape every runtime
/// reads, or device rules no list of allows can be made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RewriteError {
    NotObject,
    LinuxNotObject,
    ResourcesNotObject,
    DevicesNotArray,
    /// `linux.resources.devices` cannot be rewritten.
    Rules(RuleError),
}

impl fmt::Display for RewriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RewriteError::NotObject => f.write_str("config.json is not a JSON object"),
            RewriteError::LinuxNotObject => f.write_str("config.json linux is not an object"),
            RewriteError::ResourcesNotObject => {
                f.write_str("config.json linux.resources is not an object")
            }
            RewriteError::DevicesNotArray => {
                f.write_str("config.json linux.resources.devices is not an array")
            }
            RewriteError::Rules(e) => write!(f, "config.json linux.resources.devices: {e}"),
        }
    }
}

impl std::error::Error for RewriteError {}

/// What the rewrite did for one swap, for the record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Changed {
    /// `linux.devices` and bind mounts, one clause each.
    pub nodes: Vec<String>,
    /// The rules appended.
    pub rules: String,
}

fn dev_type(letter: &str) -> Option<DevType> {
    match letter {
        "c" | "u" => Some(DevType::Char),
        "b" => Some(DevType::Block),
        _ => None,
    }
}

/// Rewrites a device rule list for `swaps`: a deny-all, the spec's allows without each
/// bad device, and each spare with the access the bad device had (device_rules.rs says why
/// this shape). Fails on a rule no runtime accepts, or one that cannot leave a device out
/// (an allow-all: a privileged container).
pub fn remap_rules(
    rules: &mut Vec<Value>,
    swaps: &[Swap],
) -> std::result::Result<Vec<String>, RuleError> {
    let mut allows = device_rules::effective_allows(rules)?;
    let mut spares = Vec::new();
    let mut said = Vec::new();
    for s in swaps {
        let bits = device_rules::granted(&allows, s.bad);
        let access = device_rules::access_text(bits);
        allows = device_rules::without(allows, s.bad)?;
        spares.push(device_rules::Rule::exact(true, s.spare, bits));
        said.push(format!(
            "deny all first, allows without {t} {}, allow {t} {} {access}",
            s.bad,
            s.spare,
            t = s.bad.typ.letter()
        ));
    }
    allows.extend(spares);
    *rules = device_rules::to_values(&allows);
    Ok(said)
}

fn num_of(entry: &Value) -> Option<DevNum> {
    let typ = dev_type(entry.get("type")?.as_str()?)?;
    let major = u32::try_from(entry.get("major")?.as_i64()?).ok()?;
    let minor = u32::try_from(entry.get("minor")?.as_i64()?).ok()?;
    Some(DevNum { typ, major, minor })
}

/// Rewrites `doc` (a whole config.json) for `swaps`: the three places it names a device
/// (bind mounts, linux.devices, linux.resources.devices), each filling the same `Changed`
/// per swap. Fails only on a document whose shape no runtime would accept (a `linux` that
/// is not an object, and the like). Bind mounts are swapped only when their source is
/// under `dev_root`, as discovery finds them.
pub fn rewrite(
    doc: &mut Value,
    swaps: &[Swap],
    dev_root: &Path,
) -> std::result::Result<Vec<Changed>, RewriteError> {
    let mut out = vec![Changed::default(); swaps.len()];
    let root = doc.as_object_mut().ok_or(RewriteError::NotObject)?;
    if let Some(mounts) = root.get_mut("mounts").and_then(Value::as_array_mut) {
        swap_bind_mounts(mounts, swaps, dev_root, &mut out);
    }
    let linux = root
        .entry("linux")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
        .ok_or(RewriteError::LinuxNotObject)?;
    if let Some(devices) = linux.get_mut("devices").and_then(Value::as_array_mut) {
        swap_linux_devices(devices, swaps, &mut out);
    }
    swap_device_rules(linux, swaps, &mut out)?;
    Ok(out)
}

/// Bind mounts whose source, a node under `dev_root`, is a bad device's: from its spare.
fn swap_bind_mounts(mounts: &mut [Value], swaps: &[Swap], dev_root: &Path, out: &mut [Changed]) {
    for m in mounts.iter_mut() {
        let Ok(parsed) = serde_json::from_value::<crate::oci::spec::Mount>(m.clone()) else {
            continue;
        };
        if !parsed.is_bind() {
            continue;
        }
        let Some(src) = &parsed.source else {
            continue;
        };
        // As in discovery: a source outside dev_root is never stat'ed. It may be on a
        // filesystem a pod controls (a hung NFS volume), where a stat cannot be
        // interrupted, and the runtime is waiting.
        if !crate::discover::lexically_below(src, dev_root) {
            continue;
        }
        let Some(num) = crate::fsutil::stat_beneath(dev_root, src)
            .ok()
            .and_then(|meta| DevNum::from_metadata(&meta))
        else {
            continue;
        };
        for (s, changed) in swaps.iter().zip(out.iter_mut()) {
            if s.bad == num {
                m["source"] = Value::String(s.spare_path.display().to_string());
                changed.nodes.push(format!(
                    "bind mount {} now from {}",
                    parsed.destination.display(),
                    s.spare_path.display()
                ));
            }
        }
    }
}

/// `linux.devices` entries of a bad device: the spare's number, the rest kept.
fn swap_linux_devices(devices: &mut [Value], swaps: &[Swap], out: &mut [Changed]) {
    for d in devices.iter_mut() {
        let Some(num) = num_of(d) else { continue };
        for (s, changed) in swaps.iter().zip(out.iter_mut()) {
            if s.bad != num {
                continue;
            }
            d["type"] = Value::String(s.spare.typ.letter().to_string());
            d["major"] = Value::from(s.spare.major);
            d["minor"] = Value::from(s.spare.minor);
            let field = |k: &str, octal: bool| match d.get(k).and_then(Value::as_u64) {
                Some(v) if octal => format!("{v:o}"),
                Some(v) => v.to_string(),
                None => "unset".into(),
            };
            changed.nodes.push(format!(
                "linux.devices {} is now {} {} (mode {}, uid {}, gid {})",
                d.get("path").and_then(Value::as_str).unwrap_or("?"),
                s.spare.typ.letter(),
                s.spare,
                field("fileMode", true),
                field("uid", false),
                field("gid", false),
            ));
        }
    }
}

/// `linux.resources.devices` rewritten by [`remap_rules`] (both made where missing).
fn swap_device_rules(
    linux: &mut serde_json::Map<String, Value>,
    swaps: &[Swap],
    out: &mut [Changed],
) -> std::result::Result<(), RewriteError> {
    let resources = linux
        .entry("resources")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
        .ok_or(RewriteError::ResourcesNotObject)?;
    let rules = resources
        .entry("devices")
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or(RewriteError::DevicesNotArray)?;
    let said = remap_rules(rules, swaps).map_err(RewriteError::Rules)?;
    for (said, changed) in said.into_iter().zip(out.iter_mut()) {
        changed.rules = format!("linux.resources.devices: {said}");
    }
    Ok(())
}

/// Replaces the spec file with `bytes` so that the runtime reads the old or the new
/// document, never a mix, keeping the original's mode and owner. The bundle directory is
/// the runtime caller's (root's), never the container's; the file itself must be a regular
/// file, not a symlink.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let meta = fs::symlink_metadata(path).map_err(|e| Error::io("cannot stat", path, e))?;
    if !meta.is_file() {
        return Err(Error::invalid(
            format!("spec file {}", path.display()),
            "not a regular file",
        ));
    }
    crate::fsutil::write_atomic_owned(path, bytes, meta.mode() & 0o7777, meta.uid(), meta.gid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceType};
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;

    fn c(major: u32, minor: u32) -> DevNum {
        DevNum {
            typ: DevType::Char,
            major,
            minor,
        }
    }

    fn swap(bad: DevNum, spare: DevNum, path: &str) -> Swap {
        Swap {
            bad,
            spare,
            spare_path: path.into(),
        }
    }

    /// What containerd's CRI plugin writes for a pod with a GPU, trimmed.
    fn cri_spec() -> Value {
        json!({
            "ociVersion": "1.1.0",
            "process": {"args": ["sleep", "1"], "env": ["A=1"]},
            "annotations": {"io.kubernetes.cri.container-name": "trainer"},
            "someFutureField": {"kept": [1, 2, 3]},
            "linux": {
                "devices": [
                    {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1,
                     "fileMode": 438, "uid": 0, "gid": 44},
                    {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255,
                     "fileMode": 438, "uid": 0, "gid": 0}
                ],
                "resources": {
                    "devices": [
                        {"allow": false, "access": "rwm"},
                        {"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rw"},
                        {"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rw"}
                    ],
                    "cpu": {"shares": 1024}
                },
                "cgroupsPath": "kubepods-pod1.slice:cri-containerd:abc"
            }
        })
    }

    #[test]
    fn device_entry_and_rules_are_swapped_and_the_rest_kept() {
        let mut doc = cri_spec();
        let before = doc.clone();
        let changed = rewrite(
            &mut doc,
            &[swap(c(195, 1), c(195, 7), "/dev/nvidia7")],
            Path::new("/dev"),
        )
        .unwrap();
        assert_eq!(
            doc["linux"]["devices"][0],
            json!({"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 7,
                   "fileMode": 438, "uid": 0, "gid": 44})
        );
        assert_eq!(doc["linux"]["devices"][1], before["linux"]["devices"][1]);
        // A deny-all, the spec's allows without the bad device, the spare (with what the
        // bad device was given): the one shape every runtime and cgroup driver accepts.
        assert_eq!(
            doc["linux"]["resources"]["devices"],
            json!([
                {"allow": false, "type": "a", "access": "rwm"},
                {"allow": true, "type": "c", "major": 195, "minor": 255, "access": "rw"},
                {"allow": true, "type": "c", "major": 195, "minor": 7, "access": "rw"}
            ])
        );
        for k in ["process", "annotations", "someFutureField", "ociVersion"] {
            assert_eq!(doc[k], before[k], "{k}");
        }
        assert_eq!(doc["linux"]["cgroupsPath"], before["linux"]["cgroupsPath"]);
        assert_eq!(
            doc["linux"]["resources"]["cpu"],
            before["linux"]["resources"]["cpu"]
        );
        assert_eq!(
            changed,
            [Changed {
                nodes: vec![
                    "linux.devices /dev/nvidia1 is now c 195:7 (mode 666, uid 0, gid 44)".into()
                ],
                rules: "linux.resources.devices: deny all first, allows without c 195:1, \
                        allow c 195:7 rw"
                    .into(),
            }]
        );
    }

    /// Under the systemd driver without bpffs crun turns the rules into DeviceAllow=: it
    /// starts from its last deny-all, refuses a deny after it ("systemd does not support
    /// deny rules for devices") and writes `c 195:*` as `char-195`, which systemd reads as
    /// a driver name. So: a deny-all first, no deny after, no wildcard over a bad device.
    fn systemd_fallback_accepts(rules: &Value) -> std::result::Result<(), String> {
        let rules: Vec<LinuxDeviceCgroup> = serde_json::from_value(rules.clone()).unwrap();
        let first = rules.first().ok_or("no rules")?;
        let all = |r: &LinuxDeviceCgroup| {
            matches!(r.typ(), None | Some(LinuxDeviceType::A))
                && r.major().is_none()
                && r.minor().is_none()
        };
        if first.allow() || !all(first) {
            return Err(format!("first rule is not a deny-all: {first:?}"));
        }
        match rules[1..].iter().find(|r| !r.allow()) {
            Some(r) => Err(format!("a deny after the deny-all: {r:?}")),
            None => Ok(()),
        }
    }

    fn program(doc: &Value) -> Vec<crate::action::cgroup::bpf::Insn> {
        use crate::action::cgroup::bpf;
        let rules: Vec<LinuxDeviceCgroup> =
            serde_json::from_value(doc["linux"]["resources"]["devices"].clone()).unwrap();
        bpf::program(&rules).unwrap()
    }

    #[test]
    fn a_wildcard_minor_allow_is_split_without_the_bad_device() {
        use crate::action::cgroup::bpf::{emulate, ACC_READ as R, ACC_WRITE as W, DEV_CHAR as C};
        let mut doc = json!({"linux": {"resources": {"devices": [
            {"allow": false, "access": "rwm"},
            {"allow": true, "type": "c", "major": 195, "access": "rw"},
            {"allow": true, "type": "c", "access": "m"}
        ]}}});
        rewrite(
            &mut doc,
            &[swap(c(195, 1), c(195, 7), "/dev/nvidia7")],
            Path::new("/dev"),
        )
        .unwrap();
        let rules = &doc["linux"]["resources"]["devices"];
        systemd_fallback_accepts(rules).unwrap();
        let has = |major: u32, minor: u32| {
            rules
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["allow"] == true && r["major"] == major && r["minor"] == minor)
        };
        assert!(!has(195, 1), "{rules}");
        for m in [0, 2, 7, 253, 254, 255] {
            assert!(has(195, m), "195:{m} {rules}");
        }
        assert!(rules
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r.get("major").is_some() || r["access"] != "rw"));
        let p = program(&doc);
        assert_eq!(emulate(&p, C, R | W, 195, 1), Some(0), "bad denied");
        assert_eq!(emulate(&p, C, R | W, 195, 7), Some(1), "spare allowed");
        assert_eq!(emulate(&p, C, R | W, 195, 255), Some(1), "nvidiactl kept");
        assert_eq!(
            emulate(&p, C, R | W, 195, 254),
            Some(1),
            "nvidia-modeset kept"
        );
        assert_eq!(emulate(&p, C, R | W, 10, 1), Some(0), "others as before");
    }

    /// A privileged container's spec allows every device: no list of allows can leave one
    /// out, and crun hands systemd DevicePolicy=auto for it. The remap is refused.
    #[test]
    fn an_allow_all_spec_is_refused_saying_why() {
        for all in [
            json!({"allow": true, "access": "rwm"}),
            json!({"allow": true, "type": "a", "access": "rwm"}),
            json!({"allow": true, "type": "c", "access": "rwm"}),
        ] {
            let mut doc = json!({"linux": {"resources": {"devices": [all.clone()]}}});
            let e = rewrite(
                &mut doc,
                &[swap(c(195, 1), c(195, 7), "/dev/nvidia7")],
                Path::new("/dev"),
            )
            .unwrap_err();
            assert_eq!(
                e,
                RewriteError::Rules(RuleError::AllowsEvery(Some(DevType::Char))),
                "{all}"
            );
            let e = e.to_string();
            assert!(
                e.starts_with(
                    "config.json linux.resources.devices: the spec allows every c device"
                ),
                "{all}: {e}"
            );
            assert!(e.contains("privileged"), "{all}: {e}");
        }
    }

    /// A deny of the spec's own after its allows is folded into them, so none follows the
    /// deny-all; the runtimes' `c *:* m` stays as it was.
    #[test]
    fn the_specs_own_denies_are_folded_into_its_allows() {
        use crate::action::cgroup::bpf::{emulate, ACC_READ as R, ACC_WRITE as W, DEV_CHAR as C};
        let mut doc = json!({"linux": {"resources": {"devices": [
            {"allow": true, "access": "rwm"},
            {"allow": false, "access": "rwm"},
            {"allow": true, "type": "c", "access": "m"},
            {"allow": true, "type": "c", "major": 10, "access": "rwm"},
            {"allow": false, "type": "c", "major": 10, "minor": 201, "access": "rw"},
            {"allow": true, "type": "c", "major": 10, "minor": 229, "access": "rwm"}
        ]}}});
        rewrite(
            &mut doc,
            &[swap(c(10, 229), c(10, 237), "/dev/loop-control")],
            Path::new("/dev"),
        )
        .unwrap();
        systemd_fallback_accepts(&doc["linux"]["resources"]["devices"]).unwrap();
        let p = program(&doc);
        assert_eq!(emulate(&p, C, R | W, 10, 229), Some(0), "bad denied");
        assert_eq!(
            emulate(&p, C, R | W, 10, 201),
            Some(0),
            "the spec's deny kept"
        );
        assert_eq!(emulate(&p, C, R | W, 10, 237), Some(1), "spare allowed");
        assert_eq!(emulate(&p, C, R | W, 10, 1), Some(1), "others as before");
        assert_eq!(emulate(&p, C, R | W, 1, 1), Some(0), "others as before");
    }

    #[test]
    fn no_rules_and_no_devices_get_just_the_two_rules() {
        let mut doc = json!({"ociVersion": "1.0.2"});
        let changed = rewrite(
            &mut doc,
            &[swap(c(10, 229), c(10, 237), "/dev/loop-control")],
            Path::new("/dev"),
        )
        .unwrap();
        assert_eq!(
            doc["linux"]["resources"]["devices"],
            json!([
                {"allow": false, "type": "a", "access": "rwm"},
                {"allow": true, "type": "c", "major": 10, "minor": 237, "access": "rwm"}
            ])
        );
        assert!(changed[0].nodes.is_empty());
    }

    #[test]
    fn two_swaps_and_block_devices() {
        let b = |major, minor| DevNum {
            typ: DevType::Block,
            major,
            minor,
        };
        let mut doc = json!({"linux": {"devices": [
            {"path": "/dev/a", "type": "c", "major": 195, "minor": 1},
            {"path": "/dev/b", "type": "b", "major": 7, "minor": 1}
        ]}});
        let changed = rewrite(
            &mut doc,
            &[
                swap(c(195, 1), c(195, 7), "/dev/nvidia7"),
                swap(b(7, 1), b(7, 5), "/dev/loop5"),
            ],
            Path::new("/dev"),
        )
        .unwrap();
        assert_eq!(doc["linux"]["devices"][0]["minor"], 7);
        assert_eq!(doc["linux"]["devices"][1]["minor"], 5);
        assert_eq!(doc["linux"]["devices"][1]["type"], "b");
        assert_eq!(
            changed[1].nodes,
            ["linux.devices /dev/b is now b 7:5 (mode unset, uid unset, gid unset)"]
        );
        assert_eq!(
            doc["linux"]["resources"]["devices"]
                .as_array()
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn device_bind_mount_source_is_the_spare() {
        let mut doc = json!({"mounts": [
            {"destination": "/dev/accel", "type": "bind", "source": "/dev/zero", "options": ["rbind"]},
            {"destination": "/data", "type": "bind", "source": "/tmp", "options": ["rbind"]},
            {"destination": "/proc", "type": "proc", "source": "proc"}
        ]});
        let before = doc["mounts"].clone();
        let changed = rewrite(
            &mut doc,
            &[swap(c(1, 5), c(1, 7), "/dev/full")],
            Path::new("/dev"),
        )
        .unwrap();
        assert_eq!(doc["mounts"][0]["source"], "/dev/full");
        assert_eq!(doc["mounts"][1], before[1]);
        assert_eq!(doc["mounts"][2], before[2]);
        assert_eq!(
            changed[0].nodes,
            ["bind mount /dev/accel now from /dev/full"]
        );
    }

    /// The wrapper must not stat what discovery would not: a source outside dev_root (a
    /// pod's volume, maybe on a hung NFS server) is left alone, even when it is the bad
    /// device's node, and so is one reaching out of dev_root through `..`.
    #[test]
    fn bind_sources_outside_dev_root_are_never_stated() {
        let mut doc = json!({"mounts": [
            {"destination": "/dev/a", "type": "bind", "source": "/dev/zero", "options": ["rbind"]},
            {"destination": "/dev/b", "type": "bind", "source": "/dev/../dev/zero", "options": ["rbind"]}
        ]});
        let before = doc["mounts"].clone();
        let root = Path::new("/elsewhere");
        let changed = rewrite(&mut doc, &[swap(c(1, 5), c(1, 7), "/dev/full")], root).unwrap();
        assert_eq!(doc["mounts"], before);
        assert!(changed[0].nodes.is_empty());
        let changed = rewrite(
            &mut doc,
            &[swap(c(1, 5), c(1, 7), "/dev/full")],
            Path::new("/dev"),
        )
        .unwrap();
        assert_eq!(doc["mounts"][0]["source"], "/dev/full");
        assert_eq!(doc["mounts"][1], before[1]);
        assert_eq!(changed[0].nodes.len(), 1);
    }

    /// As in discovery: a symlink someone left in a world-writable directory under
    /// dev_root (/dev/shm) does not lead the stat out of dev_root.
    #[test]
    fn a_symlink_under_dev_root_is_not_followed_out_of_it() {
        let d = std::env::temp_dir().join(format!("devgate-rewrite-link-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("shm")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.join("shm/abs")).unwrap();
        std::os::unix::fs::symlink("/dev", d.join("shm/dir")).unwrap();
        let mut doc = json!({"mounts": [
            {"destination": "/dev/a", "type": "bind", "source": d.join("shm/abs"), "options": ["rbind"]},
            {"destination": "/dev/b", "type": "bind", "source": d.join("shm/dir/zero"), "options": ["rbind"]}
        ]});
        let before = doc["mounts"].clone();
        let changed = rewrite(&mut doc, &[swap(c(1, 5), c(1, 7), "/dev/full")], &d).unwrap();
        assert_eq!(doc["mounts"], before);
        assert!(changed[0].nodes.is_empty());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn shapes_no_runtime_accepts_are_errors() {
        for bad in [
            json!([]),
            json!({"linux": 3}),
            json!({"linux": {"resources": []}}),
        ] {
            let mut doc = bad.clone();
            assert!(
                rewrite(
                    &mut doc,
                    &[swap(c(1, 5), c(1, 7), "/dev/full")],
                    Path::new("/dev")
                )
                .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn replace_file_keeps_mode_and_owner_and_leaves_no_temp() {
        let dir = std::env::temp_dir().join(format!("devgate-sr-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("config.json");
        fs::write(&p, b"{}").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        let before = fs::metadata(&p).unwrap();
        replace_file(&p, b"{\"a\":1}").unwrap();
        let after = fs::metadata(&p).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"{\"a\":1}");
        assert_eq!(after.mode() & 0o7777, 0o640);
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        assert_ne!(after.ino(), before.ino(), "replaced, not written in place");
        let names: Vec<_> = fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
        std::os::unix::fs::symlink(&p, dir.join("link")).unwrap();
        assert!(replace_file(&dir.join("link"), b"{}").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
