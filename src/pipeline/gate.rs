//! The gate (prestart / createRuntime, and the runtime wrapper through [`gate_with`]):
//! spec → devices → probes → policy → remap → record.

use super::input::ToGate;
use super::outcome::{Remapper, Reply};
use crate::action::remap;
use crate::config::policy::Action;
use crate::config::Config;
use crate::discover;
use crate::error::Result;
use crate::gpu::{self, Assigned, GpuContext};
use crate::model::clock;
use crate::model::device::{Device, Source};
use crate::oci::spec::Spec;
use crate::oci::stage::Stage;
use crate::oci::state::State;
use crate::policy::{self, DeviceDecision};
use crate::probe::counters::{self, Snapshot};
use crate::probe::{pcie, probe_all, Findings, HostNodes, Probed};
use crate::report::prior;
use crate::report::record::{self, Decision, PodInfo};
use crate::report::termination::UID_KEYS;
use crate::store::lease::Leases;
use crate::store::marker;
use crate::store::quarantine::Ledger;
use std::path::Path;
use std::time::Instant;

/// prestart / createRuntime: decide whether the container may start, on the spec read
/// (`Input::read`), which may name devices.
pub(super) fn gate(
    stage: Stage,
    state: &State,
    to_gate: ToGate,
    config_path: Option<&Path>,
    started: Instant,
) -> Result<Reply> {
    let ToGate {
        process,
        spec,
        bytes,
    } = to_gate;
    let config = Config::load(config_path)?;
    // The runtime wrapper gated this very spec already (and remapped in it if it had to):
    // probing again would double the cost, remapping again would remap the spare.
    if marker::matches(&config.state_dir, &state.id, &bytes) {
        adopt(&config.state_dir, config.exits_keep, &state.id, state.pid());
        return Ok(Reply::default());
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
    gate_with(stage.name(), state, &spec, &config, started, &mut remap)
}

/// What the spec assigns: the devices `discover` finds, and the GPUs the spec's selectors
/// name with the GPU context (`gpu::assigned`).
fn assigned(config: &Config, spec: &Spec) -> Result<Assigned> {
    let rules = config.class_rules();
    let devices = discover::discover(spec, &rules, &config.dev_root, &config.sysfs_root)?;
    Ok(gpu::assigned(config, &rules, spec, devices))
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
pub(crate) fn gate_with(
    stage: &str,
    state: &State,
    spec: &Spec,
    config: &Config,
    started: Instant,
    remap: &mut Remapper,
) -> Result<Reply> {
    let start = Start {
        stage,
        state,
        spec,
        started,
    };
    let Assigned {
        devices,
        gpu,
        unknowns: mut selector_warnings,
        toolkit_warning,
    } = assigned(config, spec)?;
    // A selector naming no GPU devgate can find is an unknown, like a probe that cannot
    // tell: under `on_unknown: reject` it refuses the start rather than check nothing.
    if let Some(line) = policy::unknown_selectors(&selector_warnings, &config.policy) {
        return Ok(reject_unknown_selectors(&start, config, line));
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
    Ok(judge(
        &start,
        config,
        devices,
        gpu,
        selector_warnings,
        remap,
    ))
}

/// The start's devices probed, decided and remapped through `remap`; what was judged
/// recorded (the PCIe baselines, the counters, the record) and the hook's reply.
fn judge(
    start: &Start,
    config: &Config,
    devices: Vec<Device>,
    gpu: Option<GpuContext>,
    selector_warnings: Vec<String>,
    remap: &mut Remapper,
) -> Reply {
    let ledger = Ledger::new(&config.quarantine_dir);
    // The pod a cluster taint may be tolerated by; the runtimes' keys disagreeing (one is
    // the pod's forgery) is no pod.
    let pod_uid = (start.spec)
        .cri_annotation(&start.state.annotations, UID_KEYS)
        .ok()
        .flatten();
    // Every device here came from `assigned`, whose discovery found its host node just now.
    let Probed { verdicts, findings } = probe_all(
        config,
        &ledger,
        &devices,
        gpu.as_ref(),
        // Start-up trick (docs/performance.md). Plain: stat again.
        HostNodes::JustFound,
        pod_uid,
    );
    let mut decisions = policy::decide_all(devices, verdicts, &config.policy);
    let applied = remap(config, &ledger, gpu.as_ref(), &mut decisions);
    let summary = summarize(config, start, &decisions, selector_warnings);
    let in_use = record::in_use(decisions.iter().map(|d| &d.device), &applied.remaps);
    let used = with_findings(&decisions, &in_use, &findings);
    advance_baselines(config, &decisions, &findings, &used, gpu.as_ref());
    let (time_unix, time) = clock::now();
    let snapshot = (summary.action != Action::Reject)
        .then(|| snapshot_of(config, &ledger, gpu.as_ref(), &used, time_unix));
    let decision = Decision {
        devices: decisions,
        snapshot,
        remaps: applied.remaps,
        ..start.record((time_unix, time), summary.action, summary.message.clone())
    };
    record::keep(config, &decision);
    reply_of(applied.lines, summary)
}

/// The reject of a start whose selectors name a GPU devgate cannot find, under
/// `on_unknown: reject`: recorded like any decision, so `devgate explain` tells why.
fn reject_unknown_selectors(start: &Start, config: &Config, line: String) -> Reply {
    let message = Some(line.clone());
    let d = start.record(clock::now(), Action::Reject, message);
    record::keep(config, &d);
    Reply {
        exit_code: 1,
        stderr: vec![line.clone()],
        action: Some(Action::Reject),
        message: Some(line),
    }
}

/// What the policy made of a start's decisions: its action, the reject line (with the
/// pod's prior fault), and the warnings, the selectors' last.
struct Summary {
    action: Action,
    message: Option<String>,
    warnings: Vec<String>,
}

/// The policy's summary of `decisions`, with the reject line's prior fault.
fn summarize(
    config: &Config,
    start: &Start,
    decisions: &[DeviceDecision],
    selector_warnings: Vec<String>,
) -> Summary {
    let (action, mut message, mut warnings) = policy::summarize(decisions);
    if action == Action::Reject {
        message = message.map(|m| with_prior_fault(config, start.spec, start.state, m));
    }
    warnings.extend(selector_warnings);
    Summary {
        action,
        message,
        warnings,
    }
}

/// What this start judged becomes the PCIe baseline of the next (probe::pcie): the
/// devices probed, and a spare the remap put in.
fn advance_baselines(
    config: &Config,
    decisions: &[DeviceDecision],
    findings: &[Findings],
    used: &[(&Device, Option<&Findings>)],
    gpu: Option<&GpuContext>,
) {
    let mut judged: Vec<(&Device, Option<&Findings>)> = decisions
        .iter()
        .map(|d| &d.device)
        .zip(findings.iter().map(Some))
        .collect();
    judged.extend(used.iter().filter(|(_, f)| f.is_none()));
    pcie::advance_baselines(&config.sysfs_root, &config.state_dir, &judged, gpu);
}

/// The counters of the devices in use at `time_unix`, for poststop to compare against.
fn snapshot_of(
    config: &Config,
    ledger: &Ledger,
    gpu: Option<&GpuContext>,
    used: &[(&Device, Option<&Findings>)],
    time_unix: u64,
) -> Snapshot {
    Snapshot {
        time_unix,
        kmsg_seq: gpu.and_then(GpuContext::next_kmsg_seq),
        // A device a privileged container holds unassigned is not its: a fault there
        // during the run is no reason for its exit.
        devices: used
            .iter()
            .filter(|(d, _)| d.source != Source::Held)
            .map(|(d, f)| counters::snapshot_of(config, ledger, d, gpu, *f))
            .collect(),
    }
}

/// The hook's answer: the remap's lines, the warnings, and on a reject its line.
fn reply_of(remap_lines: Vec<String>, summary: Summary) -> Reply {
    let mut reply = Reply {
        exit_code: 0,
        stderr: remap_lines,
        action: Some(summary.action),
        message: summary.message.clone(),
    };
    reply.stderr.extend(summary.warnings);
    if summary.action == Action::Reject {
        reply.exit_code = 1;
        reply.stderr.extend(summary.message);
    }
    reply
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
// Start-up trick (docs/performance.md). Plain: the snapshot reads again.
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

/// The start a gate judges, as its record names it: `stage` is the record's (`prestart`,
/// or the runtime command for the wrapper).
struct Start<'a> {
    stage: &'a str,
    state: &'a State,
    spec: &'a Spec,
    started: Instant,
}

impl Start<'_> {
    /// The start's record with no devices, snapshot or remaps yet; `now` is the decision's
    /// time.
    fn record(
        &self,
        (time_unix, time): (u64, String),
        action: Action,
        message: Option<String>,
    ) -> Decision {
        let Start {
            stage,
            state,
            spec,
            started,
        } = self;
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
}
