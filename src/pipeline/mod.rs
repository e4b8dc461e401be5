//! One hook call, start to end, and the only module that knows every stage:
//! state → spec → devices → probes → policy → action → record (gate, in `gate.rs`), and
//! state → record → probes → fault diff → termination message (poststop, in `poststop.rs`).
//! What a stage reads first is read once (`input.rs`): whoever calls the pipeline (the
//! hook front, `crate::front`) may look at it, and passes it on to [`run`].
//!
//! The runtime wrapper (`crate::wrapper`) runs the same gate before the runtime, through
//! `gate_with`, with a remap that writes into the spec instead of the created container.

mod gate;
mod input;
mod outcome;
mod poststop;

pub(crate) use gate::gate_with;
pub use input::Input;
pub use outcome::Reply;

use crate::error::Result;
use crate::oci::stage::Stage;
use crate::oci::state::State;
use gate::gate;
use poststop::poststop;
use std::path::Path;
use std::time::Instant;

/// One hook call, once the state and the stage's input are read (the caller reads stdin
/// first, always: a runtime that writes the state into a pipe nobody reads can see EPIPE
/// and report a failure that is not there). `input` is what [`Input::read`] read for
/// `stage`.
pub fn run(
    stage: Stage,
    state: &State,
    input: Input,
    config_path: Option<&Path>,
    started: Instant,
) -> Result<Reply> {
    match input {
        Input::Nothing => Ok(Reply::default()),
        Input::Gate(to_gate) => gate(stage, state, to_gate, config_path, started),
        Input::Poststop(spec) => poststop(state, spec.as_ref(), config_path, started),
    }
}
