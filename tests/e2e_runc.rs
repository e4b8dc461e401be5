//! The prestart gate end to end under the real runc and crun.

mod common;
use common::*;
use std::fs;

fn gated_bundle(env: &Env, tag: &str, devices: &[(&str, u32, u32)]) -> Bundle {
    let mut b = Bundle::new(tag, &["sh", "-c", "echo ran > /out/ran"]);
    for (path, major, minor) in devices {
        b.add_device(path, "c", *major, *minor);
    }
    b.add_hooks(env, &["prestart", "poststop"]);
    b
}

fn gate_cycle(runtime: &str) {
    let env = Env::new(&format!("gate-{runtime}"));
    let mut b = gated_bundle(&env, runtime, &[("/dev/null", 1, 3), ("/dev/zero", 1, 5)]);
    // runc puts a failed hook's stderr into its error; crun keeps hook output only where
    // the run.oci.hooks.stderr annotation says (README, Troubleshooting).
    let hook_stderr = b.dir.join("hooks.stderr");
    if runtime == "crun" {
        b.spec["annotations"] = serde_json::json!({"run.oci.hooks.stderr": hook_stderr});
    }

    // (a) healthy devices: the container starts and its process runs
    let out = runtime_run(runtime, &b, &unique_id("a"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");
    fs::remove_file(b.marker()).unwrap();

    // (b) cordoned: the start fails with devgate's line and the process never runs
    let said = env.ok(&["cordon", "/dev/zero", "--reason", "xid 79 seen"]);
    assert!(said.contains("cordoned c 1:5"), "{said}");
    let out = runtime_run(runtime, &b, &unique_id("b"));
    let mut all = text(&out);
    if runtime == "crun" {
        all.push_str(&fs::read_to_string(&hook_stderr).unwrap_or_default());
    }
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(r#"devgate: rejected /dev/zero (1:5): quarantined by operator: \"xid 79 seen\"; policy reject"#)
            || all.contains(r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "xid 79 seen"; policy reject"#),
        "{all}"
    );
    assert!(
        !b.marker().exists(),
        "the container process ran although rejected"
    );

    // the decision was logged with the container and its devices
    let lines = env.log_lines();
    let last = lines.last().expect("a decision log line");
    assert_eq!(last["action"], "reject");
    assert_eq!(last["stage"], "prestart");
    assert_eq!(last["devices"].as_array().unwrap().len(), 2);

    // (c) uncordoned: it starts again
    env.ok(&["uncordon", "/dev/zero"]);
    let out = runtime_run(runtime, &b, &unique_id("c"));
    assert!(out.status.success(), "{}", text(&out));
    assert!(b.marker().exists());
}

#[test]
fn runc_gate_allows_rejects_and_allows_again() {
    require_root!();
    gate_cycle("runc");
}

#[test]
fn crun_gate_allows_rejects_and_allows_again() {
    require_root!();
    assert!(
        have("crun"),
        "crun is not installed: make test installs it (scripts/install-test-deps.sh)"
    );
    gate_cycle("crun");
}

#[test]
fn runc_container_without_devices_starts() {
    require_root!();
    let env = Env::new("nodev");
    let b = gated_bundle(&env, "nodev", &[]);
    let out = runtime_run("runc", &b, &unique_id("d"));
    assert!(out.status.success(), "{}", text(&out));
    assert!(b.marker().exists());
    assert!(env.log_lines().is_empty(), "no devices, no decision to log");
}

#[test]
fn runc_gpu_rule_only_device_without_host_node_is_rejected() {
    require_root!();
    // A GPU reached only through a cgroup rule, on a node where no such GPU exists.
    let dev_root = tempdir("devroot");
    let env = Env::with("rule", serde_json::json!({"dev_root": dev_root}));
    let mut b = gated_bundle(&env, "rule", &[]);
    b.spec["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"allow": true, "type": "c", "major": 195, "minor": 3, "access": "rw"}));
    let out = runtime_run("runc", &b, &unique_id("r"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("devgate: rejected c 195:3 (195:3): no device node c 195:3 under"),
        "{all}"
    );
    assert!(!b.marker().exists());
}

/// runc reads config.json with Go's encoding/json, which takes `"Devices"` for `devices`:
/// a quarantined device listed under it would reach the container unchecked if devgate
/// read keys exactly and ignored the rest. Such a spec is refused, naming the key.
#[test]
fn runc_refuses_a_device_listed_under_a_key_spelled_otherwise() {
    require_root!();
    let env = Env::new("gokeys");
    let mut b = gated_bundle(&env, "gokeys", &[("/dev/zero", 1, 5)]);
    env.ok(&["cordon", "/dev/zero", "--reason", "xid 79 seen"]);
    let devices = b.spec["linux"]
        .as_object_mut()
        .unwrap()
        .remove("devices")
        .unwrap();
    b.spec["linux"]["Devices"] = devices;
    let out = runtime_run("runc", &b, &unique_id("k"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(r#"non-canonical key \"Devices\" at linux"#)
            || all.contains(r#"non-canonical key "Devices" at linux"#),
        "{all}"
    );
    assert!(!b.marker().exists(), "the container process ran");
}
