//! devgate under containerd's CRI plugin configured with the shipped snippet for its version
//! (hooks/containerd/config.toml for 1.6 and 1.7, config-v3.toml for 2.x: base_runtime_spec
//! for the runc runtime; tests/common/cri.rs `containerd_with_snippet`), driven as kubelet
//! drives it: RunPodSandbox (host network), CreateContainer with a device and a
//! termination-message mount, StartContainer, ContainerStatus. The CRI client is k8s-cri's
//! typed runtime.v1 client (tests/common/cri.rs).

mod common;
use common::cri::{self, ContainerState, Cri, PodGuard};
use common::*;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const REJECT_LINE: &str =
    r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "cri test"; policy reject"#;
const TERMINATION_PATH: &str = "/dev/termination-log";

struct Pod {
    id: String,
    config: cri::PodSandboxConfig,
    uid: String,
    kubelet_pods: PathBuf,
}

impl Pod {
    /// What kubelet creates for a container: the termination-message file under its pod
    /// directory, mounted at the container's terminationMessagePath.
    fn container(&self, name: &str, command: &[&str]) -> cri::ContainerConfig {
        let dir = self
            .kubelet_pods
            .join(&self.uid)
            .join("containers")
            .join(name);
        fs::create_dir_all(&dir).unwrap();
        let term = dir.join("termination-log");
        fs::write(&term, "").unwrap();
        let mut c = cri::container(name, TEST_IMAGE, command, &["/dev/zero"]);
        c.mounts.push(cri::Mount {
            container_path: TERMINATION_PATH.into(),
            host_path: term.display().to_string(),
            ..Default::default()
        });
        c.annotations.insert(
            "io.kubernetes.container.terminationMessagePath".into(),
            TERMINATION_PATH.into(),
        );
        c
    }
}

