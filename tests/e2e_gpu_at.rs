//! The driver's `NVRM: GPU at PCI:…: GPU-…` records through the devgate binary: a container
//! that selects a lost GPU by UUID, when neither NVML nor the driver's /proc list can still
//! read that UUID, is judged on that GPU because the kernel log placed the UUID at its PCI
//! slot; without the record (or with a forged one) it is a warning and nothing is checked.
//! And the XID history: poststop after prestart reads only what the log gained.

mod common;
use common::fake_nvml::*;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// An 8-GPU node on the fake NVML, with a /proc tree and a kernel log file.
struct Node {
    env: Env,
    dir: PathBuf,
    kmsg: PathBuf,
}

fn node(tag: &str) -> Node {
    let dir = tempdir(tag);
    let dev_root = dir.join("dev");
    fs::create_dir_all(&dev_root).unwrap();
    make_gpu_nodes(&dev_root, 8);
    let kmsg = dir.join("kmsg");
    fs::write(&kmsg, "").unwrap();
    let cfg = json!({"dev_root": dev_root, "nvml_library": lib(), "kmsg_path": kmsg,
                     "proc_root": dir, "probe_timeout_ms": 2000});
    Node {
        env: Env::with(tag, cfg),
        dir,
        kmsg,
    }
}

impl Node {
    fn prestart(&self, spec: &Value, scenario: &Value) -> Output {
        let bundle = tempdir("bundle");
        fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let fake = write_scenario(&self.dir, "scenario", scenario);
        let state = json!({"ociVersion": "1.0.2", "id": unique_id("c"), "status": "creating",
                           "pid": std::process::id(), "bundle": bundle});
        let mut child = Command::new(devgate_bin())
            .arg("--config")
            .arg(&self.env.config)
            .args(["hook", "prestart"])
            .env_remove("DEVGATE_CONFIG")
            .env("FAKE_NVML_CONFIG", &fake)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(state.to_string().as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    fn said(&self, out: &Output) -> String {
        String::from_utf8_lossy(&out.stderr).replace(&self.dir.display().to_string(), "")
    }
}

/// `cdi.k8s.io/…: nvidia.com/gpu=<uuid>`, no device node in the spec.
fn by_uuid(uuid: &str) -> Value {
    let mut spec = base_spec(&["true"]);
    spec["annotations"] =
        json!({"cdi.k8s.io/nvidia-device-plugin_gpu": format!("nvidia.com/gpu={uuid}")});
    spec
}

fn records(lines: &[(u32, String)]) -> String {
    lines
        .iter()
        .enumerate()
        .map(|(i, (pri, m))| format!("{pri},{},{},-;{m}\n", 100 + i, 1_000_000 + i * 1000))
        .collect()
}

#[test]
fn a_lost_gpus_uuid_is_placed_by_the_drivers_gpu_at_record() {
    require_root!();
    let n = node("gpuat");
    // GPU 2 is lost: NVML gives no handle, and the driver's /proc list can no longer read
    // its UUID either, so only its slot and minor are known.
    let scenario = node_with(2, fault::lost_at_handle());
    let mut proc_view = scenario.clone();
    proc_view["gpus"][2]["uuid"] = json!("GPU-????????-????-????-????-????????????");
    write_proc_gpus(&n.dir, &proc_view);
    let slot = canonical_bus(&bus_id(2));
    let slot = slot.trim_end_matches(".0");
    let at = format!("NVRM: GPU at PCI:{slot}: {}", uuid(2));
    let spec = by_uuid(&uuid(2));

    // no record: the selector names nothing the driver lists, and the GPU goes unchecked
    let out = n.prestart(&spec, &scenario);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        n.said(&out).contains(&format!(
            "devgate: warning: CDI annotation selects {}, which the driver does not list",
            uuid(2)
        )),
        "{}",
        text(&out)
    );

    // a forged record (a write to /dev/kmsg arrives with the user facility) places nothing
    fs::write(&n.kmsg, records(&[(14, at.clone())])).unwrap();
    let out = n.prestart(&spec, &scenario);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        n.said(&out).contains("which the driver does not list"),
        "{}",
        text(&out)
    );

    // the driver's record: /dev/nvidia2 is judged, and it is lost
    fs::write(&n.kmsg, records(&[(4, at.clone())])).unwrap();
    let out = n.prestart(&spec, &scenario);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = n.said(&out);
    assert!(
        said.starts_with("devgate: rejected /dev/nvidia2 (host /dev/nvidia2, 195:2): nvml: ")
            && said.contains("GPU is lost (fallen off the bus)"),
        "{}",
        text(&out)
    );
    assert_eq!(
        n.env.log_lines().pop().unwrap()["devices"][0]["device"]["source"],
        "cdi-annotation"
    );
}

/// The cache written at prestart is used at the next call: a log file that only grew is
/// read from where the last scan ended, and its answer is the full read's.
#[test]
fn the_kernel_log_cache_carries_from_one_call_to_the_next() {
    require_root!();
    let n = node("kcache");
    // A driver without NVML's recovery action field, so that the kernel log alone decides:
    // where the field says NONE and the GPU answers, an old XID only warns (docs/gpus.md).
    let scenario = node_with(1, json!({"not_supported": ["nvmlDeviceGetFieldValues"]}));
    let mut log = String::new();
    for i in 0..2000 {
        log.push_str(&format!("6,{i},{i}000,-;usb 1-1: chatter {i}\n"));
    }
    fs::write(&n.kmsg, &log).unwrap();
    let mut spec = base_spec(&["true"]);
    spec["linux"]["devices"] =
        json!([{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}]);
    let out = n.prestart(&spec, &scenario);
    assert!(out.status.success(), "{}", text(&out));
    let cache = state_dir(&n).join("xid-history.json");
    let c: Value = serde_json::from_slice(&fs::read(&cache).unwrap()).unwrap();
    assert_eq!(c["last_seq"], 1999);
    assert_eq!(c["file"]["offset"], log.len() as u64);

    // the log grows by an XID on GPU 1's slot: the next start sees it
    let xid =
        "4,2000,2000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n";
    fs::OpenOptions::new()
        .append(true)
        .open(&n.kmsg)
        .unwrap()
        .write_all(xid.as_bytes())
        .unwrap();
    let out = n.prestart(&spec, &scenario);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(n.said(&out).contains("xid 79"), "{}", text(&out));
    let c: Value = serde_json::from_slice(&fs::read(&cache).unwrap()).unwrap();
    assert_eq!(c["last_seq"], 2000);
    assert_eq!(c["events"][0]["xid"], 79);
}

fn state_dir(n: &Node) -> PathBuf {
    let cfg: Value = serde_json::from_slice(&fs::read(&n.env.config).unwrap()).unwrap();
    Path::new(cfg["state_dir"].as_str().unwrap()).to_path_buf()
}
