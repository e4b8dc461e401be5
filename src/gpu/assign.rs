//! The GPUs a spec assigns, before the gate probes them: the GPUs its selectors choose,
//! added to the devices `discover` found, with the GPU context the probes then read (NVML
//! is opened at most once per hook call, so each step sees whether an earlier one opened
//! it). And the two cheap tests on a spec's text that run before anything is read.

use super::context::{self, GpuContext};
use super::driver::ProcGpu;
use super::gpu_at;
use super::gpu_at::Placed;
use super::request::{self, GpuSelector};
use super::select::{self, KnownGpus};
use crate::config::Config;
use crate::discover;
use crate::model::class::ClassRule;
use crate::model::device::{DevNum, Device, Source};
use crate::model::text::one_line;
use crate::oci::spec::Spec;

/// A container's GPU selectors, each with where it came from.
type Selectors = Vec<(GpuSelector, Source)>;

/// What [`assigned`] found: every device (those `discover` found and the GPUs selectors
/// name), the GPU context, a warning per selector naming no GPU (an unknown to the
/// policy), and the toolkit config's warning (no unknown).
pub struct Assigned {
    pub devices: Vec<Device>,
    pub gpu: Option<GpuContext>,
    pub unknowns: Vec<String>,
    pub toolkit_warning: Option<String>,
}

/// The pipeline's entry to GPUs: `devices` (what `discover` found in the spec) with the
/// GPUs the spec's selectors name added, the GPU context when a GPU is among them, a
/// warning line for each selector that names no GPU, and one when the NVIDIA toolkit's
/// config could not be read as the toolkit reads it (not an unknown: it only widens the
/// check).
pub fn assigned(
    config: &Config,
    rules: &[ClassRule],
    spec: &Spec,
    mut devices: Vec<Device>,
) -> Assigned {
    let mut toolkit_warning = None;
    let keys = NodeToolkit {
        config,
        warning: &mut toolkit_warning,
    };
    let selectors = request::gpu_selectors_with(spec, keys);
    let mut named = Vec::new();
    let (gpu, unknowns) = if !selectors.is_empty() || context::has_gpu(&devices) {
        let (ctx, warnings) = gpus_selected(config, rules, selectors, &mut devices, &mut named);
        (Some(ctx), warnings)
    } else {
        (None, Vec::new())
    };
    if spec.holds_every_device() && !config.policy.strict_privileged {
        named.extend(discover::allowed_by_number(spec));
        mark_held(&mut devices, &named);
    }
    Assigned {
        devices,
        gpu,
        unknowns,
        toolkit_warning,
    }
}

/// A container that holds every device (a privileged one: every host node in
/// `linux.devices`, an allow-all rule) is assigned only what a selector other than `all`
/// names, or an allow rule names by number (`named`: a device plugin's allocation, a CDI
/// device): every other device it holds is marked [`Source::Held`], which the
/// policy lets warn and never block. Otherwise the first bad GPU on a node would refuse
/// the next start of every privileged pod there: the CNI and CSI agents, the GPU stack's
/// own pods, `kubectl debug node`.
fn mark_held(devices: &mut [Device], named: &[DevNum]) {
    for d in devices.iter_mut().filter(|d| !named.contains(&d.num)) {
        d.source = Source::Held;
    }
}

/// The node's NVIDIA toolkit config as devgate's config says where to read it, with the
/// warning for one it could not read as the toolkit does.
struct NodeToolkit<'a> {
    config: &'a Config,
    warning: &'a mut Option<String>,
}

impl request::ToolkitKeys for NodeToolkit<'_> {
    fn env_selectors(&mut self) -> bool {
        let (on, warning) = self.config.env_selectors_warned();
        *self.warning = warning.map(|w| one_line(&w));
        on
    }
    fn volume_mounts(&mut self) -> bool {
        self.config.toolkit_volume_mounts()
    }
}

/// True when the spec may assign any device, GPUs its selectors name included: the cheap
/// test that lets a container with no devices skip loading devgate's config at all.
pub fn may_have_devices(spec: &Spec) -> bool {
    discover::may_name_devices(spec) || !request::gpu_selectors(spec).is_empty()
}

/// True when the spec may assign an NVIDIA device or name GPUs through a selector: what
/// sends a hook to the dynamically linked devgate, which can load NVML, before devgate's
/// config is read (`discover::may_name_nvidia_nodes` says what the text shows).
pub fn may_name_nvidia(spec: &Spec) -> bool {
    discover::may_name_nvidia_nodes(spec) || !request::gpu_selectors(spec).is_empty()
}

