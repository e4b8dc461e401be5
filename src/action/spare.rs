//! Spares: which configured spares of a class are healthy enough to stand in for a bad
//! device (probed and judged like any assigned device), choosing and leasing one, and
//! giving a container's back.
//!
//! [`lease_spare`] is the one path by which a spare is chosen and leased: the hook-time
//! remap (`action::remap`) and the runtime wrapper's (`wrapper::remap_spec`) both take it,
//! and differ only in what they do with the lease (edit the cgroup and /dev, or the spec).

use crate::config::Config;
use crate::error::{Error, IoCause};
use crate::gpu::GpuContext;
use crate::model::class::Class;
use crate::model::clock;
use crate::model::device::{DevNum, Device};
use crate::model::verdict::Verdict;
use crate::policy::{self, Disposition};
use crate::probe;
use crate::store::lease::{Lease, Leases, Outcome};
use crate::store::quarantine::Ledger;
use std::fmt;
use std::path::{Path, PathBuf};

/// The device as a spare: its host node, probed like any assigned device.
fn spare_device(path: &Path, class: &Class) -> std::result::Result<Device, SpareError> {
    let meta = std::fs::metadata(path).map_err(|e| SpareError::Stat {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let num = DevNum::from_metadata(&meta).ok_or_else(|| SpareError::NotDevice {
        path: path.to_path_buf(),
    })?;
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
        crate::gpu::gpu_minors(&devices)
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
    let verdicts = probe::probe_all(
        config,
        ledger,
        &devices,
        gpu,
        probe::HostNodes::Unchecked,
        None,
    )
    .verdicts;
    for dec in policy::decide_all(devices, verdicts, &config.policy) {
        let bad: Vec<&str> = dec
            .verdicts
            .iter()
            .filter_map(|v| match &v.verdict {
                Verdict::Unhealthy(r) => Some(r.detail.as_str()),
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

/// Who will hold a spare: the process the lease names, and the runtime's state directory
/// when the lease is taken before the container has a process (the runtime wrapper).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    pub pid_start: Option<u64>,
    pub runtime_state: Option<PathBuf>,
}

/// How the spare will reach the container's device cgroup; it decides which healthy
/// spares can be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// The hook's edit, or a spec rule the runtime writes itself: any healthy spare.
    Cgroup,
    /// systemd's `DeviceAllow=`, under the runtime's systemd cgroup driver: only a spare
    /// whose /dev/char (/dev/block) link names it ([`systemd_can_grant`]).
    SystemdDeviceAllow,
}

/// A spare wanted for one device of one container.
#[derive(Debug)]
pub struct SpareRequest<'a> {
    pub device: &'a Device,
    pub container_id: &'a str,
    pub holder: Holder,
    /// Spares already leased for this container's other devices.
    pub taken: &'a [DevNum],
    pub grant: Grant,
}

/// A spare leased for a request.
#[derive(Debug)]
pub struct Leased {
    pub lease: Lease,
    /// The lease of a container that no longer exists, taken over.
    pub reclaimed: Option<Lease>,
}

/// Why no spare was leased. Rendered by `Display`, the only place these texts are made.
#[derive(Debug)]
pub enum NoSpare {
    /// The configuration names no spare for the class.
    NotConfigured(Class),
    /// The lease store could not be read or written.
    Store(Error),
    /// Every spare of the class is leased, unhealthy, damaged or not a node: one clause
    /// for each.
    NoneFree { class: Class, why: Vec<String> },
}

impl fmt::Display for NoSpare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoSpare::NotConfigured(class) => write!(f, "no spare configured for class {class}"),
            NoSpare::Store(e) => write!(f, "cannot lease a spare: {e}"),
            NoSpare::NoneFree { class, why } => {
                write!(f, "no free healthy spare of class {class}")?;
                if !why.is_empty() {
                    write!(f, " ({})", why.join("; "))?;
                }
                Ok(())
            }
        }
    }
}

/// Under the systemd cgroup driver runc passes each allowed device to systemd as
/// `DeviceAllow=/dev/char/MAJ:MIN` (`/dev/block/…`) and leaves out a device whose link is
/// missing: systemd's next daemon-reload would then take the spare away. The link must
/// exist and name the spare.
pub fn systemd_can_grant(dev_root: &Path, num: DevNum) -> Result<(), SpareError> {
    let link = dev_root
        .join(num.typ.sysfs_dir())
        .join(format!("{}:{}", num.major, num.minor));
    match std::fs::metadata(&link) {
        Ok(m) if DevNum::from_metadata(&m) == Some(num) => Ok(()),
        Ok(_) => Err(SpareError::WrongLink { link, num }),
        Err(e) => Err(SpareError::NoLink {
            link,
            source: e.into(),
        }),
    }
}

