//! The sysfs probe: what the kernel's device model says about the hardware behind a node.
//! `/sys/dev/{char,block}/MAJ:MIN` leads to the device; a `device` link there means real
//! hardware, which must have a driver bound; SCSI-backed block devices report a state.
//! The PCI function's link and AER counters are the `pcie` probe's (`probe::pcie`).

use crate::fsutil::read_attr;
use crate::model::device::{DevType, Device};
use crate::model::verdict::{Code, Verdict};
use crate::probe::findings::{Findings, Probe};
use std::fs;
use std::path::{Path, PathBuf};

pub struct SysfsProbe {
    pub sysfs_root: PathBuf,
}

/// How far devgate follows `device` links and parent directories; real trees need 2–6.
const MAX_DEVICE_LINKS: usize = 4;
const MAX_PARENTS: usize = 24;

impl Probe for SysfsProbe {
    fn name(&self) -> &'static str {
        "sysfs"
    }

    fn check(&self, device: &Device, found: &mut Findings) -> Verdict {
        let (verdict, pci) = self.look(device);
        // The pcie probe and the start snapshot take the PCI function from here.
        found.device_pci = Some(pci);
        verdict
    }
}

impl SysfsProbe {
    pub fn new(sysfs_root: &Path) -> SysfsProbe {
        SysfsProbe {
            sysfs_root: sysfs_root.to_path_buf(),
        }
    }

    /// The verdict, and the PCI function the device model leads to.
    fn look(&self, device: &Device) -> (Verdict, Option<PathBuf>) {
        // The links below are followed from the resolved `devices` without realpath.
        let devices = devices_dir(&self.sysfs_root);
        let devices = devices.as_deref();
        let root = devices.and_then(Path::parent);
        let entry = device.num.sysfs_path(root.unwrap_or(&self.sysfs_root));
        let resolved = match devices {
            Some(_) => resolve(&entry),
            None => fs::canonicalize(&entry),
        };
        let base = match resolved {
            Ok(base) => base,
            // Absent, not a link that leads nowhere (a dangling entry is unknown, below):
            // asked only here, so the usual path has no lstat.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && fs::symlink_metadata(&entry).is_err() =>
            {
                let why = format!(
                    "no sysfs entry for {} {}",
                    device.num.typ.letter(),
                    device.num
                );
                return (Verdict::not_applicable(Code::NoSysfsEntry, why), None);
            }
            Err(_) => {
                let why = format!("cannot resolve {}", entry.display());
                return (Verdict::unknown(Code::SysfsUnreadable, why), None);
            }
        };
        let base = disk_of(device, base);
        let hw = base.join("device");
        if !hw.exists() {
            return (
                Verdict::not_applicable(Code::VirtualDevice, "virtual device"),
                None,
            );
        }
        let chain = device_chain(&hw);
        let pci = devices.and_then(|stop| chain.iter().find_map(|d| pci_ancestor(stop, d)));

        let mut findings: Vec<Verdict> = unbound(&chain, pci.as_deref()).into_iter().collect();
        if device.num.typ == DevType::Block {
            findings.push(block_state(&hw));
        }
        let verdict = match Verdict::worst(findings) {
            Verdict::NotApplicable(_) => Verdict::Healthy,
            v => v,
        };
        (verdict, pci)
    }
}

/// Unhealthy when neither the device chain nor its PCI function has a driver bound.
fn unbound(chain: &[PathBuf], pci: Option<&Path>) -> Option<Verdict> {
    let bound = chain
        .iter()
        .map(PathBuf::as_path)
        .chain(pci)
        .any(|d| d.join("driver").exists());
    if bound {
        return None;
    }
    let name = chain
        .first()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Some(Verdict::unhealthy(
        Code::DriverUnbound,
        format!("no driver bound to {name}"),
    ))
}

/// A partition's hardware is its disk's (its driver, its state, its PCI function): the
/// disk's directory for a partition's, else `base` as it is.
fn disk_of(device: &Device, base: PathBuf) -> PathBuf {
    if device.num.typ == DevType::Block && base.join("partition").exists() {
        if let Some(parent) = base.parent() {
            return parent.to_path_buf();
        }
    }
    base
}

