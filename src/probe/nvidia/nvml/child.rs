//! The query children's side of [`super::isolate`]: each keeps only its own pipe, puts its
//! stdio on /dev/null, asks NVML about its one GPU, writes the answer and `_exit`s; and the
//! query process ([`serve`]) that forks them for a hook with other threads.

use super::isolate::{Answer, Job};
use super::query;
use std::ffi::OsString;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

/// A query child still running this long after it started ends itself: the alarm kills it
/// when its driver call returns, or at once if the call can be interrupted.
const ABANDON_AFTER_S: u32 = 600;

/// The query process: `args` are what follows [`super::isolate::QUERY_ARG`]. Forks one
/// child per job and ends without waiting for them. Never returns.
pub fn serve(args: &[OsString]) -> ! {
    let parsed = parse_args(args);
    let Some((library, jobs)) = parsed else {
        // SAFETY: ends the process at once.
        unsafe { libc::_exit(2) }
    };
    for (fd, job) in &jobs {
        // SAFETY: this process is single-threaded (main.rs calls serve first thing), so the
        // child may run anything; it ends with _exit.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => run_child(&library, *fd, job),
            Ok(nix::unistd::ForkResult::Parent { .. }) => {}
            Err(e) => write_answer(*fd, &Answer::Failed(format!("cannot fork: {e}"))),
        }
        // SAFETY: the fd is this process's copy of the job's pipe, used by nothing else.
        drop(unsafe { OwnedFd::from_raw_fd(*fd) });
    }
    // SAFETY: ends the process at once; nothing to flush.
    unsafe { libc::_exit(0) }
}

fn parse_args(args: &[OsString]) -> Option<(OsString, Vec<(RawFd, Job)>)> {
    let (library, rest) = args.split_first()?;
    let mut jobs = Vec::new();
    for a in rest {
        let s = a.to_str()?;
        let (fd, job) = s.split_once('=')?;
        let fd: RawFd = fd.parse().ok().filter(|fd| *fd > 2)?;
        jobs.push((fd, Job::parse(job)?));
    }
    Some((library.clone(), jobs))
}

/// One job, in its own process: keeps only its own pipe, puts stdio on /dev/null, asks
/// NVML, answers, `_exit`s. Never returns, not even by a panic: a child forked from the
/// hook must never run on into the hook's code.
pub(super) fn run_child(library: &OsString, fd: RawFd, job: &Job) -> ! {
    close_others(fd);
    stdio_to_null();
    // SAFETY: alarm only arms a timer; its default action ends this process.
    unsafe { libc::alarm(ABANDON_AFTER_S) };
    let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| answer(library, job)))
        .unwrap_or_else(|_| Answer::Failed("the NVML query panicked".into()));
    write_answer(fd, &answer);
    // SAFETY: ends the process at once, without the library's destructors.
    unsafe { libc::_exit(0) }
}

fn answer(library: &OsString, job: &Job) -> Answer {
    let started = Instant::now();
    let nvml = match query::open(library) {
        Ok(n) => n,
        Err(e) => return Answer::Failed(e),
    };
    let init_us = started.elapsed().as_micros() as u64;
    let driver_version = nvml.sys_driver_version().ok();
    let gpus = match job {
        Job::Gpu { bus_id, index } => Ok(vec![query::one_gpu(&nvml, bus_id, *index)]),
        Job::Every => query::every_gpu(&nvml),
    };
    // No nvmlShutdown: a lost GPU can hang it, and the process ends now anyway.
    std::mem::forget(nvml);
    match gpus {
        Ok(gpus) => Answer::Gpus {
            driver_version,
            gpus,
            init_us,
        },
        Err(e) => Answer::Failed(e),
    }
}

/// stdin, stdout and stderr on /dev/null: a child forked from the hook must not hold the
/// runtime's pipes, which runc waits on.
fn stdio_to_null() {
    // SAFETY: open and dup2 on descriptors this process owns; nothing else uses them.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null < 0 {
            for fd in 0..3 {
                libc::close(fd);
            }
            return;
        }
        for fd in 0..3 {
            if null != fd {
                libc::dup2(null, fd);
            }
        }
        if null > 2 {
            libc::close(null);
        }
    }
}

pub(super) fn write_answer(fd: RawFd, answer: &Answer) {
    use std::io::Write;
    let Ok(bytes) = serde_json::to_vec(answer) else {
        return;
    };
    // SAFETY: `fd` is this process's copy of its pipe; ManuallyDrop leaves closing to the
    // caller (the process's end, or serve's drop).
    let mut f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    // The hook's end is non-blocking, this one is not; a hook that left makes this EPIPE.
    let _ = f.write_all(&bytes);
}

/// Closes every descriptor but stdio and `keep`: the child must not hold the pipes of the
/// other GPUs (their ends would not close with their children) nor anything the runtime
/// passed the hook.
fn close_others(keep: RawFd) {
    let keep = keep as libc::c_uint;
    // SAFETY: close_range only closes descriptors; none of them is used after this.
    let ok = unsafe {
        (keep == 3 || libc::syscall(libc::SYS_close_range, 3u32, keep - 1, 0u32) == 0)
            && libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32) == 0
    };
    if !ok {
        // kernels before 5.9: the descriptors a hook can have
        for fd in 3..1024 {
            if fd != keep as RawFd {
                // SAFETY: as above.
                unsafe { libc::close(fd) };
            }
        }
    }
}
