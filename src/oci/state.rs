//! The OCI state a runtime writes to a hook's stdin. Read into a small struct of the fields
//! devgate uses: a strict parser (oci-spec's) refuses a whole state over one status value it
//! does not know, and a hook that fails there would block every container on the node.

use crate::error::{Error, Result};
use crate::fsutil::read_bounded;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

pub const MAX_STATE_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub id: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub pid: Option<i64>,
    pub bundle: PathBuf,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl State {
    pub fn parse(bytes: &[u8]) -> Result<State> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::invalid(
                "state on stdin",
                "empty (a runtime passes the container state as JSON)",
            ));
        }
        let state: State =
            serde_json::from_slice(bytes).map_err(|e| Error::json("state on stdin", None, &e))?;
        if state.id.is_empty() {
            return Err(Error::invalid("state on stdin", "empty container id"));
        }
        if !state.bundle.is_absolute() {
            return Err(Error::invalid(
                "state on stdin",
                format!("bundle {:?} is not an absolute path", state.bundle),
            ));
        }
        Ok(state)
    }

    /// The state from `r` (the hook's stdin), with the bytes it was read from: a hook
    /// that hands the call on passes them to the next devgate as its stdin.
    pub fn read(r: impl Read) -> Result<(Vec<u8>, State)> {
        let bytes = read_bounded(r, MAX_STATE_BYTES, "state on", Path::new("stdin"))?;
        let state = State::parse(&bytes)?;
        Ok((bytes, state))
    }

    /// The pid as the kernel knows it; 0, negative and absurd values mean "none".
    pub fn pid(&self) -> Option<i32> {
        self.pid
            .filter(|p| *p > 0 && *p <= i32::MAX as i64)
            .map(|p| p as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_runc_state_and_tolerates_unknown_status_and_fields() {
        let s = State::parse(
            br#"{"ociVersion":"1.2.0","id":"abc","status":"paused","pid":42,
                 "bundle":"/run/b","annotations":{"k":"v"},"future":{"x":1}}"#,
        )
        .unwrap();
        assert_eq!(s.id, "abc");
        assert_eq!(s.status, "paused");
        assert_eq!(s.pid(), Some(42));
        assert_eq!(s.annotations["k"], "v");
    }

    #[test]
    fn empty_and_truncated_input_are_clear_errors() {
        let e = State::parse(b"").unwrap_err().to_string();
        assert!(e.starts_with("state on stdin: empty"), "{e}");
        let e = State::parse(br#"{"id":"abc","bund"#)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("state on stdin: line 1 column"), "{e}");
    }

    #[test]
    fn missing_bundle_and_relative_bundle_are_refused() {
        assert!(State::parse(br#"{"id":"a"}"#).is_err());
        let e = State::parse(br#"{"id":"a","bundle":"rel"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an absolute path"), "{e}");
    }

    #[test]
    fn oversized_stdin_is_refused() {
        let big = vec![b' '; (MAX_STATE_BYTES + 1) as usize];
        let e = State::read(&big[..]).unwrap_err().to_string();
        assert_eq!(e, "state on stdin exceeds 1 MiB");
    }

    #[test]
    fn absurd_pid_is_none() {
        let s = State::parse(br#"{"id":"a","bundle":"/b","pid":99999999999}"#).unwrap();
        assert_eq!(s.pid(), None);
    }
}
