//! The one JSON file format every ledger and record shares: bounded reads, atomic
//! writes, and the per-device file names. A leaf, so the stores' modules import it and
//! not the `store` module that declares them.

use crate::error::{Error, Result};
use crate::fsutil::{read_regular_file, read_trusted_file, write_atomic, write_atomic_volatile};
use crate::model::device::{DevNum, DevType};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io;
use std::path::Path;

/// Reads one JSON file of at most `limit` bytes: None when there is no such file, an
/// error naming `what` and the file when it cannot be read or parsed.
pub(crate) fn read_json<T: DeserializeOwned>(
    path: &Path,
    limit: u64,
    what: &str,
) -> Result<Option<T>> {
    parse_read(read_regular_file(path, limit, what), path, what)
}

/// [`read_json`] for a file another root program writes for devgate to act on: root's,
/// writable by nobody else, in a safe directory (`fsutil::read_trusted_file`).
pub(crate) fn read_trusted_json<T: DeserializeOwned>(
    path: &Path,
    limit: u64,
    what: &str,
) -> Result<Option<T>> {
    parse_read(read_trusted_file(path, limit, what), path, what)
}

/// A file's bytes as JSON; a missing file is None.
fn parse_read<T: DeserializeOwned>(
    read: Result<Vec<u8>>,
    path: &Path,
    what: &str,
) -> Result<Option<T>> {
    match read {
        Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::json(format!("cannot parse {what}"), Some(path), &e)),
    }
}

/// Replaces `path` with `value` as compact JSON (one line; `jq` pretty-prints it),
/// atomically and durably, readable by root only (mode 0600): for the operator's quarantine
/// ledger on disk; records hold pod names, paths and reasons other local users have no
/// need for. The caller has checked the directory.
pub(crate) fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    write_atomic(path, &to_json_line(value), 0o600)
}

/// As `write_json` but without fsync: leases and records live in state_dir on tmpfs
/// (/run), where fsync does nothing and a reboot clears them anyway.
pub(crate) fn write_json_volatile(path: &Path, value: &impl Serialize) -> Result<()> {
    write_atomic_volatile(path, &to_json_line(value), 0o600)
}

/// One value as devgate writes it everywhere: compact, shown-safe JSON and a newline.
pub(crate) fn to_json_line(value: &impl Serialize) -> Vec<u8> {
    let mut json = crate::model::text::json_safe(
        serde_json::to_vec(value).expect("devgate's own types serialize"),
    );
    json.push(b'\n');
    json
}

/// Both ledgers keep one file per device, named by type and major:minor: `c-195-1.json`.
pub fn file_name(num: DevNum) -> String {
    format!("{}-{}-{}.json", num.typ.letter(), num.major, num.minor)
}

/// The device a ledger file is for; None for anything else in the directory (temp files
/// start with '.', notes an operator left).
pub fn num_from_file_name(name: &str) -> Option<DevNum> {
    let stem = name.strip_suffix(".json")?;
    let mut it = stem.splitn(3, '-');
    let typ = match it.next()? {
        "c" => DevType::Char,
        "b" => DevType::Block,
        _ => return None,
    };
    Some(DevNum {
        typ,
        major: it.next()?.parse().ok()?,
        minor: it.next()?.parse().ok()?,
    })
}
