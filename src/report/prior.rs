//! A pod's container restarted after a device fault: kubelet starts it again about 1 s
//! after the exit, prestart rejects it, and from then on the pod shows only the reject
//! reason. So poststop keeps, per pod uid and container name, the last run that ended with
//! a fault, and the reject line of a later start of that container says which and when.
//!
//! One small file per pod container (`state_dir/last-faults/<pod uid>_<name>.json`):
//! found by its name, without reading the exit records, and pruned like them. The uid and
//! name are the start record's, from the runtime's CRI annotations (a pair the two
//! runtimes' keys disagree on names no pod), so a pod cannot write another's.

use super::record::{ExitRecord, PodInfo};
use crate::fsutil::is_safe_component;
use crate::model::text::one_line;
use crate::store::records::{self, Kind};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The last run of a pod's container that ended with a device fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorFault {
    pub container_id: String,
    pub stopped: String,
    pub stopped_unix: u64,
    /// The first fault's line, and how many more there were.
    pub fault: String,
    #[serde(default)]
    pub more: usize,
}

/// The record's name: `<uid>_<name>`, when both are plain components without `_` (a pod
/// uid and a container name, a DNS label, never hold one), so no two pods share a name.
fn key(pod: &PodInfo) -> Option<String> {
    let plain = |s: &str| is_safe_component(s) && !s.contains('_') && s.len() <= 120;
    let (uid, name) = (pod.uid.as_deref()?, pod.container.as_deref()?);
    (plain(uid) && plain(name)).then(|| format!("{uid}_{name}"))
}

/// After a run: keeps its first fault for the next start, or, for a run without one,
/// forgets the older run's (it is no longer the previous run).
pub fn keep(state_dir: &Path, exit: &ExitRecord, keep: usize) {
    let Some(key) = key(&exit.pod) else { return };
    let Some(first) = exit.faults.first() else {
        if let Err(e) = records::remove(state_dir, Kind::LastFault, &key) {
            log::error!("cannot remove the last-fault record {key}: {e}");
        }
        return;
    };
    let rec = PriorFault {
        container_id: exit.container_id.clone(),
        stopped: exit.stopped.clone(),
        stopped_unix: exit.stopped_unix,
        fault: first.line(),
        more: exit.faults.len() - 1,
    };
    if let Err(e) = records::write(state_dir, Kind::LastFault, &key, &rec) {
        log::error!("cannot keep the last-fault record {key}: {e}");
        return;
    }
    records::prune(state_dir, Kind::LastFault, keep.max(1), |_| false);
}

pub fn read(state_dir: &Path, pod: &PodInfo) -> Option<PriorFault> {
    records::read(state_dir, Kind::LastFault, &key(pod)?)
        .map_err(|e| log::error!("cannot read the last-fault record: {e}"))
        .ok()
        .flatten()
}

/// The reject line with the previous run's fault after it: today's line stays first, as
/// kubelet users and scripts read it.
pub fn with_prior(reject: &str, prior: &PriorFault) -> String {
    let id: String = prior.container_id.chars().take(12).collect();
    let fault = prior
        .fault
        .strip_prefix("devgate: ")
        .unwrap_or(&prior.fault);
    let more = match prior.more {
        0 => String::new(),
        n => format!(" (and {n} more)"),
    };
    one_line(&format!(
        "{reject}; the previous run of this container ({id}) ended {} with {fault}{more}",
        prior.stopped
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fault::Fault;

    fn exit(uid: &str, name: &str, faults: Vec<Fault>) -> ExitRecord {
        serde_json::from_value(serde_json::json!({
            "container_id": "0123456789abcdef0123", "pod": {"uid": uid, "container": name},
            "devices": [], "faults": faults, "started": "t0", "started_unix": 1,
            "stopped": "2026-12-04T02:40:00Z", "stopped_unix": 2, "version": "x"
        }))
        .unwrap()
    }

    fn fault() -> Fault {
        serde_json::from_value(serde_json::json!({
            "code": "DeviceFault/Cordoned", "device": "/dev/zero", "type": "c", "major": 1, "minor": 5,
            "message": "cordoned by operator during the run: \"x\""
        }))
        .unwrap()
    }

    #[test]
    fn a_faulted_run_is_named_by_the_next_reject_until_a_clean_run() {
        let d = crate::fsutil::tests::tempdir("prior");
        let e = exit("u1", "app", vec![fault(), fault()]);
        keep(&d, &e, 10);
        let p = read(&d, &e.pod).expect("kept");
        assert_eq!(
            with_prior("devgate: rejected /dev/zero (1:5): bad; policy reject", &p),
            "devgate: rejected /dev/zero (1:5): bad; policy reject; the previous run of this \
             container (0123456789ab) ended 2026-12-04T02:40:00Z with DeviceFault/Cordoned on \
             /dev/zero (1:5): cordoned by operator during the run: \"x\" (and 1 more)"
        );
        // another container of the pod, and the same name in another pod, have none
        assert!(read(&d, &exit("u1", "other", vec![]).pod).is_none());
        assert!(read(&d, &exit("u2", "app", vec![]).pod).is_none());
        keep(&d, &exit("u1", "app", vec![]), 10);
        assert!(
            read(&d, &e.pod).is_none(),
            "a clean run is the previous run now"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn names_that_could_collide_or_escape_keep_nothing() {
        let d = crate::fsutil::tests::tempdir("prior-names");
        for (uid, name) in [("u_1", "app"), ("u1", "a_b"), ("..", "app"), ("u1", "a/b")] {
            let e = exit(uid, name, vec![fault()]);
            keep(&d, &e, 10);
            assert!(read(&d, &e.pod).is_none(), "{uid} {name}");
        }
        assert!(!Kind::LastFault.dir(&d).exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
