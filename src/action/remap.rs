//! Remap: a device whose policy is `remap` is swapped for a healthy free spare of its class.
//! For each such device: pick and lease a spare, deny the bad device and allow the spare in
//! the container's device cgroup, and replace the container's node with the spare's. Any
//! failure leaves the container rejected, saying why, and gives back what it leased.

use super::cgroup::{self, Location};
use super::nsdev;
use super::spare::healthy_spares;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::class::Class;
use crate::model::clock;
use crate::model::device::{DevNum, Device};
use crate::model::text::one_line;
use crate::oci::spec::Spec;
use crate::oci::state::State;
use crate::policy::{DeviceDecision, Disposition};
use crate::probe::nvidia::GpuContext;
use crate::store::lease::{self, Lease, Leases, Outcome};
use crate::store::quarantine::Ledger;
use serde::{Deserialize, Serialize};
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
/// policy on `systemctl daemon-reload`, undoing a direct edit.
pub fn systemd_refusal(loc: &Location, systemd_running: bool) -> Option<String> {
    let unit = loc.systemd_unit()?;
    systemd_running.then(|| {
        format!(
            "{} belongs to systemd unit {unit}; systemd re-applies the unit's device policy \
             on daemon-reload and would undo the remap (run containers that may be remapped \
             with the cgroupfs driver)",
            loc.describe()
        )
    })
}

pub fn systemd_running() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// The rule list a v2 replacement program is built from: the container's own rules, the
/// rules runc appends to every container, then the remaps (deny bad, allow spare), last so
/// that they win.
pub fn v2_rules(
    spec_rules: &[oci_spec::runtime::LinuxDeviceCgroup],
    changes: &[oci_spec::runtime::LinuxDeviceCgroup],
) -> Vec<oci_spec::runtime::LinuxDeviceCgroup> {
    let mut rules = spec_rules.to_vec();
    rules.extend(cgroup::runtime_default_rules());
    rules.extend(changes.iter().cloned());
    rules
}

struct Ctx<'a> {
    config: &'a Config,
    state: &'a State,
    spec: &'a Spec,
    ledger: &'a Ledger,
    gpu: Option<&'a GpuContext>,
    leases: Leases,
    pid: i32,
    loc: Location,
    rootfs: PathBuf,
    /// v2: the changes so far, appended to the container's rules.
    changes: Vec<oci_spec::runtime::LinuxDeviceCgroup>,
    taken: Vec<DevNum>,
}

/// Leases a healthy free spare for `d`, or says why there is none.
fn lease_spare(cx: &mut Ctx, d: &Device) -> std::result::Result<(Lease, Option<Lease>), String> {
    if !cx.config.spares.contains_key(d.class.as_str()) {
        return Err(format!("no spare configured for class {}", d.class));
    }
    let mut exclude = cx.taken.clone();
    exclude.push(d.num);
    let (cands, mut why) = healthy_spares(cx.config, cx.ledger, &d.class, &exclude, cx.gpu);
    let (time_unix, time) = clock::now();
    let want = Lease {
        spare: d.num,
        spare_path: PathBuf::new(),
        class: d.class.clone(),
        container_id: cx.state.id.clone(),
        pid: cx.pid,
        pid_start: lease::pid_start(cx.pid),
        replaces: d.num,
        container_path: d.container_path.clone(),
        runtime_state: None,
        since: time,
        since_unix: time_unix,
    };
    let outcome = cx
        .leases
        .acquire(&cands, &want)
        .map_err(|e| format!("cannot lease a spare: {e}"))?;
    match outcome {
        Outcome::Leased {
            lease, reclaimed, ..
        } => Ok((lease, reclaimed)),
        Outcome::NoneFree(busy) => {
            why.extend(busy);
            let detail = if why.is_empty() {
                String::new()
            } else {
                format!(" ({})", why.join("; "))
            };
            Err(format!(
                "no free healthy spare of class {}{detail}",
                d.class
            ))
        }
    }
}

