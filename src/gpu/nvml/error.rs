//! Why NVML gave no answer for a GPU, or for any: what the query child met (the library,
//! its init, the count) and what the hook met asking it (the pipes, the processes, the
//! deadline, the answer read back). And why a child could not show NVML its GPU alone.
//! A leaf: the child, the query, the view, the pipes and the module that merges the
//! answers all take it.

use crate::error::{Error, IoCause};
use crate::model::reason::Code;
use std::fmt;
use std::path::PathBuf;

/// Why NVML gave no answer, for one GPU or for all: each GPU check is unknown with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryError {
    /// The library did not load (`library`, the loader's words).
    Load { library: String, cause: String },
    /// The library loaded but lacks NVML's symbols.
    NotNvml { library: String, cause: String },
    /// nvmlInit failed.
    Init { library: String, cause: String },
    /// nvmlDeviceGetCount failed.
    Count { cause: String },
    /// More GPUs than any node has (`max`).
    TooMany { count: u32, max: u32 },
    /// The query itself panicked in the child.
    Panicked,
    /// A query child could not be forked.
    Fork(nix::errno::Errno),
    /// What the query process answered it could not do: its own words, as they crossed the
    /// pipe (one of the kinds above, rendered in the child).
    Failed(String),
    /// The query process's pipe ended with nothing on it.
    Crashed,
    /// The answer was longer than any answer is (`max` bytes).
    AnswerTooLarge { max: usize },
    /// The answer did not parse: serde_json's words.
    Malformed(String),
    /// The answer held more GPUs than any node has.
    AnsweredTooMany,
    /// No answer by the deadline, of `ms` milliseconds: for one GPU, or for the
    /// enumeration of all.
    Timeout { ms: u128, one_gpu: bool },
    /// An earlier hook's query of this GPU is still stuck, in process `pid`, for `secs`.
    Stuck { secs: u64, pid: i32 },
    /// The GPU was never asked.
    NotAsked,
    /// The query process answered for no job.
    NoAnswer,
    /// A pipe for the answers could not be made.
    Pipe(nix::errno::Errno),
    /// The dynamically linked devgate beside a static one was not found.
    NoDevgate(Error),
    /// devgate's own binary was not found (to exec the query process).
    OwnBinary(IoCause),
    /// The query process did not start (`program`).
    Spawn { program: PathBuf, source: IoCause },
}

impl QueryError {
    /// The reason code a verdict on this failure carries: a hang and a query still stuck
    /// are told apart from every other way NVML gives no answer.
    pub fn code(&self) -> Code {
        match self {
            QueryError::Timeout { .. } => Code::NvmlTimeout,
            QueryError::Stuck { .. } => Code::NvmlStuck,
            _ => Code::NvmlUnanswered,
        }
    }
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueryError::Load { library, cause } => write!(f, "cannot load {library}: {cause}"),
            QueryError::NotNvml { library, cause } => {
                write!(f, "{library} is not a usable NVML library: {cause}")
            }
            QueryError::Init { library, cause } => {
                write!(f, "NVML init failed ({library}): {cause}")
            }
            QueryError::Count { cause } => write!(f, "NVML cannot count GPUs: {cause}"),
            QueryError::TooMany { count, max } => {
                write!(f, "NVML reports {count} GPUs, more than {max}")
            }
            QueryError::Panicked => f.write_str("the NVML query panicked"),
            QueryError::Fork(e) => write!(f, "cannot fork: {e}"),
            QueryError::Failed(why) => f.write_str(why),
            QueryError::Crashed => {
                f.write_str("the NVML query process ended without an answer (it crashed)")
            }
            QueryError::AnswerTooLarge { max } => {
                write!(f, "the NVML query process wrote more than {max} bytes")
            }
            QueryError::Malformed(e) => {
                write!(f, "the NVML query process wrote a malformed answer: {e}")
            }
            QueryError::AnsweredTooMany => {
                f.write_str("the NVML query process answered for too many GPUs")
            }
            QueryError::Timeout { ms, one_gpu: true } => {
                write!(f, "NVML did not answer for this GPU in {ms} ms")
            }
            QueryError::Timeout { ms, one_gpu: false } => {
                write!(f, "NVML did not answer in {ms} ms")
            }
            QueryError::Stuck { secs, pid } => write!(
                f,
                "an NVML query on this GPU has been stuck for {secs} s (pid {pid}); not asked \
                 again until it ends"
            ),
            QueryError::NotAsked => f.write_str("not asked"),
            QueryError::NoAnswer => f.write_str("no answer"),
            QueryError::Pipe(e) => write!(f, "cannot make a pipe: {e}"),
            QueryError::NoDevgate(e) => e.fmt(f),
            QueryError::OwnBinary(e) => write!(f, "cannot find devgate's own binary: {e}"),
            QueryError::Spawn { source, .. } => {
                write!(f, "cannot start the NVML query process: {source}")
            }
        }
    }
}

impl std::error::Error for QueryError {}

/// Why a query child could not show NVML its GPU alone (see `view`): NVML then sees every
/// GPU the driver lists. The answers stay true; only the isolation is lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewError {
    /// The child was asked about no GPU by address.
    NoGpuAsked,
    /// Setting up the mount namespace panicked.
    Panicked,
    /// The driver's list (or a directory in it) could not be read.
    Read { path: PathBuf, source: IoCause },
    /// unshare(CLONE_NEWNS) failed.
    Namespace(nix::errno::Errno),
    /// The namespace's mounts could not be made slaves of the host's.
    OneWay(nix::errno::Errno),
    /// A GPU's directory in the list could not be opened.
    Open {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    /// The list (`list`) has no directory for `bus_id` that the child opened.
    NoDirectory { list: PathBuf, bus_id: String },
    /// The tmpfs over the list could not be mounted.
    Cover {
        list: PathBuf,
        errno: nix::errno::Errno,
    },
    /// The GPU's directory in the tmpfs could not be made.
    MakeDir { path: PathBuf, source: IoCause },
    /// The GPU's own directory could not be bound into the tmpfs.
    Bind {
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    /// The tmpfs over the list could not be unmounted.
    Uncover {
        list: PathBuf,
        errno: nix::errno::Errno,
    },
}

impl fmt::Display for ViewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViewError::NoGpuAsked => f.write_str("no GPU asked for by address"),
            ViewError::Panicked => f.write_str("the mount namespace setup panicked"),
            ViewError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            ViewError::Namespace(e) => write!(f, "cannot make a mount namespace: {e}"),
            ViewError::OneWay(e) => write!(f, "cannot make the mounts one-way: {e}"),
            ViewError::Open { path, errno } => write!(f, "cannot open {}: {errno}", path.display()),
            ViewError::NoDirectory { list, bus_id } => write!(
                f,
                "{} has no directory for {bus_id} that this process opened",
                list.display()
            ),
            ViewError::Cover { list, errno } => {
                write!(f, "cannot mount a tmpfs on {}: {errno}", list.display())
            }
            ViewError::MakeDir { path, source } => {
                write!(f, "cannot make {}: {source}", path.display())
            }
            ViewError::Bind { path, errno } => write!(f, "cannot bind {}: {errno}", path.display()),
            ViewError::Uncover { list, errno } => {
                write!(f, "cannot unmount {}: {errno}", list.display())
            }
        }
    }
}

impl std::error::Error for ViewError {}
