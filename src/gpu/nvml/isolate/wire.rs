//! What the hook and a query child say to each other: the hidden argument, the jobs and
//! the answer. A leaf, so the child (`nvml::child`) and the pipes both take it without
//! importing the module that forks them.

use crate::gpu::nvml::facts::GpuFacts;
use serde::{Deserialize, Serialize};

/// `devgate __nvml-query LIBRARY PROC_ROOT FD=JOB…`: the query process. Not a command: main.rs hands
/// it to [`super::child::serve`] before anything else runs.
pub const QUERY_ARG: &str = "__nvml-query";

/// The most one child may write: an answer is a few hundred bytes per GPU.
pub const MAX_ANSWER: usize = 1 << 20;

/// What one query child is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// One GPU by its PCI address as NVML takes it, and the index to label it with.
    Gpu { bus_id: String, index: u32 },
    /// Every GPU by index: only where the driver's list cannot be read.
    Every,
}

impl Job {
    pub(super) fn arg(&self) -> String {
        match self {
            Job::Gpu { bus_id, index } => format!("{index}@{bus_id}"),
            Job::Every => "every".into(),
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Job> {
        if s == "every" {
            return Some(Job::Every);
        }
        let (index, bus_id) = s.split_once('@')?;
        Some(Job::Gpu {
            bus_id: bus_id.to_string(),
            index: index.parse().ok()?,
        })
    }
}

/// What a query child writes on its pipe: one JSON document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Gpus {
        driver_version: Option<String>,
        gpus: Vec<GpuFacts>,
        /// How long loading the library and nvmlInit took in the child, in µs.
        #[serde(default)]
        init_us: u64,
        /// Why NVML saw every GPU the driver lists rather than this job's GPU alone (no
        /// mount namespace: not root): isolation lost for this answer, not its truth.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unisolated: Option<String>,
    },
    /// NVML could not be opened (library missing, init failed) or could not count.
    Failed(String),
}
