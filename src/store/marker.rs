//! "Already decided": the runtime wrapper's note to the hooks that it gated a container
//! (and remapped it, if it had to), so that prestart neither probes again nor remaps the
//! spare it now sees. One file per container under `state_dir/decided`, root's, naming the
//! spec it decided on by SHA-256: a spec changed after the wrapper (another wrapper behind
//! it adding devices, a reused id) no longer matches, and the hook decides afresh.
//!
//! Never an annotation: CRI-O copies a pod's annotations into the spec, so anything that
//! could be read from the spec could be written by the pod's author.

use super::records::{self, Kind};
use crate::config::policy::Action;
use crate::error::Result;
use crate::model::clock;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub container_id: String,
    /// SHA-256 of the spec file's bytes as the runtime reads them, hex.
    pub spec_sha256: String,
    pub action: Action,
    pub time: String,
    pub time_unix: u64,
}

pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn write(state_dir: &Path, id: &str, spec: &[u8], action: Action) -> Result<()> {
    let (time_unix, time) = clock::now();
    let m = Marker {
        container_id: id.to_string(),
        spec_sha256: digest(spec),
        action,
        time,
        time_unix,
    };
    records::write(state_dir, Kind::Decided, id, &m)
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
        write(&d, "c1", b"{\"a\":1}", Action::Remap).unwrap();
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

    #[test]
    fn digest_is_sha256() {
        assert_eq!(
            digest(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
