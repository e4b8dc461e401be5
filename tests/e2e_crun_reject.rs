//! Where crun runs, a reject reaches the caller only through devgate's runtime wrapper:
//! crun sends a hook's stdout and stderr to /dev/null, so a hooks-only node shows
//! ``error executing hook `…` (exit code: 1)`` and nothing of devgate's line. The wrapper
//! decides before crun is exec'd and reports on stderr and in the runtime's `--log`; these
//! tests drive podman, containerd's CRI and `ctr` with the wrapper in front of crun and
//! look for devgate's line in what each of them tells its caller.

mod common;
use common::*;
use std::fs;
use std::path::{Path, PathBuf};

const REJECT_LINE: &str =
    r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "crun test"; policy reject"#;

/// A config with `runtime.path` crun and /dev/zero cordoned.
fn crun_env(tag: &str) -> Env {
    let env = Env::with(tag, serde_json::json!({"runtime": {"path": "crun"}}));
    env.ok(&["cordon", "/dev/zero", "--reason", "crun test"]);
    env
}

/// The wrapper as conmon or a shim starts it: a path, no arguments, the config from the
/// environment (conmon does not pass podman's on, so the script sets it).
fn wrapper_script(dir: &Path, name: &str, env: &Env) -> PathBuf {
    let path = dir.join(name);
    fs::write(
        &path,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}.calls'\n\
             DEVGATE_CONFIG='{}' exec '{}' \"$@\"\n",
            path.display(),
            env.config.display(),
            devgate_runtime_bin().display()
        ),
    )
    .unwrap();
    fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// podman's containers.conf with `runtime_supports_json` naming the wrapper: podman then
/// passes `--log-format=json --log FILE` and parses FILE as one JSON object.
fn supports_json(podman: &Podman, name: &str) {
    let conf = podman.dir.join("containers.conf");
    let text = fs::read_to_string(&conf).unwrap();
    let text = text.replacen(
        "[engine]\n",
        &format!("[engine]\nruntime_supports_json = [\"{name}\"]\n"),
        1,
    );
    fs::write(&conf, text).unwrap();
}

/// podman 5 keeps its locks in one shared-memory segment per machine: two podmans with
/// separate roots at once fail ("failed to open 2048 locks in /libpod_lock").
static PODMAN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn podman_reject(json_log: bool) {
    let _one = PODMAN.lock().unwrap_or_else(|e| e.into_inner());
    let tag = if json_log { "crun-pj" } else { "crun-ps" };
    let podman = Podman::new(tag);
    let env = crun_env(&format!("{tag}-env"));
    let name = "devgate-crun";
    let runtime = wrapper_script(&env.dir, name, &env);
    if json_log {
        supports_json(&podman, name);
    }
    let out = podman
        .cmd_with_runtime(&runtime)
        .args(["run", "--rm", "--network", "none", "--device", "/dev/zero"])
        .arg(TEST_IMAGE)
        .args(["echo", "ran"])
        .output()
        .unwrap();
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("ran"),
        "{all}"
    );
    // podman's own error line (stderr's last) carries devgate's line
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("Error: "), "{all}");
    assert!(last.contains(REJECT_LINE), "{all}");
    // the log podman asked for, or none
    let calls = fs::read_to_string(format!("{}.calls", runtime.display())).unwrap();
    let create = calls
        .lines()
        .find(|l| l.contains(" create "))
        .unwrap_or_default();
    assert_eq!(create.contains("--log-format=json"), json_log, "{calls}");
    let decisions = env.decisions();
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!(decisions[0]["message"], REJECT_LINE);
}

/// podman without `runtime_supports_json` for the wrapper (as the shipped snippet names
/// it): conmon reads the runtime's stderr into podman's error.
#[test]
fn podman_error_carries_the_reject_line_from_the_wrappers_stderr() {
    require_root!();
    require_cmd("crun", "crun");
    podman_reject(false);
}

/// podman with `runtime_supports_json` for the wrapper: the error comes from `--log`,
/// which podman parses as exactly one JSON object.
#[test]
fn podman_error_carries_the_reject_line_from_the_wrappers_json_log() {
    require_root!();
    require_cmd("crun", "crun");
    podman_reject(true);
}

