//! A privileged container holds every device: every host node in `linux.devices` and an
//! allow-all device rule, as containerd's and CRI-O's CRI, podman `--privileged` and runc
//! give it. Under the real runc and crun, with GPU 2 lost and the default policy, it is
//! judged only on the GPUs assigned to it (a selector other than `all`): the node's own
//! privileged pods (CNI, CSI, the GPU stack, `kubectl debug node`) keep starting, with
//! one line naming the bad GPU they hold, and one whose selector names GPU 2 is refused.
//! `policy.strict_privileged` brings back the reading where every held device is gated.

mod common;
use common::fake_nvml::*;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;

/// The lost GPU.
const LOST: usize = 2;

/// A privileged bundle on `node`: its 8 GPUs in linux.devices (as the CRI's
/// `WithHostDevices` lists them), one allow-all rule, the hooks reading `scenario`.
fn privileged_bundle(env: &Env, tag: &str, scenario: &Path, extra_env: &[&str]) -> Bundle {
    let mut b = Bundle::new(tag, &["sh", "-c", "echo ran > /out/ran"]);
    for i in 0..8 {
        b.add_device(&format!("/dev/nvidia{i}"), "c", 195, i);
    }
    b.spec["linux"]["resources"]["devices"] = json!([{"allow": true, "access": "rwm"}]);
    let envs = b.spec["process"]["env"].as_array_mut().unwrap();
    envs.extend(extra_env.iter().map(|e| json!(e)));
    with_hooks(&mut b, env, scenario);
    b
}

/// An unprivileged bundle given GPU `minor` alone.
fn gpu_bundle(env: &Env, tag: &str, scenario: &Path, minor: u32) -> Bundle {
    let mut b = Bundle::new(tag, &["sh", "-c", "echo ran > /out/ran"]);
    b.add_device(&format!("/dev/nvidia{minor}"), "c", 195, minor);
    with_hooks(&mut b, env, scenario);
    b
}

/// devgate's hooks, with the fake NVML's scenario in their environment (runc gives a hook
/// only what its entry names).
fn with_hooks(b: &mut Bundle, env: &Env, scenario: &Path) {
    b.add_hooks(env, &["prestart", "poststop"]);
    for stage in ["prestart", "poststop"] {
        for h in b.spec["hooks"][stage].as_array_mut().unwrap() {
            h["env"] = json!([format!("FAKE_NVML_CONFIG={}", scenario.display())]);
        }
    }
}

/// A node whose GPU 2 is lost at every query, and its devgate (`policy`).
fn lost_gpu_node(tag: &str, policy: Value) -> (GpuNode, Env, std::path::PathBuf) {
    let node = GpuNode::new(tag);
    let mut cfg = node.config();
    cfg["proc_root"] = json!(node.dir);
    cfg["policy"] = policy;
    let env = Env::with(tag, cfg);
    let scenario = node_with(LOST, fault::lost_at_every_query());
    write_proc_gpus(&node.dir, &scenario);
    let path = write_scenario(&node.dir, "lost", &scenario);
    (node, env, path)
}

