//! The NVML probe: what the NVIDIA driver says about each GPU assigned to a container.
//!
//! NVML is opened once per hook call, only when a container has an NVIDIA GPU, on a thread
//! of its own: a dying GPU can make NVML block for minutes, so the hook waits at most
//! `probe_timeout_ms` and then abandons the thread (see [`abandoned`]). What the thread
//! brings back is plain data, a [`NvmlAnswer`]; judging it ([`checks`]) is pure and is where
//! every threshold lives.
//!
//! nvml-wrapper resolves every symbol when the library loads and keeps the failures, so its
//! safe methods return `FailedToLoadSymbol` for a function an old driver lacks. Only its
//! `Drop` (nvmlShutdown) and the raw calls devgate makes itself through [`Nvml::lib`] would
//! panic on a missing symbol; both check the symbol first.

use super::pci::PciAddr;
use crate::discover::gpu::{GpuSelector, NVIDIA_VISIBLE_DEVICES};
use crate::model::class::NVIDIA_GPU;
use crate::model::device::{Device, Source};
use crate::model::verdict::Verdict;
use crate::probe::counters::GpuCounters;
use crate::probe::Probe;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::Nvml;
use serde::Serialize;
use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// More GPUs than any node has; a library reporting more is broken or hostile.
const MAX_GPUS: u32 = 256;

