//! The node shapes the runtime tests run on, and the runtimes on them.
//!
//! - `Node::Host`: this machine as it is, hybrid (v1 controllers, cgroup2 at
//!   /sys/fs/cgroup/unified): runc keeps device policy in the v1 devices controller.
//! - `Node::V2`: a true cgroup v2 node, made per command in a private mount namespace
//!   (`unshare -m`, propagation private, `mount -t cgroup2 none /sys/fs/cgroup`). A runtime
//!   started there runs in its unified mode: the container lands in `0::/<path>` and its
//!   devices are enforced only by eBPF programs. That namespace's cgroup2 has no
//!   controllers besides hugetlb (the v1 hierarchies hold the rest), so containers there
//!   ask for no resources but devices. Nothing outside the namespace changes except the
//!   runtime's own cgroup directories, which it removes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Host,
    V2,
}

impl Node {
    pub const ALL: [Node; 2] = [Node::Host, Node::V2];

    pub fn name(self) -> &'static str {
        match self {
            Node::Host => "v1",
            Node::V2 => "v2",
        }
    }

    /// `program` as a command on this node; arguments added later are the program's.
    pub fn command(self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match self {
            Node::Host => Command::new(program),
            Node::V2 => {
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg(r#"mount -t cgroup2 none /sys/fs/cgroup && exec "$0" "$@""#)
                    .arg(program);
                c
            }
        }
    }

    /// The node's cgroup2 hierarchy as this (host) process sees it, where a test makes
    /// cgroups that a command on the node sees at /sys/fs/cgroup.
    pub fn cgroup2_root() -> PathBuf {
        let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        devgate::action::cgroup::parse_mountinfo(&mi)
            .into_iter()
            .find(|m| m.fstype == "cgroup2" && m.root == "/")
            .map(|m| m.mount_point)
            .expect("a cgroup2 hierarchy is mounted")
    }
}

/// A runtime on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runtime {
    pub bin: &'static str,
    pub node: Node,
    /// false: crun `--cgroup-manager=disabled` (the gate needs no cgroup).
    pub cgroups: bool,
}

impl Runtime {
    pub const RUNC: Runtime = Runtime {
        bin: "runc",
        node: Node::Host,
        cgroups: true,
    };
    pub const RUNC_V2: Runtime = Runtime {
        bin: "runc",
        node: Node::V2,
        cgroups: true,
    };
    /// crun 1.8 refuses a hybrid layout whose cgroup2 still has a controller (hugetlb
    /// here), so crun always runs on the v2 node.
    pub const CRUN_NO_CGROUPS: Runtime = Runtime {
        bin: "crun",
        node: Node::V2,
        cgroups: false,
    };
    pub const CRUN_V2: Runtime = Runtime {
        bin: "crun",
        node: Node::V2,
        cgroups: true,
    };

    /// What the older tests call "runc" and "crun".
    pub fn named(name: &str) -> Runtime {
        match name {
            "crun" => Runtime::CRUN_NO_CGROUPS,
            _ => Runtime::RUNC,
        }
    }

    pub fn name(&self) -> String {
        let cg = if self.cgroups { "" } else { ", no cgroups" };
        format!("{} on {}{cg}", self.bin, self.node.name())
    }

    /// The runtime's command line with its own state root.
    pub fn command(&self, root: &Path) -> Command {
        let mut cmd = self.node.command(self.bin);
        if self.bin == "crun" && self.cgroups {
            if let Some(shim) = crun_memlock_shim() {
                cmd.env("LD_PRELOAD", shim);
            }
        }
        cmd.arg("--root").arg(root);
        if self.bin == "crun" && !self.cgroups {
            cmd.arg("--cgroup-manager=disabled");
        }
        cmd
    }
}

/// capability(7) number.
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process may raise RLIMIT_MEMLOCK's hard limit: it is already unlimited, or
/// the process has CAP_SYS_RESOURCE.
fn may_raise_memlock() -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: fills a valid rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0
        && lim.rlim_max == libc::RLIM_INFINITY
    {
        return true;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

const MEMLOCK_SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/resource.h>
/* crun 1.8 sets RLIMIT_MEMLOCK to infinity before loading its device program and fails
   when it may not. Since Linux 5.11 BPF memory is charged to the memory cgroup, not to
   this limit; crun 1.9 and later fall back to the current hard limit, as this does. */
int setrlimit(__rlimit_resource_t res, const struct rlimit *lim) {
  int (*real)(__rlimit_resource_t, const struct rlimit *) = dlsym(RTLD_NEXT, "setrlimit");
  int r = real(res, lim);
  if (r < 0 && errno == EPERM && res == RLIMIT_MEMLOCK) {
    struct rlimit cur;
    if (getrlimit(RLIMIT_MEMLOCK, &cur) == 0) {
      cur.rlim_cur = cur.rlim_max;
      return real(res, &cur);
    }
  }
  return r;
}
"#;

/// crun 1.8 with its cgroups on fails at `setrlimit (RLIM_MEMLOCK)` where the hard limit
/// is finite and CAP_SYS_RESOURCE is missing (a container as CI machine). There it runs
/// with a preload that does what later crun versions do; elsewhere it runs as it is.
pub fn crun_memlock_shim() -> Option<&'static Path> {
    static SHIM: OnceLock<Option<PathBuf>> = OnceLock::new();
    SHIM.get_or_init(|| {
        if may_raise_memlock() {
            return None;
        }
        eprintln!(
            "note: this machine may not raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE); crun \
             runs with a setrlimit preload that falls back to the hard limit, as crun >= 1.9 does"
        );
        let dir = super::tempdir("crun-memlock");
        let src = dir.join("memlock.c");
        std::fs::write(&src, MEMLOCK_SHIM).unwrap();
        let so = dir.join("memlock.so");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&src)
            .arg("-ldl")
            .output()
            .expect("cc runs");
        assert!(
            out.status.success(),
            "building the crun memlock preload failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(so)
    })
    .as_deref()
}

/// The major version of the containerd on PATH, from `containerd --version`
/// ("containerd github.com/containerd/containerd/v2 2.1.9+unknown"); 0 when it says none.
pub fn containerd_major() -> u32 {
    let out = Command::new("containerd").arg("--version").output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    parse_containerd_major(&text.unwrap_or_default())
}

pub fn parse_containerd_major(version: &str) -> u32 {
    version
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim_start_matches('v').parse().ok())
        .unwrap_or(0)
}

/// The CRI runtime plugin's table name in the config containerd runs with: containerd 2.x
/// (config version 3) renamed the 1.x one, and doctor names the daemon's own.
pub fn cri_runtime_plugin() -> &'static str {
    super::cri::Config::of_containerd().runtime_plugin()
}

/// Why a container with resources cannot start here, when /sys/fs/cgroup is a unified
/// (cgroup2 alone) hierarchy that lacks `controller`: this host binds cpu, memory and pids
/// to cgroup v1, so a cgroup2 mounted alone has none of them (the forky stack with
/// FORKY_CGROUP=v2). None on a hybrid node, or where the controller is there.
pub fn unified_without(controller: &str) -> Option<String> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let unified = devgate::action::cgroup::parse_mountinfo(&mi)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == Path::new("/sys/fs/cgroup"))
        .is_some_and(|m| m.fstype == "cgroup2");
    let have = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    (unified && !have.split_whitespace().any(|c| c == controller)).then(|| {
        format!(
            "/sys/fs/cgroup is cgroup2 alone without the {controller} controller (this \
             host binds it to cgroup v1; issue 20)"
        )
    })
}
