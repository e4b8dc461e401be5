//! Restarting a host's service through its own systemd, as the installer does for
//! containerd (which reads its config and devgate's base spec only at start): the host's
//! `systemctl`, run inside the host root, talks to the host's systemd over its socket in
//! /run/systemd. containerd's unit kills only containerd itself (KillMode=process), so the
//! running containers and their shims, the installer's own among them, stay.

use super::host_exec::{self as host, RunError};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// containerd's unit, as its packages name it.
pub(super) const CONTAINERD_UNIT: &str = "containerd.service";
/// How long a restart may take: containerd loads its plugins and snapshots first.
const RESTART_DEADLINE: Duration = Duration::from_secs(120);
/// What systemctl prints that devgate passes on.
const MAX_OUTPUT: u64 = 4096;

/// The host's systemctl under `root`, where the host runs systemd.
fn systemctl(root: &Path) -> Result<PathBuf> {
    let booted = root.join("run/systemd/system");
    if !booted.is_dir() {
        return Err(Error::invalid(
            "--restart",
            format!(
                "{} is not there: the host does not run systemd; restart containerd yourself \
                 (docs/install.md)",
                booted.display()
            ),
        ));
    }
    ["/usr/bin/systemctl", "/bin/systemctl"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| root.join(p.strip_prefix("/").unwrap_or(p)).is_file())
        .ok_or_else(|| {
            Error::invalid(
                "--restart",
                format!("no systemctl under {}", root.display()),
            )
        })
}

/// Runs the host's `systemctl ARGS` inside `root`, within `deadline`; its output on failure.
fn run(root: &Path, args: &[&str], deadline: Duration) -> Result<()> {
    let prog = systemctl(root)?;
    let mut cmd = Command::new(&prog);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        // Inside a pod, systemctl may take the chroot for one and then ignore `restart`
        // without an error; the chroot here is the host's own root.
        .env("SYSTEMD_IGNORE_CHROOT", "1");
    host::run_inside(&mut cmd, root).map_err(|e| Error::invalid("--root", e.to_string()))?;
    let shown = format!("systemctl {}", args.join(" "));
    match host::output_within(cmd, deadline, MAX_OUTPUT) {
        Ok(_) => Ok(()),
        Err(RunError::Spawn(e)) => Err(Error::io(format!("cannot run {shown}"), &prog, e.0)),
        Err(e) => Err(Error::invalid(shown, e.to_string())),
    }
}

/// Fails where the host at `root` has no systemd to restart a unit with.
pub(super) fn check(root: &Path) -> Result<()> {
    systemctl(root).map(|_| ())
}

/// Restarts `unit` on the host at `root` and waits until systemd has it running again.
pub(super) fn restart(root: &Path, unit: &str) -> Result<()> {
    run(root, &["restart", unit], RESTART_DEADLINE)?;
    run(
        root,
        &["is-active", "--quiet", unit],
        Duration::from_secs(10),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_without_systemd_is_told_to_restart_by_hand() {
        let root = std::env::temp_dir().join(format!("dg-sd-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let e = restart(&root, CONTAINERD_UNIT).unwrap_err().to_string();
        assert!(e.contains("does not run systemd"), "{e}");
        std::fs::create_dir_all(root.join("run/systemd/system")).unwrap();
        let e = restart(&root, CONTAINERD_UNIT).unwrap_err().to_string();
        assert!(e.contains("no systemctl under"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
