//! The wrapper's remap: lease a healthy spare for each device the policy remaps, then
//! write the swap into the spec file before the runtime reads it (spec_rewrite.rs). The
//! same outcomes as the hook-time remap: every device remapped, or the container rejected
//! saying why with every spare taken for it given back.

use super::spec_rewrite::{self, Swap};
use crate::action::remap::{abandon, fail_all, wanted, Applied, RemapRecord};
use crate::action::spare::healthy_spares;
use crate::config::Config;
use crate::model::device::{self, DevNum};
use crate::policy::{DeviceDecision, Disposition};
use crate::probe::nvidia::GpuContext;
use crate::store::lease::{self, Lease, Leases, Outcome};
use crate::store::quarantine::Ledger;
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

/// Under the systemd cgroup driver runc passes each allowed device to systemd as
/// `DeviceAllow=/dev/char/MAJ:MIN` (`/dev/block/…`) and leaves out a device whose link is
/// missing: systemd's next daemon-reload would then take the spare away. The link must
/// exist and name the spare.
pub fn systemd_can_grant(dev_root: &Path, num: DevNum) -> Result<(), String> {
    let link = dev_root
        .join(num.typ.sysfs_dir())
        .join(format!("{}:{}", num.major, num.minor));
    match std::fs::metadata(&link) {
        Ok(m) if DevNum::from_metadata(&m) == Some(num) => Ok(()),
        Ok(_) => Err(format!(
            "{} is not {} {num}",
            link.display(),
            num.typ.letter()
        )),
        Err(e) => Err(format!(
            "{} is missing ({e}); under the systemd cgroup driver runc grants a device \
             through DeviceAllow= on that path and skips it when absent, so systemd would \
             take the spare away at its next daemon-reload",
            link.display()
        )),
    }
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
    ) -> Result<(Lease, Option<Lease>), String> {
        let d = &dec.device;
        if device::is_default_device(d.num) {
            // runc and crun append their default rules after the spec's: a deny in the
            // spec cannot hold for these.
            return Err(format!(
                "the runtime allows {} {} to every container after the spec's own rules, so \
                 the spec cannot deny it",
                d.num.typ.letter(),
                d.num
            ));
        }
        if !config.spares.contains_key(d.class.as_str()) {
            return Err(format!("no spare configured for class {}", d.class));
        }
        let mut exclude = taken.to_vec();
        exclude.push(d.num);
        let (mut cands, mut why) = healthy_spares(config, ledger, &d.class, &exclude, gpu);
        if self.systemd {
            cands.retain(
                |(num, path)| match systemd_can_grant(&config.dev_root, *num) {
                    Ok(()) => true,
                    Err(m) => {
                        why.push(format!("{}: {m}", path.display()));
                        false
                    }
                },
            );
        }
        let (since_unix, since) = crate::model::clock::now();
        // No container process exists yet: the lease names this process (the runtime's
        // once exec'd, alive until the container is created) and the runtime's state
        // directory, which lasts as long as the container does. The hook repoints it.
        let pid = std::process::id() as i32;
        let want = Lease {
            spare: d.num,
            spare_path: PathBuf::new(),
            class: d.class.clone(),
            container_id: self.id.to_string(),
            pid,
            pid_start: lease::pid_start(pid),
            replaces: d.num,
            container_path: d.container_path.clone(),
            runtime_state: self.runtime_state.clone(),
            since,
            since_unix,
        };
        match leases
            .acquire(&cands, &want)
            .map_err(|e| format!("cannot lease a spare: {e}"))?
        {
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

    fn write(
        &mut self,
        swaps: &[Swap],
        dev_root: &Path,
    ) -> Result<Vec<spec_rewrite::Changed>, String> {
        let mut doc: serde_json::Value = serde_json::from_slice(&self.bytes)
            .map_err(|e| format!("cannot parse {}: {e}", self.spec_file.display()))?;
        let changed = spec_rewrite::rewrite(&mut doc, swaps, dev_root)?;
        let bytes = serde_json::to_vec(&doc).map_err(|e| e.to_string())?;
        spec_rewrite::replace_file(self.spec_file, &bytes)
            .map_err(|e| format!("cannot rewrite the spec: {e}"))?;
        self.bytes = bytes;
        Ok(changed)
    }

    /// Remaps every device whose disposition is Remap, in the spec.
    /// Long because it is all or nothing: every lease taken, the spec written once, and on
    /// any failure every lease given back before a record is made.
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
        let mut held: Vec<(usize, Lease, Option<Lease>)> = Vec::new();
        let mut failed = None;
        for (i, dec) in decisions.iter().enumerate() {
            if dec.disposition != Disposition::Remap {
                continue;
            }
            let taken: Vec<_> = held.iter().map(|(_, l, _)| l.spare).collect();
            match self.lease_one(config, ledger, gpu, &leases, &taken, dec) {
                Ok((l, reclaimed)) => held.push((i, l, reclaimed)),
                Err(m) => {
                    failed = Some((i, format!("remap impossible: {m}")));
                    break;
                }
            }
        }
        let swaps: Vec<Swap> = held
            .iter()
            .map(|(i, l, _)| Swap {
                bad: decisions[*i].device.num,
                spare: l.spare,
                spare_path: l.spare_path.clone(),
            })
            .collect();
        let changed = match failed {
            Some(_) => Vec::new(),
            None => match self.write(&swaps, &config.dev_root) {
                Ok(c) => c,
                Err(m) => {
                    // Every device fails alike: none of them was written.
                    for (_, l, _) in &held {
                        give_back(&leases, l);
                    }
                    fail_all(decisions, &m);
                    return Applied::default();
                }
            },
        };
        if let Some((i, why)) = failed {
            for (_, l, _) in &held {
                give_back(&leases, l);
            }
            abandon(decisions, i, why);
            return Applied::default();
        }
        let mut out = Applied::default();
        for ((i, l, reclaimed), c) in held.into_iter().zip(changed) {
            let dec = &decisions[i];
            let d = &dec.device;
            let node = if c.nodes.is_empty() {
                "no container path (a cgroup rule only)".to_string()
            } else {
                format!("config.json {}", c.nodes.join("; "))
            };
            let r = RemapRecord {
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
            };
            out.lines.push(r.line(d));
            out.remaps.push(r);
        }
        out
    }
}

fn give_back(leases: &Leases, l: &Lease) {
    if let Err(e) = leases.release(l.spare, &l.container_id) {
        log::error!(
            "cannot give back spare {} of {}: {e}",
            l.spare,
            l.container_id
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::device::DevType;

    #[test]
    fn systemd_needs_the_dev_char_link_to_the_spare() {
        let d = std::env::temp_dir().join(format!("devgate-devchar-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("char")).unwrap();
        let full = DevNum {
            typ: DevType::Char,
            major: 1,
            minor: 7,
        };
        let e = systemd_can_grant(&d, full).unwrap_err();
        assert!(e.contains("char/1:7 is missing"), "{e}");
        assert!(e.contains("daemon-reload"), "{e}");
        std::os::unix::fs::symlink("/dev/null", d.join("char/1:7")).unwrap();
        let e = systemd_can_grant(&d, full).unwrap_err();
        assert!(e.ends_with("char/1:7 is not c 1:7"), "{e}");
        std::fs::remove_file(d.join("char/1:7")).unwrap();
        std::os::unix::fs::symlink("/dev/full", d.join("char/1:7")).unwrap();
        assert_eq!(systemd_can_grant(&d, full), Ok(()));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
