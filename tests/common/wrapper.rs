//! The runtime wrapper under test: the `devgate-runtime` program (as packages install it,
//! handing a create with devices to the devgate beside it), a remap environment, and a probe that shows which devices the container's device
//! cgroup lets it open.
//!
//! The devices are /dev/fuse (10:229, "bad") and /dev/loop-control (10:237, the spare):
//! neither is among the devices runc and crun allow every container, so the device cgroup
//! alone decides whether the container may open them (with /dev/zero and /dev/full, the
//! runtime's own default rules would allow both whatever the spec says).

use super::{devgate_runtime_bin, tempdir, text, Bundle, Env};
use serde_json::json;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const BAD: &str = "/dev/fuse";
pub const BAD_NUM: (u32, u32) = (10, 229);
pub const SPARE: &str = "/dev/loop-control";
pub const SPARE_NUM: (u32, u32) = (10, 237);

/// Whether this kernel has both devices; the remap tests need them.
pub fn have_devices() -> bool {
    let is = |p: &str, n: (u32, u32)| {
        fs::metadata(p).is_ok_and(|m| {
            m.file_type().is_char_device() && (libc::major(m.rdev()), libc::minor(m.rdev())) == n
        })
    };
    let ok = is(BAD, BAD_NUM) && is(SPARE, SPARE_NUM);
    if !ok {
        eprintln!("skipped: the kernel has no {BAD} {BAD_NUM:?} or {SPARE} {SPARE_NUM:?}");
    }
    ok
}

/// `devgate-runtime` linked into `dir`: what containerd's BinaryName, CRI-O's
/// runtime_path and podman's --runtime name.
pub fn runtime_link(dir: &Path) -> PathBuf {
    let link = dir.join("devgate-runtime");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(devgate_runtime_bin(), &link).unwrap();
    link
}

/// An environment whose policy remaps the "char" class (both devices are in it), with
/// the spare configured, `runtime.path` the real runtime, and the bad device cordoned.
pub fn remap_env(tag: &str, runtime: &str) -> Env {
    let env = Env::with(
        tag,
        json!({"policy": {"classes": {"char": "remap"}}, "spares": {"char": [SPARE]},
               "runtime": {"path": runtime}}),
    );
    env.ok(&["cordon", BAD, "--reason", "wrapper test"]);
    env
}

/// What the container prints about its devices: the node at BAD's path, and whether the
/// container may open that node, a node it makes for the bad device and one for the spare
/// (mknod is allowed: runtimes grant `c *:* m` after the spec's rules). busybox by its
/// full name: images have few applet links.
pub const PROBE: &str = "\
busybox mknod /tmp/bad c 10 229 2>/dev/null; busybox mknod /tmp/spare c 10 237 2>/dev/null; \
busybox stat -c 'node=%t:%T' /dev/fuse; \
if busybox head -c0 </dev/fuse 2>/dev/null; then echo dev=ok; else echo dev=denied; fi; \
if busybox head -c0 </tmp/bad 2>/dev/null; then echo bad=ok; else echo bad=denied; fi; \
if busybox head -c0 </tmp/spare 2>/dev/null; then echo spare=ok; else echo spare=denied; fi";

/// A bundle with BAD assigned (linux.devices and an allow rule, as CRI does).
pub fn bundle(tag: &str, args: &[&str]) -> Bundle {
    let mut b = Bundle::new(tag, args);
    b.add_device(BAD, "c", BAD_NUM.0, BAD_NUM.1);
    b
}

/// The PROBE's answers as `key=value` pairs.
pub fn probe_says(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| {
            ["node=", "dev=", "bad=", "spare="]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(String::from)
        .collect()
}

/// What a remapped container must say: its /dev/fuse is the spare's node and opens, the
/// bad device is denied, the spare allowed.
pub fn remapped() -> Vec<String> {
    vec![
        format!("node={:x}:{:x}", SPARE_NUM.0, SPARE_NUM.1),
        "dev=ok".into(),
        "bad=denied".into(),
        "spare=ok".into(),
    ]
}

/// What a container that was not remapped says.
pub fn not_remapped() -> Vec<String> {
    vec![
        format!("node={:x}:{:x}", BAD_NUM.0, BAD_NUM.1),
        "dev=ok".into(),
        "bad=ok".into(),
        "spare=denied".into(),
    ]
}

/// The wrapper as a shim runs it: `devgate-runtime --root R --log L --log-format json ...`
/// with devgate's config from DEVGATE_CONFIG (a link takes no --config).
pub struct Wrapper {
    pub link: PathBuf,
    pub config: PathBuf,
    pub root: PathBuf,
    pub log: PathBuf,
}

impl Wrapper {
    pub fn new(env: &Env) -> Wrapper {
        let dir = tempdir("wrapper");
        Wrapper {
            link: runtime_link(&dir),
            config: env.config.clone(),
            root: dir.join("runtime-root"),
            log: dir.join("log.json"),
        }
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.link);
        c.env("DEVGATE_CONFIG", &self.config)
            .env_remove("DEVGATE_RUNTIME_WRAPPED")
            .arg("--root")
            .arg(&self.root)
            .arg("--log")
            .arg(&self.log)
            .args(["--log-format", "json"])
            .args(args)
            .stdin(Stdio::null());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The runtime's log entries, as the shim reads them.
    pub fn log_entries(&self) -> Vec<serde_json::Value> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// The leases in an environment's state, as (container id, replaces minor, spare minor).
pub fn leases(env: &Env) -> Vec<(String, u32, u32)> {
    devgate::store::lease::Leases::new(&env.dir.join("state"))
        .list()
        .unwrap()
        .into_iter()
        .filter_map(|(_, s)| match s {
            devgate::store::lease::Slot::Held(l) => {
                Some((l.container_id, l.replaces.minor, l.spare.minor))
            }
            _ => None,
        })
        .collect()
}
