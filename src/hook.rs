//! One hook call, start to end: state → spec → devices → probes → policy → action → record.

use crate::config::Config;
use crate::device::{self, Device};
use crate::error::{Error, Result};
use crate::fault::{self, DeviceSnapshot, Fault, GpuCounters, Snapshot, XidReport};
use crate::ledger::quarantine::Ledger;
use crate::policy::{self, DeviceDecision, Disposition};
use crate::probe::nvml::{self, NvmlProbe};
use crate::probe::xid::{self, KmsgScan, XidAction, XidProbe, XidTable};
use crate::probe::{
    self, node::NodeProbe, quarantine::QuarantineProbe, sysfs::SysfsProbe, Probe, ProbeResult,
};
use crate::record::{self, ContainerAction, Decision, ExitRecord, PodInfo, StopLine};
use crate::spec::Spec;
use crate::state::State;
use crate::termination;
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

    /// The stage a runtime is in from the state's status, for `devgate hook auto`: an
    /// oci-hooks(5) file has one argument list for all its stages. Every runtime passes
    /// `stopped` to poststop (runc `creating`, crun `created` to prestart); a status devgate
    /// does not know gates, so that no start slips through ungated.
    pub fn from_status(status: &str) -> Stage {
        match status {
            "stopped" => Stage::Poststop,
            "running" | "paused" => Stage::Poststart,
            _ => Stage::Prestart,
        }
    }

    pub fn parse(s: &str) -> Result<Stage> {
        Stage::ALL
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, st)| *st)
            .ok_or_else(|| {
                let names: Vec<&str> = Stage::ALL.iter().map(|(n, _)| *n).collect();
                Error::Usage(format!(
                    "unknown hook stage {s:?}; expected auto or one of {}",
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
    /// The decision, when devgate made one (a container with devices).
    pub action: Option<ContainerAction>,
    /// The reject line, also among `stderr`.
    pub message: Option<String>,
}

/// How a gate carries out a remap: at hook time in the created container
/// (`remap::apply`), or in the spec before the runtime reads it (the runtime wrapper).
pub type Remapper<'a> = dyn FnMut(&Config, &Ledger, Option<&GpuContext>, &mut [DeviceDecision]) -> crate::remap::Applied
    + 'a;

/// One hook call, once the state is read (the caller reads stdin first, always: a
/// runtime that writes the state into a pipe nobody reads can see EPIPE and report a
/// failure that is not there).
pub fn run(
    stage: Stage,
    state: &State,
    config_path: Option<&Path>,
    started: Instant,
) -> Result<Report> {
    if stage.gates() {
        gate(stage, state, config_path, started)
    } else if stage == Stage::Poststop {
        poststop(state, config_path, started)
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
    let (spec, bytes) = Spec::read(&state.bundle.join("config.json"))?;
    if !device::may_have_devices(&spec) {
        return Ok(Report::default());
    }
    let config = Config::load(config_path)?;
    // The runtime wrapper gated this very spec already (and remapped in it if it had to):
    // probing again would double the cost, remapping again would remap the spare.
    if crate::wrapper::marker::matches(&config.state_dir, &state.id, &bytes) {
        crate::wrapper::marker::adopt(&config.state_dir, &state.id, state.pid());
        return Ok(Report::default());
    }
    let mut remap = |config: &Config,
                     ledger: &Ledger,
                     gpu: Option<&GpuContext>,
                     decisions: &mut [DeviceDecision]| {
        crate::remap::apply(config, state, &spec, ledger, gpu, decisions)
    };
    gate_with(stage.name(), state, &spec, &config, started, &mut remap)
}

/// The gate on a loaded spec: discover, probe, decide, remap through `remap`, record.
/// The stage is the record's (`prestart`, or the runtime command for the wrapper).
pub fn gate_with(
    stage: &str,
    state: &State,
    spec: &Spec,
    config: &Config,
    started: Instant,
    remap: &mut Remapper,
) -> Result<Report> {
    let rules = config.class_rules();
    let mut devices = device::discover(spec, &rules, &config.dev_root, &config.sysfs_root)?;
    let selectors = device::gpu_selectors(spec);
    let gpu = (!selectors.is_empty() || has_gpu(&devices)).then(|| GpuContext::gather(config));
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
            ..Report::default()
        });
    }
    let ledger = Ledger::new(&config.quarantine_dir);
    let mut decisions = decide_with(config, &ledger, devices, gpu.as_ref());
    let applied = remap(config, &ledger, gpu.as_ref(), &mut decisions);
    let (action, message, mut warnings) = summarize(&decisions);
    warnings.extend(selector_warnings);

    let (time_unix, time) = crate::ledger::now();
    let snapshot = (action != ContainerAction::Reject).then(|| Snapshot {
        time_unix,
        kmsg_seq: gpu.as_ref().and_then(next_kmsg_seq),
        devices: in_use(&decisions, &applied.remaps)
            .iter()
            .map(|d| snapshot_of(config, &ledger, d, gpu.as_ref()))
            .collect(),
    });
    let decision = Decision {
        time,
        time_unix,
        stage: stage.to_string(),
        container_id: state.id.clone(),
        pid: state.pid(),
        pod: PodInfo::from_annotations(spec, &state.annotations),
        devices: decisions,
        action,
        message: message.clone(),
        elapsed_us: started.elapsed().as_micros() as u64,
        version: crate::VERSION.to_string(),
        snapshot,
        remaps: applied.remaps,
    };
    keep_records(config, &decision);

    let mut report = Report {
        exit_code: 0,
        stderr: applied.lines,
        action: Some(action),
        message: message.clone(),
    };
    report.stderr.extend(warnings);
    if action == ContainerAction::Reject {
        report.exit_code = 1;
        report.stderr.extend(message);
    }
    Ok(report)
}

/// What the GPU probes read once per hook call: NVML's answer and the kernel log.
pub struct GpuContext {
    pub nvml: nvml::Snapshot,
    pub kmsg: std::result::Result<KmsgScan, String>,
    pub xid_table: XidTable,
    pub limits: nvml::Limits,
}

impl GpuContext {
    /// Opens NVML (bounded by `probe_timeout_ms`) and reads `kmsg_path`.
    pub fn gather(config: &Config) -> GpuContext {
        let timeout = Duration::from_millis(config.probe_timeout_ms);
        let nvml = nvml::Snapshot::take(&config.nvml_library, timeout);
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

/// Runs every probe on every device. The probe list is built once per call; the NVML and
/// XID probes join it only when a device has an NVIDIA class and the caller gathered their
/// context.
pub fn probe_all(
    config: &Config,
    ledger: &Ledger,
    devices: &[Device],
    gpu: Option<&GpuContext>,
) -> Vec<Vec<ProbeResult>> {
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
    devices.iter().map(|d| probe::run_all(&probes, d)).collect()
}

/// Probes every device and applies the policy. A device whose disposition is Remap is
/// left for `remap::apply`, which remaps it or rejects it saying why.
pub fn decide_with(
    config: &Config,
    ledger: &Ledger,
    devices: Vec<Device>,
    gpu: Option<&GpuContext>,
) -> Vec<DeviceDecision> {
    let verdicts = probe_all(config, ledger, &devices, gpu);
    devices
        .into_iter()
        .zip(verdicts)
        .map(|(d, verdicts)| policy::decide(d, verdicts, &config.policy))
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
    if let Err(e) = record::remove_exit(&config.state_dir, &decision.container_id) {
        log::error!("cannot remove the previous run's exit record: {e}");
    }
    if let Err(e) = record::write_record(&config.state_dir, decision) {
        log::error!("cannot keep container record: {e}");
    }
    if let Some(log_file) = &config.log_file {
        if let Err(e) = record::append_log(log_file, decision) {
            log::error!("cannot append decision log: {e}");
        }
    }
}

/// The devices the container runs on: a remapped device's spare stands in for it.
fn in_use(decisions: &[DeviceDecision], remaps: &[crate::remap::RemapRecord]) -> Vec<Device> {
    decisions
        .iter()
        .map(|d| match remaps.iter().find(|r| r.device == d.device.num) {
            Some(r) => Device {
                num: r.spare,
                host_path: Some(r.spare_path.clone()),
                ..d.device.clone()
            },
            None => d.device.clone(),
        })
        .collect()
}

fn snapshot_of(
    config: &Config,
    ledger: &Ledger,
    device: &Device,
    gpu: Option<&GpuContext>,
) -> DeviceSnapshot {
    let mut counters = fault::read_counters(config, ledger, device);
    if device.class == crate::class::NVIDIA_GPU {
        counters.gpu = gpu.and_then(|g| gpu_counters(&g.nvml, device.num.minor));
    }
    DeviceSnapshot {
        num: device.num,
        name: device.name(),
        counters,
    }
}

/// NVML's changeable figures for /dev/nvidia`minor`. None when NVML gave no answer at all
/// (library missing, deadline): then no GPU fault can be claimed either way.
fn gpu_counters(snapshot: &nvml::Snapshot, minor: u32) -> Option<GpuCounters> {
    let gpus = snapshot.gpus.as_ref().ok()?;
    let Some(g) = snapshot.gpu_by_minor(minor) else {
        // NVML answered but no GPU has this minor any more: it fell off the bus.
        return (!gpus.is_empty()).then(GpuCounters::default);
    };
    let rows = g.remapped_rows.value();
    Some(GpuCounters {
        uuid: g.uuid.value().cloned(),
        pci_bus_id: g.pci_bus_id.value().cloned(),
        reachable: !g.is_lost(),
        ecc_volatile_uncorrectable: g.volatile_uncorrectable_ecc.value().copied(),
        remapped_rows_uncorrectable: rows.map(|r| u64::from(r.uncorrectable)),
        remap_failure: rows.is_some_and(|r| r.failure),
    })
}

/// The first kernel log sequence number after what devgate saw at start; None when the
/// log could not be read, so that poststop never blames a run for older reports.
fn next_kmsg_seq(gpu: &GpuContext) -> Option<u64> {
    let scan = gpu.kmsg.as_ref().ok()?;
    // A read cut short does not know where the log ends.
    if scan.truncated {
        return None;
    }
    Some(scan.last_seq.map_or(0, |s| s + 1))
}

/// XID reports in the kernel log, classified by the operator's table.
fn xid_reports(gpu: &GpuContext) -> Vec<XidReport> {
    let Ok(scan) = &gpu.kmsg else {
        return Vec::new();
    };
    scan.events
        .iter()
        .map(|e| XidReport {
            seq: e.seq,
            pci: e.pci.to_string(),
            xid: e.xid,
            critical: gpu.xid_table.action(e.xid) == XidAction::Unhealthy,
            text: e.text.clone(),
        })
        .collect()
}

/// poststop: what went wrong with the container's devices while it ran. It never fails the
/// lifecycle (the caller exits 0 on any error past reading stdin) and is idempotent: an
/// exit record already present means an earlier call did the work.
fn poststop(state: &State, config_path: Option<&Path>, started: Instant) -> Result<Report> {
    // The bundle may already be gone; then only devgate's own record can tell.
    let spec = Spec::load(&state.bundle).ok();
    if spec.as_ref().is_some_and(|s| !device::may_have_devices(s)) {
        return Ok(Report::default());
    }
    let config = Config::load(config_path)?;
    // Spares go back first: whatever else fails below, a lease must not outlive its container.
    crate::remap::release(&config, &state.id);
    // The runtime wrapper's marker is for this run only (a runtime deleting without the
    // wrapper never tells it).
    if let Err(e) = crate::wrapper::marker::remove(&config.state_dir, &state.id) {
        log::error!("cannot remove the decided marker of {}: {e}", state.id);
    }
    let Some(rec) = record::read_record(&config.state_dir, &state.id)? else {
        return Ok(Report::default());
    };
    let Some(start) = &rec.snapshot else {
        return Ok(Report::default()); // rejected: it never ran
    };
    if record::read_exit(&config.state_dir, &state.id)?.is_some() {
        return Ok(Report::default());
    }
    let ledger = Ledger::new(&config.quarantine_dir);
    let devices = in_use(&rec.devices, &rec.remaps);
    // NVML and the kernel log are read again only for a container that had a GPU.
    let gpu = GpuContext::for_devices(&config, &devices);
    let now: Vec<DeviceSnapshot> = devices
        .iter()
        .map(|d| snapshot_of(&config, &ledger, d, gpu.as_ref()))
        .collect();
    let xids = gpu.as_ref().map(xid_reports).unwrap_or_default();
    let faults = fault::diff(start, &now, &xids);
    let lines: Vec<String> = faults.iter().map(Fault::line).collect();

    let termination_message = if faults.is_empty() {
        None
    } else {
        let host = spec
            .as_ref()
            .and_then(|s| termination::host_file(s, &state.annotations));
        Some(match host {
            Some(h) => termination::append(&config.kubelet_pods_dir, &h, &lines),
            None => termination::Outcome {
                host_path: None,
                written: false,
                note: "no termination-message mount".into(),
            },
        })
    };
    let (stopped_unix, stopped) = crate::ledger::now();
    let exit = ExitRecord {
        container_id: state.id.clone(),
        pod: rec.pod.clone(),
        devices,
        faults,
        started: rec.time.clone(),
        started_unix: rec.time_unix,
        stopped: stopped.clone(),
        stopped_unix,
        termination_message,
        version: crate::VERSION.to_string(),
    };
    if let Err(e) = record::write_exit(&config.state_dir, &exit, config.exits_keep) {
        log::error!("cannot keep exit record: {e}");
    }
    if let Some(log_file) = &config.log_file {
        let line = StopLine {
            time: &stopped,
            time_unix: stopped_unix,
            stage: "poststop",
            container_id: &state.id,
            pod: &rec.pod,
            faults: &exit.faults,
            elapsed_us: started.elapsed().as_micros() as u64,
            version: crate::VERSION,
        };
        if let Err(e) = record::append_log(log_file, &line) {
            log::error!("cannot append decision log: {e}");
        }
    }
    Ok(Report {
        exit_code: 0,
        stderr: lines,
        ..Report::default()
    })
}
