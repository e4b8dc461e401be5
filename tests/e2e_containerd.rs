//! devgate under a private containerd (`ctr run --config`), on a spec built from the
//! shipped base runtime spec (hooks/containerd/devgate-base-spec.json) with its hooks
//! pointed at the test build.

mod common;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;

const NS: &str = "devgate";

/// The shipped base spec with the hooks `devgate hooks-config` generates for the test build
/// and its config, the process, a mounted image rootfs and the devices.
fn spec_from_shipped_base(env: &Env, rootfs: &Path, devices: &[(&str, u32, u32)]) -> Value {
    let shipped: Value = serde_json::from_str(
        &fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/containerd/devgate-base-spec.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let generated: Value = serde_json::from_str(&containerd_base_spec_for(env)).unwrap();
    // Only the hook path and the config argument differ from what ships.
    let mut expect = generated.clone();
    for stage in ["prestart", "poststop"] {
        expect["hooks"][stage][0]["path"] = json!("/usr/bin/devgate-hook");
        expect["hooks"][stage][0]["args"] = json!(["devgate", "hook", stage]);
    }
    assert_eq!(
        expect, shipped,
        "generated base spec differs from the shipped one"
    );

    let mut spec = generated;
    spec["process"]["args"] = json!(["sh", "-c", "echo ran"]);
    spec["process"]["env"] = json!(["PATH=/bin"]);
    spec["root"] = json!({"path": rootfs});
    let mut devs = Vec::new();
    for (path, major, minor) in devices {
        devs.push(
            json!({"path": path, "type": "c", "major": major, "minor": minor,
                         "fileMode": 0o666, "uid": 0, "gid": 0}),
        );
        spec["linux"]["resources"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(
                json!({"allow": true, "type": "c", "major": major, "minor": minor,
                         "access": "rwm"}),
            );
    }
    spec["linux"]["devices"] = Value::Array(devs);
    spec
}

#[test]
fn containerd_ctr_run_with_base_spec_rejects_cordoned_and_runs_healthy() {
    require_root!();
    let cd = Containerd::start(
        "ctr",
        "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]",
        "",
    );
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

    let env = Env::new("ctr-env");
    let spec = spec_from_shipped_base(&env, &rootfs, &[("/dev/zero", 1, 5)]);
    let spec_path = cd.dir.join("spec.json");
    fs::write(&spec_path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let run = |id: &str| {
        cd.ctr(
            NS,
            &["run", "--rm", "--config", spec_path.to_str().unwrap(), id],
        )
    };

    // healthy
    let out = run("healthy");
    assert!(out.status.success(), "{}\n{}", text(&out), cd.log());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    let lines = env.decisions();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["container_id"], "healthy");
    assert_eq!(lines[0]["action"], "allow");

    // cordoned: ctr's error carries devgate's line and the process never ran
    env.ok(&["cordon", "/dev/zero", "--reason", "ctr test"]);
    let out = run("cordoned");
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(
            r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "ctr test"; policy reject"#
        ),
        "{all}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("ran"),
        "{all}"
    );
    assert_eq!(env.decisions()[1]["action"], "reject");
    let _ = cd.ctr(NS, &["containers", "rm", "cordoned"]);

    // uncordoned: it runs again
    env.ok(&["uncordon", "/dev/zero"]);
    let out = run("again");
    assert!(out.status.success(), "{}", text(&out));

    let _ = cd.ctr(NS, &["images", "unmount", rootfs.to_str().unwrap()]);
}
