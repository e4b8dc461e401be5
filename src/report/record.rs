//! What devgate leaves behind for people: the decision log line (one JSON object per
//! decision, appended to log_file) and the per-container record under state_dir that
//! `devgate explain` reads.

use crate::action::remap::RemapRecord;
use crate::config::policy::Action;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::fsutil::ensure_private_dir;
use crate::model::device::Device;
use crate::oci::spec::Spec;
use crate::policy::DeviceDecision;
use crate::probe::counters::Snapshot;
use crate::report::fault::Fault;
use crate::report::termination::Delivery;
use crate::store::records::{self, Kind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Which pod a container belongs to, from the CRI annotations containerd and CRI-O set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodInfo {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub container: Option<String>,
}

impl PodInfo {
    pub fn from_annotations(spec: &Spec, state: &BTreeMap<String, String>) -> PodInfo {
        // A value the two runtimes' keys disagree on is a pod's forgery: no value.
        let get = |containerd: &str, crio: &str| {
            spec.cri_annotation(state, (containerd, crio))
                .ok()
                .flatten()
                .map(|s| s.chars().take(256).collect::<String>())
        };
        PodInfo {
            namespace: get(
                "io.kubernetes.cri.sandbox-namespace",
                "io.kubernetes.pod.namespace",
            ),
            name: get("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"),
            uid: get("io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"),
            container: get(
                "io.kubernetes.cri.container-name",
                "io.kubernetes.container.name",
            ),
        }
    }

    pub fn is_empty(&self) -> bool {
        self == &PodInfo::default()
    }
}

/// One decision: the log line's content and the record's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decision {
    pub time: String,
    pub time_unix: u64,
    pub stage: String,
    pub container_id: String,
    /// The container's pid at start, from the runtime state: tells a live container's
    /// record from a dead one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// That process's start time (/proc/PID/stat field 22): a pid the kernel has since
    /// given to another process is not the container's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_start: Option<u64>,
    #[serde(default, skip_serializing_if = "PodInfo::is_empty")]
    pub pod: PodInfo,
    pub devices: Vec<DeviceDecision>,
    /// The container's overall outcome: `allow` (every device healthy), `warn` (started
    /// although a device had findings), `remap` or `reject`.
    pub action: Action,
    /// The line printed on stderr, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub elapsed_us: u64,
    pub version: String,
    /// Counters at start, compared at poststop; absent for a rejected container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    /// Devices swapped for spares, what was edited and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remaps: Vec<RemapRecord>,
}

/// What devgate found when a container stopped: `state_dir/exits/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExitRecord {
    pub container_id: String,
    #[serde(default, skip_serializing_if = "PodInfo::is_empty")]
    pub pod: PodInfo,
    pub devices: Vec<Device>,
    pub faults: Vec<Fault>,
    pub started: String,
    pub started_unix: u64,
    pub stopped: String,
    pub stopped_unix: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_message: Option<Delivery>,
    pub version: String,
}

/// The poststop log line.
#[derive(Debug, Clone, Serialize)]
pub struct StopLine<'a> {
    pub time: &'a str,
    pub time_unix: u64,
    pub stage: &'static str,
    pub container_id: &'a str,
    #[serde(skip_serializing_if = "PodInfo::is_empty")]
    pub pod: &'a PodInfo,
    pub faults: &'a [Fault],
    pub elapsed_us: u64,
    pub version: &'static str,
}

/// Appends one line. O_APPEND keeps concurrent hooks' lines whole; the directory is
/// checked so root never appends through a path someone else planted.
pub fn append_log(log_file: &Path, entry: &impl Serialize) -> Result<()> {
    append_log_line(log_file, &crate::store::to_json_line(entry))
}

/// As `append_log`, for an entry already serialized by [`json_line`].
pub fn append_log_line(log_file: &Path, line: &[u8]) -> Result<()> {
    if let Some(dir) = log_file.parent() {
        ensure_private_dir(dir)?;
    }
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(log_file)
        .map_err(|e| Error::io("cannot open log file", log_file, e))?;
    // A log created by an older devgate (0640) or by hand is made root's alone.
    let meta = f
        .metadata()
        .map_err(|e| Error::io("cannot stat log file", log_file, e))?;
    if std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o077 != 0 {
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| Error::io("cannot chmod log file", log_file, e))?;
    }
    f.write_all(line)
        .map_err(|e| Error::io("cannot write log file", log_file, e))
}

