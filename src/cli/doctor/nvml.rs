//! NVML and the GPUs it sees, for doctor: the driver version, and each GPU's identity and
//! persistence mode.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::ffi::OsString;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// NVML: on a thread of its own with a deadline, as the hook does (a dying GPU can make
// NVML block for minutes).

/// Set when doctor's NVML thread is left running past its deadline; the process must then
/// leave with _exit (see probe::nvml for why).
static ABANDONED: AtomicBool = AtomicBool::new(false);

pub(crate) fn nvml_abandoned() -> bool {
    ABANDONED.load(Ordering::SeqCst)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuInfo {
    pub(crate) index: u32,
    pub(crate) name: Option<String>,
    pub(crate) uuid: Option<String>,
    pub(crate) bus_id: Option<String>,
    pub(crate) minor: Option<u32>,
    /// Ok(on) or why it could not be read.
    pub(crate) persistence: Result<bool, Unread>,
    /// Why NVML gave no handle for this index.
    pub(crate) unreachable: Option<String>,
}

/// Why NVML gave no reading of a GPU's setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unread {
    /// The GPU does not support it.
    NotSupported,
    /// NVML's error, in its words.
    Nvml(String),
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::NotSupported => f.write_str("not supported"),
            Unread::Nvml(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for Unread {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NvmlAnswer {
    Gpus {
        driver: Option<String>,
        gpus: Vec<GpuInfo>,
    },
    /// `no_driver`: the library is missing or says no driver is loaded.
    Failed { error: String, no_driver: bool },
}

pub(crate) fn nvml_inventory(library: &Path, timeout: Duration) -> NvmlAnswer {
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
                persistence: Err(Unread::Nvml(e.to_string())),
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
            .map(|p| crate::gpu::nvml::display_bus_id(&p.bus_id)),
        minor: dev.minor_number().ok(),
        persistence: dev.is_in_persistent_mode().map_err(|e| match e {
            NvmlError::NotSupported => Unread::NotSupported,
            other => Unread::Nvml(other.to_string()),
        }),
        unreachable: None,
    }
}

/// `/dev/nvidiactl` or any `/dev/nvidiaN`: the driver's nodes are there.
pub(crate) fn has_nvidia_nodes(dev_root: &Path) -> bool {
    fs::symlink_metadata(dev_root.join("nvidiactl")).is_ok()
        || !crate::gpu::request::gpu_minor_nodes(dev_root).is_empty()
}

pub(crate) fn describe_gpu(g: &GpuInfo) -> String {
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
