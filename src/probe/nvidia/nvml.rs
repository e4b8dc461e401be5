//! The NVML probe: what the NVIDIA driver says about each GPU assigned to a container.
//!
//! NVML is opened once per hook call, only when a container has an NVIDIA GPU, on a thread
//! of its own: a dying GPU can make NVML block for minutes, so the hook waits at most
//! `probe_timeout_ms` and then abandons the thread (see [`abandoned`]). What the thread
//! brings back is plain data, a [`NvmlAnswer`]; judging it ([`super::gpu::checks`]) is pure and is where
//! every threshold lives.
//!
//! nvml-wrapper resolves every symbol when the library loads and keeps the failures, so its
//! safe methods return `FailedToLoadSymbol` for a function an old driver lacks. Only its
//! `Drop` (nvmlShutdown) and the raw calls devgate makes itself through [`Nvml::lib`] would
//! panic on a missing symbol; both check the symbol first.

use super::pci::PciAddr;
use super::procfs::ProcGpu;
use crate::probe::counters::GpuCounters;
use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Nvml;
use serde::Serialize;
use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What every lost GPU's reason says, whichever way NVML showed it.
pub const LOST: &str = "GPU is lost (fallen off the bus)";

/// More GPUs than any node has; a library reporting more is broken or hostile.
const MAX_GPUS: u32 = 256;

/// Set when the NVML thread was left running past its deadline. The process must then end
/// with `_exit`: exit() would run the library's destructors while that thread may still be
/// inside it, and a destructor waiting on the stuck thread would hang the hook after all.
static ABANDONED: AtomicBool = AtomicBool::new(false);

/// True when an NVML thread is still running past its deadline; see [`ABANDONED`].
pub fn abandoned() -> bool {
    ABANDONED.load(Ordering::SeqCst)
}

/// A value read from NVML, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "value", rename_all = "snake_case")]
pub enum Reading<T> {
    Value(T),
    /// The GPU or driver does not support it, or the library lacks the function.
    NotSupported(String),
    /// NVML_ERROR_GPU_IS_LOST.
    Lost,
    Failed(String),
}

impl<T> Reading<T> {
    fn from_result(r: Result<T, NvmlError>) -> Reading<T> {
        match r {
            Ok(v) => Reading::Value(v),
            Err(e) => Reading::from_error(e),
        }
    }

    pub(crate) fn from_error(e: NvmlError) -> Reading<T> {
        match e {
            NvmlError::GpuLost => Reading::Lost,
            NvmlError::NotSupported => Reading::NotSupported("not supported".into()),
            NvmlError::FunctionNotFound => {
                Reading::NotSupported("function not found in the driver".into())
            }
            NvmlError::FailedToLoadSymbol(s) => {
                Reading::NotSupported(format!("symbol missing from the NVML library ({s})"))
            }
            other => Reading::Failed(other.to_string()),
        }
    }

