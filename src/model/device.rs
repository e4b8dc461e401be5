//! A device's identity: what the kernel knows it by (type and major:minor), where the
//! container and the host see it, and how it reached the container.

use crate::error::{Error, Result};
use crate::model::class::Class;
pub use crate::model::devtype::DevType;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The kernel's dev_t keeps 12 bits of major and 20 of minor.
pub(crate) const MAX_MAJOR: i64 = (1 << 12) - 1;
pub(crate) const MAX_MINOR: i64 = (1 << 20) - 1;

/// Type plus major:minor: what the kernel and the device cgroup know a device by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DevNum {
    #[serde(rename = "type")]
    pub typ: DevType,
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    pub(crate) fn from_metadata(meta: &fs::Metadata) -> Option<DevNum> {
        let typ = DevType::of_metadata(meta)?;
        let rdev = meta.rdev();
        Some(DevNum {
            typ,
            major: libc::major(rdev),
            minor: libc::minor(rdev),
        })
    }

    /// sysfs's directory for this number: `SYSFS/dev/{char,block}/MAJ:MIN`, a link to the
    /// device's own directory.
    pub(crate) fn sysfs_path(&self, sysfs_root: &Path) -> PathBuf {
        // One format and one join: this runs for every device of every start, twice.
        sysfs_root.join(format!(
            "dev/{}/{}:{}",
            self.typ.sysfs_dir(),
            self.major,
            self.minor
        ))
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    LinuxDevices,
    BindMount,
    CgroupRule,
    /// A GPU named by `NVIDIA_VISIBLE_DEVICES` in the container's process.env.
    NvidiaVisibleDevices,
    /// A GPU named by a CDI annotation (`cdi.k8s.io/…: nvidia.com/gpu=…`).
    CdiAnnotation,
    /// A GPU named only by `all` (env or CDI). Every CUDA base image sets
    /// `NVIDIA_VISIBLE_DEVICES=all`, so its findings warn and never block a start.
    AllGpus,
    /// Not a container's: a node on the host (an accelerator, a spare, a quarantined device).
    Host,
    /// Held by a container that holds every device (a privileged one), but assigned to it
    /// by nothing: no selector or CDI names it. Its findings warn and never block a start
    /// (`policy.strict_privileged` judges it as assigned).
    Held,
}

impl Source {
    /// Named by the container's env or annotations, not granted by the spec.
    pub fn is_selector(self) -> bool {
        matches!(
            self,
            Source::NvidiaVisibleDevices | Source::CdiAnnotation | Source::AllGpus
        )
    }

    pub fn describe(self) -> &'static str {
        match self {
            Source::LinuxDevices => "linux.devices",
            Source::BindMount => "a device bind mount",
            Source::CgroupRule => "a device cgroup rule",
            Source::NvidiaVisibleDevices => "NVIDIA_VISIBLE_DEVICES",
            Source::CdiAnnotation => "a CDI annotation",
            Source::AllGpus => "a selector of all GPUs",
            Source::Host => "the host",
            Source::Held => "a container that holds every device",
        }
    }
}

/// Written with its number flat (`{"type":…,"major":…,"minor":…,"class":…}`), read back
/// through [`DeviceWire`]: serde's `flatten` buffers every field into a map of its own first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "DeviceWire")]
pub struct Device {
    #[serde(flatten)]
    pub num: DevNum,
    pub class: Class,
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

#[derive(Deserialize)]
struct DeviceWire {
    #[serde(rename = "type")]
    typ: DevType,
    major: u32,
    minor: u32,
    class: Class,
    container_path: Option<PathBuf>,
    host_path: Option<PathBuf>,
    source: Source,
    #[serde(default)]
    file_mode: Option<u32>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
}

impl From<DeviceWire> for Device {
    fn from(w: DeviceWire) -> Device {
        Device {
            num: DevNum {
                typ: w.typ,
                major: w.major,
                minor: w.minor,
            },
            class: w.class,
            container_path: w.container_path,
            host_path: w.host_path,
            source: w.source,
            file_mode: w.file_mode,
            uid: w.uid,
            gid: w.gid,
        }
    }
}

impl Device {
    /// A device known by its host node alone, assigned to no container.
    pub(crate) fn on_host(num: DevNum, class: Class, host_path: Option<PathBuf>) -> Device {
        Device {
            num,
            class,
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
pub(crate) fn is_default_device(n: DevNum) -> bool {
    if n.typ != DevType::Char {
        return false;
    }
    matches!(
        (n.major, n.minor),
        (1, 3) | (1, 5) | (1, 7) | (1, 8) | (1, 9) | (5, 0) | (5, 1) | (5, 2) | (10, 200)
    ) || (136..=143).contains(&n.major)
}

/// A major or minor number from outside (a spec, an operator), checked against the
/// kernel's range.
pub(crate) fn check_number(what: &str, n: i64, max: i64, ctx: &str) -> Result<u32> {
    if (0..=max).contains(&n) {
        Ok(n as u32)
    } else {
        Err(Error::invalid(
            ctx,
            format!("{what} {n} out of range 0-{max}"),
        ))
    }
}

/// `/dev/nvidiaN` as `linux.devices` names it, for the unit tests of every stage.
#[cfg(test)]
impl Device {
    pub(crate) fn linux_gpu(minor: u32) -> Device {
        Device {
            num: DevNum {
                typ: DevType::Char,
                major: 195,
                minor,
            },
            class: Class::NvidiaGpu,
            container_path: Some(format!("/dev/nvidia{minor}").into()),
            host_path: None,
            source: Source::LinuxDevices,
            file_mode: None,
            uid: None,
            gid: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_reads_back_what_it_wrote() {
        let d = Device {
            file_mode: Some(0o666),
            gid: Some(0),
            ..Device::linux_gpu(3)
        };
        let text = serde_json::to_string(&d).unwrap();
        assert!(
            text.starts_with(r#"{"type":"c","major":195,"minor":3,"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Device>(&text).unwrap(), d);
        let missing = r#"{"type":"c","major":1,"class":"char","source":"host"}"#;
        let err = serde_json::from_str::<Device>(missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("minor"), "{err}");
    }
}
