//! The node's side: devgate's directories, the spares, and the kernel log. Pure judges first
//! in each part, then the reader. The cgroup mode and driver are in cgroup.rs, NVML in nvml.rs.

use super::error::{ConfigError, NodeError};
use crate::error::Error;
use crate::model::device::{DevNum, DevType};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------
// Directories devgate (root) writes into: every component of the path must be root's and
// writable by nobody else, or someone else could swap what root writes through.

/// Checks the whole path of a directory devgate writes into (the runtime's own check,
/// fsutil::check_path). Ok: a note for the ✓ line.
pub fn check_safe_dir(dir: &Path) -> Result<&'static str, Error> {
    match crate::fsutil::check_path(dir)? {
        crate::fsutil::DirState::Present => {
            Ok("every directory on its path is root's and not writable by others")
        }
        crate::fsutil::DirState::Absent => Ok("absent; devgate creates it"),
    }
}

// ---------------------------------------------------------------------------------------
// Spares: the device, and the /dev/char (or /dev/block) link systemd needs.

/// A spare's device number, or why it is not a usable device.
pub(crate) fn spare_device(path: &Path) -> Result<DevNum, NodeError> {
    let meta = fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => NodeError::Missing(path.to_path_buf()),
        _ => NodeError::Stat {
            path: path.to_path_buf(),
            source: e.into(),
        },
    })?;
    DevNum::from_metadata(&meta).ok_or_else(|| NodeError::NotDevice(path.to_path_buf()))
}

/// The /dev/char/MAJ:MIN (or /dev/block) name for `num` under `dev_root`.
pub fn dev_link(dev_root: &Path, num: DevNum) -> PathBuf {
    let dir = match num.typ {
        DevType::Char => "char",
        DevType::Block => "block",
    };
    dev_root.join(dir).join(num.to_string())
}

/// Ok: the link resolves to the spare's own device. Err: what is wrong with it.
pub(crate) fn check_dev_link(link: &Path, num: DevNum) -> Result<(), NodeError> {
    match fs::symlink_metadata(link) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(NodeError::LinkMissing(link.to_path_buf()))
        }
        Err(e) => {
            return Err(NodeError::Stat {
                path: link.to_path_buf(),
                source: e.into(),
            })
        }
        Ok(_) => {}
    }
    match fs::metadata(link)
        .ok()
        .and_then(|m| DevNum::from_metadata(&m))
    {
        Some(n) if n == num => Ok(()),
        Some(found) => Err(NodeError::LinkElsewhere {
            link: link.to_path_buf(),
            found,
        }),
        None => Err(NodeError::LinkNotDevice(link.to_path_buf())),
    }
}

/// The command that makes the link: NVIDIA's tool for its nodes (which nvidia-modprobe
/// makes without udev, so they never get one), `ln -s` otherwise.
pub fn dev_link_fix(spare: &Path, link: &Path, dev_root: &Path, class: &str) -> String {
    let target = match spare.strip_prefix(dev_root) {
        Ok(rel) => format!("../{}", rel.display()),
        Err(_) => spare.display().to_string(),
    };
    let ln = format!("ln -s {target} {}", link.display());
    if class == crate::model::class::Class::NvidiaGpu.as_str() {
        format!("nvidia-ctk system create-dev-char-symlinks --create-all (or {ln}), at every boot")
    } else {
        format!("{ln}, at every boot (a udev rule does it for devices udev creates)")
    }
}

// ---------------------------------------------------------------------------------------
// Spares hidden from the device plugin. kubelet checkpoints the devices each plugin
// registered (RegisteredDevices, resource → device ids) in
// /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint. NVIDIA's plugin names a GPU
// by its UUID (default device-id-strategy), or by its index; time-sliced replicas as
// `UUID::N`.

#[derive(Deserialize)]
struct Checkpoint {
    #[serde(rename = "Data")]
    data: CheckpointData,
}

#[derive(Deserialize)]
struct CheckpointData {
    #[serde(rename = "RegisteredDevices", default)]
    registered: Option<BTreeMap<String, Vec<String>>>,
}

