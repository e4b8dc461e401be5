//! The container's process as a pidfd, and the parent's side of the child: its pipe, its
//! bounded report read and its bounded reaping.

use super::child::errno;
use super::wire::Wire;
use crate::error::{Error, IoCause, Result};
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

pub(super) fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::io(
            "cannot create pipe",
            "pipe2",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: both fds were just created and are owned only here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub use crate::fsutil::pidfd::{pidfd_alive, pidfd_open};

/// The container's process as a hook holds it: the state's pid and a pidfd opened before
/// anything slow (probing) ran. Everything the remap does to "the container" goes through
/// it, so a pid that dies and is reused meanwhile is noticed instead of edited.
#[derive(Debug)]
pub struct ContainerProcess {
    pub pid: i32,
    fd: std::result::Result<OwnedFd, PidfdError>,
}

impl ContainerProcess {
    pub fn open(pid: i32) -> ContainerProcess {
        ContainerProcess {
            pid,
            fd: pidfd_open(pid).map_err(|e| PidfdError {
                pid,
                source: e.into(),
            }),
        }
    }

    /// The pidfd, or why there is none (the process had exited when the hook started).
    pub fn pidfd(&self) -> std::result::Result<RawFd, PidfdError> {
        self.fd
            .as_ref()
            .map(|f| f.as_raw_fd())
            .map_err(Clone::clone)
    }
}

/// No pidfd for the container's process `pid` (it had exited when the hook started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidfdError {
    pub pid: i32,
    pub source: IoCause,
}

impl fmt::Display for PidfdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot open a pidfd for container process {}: {}",
            self.pid,
            self.source.to_string().to_lowercase()
        )
    }
}

impl std::error::Error for PidfdError {}

/// Why the /dev edit's child gave no report by the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildError {
    TimedOut,
    Poll(IoCause),
    Read(IoCause),
    /// The child's pipe ended before a whole report.
    NoReport,
}

impl fmt::Display for ChildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildError::TimedOut => f.write_str("timed out"),
            ChildError::Poll(e) => write!(f, "poll: {e}"),
            ChildError::Read(e) => write!(f, "read: {e}"),
            ChildError::NoReport => f.write_str("the child exited without a report"),
        }
    }
}

impl std::error::Error for ChildError {}

/// Waits up to `deadline` for the pipe to fill `buf`.
pub(super) fn read_full(
    fd: &OwnedFd,
    buf: &mut [u8],
    deadline: Instant,
) -> std::result::Result<(), ChildError> {
    let mut got = 0usize;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ChildError::TimedOut);
        }
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe {
            libc::poll(
                &mut p,
                1,
                left.as_millis().clamp(1, i32::MAX as u128) as i32,
            )
        };
        if n < 0 && errno() != libc::EINTR {
            return Err(ChildError::Poll(std::io::Error::last_os_error().into()));
        }
        if n <= 0 {
            continue;
        }
        // SAFETY: reads into the buffer's remaining bytes.
        let k = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf[got..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - got,
            )
        };
        if k < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(ChildError::Read(std::io::Error::last_os_error().into()));
        }
        if k == 0 {
            return Err(ChildError::NoReport);
        }
        got += k as usize;
    }
    Ok(())
}

pub(super) fn read_report(
    fd: &OwnedFd,
    deadline: Instant,
) -> std::result::Result<Wire, ChildError> {
    let mut buf = [0u8; std::mem::size_of::<Wire>()];
    read_full(fd, &mut buf, deadline)?;
    // SAFETY: Wire is repr(C) plain integers; every bit pattern is valid.
    Ok(unsafe { std::ptr::read_unaligned(buf.as_ptr() as *const Wire) })
}

/// Reaps the child, waiting at most a short while: a child stuck in an uninterruptible
/// system call (a hung filesystem) cannot be killed, and devgate must not hang with it.
pub(super) fn reap(child: i32) {
    crate::fsutil::pidfd::reap_until(child, Instant::now() + Duration::from_millis(500));
}