/// Denies `bad` and allows `spare` in the container's device cgroup; says what was edited.
fn edit_cgroup(cx: &mut Ctx, bad: DevNum, spare: DevNum) -> std::result::Result<String, String> {
    match &cx.loc {
        Location::V1 { dir, .. } => cgroup::v1::remap(dir, bad, spare)
            .map(|()| cx.loc.describe())
            .map_err(|e| format!("cannot edit the device cgroup: {e}")),
        Location::V2 { dir, .. } => {
            cx.changes.push(cgroup::device_rule(false, bad, "rwm"));
            cx.changes.push(cgroup::device_rule(true, spare, "rwm"));
            let rules = v2_rules(cx.spec.device_rules(), &cx.changes);
            cgroup::v2::replace(dir, &rules)
                .map(|r| {
                    format!(
                        "{}: device program {:?} replaced by {:?}",
                        cx.loc.describe(),
                        r.old,
                        r.new
                    )
                })
                .map_err(|e| format!("cannot replace the device program: {e}"))
        }
    }
}

/// Replaces the container's node for `d` with one for `spare`; says what the node is now.
fn edit_node(cx: &Ctx, d: &Device, spare: DevNum) -> std::result::Result<String, String> {
    let Some(cp) = &d.container_path else {
        return Ok("no container path (a cgroup rule only)".to_string());
    };
    nsdev::replace_node(&nsdev::NodeEdit {
        pid: cx.pid,
        pidfd: None,
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
    .map_err(|e| format!("cannot replace the node in the container: {e}"))
}

/// One device: lease a spare, then the cgroup (first: the node is useless without it, and
/// the bad device must be shut off whatever happens to the node), then the node. A
/// failure gives the spare back.
fn remap_one(cx: &mut Ctx, dec: &DeviceDecision) -> std::result::Result<RemapRecord, String> {
    let d = &dec.device;
    let (lease, reclaimed) = lease_spare(cx, d)?;
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
            if let Err(e) = cx.leases.release(spare, &cx.state.id) {
                log::error!("cannot give back spare {spare} of {}: {e}", cx.state.id);
            }
            Err(m)
        }
    }
}

/// Every device to remap becomes Reject, saying why (the runtime wrapper's remap too).
pub(crate) fn fail_all(decisions: &mut [DeviceDecision], why: &str) {
    for d in decisions
        .iter_mut()
        .filter(|d| d.disposition == Disposition::Remap)
    {
        d.disposition = Disposition::Reject;
        d.reasons.push(format!("remap impossible: {why}"));
    }
}

