//! Running a host's own program inside the host root the installer is given (`--root`),
//! as the DaemonSet does from its pod: the host's systemctl, the host's containerd.

use crate::error::IoCause;
use crate::model::text::one_line;
use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// Makes `cmd` run inside `root` (chroot, then `/` as its directory), where `root` is not
/// already `/`; its program and arguments are then paths as the host names them.
pub fn run_inside(cmd: &mut Command, root: &Path) -> Result<(), RunError> {
    if root == Path::new("/") {
        return Ok(());
    }
    let dir = CString::new(root.as_os_str().as_encoded_bytes())
        .map_err(|_| RunError::Root(root.to_path_buf()))?;
    // SAFETY: chroot and chdir are async-signal-safe; the path was made before fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::chroot(dir.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// `p` (absolute, on the host) under the host root.
pub fn under(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

/// The first of `candidates` (paths under the host root, as the host names them without
/// the leading `/`) that is a file there, as the host names it.
pub fn program_under(root: &Path, candidates: &[&str]) -> Option<PathBuf> {
    candidates
        .iter()
        .find(|p| fs::symlink_metadata(root.join(p)).is_ok_and(|m| m.is_file()))
        .map(|p| Path::new("/").join(p))
}

/// How a host program run with [`output_within`] (inside a host root, [`run_inside`]) fell
/// short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// The host root's path holds a NUL byte: no program can be run inside it.
    Root(PathBuf),
    Spawn(IoCause),
    Wait(IoCause),
    Deadline(Duration),
    /// Its exit status, and the last line it wrote on stderr (else stdout).
    Failed(ExitStatus, String),
    TooLarge(u64),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Root(root) => write!(f, "{} holds a NUL byte", root.display()),
            RunError::Spawn(e) => write!(f, "cannot run: {e}"),
            RunError::Wait(e) => write!(f, "cannot wait for it: {e}"),
            RunError::Deadline(d) => write!(f, "did not finish in {} s", d.as_secs()),
            RunError::Failed(status, said) => write!(f, "failed ({status}): {said}"),
            RunError::TooLarge(max) => write!(f, "wrote more than {max} bytes"),
        }
    }
}

/// Reads at most `max` bytes of `pipe` on a thread of its own, so that a program writing
/// more than a pipe holds never blocks on it while it is waited for. The bytes come on the
/// channel once the pipe closes.
fn drain<R: Read + Send + 'static>(pipe: Option<R>, max: u64) -> Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(p) = pipe {
            let _ = p.take(max).read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

/// What a pipe's reader got, waiting no longer than `left`: a program that exited may have
/// left a child holding the pipe open (a daemon it started), which must not hold us.
fn drained(rx: &Receiver<Vec<u8>>, left: Duration) -> Vec<u8> {
    rx.recv_timeout(left.max(Duration::from_millis(100)))
        .unwrap_or_default()
}

/// Runs `cmd` to its end within `deadline` (killed past it), with stdin on /dev/null; its
/// stdout, at most `max_out` bytes, where it succeeds.
pub fn output_within(
    mut cmd: Command,
    deadline: Duration,
    max_out: u64,
) -> Result<Vec<u8>, RunError> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| RunError::Spawn(e.into()))?;
    let stdout = drain(child.stdout.take(), max_out + 1);
    let stderr = drain(child.stderr.take(), 64 << 10);
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Deadline(deadline));
            }
            Err(e) => return Err(RunError::Wait(e.into())),
        }
    };
    let left = deadline.saturating_sub(started.elapsed());
    let stdout = drained(&stdout, left);
    let stderr = drained(&stderr, left);
    if !status.success() {
        let last = |b: &[u8]| {
            String::from_utf8_lossy(b)
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| one_line(l.trim()))
        };
        let said = last(&stderr).or_else(|| last(&stdout)).unwrap_or_default();
        return Err(RunError::Failed(status, said));
    }
    if stdout.len() as u64 > max_out {
        return Err(RunError::TooLarge(max_out));
    }
    Ok(stdout)
}
