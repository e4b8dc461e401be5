//! The cluster's device taints as the node agent (`devgate-agent`) hands them to the hook:
//! `<state_dir>/cluster-taints.json`, and the agent's own status for `devgate doctor`:
//! `<state_dir>/agent-status.json` (the contract of issue #30). The agent writes both,
//! root's, mode 0644, atomically, through [`write`] and [`write_status`]; the hook and
//! doctor read them through [`read`] and [`read_status`], which refuse a file that is not
//! root's, that others could write, that is a symlink, or that lies in a directory others
//! could write. Public, so the agent's crate shares these types and bounds.
//!
//! The taints' strings come from Kubernetes objects other people write (a DeviceTaintRule,
//! a DRA driver's ResourceSlice): they are bounded here and escaped wherever shown.

use super::json::{read_trusted_json, to_json_line};
use crate::error::{Error, Result};
use crate::fsutil::{ensure_private_dir, write_atomic_volatile};
use serde::{Deserialize, Serialize};
use std::cell::OnceCell;
use std::path::{Path, PathBuf};

/// The taints file's name under state_dir.
pub const TAINTS_FILE: &str = "cluster-taints.json";
/// The agent status file's name under state_dir.
pub const STATUS_FILE: &str = "agent-status.json";
/// The most bytes of a taints file.
pub const MAX_TAINTS_BYTES: u64 = 1 << 20;
/// The most taints in one file.
pub const MAX_TAINTS: usize = 1024;
/// The most characters of any one string in the file.
pub const MAX_STRING_CHARS: usize = 1024;
/// The most pod uids in one taint's `tolerated_by`.
pub const MAX_TOLERATED_BY: usize = 4096;
/// The most bytes of an agent status file.
pub const MAX_STATUS_BYTES: u64 = 64 << 10;
pub use crate::config::{
    CLUSTER_TAINTS_MAX_AGE_S as DEFAULT_MAX_AGE_S, CLUSTER_TAINTS_REFRESH_S as REFRESH_S,
};

/// A taint's effect, as Kubernetes spells it. Another spelling makes the file unreadable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    None,
    NoSchedule,
    NoExecute,
}

impl Effect {
    /// Whether a taint with this effect keeps a pod that does not tolerate it off the
    /// device: NoSchedule and NoExecute; None only informs.
    pub fn blocks(self) -> bool {
        self != Effect::None
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Effect::None => "None",
            Effect::NoSchedule => "NoSchedule",
            Effect::NoExecute => "NoExecute",
        }
    }
}

/// One taint on one device of a DRA driver on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterTaint {
    /// The ResourceSlice device's `uuid` attribute (`GPU-…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The device's `resource.kubernetes.io/pciBusID` attribute (`0000:3b:00.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    pub device: String,
    pub driver: String,
    pub pool: String,
    pub key: String,
    #[serde(default)]
    pub value: String,
    pub effect: Effect,
    /// `DeviceTaintRule <name>` or `ResourceSlice <name>`.
    pub source: String,
    /// The uids of the pods whose claim on this device tolerates the taint.
    #[serde(default)]
    pub tolerated_by: Vec<String>,
    /// Pods that tolerate the taint only until a time (a NoExecute toleration's
    /// `tolerationSeconds`, counted from the taint's `timeAdded`, as the eviction
    /// controller counts). A hook that does not know this field tolerates none of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerated_until: Vec<TimedToleration>,
}

/// A pod that tolerates a taint until `until_unix` (seconds since the epoch), not after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimedToleration {
    pub pod: String,
    pub until_unix: u64,
}

/// The whole taints file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterTaints {
    pub node: String,
    pub written_unix: u64,
    #[serde(default)]
    pub taints: Vec<ClusterTaint>,
    /// Set when the cluster put more taints on this node's GPUs than the file holds: the
    /// agent wrote none, and says why; the hook then knows no GPU's taints (unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflow: Option<String>,
}