/// Throttle reasons that mean the hardware is protecting itself, not policy (power cap,
/// idle, application clocks): NVML's HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE.
const THROTTLE_REASONS: [(u64, &str); 4] = [
    (0x08, "hw_slowdown"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
];

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

    fn from_error(e: NvmlError) -> Reading<T> {
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

    fn is_lost(&self) -> bool {
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
    fn unreachable(index: u32, why: String, lost: bool) -> GpuFacts {
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
    /// Opens NVML, reads every GPU and closes it again, within `timeout`.
    pub fn take(library: &Path, timeout: Duration) -> NvmlAnswer {
        let started = Instant::now();
        let (gpus, driver_version) = with_deadline(library.as_os_str().to_owned(), timeout);
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
) -> (Result<Vec<GpuFacts>, String>, Option<String>) {
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("devgate-nvml".into())
        .spawn(move || collect(&library, &tx));
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
fn collect(library: &OsString, tx: &mpsc::Sender<Msg>) {
    let nvml = match Nvml::builder().lib_path(library).init() {
        Ok(n) => n,
        Err(e) => {
            let _ = tx.send(Msg::Facts(Err(init_error(library, &e))));
            return;
        }
    };
    let result = inventory(&nvml);
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

fn inventory(nvml: &Nvml) -> Result<(Vec<GpuFacts>, Option<String>), String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML cannot count GPUs: {e}"))?;
    if count > MAX_GPUS {
        return Err(format!("NVML reports {count} GPUs, more than {MAX_GPUS}"));
    }
    let gpus = (0..count).map(|i| facts(nvml, i)).collect();
    Ok((gpus, nvml.sys_driver_version().ok()))
}

fn facts(nvml: &Nvml, index: u32) -> GpuFacts {
    let dev = match nvml.device_by_index(index) {
        Ok(d) => d,
        Err(NvmlError::GpuLost) => return GpuFacts::unreachable(index, "GPU is lost".into(), true),
        Err(e) => return GpuFacts::unreachable(index, e.to_string(), false),
    };
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
        remapped_rows: Reading::from_result(remapped_rows(nvml, &dev)),
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

/// One check's result, as `devgate status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub check: &'static str,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// Thresholds the operator sets.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_volatile_uncorrectable_ecc: u64,
}

/// Judges one GPU's facts, check by check. Pure.
pub fn checks(g: &GpuFacts, limits: Limits) -> Vec<Check> {
    let mut out = Vec::new();
    let mut push = |check, verdict| out.push(Check { check, verdict });
    push(
        "reachable",
        match &g.unreachable {
            Some(why) if g.is_lost() => Verdict::Unhealthy(format!("unreachable: {why}")),
            Some(why) => Verdict::Unknown(format!("no NVML handle: {why}")),
            None if g.is_lost() => Verdict::Unhealthy("GPU is lost".into()),
            None => Verdict::Healthy,
        },
    );
    push(
        "remapped_rows",
        judge(&g.remapped_rows, "remapped rows", |r| {
            if r.failure {
                Verdict::Unhealthy(format!(
                    "row remapping failed ({} uncorrectable rows, {} correctable)",
                    r.uncorrectable, r.correctable
                ))
            } else if r.pending {
                Verdict::Unhealthy(format!(
                    "row remapping pending, reset required ({} uncorrectable rows, {} correctable)",
                    r.uncorrectable, r.correctable
                ))
            } else {
                Verdict::Healthy
            }
        }),
    );
    push(
        "retired_pages",
        judge(&g.retired_pages_pending, "retired pages", |p| {
            if *p {
                Verdict::Unhealthy("retired pages pending, reboot required".into())
            } else {
                Verdict::Healthy
            }
        }),
    );
    push(
        "volatile_ecc",
        judge(&g.volatile_uncorrectable_ecc, "volatile ECC", |n| {
            let max = limits.max_volatile_uncorrectable_ecc;
            if *n > max {
                Verdict::Unhealthy(format!("volatile uncorrectable ECC errors {n} > {max}"))
            } else {
                Verdict::Healthy
            }
        }),
    );
    push(
        "throttle",
        judge(&g.throttle_reasons, "throttle reasons", |bits| {
            let active: Vec<&str> = THROTTLE_REASONS
                .iter()
                .filter(|(b, _)| bits & b != 0)
                .map(|(_, n)| *n)
                .collect();
            if active.is_empty() {
                Verdict::Healthy
            } else {
                Verdict::Warn(format!(
                    "clocks throttled by {} (reasons 0x{bits:x})",
                    active.join(", ")
                ))
            }
        }),
    );
    let pcie = [
        judge(&g.pcie_gen, "PCIe link generation", |l| {
            below(l, "PCIe link gen ", "")
        }),
        judge(&g.pcie_width, "PCIe link width", |l| {
            below(l, "PCIe link width x", "x")
        }),
    ];
    let mut pcie = pcie.to_vec();
    pcie.dedup(); // a lost GPU fails both the same way; say it once
    push("pcie_link", Verdict::worst(pcie));
    out
}

fn below(l: &Link, what: &str, unit: &str) -> Verdict {
    if l.current < l.max {
        Verdict::Warn(format!("{what}{} below max {unit}{}", l.current, l.max))
    } else {
        Verdict::Healthy
    }
}

fn judge<T>(r: &Reading<T>, what: &str, f: impl FnOnce(&T) -> Verdict) -> Verdict {
    match r {
        Reading::Value(v) => f(v),
        Reading::NotSupported(why) => Verdict::NotApplicable(format!("{what}: {why}")),
        Reading::Lost => Verdict::Unhealthy("GPU is lost".into()),
        Reading::Failed(why) => Verdict::Unknown(format!("cannot read {what}: {why}")),
    }
}

/// The probe's one verdict for a GPU: a lost GPU is one finding, whatever else failed;
/// otherwise the worst checks, prefixed with which GPU NVML means.
pub fn verdict_for(g: &GpuFacts, checks: &[Check]) -> Verdict {
    let label = g.label();
    if g.is_lost() {
        return Verdict::Unhealthy(format!("nvml: GPU {label} has fallen off the bus"));
    }
    let prefix = |r: String| format!("nvml: GPU {label}: {r}");
    match Verdict::worst(checks.iter().map(|c| c.verdict.clone()).collect()) {
        Verdict::Unhealthy(r) => Verdict::Unhealthy(prefix(r)),
        Verdict::Unknown(r) => Verdict::Unknown(prefix(r)),
        Verdict::Warn(r) => Verdict::Warn(prefix(r)),
        Verdict::NotApplicable(_) | Verdict::Healthy => Verdict::Healthy,
    }
}

pub struct NvmlProbe<'a> {
    pub answer: &'a NvmlAnswer,
    pub limits: Limits,
}

impl Probe for NvmlProbe<'_> {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn check(&self, device: &Device) -> Verdict {
        if device.class != NVIDIA_GPU {
            return Verdict::NotApplicable("not an NVIDIA GPU".into());
        }
        let gpus = match &self.answer.gpus {
            Ok(g) => g,
            Err(why) => return Verdict::Unknown(why.clone()),
        };
        let minor = device.num.minor;
        match self.answer.gpu_by_minor(minor) {
            Some(g) => verdict_for(g, &checks(g, self.limits)),
            None => missing_minor(minor, gpus),
        }
    }
}

/// No GPU answered with this minor. When some index had no handle that is most likely the
/// one, and it is lost; otherwise the node has a node with no GPU behind it.
fn missing_minor(minor: u32, gpus: &[GpuFacts]) -> Verdict {
    let unreachable: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            g.unreachable
                .as_ref()
                .map(|why| format!("index {}: {why}", g.index))
        })
        .collect();
    if unreachable.is_empty() {
        Verdict::Unhealthy(format!(
            "nvml: no GPU with minor number {minor} among the {} GPUs NVML reports",
            gpus.len()
        ))
    } else {
        Verdict::Unhealthy(format!(
            "nvml: no reachable GPU with minor number {minor}; unreachable {}",
            unreachable.join(", ")
        ))
    }
}

