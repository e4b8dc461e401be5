//! The PCIe link end to end under the real runc (issue 12, item 4): a GPU whose link sits
//! at generation 1 of 5 while idle starts without a word, and a GPU whose AER fatal count
//! rose since the baseline devgate stored at the last start is refused, until the
//! operator removes that baseline; a GPU whose NVML PCIe replay counter rose since the last
//! start is warned about once, as a correctable AER error is. The GPU is the fake NVML's
//! GPU 1 (bus 0x3b); sysfs is a temp tree laid out as the kernel lays it out.

mod common;
use common::fake_nvml::*;
use common::*;
use serde_json::json;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// `<sys>/devices/pci0000:00/0000:00:01.0/0000:3b:00.0` under a root port, with
/// `<sys>/bus/pci/devices/0000:3b:00.0` pointing at it. Returns (port, gpu).
fn sysfs_tree(sys: &Path) -> (PathBuf, PathBuf) {
    let port = sys.join("devices/pci0000:00/0000:00:01.0");
    let gpu = port.join("0000:3b:00.0");
    fs::create_dir_all(&gpu).unwrap();
    fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
    fs::create_dir_all(sys.join("bus/pci/drivers/nvidia")).unwrap();
    symlink("../../../bus/pci", port.join("subsystem")).unwrap();
    symlink("../../../../bus/pci", gpu.join("subsystem")).unwrap();
    symlink(
        "../../../devices/pci0000:00/0000:00:01.0/0000:3b:00.0",
        sys.join("bus/pci/devices/0000:3b:00.0"),
    )
    .unwrap();
    let put = |dir: &Path, name: &str, text: &str| fs::write(dir.join(name), text).unwrap();
    put(&gpu, "vendor", "0x10de\n");
    // idle: generation 1 of 5, full width
    put(&gpu, "current_link_speed", "2.5 GT/s PCIe\n");
    put(&gpu, "max_link_speed", "32.0 GT/s PCIe\n");
    put(&gpu, "current_link_width", "16\n");
    put(&gpu, "max_link_width", "16\n");
    put(&port, "max_link_width", "16\n");
    let fixture = |n: &str| {
        fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/sysfs-aer")
                .join(n),
        )
        .unwrap()
    };
    for dir in [&port, &gpu] {
        put(
            dir,
            "aer_dev_correctable",
            &fixture("v6-aer_dev_correctable"),
        );
        put(
            dir,
            "aer_dev_nonfatal",
            "Undefined 0\nTOTAL_ERR_NONFATAL 0\n",
        );
        put(
            dir,
            "aer_dev_fatal",
            "Undefined 0\nDLP 0\nTOTAL_ERR_FATAL 0\n",
        );
    }
    (port, gpu)
}

fn gpu_bundle(env: &Env, tag: &str, fake_config: &Path) -> Bundle {
    let mut b = Bundle::new(
        tag,
        &["sh", "-c", "test -c /dev/nvidia1 && echo ran > /out/ran"],
    );
    b.add_device("/dev/nvidia1", "c", 195, 1);
    b.add_hooks(env, &["prestart", "poststop"]);
    for stage in ["prestart", "poststop"] {
        for h in b.spec["hooks"][stage].as_array_mut().unwrap() {
            h["env"] = json!([format!("FAKE_NVML_CONFIG={}", fake_config.display())]);
        }
    }
    b
}