impl ClusterTaints {
    /// The file's age at `now` when it is more than `max_age_s`: the agent wrote it from
    /// the cluster that long ago and has not confirmed it since (stopped, or cannot reach
    /// the API server, or cannot write the file). None while fresh; a file written in the
    /// future (the clock stepped back) is fresh.
    pub fn stale_age(&self, now: u64, max_age_s: u64) -> Option<u64> {
        let age = now.saturating_sub(self.written_unix);
        (age > max_age_s).then_some(age)
    }

    /// Whether the file keeps to its bounds: at most [`MAX_TAINTS`] taints, every string
    /// at most [`MAX_STRING_CHARS`] characters, at most [`MAX_TOLERATED_BY`] pods per taint.
    pub fn check_bounds(&self) -> std::result::Result<(), String> {
        if self.taints.len() > MAX_TAINTS {
            return Err(format!(
                "{} taints, more than {MAX_TAINTS}",
                self.taints.len()
            ));
        }
        bounded("node", &self.node)?;
        self.check_added_bounds()?;
        for (i, t) in self.taints.iter().enumerate() {
            if t.tolerated_by.len() > MAX_TOLERATED_BY {
                return Err(format!(
                    "taint {i}: {} tolerating pods, more than {MAX_TOLERATED_BY}",
                    t.tolerated_by.len()
                ));
            }
            let fields = [
                ("uuid", t.uuid.as_deref().unwrap_or("")),
                ("pci_bus_id", t.pci_bus_id.as_deref().unwrap_or("")),
                ("device", &t.device),
                ("driver", &t.driver),
                ("pool", &t.pool),
                ("key", &t.key),
                ("value", &t.value),
                ("source", &t.source),
            ];
            for (name, s) in fields {
                bounded(name, s).map_err(|e| format!("taint {i}: {e}"))?;
            }
            for s in &t.tolerated_by {
                bounded("tolerated_by", s).map_err(|e| format!("taint {i}: {e}"))?;
            }
        }
        Ok(())
    }
}

impl ClusterTaints {
    /// The bounds of `overflow` and of each taint's `tolerated_until`.
    fn check_added_bounds(&self) -> std::result::Result<(), String> {
        bounded("overflow", self.overflow.as_deref().unwrap_or(""))?;
        for (i, t) in self.taints.iter().enumerate() {
            if t.tolerated_until.len() > MAX_TOLERATED_BY {
                return Err(format!(
                    "taint {i}: {} pods tolerating for a time, more than {MAX_TOLERATED_BY}",
                    t.tolerated_until.len()
                ));
            }
            for p in &t.tolerated_until {
                bounded("tolerated_until", &p.pod).map_err(|e| format!("taint {i}: {e}"))?;
            }
        }
        Ok(())
    }
}

fn bounded(name: &str, s: &str) -> std::result::Result<(), String> {
    // bytes first: a string under the bound in bytes is under it in characters
    if s.len() > MAX_STRING_CHARS && s.chars().count() > MAX_STRING_CHARS {
        return Err(format!("{name} longer than {MAX_STRING_CHARS} characters"));
    }
    Ok(())
}

/// `<state_dir>/cluster-taints.json`.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(TAINTS_FILE)
}

/// The taints file's text as the reader takes it: JSON within the bounds. `path` names
/// the file in the error.
pub fn parse(bytes: &[u8], path: &Path) -> Result<ClusterTaints> {
    let t: ClusterTaints = serde_json::from_slice(bytes)
        .map_err(|e| Error::json("cannot parse cluster taints", Some(path), &e))?;
    checked(t, path)
}

fn checked(t: ClusterTaints, path: &Path) -> Result<ClusterTaints> {
    t.check_bounds()
        .map_err(|e| Error::invalid(format!("cluster taints {}", path.display()), e))?;
    Ok(t)
}

/// The node's cluster taints: None when there is no file (the agent does not run here),
/// an error naming the file when it is unsafe, over its bounds or damaged.
pub fn read(state_dir: &Path) -> Result<Option<ClusterTaints>> {
    let p = path(state_dir);
    match read_trusted_json::<ClusterTaints>(&p, MAX_TAINTS_BYTES, "cluster taints")? {
        None => Ok(None),
        Some(t) => checked(t, &p).map(Some),
    }
}

