//! The gate (prestart / createRuntime, and the runtime wrapper through [`gate_with`]):
//! spec → devices → probes → policy → remap → record.

use super::outcome::{Outcome, Remapper, Reply};
use crate::action::nsdev::ContainerProcess;
use crate::action::remap;
use crate::config::policy::Action;
use crate::config::Config;
use crate::discover::gpu::GpuSelector;
use crate::discover::{self, gpu};
use crate::error::Result;
use crate::fsutil::program;
use crate::model::clock;
use crate::model::device::Device;
use crate::model::text::one_line;
use crate::oci::spec::Spec;
use crate::oci::stage::Stage;
use crate::oci::state::State;
use crate::policy::{self, DeviceDecision};
use crate::probe::counters::{self, Snapshot};
use crate::probe::nvidia::{self, GpuContext};
use crate::probe::{pcie, probe_all, Findings, HostNodes, Probed};
use crate::report::prior;
use crate::report::record::{self, Decision, PodInfo};
use crate::store::lease::Leases;
use crate::store::marker;
use crate::store::quarantine::Ledger;
use std::path::Path;
use std::time::Instant;

/// The devices a spec assigns, GPUs its selectors name included, with the GPU context
/// when a GPU is among them (NVML is opened at most once per hook call), a warning
/// line for each selector that names no GPU, and one when the NVIDIA toolkit's config
/// could not be read as the toolkit reads it (not an unknown: it only widens the check).
///
/// Long because the GPU context and the driver's list thread through every step (the GPU
/// list, the kernel log only for an unknown UUID, the selectors resolved, NVML asked about
/// what they chose): NVML is opened at most once, so each step sees whether an earlier
/// one opened it.
fn assigned(config: &Config, spec: &Spec) -> Result<Assigned> {
    let rules = config.class_rules();
    let mut devices = discover::discover(spec, &rules, &config.dev_root, &config.sysfs_root)?;
    let mut toolkit_warning = None;
    let mut selectors = gpu::gpu_selectors_with(spec, || {
        let (on, warning) = config.env_selectors_warned();
        toolkit_warning = warning.map(|w| one_line(&w));
        on
    });
    let mut ctx = None;
    let mut warnings = Vec::new();
    if !selectors.is_empty() || nvidia::has_gpu(&devices) {
        // Selectors are resolved by the driver's list without NVML; only where that list
        // cannot be read does NVML enumerate, and then its answer serves the probes too.
        let driver = nvidia::driver_gpus(config);
        let known = if driver.is_empty() {
            let g = GpuContext::enumerated(config);
            if nvidia::no_nvidia_node(config, &g.nvml) {
                selectors.clear();
            }
            let k = nvidia::gpu::KnownGpus::from_answer(&g.nvml);
            ctx = Some(g);
            k
        } else {
            nvidia::gpu::KnownGpus::from_driver(&driver)
        };
        let nodes = gpu::gpu_minor_nodes(&config.dev_root);
        // UUIDs the list does not know (a lost GPU's, which neither NVML nor the driver can
        // read any more) are placed by the driver's `GPU at` lines in the kernel log; the
        // log is read for that only when such a UUID is there (through its cache, which
        // the probes then read from).
        let unknown_uuid = selectors
            .iter()
            .any(|(s, _)| matches!(s, GpuSelector::Uuid(u) if !known.knows_uuid(u)));
        let placed = if unknown_uuid {
            let read;
            let log = match &ctx {
                Some(g) => &g.kmsg,
                None => {
                    read = nvidia::read_log(config);
                    &read
                }
            };
            let gpu_at = log.as_ref().map(|s| s.gpu_at.as_slice()).unwrap_or(&[]);
            let procs: Vec<_> = driver.iter().map(|(_, p)| p.clone()).collect();
            nvidia::gpu_at::place_uuid_selectors(
                std::mem::take(&mut selectors),
                &known,
                ctx.as_ref().map(|g| &g.nvml),
                gpu_at,
                &procs,
            )
        } else {
            nvidia::gpu_at::Placed {
                minors: Vec::new(),
                rest: std::mem::take(&mut selectors),
            }
        };
        let (chosen, unresolved) = nvidia::gpu::resolve_selectors(&placed.rest, &known, &nodes);
        for (minor, source) in placed.minors.into_iter().chain(chosen) {
            let d = gpu::selected_gpu(minor, source, &rules, &config.dev_root, &config.sysfs_root);
            if !devices.iter().any(|e| e.num == d.num) {
                devices.push(d);
            }
        }
        warnings = unresolved
            .iter()
            .map(|u| one_line(&format!("devgate: warning: {u}")))
            .collect();
        if ctx.is_none() {
            let minors = nvidia::gpu_minors(&devices);
            ctx = Some(GpuContext::for_minors(config, &driver, &minors));
        }
    }
    Ok(Assigned {
        devices,
        gpu: ctx,
        unknowns: warnings,
        toolkit_warning,
    })
}

