//! `make demo` as a newcomer runs it: on a fresh clone of the repository (this checkout's
//! HEAD), under the real runc, with the fake NVML. The clone builds into this build's target
//! directory (CARGO_TARGET_DIR), so that only devgate itself is compiled again.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The target directory this test binary was built in: `<target>/debug/devgate`'s grandparent.
fn target_dir() -> PathBuf {
    let bin = devgate_bin();
    bin.parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{bin:?} is not under a target directory"))
        .to_path_buf()
}

#[test]
fn make_demo_on_a_fresh_clone_tells_the_whole_story() {
    require_root!();
    require_cmd("git", "git");
    require_cmd("make", "make");
    require_cmd("runc", "runc");
    let work = tempdir("demo-clone");
    let clone = work.join("devgate");
    let out = Command::new("git")
        .args(["clone", "--quiet", "--no-hardlinks"])
        .arg(env!("CARGO_MANIFEST_DIR"))
        .arg(&clone)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git clone of {} failed (the test runs the committed HEAD): {}",
        env!("CARGO_MANIFEST_DIR"),
        text(&out)
    );

    let out = Command::new("make")
        .arg("demo")
        .current_dir(&clone)
        .env("CARGO_TARGET_DIR", target_dir())
        .env_remove("DEVGATE_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let all = text(&out);
    assert!(out.status.success(), "make demo failed:\n{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // b: the start after the XID is rejected with devgate's line
    assert!(
        stdout.lines().any(
            |l| l.trim_start().starts_with("devgate: rejected /dev/nvidia0")
                && l.contains("xid 79 (GPU has fallen off the bus)")
                && l.ends_with("; policy reject")
        ),
        "no reject for XID 79:\n{all}"
    );
    // c: the remap to the spare, and the container saw the spare
    assert!(
        stdout.lines().any(|l| l
            .trim_start()
            .starts_with("devgate: remapped /dev/nvidia0 (host ")
            && l.contains("/dev/nvidia1 (195:1): xid: xid 79")),
        "no remap:\n{all}"
    );
    assert!(
        stdout.contains("container: my /dev/nvidia0 is device 195,1"),
        "{all}"
    );
    // d: the fault during the run, in the termination message and the exit record
    assert!(
        stdout.lines().any(|l| l
            .trim_start()
            .starts_with("devgate: DeviceFault/ECCUncorrectable on /dev/nvidia0 (GPU-")),
        "no DeviceFault in the termination message:\n{all}"
    );
    assert!(
        stdout.contains("exit record: faults DeviceFault/ECCUncorrectable"),
        "{all}"
    );
    assert!(
        stdout.contains("demo: ok, every step did what it said"),
        "{all}"
    );
    // Nothing left behind: the demo's temp dir is gone with its containers.
    let dir = stdout
        .split("all under ")
        .nth(1)
        .and_then(|s| s.lines().next())
        .expect("the demo names its temp dir");
    assert!(!Path::new(dir).exists(), "the demo left {dir}");
    let _ = std::fs::remove_dir_all(&work);
}