/// Replaces the taints file, atomically, root's, mode 0644, creating state_dir if missing
/// (checked along its whole path). A value the hook would refuse (a bound, or the file's
/// size) is refused here, and the last file stays.
pub fn write(state_dir: &Path, taints: &ClusterTaints) -> Result<()> {
    let p = path(state_dir);
    taints
        .check_bounds()
        .map_err(|e| Error::invalid(format!("cluster taints {}", p.display()), e))?;
    let text = to_json_line(taints);
    if text.len() as u64 > MAX_TAINTS_BYTES {
        return Err(Error::invalid(
            format!("cluster taints {}", p.display()),
            format!("{} bytes, more than {MAX_TAINTS_BYTES}", text.len()),
        ));
    }
    ensure_private_dir(state_dir)?;
    write_atomic_volatile(&p, &text, 0o644)
}

/// How many bytes [`write`] would write for `taints`: the agent keeps a file it builds
/// under [`MAX_TAINTS_BYTES`] by this.
pub fn file_bytes(taints: &ClusterTaints) -> usize {
    to_json_line(taints).len()
}

/// The taints file read at most once per call, on first use: a container with no NVIDIA
/// GPU never opens it, and a missing file costs one failed open.
#[derive(Debug)]
pub struct TaintsOnce {
    state_dir: PathBuf,
    read: OnceCell<Result<Option<ClusterTaints>>>,
}

impl TaintsOnce {
    pub fn new(state_dir: &Path) -> TaintsOnce {
        TaintsOnce {
            state_dir: state_dir.to_path_buf(),
            read: OnceCell::new(),
        }
    }

    /// What the file held, read on the first call.
    pub fn get(&self) -> &Result<Option<ClusterTaints>> {
        self.read.get_or_init(|| read(&self.state_dir))
    }
}

/// The agent's status, for `devgate doctor`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStatus {
    pub node: String,
    pub pid: u32,
    pub started_unix: u64,
    /// When the agent last wrote this file; doctor calls it stale past 60 s.
    pub updated_unix: u64,
    /// Whether the agent's last API calls succeeded.
    pub api_ok: bool,
    pub last_error: Option<String>,
    pub last_sync_unix: u64,
    /// The DRA API version in use (`resource.k8s.io/v1`), None when the cluster has none.
    pub dra_api: Option<String>,
    /// DeviceTaintRules the agent keeps for this node.
    pub rules: usize,
    /// Taints in the taints file.
    pub inward_taints: usize,
    /// Devices devgate judges bad.
    pub bad_devices: usize,
    /// Failed syncs with the API server since the agent started.
    #[serde(default)]
    pub api_errors: u64,
    /// Failed runs of `devgate status` since the agent started.
    #[serde(default)]
    pub status_errors: u64,
    /// The devices the agent last published as bad, (`c 195:2`, code): a restarted agent
    /// tells only real transitions as Events.
    #[serde(default)]
    pub published: Vec<(String, String)>,
    /// Why the taints file holds no taints though the cluster put some on this node's
    /// GPUs (more than the file's bounds); None when it holds them all.
    #[serde(default)]
    pub inward_overflow: Option<String>,
    /// The DeviceTaintRules the agent should keep for this node (`rules` is how many it
    /// does); more wanted than kept is a failure doctor shows.
    #[serde(default)]
    pub rules_wanted: usize,
}

/// `<state_dir>/agent-status.json`.
pub fn status_path(state_dir: &Path) -> PathBuf {
    state_dir.join(STATUS_FILE)
}

/// The agent's status; None when there is no file (no agent on this node).
pub fn read_status(state_dir: &Path) -> Result<Option<AgentStatus>> {
    read_trusted_json(&status_path(state_dir), MAX_STATUS_BYTES, "agent status")
}

