//! A fake NVML. Every exported function takes its answer from the JSON file named by
//! FAKE_NVML_CONFIG, read at nvmlInit_v2:
//!
//! ```json
//! {"driver_version": "550.54.15",
//!  "hang_ms": {"nvmlDeviceGetRemappedRows": 30000},
//!  "init_error": 9,
//!  "gpus": [{"uuid": "GPU-…", "pci_bus_id": "00000000:3B:00.0", "minor": 1,
//!            "name": "NVIDIA H100 80GB HBM3", "persistence_mode": true,
//!            "lost": false, "unreachable": false,
//!            "remapped_rows": {"correctable": 0, "uncorrectable": 3, "pending": false, "failure": true},
//!            "retired_pages_pending": false, "volatile_uncorrectable_ecc": 0,
//!            "throttle_reasons": 0, "pcie": {"gen": 4, "max_gen": 4, "width": 16, "max_width": 16},
//!            "not_supported": ["nvmlDeviceGetTotalEccErrors"]}]}
//! ```
//!
//! `lost` makes every per-GPU query but the identity ones answer NVML_ERROR_GPU_IS_LOST;
//! `unreachable` makes the handle lookup itself fail so. If FAKE_NVML_MARKER names a file,
//! a line is appended to it when the library is loaded and at every init, which is how
//! tests prove devgate did or did not load NVML.
#![allow(clippy::missing_safety_doc, non_snake_case)]

use serde_json::Value;
use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

type Ret = c_uint;
type Handle = *mut c_void;

const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const GPU_IS_LOST: Ret = 15;

static STATE: Mutex<Option<Value>> = Mutex::new(None);

fn mark(what: &str) {
    if let Some(p) = std::env::var_os("FAKE_NVML_MARKER") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            let _ = writeln!(f, "{what} pid {}", std::process::id());
        }
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

extern "C" fn on_load() {
    mark("loaded");
}

/// Runs at exit() (and dlclose): takes the state lock, as a real library's teardown takes
/// its own. While nvmlShutdown hangs holding that lock, exit() would hang here too; a
/// caller that abandoned a stuck call must leave with _exit.
#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

extern "C" fn on_unload() {
    let _held = STATE.lock();
    mark("unloaded");
}

fn state() -> Option<Value> {
    STATE.lock().ok()?.clone()
}

fn hang(func: &str) {
    let ms = state()
        .and_then(|s| s["hang_ms"][func].as_u64())
        .unwrap_or(0);
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// The GPU behind a handle (index + 1), with the query's common failures applied.
fn gpu(h: Handle, func: &str, identity: bool) -> Result<Value, Ret> {
    hang(func);
    let s = state().ok_or(UNINITIALIZED)?;
    let i = (h as usize).checked_sub(1).ok_or(INVALID_ARGUMENT)?;
    let g = s["gpus"].get(i).cloned().ok_or(INVALID_ARGUMENT)?;
    if g["not_supported"]
        .as_array()
        .is_some_and(|a| a.iter().any(|f| f == func))
    {
        return Err(NOT_SUPPORTED);
    }
    if !identity && g["lost"].as_bool() == Some(true) {
        return Err(GPU_IS_LOST);
    }
    Ok(g)
}

unsafe fn put<T>(out: *mut T, v: T) -> Ret {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    out.write(v);
    SUCCESS
}

unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Ret {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    if s.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, buf, s.len());
    *buf.add(s.len()) = 0;
    SUCCESS
}

