//! The node's view for operators and Kubernetes tooling: every accelerator node, every
//! configured spare, every quarantined device and every device of a running container,
//! each with its probe verdicts. `status`, `check` and `metrics` are views of this list.

use crate::config::Config;
use crate::discover::devnode::{accelerators, find_host_node};
use crate::error::Result;
use crate::gpu::checks::{self, Check};
use crate::gpu::{nvml, GpuContext};
use crate::model::class::{self, Class, ClassRule};
use crate::model::device::{DevNum, Device};
use crate::model::verdict::{Code, ProbeResult, Verdict};
use crate::probe::{probe_all, HostNodes};
use crate::report::record;
use crate::store::lease::{Lease, Leases, Slot};
use crate::store::quarantine::{Entry, Ledger, Lookup};
use crate::store::records::{self, Kind};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub device: Device,
    /// accelerator, spare, quarantined, assigned
    pub roles: Vec<&'static str>,
    pub health: Health,
    pub verdicts: Vec<ProbeResult>,
    pub reasons: Vec<String>,
    pub quarantine: Option<Filed<Entry>>,
    pub lease: Option<Filed<Lease>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuStatus>,
}

/// A ledger file as `status` shows it: its content, or the file and why it is unreadable.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Filed<T> {
    Read(T),
    Damaged { damaged: PathBuf, error: String },
}

/// What NVML and the kernel log say about one GPU, check by check.
#[derive(Debug, Clone, Serialize)]
pub struct GpuStatus {
    pub minor: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    pub checks: Vec<Check>,
}

fn gpu_status(gpu: &GpuContext, device: &Device, verdicts: &[ProbeResult]) -> Option<GpuStatus> {
    if device.class != Class::NvidiaGpu {
        return None;
    }
    let minor = device.num.minor;
    let facts = gpu.nvml.gpu_by_minor(minor);
    let mut checks = match (&gpu.nvml.gpus, facts) {
        (_, Some(g)) => checks::checks(g, gpu.limits),
        (Err(why), None) => vec![Check {
            check: "nvml",
            verdict: Verdict::unknown(why.code(), why.to_string()),
        }],
        (Ok(_), None) => vec![Check {
            check: "nvml",
            verdict: Verdict::unhealthy(
                Code::GpuMissing,
                format!("no GPU with minor number {minor}"),
            ),
        }],
    };
    if let Some(x) = verdicts.iter().find(|v| v.probe == "xid") {
        checks.push(Check {
            check: "xid",
            verdict: x.verdict.clone(),
        });
    }
    Some(GpuStatus {
        minor,
        index: facts.map(|g| g.index),
        uuid: facts.and_then(|g| g.uuid.value().cloned()),
        pci_bus_id: facts.and_then(|g| g.pci_bus_id.value().map(|p| nvml::display_bus_id(p))),
        checks,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Healthy,
    /// Usable, with warn-level findings.
    Degraded,
    Unknown,
    Unhealthy,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Degraded => "degraded",
            Health::Unknown => "unknown",
            Health::Unhealthy => "unhealthy",
        }
    }

    pub fn of(verdicts: &[ProbeResult]) -> Health {
        verdicts
            .iter()
            .map(|r| match r.verdict {
                Verdict::Unhealthy(_) => Health::Unhealthy,
                Verdict::Unknown(_) => Health::Unknown,
                Verdict::Warn(_) => Health::Degraded,
                Verdict::Healthy | Verdict::NotApplicable(_) => Health::Healthy,
            })
            .max()
            .unwrap_or(Health::Healthy)
    }
}

/// Devices of containers devgate let start and has not yet seen stop.
fn assigned(config: &Config) -> Vec<Device> {
    let mut out = Vec::new();
    for id in records::ids(&config.state_dir, Kind::Start) {
        let id = id.as_str();
        let Ok(Some(rec)) = record::read_record(&config.state_dir, id) else {
            continue;
        };
        let stopped = matches!(record::read_exit(&config.state_dir, id), Ok(Some(_)));
        if rec.snapshot.is_none() || stopped || (rec.pid.is_some() && !rec.is_alive()) {
            continue;
        }
        out.extend(rec.devices.into_iter().map(|d| d.device));
    }
    out
}

