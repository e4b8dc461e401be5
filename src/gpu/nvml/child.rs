//! The query children's side of [`super::isolate`]: each keeps only its own pipes, puts its
//! stdio on /dev/null, and for each of its GPUs in turn shows NVML that GPU alone
//! ([`super::view`]), opens NVML, writes the answer; then `_exit`s. And the query process
//! ([`serve`]) that forks them for a hook with other threads.

use super::error::{QueryError, ViewError};
use super::isolate::wire::{Answer, Job};
use super::query;
use super::view::GpuView;
use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::Nvml;
use std::ffi::OsString;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Instant;

/// A query child still running this long after it started ends itself: the alarm kills it
/// when its driver call returns, or at once if the call can be interrupted.
const ABANDON_AFTER_S: u32 = 600;

/// The query process: `args` are what follows [`super::isolate::QUERY_ARG`]. Forks one
/// child per job and ends without waiting for them. Never returns.
pub fn serve(args: &[OsString]) -> ! {
    let parsed = parse_args(args);
    let Some((library, proc_root, jobs)) = parsed else {
        // SAFETY: ends the process at once.
        unsafe { libc::_exit(2) }
    };
    for (fd, job) in &jobs {
        // SAFETY: this process is single-threaded (main.rs calls serve first thing), so the
        // child may run anything; it ends with _exit.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                run_child(&library, &proc_root, &[(*fd, job.clone())])
            }
            Ok(nix::unistd::ForkResult::Parent { .. }) => {}
            Err(e) => write_answer(*fd, &Answer::Failed(QueryError::Fork(e).to_string())),
        }
        // SAFETY: the fd is this process's copy of the job's pipe, used by nothing else.
        drop(unsafe { OwnedFd::from_raw_fd(*fd) });
    }
    // SAFETY: ends the process at once; nothing to flush.
    unsafe { libc::_exit(0) }
}

/// `LIBRARY PROC_ROOT FD=JOB…`.
type Parsed = (OsString, OsString, Vec<(RawFd, Job)>);

fn parse_args(args: &[OsString]) -> Option<Parsed> {
    let (library, rest) = args.split_first()?;
    let (proc_root, rest) = rest.split_first()?;
    let mut jobs = Vec::new();
    for a in rest {
        let s = a.to_str()?;
        let (fd, job) = s.split_once('=')?;
        let fd: RawFd = fd.parse().ok().filter(|fd| *fd > 2)?;
        jobs.push((fd, Job::parse(job)?));
    }
    Some((library.clone(), proc_root.clone(), jobs))
}

/// A list of jobs, in a process of their own: keeps only their pipes, puts stdio on
/// /dev/null, then answers the jobs in order, each on its own pipe, which it closes at once
/// so that the hook sees that job answered while the next runs; then `_exit`s. Never
/// returns, not even by a panic: a child forked from the hook must never run on into the
/// hook's code.
///
/// NVML is opened once per job, on a view of the driver's list that shows that job's GPU
/// alone, and shut down before the next: init attaches every GPU NVML sees, so one NVML for
/// all the jobs would attach them all and a GPU that hangs at attach would hold the others.
/// A shutdown that hangs (a lost GPU) leaves the jobs after it to be asked again elsewhere,
/// as any stuck job does ([`super::isolate::ask`]).
pub(super) fn run_child(library: &OsString, proc_root: &OsString, jobs: &[(RawFd, Job)]) -> ! {
    let keep: Vec<RawFd> = jobs.iter().map(|(fd, _)| *fd).collect();
    close_others(&keep);
    stdio_to_null();
    // SAFETY: alarm only arms a timer; its default action ends this process.
    unsafe { libc::alarm(ABANDON_AFTER_S) };
    let mut view = gpu_view(Path::new(proc_root), jobs);
    pin_library(library);
    // Asked once: the driver is the same for every GPU this process answers for.
    let mut driver_version = None;
    for (i, (fd, job)) in jobs.iter().enumerate() {
        if reader_gone(*fd) {
            // The hook asked this GPU again elsewhere (or left): asking it here too could
            // leave a second process stuck on it.
            // SAFETY: this process's copy of the job's pipe, used by nothing else after this.
            unsafe { libc::close(*fd) };
            continue;
        }
        let unisolated = match (job, &mut view) {
            (Job::Gpu { bus_id, .. }, Ok(v)) => v.show(bus_id).err(),
            (Job::Gpu { .. }, Err(e)) => Some(e.clone()),
            (Job::Every, _) => None,
        };
        let started = Instant::now();
        let opened = std::panic::catch_unwind(|| query::open(library, flags(job)))
            .unwrap_or(Err(QueryError::Panicked));
        let init_us = started.elapsed().as_micros() as u64;
        let answer = match &opened {
            Ok(nvml) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if driver_version.is_none() {
                    driver_version = nvml.sys_driver_version().ok();
                }
                answer(nvml, job, init_us, driver_version.clone(), unisolated)
            }))
            .unwrap_or_else(|_| Answer::Failed(QueryError::Panicked.to_string())),
            Err(e) => Answer::Failed(e.to_string()),
        };
        write_answer(*fd, &answer);
        // SAFETY: this process's copy of the job's pipe, used by nothing else after this.
        unsafe { libc::close(*fd) };
        if let Ok(nvml) = opened {
            if i + 1 < jobs.len() {
                // nvmlShutdown, so that the next init enumerates the next view afresh.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(nvml)));
            } else {
                // No nvmlShutdown after the last: a lost GPU can hang it, and the process
                // ends now anyway.
                std::mem::forget(nvml);
            }
        }
    }
    // SAFETY: ends the process at once, without the library's destructors.
    unsafe { libc::_exit(0) }
}