/// A container id can be used again (`runc run demo` twice): a new start makes the exit
/// record of the id's previous run stale, and a poststop that finds one must not take it
/// for its own.
pub fn remove_exit(state_dir: &Path, id: &str) -> Result<bool> {
    records::remove(state_dir, Kind::Exit, id)
}

pub fn read_exit(state_dir: &Path, id: &str) -> Result<Option<ExitRecord>> {
    records::read(state_dir, Kind::Exit, id)
}

/// Writes the exit record, then trims the directory to the newest `keep` records.
pub fn write_exit(state_dir: &Path, rec: &ExitRecord, keep: usize) -> Result<()> {
    records::write(state_dir, Kind::Exit, &rec.container_id, rec)?;
    records::prune(state_dir, Kind::Exit, keep.max(1), |_| false);
    prune_starts(state_dir, keep);
    Ok(())
}

/// Start records of containers that are gone are trimmed to the newest `keep`, and so are
/// those of rejected starts (they never ran and never get an exit record, so a
/// crash-looping pod would otherwise leave one per container id forever). The record of
/// an admitted container that still runs is never removed: its poststop needs it.
fn prune_starts(state_dir: &Path, keep: usize) {
    records::prune(state_dir, Kind::Start, keep.max(1), |p| {
        records::read_file::<Decision>(p, Kind::Start)
            .ok()
            .flatten()
            .is_some_and(|d| d.snapshot.is_some() && d.is_alive())
    });
}

impl Decision {
    /// The container's process still exists: its pid is alive and, where the record kept
    /// its start time, is still the same process (a record written before devgate kept the
    /// start time goes by the pid alone).
    pub fn is_alive(&self) -> bool {
        self.pid
            .is_some_and(|pid| crate::store::lease::same_process(pid, self.pid_start))
    }
}

/// Every exit record, newest first, for metrics and `check`; damaged files are skipped.
pub fn list_exits(state_dir: &Path) -> Vec<ExitRecord> {
    let mut out: Vec<ExitRecord> = records::list(state_dir, Kind::Exit);
    out.sort_by_key(|r| std::cmp::Reverse(r.stopped_unix));
    out
}

/// Writes the start record, then trims start records as `write_exit` does, so rejected
/// starts (which never reach an exit record) stay bounded too.
pub fn write_record(state_dir: &Path, decision: &Decision, keep: usize) -> Result<()> {
    write_record_line(
        state_dir,
        &decision.container_id,
        &json_line(decision),
        keep,
    )
}

/// A decision as its start record and its decision-log line both hold it: serialized once
/// for the two (a record with 8 devices is some 7 KB of JSON).
pub fn json_line(decision: &Decision) -> Vec<u8> {
    crate::store::to_json_line(decision)
}

/// As `write_record`, for a decision already serialized by [`json_line`].
pub fn write_record_line(state_dir: &Path, id: &str, line: &[u8], keep: usize) -> Result<()> {
    records::write_line(state_dir, Kind::Start, id, line)?;
    prune_starts(state_dir, keep);
    Ok(())
}

pub fn read_record(state_dir: &Path, id: &str) -> Result<Option<Decision>> {
    records::read(state_dir, Kind::Start, id)
}

/// What poststop reads of a start record: the devices without their verdicts, the start
/// snapshot, the remaps, the pod and the start time. The parts it does not need are
/// skipped unparsed (no strings made, no UTF-8 checked): the verdicts were most of the
/// cost of reading a record back, on every container stop.
#[derive(Debug, Deserialize)]
// Start-up trick (docs/performance.md). Plain: read the whole `Decision`.
pub struct StartRecord {
    pub time: String,
    pub time_unix: u64,
    #[serde(default)]
    pub pod: PodInfo,
    pub devices: Vec<AssignedDevice>,
    #[serde(default)]
    pub snapshot: Option<Snapshot>,
    #[serde(default)]
    pub remaps: Vec<RemapRecord>,
}

