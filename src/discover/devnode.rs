//! The host's /dev: the node for a major:minor, the one bounded walk of the tree, and the
//! operator's DEVICE argument.

use crate::error::{Error, Result};
use crate::fsutil::read_attr;
use crate::model::class::{self, ClassRule};
use crate::model::device::{check_number, DevNum, DevType, Device, MAX_MAJOR, MAX_MINOR};
use std::fs;
use std::ops::ControlFlow;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// The device number of the node at `path`, never following a symlink.
pub fn node_num(path: &Path) -> Option<DevNum> {
    fs::symlink_metadata(path)
        .ok()
        .and_then(|m| DevNum::from_metadata(&m))
}

/// The node at `path` is `num`, reached without leaving `dev_root` (no `..` out of it, no
/// link on the way pointing out: a hint comes from the spec's container path, and /dev/shm
/// is writable by every user).
fn node_is(dev_root: &Path, path: &Path, num: DevNum) -> bool {
    crate::fsutil::lstat_beneath(dev_root, path)
        .ok()
        .and_then(|m| DevNum::from_metadata(&m))
        == Some(num)
}

/// The host node for a major:minor. Tries the hints, then the kernel's own name for it
/// (DEVNAME in sysfs uevent), then a bounded scan of dev_root. Symlinks are never taken
/// as the node: /dev/disk/by-id links would otherwise shadow the real name.
pub fn find_host_node(
    dev_root: &Path,
    sysfs_root: &Path,
    num: DevNum,
    hints: &[PathBuf],
) -> Option<PathBuf> {
    if let Some(h) = hints.iter().find(|h| node_is(dev_root, h, num)) {
        return Some(h.clone());
    }
    if let Ok(text) = read_attr(&num.sysfs_path(sysfs_root).join("uevent")) {
        if let Some(name) = text.lines().find_map(|l| l.strip_prefix("DEVNAME=")) {
            let p = dev_root.join(name);
            if !name.contains("..") && node_is(dev_root, &p, num) {
                return Some(p);
            }
        }
    }
    let mut found = None;
    walk_nodes(dev_root, WALK_LEVELS, |path| {
        if node_is(dev_root, path, num) {
            found = Some(path.to_path_buf());
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    found
}

/// Entries looked at in one walk of /dev, directories included: a /dev that is larger is
/// hostile or broken, and a hook must not spend its deadline on it.
const WALK_MAX_ENTRIES: usize = 8192;
/// /dev, its subdirectories and theirs (`/dev/nvidia-caps/nvidia-cap1`, `/dev/dri/card0`).
const WALK_LEVELS: usize = 3;

/// The one bounded walk of a /dev tree: calls `visit` with the path of every char or
/// block node (never a symlink, never followed) in `dev_root` and `levels - 1` levels of
/// subdirectories below it, until `visit` breaks or the entry budget runs out.
pub fn walk_nodes(dev_root: &Path, levels: usize, mut visit: impl FnMut(&Path) -> ControlFlow<()>) {
    let mut budget = WALK_MAX_ENTRIES;
    let mut stack = vec![(dev_root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for entry in rd.flatten() {
            if budget == 0 {
                return;
            }
            budget -= 1;
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() && depth + 1 < levels {
                if others_write(&entry) {
                    continue;
                }
                stack.push((entry.path(), depth + 1));
            } else if (ft.is_char_device() || ft.is_block_device())
                && visit(&entry.path()).is_break()
            {
                return;
            }
        }
    }
}

/// A directory other users can write or own (/dev/shm, /dev/mqueue, theirs below them) is
/// not walked: there they could mount FUSE and answer with any node, or never answer, and
/// fill it to spend the walk's budget before a real node is reached. Its lstat is answered
/// by the filesystem holding it, which is dev_root's or a kernel one.
fn others_write(entry: &fs::DirEntry) -> bool {
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::geteuid().as_raw();
    entry.metadata().map_or(true, |m| {
        m.mode() & 0o022 != 0 || (m.uid() != 0 && m.uid() != euid)
    })
}

/// Accelerator nodes under dev_root (classes whose rule says `accelerator`), classified
/// by the path they would have in /dev.
pub fn accelerators(dev_root: &Path, rules: &[ClassRule]) -> Vec<Device> {
    let mut out = Vec::new();
    walk_nodes(dev_root, WALK_LEVELS, |path| {
        if let Some(num) = node_num(path) {
            let shown = Path::new("/dev").join(path.strip_prefix(dev_root).unwrap_or(path));
            let class = class::classify(rules, num.typ, num.major, num.minor, &[&shown]);
            if rules.iter().any(|r| r.class == class && r.accelerator) {
                out.push(Device::on_host(num, class, Some(path.to_path_buf())));
            }
        }
        ControlFlow::Continue(())
    });
    out.sort_by_key(|d| d.num);
    out
}

/// Parses an operator's DEVICE argument: a path to a node, or `MAJ:MIN` (optionally
/// prefixed `c ` / `b ` or `c:` / `b:`). A bare MAJ:MIN is a block device only when sysfs
/// knows a block device by that number and no char device.
pub fn parse_device_arg(arg: &str, sysfs_root: &Path) -> Result<(DevNum, Option<PathBuf>)> {
    if arg.starts_with('/') {
        let meta = fs::metadata(arg).map_err(|e| {
            let gone = e.kind() == std::io::ErrorKind::NotFound;
            let e = Error::io("cannot stat device", arg, e);
            // A GPU that fell off the bus may lose its node; its quarantine still has to be
            // lifted, by number.
            if gone {
                Error::Usage(format!(
                    "{e}; name a device without a node by MAJ:MIN (devgate status lists it)"
                ))
            } else {
                e
            }
        })?;
        let num = DevNum::from_metadata(&meta)
            .ok_or_else(|| Error::invalid(format!("device {arg}"), "not a device node"))?;
        return Ok((num, Some(PathBuf::from(arg))));
    }
    let (typ, mm) = match arg.split_at_checked(2) {
        Some(("c:", rest)) | Some(("c ", rest)) => (Some(DevType::Char), rest),
        Some(("b:", rest)) | Some(("b ", rest)) => (Some(DevType::Block), rest),
        _ => (None, arg),
    };
    let bad = || {
        Error::invalid(
            format!("device {arg:?}"),
            "expected a path under /dev or MAJ:MIN",
        )
    };
    let (ma, mi) = mm.split_once(':').ok_or_else(bad)?;
    let major: i64 = ma.trim().parse().map_err(|_| bad())?;
    let minor: i64 = mi.trim().parse().map_err(|_| bad())?;
    let ctx = format!("device {arg:?}");
    let major = check_number("major", major, MAX_MAJOR, &ctx)?;
    let minor = check_number("minor", minor, MAX_MINOR, &ctx)?;
    let typ = typ.unwrap_or_else(|| {
        let has = |typ| DevNum { typ, major, minor }.sysfs_path(sysfs_root).exists();
        if has(DevType::Block) && !has(DevType::Char) {
            DevType::Block
        } else {
            DevType::Char
        }
    });
    Ok((DevNum { typ, major, minor }, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_arg_parsing() {
        let sys = Path::new("/nonexistent");
        let e = parse_device_arg("/nonexistent/nvidia1", sys)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "cannot stat device /nonexistent/nvidia1: no such file or directory (os error 2); \
             name a device without a node by MAJ:MIN (devgate status lists it)"
        );
        assert_eq!(
            parse_device_arg("195:1", sys).unwrap().0,
            DevNum {
                typ: DevType::Char,
                major: 195,
                minor: 1
            }
        );
        assert_eq!(
            parse_device_arg("b:8:0", sys).unwrap().0.typ,
            DevType::Block
        );
        assert!(parse_device_arg("195", sys).is_err());
        assert!(parse_device_arg("195:x", sys).is_err());
        assert!(parse_device_arg("5000:1", sys).is_err());
        assert!(parse_device_arg("/etc/hostname", sys).is_err());
        assert_eq!(
            parse_device_arg("/dev/zero", sys).unwrap().0.to_string(),
            "1:5"
        );
    }
}
