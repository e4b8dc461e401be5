//! Why a hook-time remap could not be made: the container's process, its cgroup, its
//! rootfs, the spare, or an edit. Each is said after `remap impossible: ` on the rejected
//! device. Used by `remap` alone; it imports the errors of the steps it names, none of which
//! imports it.

use super::cgroup::error::LocateError;
use super::nsdev::PidfdError;
use super::spare::NoSpare;
use crate::error::Error;
use std::fmt;

#[derive(Debug)]
pub enum RemapError {
    /// The runtime state names no container process.
    NoPid,
    /// The container's process had exited when the hook started.
    Pidfd(PidfdError),
    /// The container's device cgroup could not be found.
    Locate(Error),
    /// The process's cgroup is not the container's.
    Misplaced(LocateError),
    /// The cgroup (`cgroup`, described) belongs to systemd unit `unit`, which re-applies
    /// its device policy on daemon-reload.
    SystemdUnit { cgroup: String, unit: String },
    /// The container's rootfs could not be resolved.
    Rootfs(Error),
    /// No spare could be leased.
    Lease(NoSpare),
    /// The v1 devices cgroup could not be edited.
    EditCgroup(Error),
    /// The cgroup's eBPF device programs could not be extended.
    ExtendPrograms(Error),
    /// The container's node could not be replaced with the spare's.
    ReplaceNode(Error),
}

impl fmt::Display for RemapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemapError::NoPid => f.write_str("the runtime state has no container pid"),
            RemapError::Pidfd(e) => e.fmt(f),
            RemapError::Locate(e) | RemapError::Rootfs(e) => e.fmt(f),
            RemapError::Misplaced(e) => e.fmt(f),
            RemapError::SystemdUnit { cgroup, unit } => write!(
                f,
                "{cgroup} belongs to systemd unit {unit}, whose device policy systemd \
                 re-applies on daemon-reload, undoing a hook's edit; under the systemd cgroup \
                 driver remap with devgate's runtime wrapper, which changes the spec before \
                 the runtime creates the container (docs/wrapper.md)"
            ),
            RemapError::Lease(e) => e.fmt(f),
            RemapError::EditCgroup(e) => write!(f, "cannot edit the device cgroup: {e}"),
            RemapError::ExtendPrograms(e) => write!(f, "cannot extend the device programs: {e}"),
            RemapError::ReplaceNode(e) => {
                write!(f, "cannot replace the node in the container: {e}")
            }
        }
    }
}

impl std::error::Error for RemapError {}