/// Replaces the agent's status file, as [`write`] does the taints file.
pub fn write_status(state_dir: &Path, status: &AgentStatus) -> Result<()> {
    ensure_private_dir(state_dir)?;
    write_atomic_volatile(&status_path(state_dir), &to_json_line(status), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn taint() -> ClusterTaint {
        ClusterTaint {
            uuid: Some("GPU-0f8e1c2d-1111-2222-3333-444444444444".into()),
            pci_bus_id: Some("0000:3b:00.0".into()),
            device: "gpu-2".into(),
            driver: "gpu.nvidia.com".into(),
            pool: "node-1".into(),
            key: "example.com/maintenance".into(),
            value: "swap".into(),
            effect: Effect::NoSchedule,
            source: "DeviceTaintRule example-rule".into(),
            tolerated_by: vec!["pod-a".into()],
            tolerated_until: vec![],
        }
    }

    fn taints(n: usize) -> ClusterTaints {
        ClusterTaints {
            node: "node-1".into(),
            written_unix: 1764930000,
            taints: vec![taint(); n],
            overflow: None,
        }
    }

    fn err_of(state: &Path) -> String {
        read(state).expect_err("refused").to_string()
    }

    #[test]
    fn a_file_the_hook_would_refuse_for_its_size_is_not_written() {
        let d = crate::fsutil::tests::tempdir("cluster-big");
        let state = d.join("state");
        write(&state, &taints(1)).unwrap();
        let mut big = taints(MAX_TAINTS);
        for t in &mut big.taints {
            t.source = "s".repeat(MAX_STRING_CHARS);
        }
        assert!(
            big.check_bounds().is_ok(),
            "each bound holds, the sum does not"
        );
        let e = write(&state, &big)
            .expect_err("over the byte bound")
            .to_string();
        assert!(
            e.contains("cluster-taints.json") && e.contains("bytes"),
            "{e}"
        );
        assert_eq!(
            read(&state).unwrap(),
            Some(taints(1)),
            "the last good file stays"
        );
    }

    #[test]
    fn written_by_the_agent_read_by_the_hook() {
        let d = crate::fsutil::tests::tempdir("cluster-rt");
        let state = d.join("state");
        assert_eq!(read(&state).unwrap(), None, "no agent: no taints");
        write(&state, &taints(2)).unwrap();
        assert_eq!(read(&state).unwrap(), Some(taints(2)));
        let mode = fs::metadata(path(&state)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        // The contract's example, with an empty value and no uuid, reads.
        let text = r#"{"node":"node-1","written_unix":1764930000,"taints":[
            {"pci_bus_id":"0000:3b:00.0","device":"gpu-2","driver":"gpu.nvidia.com",
             "pool":"node-1","key":"example.com/maintenance","value":"","effect":"None",
             "source":"ResourceSlice s1","future_field":1}]}"#;
        fs::write(path(&state), text).unwrap();
        let t = read(&state).unwrap().unwrap();
        assert_eq!(t.taints[0].effect, Effect::None);
        assert!(t.taints[0].uuid.is_none() && t.taints[0].tolerated_by.is_empty());
        // Once per call: a later change is not seen by the same reader.
        let once = TaintsOnce::new(&state);
        assert!(once.get().as_ref().unwrap().is_some());
        fs::remove_file(path(&state)).unwrap();
        assert!(once.get().as_ref().unwrap().is_some());
        assert!(TaintsOnce::new(&state).get().as_ref().unwrap().is_none());
    }

    #[test]
    fn damaged_and_unknown_effects_are_refused_naming_the_file() {
        let d = crate::fsutil::tests::tempdir("cluster-damaged");
        let p = path(&d);
        for text in [
            "{ damaged",
            r#"{"node":"n","written_unix":1,"taints":[{"device":"d","driver":"r","pool":"p","key":"k","effect":"PreferNoSchedule","source":"s"}]}"#,
            r#"{"node":"n","written_unix":1,"taints":[{"device":"d","driver":"r","pool":"p","key":"k","effect":"noschedule","source":"s"}]}"#,
            r#"{"node":"n","written_unix":-1}"#,
            "",
        ] {
            fs::write(&p, text).unwrap();
            let e = err_of(&d);
            assert!(e.contains(&p.display().to_string()), "{text}: {e}");
        }
    }

    #[test]
    fn every_bound_holds() {
        let d = crate::fsutil::tests::tempdir("cluster-bounds");
        let p = path(&d);
        let put = |t: &ClusterTaints| fs::write(&p, serde_json::to_vec(t).unwrap()).unwrap();
        put(&taints(MAX_TAINTS));
        assert_eq!(read(&d).unwrap().unwrap().taints.len(), MAX_TAINTS);
        put(&taints(MAX_TAINTS + 1));
        assert!(err_of(&d).contains("1025 taints, more than 1024"));
        let mut t = taints(1);
        t.taints[0].key = "é".repeat(MAX_STRING_CHARS);
        put(&t);
        assert!(read(&d).is_ok(), "1024 characters of two bytes each");
        t.taints[0].key.push('x');
        put(&t);
        assert!(err_of(&d).contains("taint 0: key longer than 1024 characters"));
        let mut t = taints(1);
        t.taints[0].tolerated_by = vec!["u".into(); MAX_TOLERATED_BY + 1];
        put(&t);
        assert!(err_of(&d).contains("4097 tolerating pods"));
        t.taints[0].tolerated_by = vec!["u".repeat(MAX_STRING_CHARS + 1)];
        put(&t);
        assert!(err_of(&d).contains("tolerated_by longer than"));
        let mut t = taints(1);
        t.node = "n".repeat(MAX_STRING_CHARS + 1);
        assert!(
            write(&d, &t).is_err(),
            "the writer keeps the reader's bounds"
        );
        fs::write(&p, vec![b' '; MAX_TAINTS_BYTES as usize + 1]).unwrap();
        assert!(err_of(&d).contains("exceeds 1 MiB"), "{}", err_of(&d));
    }

    /// Only a file root wrote, in a directory only root can write, is believed: anyone
    /// else could otherwise taint every GPU, or clear a real taint.
    #[test]
    fn a_file_or_directory_others_could_write_is_refused() {
        let d = crate::fsutil::tests::tempdir("cluster-unsafe");
        let state = d.join("state");
        write(&state, &taints(1)).unwrap();
        let p = path(&state);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o664)).unwrap();
        assert!(err_of(&state).contains("is writable by group or others (mode 664)"));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(&state, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(err_of(&state).contains("writable by group or others (mode 777)"));
        fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
        // a symlink to a good file is not followed
        fs::rename(&p, d.join("elsewhere.json")).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere.json"), &p).unwrap();
        let e = err_of(&state);
        assert!(e.contains("cannot open cluster taints"), "{e}");
        fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(err_of(&state).contains("not a regular file"));
        fs::remove_file(&p).unwrap();
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (CI runs as root) to own a file as another uid");
            return;
        }
        write(&state, &taints(1)).unwrap();
        std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
        assert!(err_of(&state).contains("is owned by uid 65534, not root"));
    }

    #[test]
    fn agent_status_round_trips_and_is_absent_without_an_agent() {
        let d = crate::fsutil::tests::tempdir("agent-status");
        assert_eq!(read_status(&d).unwrap(), None);
        let s = AgentStatus {
            node: "node-1".into(),
            pid: 123,
            api_ok: false,
            last_error: Some("forbidden".into()),
            dra_api: Some("resource.k8s.io/v1".into()),
            rules: 1,
            ..AgentStatus::default()
        };
        write_status(&d, &s).unwrap();
        assert_eq!(read_status(&d).unwrap(), Some(s));
        let text = r#"{"node":"n","pid":1,"started_unix":1,"updated_unix":2,"api_ok":true,
            "last_error":null,"last_sync_unix":2,"dra_api":null,"rules":0,"inward_taints":0,
            "bad_devices":0}"#;
        fs::write(status_path(&d), text).unwrap();
        assert!(read_status(&d).unwrap().unwrap().api_ok);
    }
}
