//! `devgate doctor` against real configurations: oci-hooks directories written by
//! `devgate hooks-config` (what podman reads), and containerd configurations read through
//! the real `containerd config dump` (no daemon needed), wired and not; an unsafe directory;
//! a config that does not parse; and a GPU node through the fake NVML.
//!
//! Each test gives doctor a PATH holding only the runtimes it means to be found, so the
//! lines do not depend on what else the machine has installed.

mod common;
use common::fake_nvml::{self, GpuNode};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A node for doctor: a devgate config under a temp dir, a kernel log file, a kubelet
/// directory of its own, and a PATH directory with the runtimes the test names.
struct Node {
    env: Env,
    path_dir: PathBuf,
    kmsg: PathBuf,
}

/// doctor's exit status and lines; it writes nothing to stderr.
fn doctor_lines(out: std::process::Output) -> (i32, Vec<String>) {
    assert!(
        out.stderr.is_empty(),
        "doctor wrote to stderr: {}",
        text(&out)
    );
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    (out.status.code().unwrap(), lines)
}

/// `cmd` in a private mount namespace whose /usr/share/containers is a copy of the host's
/// with `hook` added in oci/hooks.d: podman's and CRI-O's default hooks directory, where
/// install-host and the packages put devgate's hook, and where a test may not write.
fn with_hook_in_package_dir(cmd: &Command, hook: &Path, save: &Path) -> Command {
    // `cmd` may set its own PATH (doctor's names only the runtimes): the setup uses the
    // system's, and `cmd` gets its own back.
    let mut c = Command::new("/usr/bin/unshare");
    c.args(["--mount", "--propagation", "private", "/bin/sh", "-c"])
        .arg(
            r#"p=$PATH; PATH=/usr/sbin:/usr/bin:/sbin:/bin; d=/usr/share/containers
            mkdir -p "$2" && cp -a "$d/." "$2/" &&
            mount -t tmpfs -o mode=0755 tmpfs "$d" && cp -a "$2/." "$d/" &&
            mkdir -p "$d/oci/hooks.d" && cp "$1" "$d/oci/hooks.d/" || exit 97
            PATH=$p; shift 2; exec "$0" "$@""#,
        )
        .arg(cmd.get_program())
        .arg(hook)
        .arg(save)
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

impl Node {
    fn new(tag: &str, runtimes: &[&str], extra: Value) -> Node {
        let env = Env::new(tag);
        let kmsg = env.dir.join("kmsg");
        fs::write(&kmsg, "").unwrap();
        let mut cfg: Value = serde_json::from_slice(&fs::read(&env.config).unwrap()).unwrap();
        cfg["nvml_library"] = json!("/nonexistent/libnvidia-ml.so.1");
        cfg["kmsg_path"] = json!(kmsg);
        cfg["dev_root"] = json!(env.dir.join("dev"));
        cfg["kubelet_pods_dir"] = json!(env.dir.join("kubelet/pods"));
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        fs::write(&env.config, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
        fs::create_dir_all(env.dir.join("dev")).unwrap();
        let path_dir = env.dir.join("bin");
        fs::create_dir_all(&path_dir).unwrap();
        for r in runtimes {
            let real = which(r).unwrap_or_else(|| panic!("{r} is not installed"));
            symlink(real, path_dir.join(r)).unwrap();
        }
        Node {
            env,
            path_dir,
            kmsg,
        }
    }

    fn dir(&self) -> &Path {
        &self.env.dir
    }

    fn doctor(&self, args: &[&str]) -> (i32, Vec<String>) {
        self.doctor_with(args, &[])
    }

    fn doctor_with(&self, args: &[&str], envs: &[(&str, &Path)]) -> (i32, Vec<String>) {
        doctor_lines(self.doctor_cmd(args, envs).output().unwrap())
    }

    /// doctor in a PID namespace of its own, with its own /proc: it sees no kubelet but
    /// the one a test starts there (another test's kubelet on this machine would count).
    fn doctor_cmd(&self, args: &[&str], envs: &[(&str, &Path)]) -> Command {
        let mut cmd = Command::new("/usr/bin/unshare");
        cmd.args(["--pid", "--fork", "--mount-proc"])
            .arg(devgate_bin())
            .arg("--config")
            .arg(&self.env.config)
            .arg("doctor")
            .args(args)
            .env_remove("DEVGATE_CONFIG")
            .env("PATH", &self.path_dir);
        // podman's runtime from the test's containers.conf, not the host's (crun by
        // default, which doctor fails with hooks alone); a test's own CONTAINERS_CONF wins.
        let conf = self.dir().join("containers-runc.conf");
        fs::write(&conf, "[engine]\nruntime = \"runc\"\n").unwrap();
        cmd.env("CONTAINERS_CONF", &conf);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd
    }

    /// doctor beside a stand-in kubelet in its PID namespace: a script named `kubelet`
    /// (its process is then named kubelet, as the real one is) started with `kubelet_args`,
    /// as the user `setpriv` names where one is given. doctor starts once /proc names it.
    fn doctor_beside_kubelet(
        &self,
        kubelet_args: &[&str],
        setpriv: &[&str],
        args: &[&str],
    ) -> (i32, Vec<String>) {
        let dir = self.dir().join("fake-kubelet");
        fs::create_dir_all(&dir).unwrap();
        let kubelet = dir.join("kubelet");
        fs::write(&kubelet, "#!/bin/sh\n/bin/sleep 600\n").unwrap();
        fs::set_permissions(&kubelet, fs::Permissions::from_mode(0o755)).unwrap();
        let quote = |a: &str| format!("'{}'", a.replace('\'', "'\\''"));
        let launch = dir.join("launch.sh");
        fs::write(
            &launch,
            format!(
                "{} {} {} &\nk=$!\n\
                 until [ \"$(/bin/cat /proc/$k/comm 2>/dev/null)\" = kubelet ]; do \
                 kill -0 $k 2>/dev/null || exit 97; done\n\
                 \"$@\"\n",
                setpriv
                    .iter()
                    .map(|a| quote(a))
                    .collect::<Vec<_>>()
                    .join(" "),
                quote(kubelet.to_str().unwrap()),
                kubelet_args
                    .iter()
                    .map(|a| quote(a))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        )
        .unwrap();
        let doctor = self.doctor_cmd(args, &[]);
        let mut cmd = Command::new(doctor.get_program());
        let mut inner = doctor.get_args();
        // unshare's own options, then the shell that starts kubelet and runs doctor.
        cmd.args(inner.by_ref().take(3))
            .arg("/bin/sh")
            .arg(&launch)
            .args(inner);
        for (k, v) in doctor.get_envs() {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        doctor_lines(cmd.output().unwrap())
    }

    /// A podman hooks directory as `hooks-config` writes it, for `bin`.
    fn hooks_dir(&self, bin: &Path) -> PathBuf {
        let dir = self.dir().join("hooks.d");
        hooks_config(&[
            "--config",
            self.env.config.to_str().unwrap(),
            "hooks-config",
            "--runtime",
            "podman",
            "--bin",
            bin.to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
        ]);
        dir
    }

    /// containerd's config.toml (version 2, as containerd 1.6 and 1.7 read it) with `body`.
    fn containerd_config(&self, name: &str, body: &str) -> PathBuf {
        let p = self.dir().join(name);
        fs::write(&p, format!("version = 2\n{body}")).unwrap();
        p
    }

    /// The base runtime spec `hooks-config --runtime containerd` generates.
    fn base_spec(&self) -> PathBuf {
        let p = self.dir().join("devgate-base-spec.json");
        fs::write(&p, containerd_base_spec_for(&self.env)).unwrap();
        p
    }
}

/// Where the line that starts with `start` is among doctor's `lines`.
fn line_at(lines: &[String], start: &str) -> usize {
    lines
        .iter()
        .position(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no {start:?} line: {lines:#?}"))
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(cmd))
        .find(|p| p.exists())
}

const RUNC_SECTION: &str = r#"[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]"#;

/// The lines every configured test node shares, up to the runtimes.
fn head(node: &Node) -> Vec<String> {
    let d = node.dir().display();
    vec![
        format!("✓ config: {} parses", node.env.config.display()),
        format!("✓ state_dir: {d}/state: absent; devgate creates it"),
        format!("✓ quarantine_dir: {d}/quarantine: absent; devgate creates it"),
        format!("✓ log_file directory: {d}/log: absent; devgate creates it"),
    ]
}

/// The kubelet lines where no kubelet runs (doctor runs in a PID namespace of its own) and
/// no kubelet config is found.
fn no_kubelet(node: &Node) -> [String; 2] {
    [
        format!(
            "- kubelet_pods_dir: {}/kubelet/pods; cannot tell: no kubelet runs here, and its \
             --root-dir is on its command line only (no kubelet config was found either)",
            node.dir().display()
        ),
        "- kubelet_pod_logs_dir: /var/log/pods; cannot tell: no kubelet runs here and no \
         kubelet config was found (name it with --kubelet-config)"
            .to_string(),
    ]
}

/// Every line after the runtimes, on a node with no NVIDIA driver.
fn tail(node: &Node, lines: &[String]) {
    let n = lines.len();
    assert!(
        lines[n - 8].starts_with("✓ cgroup mode: v"),
        "{}",
        lines[n - 8]
    );
    assert_eq!(
        lines[n - 7],
        "✓ cgroup driver: cgroupfs, as containerd runtime runc SystemdCgroup = false"
    );
    assert_eq!(lines[n - 6..n - 4], no_kubelet(node));
    assert_eq!(
        lines[n - 4],
        "- nvml: no NVIDIA driver (CPU node): cannot load /nonexistent/libnvidia-ml.so.1: \
         /nonexistent/libnvidia-ml.so.1: cannot open shared object file: No such file or \
         directory"
    );
    assert_eq!(
        lines[n - 3],
        format!("✓ kernel log: {} readable (empty)", node.kmsg.display())
    );
    assert_eq!(lines[n - 2], NO_AGENT);
}

/// doctor's line on a node without the node agent (issue #30).
const NO_AGENT: &str =
    "- devgate-agent: devgate-agent not running on this node: no cluster integration";

#[test]
fn wired_podman_and_containerd_pass() {
    require_cmd("containerd", "containerd");
    require_cmd("podman", "podman");
    let node = Node::new("doc-wired", &["podman", "containerd"], json!({}));
    let bin = devgate_bin();
    let hooks = node.hooks_dir(&bin);
    let spec = node.base_spec();
    let config = node.containerd_config(
        "containerd.toml",
        &format!(
            "{RUNC_SECTION}\n  runtime_type = \"io.containerd.runc.v2\"\n  \
             base_runtime_spec = \"{}\"\n  container_annotations = [\"{}\"]\n",
            spec.display(),
            "io.kubernetes.container.terminationMessagePolicy"
        ),
    );
    let (code, lines) = node.doctor(&[
        "--hooks-dir",
        hooks.to_str().unwrap(),
        "--containerd-config",
        config.to_str().unwrap(),
    ]);
    let mut want = head(&node);
    want.extend([
        format!(
            "✓ podman: {}/devgate.json runs {} --config {} hook auto at start and poststop",
            hooks.display(),
            bin.with_file_name("devgate-hook").display(),
            node.env.config.display()
        ),
        "- cri-o: not installed".to_string(),
        format!(
            "✓ containerd: default runtime runc starts from {}, a complete spec whose hooks \
             run devgate at start and poststop",
            spec.display()
        ),
        "✓ containerd annotations: runtime runc passes \
         io.kubernetes.container.terminationMessagePolicy to devgate's poststop"
            .to_string(),
    ]);
    assert_eq!(lines[..want.len()], want[..], "{lines:#?}");
    tail(&node, &lines);
    assert_eq!(
        lines.last().unwrap(),
        "devgate doctor: 0 failed, 10 passed, 5 notes"
    );
    assert_eq!(code, 0, "{lines:#?}");
}

/// kubelet's terminationMessagePolicy reaches devgate's poststop only through the CRI's
/// `container_annotations` (containerd's real `config dump` read): a runtime that runs
/// devgate's poststop without it fails, with the table to add it to.
#[test]
fn containerd_without_the_policy_annotation_fails() {
    require_cmd("containerd", "containerd");
    let node = Node::new("doc-annot", &["containerd"], json!({}));
    let spec = node.base_spec();
    let runtime = |annotations: &str| {
        format!(
            "{RUNC_SECTION}\n  runtime_type = \"io.containerd.runc.v2\"\n  \
             base_runtime_spec = \"{}\"\n{annotations}",
            spec.display()
        )
    };
    let plugin = common::node::cri_runtime_plugin();
    for (annotations, has) in [
        ("", "has no container_annotations".to_string()),
        (
            "  container_annotations = [\"io.kubernetes.cri.*\", \"[\"]\n",
            r#"has container_annotations ["io.kubernetes.cri.*", "["], none matching it"#
                .to_string(),
        ),
    ] {
        let config = node.containerd_config("containerd.toml", &runtime(annotations));
        let (code, lines) = node.doctor(&["--containerd-config", config.to_str().unwrap()]);
        let at = line_at(&lines, "✗ containerd annotations: ");
        assert_eq!(
            lines[at..at + 2],
            [
                format!(
                    "✗ containerd annotations: runtime runc runs devgate's poststop but {has}: \
                     devgate takes every pod for terminationMessagePolicy File, so a \
                     FallbackToLogsOnError pod's message loses its log lines"
                ),
                format!(
                    "  fix: add \"io.kubernetes.container.terminationMessagePolicy\" to \
                     container_annotations under [plugins.\"{plugin}\".containerd.runtimes.runc] \
                     and restart containerd"
                ),
            ]
        );
        assert_eq!(code, 1);
    }
    // A pattern containerd matches as Go's path.Match does passes.
    let config = node.containerd_config(
        "containerd.toml",
        &runtime("  container_annotations = [\"io.kubernetes.container.*\"]\n"),
    );
    let (code, lines) = node.doctor(&["--containerd-config", config.to_str().unwrap()]);
    assert!(
        lines.contains(
            &"✓ containerd annotations: runtime runc passes \
              io.kubernetes.container.terminationMessagePolicy to devgate's poststop"
                .to_string()
        ),
        "{lines:#?}"
    );
    assert_eq!(code, 0, "{lines:#?}");
}

#[test]
fn unwired_podman_and_containerd_fail_with_the_fix() {
    require_cmd("containerd", "containerd");
    require_cmd("podman", "podman");
    let node = Node::new("doc-unwired", &["podman", "containerd"], json!({}));
    let bin = devgate_bin();
    // A hook file for another program, and a containerd with the stock runc runtime.
    let hooks = node.hooks_dir(Path::new("/bin/true"));
    let config = node.containerd_config(
        "containerd.toml",
        &format!("{RUNC_SECTION}\n  runtime_type = \"io.containerd.runc.v2\"\n"),
    );
    let (code, lines) = node.doctor(&[
        "--hooks-dir",
        hooks.to_str().unwrap(),
        "--containerd-config",
        config.to_str().unwrap(),
    ]);
    let mut want = head(&node);
    want.extend([
        format!("✗ podman: no hook in {} runs devgate", hooks.display()),
        format!(
            "  fix: devgate --config {} hooks-config --runtime podman --bin {} --out {}",
            node.env.config.display(),
            bin.display(),
            hooks.display()
        ),
        "- cri-o: not installed".to_string(),
        "✗ containerd: runtime runc has no base_runtime_spec and runs runc".to_string(),
        format!(
            "  fix: devgate --config {} hooks-config --runtime containerd --bin {} --out \
             /etc/containerd, set base_runtime_spec = \"/etc/containerd/devgate-base-spec.json\" \
             under [plugins.\"{}\".containerd.runtimes.runc], and restart containerd",
            node.env.config.display(),
            bin.display(),
            // the daemon's own table: containerd 2.x renamed the plugin
            common::node::cri_runtime_plugin()
        ),
    ]);
    assert_eq!(lines[..want.len()], want[..], "{lines:#?}");
    tail(&node, &lines);
    assert_eq!(
        lines.last().unwrap(),
        "devgate doctor: 2 failed, 7 passed, 5 notes"
    );
    assert_eq!(code, 1);

    // An empty hooks directory says the same.
    let empty = node.dir().join("empty.d");
    fs::create_dir(&empty).unwrap();
    let (code, lines) = node.doctor(&[
        "--hooks-dir",
        empty.to_str().unwrap(),
        "--containerd-config",
        config.to_str().unwrap(),
    ]);
    assert!(
        lines.contains(&format!(
            "✗ podman: no hook in {} runs devgate",
            empty.display()
        )),
        "{lines:#?}"
    );
    assert_eq!(code, 1);
}

/// doctor reads the hooks_dir podman reads (containers.conf, here through CONTAINERS_CONF,
/// which podman and doctor both honour) and its ✓ means podman runs the hook: a container
/// on a cordoned device is rejected. Where hooks_dir leaves devgate's directory out, doctor
/// says ✗ and podman indeed starts the container.
#[test]
fn podman_line_agrees_with_what_podman_runs() {
    require_root!();
    let podman = Podman::new("doc-podman");
    let node = Node::new("doc-podman-node", &["podman"], json!({}));
    let hooks = node.hooks_dir(&devgate_bin());
    let empty = node.dir().join("empty.d");
    fs::create_dir(&empty).unwrap();
    let conf = podman.dir.join("containers.conf");
    let base = fs::read_to_string(&conf).unwrap();
    let set_hooks_dir = |dir: &Path| {
        let line = format!(
            "[engine]\nruntime = \"runc\"\nhooks_dir = [\"{}\"]\n",
            dir.display()
        );
        fs::write(&conf, base.replacen("[engine]\n", &line, 1)).unwrap();
    };
    let run = || {
        podman
            .cmd()
            .args(["run", "--rm", "--network", "none", "--device", "/dev/zero"])
            .arg(TEST_IMAGE)
            .args(["echo", "ran"])
            .output()
            .unwrap()
    };
    node.env
        .ok(&["cordon", "/dev/zero", "--reason", "doctor test"]);

    set_hooks_dir(&hooks);
    let (_, lines) = node.doctor_with(&[], &[("CONTAINERS_CONF", &conf)]);
    let pass = format!("✓ podman: {}/devgate.json runs ", hooks.display());
    assert!(lines.iter().any(|l| l.starts_with(&pass)), "{lines:#?}");
    let out = run();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("devgate: rejected /dev/zero (1:5)"),
        "{}",
        text(&out)
    );

    set_hooks_dir(&empty);
    let (code, lines) = node.doctor_with(&[], &[("CONTAINERS_CONF", &conf)]);
    assert!(
        lines.contains(&format!(
            "✗ podman: no hook in {} runs devgate",
            empty.display()
        )),
        "{lines:#?}"
    );
    assert_eq!(code, 1);
    let out = run();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
}

/// With no hooks_dir anywhere, podman reads /usr/share/containers/oci/hooks.d alone: the
/// hook install-host and the packages put there runs, and doctor's ✓ says so.
#[test]
fn podman_without_hooks_dir_runs_the_hook_in_the_package_directory() {
    require_root!();
    if !Path::new("/usr/share/containers").is_dir() {
        eprintln!("skipped: no /usr/share/containers here (podman's package makes it)");
        return;
    }
    let podman = Podman::new("doc-podman-default");
    let node = Node::new("doc-podman-default-node", &["podman"], json!({}));
    let hook = node.hooks_dir(&devgate_bin()).join("devgate.json");
    let save = node.dir().join("share-containers");
    let conf = podman.dir.join("containers.conf");
    let base = fs::read_to_string(&conf).unwrap();
    assert!(!base.contains("hooks_dir"), "{base}");
    fs::write(
        &conf,
        base.replacen("[engine]\n", "[engine]\nruntime = \"runc\"\n", 1),
    )
    .unwrap();
    node.env
        .ok(&["cordon", "/dev/zero", "--reason", "doctor test"]);

    let envs = [("CONTAINERS_CONF", conf.as_path())];
    let (code, lines) = doctor_lines(
        with_hook_in_package_dir(&node.doctor_cmd(&[], &envs), &hook, &save)
            .output()
            .unwrap(),
    );
    let pass = "✓ podman: /usr/share/containers/oci/hooks.d/devgate.json runs ";
    assert!(lines.iter().any(|l| l.starts_with(pass)), "{lines:#?}");
    assert_ne!(code, 97, "{lines:#?}");

    let mut run = podman.cmd();
    run.args(["run", "--rm", "--network", "none", "--device", "/dev/zero"])
        .arg(TEST_IMAGE)
        .args(["echo", "ran"]);
    let out = with_hook_in_package_dir(&run, &hook, &save)
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(97), "{}", text(&out));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("devgate: rejected /dev/zero (1:5)"),
        "{}",
        text(&out)
    );
    // Without the hook there, the same container starts: it was the hook that refused.
    let out = podman
        .cmd()
        .args(["run", "--rm", "--network", "none", "--device", "/dev/zero"])
        .arg(TEST_IMAGE)
        .args(["echo", "ran"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

/// containerd reads `imports` drop-ins; doctor sees them because it reads the dump. And a
/// base spec holding only hooks is refused: containerd uses it whole.
#[test]
fn containerd_imports_and_incomplete_base_spec() {
    require_cmd("containerd", "containerd");
    let node = Node::new("doc-imports", &["containerd"], json!({}));
    let spec = node.base_spec();
    let dropins = node.dir().join("conf.d");
    fs::create_dir(&dropins).unwrap();
    fs::write(
        dropins.join("devgate.toml"),
        format!(
            "version = 2\n{RUNC_SECTION}\n  runtime_type = \"io.containerd.runc.v2\"\n  \
             base_runtime_spec = \"{}\"\n  container_annotations = [\"io.kubernetes.*\"]\n",
            spec.display()
        ),
    )
    .unwrap();
    let config = node.containerd_config(
        "containerd.toml",
        &format!("imports = [\"{}/*.toml\"]\n", dropins.display()),
    );
    let args = ["--containerd-config", config.to_str().unwrap()];
    let (code, lines) = node.doctor(&args);
    let want = format!(
        "✓ containerd: default runtime runc starts from {}, a complete spec whose hooks run \
         devgate at start and poststop",
        spec.display()
    );
    assert!(lines.contains(&want), "{lines:#?}");
    assert_eq!(code, 0, "{lines:#?}");

    // The same hooks without the rest of the spec.
    let full: Value = serde_json::from_slice(&fs::read(&spec).unwrap()).unwrap();
    fs::write(
        &spec,
        serde_json::to_vec(&json!({"hooks": full["hooks"]})).unwrap(),
    )
    .unwrap();
    let (code, lines) = node.doctor(&args);
    let want = format!(
        "✗ containerd: runtime runc: base_runtime_spec {} is not a complete spec (no \
         ociVersion, process, root, linux); containerd reads it at start and uses it whole for \
         every container",
        spec.display()
    );
    assert!(lines.contains(&want), "{lines:#?}");
    assert_eq!(code, 1);
}

/// A node laid out by install-host and wired by the shipped snippet for this containerd's
/// config version (read from `containerd config default`, so 1.6/1.7 and 2.x alike), in a
/// drop-in that `imports` names by a relative path: the static devgate-runtime alone as
/// BinaryName passes, and so does the base spec's hooks alone. A relative glob is read
/// as the daemon (cwd /) reads it: containerd 1.6 and 1.7 glob it from the working
/// directory, 2.x from the config file's directory.
#[test]
fn installed_host_wired_by_the_shipped_snippets_passes() {
    require_cmd("containerd", "containerd");
    let node = Node::new("doc-installed", &["containerd"], json!({}));
    let root = node.dir().join("host");
    let out = Command::new(devgate_bin())
        .args(["install-host", "--root"])
        .arg(&root)
        .env_remove("DEVGATE_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let bin = root.join("usr/local/bin/devgate");
    let wrapper = root.join("usr/local/bin/devgate-runtime");
    let spec = root.join("etc/containerd/devgate-base-spec.json");
    hooks_config(&[
        "--config",
        node.env.config.to_str().unwrap(),
        "hooks-config",
        "--runtime",
        "containerd",
        "--bin",
        bin.to_str().unwrap(),
        "--out",
        root.join("etc/containerd").to_str().unwrap(),
    ]);
    let default = Command::new("containerd")
        .args(["config", "default"])
        .output()
        .unwrap();
    let v3 = String::from_utf8_lossy(&default.stdout).contains("version = 3");
    let snippet = |v2: &str, v3name: &str| {
        let f = if v3 { v3name } else { v2 };
        fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("hooks/containerd")
                .join(f),
        )
        .unwrap()
        .replace(
            "/etc/containerd/devgate-base-spec.json",
            spec.to_str().unwrap(),
        )
        .replace("/usr/bin/devgate-runtime", wrapper.to_str().unwrap())
    };
    let conf_d = node.dir().join("conf.d");
    fs::create_dir(&conf_d).unwrap();
    let version = if v3 { 3 } else { 2 };
    let config = node.dir().join("containerd.toml");
    fs::write(
        &config,
        format!("version = {version}\nimports = [\"conf.d/devgate.toml\"]\n"),
    )
    .unwrap();
    let args = [
        "--bin",
        bin.to_str().unwrap(),
        "--containerd-config",
        config.to_str().unwrap(),
    ];

    let wrapper_only: String = snippet(
        "containerd-runtime-wrapper.toml",
        "containerd-runtime-wrapper-v3.toml",
    )
    .lines()
    .filter(|l| !l.contains("base_runtime_spec"))
    .map(|l| format!("{l}\n"))
    .collect();
    fs::write(conf_d.join("devgate.toml"), wrapper_only).unwrap();
    let (code, lines) = node.doctor(&args);
    let want = format!(
        "✓ containerd: default runtime runc runs devgate's runtime wrapper {}; no \
         base_runtime_spec hook runs devgate at poststop, so faults during a run go unreported",
        wrapper.display()
    );
    assert!(lines.contains(&want), "{lines:#?}");
    assert_eq!(code, 0, "{lines:#?}");

    fs::write(
        conf_d.join("devgate.toml"),
        snippet("config.toml", "config-v3.toml"),
    )
    .unwrap();
    let (code, lines) = node.doctor(&args);
    let want = format!(
        "✓ containerd: default runtime runc starts from {}, a complete spec whose hooks run \
         devgate at start and poststop",
        spec.display()
    );
    assert!(lines.contains(&want), "{lines:#?}");
    assert_eq!(code, 0, "{lines:#?}");

    // The relative glob, with doctor started in the config's directory: only 2.x reads it.
    fs::write(
        &config,
        format!("version = {version}\nimports = [\"conf.d/*.toml\"]\n"),
    )
    .unwrap();
    let out = Command::new(devgate_bin())
        .arg("--config")
        .arg(&node.env.config)
        .arg("doctor")
        .args(args)
        .env_remove("DEVGATE_CONFIG")
        .env("PATH", node.dir().join("bin"))
        .current_dir(node.dir())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(said.contains(&want), v3, "{said}");
    if !v3 {
        assert!(
            said.contains("✗ containerd: runtime runc has no base_runtime_spec"),
            "{said}"
        );
    }
}

/// The runtime wrapper as containerd's BinaryName, directly and behind NVIDIA's runtime.
#[test]
fn containerd_binary_name_wrapper_and_nvidia_runtime() {
    require_cmd("containerd", "containerd");
    let node = Node::new("doc-wrapper", &["containerd"], json!({}));
    let bin = devgate_bin();
    // A wrapper script in front of devgate, as a package may install it.
    let wrapper = node.dir().join("devgate-runc");
    fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec {} runtime \"$@\"\n", bin.display()),
    )
    .unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    let options = |binary: &Path| {
        format!(
            "{RUNC_SECTION}\n  runtime_type = \"io.containerd.runc.v2\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  \
             BinaryName = \"{}\"\n",
            binary.display()
        )
    };
    let config = node.containerd_config("direct.toml", &options(&wrapper));
    let (code, lines) = node.doctor(&["--containerd-config", config.to_str().unwrap()]);
    assert!(
        lines.contains(&format!(
            "✓ containerd: default runtime runc runs devgate's runtime wrapper {}; no \
             base_runtime_spec hook runs devgate at poststop, so faults during a run go \
             unreported",
            wrapper.display()
        )),
        "{lines:#?}"
    );
    assert_eq!(code, 0, "{lines:#?}");

    // devgate itself under its own name is no wrapper: it would read the runtime's
    // arguments as devgate's command line.
    let config = node.containerd_config("devgate.toml", &options(&bin));
    let (code, lines) = node.doctor(&["--containerd-config", config.to_str().unwrap()]);
    assert!(
        lines.iter().any(|l| l.starts_with("✗ containerd:")
            && l.contains(&format!(
                "runs devgate as {}, which is the runtime wrapper only when named \
                 devgate-runtime",
                bin.display()
            ))),
        "{lines:#?}"
    );
    assert_eq!(code, 1, "{lines:#?}");

    // NVIDIA's runtime first, which runs the first of its `runtimes` that exists.
    let nvidia = node.dir().join("nvidia-container-runtime");
    fs::write(&nvidia, "#!/bin/sh\nexit 1\n").unwrap();
    fs::set_permissions(&nvidia, fs::Permissions::from_mode(0o755)).unwrap();
    let config = node.containerd_config("nvidia.toml", &options(&nvidia));
    let nv_config = node.dir().join("nvidia-config.toml");
    let nv_args = [
        "--containerd-config",
        config.to_str().unwrap(),
        "--nvidia-runtime-config",
        nv_config.to_str().unwrap(),
    ];
    fs::write(
        &nv_config,
        format!(
            "[nvidia-container-runtime]\nruntimes = [\"{}\", \"runc\"]\n",
            wrapper.display()
        ),
    )
    .unwrap();
    let (code, lines) = node.doctor(&nv_args);
    assert!(
        lines.contains(&format!(
            "✓ containerd: default runtime runc runs NVIDIA's runtime {}, which runs {}; no \
             base_runtime_spec hook runs devgate at poststop, so faults during a run go \
             unreported",
            nvidia.display(),
            wrapper.display()
        )),
        "{lines:#?}"
    );
    assert_eq!(code, 0, "{lines:#?}");

    // NVIDIA's runtime in front of plain runc: not wired.
    let runc = node.dir().join("runc");
    fs::write(&runc, "#!/bin/sh\nexit 1\n").unwrap();
    fs::set_permissions(&runc, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(
        &nv_config,
        format!(
            "[nvidia-container-runtime]\nruntimes = [\"{}\"]\n",
            runc.display()
        ),
    )
    .unwrap();
    let (code, lines) = node.doctor(&nv_args);
    assert!(
        lines.contains(&format!(
            "✗ containerd: runtime runc has no base_runtime_spec and runs NVIDIA's runtime {}, \
             which runs {}",
            nvidia.display(),
            runc.display()
        )),
        "{lines:#?}"
    );
    assert_eq!(code, 1);
}

#[test]
fn group_writable_parent_is_unsafe() {
    let node = Node::new("doc-unsafe", &[], json!({}));
    let open = node.dir().join("shared");
    fs::create_dir_all(open.join("state")).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o775)).unwrap();
    let mut cfg: Value = serde_json::from_slice(&fs::read(&node.env.config).unwrap()).unwrap();
    cfg["state_dir"] = json!(open.join("state"));
    fs::write(&node.env.config, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let (code, lines) = node.doctor(&[]);
    if !is_root() {
        // Not root: the temp directories are not root's either, and doctor says so.
        assert_eq!(code, 1);
        return;
    }
    assert_eq!(
        lines[1..3],
        [
            format!(
                "✗ state_dir: {}/state: unsafe path {}: is writable by group or others (mode 775)",
                open.display(),
                open.display()
            ),
            "  fix: make every directory on the path root's and not writable by group or \
             others (chown root, chmod go-w), or point the config at one that is"
                .to_string(),
        ],
        "{lines:#?}"
    );
    assert_eq!(
        lines[3],
        format!(
            "✓ quarantine_dir: {}/quarantine: absent; devgate creates it",
            node.dir().display()
        )
    );
    assert_eq!(code, 1);
}

#[test]
fn config_that_does_not_parse_stops_doctor() {
    let node = Node::new("doc-badcfg", &[], json!({}));
    fs::write(&node.env.config, "{\n \"policy\": {\"default\": }\n}").unwrap();
    let (code, lines) = node.doctor(&[]);
    assert_eq!(
        lines,
        [
            format!(
                "✗ config: config {}: line 2 column 24: not valid JSON: expected value",
                node.env.config.display()
            ),
            "  fix: correct the file (devgate refuses unknown keys and classes, and relative paths); every \
             hook fails until it parses"
                .to_string(),
            "- other checks: skipped: they read the config".to_string(),
            "devgate doctor: 1 failed, 0 passed, 1 note".to_string(),
        ]
    );
    assert_eq!(code, 1);
}

/// A GPU node through the fake NVML: persistence mode, a GPU name with an escape sequence
/// (printed escaped), two spares (one without its /dev/char link, one the device plugin
/// advertises), and kubelet's device-plugin checkpoint.
#[test]
fn gpu_node_persistence_spares_and_device_plugin() {
    require_root!();
    let gpu = GpuNode::new("doc-gpu");
    let mut scenario = fake_nvml::node_with(1, json!({"persistence_mode": false}));
    scenario["gpus"][2]["name"] = json!("Evil\u{1b}[31mGPU\nsecond line");
    let scenario_file = fake_nvml::write_scenario(&gpu.dir, "doctor", &scenario);
    let dev = gpu.dev_root.clone();
    let node = Node::new(
        "doc-gpu-node",
        &[],
        json!({
            "dev_root": dev,
            "nvml_library": fake_nvml::lib(),
            "spares": {"nvidia-gpu": [dev.join("nvidia6"), dev.join("nvidia7")]},
        }),
    );
    fs::create_dir_all(dev.join("char")).unwrap();
    symlink("../nvidia7", dev.join("char/195:7")).unwrap();
    let plugins = node.dir().join("kubelet/device-plugins");
    fs::create_dir_all(&plugins).unwrap();
    let advertised: Vec<String> = (0..7).map(fake_nvml::uuid).collect();
    fs::write(
        plugins.join("kubelet_internal_checkpoint"),
        serde_json::to_vec(&json!({
            "Data": {"PodDeviceEntries": null,
                     "RegisteredDevices": {"nvidia.com/gpu": advertised}},
            "Checksum": 1
        }))
        .unwrap(),
    )
    .unwrap();

    let (code, lines) = node.doctor_with(&[], &[("FAKE_NVML_CONFIG", &scenario_file)]);
    let at = line_at(&lines, "✓ nvml: ");
    let gpu_line = |i: usize, name: &str| {
        format!(
            "{name}, 0000:{:02x}:00.0, {}, /dev/nvidia{i}",
            fake_nvml::BUSES[i],
            fake_nvml::uuid(i)
        )
    };
    let h100 = "NVIDIA H100 80GB HBM3";
    let keep: Vec<String> = (0..6).map(fake_nvml::uuid).collect();
    let want = vec![
        format!(
            "✓ nvml: {} loaded, driver 550.54.15, 8 GPU(s)",
            fake_nvml::lib().display()
        ),
        format!("✓ gpu 0: {}; persistence mode on", gpu_line(0, h100)),
        format!(
            "✗ gpu 1: {}; persistence mode off: the driver sets the GPU up again on each \
             container start, which can take seconds",
            gpu_line(1, h100)
        ),
        "  fix: nvidia-smi -i 1 -pm 1, or enable nvidia-persistenced (systemctl enable --now \
         nvidia-persistenced)"
            .to_string(),
        format!(
            "✓ gpu 2: {}; persistence mode on",
            gpu_line(2, "Evil\\x1b[31mGPU\\x0asecond line")
        ),
        format!("✓ gpu 3: {}; persistence mode on", gpu_line(3, h100)),
        format!("✓ gpu 4: {}; persistence mode on", gpu_line(4, h100)),
        format!("✓ gpu 5: {}; persistence mode on", gpu_line(5, h100)),
        format!("✓ gpu 6: {}; persistence mode on", gpu_line(6, h100)),
        format!("✓ gpu 7: {}; persistence mode on", gpu_line(7, h100)),
        format!(
            "✗ spare: {d}/nvidia6 (nvidia-gpu, c 195:6): {d}/char/195:6 is missing; under the \
             systemd cgroup driver runc skips a DeviceAllow whose path is missing, so the spare \
             is denied after a daemon-reload",
            d = dev.display()
        ),
        format!(
            "  fix: nvidia-ctk system create-dev-char-symlinks --create-all (or ln -s ../nvidia6 \
             {}/char/195:6), at every boot",
            dev.display()
        ),
        format!(
            "✗ spare hidden: {}/nvidia6 ({}) is advertised to kubelet as nvidia.com/gpu: kubelet \
             can give the spare to another pod",
            dev.display(),
            fake_nvml::uuid(6)
        ),
        format!(
            "  fix: set NVIDIA_VISIBLE_DEVICES={} on the NVIDIA device plugin's container (the \
             GPUs that are not spares), run it unprivileged (privileged, it sees every GPU), and \
             restart it",
            keep.join(",")
        ),
        format!(
            "✓ spare: {d}/nvidia7 (nvidia-gpu, c 195:7); {d}/char/195:7 links to it",
            d = dev.display()
        ),
        format!(
            "✓ spare hidden: {}/nvidia7 ({}) is not among the devices the NVIDIA device plugin \
             registered (nvidia.com/gpu)",
            dev.display(),
            fake_nvml::uuid(7)
        ),
        format!("✓ kernel log: {} readable (empty)", node.kmsg.display()),
        NO_AGENT.to_string(),
        "devgate doctor: 3 failed, 16 passed, 7 notes".to_string(),
    ];
    assert_eq!(lines[at..], want[..], "{lines:#?}");
    assert_eq!(code, 1);

    // The same node with its NVML library missing: the driver's nodes are there, so this is
    // a broken GPU node, not a CPU node.
    let mut cfg: Value = serde_json::from_slice(&fs::read(&node.env.config).unwrap()).unwrap();
    cfg["nvml_library"] = json!("/nonexistent/libnvidia-ml.so.1");
    cfg["spares"] = json!({});
    fs::write(&node.env.config, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let (code, lines) = node.doctor(&[]);
    assert!(
        lines.iter().any(|l| l.starts_with(
            "✗ nvml: cannot load /nonexistent/libnvidia-ml.so.1: /nonexistent/libnvidia-ml.so.1: \
             cannot open shared object file"
        )),
        "{lines:#?}"
    );
    assert_eq!(code, 1);
}

#[test]
fn usage_lists_doctor_and_bad_options_are_usage_errors() {
    let out = Command::new(devgate_bin()).arg("help").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("\n  doctor [--bin PATH]"));
    let out = Command::new(devgate_bin())
        .args(["doctor", "--hooks-dir"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("devgate: error: --hooks-dir needs a value"),
        "{}",
        text(&out)
    );
}

/// NVML that never answers: doctor says so at the config's deadline and still finishes. A
/// stuck library call must not keep the process from exiting either (the hang here is an
/// hour: without the deadline and the _exit this test never ends).
#[test]
fn hanging_nvml_fails_at_the_deadline_and_doctor_exits() {
    require_root!();
    let gpu = GpuNode::new("doc-hang");
    let node = Node::new(
        "doc-hang-node",
        &[],
        json!({"dev_root": gpu.dev_root, "nvml_library": fake_nvml::lib(), "probe_timeout_ms": 300}),
    );
    let hang = |func: &str| {
        let mut s = fake_nvml::healthy_node();
        s["hang_ms"] = json!({ func: 3_600_000 });
        fake_nvml::write_scenario(&gpu.dir, func, &s)
    };
    let in_count = hang("nvmlDeviceGetCount_v2");
    let (code, lines) = node.doctor_with(&[], &[("FAKE_NVML_CONFIG", &in_count)]);
    assert!(
        lines.contains(&"✗ nvml: NVML did not answer in 300 ms".to_string()),
        "{lines:#?}"
    );
    assert_eq!(
        lines.last().unwrap(),
        "devgate doctor: 1 failed, 6 passed, 7 notes"
    );
    assert_eq!(code, 1);

    // The answer comes in time, then nvmlShutdown hangs holding the library's lock.
    let in_shutdown = hang("nvmlShutdown");
    let (code, lines) = node.doctor_with(&[], &[("FAKE_NVML_CONFIG", &in_shutdown)]);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("✓ nvml: ") && l.ends_with("8 GPU(s)")),
        "{lines:#?}"
    );
    assert_eq!(code, 0, "{lines:#?}");
}

/// CRI-O's own files: crio.conf's hooks_dir and cgroup_manager, a drop-in overriding them,
/// and kubelet's config.yaml disagreeing on the driver.
#[test]
fn crio_config_hooks_dir_drop_in_and_kubelet_driver() {
    let node = Node::new("doc-crio", &[], json!({}));
    let bin = devgate_bin();
    let hooks = node.hooks_dir(&bin);
    let crio = node.dir().join("crio.conf");
    fs::write(
        &crio,
        format!(
            "[crio.runtime]\ncgroup_manager = \"cgroupfs\"\ndefault_runtime = \"runc\"\n\
             hooks_dir = [\"{}\"]\n",
            hooks.display()
        ),
    )
    .unwrap();
    let args = ["--crio-config", crio.to_str().unwrap()];

    // crun (CRI-O's default since 1.31) with the hooks alone: a reject would reach kubelet
    // without devgate's line, so the line fails and names the wrapper.
    fs::create_dir(node.dir().join("crio.conf.d")).unwrap();
    let crun = node.dir().join("crio.conf.d/05-crun.conf");
    fs::write(&crun, "[crio.runtime]\ndefault_runtime = \"crun\"\n").unwrap();
    let (code, lines) = node.doctor(&args);
    let at = line_at(&lines, "✗ cri-o: ");
    assert!(
        lines[at].contains("crun discards a hook's output"),
        "{lines:#?}"
    );
    assert!(
        lines[at + 1].contains("--runtime crio --wrapper"),
        "{lines:#?}"
    );
    assert_eq!(code, 1);
    fs::remove_file(&crun).unwrap();

    let (code, lines) = node.doctor(&args);
    assert!(
        lines.contains(&format!(
            "✓ cri-o: {}/devgate.json runs {} --config {} hook auto at start and poststop",
            hooks.display(),
            bin.with_file_name("devgate-hook").display(),
            node.env.config.display()
        )),
        "{lines:#?}"
    );
    assert!(
        lines.contains(&"✓ cgroup driver: cgroupfs, as CRI-O cgroup_manager = \"cgroupfs\"".into()),
        "{lines:#?}"
    );
    assert_eq!(code, 0, "{lines:#?}");

    // A drop-in moves the hooks directory to one without devgate's file, and kubelet says
    // systemd.
    let empty = node.dir().join("other-hooks.d");
    fs::create_dir(&empty).unwrap();
    fs::write(
        node.dir().join("crio.conf.d/10-hooks.conf"),
        format!("[crio.runtime]\nhooks_dir = [\"{}\"]\n", empty.display()),
    )
    .unwrap();
    let kubelet = node.dir().join("kubelet");
    fs::create_dir_all(&kubelet).unwrap();
    fs::write(
        kubelet.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         cgroupDriver: systemd\n",
    )
    .unwrap();
    let (code, lines) = node.doctor(&args);
    let at = line_at(&lines, "✗ cri-o: ");
    assert_eq!(
        lines[at..at + 2],
        [
            format!("✗ cri-o: no hook in {} runs devgate", empty.display()),
            format!(
                "  fix: devgate --config {} hooks-config --runtime crio --bin {} --out {} (a \
                 directory in CRI-O's hooks_dir), then restart CRI-O",
                node.env.config.display(),
                bin.display(),
                empty.display()
            ),
        ]
    );
    assert!(
        lines.contains(&format!(
            "✗ cgroup driver: kubelet and the runtimes disagree (kubelet {}/config.yaml \
             cgroupDriver: systemd means systemd; CRI-O cgroup_manager = \"cgroupfs\" means \
             cgroupfs)",
            kubelet.display()
        )),
        "{lines:#?}"
    );
    assert_eq!(code, 1);
}

/// A --crio-config that names nothing is a mistyped path: doctor says so, instead of
/// judging CRI-O's defaults as if they were that file's.
#[test]
fn crio_config_that_is_not_there_fails() {
    let node = Node::new("doc-crio-absent", &[], json!({}));
    let crio = node.dir().join("crio.conf");
    let (code, lines) = node.doctor(&["--crio-config", crio.to_str().unwrap()]);
    assert!(
        lines.contains(&format!(
            "✗ cri-o: --crio-config {}: no such file, nor {}.d",
            crio.display(),
            crio.display()
        )),
        "{lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("CRI-O cgroup_manager unset")),
        "{lines:#?}"
    );
    assert_eq!(code, 1, "{lines:#?}");
}

/// The cgroup mode comes from statfs of sysfs_root/fs/cgroup, as runc decides it: a cgroup2
/// mount is v2; tmpfs with cgroup2 at unified/ is hybrid; tmpfs alone is v1. Each is
/// mounted in a private mount namespace over a directory the test owns.
#[test]
fn cgroup_mode_from_statfs() {
    require_root!();
    require_cmd("unshare", "util-linux");
    let node = Node::new("doc-cgmode", &[], json!({}));
    let sys = node.dir().join("sys");
    fs::create_dir_all(sys.join("fs/cgroup")).unwrap();
    let mut cfg: Value = serde_json::from_slice(&fs::read(&node.env.config).unwrap()).unwrap();
    cfg["sysfs_root"] = json!(sys);
    fs::write(&node.env.config, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let cg = sys.join("fs/cgroup");
    let run = |mounts: &str| {
        let script = format!(
            "mount --make-rprivate / && {mounts} && exec '{}' --config '{}' doctor",
            devgate_bin().display(),
            node.env.config.display()
        );
        let out = Command::new("unshare")
            .args(["-m", "sh", "-c", &script])
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.contains("cgroup mode"))
            .unwrap_or_else(|| panic!("{}", text(&out)))
            .to_string()
    };
    let c = cg.display();
    assert_eq!(
        run(&format!("mount -t cgroup2 none '{c}'")),
        format!("✓ cgroup mode: v2 ({c} is cgroup2)")
    );
    assert_eq!(
        run(&format!(
            "mount -t tmpfs none '{c}' && mkdir '{c}/unified' && mount -t cgroup2 none '{c}/unified'"
        )),
        format!("✓ cgroup mode: v1, hybrid ({c} is not cgroup2; cgroup2 at {c}/unified)")
    );
    assert_eq!(
        run(&format!("mount -t tmpfs none '{c}'")),
        format!("✓ cgroup mode: v1 ({c} is not cgroup2)")
    );
}

/// The NVIDIA toolkit's config: where devgate cannot tell which file the toolkit reads
/// (two it may read disagree), doctor says so in one line; a file named by
/// `nvidia_toolkit_config` is read as TOML; one the toolkit cannot load fails.
#[test]
fn toolkit_config_ambiguity_and_reading() {
    let key = "accept-nvidia-visible-devices-envvar-when-unprivileged";
    let node = Node::new("doc-toolkit", &[], json!({}));
    let named = node.dir().join("named.toml");
    fs::write(&named, format!("{key} = false\n")).unwrap();
    let xdg = node.dir().join("xdg");
    fs::create_dir_all(xdg.join("nvidia-container-runtime")).unwrap();
    fs::write(xdg.join("nvidia-container-runtime/config.toml"), "").unwrap();
    let (_, lines) = node.doctor_with(
        &[],
        &[
            ("NVIDIA_CTK_CONFIG_FILE_PATH", named.as_path()),
            ("XDG_CONFIG_HOME", xdg.as_path()),
        ],
    );
    let line = lines
        .iter()
        .find(|l| l.contains("NVIDIA toolkit config"))
        .unwrap_or_else(|| panic!("no toolkit line: {lines:#?}"));
    assert!(
        line.starts_with(
            "- NVIDIA toolkit config: devgate cannot tell which file NVIDIA's toolkit reads"
        ),
        "{line}"
    );
    assert!(line.contains(&named.display().to_string()), "{line}");
    assert!(line.contains("checks more GPUs"), "{line}");

    let explicit = node.dir().join("explicit.toml");
    let node = Node::new(
        "doc-toolkit2",
        &[],
        json!({"nvidia_toolkit_config": explicit}),
    );
    fs::write(
        &explicit,
        format!("[nvidia-container-cli]\n{key} = false\n"),
    )
    .unwrap();
    let (_, lines) = node.doctor(&[]);
    assert!(
        lines.contains(&format!(
            "✓ NVIDIA toolkit config: {} (nvidia_toolkit_config): NVIDIA_VISIBLE_DEVICES selects GPUs",
            explicit.display()
        )),
        "{lines:#?}"
    );
    fs::write(&explicit, "[broken\n").unwrap();
    let (code, lines) = node.doctor(&[]);
    assert_eq!(code, 1, "{lines:#?}");
    let i = line_at(&lines, "✗ NVIDIA toolkit config: ");
    assert!(lines[i].contains("is not TOML"), "{}", lines[i]);
    assert!(
        lines[i + 1].starts_with("  fix: correct the file"),
        "{}",
        lines[i + 1]
    );
}

#[test]
fn containerd_versions_parse_to_their_major() {
    let v2 = "containerd github.com/containerd/containerd/v2 2.1.9+unknown \n";
    let v1 = "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n";
    assert_eq!(common::node::parse_containerd_major(v2), 2);
    assert_eq!(common::node::parse_containerd_major(v1), 1);
    assert_eq!(common::node::parse_containerd_major("containerd\n"), 0);
}

/// Where podman runs crun (its default) with devgate's hooks alone, crun discards the
/// hook's reject line: doctor says ✗ with the wrapper as the fix, and ✓ once
/// containers.conf names devgate's wrapper as podman's runtime.
#[test]
fn podman_on_crun_with_hooks_alone_fails_and_the_wrapper_passes() {
    require_cmd("podman", "podman");
    let node = Node::new("doc-crun", &["podman"], json!({}));
    let hooks = node.hooks_dir(&devgate_bin());
    let conf = node.dir().join("crun.conf");
    fs::write(&conf, "[engine]\n#runtime = \"crun\"\n").unwrap();
    let args = ["--hooks-dir", hooks.to_str().unwrap()];
    let (code, lines) = node.doctor_with(&args, &[("CONTAINERS_CONF", &conf)]);
    let fail = lines
        .iter()
        .position(|l| l.starts_with("✗ podman: ") && l.contains("its runtime \"crun\" is crun"))
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        lines[fail].ends_with("so a reject reaches podman without devgate's line"),
        "{lines:#?}"
    );
    assert!(
        lines[fail + 1].contains("--runtime podman --wrapper --bin "),
        "{lines:#?}"
    );
    assert_eq!(code, 1);

    let wired = node.dir().join("devgate-runtime.conf");
    fs::write(
        &wired,
        "[engine]\nruntime = \"devgate\"\n[engine.runtimes]\ndevgate = [\"/usr/bin/devgate-runtime\"]\n",
    )
    .unwrap();
    let (_, lines) = node.doctor_with(&args, &[("CONTAINERS_CONF", &wired)]);
    assert!(
        lines.iter().any(|l| l.starts_with("✓ podman: ")
            && l.ends_with("; its runtime is devgate's wrapper /usr/bin/devgate-runtime")),
        "{lines:#?}"
    );
}

/// doctor reads where the running kubelet keeps pods (`--root-dir`) and their logs
/// (`podLogsDir` in its `--config` file, read inside its root) and fails a devgate config
/// that names other directories; a stand-in kubelet in doctor's PID namespace plays the
/// node's. A kubelet of another user's, or a config file doctor will not read, leaves a
/// note, not a pass.
#[test]
fn kubelet_dirs_are_checked_against_the_running_kubelet() {
    let node = Node::new("doc-kubelet", &[], json!({}));
    let d = node.dir();
    let root_dir = d.join("kubelet");
    let conf = d.join("kubelet-config.yaml");
    fs::write(
        &conf,
        fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/kubelet/kubeadm-podlogsdir.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    let kargs = [
        "--config",
        conf.to_str().unwrap(),
        "--root-dir",
        root_dir.to_str().unwrap(),
        "--v=2",
    ];
    let (code, lines) = node.doctor_beside_kubelet(&kargs, &[], &[]);
    let at = lines
        .iter()
        .position(|l| l.contains("kubelet_pods_dir: "))
        .unwrap_or_else(|| panic!("{lines:#?}"));
    let pid_of = |l: &str| -> String {
        let i = l.find("(pid ").unwrap() + 5;
        l[i..].split(')').next().unwrap().to_string()
    };
    let pid = pid_of(&lines[at]);
    assert_eq!(
        lines[at..at + 3],
        [
            format!(
                "✓ kubelet_pods_dir: {}/pods, as kubelet (pid {pid}) --root-dir {}",
                root_dir.display(),
                root_dir.display()
            ),
            "✗ kubelet_pod_logs_dir: /var/log/pods, but kubelet uses /data/log/pods \
             (podLogsDir in CONF): devgate appends its line to no log kubelet reads, so a \
             FallbackToLogsOnError pod's message lacks it"
                .replace("CONF", conf.to_str().unwrap()),
            format!(
                "  fix: set kubelet_pod_logs_dir to \"/data/log/pods\" in {}",
                node.env.config.display()
            ),
        ],
        "{lines:#?}"
    );
    assert_eq!(code, 1);

    // devgate's config set as kubelet's: both pass, and doctor passes.
    let mut cfg: Value = serde_json::from_slice(&fs::read(&node.env.config).unwrap()).unwrap();
    cfg["kubelet_pod_logs_dir"] = json!("/data/log/pods");
    fs::write(&node.env.config, serde_json::to_vec(&cfg).unwrap()).unwrap();
    let (code, lines) = node.doctor_beside_kubelet(&kargs, &[], &[]);
    assert!(
        lines.contains(&format!(
            "✓ kubelet_pod_logs_dir: /data/log/pods, as podLogsDir in {}",
            conf.display()
        )),
        "{lines:#?}"
    );
    assert_eq!(code, 0, "{lines:#?}");

    // A kubelet elsewhere: both fail, each with the directory kubelet uses.
    let (code, lines) = node.doctor_beside_kubelet(&["--root-dir=/srv/kubelet"], &[], &[]);
    let fails: Vec<&String> = lines.iter().filter(|l| l.starts_with("✗ ")).collect();
    assert_eq!(fails.len(), 2, "{lines:#?}");
    assert!(fails[0].starts_with(&format!(
        "✗ kubelet_pods_dir: {}/pods, but kubelet uses /srv/kubelet/pods (kubelet (pid ",
        root_dir.display()
    )));
    assert!(fails[1].starts_with(
        "✗ kubelet_pod_logs_dir: /data/log/pods, but kubelet uses /var/log/pods (kubelet (pid "
    ));
    assert_eq!(code, 1);

    // A process another user names kubelet does not count: nothing is told.
    let nobody = [
        "/usr/bin/setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let (_, lines) = node.doctor_beside_kubelet(&["--root-dir=/srv/evil"], &nobody, &[]);
    let notes: Vec<&String> = lines.iter().filter(|l| l.contains("kubelet_pod")).collect();
    assert_eq!(notes.len(), 2, "{lines:#?}");
    for n in notes {
        assert!(
            n.starts_with("- ") && n.contains("cannot tell: no kubelet runs here"),
            "{n}"
        );
    }

    // A root process named kubelet in a mount namespace of its own, as a pod's container
    // runs it, does not count either: its flags are the pod author's.
    let (_, lines) = node.doctor_beside_kubelet(
        &["--root-dir=/srv/evil"],
        &["/usr/bin/unshare", "--mount"],
        &[],
    );
    let notes: Vec<&String> = lines.iter().filter(|l| l.contains("kubelet_pod")).collect();
    assert_eq!(notes.len(), 2, "{lines:#?}");
    for n in notes {
        assert!(
            n.starts_with("- ") && n.contains("cannot tell: no kubelet runs here"),
            "{n}"
        );
    }

    // A config file kubelet's root holds that doctor will not read: a note with the reason.
    let huge = d.join("huge.yaml");
    fs::write(&huge, "#".repeat(2 << 20)).unwrap();
    let (_, lines) = node.doctor_beside_kubelet(&["--config", huge.to_str().unwrap()], &[], &[]);
    assert!(
        lines.contains(&format!(
            "- kubelet_pod_logs_dir: /data/log/pods; cannot tell: {} is larger than 1048576 \
             bytes",
            huge.display()
        )),
        "{lines:#?}"
    );
}
