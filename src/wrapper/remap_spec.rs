//! The wrapper's remap: lease a healthy spare for each device the policy remaps, then
//! write the swap into the spec file before the runtime reads it (spec_rewrite.rs). The
//! same outcomes as the hook-time remap: every device remapped, or the container rejected
//! saying why with every spare taken for it given back.

use super::spec_rewrite::{self, RewriteError, Swap};
use crate::action::remap::{abandon, fail_all, wanted, Applied, RemapRecord};
use crate::action::spare::{self, give_back, Grant, Holder, Leased, NoSpare, SpareRequest};
use crate::config::Config;
use crate::error::Error;
use crate::gpu::GpuContext;
use crate::model::device::{self, DevNum};
use crate::policy::{DeviceDecision, Disposition};
use crate::store::lease::{self, Leases};
use crate::store::quarantine::Ledger;
use std::fmt;
use std::path::{Path, PathBuf};

pub struct SpecRemap<'a> {
    pub id: &'a str,
    pub spec_file: &'a Path,
    /// The spec file's bytes as read; replaced by what was written after a remap.
    pub bytes: Vec<u8>,
    /// The runtime's state directory for this container (the lease's witness).
    pub runtime_state: Option<PathBuf>,
    /// The runtime hands the device policy to systemd (`--systemd-cgroup`).
    pub systemd: bool,
    /// The spec gives the container a user namespace of its own.
    pub user_namespace: bool,
}

impl SpecRemap<'_> {
    fn lease_one(
        &self,
        config: &Config,
        ledger: &Ledger,
        gpu: Option<&GpuContext>,
        leases: &Leases,
        taken: &[DevNum],
        dec: &DeviceDecision,
    ) -> Result<Leased, SpecRemapError> {
        let d = &dec.device;
        if device::is_default_device(d.num) {
            // runc and crun append their default rules after the spec's: a deny in the
            // spec cannot hold for these.
            return Err(SpecRemapError::DefaultDevice(d.num));
        }
        // No container process exists yet: the lease names this process (the runtime's
        // once exec'd, alive until the container is created) and the runtime's state
        // directory, which lasts as long as the container does. The hook repoints it.
        let pid = std::process::id() as i32;
        let req = SpareRequest {
            device: d,
            container_id: self.id,
            holder: Holder {
                pid,
                pid_start: lease::pid_start(pid),
                runtime_state: self.runtime_state.clone(),
            },
            taken,
            grant: if self.systemd {
                Grant::SystemdDeviceAllow
            } else {
                Grant::Cgroup
            },
        };
        spare::lease_spare(config, ledger, gpu, leases, &req).map_err(SpecRemapError::Lease)
    }

    fn write(
        &mut self,
        swaps: &[Swap],
        dev_root: &Path,
    ) -> Result<Vec<spec_rewrite::Changed>, SpecRemapError> {
        let mut doc: serde_json::Value =
            serde_json::from_slice(&self.bytes).map_err(|e| SpecRemapError::Parse {
                path: self.spec_file.to_path_buf(),
                cause: e.to_string(),
            })?;
        let changed =
            spec_rewrite::rewrite(&mut doc, swaps, dev_root).map_err(SpecRemapError::Rewrite)?;
        let bytes =
            serde_json::to_vec(&doc).map_err(|e| SpecRemapError::Serialize(e.to_string()))?;
        spec_rewrite::replace_file(self.spec_file, &bytes).map_err(SpecRemapError::Replace)?;
        self.bytes = bytes;
        Ok(changed)
    }

    /// Remaps every device whose disposition is Remap, in the spec. All or nothing: every
    /// lease taken, the spec written once, and on any failure every lease given back
    /// before a record is made.
    pub fn apply(
        &mut self,
        config: &Config,
        ledger: &Ledger,
        gpu: Option<&GpuContext>,
        decisions: &mut [DeviceDecision],
    ) -> Applied {
        if !wanted(decisions) {
            return Applied::default();
        }
        if self.user_namespace {
            fail_all(decisions, crate::action::remap::USERNS);
            return Applied::default();
        }
        let leases = Leases::new(&config.state_dir);
        let Leasing { held, failed } = self.lease_all(config, ledger, gpu, &leases, decisions);
        if let Some((i, why)) = failed {
            self.give_back_all(&leases, &held);
            abandon(decisions, i, why);
            return Applied::default();
        }
        let swaps: Vec<Swap> = held
            .iter()
            .map(|(i, l)| Swap {
                bad: decisions[*i].device.num,
                spare: l.lease.spare,
                spare_path: l.lease.spare_path.clone(),
            })
            .collect();
        let changed = match self.write(&swaps, &config.dev_root) {
            Ok(c) => c,
            Err(m) => {
                // Every device fails alike: none of them was written.
                self.give_back_all(&leases, &held);
                fail_all(decisions, &m.to_string());
                return Applied::default();
            }
        };
        let mut out = Applied::default();
        for ((i, leased), c) in held.into_iter().zip(changed) {
            let d = &decisions[i].device;
            let r = remap_record(&decisions[i], leased, c);
            out.lines.push(r.line(d));
            out.remaps.push(r);
        }
        out
    }

    /// A spare leased for each device to remap, in order, until one cannot be.
    fn lease_all(
        &self,
        config: &Config,
        ledger: &Ledger,
        gpu: Option<&GpuContext>,
        leases: &Leases,
        decisions: &[DeviceDecision],
    ) -> Leasing {
        let mut held: Vec<(usize, Leased)> = Vec::new();
        for (i, dec) in decisions.iter().enumerate() {
            if dec.disposition != Disposition::Remap {
                continue;
            }
            let taken: Vec<_> = held.iter().map(|(_, l)| l.lease.spare).collect();
            match self.lease_one(config, ledger, gpu, leases, &taken, dec) {
                Ok(l) => held.push((i, l)),
                Err(m) => {
                    let failed = Some((i, format!("remap impossible: {m}")));
                    return Leasing { held, failed };
                }
            }
        }
        Leasing { held, failed: None }
    }

    fn give_back_all(&self, leases: &Leases, held: &[(usize, Leased)]) {
        for (_, l) in held {
            give_back(leases, l.lease.spare, self.id);
        }
    }
}

