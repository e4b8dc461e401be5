//! Processes as pidfds: opening one, asking whether it lives, and reaping a child within a
//! bound. Shared by the remap's child (`action::nsdev`) and NVML's query processes
//! (`gpu::nvml::isolate`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// A pidfd for `pid` (pidfd_open, Linux 5.3).
pub fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain system call; the returned fd is owned here.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as RawFd;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// True while the process behind `pidfd` has not exited. A file under /proc/PID opened
/// before this returns true belongs to that process, not to a later one with its pid.
pub fn pidfd_alive(pidfd: RawFd) -> bool {
    // SAFETY: signal 0 only checks; null siginfo is allowed.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// Reaps this process's child `child`, waiting for it until `until` at most: a child stuck
/// in an uninterruptible system call (a hung filesystem, a lost GPU's driver) cannot be
/// killed, and devgate must not hang with it. True when it was reaped.
pub fn reap_until(child: i32, until: Instant) -> bool {
    let reaped = || {
        let mut status = 0;
        // SAFETY: reaps our own child without blocking.
        unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) == child }
    };
    if reaped() {
        return true;
    }
    // A pidfd turns readable when the child exits: wait on it, bounded, instead of sleeping
    // in steps (the child is normally exiting already; a step would cost a whole sleep).
    if let Ok(fd) = pidfd_open(child) {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            let left = until.saturating_duration_since(Instant::now());
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as i32) };
            let interrupted =
                n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
            if !interrupted || left.is_zero() {
                break;
            }
        }
        return reaped();
    }
    loop {
        if reaped() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_ends_is_reaped_and_one_that_does_not_is_left() {
        let quick = std::process::Command::new("true").spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        assert!(reap_until(quick.id() as i32, deadline));
        // reaped already: the Child no longer has a process to wait for
        std::mem::forget(quick);
        let mut slow = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(!reap_until(slow.id() as i32, Instant::now()));
        slow.kill().unwrap();
        slow.wait().unwrap();
    }
}
