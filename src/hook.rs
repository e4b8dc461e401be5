//! One hook call, start to end: state → spec → devices → probes → policy → action → record.

use crate::config::Config;
use crate::device::{self, Device};
use crate::error::{Error, Result};
use crate::ledger::quarantine::Ledger;
use crate::policy::{self, DeviceDecision, Disposition};
use crate::probe::nvml::{self, NvmlProbe, Snapshot};
use crate::probe::xid::{self, KmsgScan, XidProbe, XidTable};
use crate::probe::{self, node::NodeProbe, quarantine::QuarantineProbe, sysfs::SysfsProbe, Probe};
use crate::record::{self, ContainerAction, Decision, PodInfo};
use crate::spec::Spec;
use crate::state::State;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

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
    let rules = config.class_rules();
    let mut devices = device::discover(&spec, &rules, &config.dev_root, &config.sysfs_root)?;
    let selectors = device::gpu_selectors(&spec);
    let gpu = (!selectors.is_empty() || has_gpu(&devices)).then(|| GpuContext::gather(&config));
    let mut selector_warnings = Vec::new();
    if let Some(g) = &gpu {
        let nodes = nvml::gpu_minor_nodes(&config.dev_root);
        let (chosen, unresolved) = nvml::resolve_selectors(&selectors, &g.nvml, &nodes);
        for (minor, source) in chosen {
            let d =
                device::selected_gpu(minor, source, &rules, &config.dev_root, &config.sysfs_root);
            if !devices.iter().any(|e| e.num == d.num) {
                devices.push(d);
            }
        }
        selector_warnings = unresolved
            .iter()
            .map(|u| policy::one_line(&format!("devgate: warning: {u}")))
            .collect();
    }
    if devices.is_empty() {
        return Ok(Report {
            exit_code: 0,
            stderr: selector_warnings,
        });
    }
    let ledger = Ledger::new(&config.quarantine_dir);
    let decisions = decide_with(&config, &ledger, devices, gpu.as_ref());
    let (action, message, mut warnings) = summarize(&decisions);
    warnings.extend(selector_warnings);

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
    };
    keep_records(&config, &decision);

    let mut report = Report {
        exit_code: 0,
        stderr: warnings,
    };
    if action == ContainerAction::Reject {
        report.exit_code = 1;
        report.stderr.extend(message);
    }
    Ok(report)
}

/// What the GPU probes read once per hook call: NVML's answer and the kernel log.
pub struct GpuContext {
    pub nvml: Snapshot,
    pub kmsg: std::result::Result<KmsgScan, String>,
    pub xid_table: XidTable,
    pub limits: nvml::Limits,
}

impl GpuContext {
    /// Opens NVML (bounded by `probe_timeout_ms`) and reads `kmsg_path`.
    pub fn gather(config: &Config) -> GpuContext {
        let timeout = Duration::from_millis(config.probe_timeout_ms);
        let nvml = Snapshot::take(&config.nvml_library, timeout);
        let limits = xid::ReadLimits {
            deadline: timeout,
            ..xid::ReadLimits::default()
        };
        GpuContext {
            nvml,
            kmsg: xid::read_kmsg(&config.kmsg_path, limits),
            // validated when the config was loaded
            xid_table: XidTable::new(&config.gpu.xid_actions).unwrap_or_default(),
            limits: nvml::Limits {
                max_volatile_uncorrectable_ecc: config.gpu.max_volatile_uncorrectable_ecc,
            },
        }
    }

    /// Only a GPU opens NVML: containers without one never load the library.
    pub fn for_devices(config: &Config, devices: &[Device]) -> Option<GpuContext> {
        has_gpu(devices).then(|| GpuContext::gather(config))
    }
}

fn has_gpu(devices: &[Device]) -> bool {
    devices.iter().any(|d| d.class == crate::class::NVIDIA_GPU)
}

/// Probes every device and applies the policy, opening NVML when a device is a GPU.
pub fn decide_all(config: &Config, ledger: &Ledger, devices: Vec<Device>) -> Vec<DeviceDecision> {
    let gpu = GpuContext::for_devices(config, &devices);
    decide_with(config, ledger, devices, gpu.as_ref())
}

/// Probes every device and applies the policy. The NVML and XID probes run only when a
/// device has an NVIDIA class and the caller gathered their context. A device whose
/// policy is remap cannot be remapped without a configured spare; it is rejected saying so.
pub fn decide_with(
    config: &Config,
    ledger: &Ledger,
    devices: Vec<Device>,
    gpu: Option<&GpuContext>,
) -> Vec<DeviceDecision> {
    let node = NodeProbe {
        dev_root: config.dev_root.clone(),
    };
    let sysfs = SysfsProbe {
        sysfs_root: config.sysfs_root.clone(),
    };
    let quarantine = QuarantineProbe { ledger };
    let nvidia = devices
        .iter()
        .any(|d| crate::class::is_nvidia_class(&d.class));
    let gpu = gpu.filter(|_| nvidia);
    let nvml_probe = gpu.map(|g| NvmlProbe {
        snapshot: &g.nvml,
        limits: g.limits,
    });
    let xid_probe = gpu.map(|g| XidProbe {
        scan: &g.kmsg,
        table: &g.xid_table,
        nvml: &g.nvml,
    });
    let mut probes: Vec<&dyn Probe> = vec![&node, &sysfs, &quarantine];
    if let Some(p) = &nvml_probe {
        probes.push(p);
    }
    if let Some(p) = &xid_probe {
        probes.push(p);
    }
    devices
        .into_iter()
        .map(|d| {
            let verdicts = probe::run_all(&probes, &d);
            let mut dec = policy::decide(d, verdicts, &config.policy);
            if dec.disposition == Disposition::Remap {
                let why = match config.spares.get(&dec.device.class) {
                    None => format!(
                        "remap impossible: no spare configured for class {}",
                        dec.device.class
                    ),
                    Some(_) => {
                        "remap impossible: remapping is not supported by this build".to_string()
                    }
                };
                dec.disposition = Disposition::Reject;
                dec.reasons.push(why);
            }
            dec
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
fn poststop(state: &State, _config_path: Option<&Path>) -> Result<Report> {
    log::debug!("poststop for {}", state.id);
    Ok(Report::default())
}
