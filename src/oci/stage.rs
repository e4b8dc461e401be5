//! The OCI lifecycle stages a hook can run at, and which of them gate a start.

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Prestart,
    CreateRuntime,
    CreateContainer,
    StartContainer,
    Poststart,
    Poststop,
}

impl Stage {
    pub const ALL: [(&'static str, Stage); 6] = [
        ("prestart", Stage::Prestart),
        ("createRuntime", Stage::CreateRuntime),
        ("createContainer", Stage::CreateContainer),
        ("startContainer", Stage::StartContainer),
        ("poststart", Stage::Poststart),
        ("poststop", Stage::Poststop),
    ];

    /// The stage a runtime is in from the state's status, for `devgate hook auto`: an
    /// oci-hooks(5) file has one argument list for all its stages. Every runtime passes
    /// `stopped` to poststop (runc `creating`, crun `created` to prestart); a status devgate
    /// does not know gates, so that no start slips through ungated.
    pub fn from_status(status: &str) -> Stage {
        match status {
            "stopped" => Stage::Poststop,
            "running" | "paused" => Stage::Poststart,
            _ => Stage::Prestart,
        }
    }

    pub fn parse(s: &str) -> Result<Stage> {
        Stage::ALL
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, st)| *st)
            .ok_or_else(|| {
                let names: Vec<&str> = Stage::ALL.iter().map(|(n, _)| *n).collect();
                Error::Usage(format!(
                    "unknown hook stage {s:?}; expected auto or one of {}",
                    names.join(", ")
                ))
            })
    }

    pub fn name(self) -> &'static str {
        Stage::ALL
            .iter()
            .find(|(_, st)| *st == self)
            .map(|(n, _)| *n)
            .unwrap_or("")
    }

    /// The stages at which devgate decides whether a container may start: both run after
    /// the runtime has created the container's cgroup and namespaces, before its process.
    pub fn gates(self) -> bool {
        matches!(self, Stage::Prestart | Stage::CreateRuntime)
    }
}
