//! A stand-in for a container at prestart, without a runtime: a sleeping process in its own
//! mount namespace (a tmpfs on ROOTFS/dev holding the container's /dev/zero) and its own
//! device cgroup that allows c 1:5 the way runc's would: on the host node a v1 devices
//! cgroup, on the v2 node a cgroup2 cgroup with a runc-like device program attached.

use super::node::Node;
use super::tempdir;
use serde_json::json;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub struct FakeContainer {
    pub id: String,
    pub node: Node,
    pub bundle: PathBuf,
    /// The container's cgroup as this process sees it.
    pub cgroup: PathBuf,
    pub child: Child,
}

pub const DEVICES_ROOT: &str = "/sys/fs/cgroup/devices";

pub fn have_v1_devices() -> bool {
    Path::new(DEVICES_ROOT).join("devices.allow").exists()
}

/// have_v1_devices, saying why a test skips when it is false (a unified node).
pub fn v1_devices_or_skip() -> bool {
    let have = have_v1_devices();
    if !have {
        eprintln!("skipped: no v1 devices controller at {DEVICES_ROOT} (a unified node)");
    }
    have
}

/// The rules runc gives a container granted /dev/zero, in short: deny all, /dev/null,
/// /dev/zero, mknod of any char device.
fn runc_like_rules() -> Vec<oci_spec::runtime::LinuxDeviceCgroup> {
    serde_json::from_value(json!([
        {"allow": false, "access": "rwm"},
        {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
        {"allow": true, "type": "c", "major": 1, "minor": 5, "access": "rwm"},
        {"allow": true, "type": "c", "access": "m"}
    ]))
    .unwrap()
}

impl FakeContainer {
    pub fn new(id: &str) -> FakeContainer {
        FakeContainer::on(Node::Host, id)
    }

    pub fn on(node: Node, id: &str) -> FakeContainer {
        let bundle = tempdir(&format!("fake-{id}"));
        let rootfs = bundle.join("rootfs");
        fs::create_dir_all(rootfs.join("dev")).unwrap();
        let name = format!("dg-fake-{id}");
        let spec = json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "linux": {
                "cgroupsPath": format!("/{name}"),
                "devices": [{"path": "/dev/zero", "type": "c", "major": 1, "minor": 5,
                             "fileMode": 0o666, "uid": 0, "gid": 0}],
                "resources": {"devices": [{"allow": false, "access": "rwm"},
                    {"allow": true, "type": "c", "major": 1, "minor": 5, "access": "rwm"}]}
            }
        });
        fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let cgroup = match node {
            Node::Host => Path::new(DEVICES_ROOT).join(&name),
            Node::V2 => Node::cgroup2_root().join(&name),
        };
        let _ = fs::remove_dir(&cgroup);
        fs::create_dir(&cgroup).unwrap();
        match node {
            Node::Host => {
                fs::write(cgroup.join("devices.deny"), "a").unwrap();
                for r in ["c 1:3 rwm", "c 1:5 rwm", "c *:* m"] {
                    fs::write(cgroup.join("devices.allow"), r).unwrap();
                }
            }
            Node::V2 => {
                devgate::action::cgroup::v2::attach_new(&cgroup, &runc_like_rules()).unwrap()
            }
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
            node,
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

    /// Whether a process in the container's device cgroup may open the host node `dev`
    /// for reading and writing: the kernel's answer, on either node shape.
    pub fn opens(&self, dev: &str) -> bool {
        let out = Command::new("sh")
            .args(["-c", r#"echo $$ > "$0" && true <> "$1""#])
            .arg(self.cgroup.join("cgroup.procs"))
            .arg(dev)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || err.contains("Operation not permitted"),
            "opening {dev} in {}: {err}",
            self.cgroup.display()
        );
        out.status.success()
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