#[test]
fn runc_starts_an_idle_gpu_quietly_and_refuses_one_whose_aer_fatal_count_rose() {
    require_root!();
    let node = GpuNode::new("e2e-pcie");
    let sys = node.dir.join("sys");
    let (port, gpu) = sysfs_tree(&sys);
    let mut cfg = node.config();
    cfg["sysfs_root"] = json!(sys);
    let env = Env::with("e2e-pcie", cfg);
    // NVML agrees: GPU 1 at generation 1 of 5 while idle
    let idle = write_scenario(&node.dir, "idle", &node_with(1, fault::idle_link()));

    let b = gpu_bundle(&env, "pcie-idle", &idle);
    let out = runtime_run("runc", &b, &unique_id("idle"));
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(!all.contains("devgate:"), "an idle link is no news: {all}");
    assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");
    // runc hides a successful hook's stderr; the decision says no warning was given
    assert_eq!(env.decisions().pop().unwrap()["action"], "allow");
    // that start took the baselines of the GPU and of its port, root's only
    let state = env.dir.join("state/pcie");
    for f in ["0000:3b:00.0.json", "0000:00:01.0.json"] {
        let meta = fs::metadata(state.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{f}");
    }

    // a fatal AER error on the GPU since that start: refused, with the figures
    fs::write(
        gpu.join("aer_dev_fatal"),
        "Undefined 0\nDLP 1\nTOTAL_ERR_FATAL 1\n",
    )
    .unwrap();
    let reason_start = format!(
        "devgate: rejected /dev/nvidia1 (host {}/nvidia1, 195:1): pcie: PCIe AER: 1 fatal error on 0000:3b:00.0 since ",
        node.dev_root.display()
    );
    for attempt in ["fatal", "fatal-again"] {
        let b = gpu_bundle(&env, &format!("pcie-{attempt}"), &idle);
        let out = runtime_run("runc", &b, &unique_id(attempt));
        let all = text(&out);
        assert!(!out.status.success(), "{attempt}: {all}");
        assert!(
            all.contains(&reason_start) && all.contains(" (0 -> 1); policy reject"),
            "{attempt}: {all}"
        );
        assert!(!b.marker().exists(), "{attempt}: ran although rejected");
    }

    // the operator dealt with it and removed the baseline: the count as it is now is the
    // new baseline, and the absolute value of 1 blocks nothing
    fs::remove_file(state.join("0000:3b:00.0.json")).unwrap();
    let b = gpu_bundle(&env, "pcie-cleared", &idle);
    let out = runtime_run("runc", &b, &unique_id("cleared"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");

    // the root port above the GPU saw a non-fatal error: one warning, then the baseline
    // moves past it and the next start is quiet again
    fs::write(
        port.join("aer_dev_nonfatal"),
        "Undefined 0\nCmpltTO 1\nTOTAL_ERR_NONFATAL 1\n",
    )
    .unwrap();
    // (runc shows a hook's stderr only when it fails: the decision log has the warning)
    let b = gpu_bundle(&env, "pcie-port", &idle);
    let out = runtime_run("runc", &b, &unique_id("port"));
    assert!(out.status.success(), "{}", text(&out));
    let last = env.decisions().pop().unwrap();
    assert_eq!(last["action"], "warn", "{last}");
    assert!(
        last.to_string()
            .contains("pcie: PCIe AER: 1 non-fatal error on 0000:00:01.0 since "),
        "{last}"
    );
    let b = gpu_bundle(&env, "pcie-port-again", &idle);
    let out = runtime_run("runc", &b, &unique_id("port-again"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(env.decisions().pop().unwrap()["action"], "allow");
}

/// GPU 1 idle, with NVML's replay counter at `count` (None: the GPU does not support it,
/// and the fake answers NOT_SUPPORTED).
fn replay_scenario(dir: &Path, count: Option<u64>) -> PathBuf {
    let mut pcie = json!({"gen": 1, "max_gen": 5, "width": 16, "max_width": 16});
    if let Some(n) = count {
        pcie["replay_counter"] = json!(n);
    }
    let name = format!("replay-{}", count.map_or("none".into(), |n| n.to_string()));
    write_scenario(dir, &name, &node_with(1, json!({ "pcie": pcie })))
}

#[test]
fn runc_warns_once_when_a_gpus_pcie_replay_counter_rose_since_the_last_start() {
    require_root!();
    let node = GpuNode::new("e2e-pcie-replay");
    let sys = node.dir.join("sys");
    sysfs_tree(&sys);
    let mut cfg = node.config();
    cfg["sysfs_root"] = json!(sys);
    // an unknown would refuse the start: "not judged" must not be one
    cfg["policy"] = json!({"on_unknown": "reject"});
    let env = Env::with("e2e-pcie-replay", cfg);
    let start = |tag: &str, count: Option<u64>| {
        let b = gpu_bundle(
            &env,
            &format!("replay-{tag}"),
            &replay_scenario(&node.dir, count),
        );
        let out = runtime_run("runc", &b, &unique_id(tag));
        let all = text(&out);
        assert!(out.status.success(), "{tag}: {all}");
        assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n", "{tag}");
        env.decisions().pop().unwrap()
    };

    // cumulative since the driver loaded: the first start takes 40 as the baseline and
    // judges nothing by it
    assert_eq!(start("first", Some(40))["action"], "allow");
    let stored: serde_json::Value =
        serde_json::from_slice(&fs::read(env.dir.join("state/pcie/0000:3b:00.0.json")).unwrap())
            .unwrap();
    assert_eq!(stored["replay"]["count"], 40, "{stored}");

    // 12 replays since: the start goes ahead with a warning, as for a correctable AER error
    // (runc shows a hook's stderr only when it fails: the decision log has it)
    let d = start("rose", Some(52));
    assert_eq!(d["action"], "warn", "{d}");
    let text = d.to_string();
    assert!(
        text.contains("pcie: PCIe replay counter: 12 replays on 0000:3b:00.0 since ")
            && text.contains(" (40 -> 52)"),
        "{d}"
    );
    // once: the baseline moved past them
    assert_eq!(start("same", Some(52))["action"], "allow");

    // a GPU or driver without the counter (NOT_SUPPORTED): not judged, not unknown, and the
    // stored count waits for when NVML answers again
    assert_eq!(start("unsupported", None)["action"], "allow");
    let d = start("again", Some(53));
    assert_eq!(d["action"], "warn", "{d}");
    assert!(d.to_string().contains(" (52 -> 53)"), "{d}");
}
