//! What a hook call hands back, and how a gate remaps: the types both stages and the
//! runtime wrapper share. A leaf, so `gate` and `poststop` import it and not the module
//! that dispatches to them.

use crate::action::remap::Applied;
use crate::config::policy::Action;
use crate::config::Config;
use crate::gpu::GpuContext;
use crate::policy::DeviceDecision;
use crate::store::quarantine::Ledger;

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

/// How a gate carries out a remap: at hook time in the created container
/// (`action::remap::apply`), or in the spec before the runtime reads it (the runtime
/// wrapper).
pub(crate) type Remapper<'a> =
    dyn FnMut(&Config, &Ledger, Option<&GpuContext>, &mut [DeviceDecision]) -> Applied + 'a;
