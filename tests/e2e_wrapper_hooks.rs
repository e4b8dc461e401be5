//! The recommended setup on a GPU node, as the packages install it: `devgate-runtime` in
//! front of the real runc and the shipped hooks (`devgate-hook`), all beside `devgate`,
//! under real runc on the fake NVML. Hook entries that name no `env` (OCI allows them) get
//! runc's own environment, which is what devgate exec'd runc with: nothing devgate marks
//! its own processes with may be in it.

mod common;
use common::fake_nvml::*;
use common::*;
use serde_json::json;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A root-owned directory holding copies of devgate, its hook front and its runtime
/// wrapper: /usr/bin as the packages lay it out.
fn install_dir(tag: &str) -> PathBuf {
    let dir = tempdir(tag).join("bin");
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    for (from, name) in [
        (devgate_bin(), "devgate"),
        (devgate_hook_bin(), "devgate-hook"),
        (devgate_runtime_bin(), "devgate-runtime"),
    ] {
        fs::copy(from, dir.join(name)).unwrap();
    }
    dir
}

/// A hook entry with no `env`: runc runs it with runc's own environment.
fn hook_without_env(bin: &Path, env: &Env, stage: &str) -> serde_json::Value {
    json!({
        "path": bin.join("devgate-hook"),
        "args": ["devgate", "--config", env.config, "hook", stage],
        "timeout": 10
    })
}

/// The names of the `DEVGATE_*` variables in an `env` dump that devgate put there: not
/// the operator's DEVGATE_CONFIG, nor one the test itself runs with (the forky pass sets
/// DEVGATE_STACK), which every process inherits.
fn devgate_vars(dump: &str) -> Vec<String> {
    dump.lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_string()))
        .filter(|k| k.starts_with("DEVGATE_") && k != "DEVGATE_CONFIG")
        .filter(|k| std::env::var_os(k).is_none())
        .collect()
}

/// The wrapper hands a GPU create to devgate (marked as handed on), devgate gates it and
/// execs runc; runc's hooks without `env` then ran with that mark, the hook front took
/// itself for devgate handed on again and refused every GPU container. A healthy GPU
/// container must start, its hooks seeing none of devgate's own variables (the operator's
/// DEVGATE_CONFIG aside).
#[test]
fn a_gpu_container_starts_through_the_wrapper_and_hooks_without_env() {
    require_root!();
    if !have("runc") {
        eprintln!("skipped: no runc");
        return;
    }
    let node = GpuNode::new("wrh-gpu");
    let mut config = node.config();
    config["runtime"] = json!({"path": "runc"});
    let env = Env::with("wrh-gpu", config);
    let bin = install_dir("wrh-gpu");
    let healthy = write_scenario(&node.dir, "healthy", &healthy_node());
    let mut b = Bundle::new("wrh-gpu", &["sh", "-c", "echo ran > /out/ran"]);
    b.add_device("/dev/nvidia1", "c", 195, 1);
    let dump = b.dir.join("hook-env");
    for stage in ["prestart", "poststop"] {
        b.spec["hooks"][stage] = json!([hook_without_env(&bin, &env, stage)]);
    }
    b.spec["hooks"]["prestart"].as_array_mut().unwrap().push(
        json!({"path": "/bin/sh", "args": ["sh", "-c", format!("env > '{}'", dump.display())]}),
    );
    b.write();
    let id = unique_id("wrh");
    let root = b.dir.join("runtime-root");
    let run = |args: &[&str]| {
        Command::new(bin.join("devgate-runtime"))
            .env("DEVGATE_CONFIG", &env.config)
            .env("FAKE_NVML_CONFIG", &healthy)
            .env_remove("DEVGATE_RUNTIME_WRAPPED")
            .env_remove("DEVGATE_HANDED_ON")
            .arg("--root")
            .arg(&root)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run(&["run", "--bundle", b.dir.to_str().unwrap(), &id]);
    let _ = run(&["delete", "--force", &id]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(b.marker().exists(), "the container never ran");
    let seen = fs::read_to_string(&dump).unwrap();
    // No mark at all: runc and crun cannot lead back to the wrapper, so not even its loop
    // mark goes to them.
    assert_eq!(
        devgate_vars(&seen),
        Vec::<String>::new(),
        "a hook saw devgate's own variables"
    );
    let last = env.decisions().pop().unwrap();
    assert_eq!(
        (last["action"].as_str(), last["container_id"].as_str()),
        (Some("allow"), Some(id.as_str()))
    );
}
