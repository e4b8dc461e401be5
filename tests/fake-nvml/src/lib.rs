//! A fake NVML. Every exported function takes its answer from the JSON file named by
//! FAKE_NVML_CONFIG, read at nvmlInit_v2 / nvmlInitWithFlags:
//!
//! ```json
//! {"driver_version": "550.54.15",
//!  "hang_ms": {"nvmlDeviceGetRemappedRows": 30000},
//!  "init_error": 9,
//!  "call_log": "/tmp/…/calls",
//!  "gpus": [{"uuid": "GPU-…", "pci_bus_id": "00000000:3B:00.0", "minor": 1,
//!            "lost_at": "query",
//!            "missing": false,
//!            "hang_ms": {"*": 600000},
//!            "name": "NVIDIA H100 80GB HBM3", "persistence_mode": true,
//!            "remapped_rows": {"correctable": 0, "uncorrectable": 3, "pending": false, "failure": true},
//!            "retired_pages_pending": false, "volatile_uncorrectable_ecc": 0,
//!            "throttle_reasons": 0,
//!            "pcie": {"gen": 4, "max_gen": 4, "width": 16, "max_width": 16, "replay_counter": 0},
//!            (no `replay_counter`: nvmlDeviceGetPcieReplayCounter answers NOT_SUPPORTED)
//!            "recovery_action": 0, "field_values": {"94": 0}, "drain": false,
//!            "not_supported": ["nvmlDeviceGetTotalEccErrors"]}]}
//! ```
//!
//! How a GPU fails, the way the real library reports it:
//! - `lost_at: "handle"` (old spelling `unreachable: true`): its handle lookups, by index, PCI
//!   bus id or UUID, answer NVML_ERROR_GPU_IS_LOST;
//! - `lost_at: "query"` (old spelling `lost: true`): its handle is given, every health query
//!   answers GPU_IS_LOST, the identity ones (minor, UUID, PCI info) still answer;
//! - `lost_at: "every_query"`: its handle is given, then every query answers GPU_IS_LOST,
//!   nvmlDeviceGetMinorNumber, nvmlDeviceGetUUID and nvmlDeviceGetPciInfo_v3 included;
//! - `missing: true`: NVML does not count it; indices run over the GPUs it does count, and
//!   lookups by PCI bus id or UUID answer NVML_ERROR_NOT_FOUND;
//! - a GPU's own `crash_at`, a function name: that query aborts the calling process;
//! - a GPU's own `hang_ms`, by function name, `attach`, or `*` for every call that touches
//!   that GPU (attach included): those calls sleep that long, other GPUs answer. The
//!   top-level `hang_ms` delays a function for every GPU, as before.
//!
//! Attaching: NVML opens a GPU ("attaches" it) before it can answer for it. nvmlInit_v2 and
//! nvmlInitWithFlags without NVML_INIT_FLAG_NO_ATTACH (2) attach every counted GPU, so one
//! GPU that hangs at attach hangs the init.
//!
//! NVML_INIT_FLAG_NO_ATTACH does not defer the attach to the handle lookups: NVML then has
//! no GPU at all. Measured with ctypes on an NVIDIA H200, driver 580.159.04 (2026-12-04):
//! with flags 2 (or 3, NO_GPUS|NO_ATTACH) init succeeds, nvmlDeviceGetCount_v2 gives 0,
//! nvmlDeviceGetHandleByPciBusId_v2("00000000:00:06.0") NVML_ERROR_NOT_FOUND (6) and
//! nvmlDeviceGetHandleByIndex_v2(0) NVML_ERROR_INVALID_ARGUMENT (2); with flags 0 or 1
//! (NO_GPUS) the count is 1 and both lookups succeed. The fake does the same: under
//! NO_ATTACH it counts nothing, lookups by PCI bus id or UUID answer NOT_FOUND, by index
//! INVALID_ARGUMENT.
//!
//! The GPUs NVML counts are the ones the driver lists in /proc/driver/nvidia/gpus (the
//! container toolkit hides a container's other GPUs by mounting over that list). Where the
//! scenario names `"proc_gpus": "<dir>"`, the fake counts (and attaches) only the GPUs whose
//! `<dir>/<canonical address>` directory exists at init, as the real library does; without
//! it, every GPU of the scenario is listed.
//!
//! Every other function nvml-wrapper looks up is exported too and answers
//! NVML_ERROR_NOT_SUPPORTED (`stubs.rs`), as the real library exports them all.
//!
//! One process can load several copies of the library (each a file of its own): a copy with
//! no FAKE_NVML_CONFIG reads `<its own path>.json`.
//!
//! `pid_log` names a file that gets `ADDRESS PID` from each process about to hang on a GPU.
//!
//! `call_log` names a file the library appends one line to per call, before the call can
//! hang: `FUNCTION TARGET`, TARGET being the canonical PCI address (`0000:3b:00.0`) of the
//! GPU the call concerns, `-` for none, or for init `flags=0xN`; `attach 0000:3b:00.0` marks
//! each attach. Tests read it to see which GPUs were queried. If FAKE_NVML_MARKER names a
//! file, a line is appended to it when the library is loaded and at every init, which is
//! how tests prove devgate did or did not load NVML.
#![allow(clippy::missing_safety_doc, non_snake_case)]

