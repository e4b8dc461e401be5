//! Booting the forky image under systemd-nspawn (systemd as PID 1, cgroup v2), as the
//! tests that need systemd do (tests/e2e_systemd_remap.rs, tests/e2e_install_enable.rs):
//! the image, a cgroup of the test's own for nspawn, and reading what the boot said.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The forky image's root (scripts/forky-stack.sh builds or finds it), or why there is none.
pub fn forky_image() -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/forky-stack.sh");
    let out = Command::new(&script)
        .arg("image")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last() {
        Some(l) if out.status.success() && Path::new(l).is_dir() => Ok(PathBuf::from(l)),
        _ => Err(format!(
            "scripts/forky-stack.sh image failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )),
    }
}

/// A cgroup of the test's own on the unified hierarchy (`/sys/fs/cgroup/unified` on a
/// hybrid host) for systemd-nspawn, which makes `payload` and `supervisor` beside itself:
/// in a cgroup shared with other runs they collide.
pub fn own_cgroup(tag: &str) -> Option<PathBuf> {
    let base = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists())?;
    let me = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = me.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = base
        .join(rel.trim_start_matches('/'))
        .join(format!("{tag}-{}", std::process::id()));
    fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

/// Removes a cgroup tree, deepest first; what still holds a process stays.
pub fn remove_cgroup(dir: &Path) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
