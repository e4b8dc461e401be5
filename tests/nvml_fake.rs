//! The NVML and XID probes through the devgate binary, on the fake NVML library: each
//! scenario of the fake, the deadline, selectors, status, and the no-GPU path that must
//! never load the library. The hook is run the way runtimes run it (state on stdin).

mod common;
use common::fake_nvml::{self, *};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A node: a dev_root with /dev/nvidia0..7, an empty kernel log, a devgate config on the
/// fake library.
struct Node {
    env: Env,
    dir: PathBuf,
    kmsg: PathBuf,
}

fn node(tag: &str, lib: &Path, extra: Value) -> Node {
    let dir = tempdir(tag);
    let dev_root = dir.join("dev");
    fs::create_dir_all(&dev_root).unwrap();
    make_gpu_nodes(&dev_root, 8);
    let kmsg = dir.join("kmsg");
    fs::write(&kmsg, "").unwrap();
    let mut cfg = json!({"dev_root": dev_root, "nvml_library": lib, "kmsg_path": kmsg,
                         "probe_timeout_ms": 2000});
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    Node {
        env: Env::with(tag, cfg),
        dir,
        kmsg,
    }
}

fn spec_with_gpus(minors: &[u32]) -> Value {
    let mut s = base_spec(&["true"]);
    for m in minors {
        s["linux"]["devices"].as_array_mut().unwrap().push(
            json!({"path": format!("/dev/nvidia{m}"), "type": "c", "major": 195, "minor": m}),
        );
    }
    s
}

impl Node {
    /// `devgate hook prestart` for a bundle with `spec`, the fake reading `scenario`.
    fn prestart(&self, spec: &Value, scenario: &Value) -> Output {
        self.prestart_env(spec, scenario, &[])
    }

