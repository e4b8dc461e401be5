//! poststop for a GPU container under the real runc: while it runs, the kernel log gains
//! an XID 79 for its GPU and the fake NVML's volatile ECC count rises; after it exits, the
//! termination message, the exit record and `devgate explain` carry both faults.

mod common;
use common::fake_nvml::*;
use common::*;
use serde_json::json;
use std::fs;
use std::process::{Command, Stdio};

#[test]
fn xid_and_ecc_during_run_reach_termination_message() {
    require_root!();
    let node = GpuNode::new("ps-gpu");
    let (dir, kmsg) = (&node.dir, &node.kmsg);
    // an old XID on another GPU, before the container starts: never this run's fault
    fs::write(
        kmsg,
        "4,990,1000000,-;NVRM: Xid (PCI:0000:5e:00): 79, pid=1, old\n",
    )
    .unwrap();
    let pods = dir.join("kubelet/pods");
    let term_dir = pods.join("uid-1/containers/trainer");
    fs::create_dir_all(&term_dir).unwrap();
    let term = term_dir.join("termination-log");
    fs::write(&term, "").unwrap();
    let mut cfg = node.config();
    cfg["kubelet_pods_dir"] = json!(pods);
    let env = Env::with("ps-gpu", cfg);
    let scenario = write_scenario(dir, "node", &healthy_node());

    let mut b = Bundle::new(
        "ps-gpu",
        &[
            "sh",
            "-c",
            "echo 'app: CUDA error: an illegal memory access' > /dev/termination-log; \
                       while [ ! -e /out/go ]; do sleep 0.05; done; exit 1",
        ],
    );
    b.add_device("/dev/nvidia1", "c", 195, 1);
    b.add_hooks(&env, &["prestart", "poststop"]);
    for stage in ["prestart", "poststop"] {
        for h in b.spec["hooks"][stage].as_array_mut().unwrap() {
            h["env"] = json!([format!("FAKE_NVML_CONFIG={}", scenario.display())]);
        }
    }
    b.spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/dev/termination-log", "type": "bind", "source": term,
        "options": ["rbind", "rprivate", "rw"]}));
    // containerd's CRI annotations name kubelet's file for this container
    b.spec["annotations"] = json!({"io.kubernetes.cri.sandbox-uid": "uid-1",
                                   "io.kubernetes.cri.container-name": "trainer"});
    let id = unique_id("gpu");
    let running = Running::start(&b, &id);
    wait_for("the container's own message", || {
        !fs::read_to_string(&term).unwrap_or_default().is_empty()
    });
    // The faults, during the run.
    let mut log = fs::read_to_string(kmsg).unwrap();
    log.push_str("3,991,9000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n");
    fs::write(kmsg, log).unwrap();
    write_scenario(
        dir,
        "node",
        &node_with(1, json!({"volatile_uncorrectable_ecc": 2})),
    );
    fs::write(b.rootfs().join("out/go"), "").unwrap();
    let out = running.wait();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));

    let msg = fs::read_to_string(&term).unwrap();
    let uuid1 = uuid(1);
    assert_eq!(
        msg,
        format!(
            "devgate: DeviceFault/XID79 on /dev/nvidia1 ({uuid1}): GPU has fallen off the bus\n\
             devgate: DeviceFault/ECCUncorrectable on /dev/nvidia1 ({uuid1}): 2 new volatile uncorrectable ECC errors (0 -> 2)\n\
             app: CUDA error: an illegal memory access\n"
        )
    );
    let exit: serde_json::Value =
        serde_json::from_slice(&fs::read(env.dir.join(format!("state/exits/{id}.json"))).unwrap())
            .unwrap();
    let codes: Vec<(&str, &str)> = exit["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["code"].as_str().unwrap(),
                f["reason_code"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        codes,
        [
            ("DeviceFault/XID79", "xid_critical"),
            ("DeviceFault/ECCUncorrectable", "ecc_volatile_uncorrectable")
        ]
    );
    assert_eq!(exit["faults"][0]["gpu_uuid"], uuid1.as_str());
    let explained = env.ok(&["explain", &id]);
    assert!(explained.contains("2 device fault(s)"), "{explained}");
}

#[test]
fn gpu_lost_during_run_is_a_fault() {
    require_root!();
    let node = GpuNode::new("ps-lost");
    let dir = &node.dir;
    let env = Env::with("ps-lost", node.config());
    let scenario = write_scenario(dir, "node", &healthy_node());
    let mut b = Bundle::new("ps-lost", &["true"]);
    b.add_device("/dev/nvidia1", "c", 195, 1);
    b.write();
    let id = unique_id("lost");
    let state = b.state_json(&id);
    let hook = |stage: &str| {
        let mut c = Command::new(devgate_bin());
        c.arg("--config").arg(&env.config).args(["hook", stage]);
        c.env("FAKE_NVML_CONFIG", &scenario);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(state.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let pre = hook("prestart");
    assert!(pre.status.success(), "{}", text(&pre));
    write_scenario(dir, "node", &node_with(1, json!({"lost": true})));
    let post = hook("poststop");
    assert!(post.status.success(), "{}", text(&post));
    assert!(
        String::from_utf8_lossy(&post.stderr).contains(&format!(
            "devgate: DeviceFault/GPULost on /dev/nvidia1 ({}): GPU is lost: NVML cannot reach it",
            uuid(1)
        )),
        "{}",
        text(&post)
    );
}
