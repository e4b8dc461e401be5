//! The device node probe: the host has a node for this device, of the right type and
//! major:minor. A GPU whose node vanished (driver unloaded, device removed) fails here.

use crate::model::device::{DevNum, Device};
use crate::model::verdict::Verdict;
use crate::probe::{Findings, Probe};
use std::io;
use std::path::PathBuf;

pub struct NodeProbe {
    pub dev_root: PathBuf,
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
            return Verdict::Unhealthy(format!(
                "no device node {} {} under {}",
                device.num.typ.letter(),
                device.num,
                self.dev_root.display()
            ));
        };
        // Stat'ed again, not trusted from discovery: a link under dev_root may have been
        // repointed since.
        match crate::discover::node_metadata(&self.dev_root, host) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Verdict::Unhealthy(format!("device node {} is gone", host.display()))
            }
            Err(e) => Verdict::Unknown(format!("cannot stat {}: {e}", host.display())),
            Ok(meta) => match DevNum::from_metadata(&meta) {
                None => Verdict::Unhealthy(format!("{} is not a device node", host.display())),
                Some(n) if n.typ != device.num.typ => Verdict::Unhealthy(format!(
                    "{} is a {} device, expected {}",
                    host.display(),
                    n.typ.sysfs_dir(),
                    device.num.typ.sysfs_dir()
                )),
                Some(n) if n != device.num => Verdict::Unhealthy(format!(
                    "{} is {}, expected {}",
                    host.display(),
                    n,
                    device.num
                )),
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
        };
        assert_eq!(
            p.check(&dev(Some("/dev/null"), 1, 3), &mut Findings::default()),
            Verdict::Healthy
        );
        assert_eq!(
            p.check(&dev(Some("/dev/null"), 1, 5), &mut Findings::default()),
            Verdict::Unhealthy("/dev/null is 1:3, expected 1:5".into())
        );
        assert_eq!(
            p.check(
                &dev(Some("/nonexistent/nvidia9"), 195, 9),
                &mut Findings::default()
            ),
            Verdict::Unhealthy("device node /nonexistent/nvidia9 is gone".into())
        );
        assert_eq!(
            p.check(&dev(Some("/etc/hostname"), 1, 3), &mut Findings::default()),
            Verdict::Unhealthy("/etc/hostname is not a device node".into())
        );
        assert_eq!(
            p.check(&dev(None, 195, 9), &mut Findings::default()),
            Verdict::Unhealthy("no device node c 195:9 under /dev".into())
        );
    }

    /// The node found at discovery is stat'ed again here: a symlink under dev_root that
    /// someone repointed out of it in between (in /dev/shm, writable by all) is not followed.
    #[test]
    fn a_symlink_under_dev_root_is_not_followed_out_of_it() {
        let d = std::env::temp_dir().join(format!("devgate-nodeprobe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("shm")).unwrap();
        std::os::unix::fs::symlink("/dev/null", d.join("shm/null")).unwrap();
        let p = NodeProbe {
            dev_root: d.clone(),
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
