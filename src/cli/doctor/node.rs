//! The node's side: devgate's directories, the cgroup mode and driver, NVML and the GPUs,
//! the spares, and the kernel log. Pure judges first in each part, then the reader.

use crate::model::device::{DevNum, DevType};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Directories devgate (root) writes into: every component of the path must be root's and
// writable by nobody else, or someone else could swap what root writes through.

/// Checks the whole path of a directory devgate writes into (the runtime's own check,
/// fsutil::check_path). Ok: a note for the ✓ line.
pub fn check_safe_dir(dir: &Path) -> Result<String, String> {
    match crate::fsutil::check_path(dir) {
        Ok(crate::fsutil::DirState::Present) => {
            Ok("every directory on its path is root's and not writable by others".into())
        }
        Ok(crate::fsutil::DirState::Absent) => Ok("absent; devgate creates it".into()),
        Err(e) => Err(e.to_string()),
    }
}

// ---------------------------------------------------------------------------------------
// cgroup mode, decided as runc and crun decide it: statfs of /sys/fs/cgroup.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    Unified,
    Hybrid,
    Legacy,
}

pub fn cgroup_mode(top_is_cgroup2: bool, unified_is_cgroup2: bool) -> CgroupMode {
    match (top_is_cgroup2, unified_is_cgroup2) {
        (true, _) => CgroupMode::Unified,
        (false, true) => CgroupMode::Hybrid,
        (false, false) => CgroupMode::Legacy,
    }
}

pub fn describe_cgroup_mode(mode: CgroupMode, top: &Path) -> String {
    match mode {
        CgroupMode::Unified => format!("v2 ({} is cgroup2)", top.display()),
        CgroupMode::Hybrid => format!(
            "v1, hybrid ({} is not cgroup2; cgroup2 at {})",
            top.display(),
            top.join("unified").display()
        ),
        CgroupMode::Legacy => format!("v1 ({} is not cgroup2)", top.display()),
    }
}

pub fn read_cgroup_mode(sysfs_root: &Path) -> Result<(CgroupMode, PathBuf), String> {
    let top = sysfs_root.join("fs/cgroup");
    let is_cgroup2 = |p: &Path| {
        nix::sys::statfs::statfs(p)
            .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
    };
    let top_v2 = is_cgroup2(&top).map_err(|e| format!("cannot statfs {}: {e}", top.display()))?;
    let unified_v2 = !top_v2 && is_cgroup2(&top.join("unified")).unwrap_or(false);
    Ok((cgroup_mode(top_v2, unified_v2), top))
}

/// One configuration's say on the cgroup driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverVote {
    pub source: String,
    pub driver: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverVerdict {
    /// Nothing on the node says.
    Unknown,
    /// Every configuration says the same: the driver, and who said it.
    Agreed(String, String),
    /// The runtimes differ, and no kubelet (or one agreeing with some of them) decides
    /// which matters: not an error by itself, only one runtime serves kubelet.
    Mixed(String),
    /// kubelet's driver is one no runtime uses: kubelet and its runtime disagree.
    Conflict(String),
}

pub fn decide_driver(kubelet: Option<&DriverVote>, runtimes: &[DriverVote]) -> DriverVerdict {
    let all: Vec<&DriverVote> = kubelet.into_iter().chain(runtimes).collect();
    let Some(first) = all.first() else {
        return DriverVerdict::Unknown;
    };
    if all.iter().all(|v| v.driver == first.driver) {
        let how: Vec<&str> = all.iter().map(|v| v.source.as_str()).collect();
        return DriverVerdict::Agreed(first.driver.clone(), how.join("; "));
    }
    let how: Vec<String> = all
        .iter()
        .map(|v| format!("{} means {}", v.source, v.driver))
        .collect();
    match kubelet {
        Some(k) if runtimes.iter().all(|r| r.driver != k.driver) => {
            DriverVerdict::Conflict(how.join("; "))
        }
        _ => DriverVerdict::Mixed(how.join("; ")),
    }
}

// ---------------------------------------------------------------------------------------
// NVML: on a thread of its own with a deadline, as the hook does (a dying GPU can make
// NVML block for minutes).

/// Set when doctor's NVML thread is left running past its deadline; the process must then
/// leave with _exit (see probe::nvml for why).
static ABANDONED: AtomicBool = AtomicBool::new(false);