/// Why a configured spare cannot stand in: its node, or (under the systemd cgroup driver)
/// its /dev/char (/dev/block) link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpareError {
    /// The configured path cannot be stat'ed.
    Stat { path: PathBuf, source: IoCause },
    /// The configured path is not a device node.
    NotDevice { path: PathBuf },
    /// The link resolves to another device than `num`.
    WrongLink { link: PathBuf, num: DevNum },
    /// The link is missing (or does not resolve).
    NoLink { link: PathBuf, source: IoCause },
}

impl fmt::Display for SpareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpareError::Stat { path, source } => write!(f, "{}: {source}", path.display()),
            SpareError::NotDevice { path } => write!(f, "{} is not a device node", path.display()),
            SpareError::WrongLink { link, num } => {
                write!(f, "{} is not {} {num}", link.display(), num.typ.letter())
            }
            SpareError::NoLink { link, source } => write!(
                f,
                "{} is missing ({source}); under the systemd cgroup driver runc grants a device \
                 through DeviceAllow= on that path and skips it when absent, so systemd would \
                 take the spare away at its next daemon-reload",
                link.display()
            ),
        }
    }
}

impl std::error::Error for SpareError {}

/// The healthy spares `grant` can give, and a clause for each it cannot.
fn grantable(
    cands: Vec<(DevNum, PathBuf)>,
    grant: Grant,
    dev_root: &Path,
) -> (Vec<(DevNum, PathBuf)>, Vec<String>) {
    let mut why = Vec::new();
    let mut ok = cands;
    if grant == Grant::SystemdDeviceAllow {
        ok.retain(|(num, path)| match systemd_can_grant(dev_root, *num) {
            Ok(()) => true,
            Err(m) => {
                why.push(format!("{}: {m}", path.display()));
                false
            }
        });
    }
    (ok, why)
}

/// The lease the request asks for; the store fills in which spare.
fn wanted_lease(req: &SpareRequest, (since_unix, since): (u64, String)) -> Lease {
    Lease {
        spare: req.device.num,
        spare_path: PathBuf::new(),
        class: req.device.class.clone(),
        container_id: req.container_id.to_string(),
        pid: req.holder.pid,
        pid_start: req.holder.pid_start,
        replaces: req.device.num,
        container_path: req.device.container_path.clone(),
        runtime_state: req.holder.runtime_state.clone(),
        since,
        since_unix,
    }
}

/// What the store's answer comes to: a lease, or every reason each spare was passed over
/// (`why`, those found before the store was asked, first).
fn settle(outcome: Outcome, class: &Class, mut why: Vec<String>) -> Result<Leased, NoSpare> {
    match outcome {
        Outcome::Leased {
            lease, reclaimed, ..
        } => Ok(Leased { lease, reclaimed }),
        Outcome::NoneFree(busy) => {
            why.extend(busy);
            Err(NoSpare::NoneFree {
                class: class.clone(),
                why,
            })
        }
    }
}

/// Chooses a healthy free spare for the request and leases it, or says why there is none.
/// The one place a remap takes a spare, for the hook and the runtime wrapper alike.
pub fn lease_spare(
    config: &Config,
    ledger: &Ledger,
    gpu: Option<&GpuContext>,
    leases: &Leases,
    req: &SpareRequest,
) -> Result<Leased, NoSpare> {
    let class = &req.device.class;
    if !config.spares.contains_key(class.as_str()) {
        return Err(NoSpare::NotConfigured(class.clone()));
    }
    let mut exclude = req.taken.to_vec();
    exclude.push(req.device.num);
    let (cands, mut why) = healthy_spares(config, ledger, class, &exclude, gpu);
    let (cands, refused) = grantable(cands, req.grant, &config.dev_root);
    why.extend(refused);
    let want = wanted_lease(req, clock::now());
    let outcome = leases.acquire(&cands, &want).map_err(NoSpare::Store)?;
    settle(outcome, class, why)
}

