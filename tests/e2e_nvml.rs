//! GPUs end to end under the real runc: a container given /dev/nvidia1 (a char node 195:1
//! under a test dev_root, and in the container through linux.devices) is rejected with
//! NVML's reason in runc's error when the fake NVML reports that GPU broken, and starts
//! when it reports it healthy.

mod common;
use common::fake_nvml::*;
use common::*;
use serde_json::json;
use std::fs;

fn gpu_bundle(env: &Env, tag: &str, fake_config: &std::path::Path) -> Bundle {
    gpu_bundle_on(env, tag, fake_config, 1)
}

fn gpu_bundle_on(env: &Env, tag: &str, fake_config: &std::path::Path, minor: u32) -> Bundle {
    let node = format!("/dev/nvidia{minor}");
    let mut b = Bundle::new(
        tag,
        &[
            "sh",
            "-c",
            &format!("test -c {node} && echo ran > /out/ran"),
        ],
    );
    b.add_device(&node, "c", 195, minor);
    b.add_hooks(env, &["prestart", "poststop"]);
    // runc gives a hook only the environment its entry names; the fake reads its GPUs
    // from this file.
    for stage in ["prestart", "poststop"] {
        for h in b.spec["hooks"][stage].as_array_mut().unwrap() {
            h["env"] = json!([format!("FAKE_NVML_CONFIG={}", fake_config.display())]);
        }
    }
    b
}

