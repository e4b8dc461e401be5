//! Shared test scaffolding: busybox bundles, devgate configs, and the real runtimes.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

pub fn devgate_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_devgate"))
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory for one test, mode 0755 as devgate's directory checks want.
pub fn tempdir(tag: &str) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let p = std::env::temp_dir().join(format!("dg-{tag}-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&p);
    fs::create_dir_all(&p).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    p
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Tests that need root say so and pass as skipped when run by a user; CI runs as root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::common::is_root() {
            eprintln!("skipped: needs root (CI runs as root)");
            return;
        }
    };
}

pub fn busybox() -> PathBuf {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("busybox-static is not installed (apt-get install busybox-static)");
}

/// A devgate test environment: its own state, quarantine and log under one temp dir.
pub struct Env {
    pub dir: PathBuf,
    pub config: PathBuf,
}

impl Env {
    pub fn new(tag: &str) -> Env {
        Env::with(tag, json!({}))
    }

    /// `extra` is merged over the test's paths: policy, spares, dev_root and the like.
    pub fn with(tag: &str, extra: Value) -> Env {
        let dir = tempdir(tag);
        let mut cfg = json!({
            "state_dir": dir.join("state"),
            "quarantine_dir": dir.join("quarantine"),
            "log_file": dir.join("log/decisions.jsonl"),
        });
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        let config = dir.join("config.json");
        fs::write(&config, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
        Env { dir, config }
    }

    pub fn devgate(&self, args: &[&str]) -> Output {
        Command::new(devgate_bin())
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .env_remove("DEVGATE_CONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.devgate(args);
        assert!(
            out.status.success(),
            "devgate {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log_lines(&self) -> Vec<Value> {
        fs::read_to_string(self.dir.join("log/decisions.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The hook entry runtimes run: devgate with this env's config.
    pub fn hook(&self, stage: &str) -> Value {
        json!({
            "path": devgate_bin(),
            "args": ["devgate", "--config", self.config, "hook", stage],
            "timeout": 10
        })
    }
}

/// An OCI bundle with a busybox rootfs.
pub struct Bundle {
    pub dir: PathBuf,
    pub spec: Value,
}

impl Bundle {
    pub fn new(tag: &str, args: &[&str]) -> Bundle {
        let dir = tempdir(tag);
        let rootfs = dir.join("rootfs");
        for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "out"] {
            fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        fs::copy(busybox(), rootfs.join("bin/busybox")).unwrap();
        for applet in [
            "sh", "cat", "echo", "ls", "test", "sleep", "touch", "dd", "mknod", "head", "stat",
            "id", "true", "false", "printf", "grep", "wc",
        ] {
            symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
        let spec = base_spec(args);
        Bundle { dir, spec }
    }

    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    pub fn add_device(&mut self, path: &str, typ: &str, major: u32, minor: u32) {
        self.spec["linux"]["devices"].as_array_mut().unwrap().push(
            json!({"path": path, "type": typ, "major": major, "minor": minor,
                          "fileMode": 0o666, "uid": 0, "gid": 0}),
        );
        self.spec["linux"]["resources"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(json!({"allow": true, "type": typ, "major": major, "minor": minor, "access": "rwm"}));
    }

    pub fn add_hooks(&mut self, env: &Env, stages: &[&str]) {
        for s in stages {
            let list = self.spec["hooks"][*s]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut list = list;
            list.push(env.hook(s));
            self.spec["hooks"][*s] = Value::Array(list);
        }
    }

    pub fn write(&self) {
        fs::write(
            self.dir.join("config.json"),
            serde_json::to_vec_pretty(&self.spec).unwrap(),
        )
        .unwrap();
    }

    /// The state a runtime would pass a hook for this bundle.
    pub fn state_json(&self, id: &str) -> String {
        json!({"ociVersion": "1.0.2", "id": id, "status": "creating", "pid": std::process::id(),
               "bundle": self.dir, "annotations": {}})
        .to_string()
    }

    pub fn marker(&self) -> PathBuf {
        self.rootfs().join("out/ran")
    }
}

/// The spec runc's `spec` command writes, trimmed to what a test container needs.
pub fn base_spec(args: &[&str]) -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin", "TERM=xterm"],
            "cwd": "/",
            "capabilities": {
                "bounding": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_MKNOD", "CAP_DAC_OVERRIDE"],
                "effective": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_MKNOD", "CAP_DAC_OVERRIDE"],
                "permitted": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_MKNOD", "CAP_DAC_OVERRIDE"]
            },
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": false},
        "hostname": "devgate-test",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]}
        ],
        "hooks": {},
        "linux": {
            "devices": [],
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "maskedPaths": ["/proc/kcore", "/sys/firmware"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd} >/dev/null 2>&1"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `runc run` (or crun) to completion, with its own state root so tests never meet the
/// node's containers.
pub fn runtime_run(runtime: &str, bundle: &Bundle, id: &str) -> Output {
    bundle.write();
    let root = bundle.dir.join("runtime-root");
    let mut cmd = Command::new(runtime);
    cmd.arg("--root").arg(&root);
    if runtime == "crun" {
        // crun refuses this machine's hybrid cgroup layout; the gate needs no cgroup.
        cmd.arg("--cgroup-manager=disabled");
    }
    let out = cmd
        .args(["run", "--bundle"])
        .arg(&bundle.dir)
        .arg(id)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // Best-effort cleanup of a container left behind by a failed start.
    let _ = Command::new(runtime)
        .arg("--root")
        .arg(&root)
        .args(["delete", "--force", id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    out
}

pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn unique_id(tag: &str) -> String {
    format!(
        "dg-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}
pub mod fake;
