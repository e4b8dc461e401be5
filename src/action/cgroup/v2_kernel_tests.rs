//! The cgroup v2 device programs for real: a cgroup under this machine's cgroup2 hierarchy,
//! a process moved into it, runtime-like programs attached, then extended by devgate's
//! remap; opens from inside the cgroup are checked before and after. (Root only; run by
//! `cargo test` as root in CI.)

use crate::action::cgroup::{self, v2};
use crate::model::device::{DevNum, DevType};
use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceCgroupBuilder};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

fn cgroup2_root() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup::parse_mountinfo(&mi)
        .into_iter()
        .find(|m| m.fstype == "cgroup2" && m.root == "/")
        .map(|m| m.mount_point)
}

fn char_dev(minor: u32) -> DevNum {
    DevNum {
        typ: DevType::Char,
        major: 1,
        minor,
    }
}

const NULL: u32 = 3;
const ZERO: u32 = 5;
const FULL: u32 = 7;
const URANDOM: u32 = 9;

/// A shell in the cgroup that, for each line it reads, tries to open four devices and says
/// what happened.
const PROBE: &str = "while read x; do r=; \
  for d in null zero full urandom; do if true </dev/$d; then r=\"$r $d=ok\"; else r=\"$r $d=denied\"; fi; done; \
  echo $r; done";

fn deny_all() -> LinuxDeviceCgroup {
    LinuxDeviceCgroupBuilder::default()
        .allow(false)
        .access("rwm")
        .build()
        .unwrap()
}

fn allowing(minors: &[u32]) -> Vec<LinuxDeviceCgroup> {
    let mut v = vec![deny_all()];
    v.extend(
        minors
            .iter()
            .map(|m| cgroup::device_rule(true, char_dev(*m), "rwm")),
    );
    v
}

/// A fresh cgroup with a probing shell in it; removed when dropped.
struct Probe {
    dir: PathBuf,
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Probe {
    fn new(tag: &str) -> Option<Probe> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return None;
        }
        let Some(root) = cgroup2_root() else {
            eprintln!("skipped: no cgroup2 hierarchy mounted");
            return None;
        };
        let dir = root.join(format!("devgate-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap();
        let mut child = Command::new("/bin/busybox")
            .args(["sh", "-c", PROBE])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).unwrap();
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Some(Probe {
            dir,
            child,
            stdin,
            out,
        })
    }

    fn ask(&mut self) -> String {
        self.stdin.write_all(b"go\n").unwrap();
        let mut a = String::new();
        self.out.read_line(&mut a).unwrap();
        a.trim().to_string()
    }

    /// The runtime's attach; a kernel that refuses device programs to root is the only
    /// reason to skip (EINVAL would be devgate's own layout or flags, and fails).
    fn attach(&self, rules: &[LinuxDeviceCgroup]) -> bool {
        match v2::attach_new(&self.dir, rules) {
            Ok(()) => true,
            Err(e) => {
                let msg = e.to_string();
                if msg.contains("operation not permitted")
                    || msg.contains("function not implemented")
                {
                    eprintln!("skipped: the kernel refuses cgroup device programs here: {msg}");
                    return false;
                }
                panic!("{msg}");
            }
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The runtime's program and a second one another hook added (ANDed with it): the remap
/// must reach both, or the spare stays denied by the one it missed.
#[test]
fn remap_extends_every_attached_program_in_place() {
    let Some(mut p) = Probe::new("multi") else {
        return;
    };
    if !p.attach(&allowing(&[NULL, ZERO, URANDOM])) {
        return;
    }
    p.attach(&allowing(&[NULL, ZERO, FULL]));
    let (before, flags) = v2::query(&p.dir).unwrap();
    assert_eq!(before.len(), 2);
    assert_eq!(flags & v2::BPF_F_ALLOW_MULTI, v2::BPF_F_ALLOW_MULTI);
    assert_eq!(p.ask(), "null=ok zero=ok full=denied urandom=denied");

    let done = v2::remap(&p.dir, char_dev(ZERO), char_dev(FULL)).unwrap();
    assert_eq!(p.ask(), "null=ok zero=denied full=ok urandom=denied");
    assert_eq!(done.old, before);
    assert_eq!(done.how, "replaced in place");
    let (after, _) = v2::query(&p.dir).unwrap();
    assert_eq!(after, done.new, "the kernel's order kept");
    assert!(after.iter().all(|id| !before.contains(id)), "{after:?}");

    // a second remap stacks on the first
    let again = v2::remap(&p.dir, char_dev(NULL), char_dev(URANDOM)).unwrap();
    assert_eq!(again.old, after);
    assert_eq!(p.ask(), "null=denied zero=denied full=ok urandom=ok");
}

#[test]
fn remap_of_a_cgroup_without_a_program_denies_only_the_bad_device() {
    let Some(mut p) = Probe::new("none") else {
        return;
    };
    assert_eq!(p.ask(), "null=ok zero=ok full=ok urandom=ok");
    let done = match v2::remap(&p.dir, char_dev(ZERO), char_dev(FULL)) {
        Ok(d) => d,
        Err(e) if e.to_string().contains("operation not permitted") => {
            eprintln!("skipped: the kernel refuses cgroup device programs here: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    assert_eq!(done.how, "attached (none was)");
    assert!(done.old.is_empty());
    assert_eq!(done.new.len(), 1);
    assert_eq!(p.ask(), "null=ok zero=denied full=ok urandom=ok");
}

#[test]
fn remap_reads_back_what_the_kernel_keeps() {
    let Some(p) = Probe::new("read") else {
        return;
    };
    if !p.attach(&allowing(&[NULL])) {
        return;
    }
    let (ids, _) = v2::query(&p.dir).unwrap();
    let fd = v2::prog_fd_by_id(ids[0]).unwrap();
    let insns = v2::instructions(&fd).unwrap();
    // what devgate loaded, as the kernel gives it back: the emulator decides the same
    let want = cgroup::bpf::program(&allowing(&[NULL])).unwrap();
    use cgroup::bpf::{emulate, ACC_READ, DEV_CHAR};
    for minor in [NULL, ZERO] {
        assert_eq!(
            emulate(&insns, DEV_CHAR, ACC_READ, 1, minor),
            emulate(&want, DEV_CHAR, ACC_READ, 1, minor)
        );
    }
}

#[test]
fn remap_on_a_cgroup_that_does_not_exist_names_it() {
    let e = v2::remap(
        Path::new("/sys/fs/cgroup/unified/devgate-no-such"),
        char_dev(ZERO),
        char_dev(FULL),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("/sys/fs/cgroup/unified/devgate-no-such"), "{e}");
}