pub fn nvml_abandoned() -> bool {
    ABANDONED.load(Ordering::SeqCst)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub bus_id: Option<String>,
    pub minor: Option<u32>,
    /// Ok(on) or why it could not be read.
    pub persistence: Result<bool, String>,
    /// Why NVML gave no handle for this index.
    pub unreachable: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlAnswer {
    Gpus {
        driver: Option<String>,
        gpus: Vec<GpuInfo>,
    },
    /// `no_driver`: the library is missing or says no driver is loaded.
    Failed { error: String, no_driver: bool },
}

pub fn nvml_inventory(library: &Path, timeout: Duration) -> NvmlAnswer {
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    let lib = library.as_os_str().to_owned();
    let spawned = std::thread::Builder::new()
        .name("devgate-doctor-nvml".into())
        .spawn(move || nvml_thread(&lib, &tx));
    if let Err(e) = spawned {
        return NvmlAnswer::Failed {
            error: format!("cannot start the NVML thread: {e}"),
            no_driver: false,
        };
    }
    let answer = match rx.recv_timeout(timeout) {
        Ok(Some(a)) => a,
        Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            return NvmlAnswer::Failed {
                error: "the NVML thread ended without an answer (the library crashed)".into(),
                no_driver: false,
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            ABANDONED.store(true, Ordering::SeqCst);
            return NvmlAnswer::Failed {
                error: format!("NVML did not answer in {} ms", timeout.as_millis()),
                no_driver: false,
            };
        }
    };
    if matches!(answer, NvmlAnswer::Gpus { .. }) {
        // The thread sends None once nvmlShutdown returned.
        let left = timeout.saturating_sub(started.elapsed());
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(left) {
            ABANDONED.store(true, Ordering::SeqCst);
        }
    }
    answer
}

fn nvml_thread(library: &OsString, tx: &mpsc::Sender<Option<NvmlAnswer>>) {
    let nvml = match Nvml::builder().lib_path(library).init() {
        Ok(n) => n,
        Err(e) => {
            let no_driver = matches!(
                e,
                NvmlError::LibloadingError(_)
                    | NvmlError::DriverNotLoaded
                    | NvmlError::LibraryNotFound
            );
            let lib = library.to_string_lossy();
            let error = match &e {
                NvmlError::LibloadingError(le) => format!("cannot load {lib}: {le}"),
                other => format!("NVML init failed ({lib}): {other}"),
            };
            let _ = tx.send(Some(NvmlAnswer::Failed { error, no_driver }));
            return;
        }
    };
    let answer = match nvml.device_count() {
        Err(e) => NvmlAnswer::Failed {
            error: format!("NVML cannot count GPUs: {e}"),
            no_driver: false,
        },
        Ok(n) if n > 256 => NvmlAnswer::Failed {
            error: format!("NVML reports {n} GPUs, more than any node has"),
            no_driver: false,
        },
        Ok(n) => NvmlAnswer::Gpus {
            driver: nvml.sys_driver_version().ok(),
            gpus: (0..n).map(|i| gpu_info(&nvml, i)).collect(),
        },
    };
    let _ = tx.send(Some(answer));
    // nvml-wrapper's Drop calls nvmlShutdown unchecked; a library without it stays loaded.
    if nvml.lib().nvmlShutdown.is_ok() {
        drop(nvml);
    } else {
        std::mem::forget(nvml);
    }
    let _ = tx.send(None);
}

fn gpu_info(nvml: &Nvml, index: u32) -> GpuInfo {
    let dev = match nvml.device_by_index(index) {
        Ok(d) => d,
        Err(e) => {
            return GpuInfo {
                index,
                name: None,
                uuid: None,
                bus_id: None,
                minor: None,
                persistence: Err(e.to_string()),
                unreachable: Some(e.to_string()),
            }
        }
    };
    GpuInfo {
        index,
        name: dev.name().ok(),
        uuid: dev.uuid().ok(),
        bus_id: dev
            .pci_info()
            .ok()
            .map(|p| crate::probe::nvidia::nvml::display_bus_id(&p.bus_id)),
        minor: dev.minor_number().ok(),
        persistence: dev.is_in_persistent_mode().map_err(|e| match e {
            NvmlError::NotSupported => "not supported".to_string(),
            other => other.to_string(),
        }),
        unreachable: None,
    }
}

/// `/dev/nvidiactl` or any `/dev/nvidiaN`: the driver's nodes are there.
pub fn has_nvidia_nodes(dev_root: &Path) -> bool {
    fs::symlink_metadata(dev_root.join("nvidiactl")).is_ok()
        || !crate::discover::gpu::gpu_minor_nodes(dev_root).is_empty()
}

pub fn describe_gpu(g: &GpuInfo) -> String {
    let mut parts = vec![g.name.clone().unwrap_or_else(|| "unnamed".into())];
    if let Some(b) = &g.bus_id {
        parts.push(b.clone());
    }
    if let Some(u) = &g.uuid {
        parts.push(u.clone());
    }
    if let Some(m) = g.minor {
        parts.push(format!("/dev/nvidia{m}"));
    }
    parts.join(", ")
}

// ---------------------------------------------------------------------------------------
// Spares: the device, and the /dev/char (or /dev/block) link systemd needs.

/// A spare's device number, or why it is not a usable device.
pub fn spare_device(path: &Path) -> Result<DevNum, String> {
    let meta = fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => format!("{} does not exist", path.display()),
        _ => format!("cannot stat {}: {e}", path.display()),
    })?;
    DevNum::from_metadata(&meta).ok_or_else(|| format!("{} is not a device node", path.display()))
}

