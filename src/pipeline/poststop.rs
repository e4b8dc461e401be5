//! Poststop: the start record and the devices read again → the fault diff → the
//! termination message and the exit record.

use super::outcome::Reply;
use crate::action::spare;
use crate::config::Config;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::model::clock;
use crate::model::device::Device;
use crate::oci::spec::Spec;
use crate::oci::state::State;
use crate::probe::counters::{self, DeviceSnapshot, Snapshot};
use crate::report::fault::{self, Fault};
use crate::report::pod_log;
use crate::report::prior;
use crate::report::record::{self, ExitRecord, StartRecord, StopLine};
use crate::report::termination::{self, Delivery};
use crate::store::marker;
use crate::store::quarantine::Ledger;
use std::path::Path;
use std::time::Instant;

/// poststop: what went wrong with the container's devices while it ran, once the spec (if
/// the bundle is still there, `Input::read`) named devices: the devices in use read again,
/// their faults, and the exit record. It never fails the lifecycle (the caller exits 0 on
/// any error past reading stdin) and is idempotent: an exit record already present means
/// an earlier call did the work.
pub(super) fn poststop(
    state: &State,
    spec: Option<&Spec>,
    config_path: Option<&Path>,
    started: Instant,
) -> Result<Reply> {
    let config = Config::load(config_path)?;
    end_this_run(&config, &state.id);
    let Some(Ran { rec, start }) = ran(&config, &state.id)? else {
        return Ok(Reply::default());
    };
    let ledger = Ledger::new(&config.quarantine_dir);
    let devices = record::in_use(rec.devices.iter().map(|d| &d.device), &rec.remaps);
    // NVML and the kernel log are read again only for a container that had a GPU.
    let gpu = GpuContext::for_devices(&config, &devices);
    let now = read_again(&config, &ledger, &devices, gpu.as_ref());
    let xids = gpu.as_ref().map(fault::xid_reports).unwrap_or_default();
    let faults = fault::diff(&start, &now, &xids);
    let lines: Vec<String> = faults.iter().map(Fault::line).collect();

    let termination_message =
        (!faults.is_empty()).then(|| deliver_message(spec, state, &config, &lines));
    let (stopped_unix, stopped) = clock::now();
    let exit = ExitRecord {
        container_id: state.id.clone(),
        pod: rec.pod.clone(),
        devices,
        faults,
        started: rec.time.clone(),
        started_unix: rec.time_unix,
        stopped,
        stopped_unix,
        termination_message,
        version: crate::VERSION.to_string(),
    };
    keep_exit(&config, &exit, started);
    Ok(Reply {
        exit_code: 0,
        stderr: lines,
        ..Reply::default()
    })
}

/// What ends with the run whatever else fails below: its spares go back first (a lease
/// must not outlive its container), then the runtime wrapper's marker, which is for this
/// run only (a runtime deleting without the wrapper never tells it).
fn end_this_run(config: &Config, id: &str) {
    spare::release(config, id);
    if let Err(e) = marker::remove(&config.state_dir, id) {
        log::error!("cannot remove the decided marker of {id}: {e}");
    }
}

/// A start that ran: its record and the snapshot the gate took of its devices.
struct Ran {
    rec: StartRecord,
    start: Snapshot,
}

/// The container's start, when it ran (a rejected start has no snapshot) and no earlier
/// poststop kept its exit record yet.
fn ran(config: &Config, id: &str) -> Result<Option<Ran>> {
    let Some(mut rec) = record::read_start(&config.state_dir, id)? else {
        return Ok(None);
    };
    let Some(start) = rec.snapshot.take() else {
        return Ok(None); // rejected: it never ran
    };
    if record::read_exit(&config.state_dir, id)?.is_some() {
        return Ok(None);
    }
    Ok(Some(Ran { rec, start }))
}

/// The devices' counters now.
fn read_again(
    config: &Config,
    ledger: &Ledger,
    devices: &[Device],
    gpu: Option<&GpuContext>,
) -> Vec<DeviceSnapshot> {
    devices
        .iter()
        .map(|d| counters::snapshot_of(config, ledger, d, gpu, None))
        .collect()
}

/// The exit record, what the next start's reject line tells, and the log's stop line.
fn keep_exit(config: &Config, exit: &ExitRecord, started: Instant) {
    if let Err(e) = record::write_exit(&config.state_dir, exit, config.exits_keep) {
        log::error!("cannot keep exit record: {e}");
    }
    // What the reject line of this container's next start tells (a restart).
    prior::keep(&config.state_dir, exit, config.exits_keep);
    if let Some(log_file) = &config.log_file {
        let line = StopLine {
            time: &exit.stopped,
            time_unix: exit.stopped_unix,
            stage: "poststop",
            container_id: &exit.container_id,
            pod: &exit.pod,
            faults: &exit.faults,
            elapsed_us: started.elapsed().as_micros() as u64,
            version: crate::VERSION,
        };
        if let Err(e) = record::append_log(log_file, &line) {
            log::error!("cannot append decision log: {e}");
        }
    }
}

/// The termination message, and under FallbackToLogsOnError with a file the app left
/// empty devgate's lines appended to the container's log instead, where kubelet then reads.
fn deliver_message(
    spec: Option<&Spec>,
    state: &State,
    config: &Config,
    lines: &[String],
) -> Delivery {
    let mut d = termination::deliver(spec, &state.annotations, &config.kubelet_pods_dir, lines);
    if let (true, Some(spec)) = (d.left_for_logs, spec) {
        let logs = &config.kubelet_pod_logs_dir;
        d.log = Some(pod_log::deliver(spec, &state.annotations, logs, lines));
    }
    d
}