mod stubs;

use serde_json::Value;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

type Ret = c_uint;
type Handle = *mut c_void;

const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const GPU_IS_LOST: Ret = 15;

const INIT_FLAG_NO_ATTACH: c_uint = 2;

/// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; its value is an nvmlDeviceGpuRecoveryAction_t.
const FI_DEV_GET_GPU_RECOVERY_ACTION: c_uint = 230;
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
const VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;

struct State {
    cfg: Value,
    /// Per entry of `gpus`: attached yet.
    attached: Vec<bool>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

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

fn config() -> Option<Value> {
    Some(STATE.lock().ok()?.as_ref()?.cfg.clone())
}

/// One line in the call log, written whole with one append so that concurrent callers (and
/// processes) never interleave inside a line.
fn log_call(cfg: &Value, func: &str, target: &str) {
    let Some(path) = cfg["call_log"].as_str() else {
        return;
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(format!("{func} {target}\n").as_bytes());
    }
}

fn sleep_ms(ms: Option<u64>) {
    if let Some(ms) = ms.filter(|&ms| ms > 0) {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// The top-level delay of `func`, for every GPU.
fn hang(cfg: &Value, func: &str) {
    sleep_ms(cfg["hang_ms"][func].as_u64());
}

/// GPU `g`'s own delay of `func` (or of every call, `*`).
fn hang_gpu(cfg: &Value, g: &Value, func: &str) {
    let own = &g["hang_ms"];
    let ms = own[func].as_u64().or_else(|| own["*"].as_u64());
    note_hang(cfg, g, ms);
    sleep_ms(ms);
}

/// A handle lookup's own delay, by its name only: under `*` the lookup hangs where the real
/// one does, attaching the GPU.
fn hang_lookup(cfg: &Value, g: &Value, func: &str) {
    let ms = g["hang_ms"][func].as_u64();
    note_hang(cfg, g, ms);
    sleep_ms(ms);
}

/// `pid_log` names a file that gets `ADDRESS PID` for each process about to hang on a GPU:
/// how tests find, and end, the process the caller left behind.
fn note_hang(cfg: &Value, g: &Value, ms: Option<u64>) {
    let (Some(path), Some(_)) = (cfg["pid_log"].as_str(), ms.filter(|&ms| ms > 0)) else {
        return;
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(format!("{} {}\n", canonical(g), std::process::id()).as_bytes());
    }
}

/// (domain, bus, device, function) from `domain:bus:device.function`, `domain:bus:device`
/// or `bus:device.function`, all hexadecimal: the forms nvmlDeviceGetHandleByPciBusId_v2
/// accepts.
fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, Option<u32>)> {
    let hex = |p: &str| {
        (!p.is_empty() && p.len() <= 8 && p.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(p, 16).ok())
            .flatten()
    };
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [d, b, r] => (hex(d)?, hex(b)?, *r),
        [b, r] if r.contains('.') => (0, hex(b)?, *r),
        _ => return None,
    };
    let (device, function) = match rest.split_once('.') {
        Some((d, f)) => (hex(d)?, Some(hex(f)?)),
        None => (hex(rest)?, None),
    };
    (bus <= 0xff && device <= 0x1f && function.unwrap_or(0) <= 7)
        .then_some((domain, bus, device, function))
}

fn gpu_bus(g: &Value) -> (u32, u32, u32, u32) {
    let (d, b, dev, f) =
        parse_bus_id(g["pci_bus_id"].as_str().unwrap_or("0:0:0.0")).unwrap_or((0, 0, 0, None));
    (d, b, dev, f.unwrap_or(0))
}

/// `0000:3b:00.0`, the form the call log uses.
fn canonical(g: &Value) -> String {
    let (d, b, dev, f) = gpu_bus(g);
    format!("{d:04x}:{b:02x}:{dev:02x}.{f}")
}

fn lost_at(g: &Value) -> &str {
    if let Some(s) = g["lost_at"].as_str() {
        return s;
    }
    if g["unreachable"].as_bool() == Some(true) {
        "handle"
    } else if g["lost"].as_bool() == Some(true) {
        "query"
    } else {
        ""
    }
}

fn missing(g: &Value) -> bool {
    g["missing"].as_bool() == Some(true) || g["_unlisted"].as_bool() == Some(true)
}

/// Positions in `gpus` of the GPUs NVML counts, in index order: none after an init with
/// NVML_INIT_FLAG_NO_ATTACH, as the real library.
fn counted(cfg: &Value) -> Vec<usize> {
    if cfg["_no_attach"].as_bool() == Some(true) {
        return Vec::new();
    }
    cfg["gpus"]
        .as_array()
        .map(|a| (0..a.len()).filter(|&i| !missing(&a[i])).collect())
        .unwrap_or_default()
}

/// Opens GPU `pos` once: logs it and takes its `attach` delay, outside the lock so that
/// other GPUs' calls go on meanwhile.
fn attach(cfg: &Value, pos: usize) {
    let done = STATE
        .lock()
        .ok()
        .and_then(|s| {
            s.as_ref()
                .map(|s| s.attached.get(pos).copied().unwrap_or(true))
        })
        .unwrap_or(true);
    if done {
        return;
    }
    let g = &cfg["gpus"][pos];
    log_call(cfg, "attach", &canonical(g));
    hang_gpu(cfg, g, "attach");
    if let Ok(mut s) = STATE.lock() {
        if let Some(flag) = s.as_mut().and_then(|s| s.attached.get_mut(pos)) {
            *flag = true;
        }
    }
}

/// The handle for GPU `pos` after a lookup found it: lost-at-handle GPUs fail here.
unsafe fn give_handle(cfg: &Value, pos: usize, out: *mut Handle) -> Ret {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    if lost_at(&cfg["gpus"][pos]) == "handle" {
        return GPU_IS_LOST;
    }
    attach(cfg, pos);
    out.write((pos + 1) as Handle);
    SUCCESS
}

/// The GPU behind a handle (its position in `gpus` + 1), with the query's common failures
/// applied: the call is logged, then delayed, then refused if not supported or lost.
fn gpu(h: Handle, func: &str, identity: bool) -> Result<Value, Ret> {
    let cfg = config().ok_or(UNINITIALIZED)?;
    let pos = (h as usize).checked_sub(1).ok_or(INVALID_ARGUMENT)?;
    let g = cfg["gpus"].get(pos).cloned().ok_or(INVALID_ARGUMENT)?;
    log_call(&cfg, func, &canonical(&g));
    if g["crash_at"].as_str() == Some(func) {
        // a library that crashes the process calling it, as a driver bug can
        std::process::abort();
    }
    hang(&cfg, func);
    hang_gpu(&cfg, &g, func);
    if g["not_supported"]
        .as_array()
        .is_some_and(|a| a.iter().any(|f| f == func))
    {
        return Err(NOT_SUPPORTED);
    }
    match lost_at(&g) {
        "every_query" => return Err(GPU_IS_LOST),
        "query" if !identity => return Err(GPU_IS_LOST),
        _ => {}
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

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

extern "C" {
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
}

/// FAKE_NVML_CONFIG, else `<this library's path>.json`. The second lets one test process
/// load several copies of the library, each with its own GPUs, without sharing (and
/// racing on) one environment variable.
fn config_path() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("FAKE_NVML_CONFIG") {
        return Some(p.into());
    }
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the address and fills `info`; the name it points to lives
    // as long as the library stays loaded.
    let own = unsafe {
        if dladdr(config_path as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    };
    Some(format!("{own}.json").into())
}

fn init(func: &str, flags: c_uint) -> Ret {
    mark("init");
    let Some(path) = config_path() else {
        return DRIVER_NOT_LOADED;
    };
    let Ok(text) = std::fs::read(&path) else {
        return DRIVER_NOT_LOADED;
    };
    let Ok(mut cfg) = serde_json::from_slice::<Value>(&text) else {
        return DRIVER_NOT_LOADED;
    };
    log_call(&cfg, func, &format!("flags={flags:#x}"));
    unlist_hidden(&mut cfg);
    if flags & INIT_FLAG_NO_ATTACH != 0 {
        cfg["_no_attach"] = Value::Bool(true);
    }
    if let Some(e) = cfg["init_error"].as_u64() {
        return e as Ret;
    }
    let n = cfg["gpus"].as_array().map(|a| a.len()).unwrap_or(0);
    if let Ok(mut s) = STATE.lock() {
        *s = Some(State {
            cfg: cfg.clone(),
            attached: vec![false; n],
        });
    }
    hang(&cfg, func);
    if flags & INIT_FLAG_NO_ATTACH == 0 {
        for pos in counted(&cfg) {
            attach(&cfg, pos);
        }
    }
    SUCCESS
}

/// Marks `_unlisted` each GPU whose directory under `proc_gpus` is not there now: NVML
/// enumerates the driver's list at init and counts nothing else.
fn unlist_hidden(cfg: &mut Value) {
    let Some(dir) = cfg["proc_gpus"].as_str().map(std::path::PathBuf::from) else {
        return;
    };
    if let Some(gpus) = cfg["gpus"].as_array_mut() {
        for g in gpus {
            if !dir.join(canonical(g)).is_dir() {
                g["_unlisted"] = Value::Bool(true);
            }
        }
    }
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    init("nvmlInit_v2", 0)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> Ret {
    init("nvmlInitWithFlags", flags)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    let cfg = config();
    if let Some(cfg) = &cfg {
        log_call(cfg, "nvmlShutdown", "-");
    }
    let ms = cfg
        .and_then(|c| c["hang_ms"]["nvmlShutdown"].as_u64())
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
    let Some(cfg) = config() else {
        return UNINITIALIZED;
    };
    put_str(
        buf,
        len,
        cfg["driver_version"].as_str().unwrap_or("550.54.15"),
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    let Some(cfg) = config() else {
        return UNINITIALIZED;
    };
    log_call(&cfg, "nvmlDeviceGetCount_v2", "-");
    hang(&cfg, "nvmlDeviceGetCount_v2");
    put(count, counted(&cfg).len() as c_uint)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut Handle) -> Ret {
    let Some(cfg) = config() else {
        return UNINITIALIZED;
    };
    let Some(&pos) = counted(&cfg).get(index as usize) else {
        log_call(&cfg, "nvmlDeviceGetHandleByIndex_v2", "-");
        return INVALID_ARGUMENT;
    };
    let g = &cfg["gpus"][pos];
    log_call(&cfg, "nvmlDeviceGetHandleByIndex_v2", &canonical(g));
    hang(&cfg, "nvmlDeviceGetHandleByIndex_v2");
    hang_lookup(&cfg, g, "nvmlDeviceGetHandleByIndex_v2");
    give_handle(&cfg, pos, out)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    out: *mut Handle,
) -> Ret {
    let Some(cfg) = config() else {
        return UNINITIALIZED;
    };
    const FUNC: &str = "nvmlDeviceGetHandleByPciBusId_v2";
    if bus_id.is_null() {
        log_call(&cfg, FUNC, "-");
        return INVALID_ARGUMENT;
    }
    let asked = CStr::from_ptr(bus_id).to_string_lossy().into_owned();
    let Some((d, b, dev, f)) = parse_bus_id(&asked) else {
        log_call(&cfg, FUNC, &format!("invalid:{}", asked.escape_default()));
        return INVALID_ARGUMENT;
    };
    log_call(
        &cfg,
        FUNC,
        &format!("{d:04x}:{b:02x}:{dev:02x}.{}", f.unwrap_or(0)),
    );
    hang(&cfg, FUNC);
    let found = counted(&cfg).into_iter().find(|&pos| {
        let (gd, gb, gdev, gf) = gpu_bus(&cfg["gpus"][pos]);
        (gd, gb, gdev) == (d, b, dev) && f.is_none_or(|f| f == gf)
    });
    let Some(pos) = found else {
        return NOT_FOUND;
    };
    hang_lookup(&cfg, &cfg["gpus"][pos], FUNC);
    give_handle(&cfg, pos, out)
}

/// Matches by UUID among the counted GPUs; NVML reads each GPU's UUID to do so, so a GPU
/// lost at every query is never matched (it cannot say its UUID).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, out: *mut Handle) -> Ret {
    let Some(cfg) = config() else {
        return UNINITIALIZED;
    };
    const FUNC: &str = "nvmlDeviceGetHandleByUUID";
    if uuid.is_null() {
        log_call(&cfg, FUNC, "-");
        return INVALID_ARGUMENT;
    }
    let asked = CStr::from_ptr(uuid).to_string_lossy().into_owned();
    let found = counted(&cfg).into_iter().find(|&pos| {
        let g = &cfg["gpus"][pos];
        lost_at(g) != "every_query" && g["uuid"].as_str() == Some(asked.as_str())
    });
    let Some(pos) = found else {
        log_call(&cfg, FUNC, "-");
        return NOT_FOUND;
    };
    log_call(&cfg, FUNC, &canonical(&cfg["gpus"][pos]));
    hang(&cfg, FUNC);
    hang_lookup(&cfg, &cfg["gpus"][pos], FUNC);
    give_handle(&cfg, pos, out)
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

/// nvmlPciInfo_t (v3 layout).
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
    let (domain, bus, device, _) = gpu_bus(&g);
    let mut info = PciInfo {
        bus_id_legacy: [0; 16],
        domain,
        bus,
        device,
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

/// The replay counter is cumulative since the driver loaded, like the real one. A GPU whose
/// scenario has no `pcie.replay_counter` answers NVML_ERROR_NOT_SUPPORTED, as a GPU or
/// driver without the counter does.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(h: Handle, out: *mut c_uint) -> Ret {
    let g = match gpu(h, "nvmlDeviceGetPcieReplayCounter", false) {
        Ok(g) => g,
        Err(e) => return e,
    };
    match g["pcie"]["replay_counter"].as_u64() {
        Some(n) => put(out, n as c_uint),
        None => NOT_SUPPORTED,
    }
}

/// nvmlFieldValue_t.
#[repr(C)]
pub struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: Ret,
    value: u64,
}

/// Each field is answered on its own: the recovery action (`recovery_action`), any field in
/// `field_values` (as an unsigned long long), and NVML_ERROR_NOT_SUPPORTED in that field's
/// own return for the rest, as a driver that does not know a field answers.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    h: Handle,
    count: c_int,
    values: *mut FieldValue,
) -> Ret {
    let g = query!(h, "nvmlDeviceGetFieldValues", false);
    if values.is_null() || count <= 0 {
        return INVALID_ARGUMENT;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    for v in std::slice::from_raw_parts_mut(values, count as usize) {
        v.timestamp = now;
        v.latency_usec = 0;
        let generic = g["field_values"][v.field_id.to_string()].as_u64();
        match (v.field_id, g["recovery_action"].as_u64(), generic) {
            (FI_DEV_GET_GPU_RECOVERY_ACTION, Some(a), _) => {
                v.value_type = VALUE_TYPE_UNSIGNED_INT;
                // uiVal: the union's low 4 bytes (little-endian x86_64 and aarch64).
                v.value = u64::from(a as u32);
                v.nvml_return = SUCCESS;
            }
            (_, _, Some(n)) => {
                v.value_type = VALUE_TYPE_UNSIGNED_LONG_LONG;
                v.value = n;
                v.nvml_return = SUCCESS;
            }
            _ => v.nvml_return = NOT_SUPPORTED,
        }
    }
    SUCCESS
}

/// NVML_FEATURE_ENABLED when the GPU at that address is being drained. The GPU is named by
/// its PCI address, not a handle: NVML answers for a GPU it has no handle for.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceQueryDrainState(pci: *const PciInfo, out: *mut c_uint) -> Ret {
    let Some(cfg) = config() else {
        return UNINITIALIZED;
    };
    const FUNC: &str = "nvmlDeviceQueryDrainState";
    if pci.is_null() || out.is_null() {
        log_call(&cfg, FUNC, "-");
        return INVALID_ARGUMENT;
    }
    let p = &*pci;
    let found = counted(&cfg).into_iter().find(|&pos| {
        let (d, b, dev, _) = gpu_bus(&cfg["gpus"][pos]);
        (d, b, dev) == (p.domain, p.bus, p.device)
    });
    let Some(pos) = found else {
        log_call(
            &cfg,
            FUNC,
            &format!("{:04x}:{:02x}:{:02x}.0", p.domain, p.bus, p.device),
        );
        return INVALID_ARGUMENT;
    };
    let g = &cfg["gpus"][pos];
    log_call(&cfg, FUNC, &canonical(g));
    hang(&cfg, FUNC);
    hang_gpu(&cfg, g, FUNC);
    if g["not_supported"]
        .as_array()
        .is_some_and(|a| a.iter().any(|f| f == FUNC))
    {
        return NOT_SUPPORTED;
    }
    if lost_at(g) == "every_query" {
        return GPU_IS_LOST;
    }
    put(out, g["drain"].as_bool().unwrap_or(false) as c_uint)
}
