//! The plumbing under [`super::ask`]: the pipes, the processes that write on them (forked
//! by the hook itself, or by the query process it execs), and the reading of what they
//! wrote, up to the deadline.

use super::wire::{Answer, Job, MAX_ANSWER, QUERY_ARG};
use crate::fsutil::program;
use crate::gpu::nvml::child::{run_child, write_answer};
use crate::gpu::nvml::error::QueryError;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

pub(super) fn make_pipes(n: usize) -> Result<Vec<(OwnedFd, OwnedFd)>, QueryError> {
    (0..n)
        .map(|_| {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map_err(QueryError::Pipe)
        })
        .collect()
}

/// Whether this process has one thread, so that a child forked from it cannot inherit a
/// lock some other thread held. Unknown counts as no.
fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.take(2).count() == 1)
}

/// Whether the children may be forked from this process: it has one thread, and it can
/// load NVML at all (a statically linked glibc program cannot dlopen a library linked
/// against libc; its children could not either).
pub(super) fn may_fork_children() -> bool {
    !program::linked_statically() && single_threaded()
}

/// Forks one child per group of jobs from this (single-threaded) process. A group whose
/// fork fails gets that as each of its jobs' answer. Returns the pid that answers each job.
pub(super) fn fork_groups(
    library: &Path,
    proc_root: &Path,
    writes: &[RawFd],
    jobs: &[Job],
    groups: &[Vec<usize>],
) -> Vec<Option<nix::unistd::Pid>> {
    let library = library.as_os_str().to_owned();
    let proc_root = proc_root.as_os_str().to_owned();
    let mut pids = vec![None; jobs.len()];
    for group in groups {
        let mine: Vec<(RawFd, Job)> = group
            .iter()
            .map(|&i| (writes[i], jobs[i].clone()))
            .collect();
        // SAFETY: the caller checked this process has one thread; the child only runs
        // run_child, which never returns.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => run_child(&library, &proc_root, &mine),
            Ok(nix::unistd::ForkResult::Parent { child }) => {
                for &i in group {
                    pids[i] = Some(child);
                }
            }
            Err(e) => {
                for (fd, _) in &mine {
                    write_answer(*fd, &Answer::Failed(QueryError::Fork(e).to_string()));
                }
            }
        }
    }
    pids
}

/// Starts the query process ([`super::super::child::serve`]), which forks the children:
/// for a hook that may have other threads, or that was linked statically.
pub(super) fn exec_query_process(
    library: &Path,
    proc_root: &Path,
    writes: &[RawFd],
    jobs: &[Job],
) -> Result<std::process::Child, QueryError> {
    // A statically linked devgate (the hook front) cannot load NVML, in its children
    // either: it asks the dynamically linked devgate beside it.
    let mut cmd = if program::linked_statically() {
        let mut c = Command::new(program::devgate_beside().map_err(QueryError::NoDevgate)?);
        c.env(program::HANDED_ON_ENV, "1");
        c
    } else {
        Command::new(std::env::current_exe().map_err(|e| QueryError::OwnBinary(e.into()))?)
    };
    cmd.arg0("devgate")
        .arg(QUERY_ARG)
        .arg(library)
        .arg(proc_root);
    for (fd, job) in writes.iter().zip(jobs) {
        cmd.arg(format!("{fd}={}", job.arg()));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let writes = writes.to_vec();
    // SAFETY: between fork and exec only fcntl runs, which is async-signal-safe. It lets the
    // write ends (O_CLOEXEC in the hook) cross the exec, in this copy of the table only.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &writes {
                if libc::fcntl(*fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| QueryError::Spawn {
        program: PathBuf::from(cmd.get_program()),
        source: e.into(),
    })
}

/// What the pipes brought so far: each job's bytes, and whether its pipe has ended.
pub(super) struct Collected {
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) done: Vec<bool>,
}

impl Collected {
    pub(super) fn new(n: usize) -> Collected {
        Collected {
            bufs: vec![Vec::new(); n],
            done: vec![false; n],
        }
    }

    /// Whether job `i`'s pipe ended with something written on it.
    pub(super) fn answered(&self, i: usize) -> bool {
        self.done[i] && !self.bufs[i].is_empty()
    }

    /// Forgets job `i`'s pipe: it is asked again on a new one.
    pub(super) fn restart(&mut self, i: usize) {
        self.bufs[i].clear();
        self.done[i] = false;
    }

    /// Reads every open pipe until each has ended or `until` passed. Each pipe is read up to
    /// one byte past [`MAX_ANSWER`], which [`super::decode`] then refuses.
    pub(super) fn collect(&mut self, reads: &[OwnedFd], until: Instant) {
        while self.done.iter().any(|d| !d) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let open: Vec<usize> = (0..reads.len()).filter(|&i| !self.done[i]).collect();
            let mut fds: Vec<libc::pollfd> = open
                .iter()
                .map(|&i| libc::pollfd {
                    fd: reads[i].as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            for (k, &i) in open.iter().enumerate() {
                if fds[k].revents != 0 && drain(&reads[i], &mut self.bufs[i]) {
                    self.done[i] = true;
                }
            }
        }
    }

    /// `Some(bytes)` for a pipe whose writer closed it, `None` for one still open.
    pub(super) fn into_answers(self) -> Vec<Option<Vec<u8>>> {
        self.bufs
            .into_iter()
            .zip(self.done)
            .map(|(b, d)| d.then_some(b))
            .collect()
    }
}

/// Reads what is there; true once the writer closed the pipe or wrote too much. The chunk
/// is small because it is zeroed on every wake-up: an answer is under a kilobyte per GPU,
/// and a 16 KB chunk cost more than the rest of the collection.
fn drain(fd: &OwnedFd, buf: &mut Vec<u8>) -> bool {
    // Start-up trick (docs/performance.md). Plain: `read_to_end` per pipe.
    let mut chunk = [0u8; 2048];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut chunk) {
            Ok(0) => return true,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > MAX_ANSWER {
                    return true;
                }
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => return false,
            Err(_) => return true,
        }
    }
}
