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

// ---- attack35: where "holds every device" and the runtime's device filter disagree ------

/// The process's probe of a device it has no rule of its own for: it makes `c 195:0`
/// (GPU 0) and opens it, writing what that said to /out/probe. The node has no NVIDIA
/// driver: an open the device filter lets through fails with ENXIO ("No such device or
/// address"), a mknod or open it stops with EPERM ("Operation not permitted").
const PROBE: &str =
    "{ mknod /dev/probe c 195 0 && head -c1 /dev/probe; echo; } > /out/probe 2>&1; \
                     echo ran > /out/ran";

/// A bundle on the lost GPU's node holding `/dev/nvidia2` (no rule added for it) whose
/// rule list is `rules`, the hooks reading `scenario`.
fn rules_bundle(env: &Env, tag: &str, scenario: &Path, rules: Value) -> Bundle {
    let mut b = Bundle::new(tag, &["sh", "-c", PROBE]);
    b.spec["linux"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({
            "path": format!("/dev/nvidia{LOST}"), "type": "c", "major": 195, "minor": LOST,
            "fileMode": 0o666, "uid": 0, "gid": 0
        }));
    b.spec["linux"]["resources"]["devices"] = rules;
    with_hooks(&mut b, env, scenario);
    b
}

/// The decision log line's action and message.
fn brief(line: Option<Value>) -> String {
    line.map(|l| format!("{} {}", l["action"], l["message"]))
        .unwrap_or_default()
}

/// Where the container ran, the runtime did not give it every device: the probe was
/// stopped. (A premise: if the runtime did give it every device, the test says so instead
/// of blaming devgate.)
fn ran_without_every_device(b: &Bundle, rt: Runtime) {
    if !b.marker().exists() {
        return;
    }
    let said = fs::read_to_string(b.rootfs().join("out/probe")).unwrap_or_default();
    assert!(
        said.contains("Operation not permitted"),
        "{}: premise failed, the runtime gave the container GPU 0 too: {said}",
        rt.name()
    );
}

/// attack35 finding 1. runc and crun apply `linux.resources.devices` in order, as the
/// kernel's device cgroup does: an allow-all rule followed by a deny-all one leaves the
/// container with only the rules after it (here `c 195:2`, the lost GPU). devgate's
/// `holds_every_device` asks only whether some allow-all rule is there, so it reads this
/// unprivileged container (the probe shows GPU 0 denied) as privileged, marks the lost GPU
/// it was given `held`, and lets it start with one warning line.
#[test]
fn an_allow_all_rule_undone_by_a_later_deny_all_is_not_holding_every_device() {
    require_root!();
    let tag = "e2e-priv-undone";
    let (_node, env, lost) = lost_gpu_node(tag, json!({"default": "reject"}));
    let rules = json!([
        {"allow": true, "access": "rwm"},
        {"allow": false, "access": "rwm"},
        {"allow": true, "type": "c", "major": 195, "minor": LOST, "access": "rwm"}
    ]);
    let mut failures = Vec::new();
    for rt in [Runtime::RUNC, Runtime::RUNC_V2, Runtime::CRUN_V2] {
        let b = rules_bundle(
            &env,
            &format!("{tag}-{}-{}", rt.bin, rt.node.name()),
            &lost,
            rules.clone(),
        );
        let out = runtime_run_on(rt, &b, &unique_id("undone"));
        ran_without_every_device(&b, rt);
        if b.marker().exists() {
            failures.push(format!(
                "{}: an unprivileged container given only the lost GPU started: {:?}",
                rt.name(),
                brief(env.decisions().pop())
            ));
            continue;
        }
        refused_on_the_lost_gpu(&env, &b, &out);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// attack35 finding 2. crun's eBPF device filter (cgroup v2) reads a type-`a` rule's
/// numbers and access: `a 195:2 rwm` allows 195:2 (char and block) alone, and `a *:* m`
/// only mknod. devgate (after runc's emulator and the v1 kernel, where `a` resets to
/// allow-all whatever follows) reads each as "holds every device", so under crun on v2 an
/// unprivileged container given the lost GPU by such a rule starts with it.
#[test]
fn crun_v2_reads_a_type_a_rule_by_its_numbers_and_access() {
    require_root!();
    let tag = "e2e-priv-crun-a";
    let (_node, env, lost) = lost_gpu_node(tag, json!({"default": "reject"}));
    let cases = [
        (
            "numbered",
            json!([
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "a", "major": 195, "minor": LOST, "access": "rwm"}
            ]),
        ),
        (
            "mknod-only",
            json!([
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "a", "access": "m"},
                {"allow": true, "type": "c", "major": 195, "minor": LOST, "access": "rw"}
            ]),
        ),
    ];
    let rt = Runtime::CRUN_V2;
    let mut failures = Vec::new();
    for (case, rules) in cases {
        let b = rules_bundle(&env, &format!("{tag}-{case}"), &lost, rules);
        let out = runtime_run_on(rt, &b, &unique_id(case));
        ran_without_every_device(&b, rt);
        if b.marker().exists() {
            failures.push(format!(
                "{case}: an unprivileged container given only the lost GPU started under {}: {:?}",
                rt.name(),
                brief(env.decisions().pop())
            ));
            continue;
        }
        refused_on_the_lost_gpu(&env, &b, &out);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// attack35 finding 3. A privileged pod allocated a GPU through CDI by the CRI
/// (`CDIDevices`: NVIDIA's DRA driver, the device plugin's `cdi-cri` strategy): containerd
/// injects the CDI edits into the privileged spec, so config.json holds the GPU's node,
/// the CDI library's own allow rule for it after the allow-all, and the edits' common
/// `NVIDIA_VISIBLE_DEVICES=void` (k8s-dra-driver-gpu `cmd/gpu-kubelet-plugin/cdi.go`;
/// nvidia-ctk's specs too), and no annotation. No selector names the GPU, so it is
/// `held` and the privileged pod starts on the lost GPU it was assigned.
fn privileged_cdi_cri_case(runtime: &str) {
    let tag = format!("e2e-priv-cdicri-{runtime}");
    let (_node, env, lost) = lost_gpu_node(&tag, json!({"default": "reject"}));
    let mut b = privileged_bundle(&env, &tag, &lost, &["NVIDIA_VISIBLE_DEVICES=void"]);
    // CDI's ContainerEdits.Apply: RemoveDevice + AddDevice, and an allow rule of its own.
    b.spec["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({"allow": true, "type": "c", "major": 195, "minor": LOST, "access": "rwm"}));
    let out = runtime_run(runtime, &b, &unique_id("cdicri"));
    refused_on_the_lost_gpu(&env, &b, &out);
}

#[test]
fn runc_refuses_a_privileged_container_given_the_lost_gpu_by_cri_cdi_devices() {
    require_root!();
    privileged_cdi_cri_case("runc");
}

#[test]
fn crun_refuses_a_privileged_container_given_the_lost_gpu_by_cri_cdi_devices() {
    require_root!();
    privileged_cdi_cri_case("crun");
}
