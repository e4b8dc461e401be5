//! The tests' own temp directories: made per test, gone when the test process exits, and
//! their removal never reaches through a mount a test left behind into a host directory.

mod common;

use common::{mount_points, remove_tree, tempdir, KEEP_ENV};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set for the child run of [`makes_a_dir_and_exits`]: where it writes the path it made.
const REPORT_ENV: &str = "DEVGATE_TEST_DIRS_REPORT";

/// Not a test of its own: run by [`a_test_process_removes_its_dirs_when_it_exits`] in a
/// child test process, it makes a directory with a file in it and says where.
#[test]
fn makes_a_dir_and_exits() {
    let Some(report) = std::env::var_os(REPORT_ENV) else {
        return;
    };
    let d = tempdir("exit-check");
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::write(d.join("sub/file"), b"x").unwrap();
    fs::write(report, d.as_os_str().as_encoded_bytes()).unwrap();
}

fn run_child(report: &Path, keep: bool) -> PathBuf {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "makes_a_dir_and_exits", "--test-threads=1"])
        .env(REPORT_ENV, report)
        .env_remove(KEEP_ENV);
    if keep {
        cmd.env(KEEP_ENV, "1");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    PathBuf::from(fs::read_to_string(report).unwrap())
}

#[test]
fn a_test_process_removes_its_dirs_when_it_exits() {
    let here = tempdir("exit-report");
    let made = run_child(&here.join("path"), false);
    assert!(made.starts_with(std::env::temp_dir()), "{}", made.display());
    assert!(!made.exists(), "{} is still there", made.display());
    // and kept when asked, for a look after a failure
    let kept = run_child(&here.join("path2"), true);
    assert!(kept.join("sub/file").exists(), "{}", kept.display());
    fs::remove_dir_all(&kept).unwrap();
}

/// A bind mount left under a test directory (here of a directory on the same filesystem,
/// so st_dev cannot tell it apart) keeps what it shows: the removal stops at the mount.
#[test]
fn removal_never_enters_a_mount_left_below() {
    require_root!();
    let src = tempdir("bind-src");
    fs::write(src.join("host-file"), b"keep").unwrap();
    let top = tempdir("bind-top");
    fs::create_dir_all(top.join("a/mnt")).unwrap();
    fs::write(top.join("a/other"), b"x").unwrap();
    nix::mount::mount(
        Some(&src),
        &top.join("a/mnt"),
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    remove_tree(&top, &mount_points());
    let survived = fs::read(src.join("host-file"));
    let other_gone = !top.join("a/other").exists();
    nix::mount::umount(&top.join("a/mnt")).unwrap();
    assert_eq!(survived.unwrap(), b"keep");
    assert!(other_gone, "what is not under the mount is removed");
    remove_tree(&top, &mount_points());
    assert!(!top.exists());
}
