//! Shared test scaffolding: busybox bundles, devgate configs, and the real runtimes.
#![allow(dead_code)]

pub mod fake_nvml;
pub mod node;

pub use node::{Node, Runtime};

use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

pub fn devgate_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_devgate"))
}

/// The runtime wrapper as the packages install it: a program of its own, linked
/// statically, that hands a create with devices to the devgate beside it.
pub fn devgate_runtime_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_devgate-runtime"))
}

/// The hook front the shipped hook files run: linked statically, it gates containers
/// without NVIDIA devices itself and hands the rest to the devgate beside it.
pub fn devgate_hook_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_devgate-hook"))
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

#[path = "../../src/fsutil/test_dirs.rs"]
mod test_dirs;
#[allow(unused_imports)] // only tests/test_dirs.rs uses them
pub use test_dirs::{mount_points, remove_tree, KEEP_ENV};

/// A fresh directory for one test, mode 0755 as devgate's directory checks want; removed
/// when the test process exits (`src/fsutil/test_dirs.rs`).
pub fn tempdir(tag: &str) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let p = std::env::temp_dir().join(format!("dg-{tag}-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&p);
    fs::create_dir_all(&p).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    test_dirs::remove_at_exit(&p);
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
    panic!("busybox-static is not installed: make test installs it (scripts/install-test-deps.sh)");
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

    /// `devgate hook STAGE` as a runtime starts it, all three streams piped.
    pub fn hook_cmd(&self, stage: &str) -> Command {
        self.hook_cmd_on(Node::Host, stage)
    }

    /// `devgate hook STAGE` as a runtime on `node` starts it.
    pub fn hook_cmd_on(&self, node: Node, stage: &str) -> Command {
        let mut c = node.command(devgate_bin());
        c.arg("--config")
            .arg(&self.config)
            .args(["hook", stage])
            .env_remove("DEVGATE_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// `devgate hook STAGE` with `stdin` as the runtime's state. A writer thread feeds it:
    /// devgate stops reading at its bound, which must not deadlock the test.
    pub fn hook_stdin(&self, stage: &str, stdin: &[u8]) -> Output {
        use std::io::Write;
        let mut child = self.hook_cmd(stage).spawn().unwrap();
        let mut pipe = child.stdin.take().unwrap();
        let data = stdin.to_vec();
        let w = std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
        let out = child.wait_with_output().unwrap();
        w.join().unwrap();
        out
    }

    /// The start decisions only (prestart / createRuntime lines), without poststop's.
    pub fn decisions(&self) -> Vec<Value> {
        self.log_lines()
            .into_iter()
            .filter(|l| l["stage"] != "poststop")
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
/// node's containers: runc on this host, crun on the v2 node without cgroups.
pub fn runtime_run(runtime: &str, bundle: &Bundle, id: &str) -> Output {
    runtime_run_on(Runtime::named(runtime), bundle, id)
}

/// `run` under `rt` to completion; whatever a failed start left is deleted.
pub fn runtime_run_on(rt: Runtime, bundle: &Bundle, id: &str) -> Output {
    bundle.write();
    let root = bundle.dir.join("runtime-root");
    let out = rt
        .command(&root)
        .args(["run", "--bundle"])
        .arg(&bundle.dir)
        .arg(id)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = rt
        .command(&root)
        .args(["delete", "--force", id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    out
}

/// A `runc run` in the background, for tests that act while the container runs.
pub struct Running {
    child: std::process::Child,
    root: PathBuf,
    pub id: String,
}

impl Running {
    pub fn start(bundle: &Bundle, id: &str) -> Running {
        bundle.write();
        let root = bundle.dir.join("runtime-root");
        let child = Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["run", "--bundle"])
            .arg(&bundle.dir)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Running {
            child,
            root,
            id: id.to_string(),
        }
    }

    /// Waits for the container to exit, then deletes what runc left.
    pub fn wait(self) -> Output {
        let out = self.child.wait_with_output().unwrap();
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&self.root)
            .args(["delete", "--force", &self.id])
            .output();
        out
    }
}

/// Polls `cond` every 50 ms for up to 20 s.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
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

// ---- Runtimes installed from packages (podman, containerd): tests/e2e_podman.rs,
// ---- tests/e2e_containerd.rs, tests/e2e_cri.rs.

/// A runtime binary these tests need: missing is a failure, not a skip, because CI must
/// prove the shipped configuration against the real software.
pub fn require_cmd(cmd: &str, package: &str) {
    assert!(
        have(cmd),
        "{cmd} is not installed: make test installs it (scripts/install-test-deps.sh; apt-get install {package})"
    );
}

/// A tarball of a busybox rootfs, for `podman import`: no registry is reachable.
pub fn busybox_rootfs_tar(dir: &Path) -> PathBuf {
    let rootfs = dir.join("image-rootfs");
    for d in ["bin", "dev", "proc", "sys", "tmp", "etc", "run", "out"] {
        fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    fs::copy(busybox(), rootfs.join("bin/busybox")).unwrap();
    for applet in [
        "sh", "cat", "echo", "ls", "test", "sleep", "true", "false", "printf",
    ] {
        symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    let tar = dir.join("busybox-rootfs.tar");
    let out = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .output()
        .unwrap();
    assert!(out.status.success(), "tar: {}", text(&out));
    tar
}

/// The image name every runtime test imports; its default command sleeps, so it can also
/// serve as CRI's sandbox ("pause") image.
pub const TEST_IMAGE: &str = "localhost/devgate-busybox:test";

/// Host directories podman, containerd and their shims write to whatever their
/// configuration says: runc's default root and podman's lock files (/run/runc, /run/libpod),
/// containerd's shim sockets and IO FIFOs (/run/containerd/s, /run/containerd/fifo),
/// podman's image copies and blob cache (/var/tmp, /var/lib/containers/cache).
const RUNTIME_SCRATCH: [&str; 3] = ["/run", "/var/tmp", "/var/lib/containers"];

/// `program` in a private mount namespace where each of RUNTIME_SCRATCH is a fresh tmpfs,
/// so that a runtime daemon or client started by a test leaves nothing in the host's real
/// directories. The test's own files are under the temp dir, which stays shared (a
/// RUNTIME_SCRATCH entry that holds it is left alone); mounts made inside stay inside.
pub fn in_private_mounts(program: &str) -> Command {
    let tmp = std::env::temp_dir();
    let dirs: Vec<&str> = RUNTIME_SCRATCH
        .into_iter()
        .filter(|d| Path::new(d).is_dir() && !tmp.starts_with(d))
        .collect();
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            r#"for d in {}; do mount -t tmpfs -o mode=1777 tmpfs "$d" || exit 1; done; exec "$0" "$@""#,
            dirs.join(" ")
        ))
        .arg(program);
    cmd
}

/// Rootful podman with its own storage and config under one temp dir, runc as runtime, in
/// a private mount namespace per call (`in_private_mounts`).
pub struct Podman {
    pub dir: PathBuf,
}

impl Podman {
    pub fn new(tag: &str) -> Podman {
        require_cmd("podman", "podman");
        require_cmd("runc", "runc");
        let dir = tempdir(tag);
        // This machine's podman needs default_ulimits = []; there is no systemd. The CNI
        // config dir is the test's, so that podman's CNI lock stays out of /etc/cni. On a
        // unified node without the pids controller podman's default pids limit cannot be
        // set: pids_limit = 0 sets none.
        let pids = if node::unified_without("pids").is_some() {
            "pids_limit = 0\n"
        } else {
            ""
        };
        fs::write(
            dir.join("containers.conf"),
            format!(
                "[containers]\ndefault_ulimits = []\n{pids}[engine]\ncgroup_manager = \"cgroupfs\"\n\
                 events_logger = \"file\"\ntmp_dir = \"{tmp}\"\n[network]\nnetwork_config_dir = \"{cni}\"\n",
                tmp = dir.join("libpod-tmp").display(),
                cni = dir.join("cni").display(),
            ),
        )
        .unwrap();
        let p = Podman { dir };
        let tar = busybox_rootfs_tar(&p.dir);
        let out = p
            .cmd()
            .args(["import", "--change", r#"CMD ["/bin/sleep", "3600"]"#])
            .arg(&tar)
            .arg(TEST_IMAGE)
            .output()
            .unwrap();
        assert!(out.status.success(), "podman import: {}", text(&out));
        p
    }

    pub fn cmd(&self) -> Command {
        self.cmd_with_runtime(Path::new("runc"))
    }

    /// podman with `--runtime RUNTIME` (a name or a path).
    pub fn cmd_with_runtime(&self, runtime: &Path) -> Command {
        let mut c = in_private_mounts("podman");
        c.env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("runroot"))
            .args(["--storage-driver", "vfs", "--runtime"])
            .arg(runtime)
            .stdin(Stdio::null());
        c
    }

    /// `podman run --rm` with devgate's hooks from `hooks_dir`, no network.
    pub fn run(&self, hooks_dir: &Path, extra: &[&str], command: &[&str]) -> Output {
        self.cmd()
            .arg("--hooks-dir")
            .arg(hooks_dir)
            .args(["run", "--rm", "--network", "none"])
            .args(extra)
            .arg(TEST_IMAGE)
            .args(command)
            .output()
            .unwrap()
    }

    /// The image as a docker archive, for `ctr images import`.
    pub fn save(&self, dest: &Path) {
        self.save_image(dest, TEST_IMAGE);
    }

    /// `image` of this podman's store, as a docker archive at `dest`.
    pub fn save_image(&self, dest: &Path, image: &str) {
        let out = self
            .cmd()
            .args(["save", "--format", "docker-archive", "-o"])
            .arg(dest)
            .arg(image)
            .output()
            .unwrap();
        assert!(out.status.success(), "podman save: {}", text(&out));
    }
}

/// Writes a shell wrapper that records each call (its arguments and the state on stdin)
/// in `trace`, then runs `real` with the same arguments and input. It is written under the
/// hook front's name (`devgate-hook`) in `dir`: hook files generated with `--bin` naming
/// the returned path (`dir/devgate`, which need not exist) run it, and show which stages a
/// runtime really ran.
pub fn tracing_wrapper(dir: &Path, real: &Path) -> (PathBuf, PathBuf) {
    let trace = dir.join("hook-trace.log");
    let wrapper = dir.join("devgate-hook");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nstate=$(cat)\nprintf '%s %s\\n' \"$*\" \"$state\" >> '{}'\n\
             printf '%s' \"$state\" | exec '{}' \"$@\"\n",
            trace.display(),
            real.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    (dir.join("devgate"), trace)
}

/// The calls the tracing wrapper saw for a container id, as `ARG/STATUS`: the stage
/// argument devgate was given and the state's status (`auto/creating`, `auto/stopped`).
pub fn traced_stages(trace: &Path, id: &str) -> Vec<String> {
    fs::read_to_string(trace)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&format!("\"id\":\"{id}\"")))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "hook")?;
            let status = l.split("\"status\":\"").nth(1)?.split('"').next()?;
            words.get(i + 1).map(|s| format!("{s}/{status}"))
        })
        .collect()
}

/// The containerd base runtime spec `hooks-config` generates for the test build and `env`.
pub fn containerd_base_spec_for(env: &Env) -> String {
    hooks_config(&[
        "--config",
        env.config.to_str().unwrap(),
        "hooks-config",
        "--runtime",
        "containerd",
        "--bin",
        devgate_bin().to_str().unwrap(),
    ])
}

/// `devgate hooks-config` with the test binary; returns what it printed.
pub fn hooks_config(args: &[&str]) -> String {
    let out = Command::new(devgate_bin())
        .args(args)
        .env_remove("DEVGATE_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "devgate {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A private containerd: its own root, state, sockets and config under one temp dir, in its
/// own mount namespace (`in_private_mounts`), killed (and its mounts undone) when dropped.
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    child: std::process::Child,
}

impl Containerd {
    /// `extra` is appended to the config (plugin sections); `top` goes before any table.
    pub fn start(tag: &str, top: &str, extra: &str) -> Containerd {
        Containerd::start_under(tag, top, extra, &[])
    }

    /// As `start`, run through `under` (a command that ends by exec'ing its arguments:
    /// `unshare ... sh -c '...; exec "$0" "$@"'`), so that containerd, its shims and the
    /// runtimes see what it set up.
    pub fn start_under(tag: &str, top: &str, extra: &str, under: &[&str]) -> Containerd {
        require_cmd("containerd", "containerd");
        require_cmd("ctr", "containerd");
        require_cmd("containerd-shim-runc-v2", "containerd");
        let dir = tempdir(tag);
        let socket = dir.join("c.sock");
        let config = format!(
            "{top}\nroot = \"{root}\"\nstate = \"{state}\"\n\n[grpc]\n  address = \"{sock}\"\n\n\
             [ttrpc]\n  address = \"{sock}.ttrpc\"\n\n[debug]\n  address = \"\"\n\n\
             [metrics]\n  address = \"\"\n\n{extra}\n",
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            sock = socket.display(),
        );
        fs::write(dir.join("config.toml"), &config).unwrap();
        Containerd::start_on_config(&dir, &dir.join("config.toml"), &socket, under)
    }

    /// containerd on a config file the test wrote itself (`config`, its path as `under`
    /// sees it), whose `[grpc] address` is `socket`; its log goes to `dir/containerd.log`.
    /// For tests that stop and start containerd on one config (an installer edits it), as
    /// an operator restarts it on a node without systemd.
    pub fn start_on_config(dir: &Path, config: &Path, socket: &Path, under: &[&str]) -> Containerd {
        require_cmd("containerd", "containerd");
        require_cmd("ctr", "containerd");
        let log = fs::File::create(dir.join("containerd.log")).unwrap();
        // `under` runs first and execs the private-mounts wrapper, which execs containerd.
        let private = in_private_mounts("containerd");
        let mut cmd = match under.split_first() {
            Some((prog, args)) => {
                let mut c = Command::new(prog);
                c.args(args)
                    .arg(private.get_program())
                    .args(private.get_args());
                c
            }
            None => private,
        };
        let child = cmd
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut c = Containerd {
            dir: dir.to_path_buf(),
            socket: socket.to_path_buf(),
            child,
        };
        for _ in 0..400 {
            if c.ctr("default", &["version"]).status.success() {
                return c;
            }
            if let Ok(Some(st)) = c.child.try_wait() {
                panic!("containerd exited ({st}): {}", c.log());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("containerd did not come up: {}", c.log());
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// ctr inside containerd's mount namespace: its IO FIFOs and image mounts must be where
    /// containerd and the shims see them.
    pub fn ctr(&self, namespace: &str, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--mount=/proc/{}/ns/mnt", self.child.id()))
            .arg("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", namespace])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    pub fn ctr_ok(&self, namespace: &str, args: &[&str]) -> String {
        let out = self.ctr(namespace, args);
        assert!(out.status.success(), "ctr {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Imports the busybox test image (built by podman) into `namespace`.
    pub fn import_test_image(&self, namespace: &str) {
        let podman = Podman::new("img");
        let archive = podman.dir.join("image.tar");
        podman.save(&archive);
        self.ctr_ok(namespace, &["images", "import", archive.to_str().unwrap()]);
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        unmount_under(&self.dir);
    }
}

/// Lazily unmounts everything mounted under `dir`, deepest first.
pub fn unmount_under(dir: &Path) {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
    }
}
pub mod boot;
pub mod cri;
pub mod fake;
pub mod k8s;
pub mod wrapper;

/// `cmd`'s output, with `input` on its standard input.
pub fn output_with_input(cmd: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// `cmd`'s output. A program a test has just written can be busy for a moment (ETXTBSY):
/// another test thread that forks while the file is still open for writing holds a copy of
/// that descriptor until its child execs. Such a spawn is tried again, a few times.
pub fn output_of(cmd: &mut Command) -> Output {
    let mut tries = 0;
    loop {
        match cmd.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other.unwrap(),
        }
    }
}