/// The device, then what its `device` link points to, and so on: a class device such as
/// nvme0 has no driver of its own but its PCI function does.
fn device_chain(hw: &Path) -> Vec<PathBuf> {
    let mut chain = Vec::new();
    let mut cur = resolve(hw).ok();
    while let Some(d) = cur {
        if chain.len() >= MAX_DEVICE_LINKS || chain.contains(&d) {
            break;
        }
        cur = resolve(&d.join("device")).ok();
        chain.push(d);
    }
    chain
}

/// The nearest directory at or above `dir` whose subsystem is pci, below sysfs's resolved
/// `devices` directory (`stop`).
fn pci_ancestor(stop: &Path, dir: &Path) -> Option<PathBuf> {
    let mut cur = Some(dir);
    for _ in 0..MAX_PARENTS {
        let d = cur?;
        if d == stop || !d.starts_with(stop) {
            return None;
        }
        let sub = fs::read_link(d.join("subsystem")).ok();
        if sub
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|n| n == "pci")
        {
            return Some(d.to_path_buf());
        }
        cur = d.parent();
    }
    None
}

/// The PCI function behind a device, for a device the sysfs probe did not look at (a
/// poststop snapshot, a spare).
pub fn pci_dir_for(sysfs_root: &Path, device: &Device) -> Option<PathBuf> {
    let devices = devices_dir(sysfs_root)?;
    let entry = device.num.sysfs_path(devices.parent()?);
    let hw = disk_of(device, resolve(&entry).ok()?).join("device");
    device_chain(&hw)
        .iter()
        .find_map(|d| pci_ancestor(&devices, d))
}

thread_local! {
    /// `<sysfs_root>/devices` resolved, for the last sysfs_root asked: once per hook rather
    /// than once per device (realpath reads every component as a link).
    static DEVICES: std::cell::RefCell<Option<(PathBuf, PathBuf)>> =
        const { std::cell::RefCell::new(None) };
}

/// `<sysfs_root>/devices` resolved (None: it cannot be). Only a resolved one is kept, so
/// a tree that appears later is still found.
// Start-up trick (docs/performance.md). Plain: realpath per device.
fn devices_dir(sysfs_root: &Path) -> Option<PathBuf> {
    let kept = DEVICES.with(|d| match &*d.borrow() {
        Some((root, devices)) if root == sysfs_root => Some(devices.clone()),
        _ => None,
    });
    if kept.is_some() {
        return kept;
    }
    let devices = fs::canonicalize(sysfs_root.join("devices")).ok()?;
    DEVICES.with(|d| *d.borrow_mut() = Some((sysfs_root.to_path_buf(), devices.clone())));
    Some(devices)
}

/// What `fs::canonicalize` returns for a sysfs path whose directory is already resolved,
/// for a fraction of its cost: realpath reads every component as a link (a dozen readlink
/// calls a path), while sysfs's own directories are never links, only its entries. So a
/// relative link target (the kernel's are `../../devices/...`) is joined to the link's
/// directory by name. Anything else (an absolute target, `..` after a name, a chain of
/// links) goes to realpath.
// Start-up trick (docs/performance.md). Plain: `fs::canonicalize`.
pub(crate) fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    use std::ffi::OsString;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let target = match fs::read_link(path) {
        Ok(t) => t,
        // Not a link: the path is already resolved.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(path.to_path_buf()),
        Err(e) => return Err(e),
    };
    // By bytes, not Path components: this runs for every link of every device.
    let whole = path.as_os_str().as_bytes();
    let (Some(slash), false) = (whole.iter().rposition(|&b| b == b'/'), target.is_absolute())
    else {
        return fs::canonicalize(path);
    };
    let mut out = whole[..slash].to_vec();
    let mut named = false;
    for part in target.as_os_str().as_bytes().split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." if !named => match out.iter().rposition(|&b| b == b'/') {
                Some(i) => out.truncate(i),
                None => return fs::canonicalize(path),
            },
            b".." => return fs::canonicalize(path),
            name => {
                named = true;
                out.push(b'/');
                out.extend_from_slice(name);
            }
        }
    }
    let out = PathBuf::from(OsString::from_vec(out));
    match fs::read_link(&out) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(out),
        _ => fs::canonicalize(path),
    }
}

