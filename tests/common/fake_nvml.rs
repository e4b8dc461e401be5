//! The fake NVML library (tests/fake-nvml), built once per test process, the GPU scenarios
//! the tests give it, its call log, and the non-NVML facts a GPU node has
//! (/proc/driver/nvidia/gpus).

use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// PCI buses of the fake node's GPUs, as on a common 8-GPU server.
pub const BUSES: [u8; 8] = [0x1b, 0x3b, 0x5e, 0x86, 0xaf, 0xd8, 0x19, 0x39];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn build(features: &[&str], name: &str) -> PathBuf {
    let target = root().join("target/fake-nvml");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--quiet", "--locked", "--manifest-path"])
        .arg(root().join("tests/fake-nvml/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target);
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    let out = cmd.output().expect("cargo runs");
    assert!(
        out.status.success(),
        "building the fake NVML failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Both variants come out under the same name; keep each under its own.
    let dest = target.join(name);
    let tmp = target.join(format!("{name}.{}", std::process::id()));
    fs::copy(target.join("debug/libfake_nvml.so"), &tmp).unwrap();
    fs::rename(&tmp, &dest).unwrap();
    dest
}

static LIBS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();

fn libs() -> &'static (PathBuf, PathBuf) {
    LIBS.get_or_init(|| {
        let full = build(&[], "libnvidia-ml-fake.so");
        let old = build(&["no-remapped-rows"], "libnvidia-ml-fake-no-remap.so");
        (full, old)
    })
}

/// The fake with every function devgate uses.
pub fn lib() -> &'static Path {
    &libs().0
}

/// The fake without nvmlDeviceGetRemappedRows, as an older driver's library.
pub fn lib_without_remapped_rows() -> &'static Path {
    &libs().1
}

pub fn uuid(i: usize) -> String {
    format!("GPU-{i:08x}-1111-2222-3333-444444444444")
}

pub fn bus_id(i: usize) -> String {
    format!("00000000:{:02X}:00.0", BUSES[i])
}

/// `0000:3b:00.0`: GPU `i`'s PCI address as the kernel, sysfs, /proc and the fake's call log
/// write it.
pub fn bus(i: usize) -> String {
    format!("0000:{:02x}:00.0", BUSES[i])
}

/// A healthy GPU at index `i`, minor `i`.
pub fn gpu(i: usize) -> Value {
    json!({
        "uuid": uuid(i),
        "pci_bus_id": bus_id(i),
        "minor": i,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
        "retired_pages_pending": false,
        "volatile_uncorrectable_ecc": 0,
        "throttle_reasons": 1,
        "pcie": {"gen": 4, "max_gen": 4, "width": 16, "max_width": 16, "replay_counter": 0},
        "recovery_action": recovery::NONE,
        "drain": false
    })
}

/// A healthy node of `n` GPUs, with `edit` applied to GPU `i`'s JSON.
pub fn node_of_with(n: usize, i: usize, edit: Value) -> Value {
    let mut gpus: Vec<Value> = (0..n).map(gpu).collect();
    for (k, v) in edit.as_object().unwrap() {
        gpus[i][k] = v.clone();
    }
    json!({"driver_version": "550.54.15", "gpus": gpus})
}

/// A healthy 8-GPU node, with `edit` applied to GPU `i`'s JSON.
pub fn node_with(i: usize, edit: Value) -> Value {
    node_of_with(8, i, edit)
}

/// The three ways NVML reports a GPU that fell off the bus, and the other faults the fake
/// models, as edits for [`node_with`].
pub mod fault {
    use serde_json::{json, Value};

    /// Handle lookups (by index, PCI bus id, UUID) answer NVML_ERROR_GPU_IS_LOST.
    pub fn lost_at_handle() -> Value {
        json!({"lost_at": "handle"})
    }

    /// The handle is given; every query then answers GPU_IS_LOST, the minor number too.
    pub fn lost_at_every_query() -> Value {
        json!({"lost_at": "every_query"})
    }

    /// NVML does not count the GPU at all.
    pub fn missing() -> Value {
        json!({"missing": true})
    }

    /// Every call that touches this GPU, attaching it included, sleeps `ms`; the other GPUs
    /// answer. 600 s stands for "never returns" in a test.
    pub fn hangs(ms: u64) -> Value {
        json!({"hang_ms": {"*": ms}})
    }

    /// An idle GPU: the link trained down to gen 1 of 5, full width.
    pub fn idle_link() -> Value {
        json!({"pcie": {"gen": 1, "max_gen": 5, "width": 16, "max_width": 16, "replay_counter": 0}})
    }
}

/// nvmlDeviceGpuRecoveryAction_t, the value of NVML_FI_DEV_GET_GPU_RECOVERY_ACTION.
pub mod recovery {
    pub const NONE: u32 = 0;
    pub const GPU_RESET: u32 = 1;
    pub const NODE_REBOOT: u32 = 2;
    pub const DRAIN_P2P: u32 = 3;
    pub const DRAIN_AND_RESET: u32 = 4;
}

