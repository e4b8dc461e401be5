//! "Already decided": the runtime wrapper's note to the hooks that it gated a container
//! (and remapped it, if it had to), so that prestart neither probes again nor remaps the
//! spare it now sees. One file per container under `state_dir/decided`, root's, naming the
//! spec it decided on by SHA-256: a spec changed after the wrapper (another wrapper behind
//! it adding devices, a reused id) no longer matches, and the hook decides afresh.
//!
//! Bounded like every other record ([`write`] prunes): a container never deleted through
//! the wrapper (a crash-looping pod, `runc delete` run by hand, a killed shim) left its
//! marker for good. A marker whose container may still need it is never pruned.
//!
//! Never an annotation: CRI-O copies a pod's annotations into the spec, so anything that
//! could be read from the spec could be written by the pod's author.

use super::records::{self, Kind};
use crate::config::policy::Action;
use crate::error::Result;
use crate::model::clock;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub container_id: String,
    /// SHA-256 of the spec file's bytes as the runtime reads them, hex.
    pub spec_sha256: String,
    pub action: Action,
    pub time: String,
    pub time_unix: u64,
    /// The wrapper's process, which becomes the runtime's (exec) and runs the hooks that
    /// read the marker; with its start time, so a reused pid is not taken for it.
    #[serde(default)]
    pub pid: Option<i32>,
    #[serde(default)]
    pub pid_start: Option<u64>,
    /// The runtime's state directory for the container (`<root>/<id>`): while it exists
    /// the runtime has the container, from create until delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_state: Option<PathBuf>,
}

impl Marker {
    /// Whether the container the marker is for may still be started or running: the
    /// wrapper's process (now the runtime) is alive, or the runtime keeps state for it.
    /// A marker from before these fields were kept has neither and may go.
    pub fn is_alive(&self) -> bool {
        self.pid
            .is_some_and(|pid| super::lease::same_process(pid, self.pid_start))
            || self.runtime_state.as_deref().is_some_and(Path::exists)
    }
}

/// What the wrapper decided on for one container, to keep as its marker.
pub struct Decided<'a> {
    pub id: &'a str,
    /// The spec file's bytes as the runtime will read them.
    pub spec: &'a [u8],
    pub action: Action,
    pub runtime_state: Option<&'a Path>,
}

pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes the marker of this process's create, then trims the markers to the newest
/// `keep` (`exits_keep`), as records are, sparing every one whose container is alive.
pub fn write(state_dir: &Path, d: &Decided, keep: usize) -> Result<()> {
    let (time_unix, time) = clock::now();
    let pid = i32::try_from(std::process::id()).ok();
    let m = Marker {
        container_id: d.id.to_string(),
        spec_sha256: digest(d.spec),
        action: d.action,
        time,
        time_unix,
        pid,
        pid_start: pid.and_then(super::lease::pid_start),
        runtime_state: d.runtime_state.map(Path::to_path_buf),
    };
    records::write(state_dir, Kind::Decided, d.id, &m)?;
    records::prune(state_dir, Kind::Decided, keep.max(1), |p| {
        records::read_file::<Marker>(p, Kind::Decided)
            .ok()
            .flatten()
            .is_some_and(|m| m.is_alive())
    });
    Ok(())
}

/// The container's marker; None when there is none or it cannot be read.
pub fn read(state_dir: &Path, id: &str) -> Option<Marker> {
    records::read(state_dir, Kind::Decided, id).ok().flatten()
}

/// Whether the wrapper decided on exactly this spec for this container. Anything
/// unreadable is "no": the hook then does the whole work, which is always safe.
pub fn matches(state_dir: &Path, id: &str, spec: &[u8]) -> bool {
    read(state_dir, id).is_some_and(|m| m.container_id == id && m.spec_sha256 == digest(spec))
}

pub fn remove(state_dir: &Path, id: &str) -> Result<bool> {
    records::remove(state_dir, Kind::Decided, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_same_id_and_spec() {
        let d = crate::fsutil::tests::tempdir("devgate-marker");
        let c1 = Decided {
            id: "c1",
            spec: b"{\"a\":1}",
            action: Action::Remap,
            runtime_state: None,
        };
        write(&d, &c1, 16).unwrap();
        assert!(matches(&d, "c1", b"{\"a\":1}"));
        assert!(
            !matches(&d, "c1", b"{\"a\":2}"),
            "spec changed after the wrapper"
        );
        assert!(!matches(&d, "c2", b"{\"a\":1}"), "another container");
        assert!(!matches(&d, "../c1", b"{\"a\":1}"));
        assert_eq!(read(&d, "c1").unwrap().action, Action::Remap);
        // a damaged marker is no marker
        std::fs::write(Kind::Decided.dir(&d).join("c3.json"), b"{").unwrap();
        assert!(!matches(&d, "c3", b"{"));
        assert!(remove(&d, "c1").unwrap());
        assert!(!remove(&d, "c1").unwrap());
        assert!(!matches(&d, "c1", b"{\"a\":1}"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A marker file as an older create left it, its modification time long past.
    fn old_marker(state: &Path, id: &str, json: serde_json::Value) {
        let p = Kind::Decided.dir(state).join(format!("{id}.json"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, json.to_string()).unwrap();
        let past = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(past)
            .unwrap();
    }

    #[test]
    fn writing_prunes_the_markers_of_gone_containers_only() {
        let d = crate::fsutil::tests::tempdir("devgate-marker-prune");
        let kept = d.join("runtime-root/kept");
        std::fs::create_dir_all(&kept).unwrap();
        let m = |id: &str, pid: Option<i32>, state: Option<&Path>| {
            serde_json::json!({"container_id": id, "spec_sha256": "00", "action": "allow",
                "time": "t", "time_unix": 1, "pid": pid, "pid_start": 1, "runtime_state": state})
        };
        old_marker(&d, "dead", m("dead", Some(i32::MAX), None));
        old_marker(
            &d,
            "state-gone",
            m("state-gone", None, Some(&d.join("nope"))),
        );
        old_marker(&d, "state-kept", m("state-kept", None, Some(&kept)));
        old_marker(
            &d,
            "legacy",
            serde_json::json!({"container_id": "legacy", "spec_sha256": "00",
                "action": "allow", "time": "t", "time_unix": 1}),
        );
        let new = Decided {
            id: "new",
            spec: b"{}",
            action: Action::Allow,
            runtime_state: None,
        };
        write(&d, &new, 1).unwrap();
        let mut left = records::ids(&d, Kind::Decided);
        left.sort();
        // "new" is this process's: alive.
        assert_eq!(left, ["new", "state-kept"]);
        assert!(read(&d, "new").unwrap().is_alive());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn digest_is_sha256() {
        assert_eq!(
            digest(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
