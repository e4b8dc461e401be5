//! What devgate leaves behind for people: the decision log line (one JSON object per
//! decision, appended to log_file) and the per-container record under state_dir that
//! `devgate explain` reads.

use crate::error::{Error, Result};
use crate::fsutil::{self, ensure_private_dir, is_safe_component, read_regular_file};
use crate::policy::DeviceDecision;
use crate::spec::Spec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

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
        let get = |containerd: &str, crio: &str| {
            spec.annotation(state, containerd)
                .or_else(|| spec.annotation(state, crio))
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

/// The container's overall outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerAction {
    /// Every device healthy.
    Allow,
    /// Started although a device had findings (policy warn/allow, on_unknown allow).
    Warn,
    Remap,
    Reject,
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
    #[serde(default, skip_serializing_if = "PodInfo::is_empty")]
    pub pod: PodInfo,
    pub devices: Vec<DeviceDecision>,
    pub action: ContainerAction,
    /// The line printed on stderr, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub elapsed_us: u64,
    pub version: String,
    /// Counters at start, compared at poststop; absent for a rejected container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<crate::fault::Snapshot>,
    /// Devices swapped for spares, what was edited and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remaps: Vec<crate::remap::RemapRecord>,
}

/// What devgate found when a container stopped: `state_dir/exits/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExitRecord {
    pub container_id: String,
    #[serde(default, skip_serializing_if = "PodInfo::is_empty")]
    pub pod: PodInfo,
    pub devices: Vec<crate::device::Device>,
    pub faults: Vec<crate::fault::Fault>,
    pub started: String,
    pub started_unix: u64,
    pub stopped: String,
    pub stopped_unix: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_message: Option<crate::termination::Outcome>,
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
    pub faults: &'a [crate::fault::Fault],
    pub elapsed_us: u64,
    pub version: &'static str,
}

/// Appends one line. O_APPEND keeps concurrent hooks' lines whole; the directory is
/// checked so root never appends through a path someone else planted.
pub fn append_log(log_file: &Path, entry: &impl Serialize) -> Result<()> {
    if let Some(dir) = log_file.parent() {
        ensure_private_dir(dir)?;
    }
    let mut line = serde_json::to_vec(entry).expect("log entry serializes");
    line.push(b'\n');
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(log_file)
        .map_err(|e| Error::io("cannot open log file", log_file, e))?;
    f.write_all(&line)
        .map_err(|e| Error::io("cannot write log file", log_file, e))
}

pub fn containers_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("containers")
}

pub fn exits_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("exits")
}

fn checked_id(id: &str) -> Result<&str> {
    if !is_safe_component(id) {
        return Err(Error::invalid(
            "container id",
            format!("{:?} is not usable as a file name", one_line_trunc(id)),
        ));
    }
    Ok(id)
}

fn record_path(state_dir: &Path, id: &str) -> Result<PathBuf> {
    Ok(containers_dir(state_dir).join(format!("{}.json", checked_id(id)?)))
}

fn exit_path(state_dir: &Path, id: &str) -> Result<PathBuf> {
    Ok(exits_dir(state_dir).join(format!("{}.json", checked_id(id)?)))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<Option<T>> {
    match read_regular_file(path, 4 << 20, what) {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::json(format!("cannot parse {what}"), Some(path), &e)),
    }
}

/// A container id can be used again (`runc run demo` twice): a new start makes the exit
/// record of the id's previous run stale, and a poststop that finds one must not take it
/// for its own.
pub fn remove_exit(state_dir: &Path, id: &str) -> Result<bool> {
    fsutil::remove_durable(&exit_path(state_dir, id)?)
}

pub fn read_exit(state_dir: &Path, id: &str) -> Result<Option<ExitRecord>> {
    read_json(&exit_path(state_dir, id)?, "exit record")
}

