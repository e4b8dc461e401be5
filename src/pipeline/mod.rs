//! One hook call, start to end, and the only module that knows every stage:
//! state → spec → devices → probes → policy → action → record (gate, in `gate.rs`), and
//! state → record → probes → fault diff → termination message (poststop, in `poststop.rs`).
//!
//! The runtime wrapper (`crate::wrapper`) runs the same gate before the runtime, through
//! `gate_with`, with a remap that writes into the spec instead of the created container.

mod gate;
mod poststop;

pub(crate) use gate::gate_with;

use crate::action::remap::Applied;
use crate::config::policy::Action;
use crate::config::Config;
use crate::error::Result;
use crate::oci::stage::Stage;
use crate::oci::state::State;
use crate::policy::DeviceDecision;
use crate::probe::nvidia::GpuContext;
use crate::store::quarantine::Ledger;
use gate::gate;
use poststop::poststop;
use std::path::Path;
use std::time::Instant;

/// What the hook has to say and how it exits.
#[derive(Debug, Default)]
pub struct Reply {
    pub exit_code: i32,
    pub stderr: Vec<String>,
    /// The decision, when devgate made one (a container with devices).
    pub action: Option<Action>,
    /// The reject line, also among `stderr`.
    pub message: Option<String>,
}

/// How a hook call ends.
#[derive(Debug)]
pub enum Outcome {
    /// devgate answered in this process.
    Replied(Reply),
    /// This process was linked statically (the hook front, `devgate-hook`) and the
    /// container may have NVIDIA devices: the dynamically linked devgate, which can load
    /// NVML, answers instead. Nothing was written yet.
    HandOff,
}

/// How a gate carries out a remap: at hook time in the created container
/// (`action::remap::apply`), or in the spec before the runtime reads it (the runtime
/// wrapper).
pub(crate) type Remapper<'a> =
    dyn FnMut(&Config, &Ledger, Option<&GpuContext>, &mut [DeviceDecision]) -> Applied + 'a;

/// One hook call, once the state is read (the caller reads stdin first, always: a
/// runtime that writes the state into a pipe nobody reads can see EPIPE and report a
/// failure that is not there).
pub fn run(
    stage: Stage,
    state: &State,
    config_path: Option<&Path>,
    started: Instant,
) -> Result<Outcome> {
    if stage.gates() {
        gate(stage, state, config_path, started)
    } else if stage == Stage::Poststop {
        poststop(state, config_path, started)
    } else {
        Ok(Outcome::Replied(Reply::default()))
    }
}
