//! Remap: a device whose policy is `remap` is swapped for a healthy free spare of its class.
//! For each such device: pick and lease a spare, deny the bad device and allow the spare in
//! the container's device cgroup, and replace the container's node with the spare's. Any
//! failure leaves the container rejected, saying why, and gives back what it leased.

use super::cgroup::{self, Location};
use super::error::RemapError;
use super::nsdev::{self, ContainerProcess};
use super::spare::{self, give_back, Grant, Holder, Leased, SpareRequest};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use crate::model::class::Class;
use crate::model::device::{DevNum, Device};
use crate::model::text::one_line;
use crate::oci::spec::Spec;
use crate::oci::state::State;
use crate::policy::{DeviceDecision, Disposition};
use crate::store::lease::{self, Leases};
use crate::store::quarantine::Ledger;
use serde::{Deserialize, Serialize};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the /dev edit in the container's mount namespace may take.
pub const NODE_TIMEOUT: Duration = Duration::from_secs(3);

/// What was done for one remapped device; kept in the decision log and the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemapRecord {
    pub device: DevNum,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_path: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<PathBuf>,
    pub class: Class,
    pub spare: DevNum,
    pub spare_path: PathBuf,
    /// Why the device was remapped: its unhealthy reasons.
    pub reason: String,
    /// The cgroup edited: `cgroup v1 /sys/fs/cgroup/devices/…`.
    pub cgroup: String,
    /// What happened to the container's node.
    pub node: String,
    /// A lease of a container that no longer exists, taken over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaimed_from: Option<String>,
}

impl RemapRecord {
    /// `devgate: remapped /dev/nvidia1 (195:1) -> /dev/nvidia7 (195:7): reason`
    pub fn line(&self, device: &Device) -> String {
        one_line(&format!(
            "devgate: remapped {} -> {} ({}): {}",
            device.describe(),
            self.spare_path.display(),
            self.spare,
            self.reason
        ))
    }
}

/// The outcome of remapping a container's devices.
#[derive(Debug, Default)]
pub struct Applied {
    pub remaps: Vec<RemapRecord>,
    pub lines: Vec<String>,
}

/// The container's rootfs as the runtime mounted it.
fn rootfs(state: &State, spec: &Spec) -> Result<PathBuf> {
    let root = spec
        .root
        .as_ref()
        .map(|r| r.path.clone())
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("rootfs"));
    let p = if root.is_absolute() {
        root
    } else {
        state.bundle.join(root)
    };
    // The bundle and root.path are the runtime's (host paths), not the container's.
    std::fs::canonicalize(&p).map_err(|e| Error::io("cannot resolve the container rootfs", &p, e))
}

/// Why a cgroup cannot take a remap that lasts: systemd re-applies a unit's device
/// policy on `systemctl daemon-reload`, undoing a direct edit. The runtime wrapper remaps
/// in the spec instead, which the runtime hands to systemd.
pub fn systemd_refusal(loc: &Location, systemd_running: bool) -> Option<RemapError> {
    let unit = loc.systemd_unit()?;
    systemd_running.then(|| RemapError::SystemdUnit {
        cgroup: loc.describe(),
        unit,
    })
}

pub fn systemd_running() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

struct Ctx<'a> {
    config: &'a Config,
    state: &'a State,
    ledger: &'a Ledger,
    gpu: Option<&'a GpuContext>,
    leases: Leases,
    pid: i32,
    /// The container's pidfd, opened when the hook started.
    pidfd: RawFd,
    /// The container process's start time, read while the pidfd showed it alive.
    pid_start: Option<u64>,
    loc: Location,
    rootfs: PathBuf,
    taken: Vec<DevNum>,
}

/// Denies `bad` and allows `spare` in the container's device cgroup; says what was edited.
fn edit_cgroup(cx: &Ctx, bad: DevNum, spare: DevNum) -> std::result::Result<String, RemapError> {
    match &cx.loc {
        Location::V1 { dir, .. } => cgroup::v1::remap(dir, bad, spare)
            .map(|()| cx.loc.describe())
            .map_err(RemapError::EditCgroup),
        Location::V2 { dir, .. } => cgroup::v2::remap(dir, bad, spare)
            .map(|r| {
                format!(
                    "{}: device programs {:?} extended, {} as {:?}",
                    cx.loc.describe(),
                    r.old,
                    r.how,
                    r.new
                )
            })
            .map_err(RemapError::ExtendPrograms),
    }
}

