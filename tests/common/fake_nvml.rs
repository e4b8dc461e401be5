//! The fake NVML library (tests/fake-nvml), built once per test process, and the GPU
//! scenarios the tests give it.

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
        "pcie": {"gen": 4, "max_gen": 4, "width": 16, "max_width": 16}
    })
}

/// A healthy 8-GPU node, with `edit` applied to GPU `i`'s JSON.
pub fn node_with(i: usize, edit: Value) -> Value {
    let mut gpus: Vec<Value> = (0..8).map(gpu).collect();
    for (k, v) in edit.as_object().unwrap() {
        gpus[i][k] = v.clone();
    }
    json!({"driver_version": "550.54.15", "gpus": gpus})
}

pub fn healthy_node() -> Value {
    node_with(0, json!({}))
}

/// Writes a scenario file; its path goes into FAKE_NVML_CONFIG.
pub fn write_scenario(dir: &Path, name: &str, scenario: &Value) -> PathBuf {
    let p = dir.join(format!("{name}.json"));
    fs::write(&p, serde_json::to_vec_pretty(scenario).unwrap()).unwrap();
    p
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
