//! The cgroup mode and the cgroup driver, for doctor: the mode as runc and crun decide it,
//! and the driver each configuration on the node names (a vote), which must agree.

use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------
// cgroup mode, decided as runc and crun decide it: statfs of /sys/fs/cgroup.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CgroupMode {
    Unified,
    Hybrid,
    Legacy,
}

pub(crate) fn cgroup_mode(top_is_cgroup2: bool, unified_is_cgroup2: bool) -> CgroupMode {
    match (top_is_cgroup2, unified_is_cgroup2) {
        (true, _) => CgroupMode::Unified,
        (false, true) => CgroupMode::Hybrid,
        (false, false) => CgroupMode::Legacy,
    }
}

pub(crate) fn describe_cgroup_mode(mode: CgroupMode, top: &Path) -> String {
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

pub(crate) fn read_cgroup_mode(
    sysfs_root: &Path,
) -> Result<(CgroupMode, PathBuf), super::error::NodeError> {
    let top = sysfs_root.join("fs/cgroup");
    let is_cgroup2 = |p: &Path| {
        nix::sys::statfs::statfs(p)
            .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
    };
    let top_v2 = is_cgroup2(&top).map_err(|errno| super::error::NodeError::Statfs {
        path: top.clone(),
        errno,
    })?;
    let unified_v2 = !top_v2 && is_cgroup2(&top.join("unified")).unwrap_or(false);
    Ok((cgroup_mode(top_v2, unified_v2), top))
}

/// One configuration's say on the cgroup driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DriverVote {
    pub(crate) source: String,
    pub(crate) driver: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DriverVerdict {
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

pub(crate) fn decide_driver(
    kubelet: Option<&DriverVote>,
    runtimes: &[DriverVote],
) -> DriverVerdict {
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
// kubelet's cgroup driver, from its KubeletConfiguration (YAML). devgate reads only the one
// top-level scalar it needs rather than carrying a YAML parser.

/// `Some(driver)` when the file sets `cgroupDriver`; kubelet's default is cgroupfs.
pub(crate) fn kubelet_cgroup_driver(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("cgroupDriver:")?;
        let v = rest.split('#').next()?.trim().trim_matches(['"', '\'']);
        (!v.is_empty()).then(|| v.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn kubelet_driver_line() {
        assert_eq!(
            kubelet_cgroup_driver(
                "apiVersion: kubelet.config.k8s.io/v1beta1\ncgroupDriver: \"systemd\" # kubeadm\n"
            )
            .as_deref(),
            Some("systemd")
        );
        assert_eq!(kubelet_cgroup_driver("  cgroupDriver: systemd\n"), None);
        assert_eq!(kubelet_cgroup_driver("kind: KubeletConfiguration\n"), None);
    }
}