    pub fn value(&self) -> Option<&T> {
        match self {
            Reading::Value(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        matches!(self, Reading::Lost)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Link {
    pub current: u32,
    pub max: u32,
}

/// Everything devgate reads about one GPU, as NVML answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuFacts {
    pub index: u32,
    /// Why no handle could be had for this index (the GPU is lost or NVML refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<String>,
    pub minor: Reading<u32>,
    pub uuid: Reading<String>,
    /// As NVML writes it: `00000000:3B:00.0`.
    pub pci_bus_id: Reading<String>,
    pub remapped_rows: Reading<RemappedRows>,
    pub retired_pages_pending: Reading<bool>,
    pub volatile_uncorrectable_ecc: Reading<u64>,
    pub throttle_reasons: Reading<u64>,
    pub pcie_gen: Reading<Link>,
    pub pcie_width: Reading<Link>,
}

impl GpuFacts {
    pub(crate) fn unreachable(index: u32, why: String, lost: bool) -> GpuFacts {
        fn r<T>(lost: bool) -> Reading<T> {
            if lost {
                Reading::Lost
            } else {
                Reading::Failed("no handle".into())
            }
        }
        GpuFacts {
            index,
            unreachable: Some(why),
            minor: r(lost),
            uuid: r(lost),
            pci_bus_id: r(lost),
            remapped_rows: r(lost),
            retired_pages_pending: r(lost),
            volatile_uncorrectable_ecc: r(lost),
            throttle_reasons: r(lost),
            pcie_gen: r(lost),
            pcie_width: r(lost),
        }
    }

    /// `GPU-1234… (0000:3b:00.0)`, with what is known.
    pub fn label(&self) -> String {
        let id = match self.uuid.value() {
            Some(u) => u.clone(),
            None => format!("index {}", self.index),
        };
        match self.pci_bus_id.value() {
            Some(p) => format!("{id} ({})", display_bus_id(p)),
            None => id,
        }
    }

    pub fn is_lost(&self) -> bool {
        self.unreachable.is_some()
            || [
                self.remapped_rows.is_lost(),
                self.retired_pages_pending.is_lost(),
                self.volatile_uncorrectable_ecc.is_lost(),
                self.throttle_reasons.is_lost(),
                self.pcie_gen.is_lost(),
                self.pcie_width.is_lost(),
                self.minor.is_lost(),
            ]
            .iter()
            .any(|l| *l)
    }
}

/// NVML's `00000000:3B:00.0` as Linux writes it, `0000:3b:00.0`; anything unparsable is
/// shown as it came, lower-cased.
pub fn display_bus_id(nvml: &str) -> String {
    match PciAddr::parse(nvml) {
        Some(a) => a.to_string(),
        None => nvml.to_ascii_lowercase(),
    }
}

/// One NVML call on a node: the GPUs, or why NVML could not be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmlAnswer {
    /// `Err` is the reason every GPU check is unknown (library missing, init failed, timeout).
    pub gpus: Result<Vec<GpuFacts>, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    pub elapsed_us: u64,
}

impl NvmlAnswer {
    /// Opens NVML, reads every GPU and closes it again, within `timeout`. `proc` is the
    /// driver's own list (minor ↔ PCI address), used to find GPUs NVML cannot identify.
    pub fn take(library: &Path, timeout: Duration, proc: Vec<ProcGpu>) -> NvmlAnswer {
        let started = Instant::now();
        let (gpus, driver_version) = with_deadline(library.as_os_str().to_owned(), timeout, proc);
        NvmlAnswer {
            gpus,
            driver_version,
            elapsed_us: started.elapsed().as_micros() as u64,
        }
    }

    pub fn gpu_by_minor(&self, minor: u32) -> Option<&GpuFacts> {
        self.gpus
            .as_ref()
            .ok()?
            .iter()
            .find(|g| g.minor.value() == Some(&minor))
    }

    /// NVML's changeable figures for /dev/nvidia`minor`, for the start snapshot and its
    /// poststop twin. None when NVML gave no answer at all (library missing, deadline):
    /// then no GPU fault can be claimed either way.
    pub fn counters(&self, minor: u32) -> Option<GpuCounters> {
        let gpus = self.gpus.as_ref().ok()?;
        let Some(g) = self.gpu_by_minor(minor) else {
            // NVML answered but no GPU has this minor any more: it fell off the bus.
            return (!gpus.is_empty()).then(GpuCounters::default);
        };
        let rows = g.remapped_rows.value();
        Some(GpuCounters {
            uuid: g.uuid.value().cloned(),
            pci_bus_id: g.pci_bus_id.value().cloned(),
            reachable: !g.is_lost(),
            ecc_volatile_uncorrectable: g.volatile_uncorrectable_ecc.value().copied(),
            remapped_rows_uncorrectable: rows.map(|r| u64::from(r.uncorrectable)),
            remap_failure: rows.is_some_and(|r| r.failure),
        })
    }

    /// The PCI address of the GPU behind /dev/nvidia`minor`, for attributing XID reports.
    pub fn pci_of_minor(&self, minor: u32) -> Option<PciAddr> {
        let g = self.gpu_by_minor(minor)?;
        PciAddr::parse(g.pci_bus_id.value()?)
    }
}

enum Msg {
    Facts(Result<(Vec<GpuFacts>, Option<String>), String>),
    Closed,
}

/// Runs [`collect`] on its own thread and waits for it at most `timeout`. The thread is not
/// joined: if it is stuck in the library, it stays stuck and the process ends around it.
fn with_deadline(
    library: OsString,
    timeout: Duration,
    proc: Vec<ProcGpu>,
) -> (Result<Vec<GpuFacts>, String>, Option<String>) {
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("devgate-nvml".into())
        .spawn(move || collect(&library, &proc, &tx));
    if let Err(e) = spawned {
        return (Err(format!("cannot start the NVML thread: {e}")), None);
    }
    let ms = timeout.as_millis();
    let answer = match rx.recv_timeout(timeout) {
        Ok(Msg::Facts(r)) => r,
        Ok(Msg::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err("the NVML thread ended without an answer (the library crashed)".into())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            ABANDONED.store(true, Ordering::SeqCst);
            return (Err(format!("NVML did not answer in {ms} ms")), None);
        }
    };
    if answer.is_ok() {
        // The answer is in; give nvmlShutdown what is left of the deadline, then leave it.
        let left = timeout.saturating_sub(started.elapsed());
        if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(left) {
            ABANDONED.store(true, Ordering::SeqCst);
        }
    }
    match answer {
        Ok((gpus, version)) => (Ok(gpus), version),
        Err(e) => (Err(e), None),
    }
}

/// The NVML thread: init, read every GPU, answer, shut down.
fn collect(library: &OsString, proc: &[ProcGpu], tx: &mpsc::Sender<Msg>) {
    // NO_ATTACH: NVML opens a GPU only when asked about it, so a GPU that hangs at attach
    // does not hang the init for every other GPU.
    let nvml = match Nvml::builder()
        .lib_path(library)
        .flags(InitFlags::NO_ATTACH)
        .init()
    {
        Ok(n) => n,
        Err(e) => {
            let _ = tx.send(Msg::Facts(Err(init_error(library, &e))));
            return;
        }
    };
    let result = inventory(&nvml, proc);
    let _ = tx.send(Msg::Facts(result));
    close(nvml);
    let _ = tx.send(Msg::Closed);
}

fn init_error(library: &OsString, e: &NvmlError) -> String {
    let lib = library.to_string_lossy();
    match e {
        NvmlError::LibloadingError(le) => format!("cannot load {lib}: {le}"),
        NvmlError::FailedToLoadSymbol(s) => format!("{lib} is not a usable NVML library: {s}"),
        other => format!("NVML init failed ({lib}): {other}"),
    }
}

/// nvml-wrapper's Drop calls nvmlShutdown unchecked and would panic on a library without
/// it; such a library is left loaded instead.
fn close(nvml: Nvml) {
    if nvml.lib().nvmlShutdown.is_ok() {
        drop(nvml);
    } else {
        std::mem::forget(nvml);
    }
}

fn inventory(nvml: &Nvml, proc: &[ProcGpu]) -> Result<(Vec<GpuFacts>, Option<String>), String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML cannot count GPUs: {e}"))?;
    if count > MAX_GPUS {
        return Err(format!("NVML reports {count} GPUs, more than {MAX_GPUS}"));
    }
    let mut gpus: Vec<GpuFacts> = (0..count).map(|i| facts(nvml, i)).collect();
    identify(nvml, &mut gpus, proc);
    Ok((gpus, nvml.sys_driver_version().ok()))
}

/// A lost GPU may give no minor (no handle, or GPU_IS_LOST on every query) or not be
/// counted at all. Each GPU the driver lists whose minor NVML did not name is looked up by
/// its PCI address instead, and takes the place of an entry NVML could not identify.
fn identify(nvml: &Nvml, gpus: &mut Vec<GpuFacts>, proc: &[ProcGpu]) {
    for p in proc {
        if gpus.iter().any(|g| g.minor.value() == Some(&p.minor)) {
            continue;
        }
        let slot = gpus.iter().position(|g| g.minor.value().is_none());
        let index = slot.map_or(gpus.len() as u32, |i| gpus[i].index);
        let f = by_pci(nvml, p, index);
        match slot {
            Some(i) => gpus[i] = f,
            None => gpus.push(f),
        }
    }
}

/// One GPU by its PCI address, carrying the driver's minor, address and UUID whatever
/// NVML answers.
fn by_pci(nvml: &Nvml, p: &ProcGpu, index: u32) -> GpuFacts {
    let bus = p.nvml_bus_id();
    let mut f = match nvml.device_by_pci_bus_id(bus.as_str()) {
        Ok(dev) => facts_of(nvml, &dev, index),
        Err(NvmlError::GpuLost) => GpuFacts::unreachable(index, LOST.into(), true),
        Err(NvmlError::NotFound) => GpuFacts::unreachable(
            index,
            format!("{LOST}: the driver lists it, NVML does not count it"),
            true,
        ),
        Err(e) => GpuFacts::unreachable(index, e.to_string(), false),
    };
    f.minor = Reading::Value(p.minor);
    f.pci_bus_id = Reading::Value(bus);
    if let (None, Some(u)) = (f.uuid.value(), &p.uuid) {
        f.uuid = Reading::Value(u.clone());
    }
    f
}

fn facts(nvml: &Nvml, index: u32) -> GpuFacts {
    match nvml.device_by_index(index) {
        Ok(d) => facts_of(nvml, &d, index),
        Err(NvmlError::GpuLost) => GpuFacts::unreachable(index, LOST.into(), true),
        Err(e) => GpuFacts::unreachable(index, e.to_string(), false),
    }
}

fn facts_of(nvml: &Nvml, dev: &nvml_wrapper::Device, index: u32) -> GpuFacts {
    let link = |cur: Result<u32, NvmlError>, max: Result<u32, NvmlError>| match (cur, max) {
        (Ok(current), Ok(max)) => Reading::Value(Link { current, max }),
        (Err(e), _) | (_, Err(e)) => Reading::from_error(e),
    };
    GpuFacts {
        index,
        unreachable: None,
        minor: Reading::from_result(dev.minor_number()),
        uuid: Reading::from_result(dev.uuid()),
        pci_bus_id: Reading::from_result(dev.pci_info().map(|p| p.bus_id)),
        remapped_rows: Reading::from_result(remapped_rows(nvml, dev)),
        retired_pages_pending: Reading::from_result(dev.are_pages_pending_retired()),
        volatile_uncorrectable_ecc: Reading::from_result(
            dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
        ),
        throttle_reasons: Reading::from_result(dev.current_throttle_reasons().map(|r| r.bits())),
        pcie_gen: link(dev.current_pcie_link_gen(), dev.max_pcie_link_gen()),
        pcie_width: link(dev.current_pcie_link_width(), dev.max_pcie_link_width()),
    }
}

/// nvmlDeviceGetRemappedRows (Ampere and later), which nvml-wrapper does not wrap. The
/// symbol is looked up first: calling a missing one through the sys layer panics.
fn remapped_rows(nvml: &Nvml, dev: &nvml_wrapper::Device) -> Result<RemappedRows, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corr, mut unc, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the symbol comes from the library `nvml` was initialised from and lives as
    // long as `nvml`; the handle belongs to that library; the out-pointers are locals.
    unsafe {
        nvml_try(sym(
            dev.handle(),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        ))?;
    }
    Ok(RemappedRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failure: failure != 0,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn healthy(index: u32) -> GpuFacts {
        GpuFacts {
            index,
            unreachable: None,
            minor: Reading::Value(index),
            uuid: Reading::Value(format!("GPU-{index:08x}-0000-0000-0000-000000000000")),
            pci_bus_id: Reading::Value(format!("00000000:{:02X}:00.0", 0x1b + index * 0x10)),
            remapped_rows: Reading::Value(RemappedRows {
                correctable: 0,
                uncorrectable: 0,
                pending: false,
                failure: false,
            }),
            retired_pages_pending: Reading::Value(false),
            volatile_uncorrectable_ecc: Reading::Value(0),
            throttle_reasons: Reading::Value(0x1),
            pcie_gen: Reading::Value(Link { current: 4, max: 4 }),
            pcie_width: Reading::Value(Link {
                current: 16,
                max: 16,
            }),
        }
    }

    #[test]
    fn missing_library_is_unknown_with_the_reason() {
        let s = NvmlAnswer::take(
            Path::new("/nonexistent/libnvidia-ml.so.1"),
            Duration::from_secs(5),
            Vec::new(),
        );
        let e = s.gpus.unwrap_err();
        assert!(
            e.starts_with("cannot load /nonexistent/libnvidia-ml.so.1: "),
            "{e}"
        );
        // a library that is not NVML at all
        let s = NvmlAnswer::take(Path::new("libc.so.6"), Duration::from_secs(5), Vec::new());
        let e = s.gpus.unwrap_err();
        assert!(e.contains("is not a usable NVML library"), "{e}");
    }
}
