//! NVML in processes the hook never waits for.
//!
//! A GPU that fails can make its driver calls block for minutes, in an ioctl that no signal
//! interrupts. runc waits for a hook, and for the hook's stdout and stderr to close, so
//! NVML must never run where it can hold either. The GPUs are asked about in child
//! processes, stdio on /dev/null, each opening NVML once and answering its GPUs in turn,
//! one pipe per GPU: as many processes as the hook has CPUs, at most one per GPU
//! ([`ask`]). A hook with one thread (the usual case) forks them itself; one with other
//! threads could hand a child a lock another thread held, so it exec's devgate with the
//! hidden argument [`QUERY_ARG`] instead, a fresh single-threaded process that forks one
//! child per GPU and ends (so does a statically linked devgate, which cannot load NVML:
//! it exec's the dynamically linked devgate beside it). The hook reads every pipe until `probe_timeout_ms` and takes
//! what came: a GPU whose answer did not come is unknown, the others are judged on their
//! own answers; GPUs queued behind one that is stuck are asked again in processes of their
//! own. A child is reaped only once it has answered; one still stuck is left to whoever
//! inherits it (the runtime's reaper, or init).
//!
//! Processes, not a thread per GPU: NVML promises thread safety, not that threads
//! are independent. A thread stuck inside NVML for one GPU can hold the library's own locks
//! (its per-process state, the attach of GPUs), and every other thread's call that needs
//! them waits too; a thread cannot be abandoned without leaving them held. Separate
//! processes share no user-space lock; only a lock inside the kernel driver could still
//! join them, and then no design in user space keeps the GPUs apart.
//!
//! This file holds what is asked and answered, and how the jobs are dealt to processes and
//! asked again; `pipes` holds the plumbing under it (the pipes, the forks and the exec, and
//! the reading of what comes back).
//!
//! A child still stuck long after the hook left ends itself (see [`super::child`]).

mod pipes;
pub(super) mod wire;

use super::error::QueryError;
use nix::unistd::Pid;
use pipes::{exec_query_process, fork_groups, make_pipes, may_fork_children, Collected};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};
pub use wire::{Answer, Job, MAX_ANSWER, QUERY_ARG};

/// Reads what a child wrote. Anything but one well-formed answer is the child's fault and
/// says so; no answer is trusted to be smaller than it says.
pub fn decode(bytes: &[u8]) -> Result<Answer, QueryError> {
    if bytes.is_empty() {
        return Err(QueryError::Crashed);
    }
    if bytes.len() > MAX_ANSWER {
        return Err(QueryError::AnswerTooLarge { max: MAX_ANSWER });
    }
    let a: Answer =
        serde_json::from_slice(bytes).map_err(|e| QueryError::Malformed(e.to_string()))?;
    if let Answer::Gpus { gpus, .. } = &a {
        if gpus.len() > super::facts::MAX_GPUS as usize {
            return Err(QueryError::AnsweredTooMany);
        }
    }
    Ok(a)
}

/// What one job came back with.
pub struct Asked {
    pub answer: Result<Answer, QueryError>,
    /// The child that had not answered by the deadline, where the hook forked it itself.
    pub stuck: Option<i32>,
}

/// Asks every job and waits for the answers at most `timeout`, running `meanwhile` (work
/// that needs no NVML, such as reading the kernel log) while the children run. The answers
/// come back in the jobs' order; a job with none by then says why.
///
/// The jobs share as many processes as this hook may run on CPUs ([`processes_for`]), each
/// answering its jobs in order on one pipe per job. If a process has not finished a job by a
/// quarter of `timeout` (or ended without answering it), that job is the one it is stuck on
/// or died in; its later jobs are asked again, each in a process of its own, and have the
/// rest of the time. So one GPU that hangs or crashes NVML still holds only itself.
///
/// Long because the pipes, the pids and what was read so far pass together through each
/// step (start, first collection, asking again, last collection, reaping); the steps
/// themselves are calls.
pub fn ask(
    library: &Path,
    proc_root: &Path,
    timeout: Duration,
    jobs: &[Job],
    meanwhile: impl FnOnce(),
) -> Vec<Asked> {
    let started_at = Instant::now();
    let deadline = started_at + timeout;
    let mut pipes = match make_pipes(jobs.len()) {
        Ok(p) => p,
        Err(e) => {
            meanwhile();
            return fail_all(jobs, e);
        }
    };
    let writes: Vec<RawFd> = pipes.iter().map(|(_, w)| w.as_raw_fd()).collect();
    let started = if may_fork_children() {
        let groups = groups(jobs.len(), processes_for(jobs.len()));
        Ok(Started::Forked(fork_groups(
            library, proc_root, &writes, jobs, &groups,
        )))
    } else {
        exec_query_process(library, proc_root, &writes, jobs).map(Started::Exec)
    };
    // The hook's write ends close now, so that a pipe ends when its child does.
    let mut reads: Vec<OwnedFd> = pipes.drain(..).map(|(r, _)| r).collect();
    meanwhile();
    let mut started = match started {
        Ok(s) => s,
        Err(e) => return fail_all(jobs, e),
    };
    let mut got = Collected::new(jobs.len());
    // The processes a job was taken from to be asked again: stuck, never waited for.
    let mut abandoned = Vec::new();
    if let Started::Forked(pids) = &mut started {
        got.collect(&reads, (started_at + timeout / 4).min(deadline));
        for i in behind_a_stuck_job(pids, &got) {
            // A fresh pipe and process for a job its first process never reached.
            let Ok(mut p) = make_pipes(1) else { continue };
            let (read, write) = p.remove(0);
            let pid = fork_groups(
                library,
                proc_root,
                &[write.as_raw_fd()],
                &jobs[i..=i],
                &[vec![0]],
            );
            drop(write);
            reads[i] = read;
            abandoned.extend(pids[i]);
            pids[i] = pid[0];
            got.restart(i);
        }
    }
    got.collect(&reads, deadline);
    let pids = started.reap(&got.done, &abandoned);
    let ms = timeout.as_millis();
    got.into_answers()
        .into_iter()
        .zip(jobs)
        .enumerate()
        .map(|(i, (r, job))| {
            let stuck = match &r {
                None => pids.get(i).copied().flatten(),
                Some(_) => None,
            };
            let answer = match (r, job) {
                (Some(bytes), _) => decode(&bytes),
                (None, Job::Gpu { .. }) => Err(QueryError::Timeout { ms, one_gpu: true }),
                (None, Job::Every) => Err(QueryError::Timeout { ms, one_gpu: false }),
            };
            Asked { answer, stuck }
        })
        .collect()
}