/// What [`assigned`] found: the devices, the GPU context, a warning per selector naming no
/// GPU (an unknown to the policy), and the toolkit config's warning (no unknown).
struct Assigned {
    devices: Vec<Device>,
    gpu: Option<GpuContext>,
    unknowns: Vec<String>,
    toolkit_warning: Option<String>,
}

/// prestart / createRuntime: decide whether the container may start.
pub(super) fn gate(
    stage: Stage,
    state: &State,
    config_path: Option<&Path>,
    started: Instant,
) -> Result<Outcome> {
    // Held before anything slow runs: a pid that dies and is reused while devgate probes
    // can never send a remap into another process.
    let process = state.pid().map(ContainerProcess::open);
    let (spec, bytes) = Spec::read(&state.bundle.join("config.json"))?;
    if !discover::may_have_devices(&spec) {
        return Ok(Outcome::Replied(Reply::default()));
    }
    if program::linked_statically() && discover::may_name_nvidia(&spec) {
        return Ok(Outcome::HandOff);
    }
    let config = Config::load(config_path)?;
    // The runtime wrapper gated this very spec already (and remapped in it if it had to):
    // probing again would double the cost, remapping again would remap the spare.
    if marker::matches(&config.state_dir, &state.id, &bytes) {
        adopt(&config.state_dir, config.exits_keep, &state.id, state.pid());
        return Ok(Outcome::Replied(Reply::default()));
    }
    let mut remap = |config: &Config,
                     ledger: &Ledger,
                     gpu: Option<&GpuContext>,
                     decisions: &mut [DeviceDecision]| {
        remap::apply(
            config,
            state,
            &spec,
            ledger,
            gpu,
            process.as_ref(),
            decisions,
        )
    };
    gate_with(stage.name(), state, &spec, &config, started, &mut remap).map(Outcome::Replied)
}

/// Once the container has a process, at the hook after the wrapper decided: the wrapper's
/// record names no pid yet and its leases name the runtime's, so both are pointed at the
/// container's (the record's pid is how `status` and pruning tell a live container's
/// record; the lease's is how a spare's holder is known to be alive).
fn adopt(state_dir: &Path, keep: usize, id: &str, pid: Option<i32>) {
    let Some(pid) = pid else { return };
    match record::read_record(state_dir, id) {
        Ok(Some(mut rec)) if rec.pid.is_none() => {
            rec.pid = Some(pid);
            rec.pid_start = crate::store::lease::pid_start(pid);
            if let Err(e) = record::write_record(state_dir, &rec, keep) {
                log::error!("cannot keep container record: {e}");
            }
        }
        Ok(_) => {}
        Err(e) => log::error!("cannot read container record: {e}"),
    }
    let leases = Leases::new(state_dir);
    if !leases.dir.exists() {
        return;
    }
    if let Err(e) = leases.adopt(id, pid) {
        log::error!("cannot point the spares of {id} at pid {pid}: {e}");
    }
}