/// Gives back a spare leased for a container that will not start with it. Logged, never
/// fails: the container is rejected already.
pub fn give_back(leases: &Leases, spare: DevNum, container_id: &str) {
    if let Err(e) = leases.release(spare, container_id) {
        log::error!("cannot give back spare {spare} of {container_id}: {e}");
    }
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
    use crate::model::device::DevType;

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

    #[test]
    fn systemd_needs_the_dev_char_link_to_the_spare() {
        let d = crate::fsutil::tests::tempdir("devgate-devchar");
        std::fs::create_dir_all(d.join("char")).unwrap();
        let full = DevNum {
            typ: DevType::Char,
            major: 1,
            minor: 7,
        };
        let e = systemd_can_grant(&d, full).unwrap_err();
        assert!(matches!(e, SpareError::NoLink { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("char/1:7 is missing"), "{e}");
        assert!(e.contains("daemon-reload"), "{e}");
        std::os::unix::fs::symlink("/dev/null", d.join("char/1:7")).unwrap();
        let e = systemd_can_grant(&d, full).unwrap_err();
        assert_eq!(
            e,
            SpareError::WrongLink {
                link: d.join("char/1:7"),
                num: full
            }
        );
        assert!(e.to_string().ends_with("char/1:7 is not c 1:7"), "{e}");
        std::fs::remove_file(d.join("char/1:7")).unwrap();
        std::os::unix::fs::symlink("/dev/full", d.join("char/1:7")).unwrap();
        assert_eq!(systemd_can_grant(&d, full), Ok(()));
        // Under systemd a spare without its link is passed over, naming why.
        let (ok, why) = grantable(
            vec![(full, "/dev/full".into())],
            Grant::SystemdDeviceAllow,
            &d.join("elsewhere"),
        );
        assert!(ok.is_empty());
        assert!(why[0].starts_with("/dev/full: "), "{why:?}");
        let (ok, why) = grantable(vec![(full, "/dev/full".into())], Grant::Cgroup, &d);
        assert_eq!((ok.len(), why.len()), (1, 0));
    }

    fn num(minor: u32) -> DevNum {
        DevNum {
            typ: DevType::Char,
            major: 1,
            minor,
        }
    }

    #[test]
    fn no_spare_renders_each_reason_once() {
        assert_eq!(
            NoSpare::NotConfigured(Class::Char).to_string(),
            "no spare configured for class char"
        );
        let none = |why: &[&str]| NoSpare::NoneFree {
            class: Class::Char,
            why: why.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(none(&[]).to_string(), "no free healthy spare of class char");
        assert_eq!(
            none(&["a unhealthy: x", "b leased to c since t"]).to_string(),
            "no free healthy spare of class char (a unhealthy: x; b leased to c since t)"
        );
    }

    #[test]
    fn the_request_becomes_the_wanted_lease_and_the_answer_a_lease_or_why() {
        let mut dev = Device::on_host(num(5), Class::Char, Some("/dev/zero".into()));
        dev.container_path = Some("/dev/zero".into());
        let req = SpareRequest {
            device: &dev,
            container_id: "c1",
            holder: Holder {
                pid: 42,
                pid_start: Some(7),
                runtime_state: Some("/run/runc/c1".into()),
            },
            taken: &[],
            grant: Grant::Cgroup,
        };
        let want = wanted_lease(&req, (9, "t".into()));
        assert_eq!(
            (
                want.replaces,
                want.container_id.as_str(),
                want.pid,
                want.pid_start
            ),
            (num(5), "c1", 42, Some(7))
        );
        assert_eq!(want.runtime_state, Some("/run/runc/c1".into()));
        assert_eq!((want.since.as_str(), want.since_unix), ("t", 9));
        assert_eq!(want.container_path, Some("/dev/zero".into()));
        let got = settle(
            Outcome::Leased {
                lease: want.clone(),
                reclaimed: None,
                reused: true,
            },
            &Class::Char,
            vec!["ignored".into()],
        )
        .unwrap();
        assert_eq!(got.lease, want);
        // Clauses found before the store was asked come first, then the store's.
        match settle(
            Outcome::NoneFree(vec!["busy".into()]),
            &Class::Char,
            vec!["sick".into()],
        ) {
            Err(NoSpare::NoneFree { class, why }) => {
                assert_eq!(
                    (class, why),
                    (Class::Char, vec!["sick".into(), "busy".into()])
                )
            }
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn a_class_without_spares_leases_nothing() {
        let dir = crate::fsutil::tests::tempdir("devgate-remap-nospare");
        let config = Config {
            quarantine_dir: dir.join("q"),
            state_dir: dir.join("s"),
            ..Config::default()
        };
        let dev = Device::on_host(num(5), Class::Char, Some("/dev/zero".into()));
        let req = SpareRequest {
            device: &dev,
            container_id: "c1",
            holder: Holder {
                pid: 1,
                pid_start: None,
                runtime_state: None,
            },
            taken: &[],
            grant: Grant::Cgroup,
        };
        let got = lease_spare(
            &config,
            &Ledger::new(&config.quarantine_dir),
            None,
            &Leases::new(&config.state_dir),
            &req,
        );
        assert!(
            matches!(got, Err(NoSpare::NotConfigured(Class::Char))),
            "{got:?}"
        );
        assert!(!config.state_dir.exists(), "no lease store touched");
    }
}