#[test]
fn runc_rejects_a_broken_gpu_with_nvmls_reason_and_starts_a_healthy_one() {
    require_root!();
    let node = GpuNode::new("e2e-nvml");
    let (dir, dev_root) = (&node.dir, &node.dev_root);
    let env = Env::with("e2e-nvml", node.config());

    // GPU 1 has a failed row remap
    let broken = write_scenario(
        dir,
        "broken",
        &node_with(
            1,
            json!({"remapped_rows": {"correctable": 0, "uncorrectable": 3, "pending": false, "failure": true}}),
        ),
    );
    let b = gpu_bundle(&env, "nvml-bad", &broken);
    let out = runtime_run("runc", &b, &unique_id("bad"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    let reason = format!(
        "devgate: rejected /dev/nvidia1 (host {}/nvidia1, 195:1): nvml: GPU {} (0000:3b:00.0): row remapping failed (3 uncorrectable rows, 0 correctable); policy reject",
        dev_root.display(),
        uuid(1)
    );
    assert!(all.contains(&reason), "{all}");
    assert!(!b.marker().exists(), "the container ran although rejected");
    let last = env.decisions().pop().expect("a decision log line");
    assert_eq!(last["action"], "reject");

    // the same GPU healthy: the container starts and sees its device
    let healthy = write_scenario(dir, "healthy", &healthy_node());
    let b = gpu_bundle(&env, "nvml-good", &healthy);
    let out = runtime_run("runc", &b, &unique_id("good"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");
    assert_eq!(env.decisions().pop().unwrap()["action"], "allow");
}

/// A GPU lost at every query (its minor number too) is named lost by its PCI address and
/// UUID from the driver's /proc list, not reported as a numbering problem.
#[test]
fn runc_names_a_lost_gpu_lost_by_its_pci_address() {
    require_root!();
    let node = GpuNode::new("e2e-nvml-lost");
    let (dir, dev_root) = (&node.dir, &node.dev_root);
    let mut cfg = node.config();
    cfg["proc_root"] = json!(dir);
    let env = Env::with("e2e-nvml-lost", cfg);
    let scenario = node_with(1, fault::lost_at_every_query());
    write_proc_gpus(dir, &scenario);
    let lost = write_scenario(dir, "lost", &scenario);
    let b = gpu_bundle(&env, "nvml-lost", &lost);
    let out = runtime_run("runc", &b, &unique_id("lost"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    let reason = format!(
        "devgate: rejected /dev/nvidia1 (host {}/nvidia1, 195:1): nvml: GPU {} ({}): GPU is lost (fallen off the bus); policy reject",
        dev_root.display(),
        uuid(1),
        bus(1)
    );
    assert!(all.contains(&reason), "{all}");
    assert!(!b.marker().exists(), "the container ran although rejected");
}

/// `NVIDIA_VISIBLE_DEVICES=all`, which every CUDA base image sets, with one GPU of the node
/// broken: the container starts under runc and the broken GPU is named in a warning.
#[test]
fn runc_starts_an_all_gpus_container_with_a_warning_for_the_bad_gpu() {
    require_root!();
    let node = GpuNode::new("e2e-nvml-all");
    let env = Env::with("e2e-nvml-all", node.config());
    let broken = write_scenario(
        &node.dir,
        "broken",
        &node_with(
            1,
            json!({"remapped_rows": {"correctable": 0, "uncorrectable": 3, "pending": false, "failure": true}}),
        ),
    );
    let mut b = Bundle::new("nvml-all", &["sh", "-c", "echo ran > /out/ran"]);
    b.spec["process"]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!("NVIDIA_VISIBLE_DEVICES=all"));
    b.add_hooks(&env, &["prestart", "poststop"]);
    for stage in ["prestart", "poststop"] {
        for h in b.spec["hooks"][stage].as_array_mut().unwrap() {
            h["env"] = json!([format!("FAKE_NVML_CONFIG={}", broken.display())]);
        }
    }
    let out = runtime_run("runc", &b, &unique_id("all"));
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");
    // runc shows a hook's stderr only on failure; the decision log has the warning
    let last = env.decisions().pop().expect("a decision log line");
    let line = last.to_string();
    assert!(
        line.contains("row remapping failed")
            && line.contains("selected only by all: warns, never rejects"),
        "{line}"
    );
}

/// GPU 3 hangs inside NVML. With `on_unknown: reject`, runc starts a container on GPU 0
/// (GPU 0 is decided on its own facts) and refuses one on GPU 3 as unknown; runc returns
/// although the process devgate left on GPU 3 is still stuck in NVML: it holds none of the
/// hook's stdio, which runc waits on.
#[test]
fn runc_starts_gpu_0_while_gpu_3_hangs_in_nvml() {
    require_root!();
    let node = GpuNode::new("e2e-nvml-hang");
    let (dir, dev_root) = (&node.dir, &node.dev_root);
    let mut cfg = node.config();
    cfg["proc_root"] = json!(dir);
    cfg["probe_timeout_ms"] = json!(1000);
    cfg["policy"] = json!({"on_unknown": "reject"});
    let env = Env::with("e2e-nvml-hang", cfg);
    let pids = dir.join("hung-pids");
    let scenario = with_pid_log(node_with(3, fault::hangs(600_000)), &pids);
    write_proc_gpus(dir, &scenario);
    let hangs = write_scenario(dir, "hang3", &scenario);

    let b = gpu_bundle_on(&env, "nvml-hang-0", &hangs, 0);
    let out = runtime_run("runc", &b, &unique_id("hang0"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");
    assert_eq!(env.decisions().pop().unwrap()["action"], "allow");

    let b = gpu_bundle_on(&env, "nvml-hang-3", &hangs, 3);
    let out = runtime_run("runc", &b, &unique_id("hang3"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    let reason = format!(
        "devgate: rejected /dev/nvidia3 (host {}/nvidia3, 195:3): nvml unknown: nvml: GPU {} ({}): NVML did not answer for this GPU in 1000 ms; policy on_unknown reject",
        dev_root.display(),
        uuid(3),
        bus(3)
    );
    assert!(all.contains(&reason), "{all}");
    assert!(!b.marker().exists(), "the container ran although rejected");

    // runc has returned; the process stuck on GPU 3 is still there, on /dev/null stdio
    let hung = Hung::read(&pids);
    assert!(!hung.pids.is_empty(), "nothing hung on GPU 3");
    assert!(
        hung.pids.iter().all(|(b, _)| *b == bus(3)),
        "{:?}",
        hung.pids
    );
    let alive: Vec<i32> = hung
        .pids
        .iter()
        .map(|(_, p)| *p)
        .filter(|p| Hung::alive(*p))
        .collect();
    assert!(!alive.is_empty(), "{:?}", hung.pids);
    for p in &alive {
        for fd in 0..3 {
            let target = fs::read_link(format!("/proc/{p}/fd/{fd}")).unwrap();
            assert_eq!(
                target,
                std::path::Path::new("/dev/null"),
                "process {p} fd {fd}"
            );
        }
    }
}

/// Issue 12 items 5 and 6 under runc: the driver's own advice decides. NVML's recovery
/// action GPU_RESET refuses the start; an XID 154 line naming a reset refuses it where NVML
/// gives no recovery action; the driver's later "to 0x0 (None)" line lets it start again;
/// an XID 13 (the application's fault, by NVIDIA's catalog) never blocks.
#[test]
fn runc_follows_the_drivers_recovery_action_from_nvml_and_from_the_kernel_log() {
    require_root!();
    let node = GpuNode::new("e2e-nvml-advice");
    let (dir, dev_root) = (&node.dir, &node.dev_root);
    let mut cfg = node.config();
    cfg["proc_root"] = json!(dir);
    let env = Env::with("e2e-nvml-advice", cfg);

    // NVML: GPU 1 needs a reset
    let scenario = node_with(1, json!({"recovery_action": recovery::GPU_RESET}));
    write_proc_gpus(dir, &scenario);
    let reset = write_scenario(dir, "reset", &scenario);
    let b = gpu_bundle(&env, "advice-nvml", &reset);
    let out = runtime_run("runc", &b, &unique_id("advice-nvml"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    let reason = format!(
        "devgate: rejected /dev/nvidia1 (host {}/nvidia1, 195:1): nvml: GPU {} ({}): NVML recovery action GPU_RESET: the GPU needs a reset (nvidia-smi -r) before new work; policy reject",
        dev_root.display(),
        uuid(1),
        bus(1)
    );
    assert!(all.contains(&reason), "{all}");
    assert!(!b.marker().exists(), "the container ran although rejected");

    // NVML without the field; the kernel log's XID 154 line says reset, and an XID 13 is there
    let no_field = write_scenario(
        dir,
        "no-field",
        &node_with(1, json!({"recovery_action": null})),
    );
    let xid13 = "NVRM: Xid (PCI:0000:3b:00): 13, pid=77, name=python, Graphics Exception";
    let xid154 = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)";
    fs::write(&node.kmsg, kmsg_records(&[xid13, xid154])).unwrap();
    let b = gpu_bundle(&env, "advice-kmsg", &no_field);
    let out = runtime_run("runc", &b, &unique_id("advice-kmsg"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    let reason = format!(
        "devgate: rejected /dev/nvidia1 (host {}/nvidia1, 195:1): xid: xid 154 on 0000:3b:00: the driver's recovery action is GPU reset required",
        dev_root.display()
    );
    assert!(all.contains(&reason), "{all}");
    assert!(
        !all.contains("xid 13"),
        "XID 13 is the application's: {all}"
    );
    assert!(!b.marker().exists(), "the container ran although rejected");

    // after `nvidia-smi -r` the driver logs the action back to None: the GPU starts work again
    let none = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)";
    fs::write(&node.kmsg, kmsg_records(&[xid13, xid154, none])).unwrap();
    let b = gpu_bundle(&env, "advice-cleared", &no_field);
    let out = runtime_run("runc", &b, &unique_id("advice-cleared"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");
    assert_eq!(env.decisions().pop().unwrap()["action"], "allow");
}

/// Issue 12 item 3 under runc, on a node with no NVIDIA driver and no NVIDIA PCI function:
/// `NVIDIA_VISIBLE_DEVICES=0` (podman's config on a GPU-less host) selects nothing, so the
/// container starts, and neither the index nor a UUID is judged.
#[test]
fn runc_starts_a_gpu_selector_container_on_a_node_without_the_driver() {
    require_root!();
    let dir = tempdir("e2e-nvml-nodriver");
    for d in ["dev", "proc", "sys"] {
        fs::create_dir_all(dir.join(d)).unwrap();
    }
    let env = Env::with(
        "e2e-nvml-nodriver",
        json!({
            "dev_root": dir.join("dev"),
            "proc_root": dir.join("proc"),
            "sysfs_root": dir.join("sys"),
            "nvml_library": dir.join("no-libnvidia-ml.so.1"),
            "kmsg_path": dir.join("no-kmsg"),
            "policy": {"on_unknown": "reject"},
        }),
    );
    for (tag, selector) in [
        ("index", "0"),
        ("uuid", "GPU-00000000-1111-2222-3333-444444444444"),
    ] {
        let mut b = Bundle::new(
            &format!("nodriver-{tag}"),
            &["sh", "-c", "echo ran > /out/ran"],
        );
        b.spec["process"]["env"]
            .as_array_mut()
            .unwrap()
            .push(json!(format!("NVIDIA_VISIBLE_DEVICES={selector}")));
        b.add_hooks(&env, &["prestart", "poststop"]);
        let out = runtime_run("runc", &b, &unique_id(&format!("nodriver-{tag}")));
        assert!(out.status.success(), "{tag}: {}", text(&out));
        assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");
    }
}
