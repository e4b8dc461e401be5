//! Remap: a device whose policy is `remap` is swapped for a healthy free spare of its class.
//! For each such device: pick and lease a spare, deny the bad device and allow the spare in
//! the container's device cgroup, and replace the container's node with the spare's. Any
//! failure leaves the container rejected, saying why, and gives back what it leased.

use crate::cgroup::{self, Location};
use crate::config::Config;
use crate::device::{DevNum, Device};
use crate::error::{Error, Result};
use crate::hook::{self, GpuContext};
use crate::ledger::lease::{self, Lease, Leases, Outcome};
use crate::ledger::quarantine::Ledger;
use crate::nsdev;
use crate::policy::{self, DeviceDecision, Disposition};
use crate::probe::Verdict;
use crate::spec::Spec;
use crate::state::State;
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
    pub class: String,
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
        policy::one_line(&format!(
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

/// The device as a spare: its host node, probed like any assigned device.
fn spare_device(path: &Path, class: &str) -> std::result::Result<Device, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let num = DevNum::from_metadata(&meta)
        .ok_or_else(|| format!("{} is not a device node", path.display()))?;
    Ok(Device::on_host(num, class, Some(path.to_path_buf())))
}

/// The configured spares of `class` that pass every probe, and a clause for each that
/// does not. A spare is usable when no probe finds it unhealthy and the policy would let it
/// start (an unknown verdict under `on_unknown: allow` is usable).
pub fn healthy_spares(
    config: &Config,
    ledger: &Ledger,
    class: &str,
    exclude: &[DevNum],
    gpu: Option<&GpuContext>,
) -> (Vec<(DevNum, PathBuf)>, Vec<String>) {
    let mut why = Vec::new();
    let mut devices = Vec::new();
    for path in config.spares.get(class).map(Vec::as_slice).unwrap_or(&[]) {
        match spare_device(path, class) {
            Ok(d) if exclude.contains(&d.num) => {}
            Ok(d) => devices.push(d),
            Err(m) => why.push(format!("spare {m}")),
        }
    }
    // One probe pass for every spare, on the gate's NVML answer when it has one: NVML is
    // opened at most once per hook call.
    let owned;
    let gpu = match gpu {
        Some(g) => Some(g),
        None => {
            owned = GpuContext::for_devices(config, &devices);
            owned.as_ref()
        }
    };
    let mut ok = Vec::new();
    for dec in hook::decide_with(config, ledger, devices, gpu) {
        let bad: Vec<&str> = dec
            .verdicts
            .iter()
            .filter_map(|v| match &v.verdict {
                Verdict::Unhealthy(r) => Some(r.as_str()),
                _ => None,
            })
            .collect();
        let path = dec.device.host_path.clone().unwrap_or_default();
        if !bad.is_empty() || dec.disposition == Disposition::Reject {
            let mut reasons = dec.reasons.clone();
            if reasons.is_empty() {
                reasons = bad.iter().map(|s| s.to_string()).collect();
            }
            why.push(format!(
                "{} unhealthy: {}",
                path.display(),
                reasons.join("; ")
            ));
            continue;
        }
        ok.push((dec.device.num, path));
    }
    (ok, why)
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

fn remap_one(cx: &mut Ctx, dec: &DeviceDecision) -> std::result::Result<RemapRecord, String> {
    let d = &dec.device;
    if !cx.config.spares.contains_key(&d.class) {
        return Err(format!("no spare configured for class {}", d.class));
    }
    let mut exclude = cx.taken.clone();
    exclude.push(d.num);
    let (cands, mut why) = healthy_spares(cx.config, cx.ledger, &d.class, &exclude, cx.gpu);
    let (time_unix, time) = crate::ledger::now();
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
    let (lease, reclaimed) = match outcome {
        Outcome::Leased {
            lease, reclaimed, ..
        } => (lease, reclaimed),
        Outcome::NoneFree(busy) => {
            why.extend(busy);
            let detail = if why.is_empty() {
                String::new()
            } else {
                format!(" ({})", why.join("; "))
            };
            return Err(format!(
                "no free healthy spare of class {}{detail}",
                d.class
            ));
        }
    };
    cx.taken.push(lease.spare);
    let spare = lease.spare;

    // The cgroup first: the node is useless without it, and the bad device must be shut off
    // whatever happens to the node.
    let cg = match &cx.loc {
        Location::V1 { dir, .. } => cgroup::v1::remap(dir, d.num, spare)
            .map(|()| cx.loc.describe())
            .map_err(|e| format!("cannot edit the device cgroup: {e}")),
        Location::V2 { dir, .. } => {
            cx.changes.push(cgroup::device_rule(false, d.num, "rwm"));
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
    };
    let node = cg.and_then(|cg| match &d.container_path {
        None => Ok((cg, "no container path (a cgroup rule only)".to_string())),
        Some(cp) => nsdev::replace_node(&nsdev::NodeEdit {
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
            (
                cg,
                format!(
                    "{} is {what} {} {} (mode {:o}, uid {}, gid {})",
                    cp.display(),
                    spare.typ.letter(),
                    spare,
                    r.mode,
                    r.uid,
                    r.gid
                ),
            )
        })
        .map_err(|e| format!("cannot replace the node in the container: {e}")),
    });
    match node {
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

fn fail_all(decisions: &mut [DeviceDecision], why: &str) {
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

/// poststop: gives back the container's spares. Never fails the lifecycle.
pub fn release(config: &Config, container_id: &str) -> Vec<Lease> {
    match Leases::new(&config.state_dir).release_container(container_id) {
        Ok(v) => v,
        Err(e) => {
            log::error!("cannot release the spares of {container_id}: {e}");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_rules_deny_the_bad_device_even_where_runc_allows_it() {
        use crate::cgroup::bpf::{
            self, ACC_MKNOD as M, ACC_READ as R, ACC_WRITE as W, DEV_CHAR as C,
        };
        use crate::device::DevType;
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

    #[test]
    fn unhealthy_and_missing_spares_are_named() {
        let dir = std::env::temp_dir().join(format!("devgate-remap-sp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut config = Config {
            quarantine_dir: dir.join("q"),
            state_dir: dir.join("s"),
            ..Config::default()
        };
        config.spares.insert(
            "char".into(),
            vec![
                "/dev/full".into(),
                "/dev/urandom".into(),
                "/nonexistent/x".into(),
            ],
        );
        let ledger = Ledger::new(&config.quarantine_dir);
        let full = spare_device(Path::new("/dev/full"), "char").unwrap().num;
        ledger.cordon(full, None, "bad spare", "t").unwrap();
        let (ok, why) = healthy_spares(&config, &ledger, "char", &[], None);
        assert_eq!(ok.len(), 1, "{ok:?} {why:?}");
        assert_eq!(ok[0].1, PathBuf::from("/dev/urandom"));
        assert!(
            why.iter()
                .any(|w| w.starts_with("/dev/full unhealthy: quarantined")),
            "{why:?}"
        );
        assert!(why.iter().any(|w| w.contains("/nonexistent/x")), "{why:?}");
        let (ok, _) = healthy_spares(&config, &ledger, "char", &[ok[0].0], None);
        assert!(ok.is_empty());
    }
}