/// Replaces the container's node for `d` with one for `spare`; says what the node is now.
fn edit_node(cx: &Ctx, d: &Device, spare: DevNum) -> std::result::Result<String, RemapError> {
    let Some(cp) = &d.container_path else {
        return Ok("no container path (a cgroup rule only)".to_string());
    };
    nsdev::replace_node(&nsdev::NodeEdit {
        pid: cx.pid,
        pidfd: Some(cx.pidfd),
        rootfs: &cx.rootfs,
        container_path: cp,
        expect: d.num,
        spare,
        timeout: NODE_TIMEOUT,
    })
    .map(|r| {
        let what = if r.already { "already" } else { "now" };
        format!(
            "{} is {what} {} {} (mode {:o}, uid {}, gid {})",
            cp.display(),
            spare.typ.letter(),
            spare,
            r.mode,
            r.uid,
            r.gid
        )
    })
    .map_err(RemapError::ReplaceNode)
}

/// One device: lease a spare, then the cgroup (first: the node is useless without it, and
/// the bad device must be shut off whatever happens to the node), then the node. A
/// failure gives the spare back.
fn remap_one(cx: &mut Ctx, dec: &DeviceDecision) -> std::result::Result<RemapRecord, RemapError> {
    let d = &dec.device;
    let req = SpareRequest {
        device: d,
        container_id: &cx.state.id,
        holder: Holder {
            pid: cx.pid,
            pid_start: cx.pid_start,
            runtime_state: None,
        },
        taken: &cx.taken,
        // A systemd unit's cgroup was refused before any spare was asked for.
        grant: Grant::Cgroup,
    };
    let Leased { lease, reclaimed } =
        spare::lease_spare(cx.config, cx.ledger, cx.gpu, &cx.leases, &req)
            .map_err(RemapError::Lease)?;
    cx.taken.push(lease.spare);
    let spare = lease.spare;
    let edited = edit_cgroup(cx, d.num, spare)
        .and_then(|cgroup| edit_node(cx, d, spare).map(|node| (cgroup, node)));
    match edited {
        Ok((cgroup, node)) => Ok(RemapRecord {
            device: d.num,
            container_path: d.container_path.clone(),
            host_path: d.host_path.clone(),
            class: d.class.clone(),
            spare,
            spare_path: lease.spare_path.clone(),
            reason: dec.reasons.join("; "),
            cgroup,
            node,
            reclaimed_from: reclaimed.map(|l| l.container_id),
        }),
        Err(m) => {
            give_back(&cx.leases, spare, &cx.state.id);
            Err(m)
        }
    }
}

/// Every device to remap becomes Reject, saying why (the runtime wrapper's remap too).
/// Why no remap is made for a container with a user namespace of its own (Kubernetes
/// `hostUsers: false`): its /dev belongs to that namespace, where a node devgate makes
/// cannot be opened, and runtimes bind the host's node by the container's path there
/// instead of making the spare's. Gating still works: the container is rejected.
pub(crate) const USERNS: &str = "the container has its own user namespace (hostUsers: \
    false): its /dev cannot hold a spare's node, so the bad device cannot be swapped";

pub(crate) fn fail_all(decisions: &mut [DeviceDecision], why: &str) {
    for d in decisions
        .iter_mut()
        .filter(|d| d.disposition == Disposition::Remap)
    {
        d.disposition = Disposition::Reject;
        d.reasons.push(format!("remap impossible: {why}"));
    }
}

/// Whether any remap is to be tried: some device asks for one, and no other device
/// rejects the container outright (then every remap fails alike, saying so). Shared by
/// the hook-time remap and the runtime wrapper's.
pub(crate) fn wanted(decisions: &mut [DeviceDecision]) -> bool {
    if !decisions
        .iter()
        .any(|d| d.disposition == Disposition::Remap)
    {
        return false;
    }
    if decisions
        .iter()
        .any(|d| d.disposition == Disposition::Reject)
    {
        fail_all(
            decisions,
            "not attempted, the container is rejected for another device",
        );
        return false;
    }
    true
}

/// Device `i` could not be remapped (`why`): it is rejected, and every other remap is
/// abandoned with it, naming it.
pub(crate) fn abandon(decisions: &mut [DeviceDecision], i: usize, why: String) {
    let name = decisions[i].device.describe();
    for (j, d) in decisions.iter_mut().enumerate() {
        if j == i {
            d.disposition = Disposition::Reject;
            d.reasons.push(why.clone());
        } else if d.disposition == Disposition::Remap {
            d.disposition = Disposition::Reject;
            d.reasons.push(format!(
                "remap abandoned: not attempted, {name} could not be remapped"
            ));
        }
    }
}

