//! devgate under containerd's CRI plugin configured with the shipped snippet
//! (hooks/containerd/config.toml: base_runtime_spec for the runc runtime), driven as kubelet
//! drives it: RunPodSandbox (host network), CreateContainer with a device and a
//! termination-message mount, StartContainer, ContainerStatus. The CRI client is
//! tests/cri/cri_client.py (grpcio from Debian's python3-grpcio; no generated code).

mod common;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const PYTHON: &str = "/usr/bin/python3";
const REJECT_LINE: &str =
    r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "cri test"; policy reject"#;
const TERMINATION_PATH: &str = "/dev/termination-log";

fn require_cri_client() {
    let ok = Command::new(PYTHON)
        .args(["-c", "import grpc"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{PYTHON} with grpc is not installed: make test installs it (scripts/install-test-deps.sh; apt-get install python3-grpcio)"
    );
}

/// One CRI call; Ok(response) or Err({"code", "details"}).
fn cri(cd: &Containerd, method: &str, arg: Value) -> Result<Value, Value> {
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cri/cri_client.py");
    let out = Command::new(PYTHON)
        .arg(client)
        .arg(&cd.socket)
        .arg(method)
        .arg(arg.to_string())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("cri client {method}: {}", text(&out)));
    match v.get("error") {
        Some(e) => Err(e.clone()),
        None => Ok(v),
    }
}

fn cri_ok(cd: &Containerd, method: &str, arg: Value) -> Value {
    cri(cd, method, arg.clone())
        .unwrap_or_else(|e| panic!("{method} {arg}: {e}\ncontainerd log:\n{}", cd.log()))
}

/// containerd's config: the shipped snippet with the base spec path of this test, and the
/// CRI settings a node without a registry needs (the sandbox image is the imported busybox).
/// restrict_oom_score_adj: this test machine (itself a container) may not lower
/// oom_score_adj, as the sandbox's -998 would.
fn start_containerd(base_spec: &Path) -> Containerd {
    let snippet = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/containerd/config.toml"),
    )
    .unwrap();
    assert!(
        snippet.contains(r#"base_runtime_spec = "/etc/containerd/devgate-base-spec.json""#),
        "{snippet}"
    );
    let (version, tables): (Vec<&str>, Vec<&str>) = snippet
        .lines()
        .partition(|l| l.trim_start().starts_with("version ="));
    assert_eq!(version, ["version = 2"]);
    let tables = tables.join("\n").replace(
        "/etc/containerd/devgate-base-spec.json",
        base_spec.to_str().unwrap(),
    );
    let cri = format!(
        "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{TEST_IMAGE}\"\n  \
         restrict_oom_score_adj = true\n\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n  \
         snapshotter = \"overlayfs\"\n"
    );
    Containerd::start("cri", "version = 2", &format!("{tables}\n\n{cri}"))
}

struct Pod {
    id: String,
    config: Value,
    uid: String,
    kubelet_pods: PathBuf,
}

impl Pod {
    /// What kubelet creates for a container: the termination-message file under its pod
    /// directory, mounted at the container's terminationMessagePath.
    fn container(&self, name: &str, command: &[&str]) -> Value {
        let dir = self
            .kubelet_pods
            .join(&self.uid)
            .join("containers")
            .join(name);
        fs::create_dir_all(&dir).unwrap();
        let term = dir.join("termination-log");
        fs::write(&term, "").unwrap();
        json!({
            "pod_sandbox_id": self.id,
            "sandbox_config": self.config,
            "config": {
                "name": name,
                "image": TEST_IMAGE,
                "command": command,
                "devices": [{"container_path": "/dev/zero", "host_path": "/dev/zero",
                             "permissions": "rwm"}],
                "mounts": [{"container_path": TERMINATION_PATH, "host_path": term}],
                "annotations": {"io.kubernetes.container.terminationMessagePath": TERMINATION_PATH},
                "log_path": format!("{name}/0.log"),
            }
        })
    }
}

/// Stops and removes the sandbox however the test ends, so no pause process outlives it.
struct SandboxGuard<'a> {
    cd: &'a Containerd,
    id: String,
}

impl Drop for SandboxGuard<'_> {
    fn drop(&mut self) {
        let _ = cri(
            self.cd,
            "StopPodSandbox",
            json!({"pod_sandbox_id": self.id}),
        );
        let _ = cri(
            self.cd,
            "RemovePodSandbox",
            json!({"pod_sandbox_id": self.id}),
        );
    }
}