/// resource name → device ids, the NVIDIA ones only (`nvidia.com/…`).
pub(crate) fn nvidia_registered(text: &str) -> Result<BTreeMap<String, Vec<String>>, ConfigError> {
    let c: Checkpoint =
        serde_json::from_str(text).map_err(|e| ConfigError::NotCheckpoint(e.to_string()))?;
    Ok(c.data
        .registered
        .unwrap_or_default()
        .into_iter()
        .filter(|(r, _)| r.starts_with("nvidia.com/"))
        .collect())
}

/// The resource that advertises the GPU with this UUID or index, if any.
pub fn advertised_as<'a>(
    registered: &'a BTreeMap<String, Vec<String>>,
    uuid: &str,
    index: u32,
) -> Option<&'a str> {
    let idx = index.to_string();
    registered.iter().find_map(|(res, ids)| {
        ids.iter()
            .any(|id| {
                let base = id.split("::").next().unwrap_or(id);
                base.eq_ignore_ascii_case(uuid) || base == idx
            })
            .then_some(res.as_str())
    })
}

// ---------------------------------------------------------------------------------------
// The kernel log: opened the way the hook opens it, one record read.

pub(crate) fn read_one_kmsg_record(path: &Path) -> Result<&'static str, NodeError> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| NodeError::Open(Error::io("cannot open", path, e)))?;
    // Larger than the kernel's largest record, or /dev/kmsg answers EINVAL.
    let mut buf = vec![0u8; 64 << 10];
    loop {
        return match f.read(&mut buf) {
            Ok(0) => Ok("readable (empty)"),
            Ok(_) => Ok("readable"),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok("readable (no records)"),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // The oldest records were overwritten: readable all the same.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => Ok("readable"),
            Err(e) => Err(NodeError::Read {
                path: path.to_path_buf(),
                source: e.into(),
            }),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_dir_notes() {
        // The rules themselves are tested in fsutil; doctor only words the outcome.
        // tempdir is mode 0755, as the directory checks want
        let d = crate::fsutil::tests::tempdir("doctor-unit");
        fs::create_dir_all(d.join("state")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(d.join("state"), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_safe_dir(&d.join("state"))
            .unwrap()
            .starts_with("every directory"));
        assert_eq!(
            check_safe_dir(&d.join("new")).unwrap(),
            "absent; devgate creates it"
        );
        fs::set_permissions(d.join("state"), fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_safe_dir(&d.join("state")).unwrap_err().to_string();
        assert!(
            e.ends_with("is writable by group or others (mode 777)"),
            "{e}"
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn checkpoint_advertising() {
        let text = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{
            "nvidia.com/gpu":["GPU-aaa","GPU-bbb::1"],"example.com/fpga":["GPU-ccc"]}},
            "Checksum":123}"#;
        let r = nvidia_registered(text).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(advertised_as(&r, "GPU-aaa", 9), Some("nvidia.com/gpu"));
        assert_eq!(advertised_as(&r, "GPU-bbb", 9), Some("nvidia.com/gpu"));
        assert_eq!(advertised_as(&r, "GPU-ccc", 9), None);
        let by_index = nvidia_registered(
            r#"{"Data":{"RegisteredDevices":{"nvidia.com/gpu":["0","1"]}},"Checksum":1}"#,
        )
        .unwrap();
        assert_eq!(advertised_as(&by_index, "GPU-x", 1), Some("nvidia.com/gpu"));
        assert_eq!(advertised_as(&by_index, "GPU-x", 7), None);
        assert!(nvidia_registered(r#"{"Data":{"RegisteredDevices":null}}"#)
            .unwrap()
            .is_empty());
        assert!(nvidia_registered("[]").is_err());
    }

    #[test]
    fn link_fix_text() {
        let num = DevNum {
            typ: DevType::Char,
            major: 195,
            minor: 7,
        };
        let link = dev_link(Path::new("/dev"), num);
        assert_eq!(link, Path::new("/dev/char/195:7"));
        assert_eq!(
            dev_link_fix(
                Path::new("/dev/nvidia7"),
                &link,
                Path::new("/dev"),
                "nvidia-gpu"
            ),
            "nvidia-ctk system create-dev-char-symlinks --create-all (or ln -s ../nvidia7 \
             /dev/char/195:7), at every boot"
        );
    }
}