/// NVML_INIT_FLAG_NO_GPUS and NVML_INIT_FLAG_NO_ATTACH.
pub const INIT_FLAG_NO_GPUS: u32 = 1;
pub const INIT_FLAG_NO_ATTACH: u32 = 2;

/// `scenario` with the fake's call log going to `path`.
pub fn with_call_log(mut scenario: Value, path: &Path) -> Value {
    scenario["call_log"] = json!(path);
    scenario
}

/// `scenario` with the fake writing `ADDRESS PID` to `path` for each process about to hang
/// on a GPU.
pub fn with_pid_log(mut scenario: Value, path: &Path) -> Value {
    scenario["pid_log"] = json!(path);
    scenario
}

/// The processes the fake logged as hanging, by GPU address; killed when dropped, so that a
/// test leaves no sleeper behind whatever it asserted.
pub struct Hung {
    pub pids: Vec<(String, i32)>,
}

impl Hung {
    /// Takes the logged processes over: they are killed when the `Hung` is dropped.
    pub fn read(path: &Path) -> Hung {
        Hung {
            pids: Hung::logged(path),
        }
    }

    /// The logged processes, only looked at: a `Hung` made just to look (a temporary in a
    /// wait) would kill them as it is dropped.
    pub fn logged(path: &Path) -> Vec<(String, i32)> {
        fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (bus, pid) = l.split_once(' ')?;
                Some((bus.to_string(), pid.trim().parse().ok()?))
            })
            .collect()
    }

    /// Whether process `pid` still runs (a zombie does not).
    pub fn alive(pid: i32) -> bool {
        fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let state = s.rsplit_once(") ")?.1.chars().next()?;
                Some(state != 'Z' && state != 'X')
            })
            .unwrap_or(false)
    }
}

impl Drop for Hung {
    fn drop(&mut self) {
        for (_, pid) in &self.pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// One call the fake saw: `func` and the canonical PCI address it concerned (`-` for none,
/// `flags=0xN` for init).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub func: String,
    pub target: String,
}

/// The fake's call log, read back.
pub fn calls(path: &Path) -> Vec<Call> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (func, target) = l.split_once(' ').unwrap_or((l, ""));
            Call {
                func: func.to_string(),
                target: target.to_string(),
            }
        })
        .collect()
}

/// Every GPU (canonical PCI address) any call touched, in first-touch order.
pub fn buses_touched(path: &Path) -> Vec<String> {
    let mut seen = Vec::new();
    for c in calls(path) {
        if c.target.len() == 12 && c.target.as_bytes()[4] == b':' && !seen.contains(&c.target) {
            seen.push(c.target);
        }
    }
    seen
}

/// A private copy of the fake under `dir` that reads `scenario` (from `<copy>.json`) without
/// FAKE_NVML_CONFIG: one test process can load several copies, each its own NVML.
pub fn private_lib(dir: &Path, scenario: &Value) -> PathBuf {
    let p = dir.join("libnvidia-ml.so.1");
    fs::copy(lib(), &p).unwrap();
    fs::write(
        dir.join("libnvidia-ml.so.1.json"),
        serde_json::to_vec_pretty(scenario).unwrap(),
    )
    .unwrap();
    p
}

/// The body of `/proc/driver/nvidia/gpus/<bus>/information` as the driver writes it
/// (kernel-open/nvidia/nv-procfs.c: `"Model: \t\t %s\n"` …, the `GPU Firmware` row only
/// when GSP firmware runs); tests/fixtures/nvidia-proc holds a real one.
pub struct ProcInfo<'a> {
    pub model: &'a str,
    pub irq: u32,
    pub uuid: &'a str,
    pub vbios: &'a str,
    pub dma_bits: u32,
    pub bus_location: &'a str,
    pub minor: u32,
    pub firmware: Option<&'a str>,
    pub excluded: bool,
}

impl ProcInfo<'_> {
    pub fn render(&self) -> String {
        let mask: u64 = if self.dma_bits >= 64 {
            u64::MAX
        } else {
            (1u64 << self.dma_bits) - 1
        };
        let mut s = format!(
            "Model: \t\t {}\nIRQ:   \t\t {}\nGPU UUID: \t {}\nVideo BIOS: \t {}\n\
             Bus Type: \t PCIe\nDMA Size: \t {} bits\nDMA Mask: \t {:#x}\n\
             Bus Location: \t {}\nDevice Minor: \t {}\n",
            self.model,
            self.irq,
            self.uuid,
            self.vbios,
            self.dma_bits,
            mask,
            self.bus_location,
            self.minor
        );
        if let Some(fw) = self.firmware {
            s.push_str(&format!("GPU Firmware: \t {fw}\n"));
        }
        s.push_str(&format!(
            "GPU Excluded:\t {}\n",
            if self.excluded { "Yes" } else { "No" }
        ));
        s
    }
}