/// One device of a [`StartRecord`], its verdicts left unread.
#[derive(Debug, Deserialize)]
pub struct AssignedDevice {
    pub device: Device,
}

pub fn read_start(state_dir: &Path, id: &str) -> Result<Option<StartRecord>> {
    records::read(state_dir, Kind::Start, id)
}

/// Records are for people after the fact; failing to write one must not change whether a
/// container starts, so errors are logged, not returned.
pub fn keep(config: &Config, decision: &Decision) {
    if let Err(e) = remove_exit(&config.state_dir, &decision.container_id) {
        log::error!("cannot remove the previous run's exit record: {e}");
    }
    // Start-up trick (docs/performance.md). Plain: serialize for each.
    let line = json_line(decision);
    let id = &decision.container_id;
    if let Err(e) = write_record_line(&config.state_dir, id, &line, config.exits_keep) {
        log::error!("cannot keep container record: {e}");
    }
    if let Some(log_file) = &config.log_file {
        if let Err(e) = append_log_line(log_file, &line) {
            log::error!("cannot append decision log: {e}");
        }
    }
}

/// The devices the container runs on: a remapped device's spare stands in for it.
pub fn in_use<'a>(
    devices: impl IntoIterator<Item = &'a Device>,
    remaps: &[RemapRecord],
) -> Vec<Device> {
    devices
        .into_iter()
        .map(|d| match remaps.iter().find(|r| r.device == d.num) {
            Some(r) => Device {
                num: r.spare,
                host_path: Some(r.spare_path.clone()),
                ..d.clone()
            },
            None => d.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_info_from_containerd_and_crio_annotations() {
        let spec = Spec::parse(
            br#"{"annotations":{"io.kubernetes.cri.sandbox-namespace":"ml","io.kubernetes.cri.sandbox-name":"train-0",
                "io.kubernetes.cri.sandbox-uid":"u-1","io.kubernetes.cri.container-name":"trainer"}}"#,
            Path::new("/c"),
        )
        .unwrap();
        let p = PodInfo::from_annotations(&spec, &BTreeMap::new());
        assert_eq!(p.namespace.as_deref(), Some("ml"));
        assert_eq!(p.container.as_deref(), Some("trainer"));
        let spec = Spec::parse(
            br#"{"annotations":{"io.kubernetes.pod.namespace":"ns","io.kubernetes.pod.name":"p",
                "io.kubernetes.pod.uid":"u","io.kubernetes.container.name":"c"}}"#,
            Path::new("/c"),
        )
        .unwrap();
        let p = PodInfo::from_annotations(&spec, &BTreeMap::new());
        assert_eq!(
            (p.name.as_deref(), p.uid.as_deref()),
            (Some("p"), Some("u"))
        );
    }

    /// CRI-O copies a pod's own annotations into every container's spec (its
    /// `SpecAddAnnotations`) and sets only its own keys after them, so under CRI-O a pod
    /// author can write containerd's keys. They must not name the pod in the record, the
    /// decision log and `devgate explain`: a pair that disagrees names no pod.
    #[test]
    fn a_pod_cannot_name_another_pod_through_the_other_runtimes_keys() {
        let spec = Spec::parse(
            br#"{"annotations":{
                "io.kubernetes.cri.sandbox-namespace":"kube-system","io.kubernetes.cri.sandbox-name":"etcd-0",
                "io.kubernetes.cri.sandbox-uid":"victim-uid","io.kubernetes.cri.container-name":"etcd",
                "io.kubernetes.pod.namespace":"team-a","io.kubernetes.pod.name":"attacker",
                "io.kubernetes.pod.uid":"u-a","io.kubernetes.container.name":"main"}}"#,
            Path::new("/c"),
        )
        .unwrap();
        let p = PodInfo::from_annotations(&spec, &BTreeMap::new());
        assert_eq!(p, PodInfo::default(), "{p:?}");
        // the same values under both keys are one pod
        let spec = Spec::parse(
            br#"{"annotations":{"io.kubernetes.cri.sandbox-name":"p","io.kubernetes.pod.name":"p"}}"#,
            Path::new("/c"),
        )
        .unwrap();
        let p = PodInfo::from_annotations(&spec, &BTreeMap::new());
        assert_eq!(p.name.as_deref(), Some("p"));
    }

    #[test]
    fn record_refuses_path_like_ids() {
        let d = crate::fsutil::tests::tempdir("devgate-rec");
        for id in ["../../etc/passwd", "a/b", ".x", ""] {
            assert!(read_record(&d, id).is_err(), "{id}");
        }
        assert!(read_record(&d, "absent").unwrap().is_none());
    }

    fn exit(id: &str, stopped_unix: u64) -> ExitRecord {
        ExitRecord {
            container_id: id.into(),
            pod: PodInfo::default(),
            devices: vec![],
            faults: vec![],
            started: String::new(),
            started_unix: 0,
            stopped: String::new(),
            stopped_unix,
            termination_message: None,
            version: String::new(),
        }
    }

    #[test]
    fn records_and_logs_are_root_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = crate::fsutil::tests::tempdir("devgate-modes");
        write_record(&d, &decision("m", None), 10).unwrap();
        write_exit(&d, &exit("m", 0), 10).unwrap();
        let log = d.join("log/devgate.log");
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        std::fs::write(&log, b"").unwrap();
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
        append_log(&log, &decision("m", None)).unwrap();
        for p in [
            Kind::Start.dir(&d).join("m.json"),
            Kind::Exit.dir(&d).join("m.json"),
            log,
        ] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", p.display());
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn exit_records_are_pruned_to_keep() {
        let d = crate::fsutil::tests::tempdir("devgate-exits");
        for i in 0..5 {
            write_exit(&d, &exit(&format!("c{i}"), i), 3).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(15));
        }
        let ids: Vec<String> = list_exits(&d).into_iter().map(|r| r.container_id).collect();
        assert_eq!(ids, ["c4", "c3", "c2"]);
        assert!(read_exit(&d, "c0").unwrap().is_none());
    }

    fn decision(id: &str, pid: Option<i32>) -> Decision {
        Decision {
            time: String::new(),
            time_unix: 0,
            stage: "prestart".into(),
            container_id: id.into(),
            pid,
            pid_start: pid.and_then(crate::store::lease::pid_start),
            pod: PodInfo::default(),
            devices: vec![],
            action: Action::Reject,
            message: None,
            elapsed_us: 0,
            version: String::new(),
            snapshot: None,
            remaps: vec![],
        }
    }

    #[test]
    fn start_records_of_gone_containers_are_pruned_live_ones_kept() {
        let d = crate::fsutil::tests::tempdir("devgate-recs");
        // oldest first: a live container (this test's own pid), then three dead ones
        let mut live = decision("live", Some(std::process::id() as i32));
        live.snapshot = Some(Snapshot {
            time_unix: 0,
            kmsg_seq: None,
            devices: vec![],
        });
        write_record(&d, &live, 10).unwrap();
        // a rejected start whose process still exists: it never ran, so it may go
        write_record(
            &d,
            &decision("rejected", Some(std::process::id() as i32)),
            10,
        )
        .unwrap();
        for i in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(15));
            write_record(&d, &decision(&format!("dead{i}"), Some(i32::MAX)), 10).unwrap();
        }
        write_exit(&d, &exit("dead2", 0), 2).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(Kind::Start.dir(&d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["dead1.json", "dead2.json", "live.json"]);
        assert!(decision("x", Some(std::process::id() as i32)).is_alive());
        assert!(!decision("x", Some(i32::MAX)).is_alive());
    }

    /// A container that died without a poststop (its runtime killed) leaves its start
    /// record; once the kernel gives its pid to another process, a record that went by the
    /// pid alone was "alive" for good: never pruned, and its devices shown as assigned by
    /// `status`, `check` and `metrics` (a device gone since then made `check` unhealthy).
    #[test]
    fn a_reused_pid_is_not_the_container() {
        let me = std::process::id() as i32;
        let mut d = decision("x", Some(me));
        assert!(d.is_alive());
        d.pid_start = d.pid_start.map(|t| t + 1);
        assert!(!d.is_alive(), "another process with the container's pid");
        d.pid_start = None;
        assert!(
            d.is_alive(),
            "a record from before pid_start goes by the pid"
        );
        assert!(!decision("x", None).is_alive());
    }
}