    fn prestart_env(&self, spec: &Value, scenario: &Value, env: &[(&str, &Path)]) -> Output {
        let bundle = tempdir("bundle");
        fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let fake = write_scenario(&self.dir, "scenario", scenario);
        let state = json!({"ociVersion": "1.0.2", "id": unique_id("c"), "status": "creating",
                           "pid": std::process::id(), "bundle": bundle});
        let mut cmd = Command::new(devgate_bin());
        cmd.arg("--config")
            .arg(&self.env.config)
            .args(["hook", "prestart"])
            .env_remove("DEVGATE_CONFIG")
            .env("FAKE_NVML_CONFIG", &fake)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(state.to_string().as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    fn status_json(&self, scenario: &Value) -> Value {
        let fake = write_scenario(&self.dir, "scenario", scenario);
        let out = Command::new(devgate_bin())
            .arg("--config")
            .arg(&self.env.config)
            .args(["status", "--json"])
            .env_remove("DEVGATE_CONFIG")
            .env("FAKE_NVML_CONFIG", &fake)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Node {
    /// What devgate said on stderr, with the test dev_root's host paths taken out: devgate
    /// names a GPU `/dev/nvidia1 (host /tmp/…/dev/nvidia1, 195:1)` here and
    /// `/dev/nvidia1 (195:1)` on a node whose dev_root is /dev.
    fn said(&self, out: &Output) -> String {
        let mut s = stderr(out);
        for m in 0..8 {
            s = s.replace(
                &format!(
                    "/dev/nvidia{m} (host {}/dev/nvidia{m}, 195:{m})",
                    self.dir.display()
                ),
                &format!("/dev/nvidia{m} (195:{m})"),
            );
        }
        s
    }

    fn rejected(&self, out: &Output, line: &str) {
        assert_eq!(out.status.code(), Some(1), "{}", text(out));
        assert_eq!(self.said(out).trim_end(), line, "{}", text(out));
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn healthy_eight_gpu_node_allows_every_gpu() {
    require_root!();
    let n = node("healthy", fake_nvml::lib(), json!({}));
    let out = n.prestart(&spec_with_gpus(&[0, 1, 2, 3, 4, 5, 6, 7]), &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(n.said(&out), "", "no warnings on a healthy node");
    let last = n.env.log_lines().pop().unwrap();
    assert_eq!(last["action"], "allow");
    let devices = last["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8);
    for d in devices {
        let probes: Vec<(&str, &str)> = d["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["probe"].as_str().unwrap(), v["status"].as_str().unwrap()))
            .collect();
        assert!(probes.contains(&("nvml", "healthy")), "{probes:?}");
        assert!(probes.contains(&("xid", "healthy")), "{probes:?}");
    }
}

#[test]
fn remap_failure_rejects_with_the_figures() {
    require_root!();
    let n = node("remap", fake_nvml::lib(), json!({}));
    let scenario = node_with(
        1,
        json!({"remapped_rows": {"correctable": 0, "uncorrectable": 3, "pending": false, "failure": true}}),
    );
    let out = n.prestart(&spec_with_gpus(&[0, 1]), &scenario);
    n.rejected(
        &out,
        &format!(
            "devgate: rejected /dev/nvidia1 (195:1): nvml: GPU {} (0000:3b:00.0): row remapping failed (3 uncorrectable rows, 0 correctable); policy reject",
            uuid(1)
        ),
    );
    // pending remap: reset required
    let scenario = node_with(
        1,
        json!({"remapped_rows": {"correctable": 2, "uncorrectable": 1, "pending": true, "failure": false}}),
    );
    let out = n.prestart(&spec_with_gpus(&[1]), &scenario);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out).contains(
            "row remapping pending, reset required (1 uncorrectable rows, 2 correctable)"
        ),
        "{}",
        text(&out)
    );
}

#[test]
fn pending_retirement_and_volatile_dbe_reject() {
    require_root!();
    let n = node("retire", fake_nvml::lib(), json!({}));
    let out = n.prestart(
        &spec_with_gpus(&[2]),
        &node_with(2, json!({"retired_pages_pending": true})),
    );
    n.rejected(
        &out,
        &format!("devgate: rejected /dev/nvidia2 (195:2): nvml: GPU {} (0000:5e:00.0): retired pages pending, reboot required; policy reject", uuid(2)),
    );
    let dbe = node_with(3, json!({"volatile_uncorrectable_ecc": 2}));
    let out = n.prestart(&spec_with_gpus(&[3]), &dbe);
    n.rejected(
        &out,
        &format!("devgate: rejected /dev/nvidia3 (195:3): nvml: GPU {} (0000:86:00.0): volatile uncorrectable ECC errors 2 > 0; policy reject", uuid(3)),
    );
    // the threshold is the operator's
    let lenient = node(
        "retire2",
        fake_nvml::lib(),
        json!({"gpu": {"max_volatile_uncorrectable_ecc": 2}}),
    );
    let out = lenient.prestart(&spec_with_gpus(&[3]), &dbe);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn lost_gpu_has_fallen_off_the_bus() {
    require_root!();
    let n = node("lost", fake_nvml::lib(), json!({}));
    let out = n.prestart(&spec_with_gpus(&[4]), &node_with(4, json!({"lost": true})));
    n.rejected(
        &out,
        &format!(
            "devgate: rejected /dev/nvidia4 (195:4): nvml: GPU {} (0000:af:00.0) has fallen off the bus; policy reject",
            uuid(4)
        ),
    );
    // a GPU NVML cannot even give a handle for
    let out = n.prestart(
        &spec_with_gpus(&[4]),
        &node_with(4, json!({"unreachable": true})),
    );
    n.rejected(
        &out,
        "devgate: rejected /dev/nvidia4 (195:4): nvml: no reachable GPU with minor number 4; unreachable index 4: GPU is lost; policy reject",
    );
}

#[test]
fn hanging_nvml_is_abandoned_at_the_deadline() {
    require_root!();
    let hang = |func: &str| {
        let mut s = healthy_node();
        s["hang_ms"] = json!({ func: 60_000 });
        s
    };
    let n = node("hang", fake_nvml::lib(), json!({"probe_timeout_ms": 300}));
    let started = Instant::now();
    let out = n.prestart(&spec_with_gpus(&[1]), &hang("nvmlDeviceGetRemappedRows"));
    let took = started.elapsed();
    assert!(out.status.success(), "{}", text(&out));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(
        n.said(&out).trim_end(),
        "devgate: warning: /dev/nvidia1 (195:1): nvml unknown: NVML did not answer in 300 ms; policy on_unknown allow"
    );

    // on_unknown reject decides the other way
    let strict = node(
        "hang2",
        fake_nvml::lib(),
        json!({"probe_timeout_ms": 300, "policy": {"on_unknown": "reject"}}),
    );
    let out = strict.prestart(&spec_with_gpus(&[1]), &hang("nvmlInit_v2"));
    strict.rejected(
        &out,
        "devgate: rejected /dev/nvidia1 (195:1): nvml unknown: NVML did not answer in 300 ms; policy on_unknown reject",
    );

    // answers in time but hangs in nvmlShutdown: the verdict stands, the exit is prompt
    let started = Instant::now();
    let out = n.prestart(&spec_with_gpus(&[1]), &hang("nvmlShutdown"));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(n.said(&out), "");
}

#[test]
fn missing_library_is_unknown_and_other_probes_still_run() {
    require_root!();
    let n = node(
        "nolib",
        Path::new("/nonexistent/libnvidia-ml.so.1"),
        json!({}),
    );
    let out = n.prestart(&spec_with_gpus(&[0]), &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        n.said(&out).starts_with(
            "devgate: warning: /dev/nvidia0 (195:0): nvml unknown: cannot load /nonexistent/libnvidia-ml.so.1: "
        ),
        "{}",
        text(&out)
    );
    // the quarantine probe still decides
    n.env.ok(&["cordon", "195:0", "--reason", "bad"]);
    let out = n.prestart(&spec_with_gpus(&[0]), &healthy_node());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out).contains(
            "rejected /dev/nvidia0 (195:0): quarantined by operator: \"bad\"; policy reject"
        ),
        "{}",
        text(&out)
    );
    // init failure (driver not loaded) likewise names the cause
    let n = node("noinit", fake_nvml::lib(), json!({}));
    let out = n.prestart(&spec_with_gpus(&[0]), &json!({"init_error": 9}));
    assert!(
        n.said(&out).contains("nvml unknown: NVML init failed ("),
        "{}",
        text(&out)
    );
}

#[test]
fn missing_symbol_is_not_applicable_not_a_crash() {
    require_root!();
    let n = node("nosym", fake_nvml::lib_without_remapped_rows(), json!({}));
    // even a remap failure cannot be seen without the function; everything else works
    let scenario = node_with(
        1,
        json!({"remapped_rows": {"uncorrectable": 3, "failure": true}, "volatile_uncorrectable_ecc": 1}),
    );
    let out = n.prestart(&spec_with_gpus(&[1]), &scenario);
    n.rejected(
        &out,
        &format!("devgate: rejected /dev/nvidia1 (195:1): nvml: GPU {} (0000:3b:00.0): volatile uncorrectable ECC errors 1 > 0; policy reject", uuid(1)),
    );
    let st = n.status_json(&healthy_node());
    let g1 = st
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["minor"] == 1)
        .unwrap();
    let remap = g1["gpu"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "remapped_rows")
        .unwrap();
    assert_eq!(remap["status"], "not_applicable");
    assert!(
        remap["reason"]
            .as_str()
            .unwrap()
            .contains("symbol missing from the NVML library"),
        "{remap}"
    );
    assert_eq!(g1["health"], "healthy");
}

#[test]
fn throttle_and_pcie_downtraining_are_warnings() {
    require_root!();
    let n = node("warn", fake_nvml::lib(), json!({}));
    let scenario = node_with(
        5,
        json!({"throttle_reasons": 0x48, "pcie": {"gen": 3, "max_gen": 4, "width": 8, "max_width": 16}}),
    );
    let out = n.prestart(&spec_with_gpus(&[5]), &scenario);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        n.said(&out).trim_end(),
        format!("devgate: warning: /dev/nvidia5 (195:5): nvml: GPU {} (0000:d8:00.0): clocks throttled by hw_slowdown, hw_thermal (reasons 0x48); PCIe link gen 3 below max 4; PCIe link width x8 below max x16", uuid(5))
    );
    assert_eq!(n.env.log_lines().pop().unwrap()["action"], "warn");
}

#[test]
fn containers_without_gpus_never_load_nvml() {
    require_root!();
    let n = node("nodlopen", fake_nvml::lib(), json!({}));
    let marker = n.dir.join("nvml-loaded");
    // a device, but not an NVIDIA one
    nix::sys::stat::mknod(
        &n.dir.join("dev/null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    let mut spec = base_spec(&["true"]);
    spec["linux"]["devices"] = json!([{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]);
    let out = n.prestart_env(&spec, &healthy_node(), &[("FAKE_NVML_MARKER", &marker)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !marker.exists(),
        "NVML was loaded for a container without a GPU"
    );
    // no devices at all
    let out = n.prestart_env(
        &base_spec(&["true"]),
        &healthy_node(),
        &[("FAKE_NVML_MARKER", &marker)],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !marker.exists(),
        "NVML was loaded for a container without devices"
    );
    // the same check sees a GPU container load it: the marker works
    let out = n.prestart_env(
        &spec_with_gpus(&[0]),
        &healthy_node(),
        &[("FAKE_NVML_MARKER", &marker)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let said = fs::read_to_string(&marker).unwrap();
    assert!(said.starts_with("loaded pid "), "{said}");
    assert!(said.contains("\ninit pid "), "{said}");
}

#[test]
fn nvidia_visible_devices_and_cdi_select_gpus() {
    require_root!();
    let n = node("select", fake_nvml::lib(), json!({}));
    let mut bad = node_with(
        3,
        json!({"remapped_rows": {"uncorrectable": 1, "failure": true}}),
    );
    bad["gpus"][3]["minor"] = json!(6); // minors need not follow indices
    bad["gpus"][6]["minor"] = json!(3);

    // by UUID in process.env, no linux.devices at all: the GPU behind it is minor 6
    let mut spec = base_spec(&["true"]);
    spec["process"]["env"] = json!([
        "PATH=/bin",
        format!("NVIDIA_VISIBLE_DEVICES={}", uuid(3).to_lowercase())
    ]);
    let out = n.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out).starts_with(&format!(
            "devgate: rejected /dev/nvidia6 (195:6): nvml: GPU {} (0000:86:00.0): row remapping failed",
            uuid(3)
        )),
        "{}",
        text(&out)
    );
    let last = n.env.log_lines().pop().unwrap();
    assert_eq!(
        last["devices"][0]["device"]["source"],
        "nvidia-visible-devices"
    );

    // by index through a CDI annotation
    let mut spec = base_spec(&["true"]);
    spec["annotations"] = json!({"cdi.k8s.io/nvidia-device-plugin_gpu": "nvidia.com/gpu=3"});
    let out = n.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out).contains("rejected /dev/nvidia6 (195:6)"),
        "{}",
        text(&out)
    );

    // all: every GPU is checked, only the bad one is named
    let mut spec = base_spec(&["true"]);
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=all"]);
    let out = n.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        n.env.log_lines().pop().unwrap()["devices"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
    assert!(!n.said(&out).contains(" | "), "one bad GPU: {}", text(&out));

    // void selects nothing; a healthy selection starts
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=void"]);
    assert!(n.prestart(&spec, &bad).status.success());
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=0,1"]);
    let out = n.prestart(&spec, &bad);
    assert!(out.status.success(), "{}", text(&out));

    // a GPU the node does not have is said, not checked
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=GPU-deadbeef"]);
    let out = n.prestart(&spec, &bad);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        n.said(&out).trim_end(),
        "devgate: warning: NVIDIA_VISIBLE_DEVICES selects GPU-deadbeef, which NVML does not report"
    );
}

/// The kernel log lines a GPU at bus 0x3b would leave.
fn kmsg_fixture(records: &[&str]) -> String {
    records
        .iter()
        .enumerate()
        .map(|(i, r)| format!("4,{},{},-;{r}\n", 1000 + i, 5_000_000 + i * 1000))
        .collect()
}

#[test]
fn xid_reports_in_the_kernel_log_reject_until_the_driver_reloads() {
    require_root!();
    let n = node("xid", fake_nvml::lib(), json!({}));
    let xid79 =
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.";
    fs::write(
        &n.kmsg,
        kmsg_fixture(&[
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
            "NVRM: Xid (PCI:0000:1b:00): 13, pid=1, Graphics Exception",
            xid79,
        ]),
    )
    .unwrap();
    let out = n.prestart(&spec_with_gpus(&[0, 1]), &healthy_node());
    n.rejected(
        &out,
        "devgate: rejected /dev/nvidia1 (195:1): xid: xid 79 (GPU has fallen off the bus) on 0000:3b:00 reported 1 time since the driver loaded, last at 5.002000 s after boot (kmsg seq 1002): \"pid=4242, name=python, GPU has fallen off the bus.\"; GPU reset or reboot required; policy reject",
    );
    // the driver was loaded again after it: the GPU was re-initialised
    fs::write(
        &n.kmsg,
        kmsg_fixture(&[
            xid79,
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        ]),
    )
    .unwrap();
    let out = n.prestart(&spec_with_gpus(&[1]), &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    // the operator can demote an XID
    let lenient = node(
        "xid2",
        fake_nvml::lib(),
        json!({"gpu": {"xid_actions": {"79": "warn"}}}),
    );
    fs::write(&lenient.kmsg, kmsg_fixture(&[xid79])).unwrap();
    let out = lenient.prestart(&spec_with_gpus(&[1]), &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        lenient
            .said(&out)
            .starts_with("devgate: warning: /dev/nvidia1 (195:1): xid: xid 79"),
        "{}",
        text(&out)
    );
    // an unreadable log is unknown, not a failure
    let gone = node("xid3", fake_nvml::lib(), json!({}));
    fs::remove_file(&gone.kmsg).unwrap();
    let out = gone.prestart(&spec_with_gpus(&[1]), &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        gone.said(&out)
            .contains("xid unknown: cannot open kernel log "),
        "{}",
        text(&out)
    );
}

#[test]
fn status_shows_each_gpu_and_every_check() {
    require_root!();
    let n = node("status", fake_nvml::lib(), json!({}));
    let scenario = node_with(2, json!({"retired_pages_pending": true}));
    let rows = n.status_json(&scenario);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 8, "{rows:?}");
    for (i, r) in rows.iter().enumerate() {
        let g = &r["gpu"];
        assert_eq!(g["minor"], i as u64);
        assert_eq!(g["uuid"], uuid(i));
        assert_eq!(g["pci_bus_id"], format!("0000:{:02x}:00.0", BUSES[i]));
        let checks: Vec<&str> = g["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["check"].as_str().unwrap())
            .collect();
        assert_eq!(
            checks,
            [
                "reachable",
                "remapped_rows",
                "retired_pages",
                "volatile_ecc",
                "throttle",
                "pcie_link",
                "xid"
            ]
        );
    }
    assert_eq!(rows[2]["health"], "unhealthy");
    assert_eq!(rows[1]["health"], "healthy");
    // the text form lists the same
    let fake = write_scenario(&n.dir, "scenario", &scenario);
    let out = Command::new(devgate_bin())
        .arg("--config")
        .arg(&n.env.config)
        .arg("status")
        .env("FAKE_NVML_CONFIG", &fake)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(&format!(
            "    gpu minor 2 uuid {} pci 0000:5e:00.0",
            uuid(2)
        )),
        "{shown}"
    );
    assert!(
        shown
            .contains("      retired_pages  unhealthy      retired pages pending, reboot required"),
        "{shown}"
    );
}
