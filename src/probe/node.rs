//! The device node probe: the host has a node for this device, of the right type and
//! major:minor. A GPU whose node vanished (driver unloaded, device removed) fails here.

use crate::model::device::{DevNum, Device};
use crate::model::verdict::{Code, Verdict};
use crate::probe::findings::{Findings, Probe};
use std::io;
use std::path::PathBuf;

pub struct NodeProbe {
    pub dev_root: PathBuf,
    /// Where the devices' host nodes come from ([`HostNodes`]).
    pub nodes: HostNodes,
}

/// Whether the devices the probes are given had their host nodes found just now by
/// discovery, in this same call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostNodes {
    /// Found by [`crate::discover::discover`] or [`crate::gpu::request::selected_gpu`] in
    /// this call: a `host_path` there is a node of the device's type and number below
    /// dev_root, as discovery stat'ed it (never through a link out of dev_root) moments ago,
    /// so the probe takes that stat instead of making it again.
    JustFound,
    /// From anywhere else (the config's spares, a walk of the node's accelerators): each
    /// node is stat'ed here.
    Unchecked,
}

impl Probe for NodeProbe {
    fn name(&self) -> &'static str {
        "node"
    }

    fn check(&self, device: &Device, found: &mut Findings) -> Verdict {
        let verdict = self.judge(device);
        // The start snapshot's "node present" is this stat's answer.
        found.node_present = Some(verdict == Verdict::Healthy);
        verdict
    }
}

impl NodeProbe {
    fn judge(&self, device: &Device) -> Verdict {
        let Some(host) = &device.host_path else {
            return Verdict::unhealthy(
                Code::NodeMissing,
                format!(
                    "no device node {} {} under {}",
                    device.num.typ.letter(),
                    device.num,
                    self.dev_root.display()
                ),
            );
        };
        // Discovery's stat is this probe's: it found the node below dev_root with this
        // type and number (`node_is`, or a bind source's own stat giving the number) in this
        // same process, microseconds before. A second stat would only narrow a window that
        // stays open anyway: whatever a link under dev_root points at after the probe,
        // the device judged is the number discovery read, and every later probe and the
        // record are about that number; a node removed after either stat is a later
        // start's to find. A node from elsewhere (a spare) is stat'ed here.
        if self.nodes == HostNodes::JustFound {
            return Verdict::Healthy;
        }
        match crate::discover::node_metadata(&self.dev_root, host) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Verdict::unhealthy(
                Code::NodeMissing,
                format!("device node {} is gone", host.display()),
            ),
            Err(e) => Verdict::unknown(
                Code::NodeUnreadable,
                format!("cannot stat {}: {e}", host.display()),
            ),
            Ok(meta) => match DevNum::from_metadata(&meta) {
                None => Verdict::unhealthy(
                    Code::NodeMismatch,
                    format!("{} is not a device node", host.display()),
                ),
                Some(n) if n.typ != device.num.typ => Verdict::unhealthy(
                    Code::NodeMismatch,
                    format!(
                        "{} is a {} device, expected {}",
                        host.display(),
                        n.typ.sysfs_dir(),
                        device.num.typ.sysfs_dir()
                    ),
                ),
                Some(n) if n != device.num => Verdict::unhealthy(
                    Code::NodeMismatch,
                    format!("{} is {}, expected {}", host.display(), n, device.num),
                ),
                Some(_) => Verdict::Healthy,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::{DevType, Source};

    fn dev(host: Option<&str>, major: u32, minor: u32) -> Device {
        Device {
            num: DevNum {
                typ: DevType::Char,
                major,
                minor,
            },
            class: "char".into(),
            container_path: Some("/dev/x".into()),
            host_path: host.map(PathBuf::from),
            source: Source::LinuxDevices,
            file_mode: None,
            uid: None,
            gid: None,
        }
    }

    #[test]
    fn checks_existence_type_and_number() {
        let p = NodeProbe {
            dev_root: "/dev".into(),
            nodes: HostNodes::Unchecked,
        };
        assert_eq!(
            p.check(&dev(Some("/dev/null"), 1, 3), &mut Findings::default()),
            Verdict::Healthy
        );
        assert_eq!(
            p.check(&dev(Some("/dev/null"), 1, 5), &mut Findings::default()),
            Verdict::unhealthy(Code::NodeMismatch, "/dev/null is 1:3, expected 1:5")
        );
        assert_eq!(
            p.check(
                &dev(Some("/nonexistent/nvidia9"), 195, 9),
                &mut Findings::default()
            ),
            Verdict::unhealthy(
                Code::NodeMissing,
                "device node /nonexistent/nvidia9 is gone"
            )
        );
        assert_eq!(
            p.check(&dev(Some("/etc/hostname"), 1, 3), &mut Findings::default()),
            Verdict::unhealthy(Code::NodeMismatch, "/etc/hostname is not a device node")
        );
        assert_eq!(
            p.check(&dev(None, 195, 9), &mut Findings::default()),
            Verdict::unhealthy(Code::NodeMissing, "no device node c 195:9 under /dev")
        );
    }

    /// After discovery in the same call the node probe takes discovery's stat (it found a
    /// node of this number below dev_root, or none): it stats nothing itself, and a device
    /// discovery found no node for is still unhealthy.
    #[test]
    fn after_discovery_the_probe_takes_its_stat() {
        let p = NodeProbe {
            dev_root: "/nonexistent".into(),
            nodes: HostNodes::JustFound,
        };
        let mut found = Findings::default();
        assert_eq!(
            p.check(&dev(Some("/nonexistent/nvidia9"), 195, 9), &mut found),
            Verdict::Healthy,
            "stat'ed the node discovery had just found"
        );
        assert_eq!(found.node_present, Some(true));
        assert_eq!(
            p.check(&dev(None, 195, 9), &mut found),
            Verdict::unhealthy(
                Code::NodeMissing,
                "no device node c 195:9 under /nonexistent"
            )
        );
        assert_eq!(found.node_present, Some(false));
    }

    /// A node not found by discovery in the same call (a spare, poststop's) is stat'ed here,
    /// and a symlink under dev_root pointing out of it (in /dev/shm, writable by all) is not
    /// followed.
    #[test]
    fn a_symlink_under_dev_root_is_not_followed_out_of_it() {
        let d = std::env::temp_dir().join(format!("devgate-nodeprobe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("shm")).unwrap();
        std::os::unix::fs::symlink("/dev/null", d.join("shm/null")).unwrap();
        let p = NodeProbe {
            dev_root: d.clone(),
            nodes: HostNodes::Unchecked,
        };
        let host = d.join("shm/null");
        let v = p.check(&dev(host.to_str(), 1, 3), &mut Findings::default());
        assert_ne!(
            v,
            Verdict::Healthy,
            "the stat followed the link out of dev_root"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