/// The gate on a loaded spec: discover, probe, decide, remap through `remap`, record.
/// `stage` is the record's (`prestart`, or the runtime command for the wrapper).
///
/// Long because it is the one path from spec to record, stage after stage; each stage is
/// a call into its layer.
pub(crate) fn gate_with(
    stage: &str,
    state: &State,
    spec: &Spec,
    config: &Config,
    started: Instant,
    remap: &mut Remapper,
) -> Result<Reply> {
    let Assigned {
        devices,
        gpu,
        unknowns: mut selector_warnings,
        toolkit_warning,
    } = assigned(config, spec)?;
    // A selector naming no GPU devgate can find is an unknown, like a probe that cannot
    // tell: under `on_unknown: reject` it refuses the start rather than check nothing.
    if let Some(line) = policy::unknown_selectors(&selector_warnings, &config.policy) {
        // Recorded like any decision, so `devgate explain` tells why.
        let message = Some(line.clone());
        let d = record_of(
            stage,
            state,
            spec,
            started,
            clock::now(),
            Action::Reject,
            message,
        );
        record::keep(config, &d);
        return Ok(Reply {
            exit_code: 1,
            stderr: vec![line.clone()],
            action: Some(Action::Reject),
            message: Some(line),
        });
    }
    // After the unknowns' check: a toolkit config devgate cannot read is no unknown.
    selector_warnings.extend(toolkit_warning);
    if devices.is_empty() {
        return Ok(Reply {
            exit_code: 0,
            stderr: selector_warnings,
            ..Reply::default()
        });
    }
    let ledger = Ledger::new(&config.quarantine_dir);
    // Every device here came from `assigned`, whose discovery found its host node just now.
    let Probed { verdicts, findings } = probe_all(
        config,
        &ledger,
        &devices,
        gpu.as_ref(),
        HostNodes::JustFound,
    );
    let mut decisions = policy::decide_all(devices, verdicts, &config.policy);
    let applied = remap(config, &ledger, gpu.as_ref(), &mut decisions);
    let (action, mut message, mut warnings) = policy::summarize(&decisions);
    if action == Action::Reject {
        message = message.map(|m| with_prior_fault(config, spec, state, m));
    }
    warnings.extend(selector_warnings);
    let in_use = record::in_use(decisions.iter().map(|d| &d.device), &applied.remaps);
    let used = with_findings(&decisions, &in_use, &findings);
    // What this start judged becomes the PCIe baseline of the next (probe::pcie).
    let mut judged: Vec<(&Device, Option<&Findings>)> = decisions
        .iter()
        .map(|d| &d.device)
        .zip(findings.iter().map(Some))
        .collect();
    judged.extend(used.iter().filter(|(_, f)| f.is_none()));
    pcie::advance_baselines(&config.sysfs_root, &config.state_dir, &judged, gpu.as_ref());

    let (time_unix, time) = clock::now();
    let snapshot = (action != Action::Reject).then(|| Snapshot {
        time_unix,
        kmsg_seq: gpu.as_ref().and_then(GpuContext::next_kmsg_seq),
        devices: used
            .iter()
            .map(|(d, f)| counters::snapshot_of(config, &ledger, d, gpu.as_ref(), *f))
            .collect(),
    });
    let decision = Decision {
        devices: decisions,
        snapshot,
        remaps: applied.remaps,
        ..record_of(
            stage,
            state,
            spec,
            started,
            (time_unix, time),
            action,
            message.clone(),
        )
    };
    record::keep(config, &decision);

    let mut reply = Reply {
        exit_code: 0,
        stderr: applied.lines,
        action: Some(action),
        message: message.clone(),
    };
    reply.stderr.extend(warnings);
    if action == Action::Reject {
        reply.exit_code = 1;
        reply.stderr.extend(message);
    }
    Ok(reply)
}

/// A rejected start of a container whose previous run in the same pod ended with a
/// device fault (kubelet's restart): the reject line says which fault and when, since
/// from now on the pod shows only this reason.
fn with_prior_fault(config: &Config, spec: &Spec, state: &State, reject: String) -> String {
    let pod = PodInfo::from_annotations(spec, &state.annotations);
    match prior::read(&config.state_dir, &pod) {
        Some(p) => prior::with_prior(&reject, &p),
        None => reject,
    }
}

/// The devices in use, each with what the probes found of it: none for a spare the remap
/// put in (probed by the remap; the stages after the probes read it again).
fn with_findings<'a>(
    decisions: &[DeviceDecision],
    in_use: &'a [Device],
    findings: &'a [Findings],
) -> Vec<(&'a Device, Option<&'a Findings>)> {
    in_use
        .iter()
        .zip(decisions)
        .zip(findings)
        .map(|((u, d), f)| (u, (u.num == d.device.num).then_some(f)))
        .collect()
}

/// A gate's record with no devices, snapshot or remaps yet; `now` is the decision's time.
fn record_of(
    stage: &str,
    state: &State,
    spec: &Spec,
    started: Instant,
    (time_unix, time): (u64, String),
    action: Action,
    message: Option<String>,
) -> Decision {
    Decision {
        time,
        time_unix,
        stage: stage.to_string(),
        container_id: state.id.clone(),
        pid: state.pid(),
        pid_start: state.pid().and_then(crate::store::lease::pid_start),
        pod: PodInfo::from_annotations(spec, &state.annotations),
        devices: Vec::new(),
        action,
        message,
        elapsed_us: started.elapsed().as_micros() as u64,
        version: crate::VERSION.to_string(),
        snapshot: None,
        remaps: Vec::new(),
    }
}