/// The minors a container's GPU selectors name, and a sentence for each one that names no
/// GPU. NVML's answer decides; a GPU without a handle (lost) and every GPU when NVML is
/// unusable is taken at the driver's default numbering, index N = /dev/nvidiaN, so that
/// it is still checked and found wanting rather than silently skipped. `nodes` are the
/// `nvidiaN` nodes on the host, for `all` without NVML.
pub fn resolve_selectors(
    selectors: &[(GpuSelector, Source)],
    snapshot: &NvmlAnswer,
    nodes: &[u32],
) -> (Vec<(u32, Source)>, Vec<String>) {
    let mut chosen: Vec<(u32, Source)> = Vec::new();
    let mut unresolved = Vec::new();
    let mut add = |minor: u32, source: Source| {
        if !chosen.iter().any(|(m, _)| *m == minor) {
            chosen.push((minor, source));
        }
    };
    let minor_of = |g: &GpuFacts| g.minor.value().copied().unwrap_or(g.index);
    for (sel, source) in selectors {
        let how = match source {
            Source::CdiAnnotation => "CDI annotation",
            _ => NVIDIA_VISIBLE_DEVICES,
        };
        match (&snapshot.gpus, sel) {
            (Ok(gpus), GpuSelector::All) => gpus.iter().for_each(|g| add(minor_of(g), *source)),
            (Ok(gpus), GpuSelector::Index(i)) => match gpus.get(*i as usize) {
                Some(g) => add(minor_of(g), *source),
                None => unresolved.push(format!(
                    "{how} selects GPU {i} but NVML reports {} GPUs",
                    gpus.len()
                )),
            },
            (Ok(gpus), GpuSelector::Uuid(u)) => {
                match gpus
                    .iter()
                    .find(|g| g.uuid.value().is_some_and(|v| v.eq_ignore_ascii_case(u)))
                {
                    Some(g) => add(minor_of(g), *source),
                    None => {
                        unresolved.push(format!("{how} selects {u}, which NVML does not report"))
                    }
                }
            }
            (Err(_), GpuSelector::All) => nodes.iter().for_each(|n| add(*n, *source)),
            (Err(_), GpuSelector::Index(i)) => add(*i, *source),
            (Err(why), GpuSelector::Uuid(u)) => {
                unresolved.push(format!("{how} selects {u}, which cannot be checked: {why}"))
            }
        }
    }
    (chosen, unresolved)
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

    const L: Limits = Limits {
        max_volatile_uncorrectable_ecc: 0,
    };

    fn verdict(g: &GpuFacts) -> Verdict {
        verdict_for(g, &checks(g, L))
    }

    #[test]
    fn healthy_gpu_passes_every_check() {
        let g = healthy(1);
        let checks = checks(&g, L);
        assert_eq!(checks.len(), 6);
        assert!(
            checks.iter().all(|c| c.verdict == Verdict::Healthy),
            "{checks:?}"
        );
        assert_eq!(verdict(&g), Verdict::Healthy);
        assert_eq!(
            g.label(),
            "GPU-00000001-0000-0000-0000-000000000000 (0000:2b:00.0)"
        );
    }

    #[test]
    fn remap_failure_and_pending_are_unhealthy_with_figures() {
        let mut g = healthy(1);
        g.remapped_rows = Reading::Value(RemappedRows {
            correctable: 1,
            uncorrectable: 3,
            pending: true,
            failure: true,
        });
        assert_eq!(
            verdict(&g),
            Verdict::Unhealthy(
                "nvml: GPU GPU-00000001-0000-0000-0000-000000000000 (0000:2b:00.0): row remapping failed (3 uncorrectable rows, 1 correctable)".into()
            )
        );
        g.remapped_rows = Reading::Value(RemappedRows {
            correctable: 0,
            uncorrectable: 2,
            pending: true,
            failure: false,
        });
        let v = verdict(&g);
        assert!(
            v.reason().unwrap().ends_with(
                "row remapping pending, reset required (2 uncorrectable rows, 0 correctable)"
            ),
            "{v:?}"
        );
    }

    #[test]
    fn retired_pages_ecc_and_several_findings_join() {
        let mut g = healthy(0);
        g.retired_pages_pending = Reading::Value(true);
        g.volatile_uncorrectable_ecc = Reading::Value(2);
        let v = verdict(&g);
        assert_eq!(v.status(), "unhealthy");
        assert!(
            v.reason().unwrap().ends_with(
                ": retired pages pending, reboot required; volatile uncorrectable ECC errors 2 > 0"
            ),
            "{v:?}"
        );
        let lenient = Limits {
            max_volatile_uncorrectable_ecc: 2,
        };
        g.retired_pages_pending = Reading::Value(false);
        assert_eq!(verdict_for(&g, &checks(&g, lenient)), Verdict::Healthy);
    }

    #[test]
    fn lost_gpu_is_one_finding() {
        let mut g = healthy(2);
        g.remapped_rows = Reading::Lost;
        g.throttle_reasons = Reading::Lost;
        g.pcie_gen = Reading::Lost;
        g.pcie_width = Reading::Lost;
        assert_eq!(
            verdict(&g),
            Verdict::Unhealthy(
                "nvml: GPU GPU-00000002-0000-0000-0000-000000000000 (0000:3b:00.0) has fallen off the bus".into()
            )
        );
        let pcie = &checks(&g, L)[5];
        assert_eq!(pcie.verdict, Verdict::Unhealthy("GPU is lost".into()));
        let u = GpuFacts::unreachable(5, "GPU is lost".into(), true);
        assert!(u.is_lost());
        assert_eq!(
            verdict(&u),
            Verdict::Unhealthy("nvml: GPU index 5 has fallen off the bus".into())
        );
    }

    #[test]
    fn throttle_and_pcie_are_warnings() {
        let mut g = healthy(0);
        g.throttle_reasons = Reading::Value(0x4 | 0x40 | 0x8);
        g.pcie_gen = Reading::Value(Link { current: 3, max: 4 });
        g.pcie_width = Reading::Value(Link {
            current: 8,
            max: 16,
        });
        let v = verdict(&g);
        assert_eq!(
            v,
            Verdict::Warn(
                "nvml: GPU GPU-00000000-0000-0000-0000-000000000000 (0000:1b:00.0): clocks throttled by hw_slowdown, hw_thermal (reasons 0x4c); PCIe link gen 3 below max 4; PCIe link width x8 below max x16".into()
            )
        );
        // a power cap alone (0x4) is policy, not a fault
        g = healthy(0);
        g.throttle_reasons = Reading::Value(0x4);
        assert_eq!(verdict(&g), Verdict::Healthy);
    }

    #[test]
    fn unsupported_is_not_applicable_and_failures_unknown() {
        let mut g = healthy(0);
        g.remapped_rows = Reading::from_error(NvmlError::FailedToLoadSymbol("x".into()));
        g.retired_pages_pending = Reading::from_error(NvmlError::NotSupported);
        let checks = checks(&g, L);
        assert_eq!(checks[1].verdict.status(), "not_applicable");
        assert_eq!(checks[2].verdict.status(), "not_applicable");
        assert_eq!(verdict_for(&g, &checks), Verdict::Healthy);
        g.volatile_uncorrectable_ecc = Reading::from_error(NvmlError::Unknown);
        let v = verdict(&g);
        assert_eq!(v.status(), "unknown");
        assert!(
            v.reason().unwrap().contains("cannot read volatile ECC"),
            "{v:?}"
        );
    }

    fn gpu_dev(minor: u32, class: &str) -> Device {
        use crate::model::device::{DevNum, DevType, Source};
        Device {
            num: DevNum {
                typ: DevType::Char,
                major: 195,
                minor,
            },
            class: class.into(),
            container_path: Some(format!("/dev/nvidia{minor}").into()),
            host_path: None,
            source: Source::LinuxDevices,
            file_mode: None,
            uid: None,
            gid: None,
        }
    }

    #[test]
    fn probe_maps_by_minor_and_explains_missing_ones() {
        let mut gpus: Vec<GpuFacts> = (0..4).map(healthy).collect();
        gpus[1].minor = Reading::Value(7); // minors need not follow indices
        gpus[3] = GpuFacts::unreachable(3, "GPU is lost".into(), true);
        let snap = NvmlAnswer {
            gpus: Ok(gpus),
            driver_version: None,
            elapsed_us: 0,
        };
        let p = NvmlProbe {
            answer: &snap,
            limits: L,
        };
        assert_eq!(p.check(&gpu_dev(7, NVIDIA_GPU)), Verdict::Healthy);
        assert_eq!(
            p.check(&gpu_dev(1, NVIDIA_GPU)),
            Verdict::Unhealthy(
                "nvml: no reachable GPU with minor number 1; unreachable index 3: GPU is lost"
                    .into()
            )
        );
        assert_eq!(
            p.check(&gpu_dev(255, "nvidia-ctl")).status(),
            "not_applicable"
        );
        assert_eq!(snap.pci_of_minor(7).unwrap().to_string(), "0000:2b:00.0");
        let failed = NvmlAnswer {
            gpus: Err("NVML did not answer in 2000 ms".into()),
            driver_version: None,
            elapsed_us: 0,
        };
        let p = NvmlProbe {
            answer: &failed,
            limits: L,
        };
        assert_eq!(
            p.check(&gpu_dev(0, NVIDIA_GPU)),
            Verdict::Unknown("NVML did not answer in 2000 ms".into())
        );
    }

    #[test]
    fn selectors_resolve_through_nvml_or_default_numbering() {
        let mut gpus: Vec<GpuFacts> = (0..3).map(healthy).collect();
        gpus[1].minor = Reading::Value(5);
        gpus[2] = GpuFacts::unreachable(2, "GPU is lost".into(), true);
        let ok = NvmlAnswer {
            gpus: Ok(gpus),
            driver_version: None,
            elapsed_us: 0,
        };
        let env = Source::NvidiaVisibleDevices;
        let cdi = Source::CdiAnnotation;
        let sel = vec![
            (GpuSelector::Index(1), env),
            (
                GpuSelector::Uuid("gpu-00000000-0000-0000-0000-000000000000".into()),
                cdi,
            ),
            (GpuSelector::Index(2), env),
            (GpuSelector::Index(9), env),
            (GpuSelector::Uuid("GPU-nope".into()), cdi),
            (GpuSelector::Index(1), cdi),
        ];
        let (chosen, unresolved) = resolve_selectors(&sel, &ok, &[]);
        assert_eq!(chosen, vec![(5, env), (0, cdi), (2, env)]);
        assert_eq!(
            unresolved,
            vec![
                "NVIDIA_VISIBLE_DEVICES selects GPU 9 but NVML reports 3 GPUs".to_string(),
                "CDI annotation selects GPU-nope, which NVML does not report".to_string()
            ]
        );
        let (chosen, _) = resolve_selectors(&[(GpuSelector::All, env)], &ok, &[]);
        assert_eq!(chosen, vec![(0, env), (5, env), (2, env)]);

        let failed = NvmlAnswer {
            gpus: Err("cannot load x".into()),
            driver_version: None,
            elapsed_us: 0,
        };
        let (chosen, unresolved) = resolve_selectors(
            &[
                (GpuSelector::All, env),
                (GpuSelector::Index(4), env),
                (GpuSelector::Uuid("GPU-1".into()), env),
            ],
            &failed,
            &[0, 1],
        );
        assert_eq!(chosen, vec![(0, env), (1, env), (4, env)]);
        assert_eq!(
            unresolved,
            vec!["NVIDIA_VISIBLE_DEVICES selects GPU-1, which cannot be checked: cannot load x"]
        );
    }

    #[test]
    fn missing_library_is_unknown_with_the_reason() {
        let s = NvmlAnswer::take(
            Path::new("/nonexistent/libnvidia-ml.so.1"),
            Duration::from_secs(5),
        );
        let e = s.gpus.unwrap_err();
        assert!(
            e.starts_with("cannot load /nonexistent/libnvidia-ml.so.1: "),
            "{e}"
        );
        // a library that is not NVML at all
        let s = NvmlAnswer::take(Path::new("libc.so.6"), Duration::from_secs(5));
        let e = s.gpus.unwrap_err();
        assert!(e.contains("is not a usable NVML library"), "{e}");
    }
}