/// Every device the node knows, gathered from each source in turn (accelerators, spares,
/// quarantine, running containers, leases), then probed all at once.
pub fn collect(config: &Config) -> Result<Vec<Row>> {
    let rules = config.class_rules();
    let ledger = Ledger::new(&config.quarantine_dir);
    let mut found = Found::default();
    for d in accelerators(&config.dev_root, &rules) {
        found.add(d, "accelerator");
    }
    for d in configured_spares(config) {
        found.add(d, "spare");
    }
    for d in quarantined(config, &ledger, &rules)? {
        found.add(d, "quarantined");
    }
    for d in assigned(config) {
        found.add(d, "assigned");
    }
    // Leases of spares no longer configured still show.
    let slots = Leases::new(&config.state_dir).list().unwrap_or_else(|e| {
        log::warn!("cannot list leases: {e}");
        Vec::new()
    });
    for (num, slot) in &slots {
        if let Slot::Held(l) = slot {
            found.add(
                Device::on_host(*num, l.class.clone(), Some(l.spare_path.clone())),
                "spare",
            );
        }
    }
    Ok(probed(config, &ledger, found, &slots))
}

/// The devices gathered so far, each once, with every role it was found in.
#[derive(Default)]
struct Found(Vec<(Device, Vec<&'static str>)>);

impl Found {
    fn add(&mut self, dev: Device, role: &'static str) {
        match self.0.iter_mut().find(|(d, _)| d.num == dev.num) {
            Some((_, roles)) => {
                if !roles.contains(&role) {
                    roles.push(role)
                }
            }
            None => self.0.push((dev, vec![role])),
        }
    }
}

/// The spares the config names that are device nodes; the others are logged.
fn configured_spares(config: &Config) -> Vec<Device> {
    let mut out = Vec::new();
    for (class, paths) in &config.spares {
        for p in paths {
            // A missing spare and a spare that is some other file are told apart: the
            // first is the common case (a node gone with its GPU, a typo in the config).
            match std::fs::metadata(p).map(|m| DevNum::from_metadata(&m)) {
                Ok(Some(num)) => out.push(Device::on_host(
                    num,
                    Class::from(class.as_str()),
                    Some(p.clone()),
                )),
                Ok(None) => {
                    log::warn!("spare {} (class {class}) is not a device node", p.display())
                }
                Err(e) => log::warn!(
                    "spare {} (class {class}): {}",
                    p.display(),
                    crate::error::Error::io("cannot stat", p, e)
                ),
            }
        }
    }
    out
}

/// The devices in the quarantine ledger, each at its host node where one is found.
fn quarantined(config: &Config, ledger: &Ledger, rules: &[ClassRule]) -> Result<Vec<Device>> {
    let mut out = Vec::new();
    for (num, _) in ledger.list()? {
        let host = find_host_node(&config.dev_root, &config.sysfs_root, num, &[]);
        let paths: Vec<&Path> = host.iter().map(PathBuf::as_path).collect();
        let class = class::classify(rules, num.typ, num.major, num.minor, &paths);
        out.push(Device::on_host(num, class, host));
    }
    Ok(out)
}

/// The devices found, probed all at once, each a row with its verdicts, its quarantine
/// entry, its lease and what NVML says of it.
fn probed(config: &Config, ledger: &Ledger, found: Found, slots: &[(DevNum, Slot)]) -> Vec<Row> {
    let devices: Vec<Device> = found.0.iter().map(|(d, _)| d.clone()).collect();
    let gpu = GpuContext::for_devices(config, &devices);
    let verdicts = probe_all(
        config,
        ledger,
        &devices,
        gpu.as_ref(),
        HostNodes::Unchecked,
        None,
    )
    .verdicts;
    found
        .0
        .into_iter()
        .zip(verdicts)
        .map(|((device, roles), verdicts)| {
            let quarantine = quarantine_of(ledger, device.num);
            let reasons = verdicts
                .iter()
                .filter(|r| !matches!(r.verdict, Verdict::Healthy | Verdict::NotApplicable(_)))
                .filter_map(|r| r.verdict.detail().map(|why| labelled(&r.probe, why)))
                .collect();
            Row {
                lease: lease_of(slots, device.num),
                gpu: gpu.as_ref().and_then(|g| gpu_status(g, &device, &verdicts)),
                health: Health::of(&verdicts),
                device,
                roles,
                verdicts,
                reasons,
                quarantine,
            }
        })
        .collect()
}

fn quarantine_of(ledger: &Ledger, num: DevNum) -> Option<Filed<Entry>> {
    match ledger.lookup(num) {
        Lookup::Clear => None,
        Lookup::Cordoned(e) => Some(Filed::Read(e)),
        Lookup::Damaged { path, error } => Some(Filed::Damaged {
            damaged: path,
            error,
        }),
    }
}

fn lease_of(slots: &[(DevNum, Slot)], num: DevNum) -> Option<Filed<Lease>> {
    match slots.iter().find(|(n, _)| *n == num).map(|(_, s)| s) {
        Some(Slot::Held(l)) => Some(Filed::Read(l.clone())),
        Some(Slot::Damaged { path, error }) => Some(Filed::Damaged {
            damaged: path.clone(),
            error: error.clone(),
        }),
        _ => None,
    }
}

/// How many devices past the first `check`'s line names, for it to stay one short line.
const MAX_OTHERS: usize = 4;

/// node-problem-detector's custom plugin contract: 0 ok, 1 problem, 2 unknown, and one
/// short line on stdout: the first device at the worst health with its reason, then the
/// others at that health by name.
pub fn check_summary(rows: &[Row]) -> (i32, String) {
    let worst = rows
        .iter()
        .map(|r| r.health)
        .max()
        .unwrap_or(Health::Healthy);
    let bad: Vec<&Row> = rows.iter().filter(|r| r.health == worst).collect();
    let first = bad.first().map(|r| {
        format!(
            "{}: {}",
            r.device.describe(),
            r.reasons.first().map(String::as_str).unwrap_or("")
        )
    });
    // The others by name, so that a page at 3 a.m. says which devices to look at.
    let others: Vec<String> = bad.iter().skip(1).map(|r| r.device.describe()).collect();
    let first = first.map(|f| match others.len() {
        0 => f,
        n if n <= MAX_OTHERS => format!("{f}; also {}", others.join(", ")),
        n => format!(
            "{f}; also {} and {} more",
            others[..MAX_OTHERS].join(", "),
            n - MAX_OTHERS
        ),
    });
    match (worst, first) {
        (Health::Unhealthy, Some(f)) => (
            1,
            format!(
                "devgate: {} of {} devices unhealthy: {f}",
                bad.len(),
                rows.len()
            ),
        ),
        (Health::Unknown, Some(f)) => (
            2,
            format!(
                "devgate: {} of {} devices unknown: {f}",
                bad.len(),
                rows.len()
            ),
        ),
        _ => (0, format!("devgate: ok: {} devices healthy", rows.len())),
    }
}

/// `probe: reason`, unless the probe already named itself (the NVML and XID reasons do).
fn labelled(probe: &str, why: &str) -> String {
    match why.strip_prefix(probe) {
        Some(rest) if rest.starts_with(": ") => why.to_string(),
        _ => format!("{probe}: {why}"),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn reasons_name_their_probe_once() {
        assert_eq!(
            labelled("xid", "xid: xid 79 on 0000:3b:00"),
            "xid: xid 79 on 0000:3b:00"
        );
        assert_eq!(labelled("sysfs", "AER fatal 2"), "sysfs: AER fatal 2");
        assert_eq!(labelled("nvml", "nvmlish"), "nvml: nvmlish");
    }
    use super::*;
    use crate::model::device::DevType;

    fn row(health: Health, reason: &str) -> Row {
        Row {
            device: Device::on_host(
                DevNum {
                    typ: DevType::Char,
                    major: 195,
                    minor: 1,
                },
                Class::NvidiaGpu,
                Some("/dev/nvidia1".into()),
            ),
            roles: vec!["accelerator", "spare"],
            health,
            verdicts: vec![],
            reasons: vec![reason.into()],
            quarantine: None,
            lease: None,
            gpu: None,
        }
    }

    #[test]
    fn check_exit_codes_follow_npd_contract() {
        assert_eq!(check_summary(&[]).0, 0);
        assert_eq!(
            check_summary(&[row(Health::Healthy, ""), row(Health::Degraded, "w")]).0,
            0
        );
        let (code, line) = check_summary(&[
            row(Health::Healthy, ""),
            row(Health::Unknown, "nvml: no library"),
        ]);
        assert_eq!(code, 2);
        assert_eq!(
            line,
            "devgate: 1 of 2 devices unknown: /dev/nvidia1 (195:1): nvml: no library"
        );
        let mut more: Vec<Row> = (2..8)
            .map(|m| {
                let mut r = row(Health::Unhealthy, "xid: 79");
                r.device.num.minor = m;
                r.device.host_path = Some(format!("/dev/nvidia{m}").into());
                r
            })
            .collect();
        more.insert(0, row(Health::Healthy, ""));
        assert_eq!(
            check_summary(&more[..3]).1,
            "devgate: 2 of 3 devices unhealthy: /dev/nvidia2 (195:2): xid: 79; also \
             /dev/nvidia3 (195:3)"
        );
        assert_eq!(
            check_summary(&more).1,
            "devgate: 6 of 7 devices unhealthy: /dev/nvidia2 (195:2): xid: 79; also \
             /dev/nvidia3 (195:3), /dev/nvidia4 (195:4), /dev/nvidia5 (195:5), \
             /dev/nvidia6 (195:6) and 1 more"
        );
        let (code, line) = check_summary(&[
            row(Health::Unknown, "u"),
            row(Health::Unhealthy, "quarantine: x"),
        ]);
        assert_eq!(code, 1);
        assert!(
            line.starts_with(
                "devgate: 1 of 2 devices unhealthy: /dev/nvidia1 (195:1): quarantine: x"
            ),
            "{line}"
        );
    }

    /// Each finding is one `devgate_device_reason` series with its probe, status and code;
    /// healthy and not-applicable verdicts have none.
    #[test]
    fn metrics_carry_each_findings_code() {
        let res = |probe: &str, verdict| ProbeResult {
            probe: probe.into(),
            verdict,
        };
        let mut r = row(Health::Unhealthy, "x");
        r.verdicts = vec![
            res("node", Verdict::Healthy),
            res("sysfs", Verdict::not_applicable(Code::NoSysfsEntry, "n")),
            res("nvml", Verdict::unhealthy(Code::GpuLost, "lost")),
            res("pcie", Verdict::warn(Code::AerCorrectable, "w")),
        ];
        let text = crate::report::metrics::metrics_text(&[r], &[], None);
        assert!(
            text.contains("# TYPE devgate_device_reason gauge\n"),
            "{text}"
        );
        let dev = "device=\"/dev/nvidia1\",class=\"nvidia-gpu\",major_minor=\"195:1\"";
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("devgate_device_reason{"))
            .collect();
        assert_eq!(
            series,
            [
                format!("devgate_device_reason{{{dev},probe=\"nvml\",status=\"unhealthy\",code=\"gpu_lost\"}} 1"),
                format!("devgate_device_reason{{{dev},probe=\"pcie\",status=\"warn\",code=\"aer_correctable\"}} 1"),
            ]
        );
    }

    #[test]
    fn metrics_are_prometheus_text() {
        let mut r = row(Health::Unhealthy, "x");
        r.device.host_path = Some("/dev/we\"ird".into());
        let text = crate::report::metrics::metrics_text(&[r], &[], None);
        assert!(text.contains("# TYPE devgate_device_healthy gauge\n"));
        assert!(text.contains("devgate_device_healthy{device=\"/dev/we\\\"ird\",class=\"nvidia-gpu\",major_minor=\"195:1\"} 0\n"), "{text}");
        assert!(text.contains("health=\"unhealthy\"} 1\n"));
        assert!(text.contains("devgate_spare_leased{"));
        assert!(text.contains("devgate_exit_records 0\n"), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, v) = line.rsplit_once(' ').unwrap();
            v.parse::<f64>().unwrap();
        }
    }
}
