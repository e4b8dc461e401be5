//! devgate under rootful podman (runc), through the oci-hooks(5) files `devgate
//! hooks-config` generates — the same generator the shipped hooks/oci-hooks.d files come
//! from — and, after `dpkg -i` of the .deb, through the installed files themselves.

mod common;
use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;

const REJECT_LINE: &str =
    r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "podman test"; policy reject"#;

fn container_ids_in_log(env: &Env) -> Vec<String> {
    env.decisions()
        .iter()
        .filter_map(|l| l["container_id"].as_str().map(String::from))
        .collect()
}

#[test]
fn podman_rejects_cordoned_device_runs_healthy_and_runs_poststop() {
    require_root!();
    let podman = Podman::new("podman");
    let env = Env::new("podman-env");
    // The hook files, generated for the test build; the hook is a wrapper that records
    // every call and then runs the test build's hook front (which hands to devgate).
    let (wrapper, trace) = tracing_wrapper(&env.dir, &devgate_hook_bin());
    let hooks_dir = env.dir.join("hooks.d");
    let config = env.config.to_str().unwrap();
    let said = hooks_config(&[
        "--config",
        config,
        "hooks-config",
        "--runtime",
        "podman",
        "--bin",
        wrapper.to_str().unwrap(),
        "--out",
        hooks_dir.to_str().unwrap(),
    ]);
    assert_eq!(said.lines().count(), 1, "{said}");

    // healthy: the container runs, devgate decided allow at prestart, poststop ran
    let out = podman.run(
        &hooks_dir,
        &["--device", "/dev/zero"],
        &["sh", "-c", "echo ran; test -c /dev/zero"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    let lines = env.decisions();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["action"], "allow");
    assert_eq!(lines[0]["stage"], "prestart");
    assert_eq!(
        lines[0]["devices"][0]["device"]["container_path"],
        "/dev/zero"
    );
    let id = lines[0]["container_id"].as_str().unwrap().to_string();
    // one hooks.d file, `hook auto` for both stages: prestart sees the state being created
    // (runc: creating), poststop sees it stopped
    assert_eq!(
        traced_stages(&trace, &id),
        ["auto/creating", "auto/stopped"],
        "{}",
        fs::read_to_string(&trace).unwrap_or_default()
    );
    // poststop left an exit record (no fault), and explain shows the stop
    let exit: serde_json::Value =
        serde_json::from_slice(&fs::read(env.dir.join(format!("state/exits/{id}.json"))).unwrap())
            .unwrap();
    assert_eq!(exit["container_id"], id.as_str());
    assert_eq!(exit["faults"], serde_json::json!([]));
    let explained = env.ok(&["explain", &id]);
    assert!(explained.contains("stopped at "), "{explained}");

    // cordoned: podman's error carries devgate's line; the process never ran
    env.ok(&["cordon", "/dev/zero", "--reason", "podman test"]);
    let out = podman.run(&hooks_dir, &["--device", "/dev/zero"], &["echo", "ran"]);
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains(REJECT_LINE), "{all}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("ran"),
        "{all}"
    );
    let lines = env.decisions();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1]["action"], "reject");
    assert_eq!(lines[1]["message"], REJECT_LINE);

    // a container without devices is untouched by the cordon
    let out = podman.run(&hooks_dir, &[], &["echo", "ran"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        container_ids_in_log(&env).len(),
        2,
        "no devices, no decision"
    );

    env.ok(&["uncordon", "/dev/zero"]);
    let out = podman.run(&hooks_dir, &["--device", "/dev/zero"], &["echo", "ran"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// Restores the node's quarantine of /dev/zero however the test ends.
struct Uncordon<'a>(&'a Path);

impl Drop for Uncordon<'_> {
    fn drop(&mut self) {
        let _ = Command::new(self.0)
            .args(["uncordon", "/dev/zero"])
            .env_remove("DEVGATE_CONFIG")
            .output();
    }
}

/// After `dpkg -i target/debian/devgate_*.deb` (.ci/run does it and sets
/// DEVGATE_TEST_INSTALLED=1): podman with the packaged hooks.d directory, the packaged
/// binary and the packaged /etc/devgate/config.json. It cordons /dev/zero in the node's
/// own ledger for the length of the test.
#[test]
fn podman_with_installed_package_files() {
    require_root!();
    if std::env::var_os("DEVGATE_TEST_INSTALLED").is_none() {
        eprintln!("skipped: set DEVGATE_TEST_INSTALLED=1 after installing the .deb (.ci/run does)");
        return;
    }
    let hooks_dir = Path::new("/usr/share/containers/oci/hooks.d");
    let bin = Path::new("/usr/bin/devgate");
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(hooks_dir.join("devgate.json")).unwrap()).unwrap();
    assert_eq!(v["hook"]["path"], "/usr/bin/devgate-hook");
    assert!(Path::new("/etc/devgate/config.json").is_file());
    let podman = Podman::new("podman-installed");

    let out = podman.run(hooks_dir, &["--device", "/dev/zero"], &["echo", "ran"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");

    let _restore = Uncordon(bin);
    let out = Command::new(bin)
        .args(["cordon", "/dev/zero", "--reason", "podman test"])
        .env_remove("DEVGATE_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let out = podman.run(hooks_dir, &["--device", "/dev/zero"], &["echo", "ran"]);
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains(REJECT_LINE), "{all}");
}
