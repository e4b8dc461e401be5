//! One hook call, start to end, and the only module that knows every stage:
//! state → spec → devices → probes → policy → action → record (gate, in `gate.rs`), and
//! state → record → probes → fault diff → termination message (poststop, in `poststop.rs`).
//!
//! The runtime wrapper (`crate::wrapper`) runs the same gate before the runtime, through
//! `gate_with`, with a remap that writes into the spec instead of the created container.

mod gate;
mod outcome;
mod poststop;

pub(crate) use gate::gate_with;
pub use outcome::{Outcome, Reply};

use crate::error::Result;
use crate::oci::stage::Stage;
use crate::oci::state::State;
use gate::gate;
use poststop::poststop;
use std::path::Path;
use std::time::Instant;

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