/// Remaps every device whose disposition is Remap. On success they stay Remap and the
/// records say what was done; on any failure every such device becomes Reject with the
/// reason, and the spares leased here are given back.
///
/// Long because it is one sequence: guards that reject every remap alike, the loop, then
/// the undo when one fails; split, the undo would be far from what it undoes.
pub fn apply(
    config: &Config,
    state: &State,
    spec: &Spec,
    ledger: &Ledger,
    gpu: Option<&GpuContext>,
    decisions: &mut [DeviceDecision],
) -> Applied {
    if !decisions
        .iter()
        .any(|d| d.disposition == Disposition::Remap)
    {
        return Applied::default();
    }
    if decisions
        .iter()
        .any(|d| d.disposition == Disposition::Reject)
    {
        fail_all(
            decisions,
            "not attempted, the container is rejected for another device",
        );
        return Applied::default();
    }
    let Some(pid) = state.pid() else {
        fail_all(decisions, "the runtime state has no container pid");
        return Applied::default();
    };
    let loc = match cgroup::locate(pid) {
        Ok(l) => l,
        Err(e) => {
            fail_all(decisions, &e.to_string());
            return Applied::default();
        }
    };
    if let Some(why) = systemd_refusal(&loc, systemd_running()) {
        fail_all(decisions, &why);
        return Applied::default();
    }
    let rootfs = match rootfs(state, spec) {
        Ok(r) => r,
        Err(e) => {
            fail_all(decisions, &e.to_string());
            return Applied::default();
        }
    };
    let mut cx = Ctx {
        config,
        state,
        spec,
        ledger,
        gpu,
        leases: Leases::new(&config.state_dir),
        pid,
        loc,
        rootfs,
        changes: Vec::new(),
        taken: Vec::new(),
    };
    let mut out = Applied::default();
    let mut failed = None;
    for (i, dec) in decisions.iter_mut().enumerate() {
        if dec.disposition != Disposition::Remap {
            continue;
        }
        match remap_one(&mut cx, dec) {
            Ok(r) => {
                out.lines.push(r.line(&dec.device));
                out.remaps.push(r);
            }
            Err(m) => {
                dec.disposition = Disposition::Reject;
                dec.reasons.push(format!("remap impossible: {m}"));
                failed = Some(i);
                break;
            }
        }
    }
    if let Some(i) = failed {
        // The container will not start: give back every spare taken for it.
        for r in &out.remaps {
            if let Err(e) = cx.leases.release(r.spare, &state.id) {
                log::error!("cannot give back spare {} of {}: {e}", r.spare, state.id);
            }
        }
        let why = format!(
            "not attempted, {} could not be remapped",
            decisions[i].device.describe()
        );
        for (j, d) in decisions.iter_mut().enumerate() {
            if j != i && d.disposition == Disposition::Remap {
                d.disposition = Disposition::Reject;
                d.reasons.push(format!("remap abandoned: {why}"));
            }
        }
        return Applied::default();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_rules_deny_the_bad_device_even_where_runc_allows_it() {
        use crate::action::cgroup::bpf::{
            self, ACC_MKNOD as M, ACC_READ as R, ACC_WRITE as W, DEV_CHAR as C,
        };
        use crate::model::device::DevType;
        let n = |minor| DevNum {
            typ: DevType::Char,
            major: 1,
            minor,
        };
        let spec: Vec<oci_spec::runtime::LinuxDeviceCgroup> = serde_json::from_str(
            r#"[{"allow":false,"access":"rwm"},{"allow":true,"type":"c","major":1,"minor":5,"access":"rwm"}]"#,
        )
        .unwrap();
        // 1:5 is in runc's defaults too: the change must come after them
        let changes = [
            cgroup::device_rule(false, n(5), "rwm"),
            cgroup::device_rule(true, n(7), "rwm"),
        ];
        let p = bpf::program(&v2_rules(&spec, &changes)).unwrap();
        assert_eq!(bpf::emulate(&p, C, R | W, 1, 5), Some(0));
        assert_eq!(bpf::emulate(&p, C, M, 1, 5), Some(0));
        assert_eq!(bpf::emulate(&p, C, R | W, 1, 7), Some(1));
        assert_eq!(bpf::emulate(&p, C, R | W, 1, 3), Some(1), "/dev/null kept");
        assert_eq!(bpf::emulate(&p, C, R | W, 136, 0), Some(1), "pts kept");
    }

    #[test]
    fn systemd_scope_refused_only_when_systemd_runs() {
        let scope = Location::V1 {
            dir: "/sys/fs/cgroup/devices/system.slice/docker-ab.scope".into(),
            path: "/system.slice/docker-ab.scope".into(),
        };
        let why = systemd_refusal(&scope, true).unwrap();
        assert!(why.contains("systemd unit docker-ab.scope"), "{why}");
        assert!(why.contains("daemon-reload"), "{why}");
        assert_eq!(systemd_refusal(&scope, false), None);
        let plain = Location::V2 {
            dir: "/sys/fs/cgroup/t1".into(),
            path: "/t1".into(),
        };
        assert_eq!(systemd_refusal(&plain, true), None);
    }
}