/// The /dev/char/MAJ:MIN (or /dev/block) name for `num` under `dev_root`.
pub fn dev_link(dev_root: &Path, num: DevNum) -> PathBuf {
    let dir = match num.typ {
        DevType::Char => "char",
        DevType::Block => "block",
    };
    dev_root.join(dir).join(num.to_string())
}

/// Ok: the link resolves to the spare's own device. Err: what is wrong with it.
pub fn check_dev_link(link: &Path, num: DevNum) -> Result<(), String> {
    match fs::symlink_metadata(link) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(format!("{} is missing", link.display()))
        }
        Err(e) => return Err(format!("cannot stat {}: {e}", link.display())),
        Ok(_) => {}
    }
    match fs::metadata(link)
        .ok()
        .and_then(|m| DevNum::from_metadata(&m))
    {
        Some(n) if n == num => Ok(()),
        Some(n) => Err(format!(
            "{} resolves to {} {n}, not the spare",
            link.display(),
            n.typ.letter()
        )),
        None => Err(format!("{} does not resolve to a device", link.display())),
    }
}

/// The command that makes the link: NVIDIA's tool for its nodes (which nvidia-modprobe
/// makes without udev, so they never get one), `ln -s` otherwise.
pub fn dev_link_fix(spare: &Path, link: &Path, dev_root: &Path, class: &str) -> String {
    let target = match spare.strip_prefix(dev_root) {
        Ok(rel) => format!("../{}", rel.display()),
        Err(_) => spare.display().to_string(),
    };
    let ln = format!("ln -s {target} {}", link.display());
    if class == crate::model::class::Class::NvidiaGpu.as_str() {
        format!("nvidia-ctk system create-dev-char-symlinks --create-all (or {ln}), at every boot")
    } else {
        format!("{ln}, at every boot (a udev rule does it for devices udev creates)")
    }
}

// ---------------------------------------------------------------------------------------
// Spares hidden from the device plugin. kubelet checkpoints the devices each plugin
// registered (RegisteredDevices, resource → device ids) in
// /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint. NVIDIA's plugin names a GPU
// by its UUID (default device-id-strategy), or by its index; time-sliced replicas as
// `UUID::N`.

#[derive(Deserialize)]
struct Checkpoint {
    #[serde(rename = "Data")]
    data: CheckpointData,
}

#[derive(Deserialize)]
struct CheckpointData {
    #[serde(rename = "RegisteredDevices", default)]
    registered: Option<BTreeMap<String, Vec<String>>>,
}

/// resource name → device ids, the NVIDIA ones only (`nvidia.com/…`).
pub fn nvidia_registered(text: &str) -> Result<BTreeMap<String, Vec<String>>, String> {
    let c: Checkpoint =
        serde_json::from_str(text).map_err(|e| format!("not a kubelet checkpoint: {e}"))?;
    Ok(c.data
        .registered
        .unwrap_or_default()
        .into_iter()
        .filter(|(r, _)| r.starts_with("nvidia.com/"))
        .collect())
}

/// The resource that advertises the GPU with this UUID or index, if any.
pub fn advertised_as<'a>(
    registered: &'a BTreeMap<String, Vec<String>>,
    uuid: &str,
    index: u32,
) -> Option<&'a str> {
    let idx = index.to_string();
    registered.iter().find_map(|(res, ids)| {
        ids.iter()
            .any(|id| {
                let base = id.split("::").next().unwrap_or(id);
                base.eq_ignore_ascii_case(uuid) || base == idx
            })
            .then_some(res.as_str())
    })
}

