//! "Already decided": the runtime wrapper's note to the hooks that it gated a container
//! (and remapped it, if it had to), so that prestart neither probes again nor remaps the
//! spare it now sees. One file per container under `state_dir/decided`, root's, naming the
//! spec it decided on by SHA-256: a spec changed after the wrapper (another wrapper behind
//! it adding devices, a reused id) no longer matches, and the hook decides afresh.
//!
//! Never an annotation: CRI-O copies a pod's annotations into the spec, so anything that
//! could be read from the spec could be written by the pod's author.

use crate::error::{Error, Result};
use crate::fsutil::{ensure_private_dir, is_safe_component, read_regular_file, write_atomic};
use crate::ledger::lease::Leases;
use crate::record::{self, ContainerAction};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const MAX_MARKER_BYTES: u64 = 64 << 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub container_id: String,
    /// SHA-256 of the spec file's bytes as the runtime reads them, hex.
    pub spec_sha256: String,
    pub action: ContainerAction,
    pub time: String,
    pub time_unix: u64,
}

pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("decided")
}

fn path(state_dir: &Path, id: &str) -> Result<PathBuf> {
    if !is_safe_component(id) {
        return Err(Error::invalid(
            "container id",
            format!(
                "{:?} is not usable as a file name",
                crate::policy::one_line(id)
            ),
        ));
    }
    Ok(dir(state_dir).join(format!("{id}.json")))
}

pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn write(state_dir: &Path, id: &str, spec: &[u8], action: ContainerAction) -> Result<()> {
    let p = path(state_dir, id)?;
    ensure_private_dir(&dir(state_dir))?;
    let (time_unix, time) = crate::ledger::now();
    let m = Marker {
        container_id: id.to_string(),
        spec_sha256: digest(spec),
        action,
        time,
        time_unix,
    };
    let mut json = serde_json::to_vec(&m).expect("marker serializes");
    json.push(b'\n');
    write_atomic(&p, &json, 0o644)
}

pub fn read(state_dir: &Path, id: &str) -> Option<Marker> {
    let bytes = read_regular_file(&path(state_dir, id).ok()?, MAX_MARKER_BYTES, "marker").ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Whether the wrapper decided on exactly this spec for this container. Anything
/// unreadable is "no": the hook then does the whole work, which is always safe.
pub fn matches(state_dir: &Path, id: &str, spec: &[u8]) -> bool {
    read(state_dir, id).is_some_and(|m| m.container_id == id && m.spec_sha256 == digest(spec))
}

pub fn remove(state_dir: &Path, id: &str) -> Result<bool> {
    crate::fsutil::remove_durable(&path(state_dir, id)?)
}

/// At the hook, once the container has a process: the wrapper's record and leases name
/// none yet (the record) or the runtime's (the leases), so they are pointed at it; the
/// record's pid is how `status` and pruning tell a live container's record.
pub fn adopt(state_dir: &Path, id: &str, pid: Option<i32>) {
    let Some(pid) = pid else { return };
    match record::read_record(state_dir, id) {
        Ok(Some(mut rec)) if rec.pid.is_none() => {
            rec.pid = Some(pid);
            if let Err(e) = record::write_record(state_dir, &rec) {
                log::error!("cannot keep container record: {e}");
            }
        }
        Ok(_) => {}
        Err(e) => log::error!("cannot read container record: {e}"),
    }
    let leases = Leases::new(state_dir);
    if !leases.dir.exists() {
        return;
    }
    if let Err(e) = leases.adopt(id, pid) {
        log::error!("cannot point the spares of {id} at pid {pid}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_same_id_and_spec() {
        let d = std::env::temp_dir().join(format!("devgate-marker-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        write(&d, "c1", b"{\"a\":1}", ContainerAction::Remap).unwrap();
        assert!(matches(&d, "c1", b"{\"a\":1}"));
        assert!(
            !matches(&d, "c1", b"{\"a\":2}"),
            "spec changed after the wrapper"
        );
        assert!(!matches(&d, "c2", b"{\"a\":1}"), "another container");
        assert!(!matches(&d, "../c1", b"{\"a\":1}"));
        assert_eq!(read(&d, "c1").unwrap().action, ContainerAction::Remap);
        // a damaged marker is no marker
        std::fs::write(dir(&d).join("c3.json"), b"{").unwrap();
        assert!(!matches(&d, "c3", b"{"));
        assert!(remove(&d, "c1").unwrap());
        assert!(!remove(&d, "c1").unwrap());
        assert!(!matches(&d, "c1", b"{\"a\":1}"));
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
