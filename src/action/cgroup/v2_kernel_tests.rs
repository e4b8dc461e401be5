//! The cgroup v2 device program for real: a cgroup under this machine's cgroup2 hierarchy,
//! a process moved into it, a runtime-like program attached, then replaced by devgate's;
//! opens from inside the cgroup are checked before and after. (Root only; run by
//! `cargo test` as root in CI.)

use crate::action::cgroup::{self, v2};
use crate::model::device::{DevNum, DevType};
use oci_spec::runtime::LinuxDeviceCgroupBuilder;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn cgroup2_root() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup::parse_mountinfo(&mi)
        .into_iter()
        .find(|m| m.fstype == "cgroup2" && m.root == "/")
        .map(|m| m.mount_point)
}

const NULL: DevNum = DevNum {
    typ: DevType::Char,
    major: 1,
    minor: 3,
};
const ZERO: DevNum = DevNum {
    typ: DevType::Char,
    major: 1,
    minor: 5,
};

/// A shell in the cgroup that, for each line it reads, tries to open /dev/null and
/// /dev/zero and says what happened.
const PROBE: &str = "while read x; do \
  if true </dev/null; then echo null=ok; else echo null=denied; fi; \
  if true </dev/zero; then echo zero=ok; else echo zero=denied; fi; \
done";

#[test]
fn v2_device_program_attach_then_replace_takes_effect() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let Some(root) = cgroup2_root() else {
        eprintln!("skipped: no cgroup2 hierarchy mounted");
        return;
    };
    let dir = root.join(format!("devgate-test-{}", std::process::id()));
    let _ = std::fs::remove_dir(&dir);
    std::fs::create_dir(&dir).unwrap();

    // The runtime's program: deny all, allow null and zero.
    let runtime_rules = vec![
        LinuxDeviceCgroupBuilder::default()
            .allow(false)
            .access("rwm")
            .build()
            .unwrap(),
        cgroup::device_rule(true, NULL, "rwm"),
        cgroup::device_rule(true, ZERO, "rwm"),
    ];
    if let Err(e) = v2::attach_new(&dir, &runtime_rules) {
        let _ = std::fs::remove_dir(&dir);
        let msg = e.to_string();
        // Only a kernel without bpf(2) or one that forbids it to root is a reason to skip;
        // EINVAL would be devgate's own attach layout or flags, and fails the test.
        if msg.contains("operation not permitted") || msg.contains("function not implemented") {
            eprintln!("skipped: the kernel refuses cgroup device programs here: {msg}");
            return;
        }
        panic!("{msg}");
    }
    let (before, flags) = v2::query(&dir).unwrap();
    assert_eq!(before.len(), 1);
    assert_eq!(flags & v2::BPF_F_ALLOW_MULTI, v2::BPF_F_ALLOW_MULTI);

    let mut child = Command::new("/bin/busybox")
        .args(["sh", "-c", PROBE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |stdin: &mut std::process::ChildStdin| {
        stdin.write_all(b"go\n").unwrap();
        let mut a = String::new();
        let mut b = String::new();
        out.read_line(&mut a).unwrap();
        out.read_line(&mut b).unwrap();
        format!("{} {}", a.trim(), b.trim())
    };
    let first = ask(&mut stdin);

    // devgate's replacement: the same rules, then deny zero.
    let mut rules = runtime_rules.clone();
    rules.push(cgroup::device_rule(false, ZERO, "rwm"));
    let replaced = v2::replace(&dir, &rules);
    let second = ask(&mut stdin);
    let after = v2::query(&dir);
    drop(stdin);
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir(&dir);

    assert_eq!(first, "null=ok zero=ok", "before the replacement");
    let replaced = replaced.unwrap();
    assert_eq!(replaced.old, before);
    assert_eq!(second, "null=ok zero=denied", "after the replacement");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Operation not permitted"), "{stderr}");
    let (after, _) = after.unwrap();
    assert_eq!(after.len(), 1, "the old program was detached: {after:?}");
    assert!(!before.contains(&after[0]));
}

#[test]
fn v2_replace_on_a_cgroup_that_does_not_exist_names_it() {
    let e = v2::replace(Path::new("/sys/fs/cgroup/unified/devgate-no-such"), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("/sys/fs/cgroup/unified/devgate-no-such"), "{e}");
}
