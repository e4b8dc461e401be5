//! A stand-in for a container at prestart, without a runtime: a sleeping process in its own
//! mount namespace (a tmpfs on ROOTFS/dev holding the container's /dev/zero) and its own v1
//! devices cgroup that allows c 1:5 the way runc's would.

use super::tempdir;
use serde_json::json;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub struct FakeContainer {
    pub id: String,
    pub bundle: PathBuf,
    pub cgroup: PathBuf,
    pub child: Child,
}

pub const DEVICES_ROOT: &str = "/sys/fs/cgroup/devices";

pub fn have_v1_devices() -> bool {
    Path::new(DEVICES_ROOT).join("devices.allow").exists()
}

impl FakeContainer {
    pub fn new(id: &str) -> FakeContainer {
        let bundle = tempdir(&format!("fake-{id}"));
        let rootfs = bundle.join("rootfs");
        fs::create_dir_all(rootfs.join("dev")).unwrap();
        let spec = json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "linux": {
                "devices": [{"path": "/dev/zero", "type": "c", "major": 1, "minor": 5,
                             "fileMode": 0o666, "uid": 0, "gid": 0}],
                "resources": {"devices": [{"allow": false, "access": "rwm"},
                    {"allow": true, "type": "c", "major": 1, "minor": 5, "access": "rwm"}]}
            }
        });
        fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let cgroup = Path::new(DEVICES_ROOT).join(format!("dg-fake-{id}"));
        let _ = fs::remove_dir(&cgroup);
        fs::create_dir(&cgroup).unwrap();
        fs::write(cgroup.join("devices.deny"), "a").unwrap();
        for r in ["c 1:3 rwm", "c 1:5 rwm", "c *:* m"] {
            fs::write(cgroup.join("devices.allow"), r).unwrap();
        }
        let script = format!(
            "mount -t tmpfs -o mode=755 tmpfs {r}/dev && mknod -m 666 {r}/dev/zero c 1 5 && echo ready && exec sleep 600",
            r = rootfs.display()
        );
        let mut child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "fake container {id} did not start");
        fs::write(cgroup.join("cgroup.procs"), child.id().to_string()).unwrap();
        FakeContainer {
            id: id.to_string(),
            bundle,
            cgroup,
            child,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn state_json(&self) -> String {
        json!({"ociVersion": "1.0.2", "id": self.id, "status": "creating", "pid": self.pid(),
               "bundle": self.bundle})
        .to_string()
    }

    /// The container's /dev/zero as seen inside its mount namespace: (major, minor).
    pub fn node(&self) -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        let p = format!(
            "/proc/{}/root{}/dev/zero",
            self.pid(),
            self.bundle.join("rootfs").display()
        );
        let m = fs::symlink_metadata(&p).unwrap();
        (libc::major(m.rdev()), libc::minor(m.rdev()))
    }

    pub fn devices_list(&self) -> String {
        fs::read_to_string(self.cgroup.join("devices.list")).unwrap()
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for _ in 0..50 {
            if fs::remove_dir(&self.cgroup).is_ok() || !self.cgroup.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = fs::remove_dir_all(&self.bundle);
    }
}
