//! What a hook stage reads before it decides anything, read once: the front
//! (`crate::front`) looks at the spec, whether the call may need NVML, before it hands the
//! input on to `pipeline::run`. A leaf, so `gate` and `poststop` import it and not the
//! module that dispatches to them.

use crate::action::nsdev::ContainerProcess;
use crate::error::Result;
use crate::gpu;
use crate::oci::spec::Spec;
use crate::oci::stage::Stage;
use crate::oci::state::State;

/// A stage's input, read once.
pub enum Input {
    /// Nothing to decide: a stage that neither gates nor stops, or a spec that names no
    /// device.
    Nothing,
    /// A gating stage's spec, which may name devices.
    Gate(ToGate),
    /// poststop's spec, which may name devices; None when the bundle is gone (then only
    /// devgate's own record can tell).
    Poststop(Option<Spec>),
}

/// What the gate reads of a start before it decides.
pub struct ToGate {
    /// The container's process, held before anything slow runs: a pid that dies and is
    /// reused while devgate probes can never send a remap into another process.
    pub(super) process: Option<ContainerProcess>,
    pub spec: Spec,
    /// The spec's bytes, which the runtime wrapper's marker names (`store::marker`).
    pub(super) bytes: Vec<u8>,
}

impl Input {
    /// What `stage` reads of the container `state` names: a container with no devices
    /// ends here, before devgate's config is read.
    pub fn read(stage: Stage, state: &State) -> Result<Input> {
        if stage.gates() {
            read_to_gate(state)
        } else if stage == Stage::Poststop {
            Ok(read_stopped(state))
        } else {
            Ok(Input::Nothing)
        }
    }
}

fn read_to_gate(state: &State) -> Result<Input> {
    let process = state.pid().map(ContainerProcess::open);
    let (spec, bytes) = Spec::read(&state.bundle.join("config.json"))?;
    if !gpu::may_have_devices(&spec) {
        return Ok(Input::Nothing);
    }
    Ok(Input::Gate(ToGate {
        process,
        spec,
        bytes,
    }))
}

fn read_stopped(state: &State) -> Input {
    // The bundle may already be gone; then only devgate's own record can tell.
    let spec = Spec::load(&state.bundle).ok();
    if spec.as_ref().is_some_and(|s| !gpu::may_have_devices(s)) {
        return Input::Nothing;
    }
    Input::Poststop(spec)
}
