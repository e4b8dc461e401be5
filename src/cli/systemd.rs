//! Restarting a host's service through its own systemd, as the installer does for
//! containerd (which reads its config and devgate's base spec only at start): the host's
//! `systemctl`, run inside the host root, talks to the host's systemd over its socket in
//! /run/systemd. containerd's unit kills only containerd itself (KillMode=process), so the
//! running containers and their shims, the installer's own among them, stay.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    let mut cmd = command(root, &prog, args)?;
    let shown = format!("systemctl {}", args.join(" "));
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("cannot run {shown}"), &prog, e))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::invalid(
                    shown,
                    format!("did not finish within {} s", deadline.as_secs()),
                ));
            }
            Err(e) => return Err(Error::io(format!("cannot wait for {shown}"), &prog, e)),
        }
    };
    if status.success() {
        return Ok(());
    }
    let out = output(&mut child);
    Err(Error::invalid(
        shown,
        format!(
            "failed ({status}): {}",
            crate::model::text::one_line(out.trim())
        ),
    ))
}

/// The `systemctl ARGS` command, in the host's root when `root` is not `/`.
fn command(root: &Path, prog: &Path, args: &[&str]) -> Result<Command> {
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        // Inside a pod, systemctl may take the chroot for one and then ignore `restart`
        // without an error; the chroot here is the host's own root.
        .env("SYSTEMD_IGNORE_CHROOT", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if root != Path::new("/") {
        let dir = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| Error::invalid("--root", "holds a NUL byte"))?;
        // SAFETY: chroot and chdir are async-signal-safe; the path was made before fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::chroot(dir.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    Ok(cmd)
}

/// What a failed systemctl wrote, stderr first, each pipe bounded.
fn output(child: &mut std::process::Child) -> String {
    let mut out = String::new();
    for pipe in [
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut buf = Vec::new();
        let _ = pipe.take(MAX_OUTPUT).read_to_end(&mut buf);
        out.push_str(&String::from_utf8_lossy(&buf));
    }
    out
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
