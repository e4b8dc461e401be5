//! The programs devgate hands work to: the dynamically linked `devgate` beside the
//! statically linked fronts (`devgate-runtime`, `devgate-hook`), which cannot load NVML.
//! Root runs them on every container start, so each is held to the rule every program root
//! executes for devgate is held to: a regular executable file that only root (or whoever
//! runs devgate) could have written.
//!
//! The hand-on itself, when a front execs devgate and how, is `crate::front`'s. What is
//! here is what more than the front needs, below it too: which devgate a static process
//! may run ([`devgate_beside`], also for its NVML query processes), the marks one devgate
//! process leaves the next, whether this process is linked statically, the trust check
//! (doctor's and the runtime wrapper's too), and an input handed on as an anonymous file.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

/// The dynamically linked devgate's file name.
pub const DEVGATE: &str = "devgate";

/// The statically linked hook front's (src/hook_main.rs), beside devgate: what the shipped
/// hook files run.
pub const HOOK_FRONT: &str = "devgate-hook";

/// Set in the environment of the devgate a statically linked program hands work to
/// (`crate::front::exec_devgate`, and a static process's NVML query processes). A
/// statically linked program that finds it was started that way as devgate: the devgate
/// beside the front is statically linked too (a link to or a copy of the front), cannot
/// load NVML either, and would hand the work on to itself without end.
pub const HANDED_ON_ENV: &str = "DEVGATE_HANDED_ON";

/// Set in the real runtime's environment by the runtime wrapper: a devgate wrapper that
/// finds it was started, through some chain of wrappers, by itself. The one mark that
/// leaves devgate on purpose, and only where the runtime is not runc or crun themselves:
/// the loop it guards against runs through programs that are not devgate (another
/// wrapper, a script) and keep only the environment.
pub const WRAPPED_ENV: &str = "DEVGATE_RUNTIME_WRAPPED";

/// A mark one devgate process leaves in the environment of the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// [`HANDED_ON_ENV`].
    HandedOn,
    /// [`WRAPPED_ENV`].
    Wrapped,
}

impl Mark {
    const ALL: [Mark; 2] = [Mark::HandedOn, Mark::Wrapped];

    pub fn var(self) -> &'static str {
        match self {
            Mark::HandedOn => HANDED_ON_ENV,
            Mark::Wrapped => WRAPPED_ENV,
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The marks this process found at its start ([`take_marks`]).
static FOUND: AtomicU8 = AtomicU8::new(0);

/// Notes which marks this process was started with, and removes them from its
/// environment: runc gives its own environment to every hook entry that sets no `env`, so
/// a mark still there when devgate execs the runtime reached the hook front, which then
/// took itself for a devgate handed on again and refused every GPU container. Run first
/// in every devgate program, before any thread exists (the environment is not locked
/// against C code).
pub fn take_marks() {
    for m in Mark::ALL {
        if std::env::var_os(m.var()).is_some() {
            FOUND.fetch_or(m.bit(), Ordering::Relaxed);
            std::env::remove_var(m.var());
        }
    }
}

/// Whether this process was started with `mark` ([`take_marks`]).
pub fn started_with(mark: Mark) -> bool {
    FOUND.load(Ordering::Relaxed) & mark.bit() != 0
}

/// `name` in this program's own directory (/usr/bin/devgate beside /usr/bin/devgate-hook).
pub fn beside(name: &str) -> std::io::Result<PathBuf> {
    Ok(std::env::current_exe()?.with_file_name(name))
}

/// The devgate beside this program, checked with [`check_trusted`]. A statically linked
/// program started by another as devgate ([`HANDED_ON_ENV`]) is refused one.
pub fn devgate_beside() -> Result<PathBuf> {
    let devgate =
        beside(DEVGATE).map_err(|e| Error::io("cannot find", Path::new("/proc/self/exe"), e))?;
    if linked_statically() && started_with(Mark::HandedOn) {
        return Err(Error::invalid(
            "devgate",
            format!(
                "{} is linked statically, as the hook front is (a link to or a copy of \
                 {HOOK_FRONT}?): it cannot load NVML and would hand the call on to itself",
                devgate.display()
            ),
        ));
    }
    check_program(&devgate)?;
    Ok(devgate)
}

/// `path` (its links followed) is a program root may run for devgate: a regular executable
/// file, [`check_trusted`].
pub fn check_program(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io("cannot find", path, e))?;
    if !is_executable_file(&meta) {
        return Err(Error::invalid(
            "devgate",
            format!("{} is not an executable file", path.display()),
        ));
    }
    check_trusted(path, &meta)
}

pub fn is_executable_file(meta: &std::fs::Metadata) -> bool {
    meta.is_file() && meta.mode() & 0o111 != 0
}

/// Owned by root (or whoever runs devgate) and writable by nobody else.
pub fn check_trusted(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(Error::unsafe_path(
            path,
            format!("owned by uid {}, not root", meta.uid()),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Error::unsafe_path(
            path,
            format!(
                "writable by group or others (mode {:o})",
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Whether this process was linked statically: a static glibc program cannot safely
/// dlopen a library that links libc itself (NVML), so such a process asks the dynamically
/// linked devgate instead. The kernel tells: a dynamically linked program's auxiliary
/// vector names its interpreter's load address (AT_BASE), a static one's is 0.
pub fn linked_statically() -> bool {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave the process.
    unsafe { libc::getauxval(libc::AT_BASE) == 0 }
}

/// An anonymous file holding `bytes`, at offset 0, inherited across exec: the runtime
/// reads it as its stdin or as `/proc/self/fd/N`.
pub fn memfd(name: &str, bytes: &[u8]) -> Result<File> {
    let name = std::ffi::CString::new(name).unwrap_or_default();
    // SAFETY: memfd_create with a NUL-terminated name; the fd is owned by the File below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    if fd < 0 {
        return Err(Error::io(
            "cannot create",
            "memfd",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: fd was just created and nothing else owns it.
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.write_all(bytes)
        .and_then(|()| f.rewind())
        .map_err(|e| Error::io("cannot write", "memfd", e))?;
    Ok(f)
}

/// Makes `f` the process's stdin.
pub fn set_stdin(f: &File) -> Result<()> {
    // SAFETY: dup2 onto fd 0; `f` stays owned by the caller.
    if unsafe { libc::dup2(f.as_raw_fd(), 0) } < 0 {
        return Err(Error::io(
            "cannot make stdin of",
            "memfd",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_harness_is_linked_dynamically() {
        // cargo's test binaries are dynamically linked; the static fronts are tested
        // end to end (tests/e2e_hook_front.rs).
        assert!(!linked_statically());
    }
}