// ---------------------------------------------------------------------------------------
// The kernel log: opened the way the hook opens it, one record read.

pub fn read_one_kmsg_record(path: &Path) -> Result<String, String> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // Larger than the kernel's largest record, or /dev/kmsg answers EINVAL.
    let mut buf = vec![0u8; 64 << 10];
    loop {
        return match f.read(&mut buf) {
            Ok(0) => Ok("readable (empty)".into()),
            Ok(_) => Ok("readable".into()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok("readable (no records)".into()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // The oldest records were overwritten: readable all the same.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => Ok("readable".into()),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_dir_notes() {
        // The rules themselves are tested in fsutil; doctor only words the outcome.
        let d = std::env::temp_dir().join(format!("dg-doctor-unit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("state")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(d.join("state"), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_safe_dir(&d.join("state"))
            .unwrap()
            .starts_with("every directory"));
        assert_eq!(
            check_safe_dir(&d.join("new")).unwrap(),
            "absent; devgate creates it"
        );
        fs::set_permissions(d.join("state"), fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_safe_dir(&d.join("state")).unwrap_err();
        assert!(
            e.ends_with("is writable by group or others (mode 777)"),
            "{e}"
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn cgroup_modes() {
        assert_eq!(cgroup_mode(true, false), CgroupMode::Unified);
        assert_eq!(cgroup_mode(false, true), CgroupMode::Hybrid);
        assert_eq!(cgroup_mode(false, false), CgroupMode::Legacy);
    }

    #[test]
    fn driver_votes() {
        let v = |s: &str, d: &str| DriverVote {
            source: s.into(),
            driver: d.into(),
        };
        assert_eq!(decide_driver(None, &[]), DriverVerdict::Unknown);
        assert_eq!(
            decide_driver(
                Some(&v("kubelet", "systemd")),
                &[v("containerd", "systemd")]
            ),
            DriverVerdict::Agreed("systemd".into(), "kubelet; containerd".into())
        );
        assert_eq!(
            decide_driver(
                Some(&v("kubelet", "systemd")),
                &[v("containerd", "cgroupfs")]
            ),
            DriverVerdict::Conflict("kubelet means systemd; containerd means cgroupfs".into())
        );
        assert!(matches!(
            decide_driver(None, &[v("containerd", "cgroupfs"), v("cri-o", "systemd")]),
            DriverVerdict::Mixed(_)
        ));
        assert!(matches!(
            decide_driver(
                Some(&v("kubelet", "systemd")),
                &[v("containerd", "cgroupfs"), v("cri-o", "systemd")]
            ),
            DriverVerdict::Mixed(_)
        ));
    }

    #[test]
    fn checkpoint_advertising() {
        let text = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{
            "nvidia.com/gpu":["GPU-aaa","GPU-bbb::1"],"example.com/fpga":["GPU-ccc"]}},
            "Checksum":123}"#;
        let r = nvidia_registered(text).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(advertised_as(&r, "GPU-aaa", 9), Some("nvidia.com/gpu"));
        assert_eq!(advertised_as(&r, "GPU-bbb", 9), Some("nvidia.com/gpu"));
        assert_eq!(advertised_as(&r, "GPU-ccc", 9), None);
        let by_index = nvidia_registered(
            r#"{"Data":{"RegisteredDevices":{"nvidia.com/gpu":["0","1"]}},"Checksum":1}"#,
        )
        .unwrap();
        assert_eq!(advertised_as(&by_index, "GPU-x", 1), Some("nvidia.com/gpu"));
        assert_eq!(advertised_as(&by_index, "GPU-x", 7), None);
        assert!(nvidia_registered(r#"{"Data":{"RegisteredDevices":null}}"#)
            .unwrap()
            .is_empty());
        assert!(nvidia_registered("[]").is_err());
    }

    #[test]
    fn link_fix_text() {
        let num = DevNum {
            typ: DevType::Char,
            major: 195,
            minor: 7,
        };
        let link = dev_link(Path::new("/dev"), num);
        assert_eq!(link, Path::new("/dev/char/195:7"));
        assert_eq!(
            dev_link_fix(
                Path::new("/dev/nvidia7"),
                &link,
                Path::new("/dev"),
                "nvidia-gpu"
            ),
            "nvidia-ctk system create-dev-char-symlinks --create-all (or ln -s ../nvidia7 \
             /dev/char/195:7), at every boot"
        );
    }
}
