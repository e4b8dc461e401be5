//! Spares: which configured spares of a class are healthy enough to stand in for a bad
//! device (probed and judged like any assigned device), and giving a container's back.

use crate::config::Config;
use crate::model::class::Class;
use crate::model::device::{DevNum, Device};
use crate::model::verdict::Verdict;
use crate::policy::{self, Disposition};
use crate::probe::{self, nvidia::GpuContext};
use crate::store::lease::{Lease, Leases};
use crate::store::quarantine::Ledger;
use std::path::{Path, PathBuf};

/// The device as a spare: its host node, probed like any assigned device.
fn spare_device(path: &Path, class: &Class) -> std::result::Result<Device, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let num = DevNum::from_metadata(&meta)
        .ok_or_else(|| format!("{} is not a device node", path.display()))?;
    Ok(Device::on_host(
        num,
        class.clone(),
        Some(path.to_path_buf()),
    ))
}

/// The configured spares of `class` that pass every probe, and a clause for each that
/// does not. A spare is usable when no probe finds it unhealthy and the policy would let it
/// start (an unknown verdict under `on_unknown: allow` is usable).
/// Long because it is one probe pass over every spare, on an NVML context that may be
/// opened here (`owned` lives in this frame), then each spare sorted into usable or a
/// clause.
pub fn healthy_spares(
    config: &Config,
    ledger: &Ledger,
    class: &Class,
    exclude: &[DevNum],
    gpu: Option<&GpuContext>,
) -> (Vec<(DevNum, PathBuf)>, Vec<String>) {
    let mut why = Vec::new();
    let mut devices = Vec::new();
    for path in config
        .spares
        .get(class.as_str())
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        match spare_device(path, class) {
            Ok(d) if exclude.contains(&d.num) => {}
            Ok(d) => devices.push(d),
            Err(m) => why.push(format!("spare {m}")),
        }
    }
    // One probe pass for every spare, on the gate's NVML answer when it covers them;
    // else NVML is asked about the spares alone.
    let owned;
    let covered = |g: &GpuContext| {
        crate::probe::nvidia::gpu_minors(&devices)
            .iter()
            .all(|m| g.covers(*m))
    };
    let gpu = match gpu {
        Some(g) if covered(g) => Some(g),
        _ => {
            owned = GpuContext::for_devices(config, &devices);
            owned.as_ref()
        }
    };
    let mut ok = Vec::new();
    let verdicts =
        probe::probe_all(config, ledger, &devices, gpu, probe::HostNodes::Unchecked).verdicts;
    for dec in policy::decide_all(devices, verdicts, &config.policy) {
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
    fn unhealthy_and_missing_spares_are_named() {
        let dir = crate::fsutil::tests::tempdir("devgate-remap-sp");
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
        let full = spare_device(Path::new("/dev/full"), &Class::Char)
            .unwrap()
            .num;
        ledger.cordon(full, None, "bad spare", "t").unwrap();
        let (ok, why) = healthy_spares(&config, &ledger, &Class::Char, &[], None);
        assert_eq!(ok.len(), 1, "{ok:?} {why:?}");
        assert_eq!(ok[0].1, PathBuf::from("/dev/urandom"));
        assert!(
            why.iter()
                .any(|w| w.starts_with("/dev/full unhealthy: quarantined")),
            "{why:?}"
        );
        assert!(why.iter().any(|w| w.contains("/nonexistent/x")), "{why:?}");
        let (ok, _) = healthy_spares(&config, &ledger, &Class::Char, &[ok[0].0], None);
        assert!(ok.is_empty());
    }
}