/// Why the wrapper's remap could not be written into the spec.
#[derive(Debug)]
pub enum SpecRemapError {
    /// The device is one runc and crun allow every container after the spec's rules.
    DefaultDevice(DevNum),
    /// No spare could be leased.
    Lease(NoSpare),
    /// The spec file's bytes are not JSON (serde_json's words).
    Parse { path: PathBuf, cause: String },
    /// The spec cannot take the swap.
    Rewrite(RewriteError),
    /// The rewritten document could not be written out as JSON.
    Serialize(String),
    /// The spec file could not be replaced.
    Replace(Error),
}

impl fmt::Display for SpecRemapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecRemapError::DefaultDevice(num) => write!(
                f,
                "the runtime allows {} {num} to every container after the spec's own rules, \
                 so the spec cannot deny it",
                num.typ.letter()
            ),
            SpecRemapError::Lease(e) => e.fmt(f),
            SpecRemapError::Parse { path, cause } => {
                write!(f, "cannot parse {}: {cause}", path.display())
            }
            SpecRemapError::Rewrite(e) => e.fmt(f),
            SpecRemapError::Serialize(e) => f.write_str(e),
            SpecRemapError::Replace(e) => write!(f, "cannot rewrite the spec: {e}"),
        }
    }
}

impl std::error::Error for SpecRemapError {}

/// What [`SpecRemap::lease_all`] leased: each spare with the index of its decision, and the
/// decision whose spare could not be leased, with why.
struct Leasing {
    held: Vec<(usize, Leased)>,
    failed: Option<(usize, String)>,
}

/// The record of one device remapped in the spec, from what the rewrite did for it.
fn remap_record(dec: &DeviceDecision, leased: Leased, c: spec_rewrite::Changed) -> RemapRecord {
    let Leased {
        lease: l,
        reclaimed,
    } = leased;
    let d = &dec.device;
    let node = if c.nodes.is_empty() {
        "no container path (a cgroup rule only)".to_string()
    } else {
        format!("config.json {}", c.nodes.join("; "))
    };
    RemapRecord {
        device: d.num,
        container_path: d.container_path.clone(),
        host_path: d.host_path.clone(),
        class: d.class.clone(),
        spare: l.spare,
        spare_path: l.spare_path.clone(),
        reason: dec.reasons.join("; "),
        cgroup: format!("config.json {}, applied by the runtime", c.rules),
        node,
        reclaimed_from: reclaimed.map(|l| l.container_id),
    }
}