fn block_state(hw: &Path) -> Verdict {
    match read_attr(&hw.join("state")) {
        Err(_) => Verdict::not_applicable(Code::NotReported, "no device state"),
        Ok(s) if s == "running" => Verdict::Healthy,
        Ok(s) => Verdict::unhealthy(
            Code::BlockNotRunning,
            format!("block device state is {:?}, not running", trunc(&s)),
        ),
    }
}

fn trunc(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::device::{DevNum, Source};
    use std::os::unix::fs::symlink;

    pub(crate) struct Tree(pub PathBuf);

    impl Tree {
        pub(crate) fn new(tag: &str) -> Tree {
            let p =
                std::env::temp_dir().join(format!("devgate-sysfs-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(p.join("dev/char")).unwrap();
            fs::create_dir_all(p.join("dev/block")).unwrap();
            fs::create_dir_all(p.join("bus/pci/drivers/nvidia")).unwrap();
            Tree(p)
        }
        /// A PCI function at devices/pci0000:00/<addr>, optionally with a driver.
        pub(crate) fn pci(&self, addr: &str, driver: bool) -> PathBuf {
            let d = self.0.join("devices/pci0000:00").join(addr);
            fs::create_dir_all(&d).unwrap();
            symlink("../../../bus/pci", d.join("subsystem")).unwrap();
            if driver {
                symlink("../../../bus/pci/drivers/nvidia", d.join("driver")).unwrap();
            }
            d
        }
        /// A char device entry MAJ:MIN whose `device` link points at `hw` (or none).
        pub(crate) fn chardev(&self, mm: &str, name: &str, hw: Option<&Path>) {
            let d = self.0.join("devices/virtual/misc").join(name);
            fs::create_dir_all(&d).unwrap();
            if let Some(hw) = hw {
                symlink(hw, d.join("device")).unwrap();
            }
            symlink(&d, self.0.join("dev/char").join(mm)).unwrap();
        }
        pub(crate) fn write(&self, dir: &Path, name: &str, text: &str) {
            fs::write(dir.join(name), text).unwrap();
        }
    }

    /// The tree goes with the test, failed or not (several tests left theirs in /tmp).
    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn dev(typ: DevType, major: u32, minor: u32) -> Device {
        Device {
            num: DevNum { typ, major, minor },
            class: "char".into(),
            container_path: None,
            host_path: None,
            source: Source::LinuxDevices,
            file_mode: None,
            uid: None,
            gid: None,
        }
    }

    #[test]
    fn missing_entry_and_virtual_device_are_not_applicable() {
        let t = Tree::new("na");
        t.chardev("1:5", "zero", None);
        let p = SysfsProbe::new(&t.0);
        assert_eq!(
            p.check(&dev(DevType::Char, 195, 0), &mut Findings::default()),
            Verdict::not_applicable(Code::NoSysfsEntry, "no sysfs entry for c 195:0")
        );
        assert_eq!(
            p.check(&dev(DevType::Char, 1, 5), &mut Findings::default()),
            Verdict::not_applicable(Code::VirtualDevice, "virtual device")
        );
        // an entry that is a link leading nowhere is not an absent one: unknown
        symlink("../../devices/gone", t.0.join("dev/char/195:1")).unwrap();
        let v = p.check(&dev(DevType::Char, 195, 1), &mut Findings::default());
        assert_eq!(v.status(), "unknown", "{v:?}");
        assert_eq!(v.code(), Some(Code::SysfsUnreadable));
    }

    #[test]
    fn driver_must_be_bound() {
        let t = Tree::new("drv");
        let pci = t.pci("0000:3b:00.0", false);
        t.chardev("240:0", "accel0", Some(&pci));
        let p = SysfsProbe::new(&t.0);
        assert_eq!(
            p.check(&dev(DevType::Char, 240, 0), &mut Findings::default()),
            Verdict::unhealthy(Code::DriverUnbound, "no driver bound to 0000:3b:00.0")
        );
        symlink("../../../bus/pci/drivers/nvidia", pci.join("driver")).unwrap();
        assert_eq!(
            p.check(&dev(DevType::Char, 240, 0), &mut Findings::default()),
            Verdict::Healthy
        );
    }

    #[test]
    fn block_state_and_class_device_chain() {
        let t = Tree::new("blk");
        let pci = t.pci("0000:5e:00.0", true);
        // disk -> device -> scsi device (driver sd) whose parent chain reaches the PCI HBA
        let scsi = pci.join("host0/target0:0:0/0:0:0:0");
        fs::create_dir_all(&scsi).unwrap();
        fs::create_dir_all(t.0.join("bus/scsi/drivers/sd")).unwrap();
        symlink(t.0.join("bus/scsi/drivers/sd"), scsi.join("driver")).unwrap();
        let disk = scsi.join("block/sdb");
        fs::create_dir_all(disk.join("sdb1")).unwrap();
        fs::write(disk.join("sdb1/partition"), "1").unwrap();
        symlink(&scsi, disk.join("device")).unwrap();
        symlink(&disk, t.0.join("dev/block/8:16")).unwrap();
        symlink(disk.join("sdb1"), t.0.join("dev/block/8:17")).unwrap();
        t.write(&scsi, "state", "running\n");
        let p = SysfsProbe::new(&t.0);
        assert_eq!(
            p.check(&dev(DevType::Block, 8, 16), &mut Findings::default()),
            Verdict::Healthy
        );
        t.write(&scsi, "state", "offline\n");
        let want = Verdict::unhealthy(
            Code::BlockNotRunning,
            "block device state is \"offline\", not running",
        );
        assert_eq!(
            p.check(&dev(DevType::Block, 8, 16), &mut Findings::default()),
            want
        );
        assert_eq!(
            p.check(&dev(DevType::Block, 8, 17), &mut Findings::default()),
            want,
            "partition uses its disk"
        );
        assert_eq!(
            pci_dir_for(&t.0, &dev(DevType::Block, 8, 16)).unwrap(),
            fs::canonicalize(&pci).unwrap()
        );
        // what the probe found is what pci_dir_for finds, for the pcie probe and the start
        // snapshot to take instead of walking the tree again
        for minor in [16, 17] {
            let d = dev(DevType::Block, 8, minor);
            let mut found = Findings::default();
            p.check(&d, &mut found);
            assert_eq!(found.device_pci, Some(pci_dir_for(&t.0, &d)), "8:{minor}");
        }
        let mut found = Findings::default();
        p.check(&dev(DevType::Char, 9, 9), &mut found);
        assert_eq!(found.device_pci, Some(None), "no sysfs entry: no function");
        // A partition's PCI function is its disk's, as its driver and state are: a pod
        // given /dev/nvme0n1p1 of a disk whose link reports a fatal AER error was not
        // judged by the pcie probe at all. The start snapshot and poststop agree.
        let mut found = Findings::default();
        p.check(&dev(DevType::Block, 8, 17), &mut found);
        let disk_pci = Some(fs::canonicalize(&pci).unwrap());
        assert_eq!(found.device_pci, Some(disk_pci.clone()), "partition");
        assert_eq!(pci_dir_for(&t.0, &dev(DevType::Block, 8, 17)), disk_pci);
        fs::remove_dir_all(&t.0).unwrap();
    }

    #[test]
    fn real_sysfs_zero_is_virtual() {
        let p = SysfsProbe::new(Path::new("/sys"));
        if Path::new("/sys/dev/char/1:5").exists() {
            assert_eq!(
                p.check(&dev(DevType::Char, 1, 5), &mut Findings::default()),
                Verdict::not_applicable(Code::VirtualDevice, "virtual device")
            );
        }
    }
}