/// `ctr run --runc-binary WRAPPER`: the runc.v2 shim reads the last `level:"error"` entry
/// of the runtime's JSON `--log` into "OCI runtime create failed: …", which ctr prints.
/// crun never runs for a reject, so this holds on any cgroup layout.
#[test]
fn ctr_error_carries_the_reject_line() {
    require_root!();
    require_cmd("crun", "crun");
    let cd = Containerd::start(
        "crun-ctr",
        "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]",
        "",
    );
    const NS: &str = "devgate";
    cd.import_test_image(NS);
    let rootfs = cd.dir.join("rootfs");
    fs::create_dir_all(&rootfs).unwrap();
    cd.ctr_ok(
        NS,
        &[
            "images",
            "mount",
            "--rw",
            TEST_IMAGE,
            rootfs.to_str().unwrap(),
        ],
    );
    let env = crun_env("crun-ctr-env");
    let runtime = wrapper_script(&env.dir, "devgate-runtime", &env);
    let mut spec = base_spec(&["echo", "ran"]);
    spec["root"] = serde_json::json!({"path": rootfs});
    spec["linux"]["devices"] = serde_json::json!([{"path": "/dev/zero", "type": "c",
        "major": 1, "minor": 5, "fileMode": 0o666, "uid": 0, "gid": 0}]);
    let spec_path = cd.dir.join("spec.json");
    fs::write(&spec_path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let out = cd.ctr(
        NS,
        &[
            "run",
            "--rm",
            "--runc-binary",
            runtime.to_str().unwrap(),
            "--config",
            spec_path.to_str().unwrap(),
            "cordoned",
        ],
    );
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("ran"),
        "{all}"
    );
    assert!(
        all.contains(&format!("OCI runtime create failed: {REJECT_LINE}")),
        "{all}\n{}",
        cd.log()
    );
    let decisions = env.decisions();
    assert_eq!(
        decisions.last().unwrap()["action"],
        "reject",
        "{decisions:?}"
    );
    let _ = cd.ctr(NS, &["containers", "rm", "cordoned"]);
    let _ = cd.ctr(NS, &["images", "unmount", rootfs.to_str().unwrap()]);
}

/// containerd's CRI with devgate's wrapper as the runc.v2 shim's `BinaryName` in front of
/// crun and devgate's hooks in the base spec: StartContainer fails with devgate's line, and
/// ContainerStatus (what kubelet shows) says StartError with it. crun 1.8 refuses this
/// host's hybrid layout, so containerd, its shims and crun run where /sys/fs/cgroup has
/// the v1 controllers only; the pod sandbox itself runs under crun through the wrapper.
#[test]
fn cri_start_error_carries_the_reject_line() {
    use common::cri::{self, Cri, PodGuard};
    require_root!();
    require_cmd("crun", "crun");
    if let Some(why) = node::unified_without("cpu") {
        eprintln!("skipped: {why}: a CRI pod sandbox sets cpu.weight");
        return;
    }
    if !fake::v1_devices_or_skip() {
        return;
    }
    let work = tempdir("crun-cri");
    let env = crun_env("crun-cri-env");
    let runtime = wrapper_script(&work, "devgate-runtime", &env);
    let base_spec = work.join("devgate-base-spec.json");
    fs::write(&base_spec, containerd_base_spec_for(&env)).unwrap();
    let version = cri::Config::of_containerd();
    let runc = version.runc_table();
    let config = format!(
        "{runc}\n  runtime_type = \"io.containerd.runc.v2\"\n  base_runtime_spec = \"{}\"\n\
         {}.options]\n  BinaryName = \"{}\"\n  Root = \"{}\"\n\n{}",
        base_spec.display(),
        runc.trim_end_matches(']'),
        runtime.display(),
        work.join("runtime-root").display(),
        version.plugin_settings(TEST_IMAGE)
    );
    let v1_only = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "umount /sys/fs/cgroup/unified && exec \"$0\" \"$@\"",
    ];
    let cd = Containerd::start_under("crun-cri", version.top(), &config, &v1_only);
    cd.import_test_image("k8s.io");
    let mut c = Cri::connect(&cd.socket);
    let uid = "crun-cri-uid";
    let pod = cri::host_network_pod("gpu-pod", uid, "ml", &work.join("pods").join(uid));
    let pod_id = c
        .run_pod_sandbox(&pod)
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", cd.log()));
    let _guard = PodGuard {
        socket: cd.socket.clone(),
        id: pod_id.clone(),
    };
    let spec = cri::container("trainer", TEST_IMAGE, &["echo", "ran"], &["/dev/zero"]);
    let cid = c
        .create_container(&pod_id, spec, &pod)
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", cd.log()));
    let err = c
        .start_container(&cid)
        .expect_err("StartContainer must fail for a cordoned device");
    assert!(err.message().contains(REJECT_LINE), "{err}");
    let st = c.container_status(&cid).unwrap();
    assert_eq!(st.reason, "StartError", "{st:?}");
    assert!(st.message.contains(REJECT_LINE), "{st:?}");
    let last = env.decisions().last().cloned().unwrap();
    assert_eq!(last["action"], "reject");
    assert_eq!(last["stage"], "create", "the wrapper decided: {last}");
    assert_eq!(last["container_id"], cid.as_str());
    c.remove_container(&cid).unwrap();
    c.stop_pod_sandbox(&pod_id).unwrap();
    c.remove_pod_sandbox(&pod_id).unwrap();
}
