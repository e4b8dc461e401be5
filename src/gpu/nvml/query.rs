//! The NVML calls themselves. They run only in a query process ([`super::isolate`]), never in
//! the hook: a call may block for minutes in the driver.
//!
//! nvml-wrapper resolves every symbol when the library loads and keeps the failures, so its
//! safe methods return `FailedToLoadSymbol` for a function an old driver lacks. Only the raw
//! call devgate makes itself through [`Nvml::lib`] would panic on a missing symbol; it
//! checks the symbol first. The process ends with `_exit` and never calls nvmlShutdown.

use super::error::QueryError;
use super::facts::{GpuFacts, Link, Reading, RemappedRows, LOST, MAX_GPUS};
use nvml_wrapper::bitmasks::InitFlags;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};
use std::ffi::OsStr;

/// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h; 230 since driver R550), whose value is an
/// nvmlDeviceGpuRecoveryAction_t.
pub const FI_DEV_GET_GPU_RECOVERY_ACTION: u32 = 230;

/// Opens NVML with `flags`. Never with NVML_INIT_FLAG_NO_ATTACH: it does not defer the
/// attach to the handle lookups but leaves NVML no GPU at all (measured on an H200, driver
/// 580.159.04: count 0, a lookup by PCI bus id NOT_FOUND, by index INVALID_ARGUMENT). Init
/// attaches every GPU NVML enumerates; a query child asking about one GPU shows NVML only
/// that GPU first ([`super::view`]).
pub fn open(library: &OsStr, flags: InitFlags) -> Result<Nvml, QueryError> {
    Nvml::builder()
        .lib_path(library)
        .flags(flags)
        .init()
        .map_err(|e| init_error(library, &e))
}

fn init_error(library: &OsStr, e: &NvmlError) -> QueryError {
    let library = library.to_string_lossy().into_owned();
    match e {
        NvmlError::LibloadingError(le) => QueryError::Load {
            library,
            cause: le.to_string(),
        },
        NvmlError::FailedToLoadSymbol(s) => QueryError::NotNvml {
            library,
            cause: s.clone(),
        },
        other => QueryError::Init {
            library,
            cause: other.to_string(),
        },
    }
}

/// One GPU, by its PCI address as NVML writes it (`00000000:3B:00.0`). `index` is only the
/// label used when NVML cannot give the UUID.
pub fn one_gpu(nvml: &Nvml, bus_id: &str, index: u32) -> GpuFacts {
    match nvml.device_by_pci_bus_id(bus_id) {
        Ok(dev) => facts_of(&dev, index),
        Err(NvmlError::GpuLost) => GpuFacts::unreachable(index, LOST.into(), true),
        Err(NvmlError::NotFound) => GpuFacts::unreachable(
            index,
            format!("{LOST}: the driver lists it, NVML does not count it"),
            true,
        ),
        Err(e) => GpuFacts::unreachable(index, format!("no NVML handle: {e}"), false),
    }
}

/// Every GPU NVML counts, by index: only for a node whose driver list cannot be read, where
/// nothing else says which PCI address /dev/nvidiaN is.
pub fn every_gpu(nvml: &Nvml) -> Result<Vec<GpuFacts>, QueryError> {
    let count = nvml.device_count().map_err(|e| QueryError::Count {
        cause: e.to_string(),
    })?;
    if count > MAX_GPUS {
        return Err(QueryError::TooMany {
            count,
            max: MAX_GPUS,
        });
    }
    Ok((0..count)
        .map(|i| match nvml.device_by_index(i) {
            Ok(d) => facts_of(&d, i),
            Err(NvmlError::GpuLost) => GpuFacts::unreachable(i, LOST.into(), true),
            Err(e) => GpuFacts::unreachable(i, format!("no NVML handle: {e}"), false),
        })
        .collect())
}

fn facts_of(dev: &Device, index: u32) -> GpuFacts {
    let link = |cur: Result<u32, NvmlError>, max: Result<u32, NvmlError>| match (cur, max) {
        (Ok(current), Ok(max)) => Reading::Value(Link { current, max }),
        (Err(e), _) | (_, Err(e)) => Reading::from_error(e),
    };
    GpuFacts {
        index,
        unreachable: None,
        unreachable_code: None,
        minor: Reading::from_result(dev.minor_number()),
        uuid: Reading::from_result(dev.uuid()),
        pci_bus_id: Reading::from_result(dev.pci_info().map(|p| p.bus_id)),
        remapped_rows: Reading::from_result(remapped_rows(dev)),
        retired_pages_pending: Reading::from_result(dev.are_pages_pending_retired()),
        volatile_uncorrectable_ecc: Reading::from_result(
            dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
        ),
        throttle_reasons: Reading::from_result(dev.current_throttle_reasons().map(|r| r.bits())),
        pcie_gen: link(dev.current_pcie_link_gen(), dev.max_pcie_link_gen()),
        pcie_width: link(dev.current_pcie_link_width(), dev.max_pcie_link_width()),
        recovery_action: Reading::from_result(recovery_action(dev)),
        drain: Reading::from_result(dev.is_drain_enabled(None)),
        pcie_replay: Reading::from_result(dev.pcie_replay_counter()),
    }
}

/// The recovery action field. A driver that does not know the field answers NOT_SUPPORTED
/// in the field's own return, a driver without nvmlDeviceGetFieldValues in the call's.
fn recovery_action(dev: &Device) -> Result<u32, NvmlError> {
    let mut got = dev.field_values_for(&[FieldId(FI_DEV_GET_GPU_RECOVERY_ACTION)])?;
    let sample = got.pop().ok_or(NvmlError::Unknown)??;
    match sample.value? {
        SampleValue::U32(v) => Ok(v),
        SampleValue::U64(v) => u32::try_from(v).map_err(|_| NvmlError::Unknown),
        SampleValue::I64(v) => u32::try_from(v).map_err(|_| NvmlError::Unknown),
        _ => Err(NvmlError::Unknown),
    }
}

/// nvmlDeviceGetRemappedRows (Ampere and later), which nvml-wrapper does not wrap. The
/// symbol is looked up first: calling a missing one through the sys layer panics.
fn remapped_rows(dev: &Device) -> Result<RemappedRows, NvmlError> {
    let sym = nvml_sym(dev.nvml().lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corr, mut unc, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the symbol comes from the library the device's NVML was initialised from and
    // lives as long as it; the handle belongs to that library; the out-pointers are locals.
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