/// How many processes `jobs` jobs share: one per CPU this process may run on, and never
/// more than the jobs. More processes than CPUs would only queue for them (with the GPUs in
/// persistence mode, a query is CPU work), and each costs a fork, its page faults and an
/// exit; on a node with a CPU for every GPU, every GPU still has a process of its own.
fn processes_for(jobs: usize) -> usize {
    let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..nix::sched::CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .count()
        })
        .unwrap_or(1);
    cpus.clamp(1, jobs.max(1))
}

/// `jobs` job indexes dealt into `processes` groups in turn (0, p, 2p… in the first), so
/// that the jobs a stuck one holds up are few and spread.
fn groups(jobs: usize, processes: usize) -> Vec<Vec<usize>> {
    let processes = processes.clamp(1, jobs.max(1));
    let mut g = vec![Vec::new(); processes];
    for i in 0..jobs {
        g[i % processes].push(i);
    }
    g.retain(|g| !g.is_empty());
    g
}

/// The jobs to ask again: in each process that has jobs unanswered, every one after the
/// first of them (the first is the one it is on, or died in), and that first one too unless
/// it was the process's first job: a GPU answered before it may have left NVML's state in
/// that process wedged, and the GPU it is on must not take the blame. A job is unanswered
/// when its pipe is still open, or ended with nothing written (the process died before it).
fn behind_a_stuck_job(pids: &[Option<nix::unistd::Pid>], got: &Collected) -> Vec<usize> {
    let mut stuck_on: Vec<nix::unistd::Pid> = Vec::new();
    let mut answered_some: Vec<nix::unistd::Pid> = Vec::new();
    let mut again = Vec::new();
    for (i, pid) in pids.iter().enumerate() {
        let Some(pid) = pid else { continue };
        if got.answered(i) {
            answered_some.push(*pid);
        } else if stuck_on.contains(pid) || answered_some.contains(pid) {
            again.push(i);
        } else {
            stuck_on.push(*pid);
        }
    }
    again
}

/// How long the hook waits, in all, for the query processes that answered to end.
const REAP_WITHIN: std::time::Duration = std::time::Duration::from_millis(200);

/// The processes `ask` started.
enum Started {
    /// Processes forked by the hook itself: each job's (None where the fork failed).
    Forked(Vec<Option<nix::unistd::Pid>>),
    /// The query process, which forked them.
    Exec(std::process::Child),
}

impl Started {
    /// Collects the children whose every job answered, each within [`REAP_WITHIN`] of
    /// the call: having answered, a child is ending, and one left behind would be handed to
    /// the runtime, whose reaper may then miss the hook's own exit (crun 1.8 waits out the
    /// hook's timeout). One with a job unanswered is left unreaped even if it has ended
    /// since: its pid then stays its own (a zombie) while the hook notes it as stuck, and
    /// cannot be another process's. Returns the forked processes' pids by job.
    /// `abandoned`: the processes a job was taken from to be asked again elsewhere.
    fn reap(self, answered: &[bool], abandoned: &[Pid]) -> Vec<Option<i32>> {
        use crate::fsutil::pidfd::reap_until;
        let until = std::time::Instant::now() + REAP_WITHIN;
        match self {
            Started::Forked(pids) => {
                for p in to_reap(&pids, answered, abandoned) {
                    reap_until(p.as_raw(), until);
                }
                pids.iter().map(|p| p.map(|p| p.as_raw())).collect()
            }
            Started::Exec(c) => {
                if answered.iter().all(|a| *a) {
                    reap_until(c.id() as i32, until);
                }
                Vec::new()
            }
        }
    }
}