/// The start ran, and the decision log's last line is a warn whose line names the held
/// lost GPU as not assigned.
fn started_holding_the_lost_gpu(env: &Env, b: &Bundle, out: &std::process::Output) {
    assert!(out.status.success(), "{}", text(out));
    assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");
    let last = env.decisions().pop().expect("a decision log line");
    assert_eq!(last["action"], "warn", "{last}");
    let line = last["message"].as_str().expect("the held line").to_string();
    assert!(
        line.starts_with(&format!("devgate: warning: holds /dev/nvidia{LOST} ")),
        "{line}"
    );
    assert!(line.contains("GPU is lost (fallen off the bus)"), "{line}");
    assert!(line.ends_with("not assigned to it: a container that holds every device is judged on its assigned devices"), "{line}");
    // one line names every held bad device; no other device is named
    assert_eq!(line.matches("195:").count(), 1, "{line}");
    let held: Vec<&Value> = last["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["disposition"] == "allowed")
        .collect();
    assert_eq!(held.len(), 1, "{last}");
    assert_eq!(held[0]["device"]["source"], "held", "{last}");
}

/// The start failed, and devgate's line names the lost GPU: in runc's error, and in the
/// decision log (crun shows only `error executing hook … (exit code: 1)`).
fn refused_on_the_lost_gpu(env: &Env, b: &Bundle, out: &std::process::Output) {
    let all = text(out);
    assert!(!out.status.success(), "{all}");
    assert!(!b.marker().exists(), "the container ran although rejected");
    let last = env.decisions().pop().expect("a decision log line");
    assert_eq!(last["action"], "reject", "{last}");
    let line = last["message"].as_str().unwrap();
    assert!(
        line.starts_with(&format!("devgate: rejected /dev/nvidia{LOST} ")),
        "{line}"
    );
    assert!(line.contains("GPU is lost (fallen off the bus)"), "{line}");
    if all.contains("devgate") && !all.contains("error executing hook") {
        assert!(all.contains(line), "{all}");
    }
}

fn privileged_cases(runtime: &str) {
    let tag = format!("e2e-priv-{runtime}");
    let (_node, env, lost) = lost_gpu_node(&tag, json!({"default": "reject"}));

    // no GPU variable at all: a CNI agent, a CSI plugin, `kubectl debug node`
    let b = privileged_bundle(&env, &format!("{tag}-none"), &lost, &[]);
    let out = runtime_run(runtime, &b, &unique_id("priv-none"));
    started_holding_the_lost_gpu(&env, &b, &out);

    // NVIDIA_VISIBLE_DEVICES=all, which every CUDA image sets: not an assignment
    let all = ["NVIDIA_VISIBLE_DEVICES=all"];
    let b = privileged_bundle(&env, &format!("{tag}-all"), &lost, &all);
    let out = runtime_run(runtime, &b, &unique_id("priv-all"));
    started_holding_the_lost_gpu(&env, &b, &out);

    // assigned a healthy GPU by the device plugin's variable: starts, the lost one held
    let gpu0 = format!("NVIDIA_VISIBLE_DEVICES={}", uuid(0));
    let b = privileged_bundle(&env, &format!("{tag}-gpu0"), &lost, &[&gpu0]);
    let out = runtime_run(runtime, &b, &unique_id("priv-gpu0"));
    started_holding_the_lost_gpu(&env, &b, &out);

    // assigned the lost GPU by UUID (the device plugin's allocation): refused
    let gpu2 = format!("NVIDIA_VISIBLE_DEVICES={}", uuid(LOST));
    let b = privileged_bundle(&env, &format!("{tag}-gpu2"), &lost, &[&gpu2]);
    let out = runtime_run(runtime, &b, &unique_id("priv-gpu2"));
    refused_on_the_lost_gpu(&env, &b, &out);

    // and by a CDI annotation
    let mut b = privileged_bundle(&env, &format!("{tag}-cdi"), &lost, &[]);
    b.spec["annotations"] = json!({"cdi.k8s.io/gpu": format!("nvidia.com/gpu={}", uuid(LOST))});
    let out = runtime_run(runtime, &b, &unique_id("priv-cdi"));
    refused_on_the_lost_gpu(&env, &b, &out);

    // an unprivileged container on the lost GPU: refused, as always
    let b = gpu_bundle(&env, &format!("{tag}-unpriv"), &lost, LOST as u32);
    let out = runtime_run(runtime, &b, &unique_id("unpriv"));
    refused_on_the_lost_gpu(&env, &b, &out);
}

#[test]
fn runc_starts_privileged_containers_holding_a_lost_gpu_unless_assigned_it() {
    require_root!();
    privileged_cases("runc");
}

#[test]
fn crun_starts_privileged_containers_holding_a_lost_gpu_unless_assigned_it() {
    require_root!();
    privileged_cases("crun");
}

/// `policy.strict_privileged: true`: every device a privileged container holds is gated,
/// as before the held reading.
#[test]
fn strict_privileged_gates_every_held_device() {
    require_root!();
    let tag = "e2e-priv-strict";
    let (_node, env, lost) = lost_gpu_node(tag, json!({"strict_privileged": true}));
    for (case, extra) in [("none", None), ("all", Some("NVIDIA_VISIBLE_DEVICES=all"))] {
        let extra: Vec<&str> = extra.into_iter().collect();
        let b = privileged_bundle(&env, &format!("{tag}-{case}"), &lost, &extra);
        let out = runtime_run("runc", &b, &unique_id(case));
        refused_on_the_lost_gpu(&env, &b, &out);
    }
}