fn wait_exited(c: &mut Cri, id: &str) -> cri::ContainerStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = c.container_status(id).unwrap();
        if st.state == ContainerState::ContainerExited as i32 || Instant::now() > deadline {
            return st;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// kubelet reads the termination message from the host file of the ContainerStatus mount
/// whose container path is the termination-message path.
fn termination_message(status: &cri::ContainerStatus) -> String {
    let m = status
        .mounts
        .iter()
        .find(|m| m.container_path == TERMINATION_PATH)
        .unwrap_or_else(|| panic!("no {TERMINATION_PATH} mount in {status:?}"));
    fs::read_to_string(&m.host_path).unwrap()
}

#[test]
fn cri_start_error_carries_devgate_line_and_healthy_container_runs() {
    require_root!();
    if let Some(why) = node::unified_without("cpu") {
        eprintln!("skipped: {why}: a CRI pod sandbox sets cpu.weight");
        return;
    }
    let work = tempdir("cri-work");
    let kubelet_pods = work.join("kubelet/pods");
    let env = Env::with(
        "cri-env",
        serde_json::json!({"kubelet_pods_dir": kubelet_pods}),
    );
    let base_spec = work.join("devgate-base-spec.json");
    fs::write(&base_spec, containerd_base_spec_for(&env)).unwrap();
    let cd = cri::containerd_with_snippet("cri", &base_spec);
    cd.import_test_image("k8s.io");
    let mut c = Cri::connect(&cd.socket);
    assert_eq!(c.version().unwrap().runtime_api_version, "v1");

    let uid = "5f0c7d7e-devgate-cri-test";
    let sandbox = cri::host_network_pod("gpu-pod", uid, "ml", &work.join("pods").join(uid));
    let id = c
        .run_pod_sandbox(&sandbox)
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", cd.log()));
    let _guard = PodGuard {
        socket: cd.socket.clone(),
        id: id.clone(),
    };
    let pod = Pod {
        id,
        config: sandbox,
        uid: uid.into(),
        kubelet_pods,
    };
    let create = |c: &mut Cri, req: cri::ContainerConfig| {
        c.create_container(&pod.id, req, &pod.config)
            .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", cd.log()))
    };

    // A cordoned device: StartContainer fails with devgate's line, and ContainerStatus (what
    // kubelet shows in `kubectl describe pod`) carries it too.
    env.ok(&["cordon", "/dev/zero", "--reason", "cri test"]);
    let cid = create(
        &mut c,
        pod.container("trainer", &["sh", "-c", "echo ran; echo ran > /tmp/ran"]),
    );
    let err = c
        .start_container(&cid)
        .expect_err("StartContainer must fail for a cordoned device");
    assert!(err.message().contains(REJECT_LINE), "{err}");
    let st = c.container_status(&cid).unwrap();
    assert_eq!(st.state, ContainerState::ContainerExited as i32, "{st:?}");
    assert_eq!(st.reason, "StartError", "{st:?}");
    assert!(st.message.contains(REJECT_LINE), "{st:?}");
    assert_ne!(st.exit_code, 0, "{st:?}");
    // The decision names the pod from containerd's CRI annotations.
    let last = env.decisions().last().cloned().unwrap();
    assert_eq!(last["action"], "reject");
    assert_eq!(last["container_id"], cid.as_str());
    assert_eq!(last["pod"]["namespace"], "ml", "{last}");
    assert_eq!(last["pod"]["name"], "gpu-pod", "{last}");
    assert_eq!(last["pod"]["uid"], uid, "{last}");
    assert_eq!(last["pod"]["container"], "trainer", "{last}");
    // The rejected container never ran: the termination file kubelet would read is as
    // kubelet made it.
    assert_eq!(termination_message(&st), "");
    c.remove_container(&cid).unwrap();

    // Healthy again: the container starts, runs and exits 0.
    env.ok(&["uncordon", "/dev/zero"]);
    let cid = create(
        &mut c,
        pod.container(
            "trainer-2",
            &[
                "sh",
                "-c",
                "test -c /dev/zero && echo ran; echo nofile $(ulimit -Hn)",
            ],
        ),
    );
    c.start_container(&cid).unwrap();
    let st = wait_exited(&mut c, &cid);
    assert_eq!(st.state, ContainerState::ContainerExited as i32, "{st:?}");
    assert_eq!(st.exit_code, 0, "{st:?}");
    let log = fs::read_to_string(&st.log_path).unwrap();
    assert!(log.contains(" stdout F ran"), "{log}");
    // The base spec sets no rlimits: the container keeps the open-file limit it inherits
    // (containerd's), not a node-wide 1024 from the file.
    let limits = fs::read_to_string("/proc/self/limits").unwrap();
    let ours: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4)?.parse().ok())
        .unwrap_or(0);
    if ours > 1024 {
        assert!(!log.contains(" stdout F nofile 1024"), "{log}");
        assert!(log.contains(" stdout F nofile "), "{log}");
    } else {
        eprintln!("skipped: the open-file hard limit here is {ours}, no more than 1024");
    }
    assert_eq!(env.decisions().last().unwrap()["action"], "allow");
    // No fault during that run: kubelet's termination file is untouched.
    assert_eq!(termination_message(&st), "");
    c.remove_container(&cid).unwrap();

    // A device fault during the run: the app writes its own message and waits; the
    // operator cordons its device; the app exits. What kubelet reads as the termination
    // message (the host file of the termination-message mount) starts with devgate's line.
    let go = work.join("go");
    let mut req = pod.container(
        "trainer-3",
        &[
            "sh",
            "-c",
            "echo 'app: CUDA error' > /dev/termination-log; \
                       while [ ! -e /go/now ]; do sleep 0.05; done; exit 1",
        ],
    );
    fs::create_dir_all(&go).unwrap();
    req.mounts.push(cri::Mount {
        container_path: "/go".into(),
        host_path: go.display().to_string(),
        ..Default::default()
    });
    let cid = create(&mut c, req);
    c.start_container(&cid).unwrap();
    let st = c.container_status(&cid).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while termination_message(&st).is_empty() {
        assert!(Instant::now() < deadline, "the app never wrote its message");
        std::thread::sleep(Duration::from_millis(50));
    }
    env.ok(&["cordon", "/dev/zero", "--reason", "xid 79 during run"]);
    fs::write(go.join("now"), "").unwrap();
    let st = wait_exited(&mut c, &cid);
    assert_eq!(st.exit_code, 1, "{st:?}");
    // poststop runs when containerd deletes the task, just after the exit is reported.
    let want = "devgate: DeviceFault/Cordoned on /dev/zero (1:5): \
                cordoned by operator during the run: \"xid 79 during run\"\napp: CUDA error\n";
    let deadline = Instant::now() + Duration::from_secs(20);
    while termination_message(&st) != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(termination_message(&st), want, "{}", cd.log());
    let explained = env.ok(&["explain", &cid]);
    assert!(explained.contains("DeviceFault/Cordoned"), "{explained}");
    env.ok(&["uncordon", "/dev/zero"]);
    c.remove_container(&cid).unwrap();

    c.stop_pod_sandbox(&pod.id).unwrap();
    c.remove_pod_sandbox(&pod.id).unwrap();
}