/// The view this child's GPU jobs are asked on, or why there is none. NVML is then opened
/// on every GPU the driver lists: the answers stay true, only the isolation is lost.
fn gpu_view(proc_root: &Path, jobs: &[(RawFd, Job)]) -> Result<GpuView, ViewError> {
    let wanted: Vec<&str> = jobs
        .iter()
        .filter_map(|(_, j)| match j {
            Job::Gpu { bus_id, .. } => Some(bus_id.as_str()),
            Job::Every => None,
        })
        .collect();
    if wanted.is_empty() {
        return Err(ViewError::NoGpuAsked);
    }
    std::panic::catch_unwind(|| GpuView::enter(proc_root, &wanted))
        .unwrap_or(Err(ViewError::Panicked))
}

/// Loads the library once for the life of this process, so that each job's open and shut
/// down does not unload and load it again (and run its destructors between jobs). A
/// library that does not load is left for [`query::open`] to report.
fn pin_library(library: &OsString) {
    use std::os::unix::ffi::OsStrExt;
    if let Ok(path) = std::ffi::CString::new(library.as_bytes()) {
        // SAFETY: a NUL-terminated path; the handle is never closed, on purpose.
        unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    }
}

/// NO_GPUS for one GPU, so that init succeeds even when the GPU is gone from the list (its
/// lookup then says so); a plain init for every GPU. Never NO_ATTACH (see [`query::open`]).
fn flags(job: &Job) -> InitFlags {
    match job {
        Job::Gpu { .. } => InitFlags::NO_GPUS,
        Job::Every => InitFlags::empty(),
    }
}

fn answer(
    nvml: &Nvml,
    job: &Job,
    init_us: u64,
    driver_version: Option<String>,
    unisolated: Option<ViewError>,
) -> Answer {
    let gpus = match job {
        Job::Gpu { bus_id, index } => Ok(vec![query::one_gpu(nvml, bus_id, *index)]),
        Job::Every => query::every_gpu(nvml),
    };
    match gpus {
        Ok(gpus) => Answer::Gpus {
            driver_version,
            gpus,
            init_us,
            unisolated: unisolated.map(|e| e.to_string()),
        },
        Err(e) => Answer::Failed(e.to_string()),
    }
}

/// Whether the read end of the pipe `fd` writes to has been closed: poll reports POLLERR
/// on a pipe's write end then.
fn reader_gone(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one live pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLERR != 0
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
/// other processes' GPUs (their ends would not close with those children) nor anything the
/// runtime passed the hook.
fn close_others(keep: &[RawFd]) {
    let mut keep: Vec<libc::c_uint> = keep
        .iter()
        .filter_map(|fd| libc::c_uint::try_from(*fd).ok())
        .filter(|fd| *fd > 2)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from: libc::c_uint = 3;
    let mut ok = true;
    for &k in keep.iter().chain(std::iter::once(&libc::c_uint::MAX)) {
        if from < k {
            let last = if k == libc::c_uint::MAX { k } else { k - 1 };
            // SAFETY: close_range only closes descriptors; none of them is used after this.
            ok &= unsafe { libc::syscall(libc::SYS_close_range, from, last, 0u32) } == 0;
        }
        from = k.saturating_add(1);
    }
    if !ok {
        // kernels before 5.9: the descriptors a hook can have
        for fd in 3..1024 {
            if !keep.contains(&(fd as libc::c_uint)) {
                // SAFETY: as above.
                unsafe { libc::close(fd) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_pipe_whose_reader_closed_is_known_before_the_query() {
        let (r, w) = nix::unistd::pipe().unwrap();
        assert!(!reader_gone(w.as_raw_fd()));
        drop(r);
        assert!(reader_gone(w.as_raw_fd()));
    }
}
