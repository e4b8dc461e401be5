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
    #[serde(default, skip_serializing_if = "PodInfo::is_empty")]
    pub pod: PodInfo,
    pub devices: Vec<DeviceDecision>,
    pub action: ContainerAction,
    /// The line printed on stderr, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub elapsed_us: u64,
    pub version: String,
    /// Devices swapped for spares, what was edited and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remaps: Vec<crate::remap::RemapRecord>,
}

/// Appends one line. O_APPEND keeps concurrent hooks' lines whole; the directory is
/// checked so root never appends through a path someone else planted.
pub fn append_log(log_file: &Path, decision: &Decision) -> Result<()> {
    if let Some(dir) = log_file.parent() {
        ensure_private_dir(dir)?;
    }
    let mut line = serde_json::to_vec(decision).expect("decision serializes");
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

fn record_path(state_dir: &Path, id: &str) -> Result<PathBuf> {
    if !is_safe_component(id) {
        return Err(Error::invalid(
            "container id",
            format!("{:?} is not usable as a file name", one_line_trunc(id)),
        ));
    }
    Ok(containers_dir(state_dir).join(format!("{id}.json")))
}

pub fn write_record(state_dir: &Path, decision: &Decision) -> Result<()> {
    let path = record_path(state_dir, &decision.container_id)?;
    ensure_private_dir(&containers_dir(state_dir))?;
    let mut json = serde_json::to_vec_pretty(decision).expect("decision serializes");
    json.push(b'\n');
    fsutil::write_atomic(&path, &json, 0o644)
}

pub fn read_record(state_dir: &Path, id: &str) -> Result<Option<Decision>> {
    let path = record_path(state_dir, id)?;
    match read_regular_file(&path, 4 << 20, "container record") {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::json("cannot parse container record", Some(&path), &e)),
    }
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
}