/// Writes the exit record, then trims the directory to the newest `keep` records.
pub fn write_exit(state_dir: &Path, rec: &ExitRecord, keep: usize) -> Result<()> {
    let path = exit_path(state_dir, &rec.container_id)?;
    ensure_private_dir(&exits_dir(state_dir))?;
    let mut json = serde_json::to_vec_pretty(rec).expect("exit record serializes");
    json.push(b'\n');
    fsutil::write_atomic(&path, &json, 0o644)?;
    prune(&exits_dir(state_dir), keep.max(1), |_| false);
    // Start records of containers that are gone (rejected ones never get an exit record)
    // are trimmed alike; a live container's record is never removed, its poststop needs it.
    prune(&containers_dir(state_dir), keep.max(1), |p| {
        read_json::<Decision>(p, "container record")
            .ok()
            .flatten()
            .is_some_and(|d| d.is_alive())
    });
    Ok(())
}

impl Decision {
    /// The container's process still exists (as far as a pid can tell).
    pub fn is_alive(&self) -> bool {
        self.pid
            .is_some_and(|p| Path::new(&format!("/proc/{p}")).exists())
    }
}

/// Removes the oldest files (by modification time) beyond `keep`, except those `spare` keeps.
fn prune(dir: &Path, keep: usize, spare: impl Fn(&Path) -> bool) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = rd
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.ends_with(".json") && !n.starts_with('.')
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() <= keep {
        return;
    }
    files.sort();
    for (_, p) in &files[..files.len() - keep] {
        if !spare(p) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Every exit record, newest first, for metrics and `check`; damaged files are skipped.
pub fn list_exits(state_dir: &Path) -> Vec<ExitRecord> {
    let Ok(rd) = std::fs::read_dir(exits_dir(state_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<ExitRecord> = rd
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            read_json::<ExitRecord>(&e.path(), "exit record")
                .ok()
                .flatten()
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.stopped_unix));
    out
}

pub fn write_record(state_dir: &Path, decision: &Decision) -> Result<()> {
    let path = record_path(state_dir, &decision.container_id)?;
    ensure_private_dir(&containers_dir(state_dir))?;
    let mut json = serde_json::to_vec_pretty(decision).expect("decision serializes");
    json.push(b'\n');
    fsutil::write_atomic(&path, &json, 0o644)
}

pub fn read_record(state_dir: &Path, id: &str) -> Result<Option<Decision>> {
    read_json(&record_path(state_dir, id)?, "container record")
}

fn one_line_trunc(s: &str) -> String {
    crate::policy::one_line(&s.chars().take(80).collect::<String>())
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

    #[test]
    fn record_refuses_path_like_ids() {
        let d = std::env::temp_dir().join(format!("devgate-rec-{}", std::process::id()));
        for id in ["../../etc/passwd", "a/b", ".x", ""] {
            assert!(record_path(&d, id).is_err(), "{id}");
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
    fn exit_records_are_pruned_to_keep() {
        let d = std::env::temp_dir().join(format!("devgate-exits-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
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
            pod: PodInfo::default(),
            devices: vec![],
            action: ContainerAction::Reject,
            message: None,
            elapsed_us: 0,
            version: String::new(),
            snapshot: None,
            remaps: vec![],
        }
    }

    #[test]
    fn start_records_of_gone_containers_are_pruned_live_ones_kept() {
        let d = std::env::temp_dir().join(format!("devgate-recs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        // oldest first: a live container (this test's own pid), then three dead ones
        write_record(&d, &decision("live", Some(std::process::id() as i32))).unwrap();
        for i in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(15));
            write_record(&d, &decision(&format!("dead{i}"), Some(i32::MAX))).unwrap();
        }
        write_exit(&d, &exit("dead2", 0), 2).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(containers_dir(&d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["dead1.json", "dead2.json", "live.json"]);
        assert!(decision("x", Some(std::process::id() as i32)).is_alive());
        assert!(!decision("x", Some(i32::MAX)).is_alive());
    }
}