/// The forked processes to reap, each once: those whose every job answered, `pids` being
/// each job's process now, and none a job was taken from (`abandoned`: stuck on it).
fn to_reap(pids: &[Option<Pid>], answered: &[bool], abandoned: &[Pid]) -> Vec<Pid> {
    let mut out: Vec<Pid> = Vec::new();
    for p in pids.iter().flatten() {
        let all = pids
            .iter()
            .zip(answered)
            .filter(|(q, _)| q.as_ref() == Some(p))
            .all(|(_, a)| *a);
        if all && !abandoned.contains(p) && !out.contains(p) {
            out.push(*p);
        }
    }
    out
}

fn fail_all(jobs: &[Job], why: QueryError) -> Vec<Asked> {
    jobs.iter()
        .map(|_| Asked {
            answer: Err(why.clone()),
            stuck: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
    use nix::unistd::ForkResult;

    /// A child that has not answered is never reaped by the hook: its pid stays its own (a
    /// zombie at worst) until the hook is gone, so the stuck note written for it
    /// (`stuck::Stuck::record`, which reads /proc/PID/stat after `ask`) cannot name another
    /// process that took the pid over in between.
    #[test]
    fn a_child_without_an_answer_is_left_unreaped() {
        // SAFETY: the child only calls _exit.
        let child = match unsafe { nix::unistd::fork() }.unwrap() {
            ForkResult::Child => unsafe { libc::_exit(0) },
            ForkResult::Parent { child } => child,
        };
        // until it has ended, without reaping it
        waitid(Id::Pid(child), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT).unwrap();
        let pids = Started::Forked(vec![Some(child)]).reap(&[false], &[]);
        assert_eq!(pids, vec![Some(child.as_raw())]);
        // still this process's child: reaping it now succeeds
        assert_eq!(waitpid(child, None), Ok(WaitStatus::Exited(child, 0)));
    }

    /// attack35: a process that answered its first job and then hung in its second (a GPU
    /// wedged in NVML), whose second job `ask` gave to a fresh process that answered. The
    /// jobs still naming the hung process are all answered, so `reap` takes it for one
    /// that is ending and waits the whole REAP_WITHIN on it, after NVML's deadline has
    /// passed, on every start that meets that GPU; and, reaped or not, it is noted as stuck
    /// nowhere. A process with a job it never answered (moved or not) must not be waited for.
    #[test]
    fn a_process_whose_unanswered_job_was_asked_again_is_not_waited_for() {
        let (hung, fresh, other) = (Pid::from_raw(101), Pid::from_raw(102), Pid::from_raw(103));
        // job 0 answered by `hung`, job 1 (hung's second) asked again in `fresh` and
        // answered; job 2 answered by `other`, job 3 not yet
        let pids = [Some(hung), Some(fresh), Some(other), Some(other)];
        assert_eq!(
            to_reap(&pids, &[true, true, true, true], &[hung]),
            vec![fresh, other]
        );
        assert_eq!(
            to_reap(&pids, &[true, true, true, false], &[hung]),
            vec![fresh]
        );
    }

    #[test]
    fn jobs_are_dealt_to_processes_in_turn_and_never_to_an_empty_one() {
        assert_eq!(groups(8, 2), [vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        assert_eq!(groups(3, 8), [vec![0], vec![1], vec![2]]);
        assert_eq!(groups(2, 1), [vec![0, 1]]);
        assert_eq!(groups(1, 0), [vec![0]]);
        assert!(groups(0, 4).is_empty());
        assert!((1..=8).contains(&processes_for(8)));
        assert_eq!(processes_for(1), 1);
    }

    #[test]
    fn only_jobs_behind_an_unanswered_one_in_the_same_process_are_asked_again() {
        let (a, b) = (
            nix::unistd::Pid::from_raw(10),
            nix::unistd::Pid::from_raw(11),
        );
        // jobs 0, 2, 4 in process a; 1, 3 in b; a is stuck on its first job, b answered all
        let pids = [Some(a), Some(b), Some(a), Some(b), Some(a)];
        let mut got = Collected::new(5);
        for i in [1, 3] {
            got.bufs[i] = b"{}".to_vec();
            got.done[i] = true;
        }
        assert_eq!(behind_a_stuck_job(&pids, &got), [2, 4]);
        // a answered job 0 and is stuck on 2: job 0's GPU may have wedged the process, so
        // 2 is asked again too, not blamed
        got.bufs[0] = b"{}".to_vec();
        got.done[0] = true;
        assert_eq!(behind_a_stuck_job(&pids, &got), [2, 4]);
        // a died in job 2: its pipes 2 and 4 ended empty; both are asked again
        got.done[2] = true;
        got.done[4] = true;
        assert_eq!(behind_a_stuck_job(&pids, &got), [2, 4]);
        // a fork that failed answered its own jobs; nothing to ask again
        let pids = [None, Some(b), None, Some(b), None];
        assert!(behind_a_stuck_job(&pids, &got).is_empty());
    }
}