fn wait_exited(cd: &Containerd, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = cri_ok(cd, "ContainerStatus", json!({"container_id": id}));
        if st["state"] == "CONTAINER_EXITED" || Instant::now() > deadline {
            return st;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// kubelet reads the termination message from the host file of the ContainerStatus mount
/// whose container path is the termination-message path.
fn termination_message(status: &Value) -> String {
    let mounts = status["mounts"].as_array().unwrap();
    let m = mounts
        .iter()
        .find(|m| m["container_path"] == TERMINATION_PATH)
        .unwrap_or_else(|| panic!("no {TERMINATION_PATH} mount in {status}"));
    fs::read_to_string(m["host_path"].as_str().unwrap()).unwrap()
}

#[test]
fn cri_start_error_carries_devgate_line_and_healthy_container_runs() {
    require_root!();
    require_cri_client();
    let work = tempdir("cri-work");
    let kubelet_pods = work.join("kubelet/pods");
    let env = Env::with("cri-env", json!({"kubelet_pods_dir": kubelet_pods}));
    let base_spec = work.join("devgate-base-spec.json");
    fs::write(&base_spec, containerd_base_spec_for(&env)).unwrap();
    let cd = start_containerd(&base_spec);
    cd.import_test_image("k8s.io");
    let v = cri_ok(&cd, "Version", json!({}));
    assert_eq!(v["runtime_api_version"], "v1");

    let uid = "5f0c7d7e-devgate-cri-test";
    let sandbox = json!({"name": "gpu-pod", "uid": uid, "namespace": "ml",
                         "log_directory": work.join("pods").join(uid), "network": "NODE"});
    let id = cri_ok(&cd, "RunPodSandbox", json!({"config": sandbox}))["pod_sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();
    let _guard = SandboxGuard {
        cd: &cd,
        id: id.clone(),
    };
    let pod = Pod {
        id,
        config: sandbox,
        uid: uid.into(),
        kubelet_pods,
    };

    // A cordoned device: StartContainer fails with devgate's line, and ContainerStatus (what
    // kubelet shows in `kubectl describe pod`) carries it too.
    env.ok(&["cordon", "/dev/zero", "--reason", "cri test"]);
    let req = pod.container("trainer", &["sh", "-c", "echo ran; echo ran > /tmp/ran"]);
    let cid = cri_ok(&cd, "CreateContainer", req)["container_id"]
        .as_str()
        .unwrap()
        .to_string();
    let err = cri(&cd, "StartContainer", json!({"container_id": cid}))
        .expect_err("StartContainer must fail for a cordoned device");
    assert!(
        err["details"].as_str().unwrap().contains(REJECT_LINE),
        "{err}"
    );
    let st = cri_ok(&cd, "ContainerStatus", json!({"container_id": cid}));
    assert_eq!(st["state"], "CONTAINER_EXITED", "{st}");
    assert_eq!(st["reason"], "StartError", "{st}");
    assert!(
        st["message"].as_str().unwrap().contains(REJECT_LINE),
        "{st}"
    );
    assert_ne!(st["exit_code"], 0, "{st}");
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
    cri_ok(&cd, "RemoveContainer", json!({"container_id": cid}));

    // Healthy again: the container starts, runs and exits 0.
    env.ok(&["uncordon", "/dev/zero"]);
    let req = pod.container("trainer-2", &["sh", "-c", "test -c /dev/zero && echo ran"]);
    let cid = cri_ok(&cd, "CreateContainer", req)["container_id"]
        .as_str()
        .unwrap()
        .to_string();
    cri_ok(&cd, "StartContainer", json!({"container_id": cid}));
    let st = wait_exited(&cd, &cid);
    assert_eq!(st["state"], "CONTAINER_EXITED", "{st}");
    assert_eq!(st["exit_code"], 0, "{st}");
    let log = fs::read_to_string(st["log_path"].as_str().unwrap()).unwrap();
    assert!(log.contains(" stdout F ran"), "{log}");
    assert_eq!(env.decisions().last().unwrap()["action"], "allow");
    // No fault during that run: kubelet's termination file is untouched.
    assert_eq!(termination_message(&st), "");
    cri_ok(&cd, "RemoveContainer", json!({"container_id": cid}));

    // A device fault during the run: the app writes its own message and waits; the
    // operator cordons its device; the app exits. What kubelet reads as the termination
    // message (the host file of the termination-message mount) ends with devgate's line.
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
    req["config"]["mounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"container_path": "/go", "host_path": go}));
    let cid = cri_ok(&cd, "CreateContainer", req)["container_id"]
        .as_str()
        .unwrap()
        .to_string();
    cri_ok(&cd, "StartContainer", json!({"container_id": cid}));
    let st = cri_ok(&cd, "ContainerStatus", json!({"container_id": cid}));
    let deadline = Instant::now() + Duration::from_secs(20);
    while termination_message(&st).is_empty() {
        assert!(Instant::now() < deadline, "the app never wrote its message");
        std::thread::sleep(Duration::from_millis(50));
    }
    env.ok(&["cordon", "/dev/zero", "--reason", "xid 79 during run"]);
    fs::write(go.join("now"), "").unwrap();
    let st = wait_exited(&cd, &cid);
    assert_eq!(st["exit_code"], 1, "{st}");
    // poststop runs when containerd deletes the task, just after the exit is reported.
    let want = "app: CUDA error\ndevgate: DeviceFault/Cordoned on /dev/zero (1:5): \
                cordoned by operator during the run: \"xid 79 during run\"\n";
    let deadline = Instant::now() + Duration::from_secs(20);
    while termination_message(&st) != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(termination_message(&st), want, "{}", cd.log());
    let explained = env.ok(&["explain", &cid]);
    assert!(explained.contains("DeviceFault/Cordoned"), "{explained}");
    env.ok(&["uncordon", "/dev/zero"]);
    cri_ok(&cd, "RemoveContainer", json!({"container_id": cid}));

    cri_ok(&cd, "StopPodSandbox", json!({"pod_sandbox_id": pod.id}));
    cri_ok(&cd, "RemovePodSandbox", json!({"pod_sandbox_id": pod.id}));
}