/// A `/proc/driver/nvidia/gpus` tree under `root` for every GPU of `scenario`: the driver
/// lists each GPU it probed, whatever NVML says of it (a GPU missing from NVML's count or
/// lost still has its entry). Returns the `gpus` directory.
pub fn write_proc_gpus(root: &Path, scenario: &Value) -> PathBuf {
    let gpus_dir = root.join("driver/nvidia/gpus");
    for (i, g) in scenario["gpus"].as_array().unwrap().iter().enumerate() {
        let id = g["pci_bus_id"].as_str().unwrap();
        let location = canonical_bus(id);
        let info = ProcInfo {
            model: "NVIDIA H100 80GB HBM3",
            irq: 200 + i as u32,
            uuid: g["uuid"].as_str().unwrap(),
            vbios: "96.00.89.00.01",
            dma_bits: 52,
            bus_location: &location,
            minor: g["minor"].as_u64().unwrap() as u32,
            firmware: Some(
                g.get("firmware")
                    .and_then(Value::as_str)
                    .unwrap_or("550.54.15"),
            ),
            excluded: false,
        };
        let dir = gpus_dir.join(&location);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("information"), info.render()).unwrap();
    }
    gpus_dir
}

/// `00000000:3B:00.0` (NVML's form) as `0000:3b:00.0` (the kernel's).
pub fn canonical_bus(nvml: &str) -> String {
    let (domain, rest) = nvml.split_once(':').unwrap();
    let domain = u32::from_str_radix(domain, 16).unwrap();
    format!("{domain:04x}:{}", rest.to_ascii_lowercase())
}

pub fn healthy_node() -> Value {
    node_with(0, json!({}))
}

/// Writes a scenario file; its path goes into FAKE_NVML_CONFIG. Where `dir` holds a driver
/// list ([`write_proc_gpus`] with `dir` as its root, the test's `proc_root`), the fake is
/// told to count only the GPUs listed there at its init ([`with_proc_gpus`]), as the real
/// library counts only those of /proc/driver/nvidia/gpus.
pub fn write_scenario(dir: &Path, name: &str, scenario: &Value) -> PathBuf {
    let p = dir.join(format!("{name}.json"));
    let gpus = dir.join("driver/nvidia/gpus");
    let scenario = if gpus.is_dir() && scenario.get("proc_gpus").is_none() {
        with_proc_gpus(scenario.clone(), &gpus)
    } else {
        scenario.clone()
    };
    fs::write(&p, serde_json::to_vec_pretty(&scenario).unwrap()).unwrap();
    p
}

/// `scenario` with the fake counting only the GPUs whose directory is under `gpus_dir`
/// (a `/proc/driver/nvidia/gpus`) when NVML is initialised.
pub fn with_proc_gpus(mut scenario: Value, gpus_dir: &Path) -> Value {
    scenario["proc_gpus"] = json!(gpus_dir);
    scenario
}

/// /dev/nvidia0..n-1 as char 195:N under a test dev_root (needs root).
pub fn make_gpu_nodes(dev_root: &Path, n: u32) {
    for i in 0..n {
        let p = dev_root.join(format!("nvidia{i}"));
        let _ = fs::remove_file(&p);
        nix::sys::stat::mknod(
            &p,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, i as u64),
        )
        .unwrap();
    }
}

/// A test node's GPU side: a dir, a dev_root with /dev/nvidia0..7, an empty kernel log.
pub struct GpuNode {
    pub dir: PathBuf,
    pub dev_root: PathBuf,
    pub kmsg: PathBuf,
}

impl GpuNode {
    pub fn new(tag: &str) -> GpuNode {
        let dir = super::tempdir(tag);
        let dev_root = dir.join("dev");
        fs::create_dir_all(&dev_root).unwrap();
        make_gpu_nodes(&dev_root, 8);
        let kmsg = dir.join("kmsg");
        fs::write(&kmsg, "").unwrap();
        GpuNode {
            dir,
            dev_root,
            kmsg,
        }
    }

    /// The config keys that point devgate at this node and the fake NVML.
    pub fn config(&self) -> Value {
        json!({"dev_root": self.dev_root, "nvml_library": lib(), "kmsg_path": self.kmsg})
    }
}

/// Kernel log records in /dev/kmsg's format (`prio,seq,usec,-;text`), warning priority,
/// from sequence 1000 at 5 s after boot, one millisecond apart: what a `kmsg_path` file
/// holds in tests.
pub fn kmsg_records(records: &[&str]) -> String {
    records
        .iter()
        .enumerate()
        .map(|(i, r)| format!("4,{},{},-;{r}\n", 1000 + i, 5_000_000 + i * 1000))
        .collect()
}