/// The GPUs `selectors` choose, added to `devices` (each GPU once), with the GPU context
/// and a warning line for each selector that names no GPU. `named` gets each GPU a
/// selector other than `all` chose.
fn gpus_selected(
    config: &Config,
    rules: &[ClassRule],
    mut selectors: Selectors,
    devices: &mut Vec<Device>,
    named: &mut Vec<DevNum>,
) -> (GpuContext, Vec<String>) {
    // Selectors are resolved by the driver's list without NVML; only where that list
    // cannot be read does NVML enumerate, and then its answer serves the probes too.
    let driver = context::driver_gpus(config);
    let (known, ctx) = known_gpus(config, &driver, &mut selectors);
    let nodes = request::gpu_minor_nodes(&config.dev_root);
    let placed = place_unknown_uuids(config, selectors, &known, ctx.as_ref(), &driver);
    let (chosen, unresolved) = select::resolve_selectors(&placed.rest, &known, &nodes);
    for (minor, source) in placed.minors.into_iter().chain(chosen) {
        let d = request::selected_gpu(minor, source, rules, &config.dev_root, &config.sysfs_root);
        if source != Source::AllGpus {
            named.push(d.num);
        }
        if !devices.iter().any(|e| e.num == d.num) {
            devices.push(d);
        }
    }
    let warnings = unresolved
        .iter()
        .map(|u| one_line(&format!("devgate: warning: {u}")))
        .collect();
    // NVML was not opened for the selectors: it is, once, for the GPUs now assigned.
    let ctx = ctx.unwrap_or_else(|| {
        let minors = context::gpu_minors(devices);
        GpuContext::for_minors(config, &driver, &minors)
    });
    (ctx, warnings)
}

/// The GPU list selectors are resolved against: the driver's, or NVML's enumeration where
/// the driver's is empty, with NVML's context then. On a node with no NVIDIA GPU at all the
/// selectors are dropped: there they mean nothing.
fn known_gpus(
    config: &Config,
    driver: &[(u32, ProcGpu)],
    selectors: &mut Selectors,
) -> (KnownGpus, Option<GpuContext>) {
    if !driver.is_empty() {
        return (KnownGpus::from_driver(driver), None);
    }
    let g = GpuContext::enumerated(config);
    if context::no_nvidia_node(config, &g.nvml) {
        selectors.clear();
    }
    (KnownGpus::from_answer(&g.nvml), Some(g))
}

/// UUIDs the list does not know (a lost GPU's, which neither NVML nor the driver can read
/// any more) are placed by the driver's `GPU at` lines in the kernel log; the log is read
/// for that only when such a UUID is there (through its cache, which the probes then read
/// from).
fn place_unknown_uuids(
    config: &Config,
    selectors: Selectors,
    known: &KnownGpus,
    ctx: Option<&GpuContext>,
    driver: &[(u32, ProcGpu)],
) -> Placed {
    let unknown_uuid = selectors
        .iter()
        .any(|(s, _)| matches!(s, GpuSelector::Uuid(u) if !known.knows_uuid(u)));
    if !unknown_uuid {
        return Placed {
            minors: Vec::new(),
            rest: selectors,
        };
    }
    let read;
    let log = match ctx {
        Some(g) => &g.kmsg,
        None => {
            read = context::read_log(config);
            &read
        }
    };
    let gpu_at = log.as_ref().map(|s| s.gpu_at.as_slice()).unwrap_or(&[]);
    let procs: Vec<_> = driver.iter().map(|(_, p)| p.clone()).collect();
    gpu_at::place_uuid_selectors(selectors, known, ctx.map(|g| &g.nvml), gpu_at, &procs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn spec(json: &str) -> Spec {
        Spec::parse(json.as_bytes(), Path::new("/b/config.json")).unwrap()
    }

    #[test]
    fn a_selector_alone_may_name_a_gpu_device() {
        let env = spec(r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#);
        assert!(!discover::may_name_devices(&env));
        assert!(!discover::may_name_nvidia_nodes(&env));
        assert!(may_have_devices(&env));
        assert!(may_name_nvidia(&env));
        let none = spec(r#"{"process":{"env":["NVIDIA_VISIBLE_DEVICES=void"]}}"#);
        assert!(!may_have_devices(&none));
        assert!(!may_name_nvidia(&none));
    }
}
