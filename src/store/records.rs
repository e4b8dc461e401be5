//! Per-container records under state_dir: `containers/<id>.json` written at start,
//! `exits/<id>.json` at stop, and `decided/<id>.json`, the runtime wrapper's marker. The
//! file layout lives here; what a record holds is `report::record`'s (the marker's is
//! `store::marker`'s).

use super::{read_json, write_json_volatile};
use crate::error::{Error, Result};
use crate::fsutil::{ensure_private_dir, is_safe_component, remove_volatile};
use crate::model::text::one_line;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};

const MAX_RECORD_BYTES: u64 = 4 << 20;

/// Which of a container's two records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// What devgate decided at start: `containers/<id>.json`.
    Start,
    /// What devgate found at stop: `exits/<id>.json`.
    Exit,
    /// The runtime wrapper's "already decided" marker: `decided/<id>.json`.
    Decided,
}

impl Kind {
    pub(crate) fn dir(self, state_dir: &Path) -> PathBuf {
        match self {
            Kind::Start => state_dir.join("containers"),
            Kind::Exit => state_dir.join("exits"),
            Kind::Decided => state_dir.join("decided"),
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Start => "container record",
            Kind::Exit => "exit record",
            Kind::Decided => "decided marker",
        }
    }
}

fn checked_id(id: &str) -> Result<&str> {
    if !is_safe_component(id) {
        return Err(Error::invalid(
            "container id",
            format!(
                "{:?} is not usable as a file name",
                one_line(&id.chars().take(80).collect::<String>())
            ),
        ));
    }
    Ok(id)
}

fn path(state_dir: &Path, kind: Kind, id: &str) -> Result<PathBuf> {
    Ok(kind
        .dir(state_dir)
        .join(format!("{}.json", checked_id(id)?)))
}

pub(crate) fn read<T: DeserializeOwned>(
    state_dir: &Path,
    kind: Kind,
    id: &str,
) -> Result<Option<T>> {
    read_json(&path(state_dir, kind, id)?, MAX_RECORD_BYTES, kind.what())
}

pub(crate) fn read_file<T: DeserializeOwned>(path: &Path, kind: Kind) -> Result<Option<T>> {
    read_json(path, MAX_RECORD_BYTES, kind.what())
}

pub(crate) fn write(state_dir: &Path, kind: Kind, id: &str, record: &impl Serialize) -> Result<()> {
    let path = path(state_dir, kind, id)?;
    ensure_private_dir(&kind.dir(state_dir))?;
    write_json_volatile(&path, record)
}

/// As `write`, for a record already serialized by `store::to_json_line`.
pub(crate) fn write_line(state_dir: &Path, kind: Kind, id: &str, line: &[u8]) -> Result<()> {
    let path = path(state_dir, kind, id)?;
    ensure_private_dir(&kind.dir(state_dir))?;
    crate::fsutil::write_atomic_volatile(&path, line, 0o600)
}

pub(crate) fn remove(state_dir: &Path, kind: Kind, id: &str) -> Result<bool> {
    remove_volatile(&path(state_dir, kind, id)?)
}

/// Removes the oldest records (by modification time) beyond `keep`, except those `spare`
/// keeps.
pub(crate) fn prune(state_dir: &Path, kind: Kind, keep: usize, spare: impl Fn(&Path) -> bool) {
    let Ok(rd) = std::fs::read_dir(kind.dir(state_dir)) else {
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

/// The container ids that have a record of `kind`.
pub(crate) fn ids(state_dir: &Path, kind: Kind) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(kind.dir(state_dir)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let id = name.to_str()?.strip_suffix(".json")?;
            (!id.starts_with('.')).then(|| id.to_string())
        })
        .collect()
}

/// Every readable record of `kind`; damaged files and temp files are skipped.
pub(crate) fn list<T: DeserializeOwned>(state_dir: &Path, kind: Kind) -> Vec<T> {
    let Ok(rd) = std::fs::read_dir(kind.dir(state_dir)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| read_file(&e.path(), kind).ok().flatten())
        .collect()
}