fn u32_of(v: &Value) -> c_uint {
    v.as_u64().unwrap_or(0) as c_uint
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    mark("init");
    let Some(path) = std::env::var_os("FAKE_NVML_CONFIG") else {
        return DRIVER_NOT_LOADED;
    };
    let Ok(text) = std::fs::read(&path) else {
        return DRIVER_NOT_LOADED;
    };
    let Ok(v) = serde_json::from_slice::<Value>(&text) else {
        return DRIVER_NOT_LOADED;
    };
    if let Some(e) = v["init_error"].as_u64() {
        return e as Ret;
    }
    if let Ok(mut s) = STATE.lock() {
        *s = Some(v);
    }
    hang("nvmlInit_v2");
    SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    let ms = state()
        .and_then(|s| s["hang_ms"]["nvmlShutdown"].as_u64())
        .unwrap_or(0);
    if let Ok(mut s) = STATE.lock() {
        // hangs holding the lock, as a library stuck in teardown would
        std::thread::sleep(Duration::from_millis(ms));
        *s = None;
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> Ret {
    let Some(s) = state() else {
        return UNINITIALIZED;
    };
    put_str(
        buf,
        len,
        s["driver_version"].as_str().unwrap_or("550.54.15"),
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    hang("nvmlDeviceGetCount_v2");
    let Some(s) = state() else {
        return UNINITIALIZED;
    };
    let n = s["gpus"].as_array().map(|a| a.len()).unwrap_or(0);
    put(count, n as c_uint)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut Handle) -> Ret {
    hang("nvmlDeviceGetHandleByIndex_v2");
    let Some(s) = state() else {
        return UNINITIALIZED;
    };
    let Some(g) = s["gpus"].get(index as usize) else {
        return INVALID_ARGUMENT;
    };
    if g["unreachable"].as_bool() == Some(true) {
        return GPU_IS_LOST;
    }
    put(out, (index as usize + 1) as Handle)
}

macro_rules! query {
    ($h:expr, $name:literal, $identity:expr) => {
        match gpu($h, $name, $identity) {
            Ok(g) => g,
            Err(e) => return e,
        }
    };
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(h: Handle, out: *mut c_uint) -> Ret {
    let g = query!(h, "nvmlDeviceGetMinorNumber", true);
    put(out, u32_of(&g["minor"]))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(h: Handle, buf: *mut c_char, len: c_uint) -> Ret {
    let g = query!(h, "nvmlDeviceGetUUID", true);
    put_str(buf, len, g["uuid"].as_str().unwrap_or(""))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(h: Handle, buf: *mut c_char, len: c_uint) -> Ret {
    let g = query!(h, "nvmlDeviceGetName", true);
    put_str(
        buf,
        len,
        g["name"].as_str().unwrap_or("NVIDIA H100 80GB HBM3"),
    )
}

/// NVML_FEATURE_ENABLED (1) unless the scenario says `"persistence_mode": false`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(h: Handle, out: *mut c_uint) -> Ret {
    let g = query!(h, "nvmlDeviceGetPersistenceMode", false);
    put(
        out,
        g["persistence_mode"].as_bool().unwrap_or(true) as c_uint,
    )
}

#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(h: Handle, out: *mut PciInfo) -> Ret {
    let g = query!(h, "nvmlDeviceGetPciInfo_v3", true);
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    let id = g["pci_bus_id"].as_str().unwrap_or("00000000:00:00.0");
    let mut info = PciInfo {
        bus_id_legacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pci_device_id: 0x20b010de,
        pci_sub_system_id: 0x147e10de,
        bus_id: [0; 32],
    };
    for (i, b) in id.bytes().take(31).enumerate() {
        info.bus_id[i] = b as c_char;
    }
    for (i, b) in id.bytes().take(15).enumerate() {
        info.bus_id_legacy[i] = b as c_char;
    }
    out.write(info);
    SUCCESS
}

#[cfg(not(feature = "no-remapped-rows"))]
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    h: Handle,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> Ret {
    let g = query!(h, "nvmlDeviceGetRemappedRows", false);
    let r = &g["remapped_rows"];
    if corr.is_null() || unc.is_null() || pending.is_null() || failure.is_null() {
        return INVALID_ARGUMENT;
    }
    *corr = u32_of(&r["correctable"]);
    *unc = u32_of(&r["uncorrectable"]);
    *pending = r["pending"].as_bool().unwrap_or(false) as c_uint;
    *failure = r["failure"].as_bool().unwrap_or(false) as c_uint;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    h: Handle,
    out: *mut c_uint,
) -> Ret {
    let g = query!(h, "nvmlDeviceGetRetiredPagesPendingStatus", false);
    put(
        out,
        g["retired_pages_pending"].as_bool().unwrap_or(false) as c_uint,
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    h: Handle,
    error_type: c_uint,
    counter_type: c_uint,
    out: *mut c_ulonglong,
) -> Ret {
    let g = query!(h, "nvmlDeviceGetTotalEccErrors", false);
    // NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0
    let n = if error_type == 1 && counter_type == 0 {
        g["volatile_uncorrectable_ecc"].as_u64().unwrap_or(0)
    } else {
        0
    };
    put(out, n)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    h: Handle,
    out: *mut c_ulonglong,
) -> Ret {
    let g = query!(h, "nvmlDeviceGetCurrentClocksThrottleReasons", false);
    put(out, g["throttle_reasons"].as_u64().unwrap_or(0))
}

unsafe fn pcie(h: Handle, func: &str, key: &str, default: u64, out: *mut c_uint) -> Ret {
    let g = match gpu(h, func, false) {
        Ok(g) => g,
        Err(e) => return e,
    };
    put(out, g["pcie"][key].as_u64().unwrap_or(default) as c_uint)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(h: Handle, out: *mut c_uint) -> Ret {
    pcie(h, "nvmlDeviceGetCurrPcieLinkGeneration", "gen", 4, out)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(h: Handle, out: *mut c_uint) -> Ret {
    pcie(h, "nvmlDeviceGetMaxPcieLinkGeneration", "max_gen", 4, out)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(h: Handle, out: *mut c_uint) -> Ret {
    pcie(h, "nvmlDeviceGetCurrPcieLinkWidth", "width", 16, out)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(h: Handle, out: *mut c_uint) -> Ret {
    pcie(h, "nvmlDeviceGetMaxPcieLinkWidth", "max_width", 16, out)
}