/// Remaps every device whose disposition is Remap. On success they stay Remap and the
/// records say what was done; on any failure every such device becomes Reject with the
/// reason, and the spares leased here are given back.
pub fn apply(
    config: &Config,
    state: &State,
    spec: &Spec,
    ledger: &Ledger,
    gpu: Option<&GpuContext>,
    process: Option<&ContainerProcess>,
    decisions: &mut [DeviceDecision],
) -> Applied {
    if !wanted(decisions) {
        return Applied::default();
    }
    if spec.user_namespace() {
        fail_all(decisions, USERNS);
        return Applied::default();
    }
    // Whatever stands in the way of editing the container rejects every remap alike.
    let Target {
        pid,
        pidfd,
        pid_start,
        loc,
        rootfs,
    } = match target(state, spec, process) {
        Ok(t) => t,
        Err(why) => {
            fail_all(decisions, &why.to_string());
            return Applied::default();
        }
    };
    let mut cx = Ctx {
        config,
        state,
        ledger,
        gpu,
        leases: Leases::new(&config.state_dir),
        pid,
        pidfd,
        pid_start,
        loc,
        rootfs,
        taken: Vec::new(),
    };
    remap_all(&mut cx, decisions)
}

/// Where a remap edits the container: its process, its cgroup, its rootfs.
struct Target {
    pid: i32,
    pidfd: RawFd,
    pid_start: Option<u64>,
    loc: Location,
    rootfs: PathBuf,
}

/// The container's process, cgroup and rootfs, each checked in turn; the error says why
/// no remap can be made in this container.
fn target(
    state: &State,
    spec: &Spec,
    process: Option<&ContainerProcess>,
) -> std::result::Result<Target, RemapError> {
    let Some(process) = process else {
        return Err(RemapError::NoPid);
    };
    let pid = process.pid;
    let pidfd = process.pidfd().map_err(RemapError::Pidfd)?;
    // Read by pid number, then checked alive by locate's pidfd check below.
    let pid_start = lease::pid_start(pid);
    let loc = cgroup::locate(pid, pidfd).map_err(RemapError::Locate)?;
    let cgroups_path = spec.linux.as_ref().and_then(|l| l.cgroups_path.as_deref());
    cgroup::path::check(loc.path(), cgroups_path, &state.id).map_err(RemapError::Misplaced)?;
    if let Some(why) = systemd_refusal(&loc, systemd_running()) {
        return Err(why);
    }
    let rootfs = rootfs(state, spec).map_err(RemapError::Rootfs)?;
    Ok(Target {
        pid,
        pidfd,
        pid_start,
        loc,
        rootfs,
    })
}

/// Each device to remap in turn, until one fails: then the container will not start, every
/// spare taken for it is given back, and the other remaps are abandoned.
fn remap_all(cx: &mut Ctx, decisions: &mut [DeviceDecision]) -> Applied {
    let mut out = Applied::default();
    let mut failed = None;
    for (i, dec) in decisions.iter().enumerate() {
        if dec.disposition != Disposition::Remap {
            continue;
        }
        match remap_one(cx, dec) {
            Ok(r) => {
                out.lines.push(r.line(&dec.device));
                out.remaps.push(r);
            }
            Err(m) => {
                failed = Some((i, format!("remap impossible: {m}")));
                break;
            }
        }
    }
    if let Some((i, why)) = failed {
        // The container will not start: give back every spare taken for it.
        for r in &out.remaps {
            give_back(&cx.leases, r.spare, &cx.state.id);
        }
        abandon(decisions, i, why);
        return Applied::default();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_scope_refused_only_when_systemd_runs() {
        let scope = Location::V1 {
            dir: "/sys/fs/cgroup/devices/system.slice/docker-ab.scope".into(),
            path: "/system.slice/docker-ab.scope".into(),
        };
        let why = systemd_refusal(&scope, true).unwrap();
        assert!(
            matches!(&why, RemapError::SystemdUnit { unit, .. } if unit == "docker-ab.scope"),
            "{why:?}"
        );
        let why = why.to_string();
        assert!(why.contains("systemd unit docker-ab.scope"), "{why}");
        assert!(why.contains("daemon-reload"), "{why}");
        assert!(why.contains("devgate's runtime wrapper"), "{why}");
        assert!(!why.contains('\n'), "one line: {why}");
        assert!(systemd_refusal(&scope, false).is_none());
        let plain = Location::V2 {
            dir: "/sys/fs/cgroup/t1".into(),
            path: "/t1".into(),
        };
        assert!(systemd_refusal(&plain, true).is_none());
    }
}
