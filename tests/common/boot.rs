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

/// Whether this is the forky stack's own pass, where there is no systemd to boot from (the
/// host's pass boots the image itself); says so as a skip.
pub fn skip_in_forky_pass() -> bool {
    let forky = std::env::var("DEVGATE_STACK").as_deref() == Ok("forky");
    if forky {
        eprintln!(
            "skipped: boots the forky image under systemd-nspawn itself, from the host's pass"
        );
    }
    forky
}

/// The forky image to boot, or `None` having said why there is none to boot.
pub fn image_to_boot() -> Option<PathBuf> {
    if Command::new("systemd-nspawn")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-nspawn is not installed (apt-get install systemd-container)");
        return None;
    }
    match forky_image() {
        Ok(r) => Some(r),
        Err(why) => {
            eprintln!("skipped: no forky image: {why}");
            None
        }
    }
}

/// One boot of the image: `out` is bound at /dgout and holds `run.sh`, the test's script.
pub struct Boot<'a> {
    /// The unit's description, and the tag of the test's own cgroup.
    pub description: &'a str,
    pub tag: &'a str,
    /// `timeout` around the whole nspawn, and around the script where set.
    pub nspawn_timeout_s: u32,
    pub script_timeout_s: Option<u32>,
    /// nspawn's arguments beyond the ones every boot takes (binds, tmpfs).
    pub args: Vec<String>,
    /// How much of run.log the answer keeps: its last lines, or all of it.
    pub run_tail: Option<usize>,
}

/// Boots the image at `root` with systemd as PID 1 on cgroup v2 and a unit that runs
/// `out/run.sh` (under `sh -x`, to `out/run.log`) once the system is up, then powers the
/// machine off; `out/state` gets what `systemctl is-system-running` said. In a cgroup of the
/// test's own, removed after. Returns the console's tail and run.log, for failures.
pub fn boot(root: &Path, out: &Path, b: &Boot) -> String {
    let script = match b.script_timeout_s {
        Some(s) => format!("timeout {s} sh -x /dgout/run.sh"),
        None => "sh -x /dgout/run.sh".into(),
    };
    fs::write(
        out.join("dgtest.service"),
        format!(
            "[Unit]\nDescription={}\nAfter=basic.target\n[Service]\nType=exec\n\
             ExecStart=/bin/sh -c 'timeout 60 systemctl is-system-running --wait \
             >/dgout/state 2>&1; {script} >/dgout/run.log 2>&1; systemctl poweroff'\n",
            b.description
        ),
    )
    .unwrap();
    let cg = own_cgroup(b.tag);
    let mut cmd = Command::new("sh");
    // Into the test's own cgroup, then nspawn.
    cmd.arg("-c")
        .arg("[ -z \"$0\" ] || echo $$ >\"$0/cgroup.procs\" && exec \"$@\"")
        .arg(cg.as_deref().map(|p| p.as_os_str()).unwrap_or_default());
    cmd.env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1")
        .arg("timeout")
        .arg(b.nspawn_timeout_s.to_string())
        .args(["systemd-nspawn", "--quiet", "--boot", "--register=no"])
        .args(["--keep-unit", "--volatile=overlay", "--capability=all"])
        // runc and crun load device programs with bpf(); nspawn filters it by default.
        .arg("--system-call-filter=bpf keyctl add_key")
        .arg(format!("--directory={}", root.display()))
        .arg(format!("--bind={}:/dgout", out.display()))
        .arg(format!(
            "--bind-ro={}:/etc/systemd/system/dgtest.service",
            out.join("dgtest.service").display()
        ))
        .args(&b.args)
        .arg("systemd.wants=dgtest.service")
        .stdin(std::process::Stdio::null());
    let o = cmd.output().unwrap();
    if let Some(cg) = &cg {
        remove_cgroup(cg);
    }
    let console = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let run = fs::read_to_string(out.join("run.log")).unwrap_or_default();
    let run = match b.run_tail {
        Some(n) => tail(&run, n),
        None => run,
    };
    format!("console (tail): {}\nrun.log:\n{run}", tail(&console, 20))
}
