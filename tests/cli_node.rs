//! The operator's node view: status, check (node-problem-detector contract), metrics,
//! explain; and the reason codes they carry beside the words.

mod common;
use common::*;
use std::fs;

fn with_gpus(tag: &str) -> (Env, std::path::PathBuf) {
    let dev_root = tempdir(&format!("{tag}-dev"));
    for i in 0..2u64 {
        nix::sys::stat::mknod(
            &dev_root.join(format!("nvidia{i}")),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, i),
        )
        .unwrap();
    }
    let env = Env::with(
        tag,
        serde_json::json!({ "dev_root": dev_root, "nvml_library": "/nonexistent/libnvidia-ml.so.1" }),
    );
    (env, dev_root)
}

#[test]
fn check_follows_health_and_status_lists_gpus() {
    require_root!();
    let (env, dev_root) = with_gpus("check");
    let out = env.devgate(&["check"]);
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    // NVML is absent here, so the GPUs may be healthy (no NVML probe) or unknown: never unhealthy.
    assert!(
        matches!(out.status.code(), Some(0) | Some(2)),
        "{}",
        text(&out)
    );
    assert_eq!(line.lines().count(), 1, "{line}");

    let node = dev_root.join("nvidia1");
    env.ok(&["cordon", node.to_str().unwrap(), "--reason", "xid 79"]);
    let out = env.devgate(&["check"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        line.starts_with("devgate: 1 of 2 devices unhealthy: "),
        "{line}"
    );
    assert!(
        line.contains("(195:1): quarantine: quarantined by operator: \"xid 79\""),
        "{line}"
    );

    let status: serde_json::Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let rows = status.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{status}");
    assert_eq!(rows[1]["class"], "nvidia-gpu");
    assert_eq!(rows[1]["health"], "unhealthy");
    assert_eq!(
        rows[1]["roles"],
        serde_json::json!(["accelerator", "quarantined"])
    );
    assert_eq!(rows[1]["quarantine"]["reason"], "xid 79");
    let quarantine = rows[1]["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["probe"] == "quarantine")
        .unwrap();
    assert_eq!(quarantine["code"], "quarantined", "{quarantine}");

    let textfile = env.dir.join("textfile/devgate.prom");
    fs::create_dir_all(textfile.parent().unwrap()).unwrap();
    env.ok(&["metrics", "--textfile", textfile.to_str().unwrap()]);
    let prom = fs::read_to_string(&textfile).unwrap();
    assert!(
        prom.contains("devgate_device_quarantined{device=\""),
        "{prom}"
    );
    assert!(
        prom.contains("class=\"nvidia-gpu\",major_minor=\"195:1\"} 1\n"),
        "{prom}"
    );
    assert!(prom.contains("devgate_exit_records 0\n"), "{prom}");
    assert!(
        prom.contains(
            "major_minor=\"195:1\",probe=\"quarantine\",status=\"unhealthy\",code=\"quarantined\"} 1\n"
        ),
        "{prom}"
    );

    env.ok(&["uncordon", "195:1"]);
    let out = env.devgate(&["check"]);
    assert_ne!(out.status.code(), Some(1), "{}", text(&out));
}

#[test]
fn metrics_refuses_world_writable_directory() {
    let env = Env::new("metrics-dir");
    let dir = env.dir.join("open");
    fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let out = env.devgate(&[
        "metrics",
        "--textfile",
        dir.join("x.prom").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("writable by group or others"),
        "{}",
        text(&out)
    );
    assert!(!dir.join("x.prom").exists());
}

#[test]
fn a_second_cordon_says_what_it_replaces() {
    let env = Env::new("cordon-twice");
    let first = env.ok(&["cordon", "c:1:5", "--reason", "xid 79 seen"]);
    assert_eq!(
        first.trim_end(),
        "devgate: cordoned c 1:5 (c:1:5): \"xid 79 seen\""
    );
    let second = env.ok(&["cordon", "1:5", "--reason", "still bad"]);
    assert!(
        second.starts_with(
            "devgate: cordoned c 1:5 (1:5): \"still bad\" (replaces \"xid 79 seen\" by "
        ),
        "{second}"
    );
    env.ok(&["uncordon", "1:5"]);
    let again = env.ok(&["cordon", "1:5", "--reason", "new"]);
    assert_eq!(again.trim_end(), "devgate: cordoned c 1:5 (1:5): \"new\"");
}

#[test]
fn a_device_path_that_is_gone_points_at_maj_min() {
    let env = Env::new("uncordon-gone");
    let out = env.devgate(&["uncordon", "/nonexistent/nvidia1"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        "devgate: error: cannot stat device /nonexistent/nvidia1: no such file or directory \
         (os error 2); name a device without a node by MAJ:MIN (devgate status lists it)"
    );
}

#[test]
fn a_bad_command_line_is_one_line() {
    let env = Env::new("bad-cli");
    for (args, want) in [
        (
            &["explain"][..],
            "devgate: error: bad command line: explain; usage: devgate [--config PATH] \
             explain CONTAINER_ID [--json]",
        ),
        (
            &["statsu"][..],
            "devgate: error: unknown command \"statsu\"; `devgate help` lists the commands",
        ),
    ] {
        let out = env.devgate(args);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim_end(), want);
    }
    assert_eq!(
        env.ok(&["--version"]).trim_end(),
        format!("devgate {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_relative_textfile_is_named_in_the_error() {
    let env = Env::new("metrics-relative");
    let out = env.devgate(&["metrics", "--textfile", "devgate.prom"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        "devgate: error: --textfile devgate.prom is not an absolute path"
    );
}

#[test]
fn a_missing_spare_is_said_to_be_missing() {
    let env = Env::with(
        "spare-missing",
        serde_json::json!({"spares": {"char": ["/nonexistent/spare0", "/etc/hostname"]}}),
    );
    let out = env.devgate(&["status"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "devgate: warn: spare /nonexistent/spare0 (class char): cannot stat \
             /nonexistent/spare0: no such file or directory (os error 2)\n"
        ),
        "{err}"
    );
    assert!(
        err.contains("devgate: warn: spare /etc/hostname (class char) is not a device node\n"),
        "{err}"
    );
}

/// A rejected start: the reject line's words are the contract kubelet users read, and
/// `explain --json` carries each verdict's code beside them for tools.
#[test]
fn a_reject_keeps_its_line_and_explain_json_carries_the_code() {
    let env = Env::new("reject-code");
    let mut b = Bundle::new("reject-code", &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.write();
    env.ok(&["cordon", "1:5", "--reason", "xid 79 seen"]);
    let out = env.hook_stdin("prestart", b.state_json("reject-code").as_bytes());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "devgate: rejected /dev/zero (1:5): quarantined by operator: \"xid 79 seen\"; policy reject\n"
    );
    let v: serde_json::Value =
        serde_json::from_str(&env.ok(&["explain", "reject-code", "--json"])).unwrap();
    let verdicts = &v["start"]["devices"][0]["verdicts"];
    let quarantine = verdicts
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["probe"] == "quarantine")
        .unwrap();
    assert_eq!(
        quarantine,
        &serde_json::json!({"probe": "quarantine", "status": "unhealthy",
            "code": "quarantined", "reason": "quarantined by operator: \"xid 79 seen\""})
    );
    let node = verdicts
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["probe"] == "node");
    assert_eq!(
        node.unwrap(),
        &serde_json::json!({"probe": "node", "status": "healthy"}),
        "a healthy verdict has no code"
    );
}
