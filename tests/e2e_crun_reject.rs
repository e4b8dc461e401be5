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
