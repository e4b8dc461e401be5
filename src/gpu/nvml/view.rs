//! What a query child lets NVML see of the driver's GPU list.
//!
//! NVML has no way to be opened on one GPU. `NVML_INIT_FLAG_NO_ATTACH` does not defer the
//! attach to a handle lookup, as devgate once believed: on an H200 with driver 580.159.04
//! it leaves NVML no GPU at all (count 0, every lookup NOT_FOUND or INVALID_ARGUMENT). A
//! plain init attaches every GPU NVML enumerates, and NVML enumerates the GPUs the driver
//! lists in `/proc/driver/nvidia/gpus`. So a child asking about one GPU does what the
//! NVIDIA container toolkit does for a container: in a mount namespace of its own, it
//! mounts an empty tmpfs over that list and binds back only its GPU's directory. Its init
//! then attaches that GPU alone, and a GPU that hangs at attach holds only the child asking
//! about it. Nothing here outlives the child: the namespace ends with it.

use super::error::ViewError;
use crate::gpu::pci::PciAddr;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// More GPU directories than any node has; the rest are not looked at.
const MAX_GPU_DIRS: usize = 256;

/// The driver's list, narrowed in this process's own mount namespace.
pub(super) struct GpuView {
    /// `<proc_root>/driver/nvidia/gpus`.
    gpus_dir: PathBuf,
    /// The list's own directories, by address, opened before anything covered them.
    dirs: Vec<(PciAddr, OsString, OwnedFd)>,
    /// Whether a tmpfs of this view covers `gpus_dir` now.
    covered: bool,
}

impl GpuView {
    /// Moves this process into a mount namespace of its own whose mounts do not propagate
    /// back, then opens each directory of the list that one of `wanted` (NVML's
    /// `00000000:3B:00.0`) names. Nothing is covered yet ([`GpuView::show`] does). Err says why the
    /// GPUs cannot be shown one at a time (no list, not root, no namespaces).
    pub(super) fn enter(proc_root: &Path, wanted: &[&str]) -> Result<GpuView, ViewError> {
        let gpus_dir = proc_root.join("driver/nvidia/gpus");
        let wanted: Vec<PciAddr> = wanted.iter().filter_map(|w| PciAddr::parse(w)).collect();
        // First the namespace, then the directories: a bind's source must be a mount of
        // the namespace it is made in, so they are opened in the new one.
        let unreadable = |e: std::io::Error| ViewError::Read {
            path: gpus_dir.clone(),
            source: e.into(),
        };
        std::fs::metadata(&gpus_dir).map_err(unreadable)?;
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(ViewError::Namespace)?;
        // Shared mounts would carry the tmpfs out to the host's namespace. Slave, not
        // private: the host's unmounts still reach this copy, so a child stuck on a hung
        // GPU (it may live until reboot) does not hold the node's old mounts (a container's
        // rootfs, a pod's volume) busy after the host let them go.
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_SLAVE,
            None::<&str>,
        )
        .map_err(ViewError::OneWay)?;
        let entries = std::fs::read_dir(&gpus_dir).map_err(unreadable)?;
        let mut dirs = Vec::new();
        for e in entries.take(MAX_GPU_DIRS).flatten() {
            let name = e.file_name();
            let Some(addr) = name.to_str().and_then(PciAddr::parse) else {
                continue;
            };
            if !wanted.iter().any(|w| same_function(w, &addr)) {
                continue;
            }
            let fd = nix::fcntl::open(
                &e.path(),
                nix::fcntl::OFlag::O_PATH
                    | nix::fcntl::OFlag::O_DIRECTORY
                    | nix::fcntl::OFlag::O_CLOEXEC
                    | nix::fcntl::OFlag::O_NOFOLLOW,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|errno| ViewError::Open {
                path: gpus_dir.join(&name),
                errno,
            })?;
            // SAFETY: open returned a new descriptor that nothing else owns.
            dirs.push((addr, name, unsafe {
                <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
            }));
        }
        Ok(GpuView {
            gpus_dir,
            dirs,
            covered: false,
        })
    }

    /// Shows NVML the GPU `bus_id` alone: a fresh empty tmpfs over the list (the one shown
    /// before goes, with its GPU's bind), and that GPU's own directory bound into it. A GPU
    /// whose directory was not found is not shown an empty list (NVML would take it for
    /// lost): Err, and NVML sees the whole list. On Err the list is left uncovered where it
    /// could be.
    pub(super) fn show(&mut self, bus_id: &str) -> Result<(), ViewError> {
        self.uncover()?;
        let Some((_, name, fd)) = PciAddr::parse(bus_id)
            .and_then(|addr| self.dirs.iter().find(|(a, _, _)| same_function(a, &addr)))
        else {
            return Err(ViewError::NoDirectory {
                list: self.gpus_dir.clone(),
                bus_id: bus_id.to_string(),
            });
        };
        mount(
            Some("tmpfs"),
            &self.gpus_dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=0555,size=64k"),
        )
        .map_err(|errno| ViewError::Cover {
            list: self.gpus_dir.clone(),
            errno,
        })?;
        self.covered = true;
        let target = self.gpus_dir.join(name);
        let bound = std::fs::create_dir(&target)
            .map_err(|e| ViewError::MakeDir {
                path: target.clone(),
                source: e.into(),
            })
            .and_then(|()| {
                // The directory as opened before the tmpfs covered it.
                let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
                mount(
                    Some(source.as_str()),
                    &target,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
                .map_err(|errno| ViewError::Bind {
                    path: target.clone(),
                    errno,
                })
            });
        if bound.is_err() {
            let _ = self.uncover();
        }
        bound
    }

    /// Takes this view's tmpfs (and the bind in it) off the list.
    pub(super) fn uncover(&mut self) -> Result<(), ViewError> {
        if self.covered {
            umount2(&self.gpus_dir, MntFlags::MNT_DETACH).map_err(|errno| ViewError::Uncover {
                list: self.gpus_dir.clone(),
                errno,
            })?;
            self.covered = false;
        }
        Ok(())
    }
}

/// The same PCI function; a missing function is function 0, as NVML's form always has one.
fn same_function(a: &PciAddr, b: &PciAddr) -> bool {
    a.same_slot(b) && a.function.unwrap_or(0) == b.function.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drivers_directory_name_and_nvmls_bus_id_name_the_same_function() {
        let dir = PciAddr::parse("0000:3b:00.0").unwrap();
        assert!(same_function(
            &PciAddr::parse("00000000:3B:00.0").unwrap(),
            &dir
        ));
        assert!(!same_function(
            &PciAddr::parse("00000000:3B:00.1").unwrap(),
            &dir
        ));
        assert!(!same_function(
            &PciAddr::parse("00000000:3C:00.0").unwrap(),
            &dir
        ));
    }

    #[test]
    fn a_node_without_the_drivers_list_cannot_show_one_gpu() {
        let r = GpuView::enter(
            Path::new("/nonexistent-devgate-proc"),
            &["00000000:3B:00.0"],
        );
        match r {
            Err(ViewError::Read { path, source }) => {
                assert_eq!(
                    path,
                    Path::new("/nonexistent-devgate-proc/driver/nvidia/gpus")
                );
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{:?}", other.err()),
        }
    }
}
