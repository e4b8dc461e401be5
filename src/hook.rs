//! One hook call, start to end: state → spec → devices → probes → policy → action → record.

use crate::config::Config;
use crate::device::{self, Device};
use crate::error::{Error, Result};
use crate::ledger::quarantine::Ledger;
use crate::policy::{self, DeviceDecision, Disposition};
use crate::probe::{self, node::NodeProbe, quarantine::QuarantineProbe, sysfs::SysfsProbe, Probe};
use crate::record::{self, ContainerAction, Decision, PodInfo};
use crate::spec::Spec;
use crate::state::State;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Prestart,
    CreateRuntime,
    CreateContainer,
    StartContainer,
    Poststart,
    Poststop,
}

impl Stage {
    pub const ALL: [(&'static str, Stage); 6] = [
        ("prestart", Stage::Prestart),
        ("createRuntime", Stage::CreateRuntime),
        ("createContainer", Stage::CreateContainer),
        ("startContainer", Stage::StartContainer),
        ("poststart", Stage::Poststart),
        ("poststop", Stage::Poststop),
    ];

    pub fn parse(s: &str) -> Result<Stage> {
        Stage::ALL
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, st)| *st)
            .ok_or_else(|| {
                let names: Vec<&str> = Stage::ALL.iter().map(|(n, _)| *n).collect();
                Error::Usage(format!(
                    "unknown hook stage {s:?}; expected one of {}",
                    names.join(", ")
                ))
            })
    }

    pub fn name(self) -> &'static str {
        Stage::ALL
            .iter()
            .find(|(_, st)| *st == self)
            .map(|(n, _)| *n)
            .unwrap_or("")
    }

    /// The stages at which devgate decides whether a container may start: both run after
    /// the runtime has created the container's cgroup and namespaces, before its process.
    pub fn gates(self) -> bool {
        matches!(self, Stage::Prestart | Stage::CreateRuntime)
    }
}

/// What the hook has to say and how it exits.
#[derive(Debug, Default)]
pub struct Report {
    pub exit_code: i32,
    pub stderr: Vec<String>,
}

pub fn run(
    stage: Stage,
    config_path: Option<&Path>,
    input: impl Read,
    started: Instant,
) -> Result<Report> {
    // Always drain stdin: a runtime that writes the state into a pipe nobody reads can see
    // EPIPE and report a failure that is not there.
    let state = State::read(input)?;
    if stage.gates() {
        gate(stage, &state, config_path, started)
    } else if stage == Stage::Poststop {
        poststop(&state, config_path)
    } else {
        Ok(Report::default())
    }
}

fn gate(
    stage: Stage,
    state: &State,
    config_path: Option<&Path>,
    started: Instant,
) -> Result<Report> {
    let spec = Spec::load(&state.bundle)?;
    if !device::may_have_devices(&spec) {
        return Ok(Report::default());
    }
    let config = Config::load(config_path)?;
    let devices = device::discover(
        &spec,
        &config.class_rules(),
        &config.dev_root,
        &config.sysfs_root,
    )?;
    if devices.is_empty() {
        return Ok(Report::default());
    }
    let ledger = Ledger::new(&config.quarantine_dir);
    let mut decisions = decide_all(&config, &ledger, devices);
    let applied = crate::remap::apply(&config, state, &spec, &ledger, &mut decisions);
    let (action, message, warnings) = summarize(&decisions);

    let (time_unix, time) = crate::ledger::now();
    let decision = Decision {
        time,
        time_unix,
        stage: stage.name().to_string(),
        container_id: state.id.clone(),
        pod: PodInfo::from_annotations(&spec, &state.annotations),
        devices: decisions,
        action,
        message: message.clone(),
        elapsed_us: started.elapsed().as_micros() as u64,
        version: crate::VERSION.to_string(),
        remaps: applied.remaps,
    };
    keep_records(&config, &decision);

    let mut report = Report {
        exit_code: 0,
        stderr: applied.lines,
    };
    report.stderr.extend(warnings);
    if action == ContainerAction::Reject {
        report.exit_code = 1;
        report.stderr.extend(message);
    }
    Ok(report)
}

/// Probes every device and applies the policy. A device whose disposition is Remap is
/// left for `remap::apply`, which remaps it or rejects it saying why.
pub fn decide_all(config: &Config, ledger: &Ledger, devices: Vec<Device>) -> Vec<DeviceDecision> {
    let node = NodeProbe {
        dev_root: config.dev_root.clone(),
    };
    let sysfs = SysfsProbe {
        sysfs_root: config.sysfs_root.clone(),
    };
    let quarantine = QuarantineProbe { ledger };
    let probes: [&dyn Probe; 3] = [&node, &sysfs, &quarantine];
    devices
        .into_iter()
        .map(|d| {
            let verdicts = probe::run_all(&probes, &d);
            policy::decide(d, verdicts, &config.policy)
        })
        .collect()
}

/// The container's action, its reject line if any, and warning lines for stderr.
pub fn summarize(decisions: &[DeviceDecision]) -> (ContainerAction, Option<String>, Vec<String>) {
    let rejected: Vec<&DeviceDecision> = decisions
        .iter()
        .filter(|d| d.disposition == Disposition::Reject)
        .collect();
    let mut warnings = Vec::new();
    for d in decisions {
        if d.disposition == Disposition::Allowed {
            warnings.push(policy::one_line(&format!(
                "devgate: warning: {}",
                policy::reject_clause(d)
            )));
        }
        for w in &d.warnings {
            warnings.push(policy::one_line(&format!(
                "devgate: warning: {}: {w}",
                d.device.describe()
            )));
        }
    }
    if !rejected.is_empty() {
        return (
            ContainerAction::Reject,
            Some(policy::reject_line(rejected)),
            warnings,
        );
    }
    let action = if decisions
        .iter()
        .any(|d| d.disposition == Disposition::Remap)
    {
        ContainerAction::Remap
    } else if decisions
        .iter()
        .any(|d| d.disposition == Disposition::Allowed)
        || !warnings.is_empty()
    {
        ContainerAction::Warn
    } else {
        ContainerAction::Allow
    };
    (action, None, warnings)
}

/// Records are for people after the fact; failing to write one must not change whether a
/// container starts, so errors are logged, not returned.
fn keep_records(config: &Config, decision: &Decision) {
    if let Err(e) = record::write_record(&config.state_dir, decision) {
        log::error!("cannot keep container record: {e}");
    }
    if let Some(log_file) = &config.log_file {
        if let Err(e) = record::append_log(log_file, decision) {
            log::error!("cannot append decision log: {e}");
        }
    }
}

/// poststop never fails the container's lifecycle; a bundle already gone is normal.
fn poststop(state: &State, config_path: Option<&Path>) -> Result<Report> {
    log::debug!("poststop for {}", state.id);
    match Config::load(config_path) {
        Ok(config) => {
            crate::remap::release(&config, &state.id);
        }
        Err(e) => log::error!("poststop for {}: cannot release spares: {e}", state.id),
    }
    Ok(Report::default())
}
