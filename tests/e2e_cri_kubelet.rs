//! What kubelet shows of a device fault, through containerd's CRI with the shipped snippet,
//! read by kubelet's own rules (tests/common/kubelet.rs): the last 4096 bytes of the
//! termination file, each container's share of 12 KiB, the restart about 1 s after the
//! exit, and the fallback to the log only for an empty file.

mod common;
use common::cri::{self, ContainerState, Cri, PodGuard};
use common::kubelet::{self, Pod, Policy};
use common::*;
use std::fs;
use std::path::PathBuf;

const FAULT_LINE: &str = "devgate: DeviceFault/Cordoned on /dev/zero (1:5): \
                          cordoned by operator during the run: \"xid 79 during run\"";
const REJECT_LINE: &str = r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "xid 79 during run"; policy reject"#;

struct Cluster {
    // First: dropped (the pod stopped and removed) while containerd still runs.
    _guard: PodGuard,
    env: Env,
    cd: Containerd,
    c: Cri,
    pod: Pod,
    work: PathBuf,
}

/// A CRI pod sandbox sets cpu.weight, which a unified node without the cpu controller on
/// cgroup2 (this project's machines) cannot give: say so and skip.
fn skip_without_cpu_on_v2() -> bool {
    match common::node::unified_without("cpu") {
        Some(why) => {
            eprintln!("skipped: {why}: a CRI pod sandbox sets cpu.weight");
            true
        }
        None => false,
    }
}

fn cluster(tag: &str) -> Cluster {
    kubelet::stack();
    let work = tempdir(tag);
    let kubelet_pods = work.join("kubelet/pods");
    let env = Env::with(
        &format!("{tag}-env"),
        serde_json::json!({
            "kubelet_pods_dir": kubelet_pods,
            "kubelet_pod_logs_dir": work.join("pods"),
        }),
    );
    let base_spec = work.join("devgate-base-spec.json");
    fs::write(&base_spec, containerd_base_spec_for(&env)).unwrap();
    let cd = cri::containerd_with_snippet(tag, &base_spec);
    cd.import_test_image("k8s.io");
    let mut c = Cri::connect(&cd.socket);
    let uid = format!("{tag}-uid");
    let pod = Pod::run(&mut c, "gpu-pod", &uid, &work, &kubelet_pods);
    let guard = PodGuard {
        socket: cd.socket.clone(),
        id: pod.id.clone(),
    };
    Cluster {
        _guard: guard,
        env,
        cd,
        c,
        pod,
        work,
    }
}

impl Cluster {
    /// One run of `name` that sees a device fault: `app` runs, then the operator cordons
    /// the device, then the app exits 1; returns its status once devgate's poststop ran.
    fn faulted_run(
        &mut self,
        name: &str,
        attempt: u32,
        policy: Policy,
        app: &str,
    ) -> (String, cri::ContainerStatus) {
        let go = self.work.join(format!("go-{name}-{attempt}"));
        fs::create_dir_all(&go).unwrap();
        let script =
            format!("{app}; touch /go/ready; while [ ! -e /go/now ]; do sleep 0.05; done; exit 1");
        let mut req = self
            .pod
            .container(name, attempt, policy, &["sh", "-c", &script]);
        req.mounts.push(cri::Mount {
            container_path: "/go".into(),
            host_path: go.display().to_string(),
            ..Default::default()
        });
        let cid = self
            .c
            .create_container(&self.pod.id, req, &self.pod.config)
            .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", self.cd.log()));
        self.c.start_container(&cid).unwrap();
        wait_for("the app to write its message", || go.join("ready").exists());
        self.env
            .ok(&["cordon", "/dev/zero", "--reason", "xid 79 during run"]);
        fs::write(go.join("now"), "").unwrap();
        let st = kubelet::wait_exited(&mut self.c, &cid);
        assert_eq!(st.exit_code, 1, "{st:?}");
        kubelet::wait_poststop(&self.env, &cid);
        (cid, self.c.container_status(&st.id).unwrap())
    }
}

/// An app that filled its termination file: devgate's line still reaches `kubectl
/// describe` whole, first, through kubelet's 4096-byte tail and a 4-container pod's
/// 3072-byte share; the app's last words follow it where one container has 12 KiB.
#[test]
fn cri_fault_line_survives_kubelets_cuts_in_a_pod_of_four() {
    require_root!();
    if skip_without_cpu_on_v2() {
        return;
    }
    let mut n = cluster("kcut");
    let app = "head -c 3990 /dev/zero | tr '\\0' x > /dev/termination-log; \
               echo ' app: CUDA error' >> /dev/termination-log";
    let (_, st) = n.faulted_run("trainer", 0, Policy::File, app);
    for containers in [4, 6, 8] {
        let shown = kubelet::describe_message(&st, Policy::File, containers);
        assert_eq!(
            shown.lines().next(),
            Some(FAULT_LINE),
            "{containers}: {shown}"
        );
    }
    let whole = kubelet::describe_message(&st, Policy::File, 1);
    assert!(
        whole.starts_with(&format!("{FAULT_LINE}\n")),
        "{}",
        &whole[..200]
    );
    let end = &whole[whole.len().saturating_sub(200)..];
    assert!(whole.ends_with("x app: CUDA error\n"), "{end}");
    assert!(fs::metadata(kubelet::host_file(&st)).unwrap().len() <= kubelet::FILE_LIMIT);
    n.env.ok(&["uncordon", "/dev/zero"]);
}

/// FallbackToLogsOnError and an app that wrote no message: kubelet shows the app's own
/// last log lines, as it would without devgate, then devgate's line, which poststop
/// appended to the container's log. A `File` pod gets devgate's line and never log text,
/// and its log is left as the app wrote it.
#[test]
fn cri_fallback_to_logs_keeps_the_apps_log_lines() {
    require_root!();
    if skip_without_cpu_on_v2() {
        return;
    }
    let mut n = cluster("kfallback");
    let app = "echo 'app: CUDA error: an illegal memory access was encountered'";
    let (cid, st) = n.faulted_run("logs", 0, Policy::FallbackToLogsOnError, app);
    let shown = kubelet::describe_message(&st, Policy::FallbackToLogsOnError, 2);
    assert!(
        shown.contains("app: CUDA error: an illegal memory access was encountered\n"),
        "{shown}"
    );
    let exit = n.env.dir.join(format!("state/exits/{cid}.json"));
    let exit = fs::read_to_string(exit).unwrap_or_default();
    assert!(
        shown.contains(&format!("{FAULT_LINE}\n")),
        "{shown}\n{exit}"
    );
    assert_eq!(fs::metadata(kubelet::host_file(&st)).unwrap().len(), 0);
    let explained = n.env.ok(&["explain", &cid]);
    assert!(explained.contains("container log: appended"), "{explained}");
    n.env.ok(&["uncordon", "/dev/zero"]);
    // An app whose last 80 lines hold far more than kubelet's 2048 bytes: kubelet keeps
    // their end, where devgate's line is.
    let long = "i=0; while [ $i -lt 100 ]; do echo \"app: step $i of a long and chatty \
                training loop\"; i=$((i+1)); done";
    let (_, st) = n.faulted_run("long", 0, Policy::FallbackToLogsOnError, long);
    let shown = kubelet::describe_message(&st, Policy::FallbackToLogsOnError, 2);
    assert!(shown.contains("app: step 99 of"), "{shown}");
    assert!(!shown.contains("app: step 20 of"), "{shown}");
    assert!(shown.ends_with(&format!("{FAULT_LINE}\n")), "{shown}");
    n.env.ok(&["uncordon", "/dev/zero"]);
    let (_, st) = n.faulted_run("file", 0, Policy::File, app);
    let shown = kubelet::describe_message(&st, Policy::File, 2);
    assert_eq!(shown, format!("{FAULT_LINE}\n"));
    let log = fs::read_to_string(&st.log_path).unwrap();
    assert!(!log.contains("devgate"), "{log}");
    n.env.ok(&["uncordon", "/dev/zero"]);
}

/// `restartPolicy: Always`: kubelet creates the container again about 1 s after the
/// faulted exit, prestart rejects it (the device is still cordoned), and from then on the
/// pod shows only that attempt's StartError. Its reject line keeps today's text first and
/// says which fault ended the previous run, and when.
#[test]
fn cri_restart_after_a_fault_names_the_fault_in_the_reject_line() {
    require_root!();
    if skip_without_cpu_on_v2() {
        return;
    }
    let mut n = cluster("krestart");
    let (first, _) = n.faulted_run("trainer", 0, Policy::File, "true");
    std::thread::sleep(kubelet::RESTART_DELAY);
    let req = n
        .pod
        .container("trainer", 1, Policy::File, &["sh", "-c", "exit 0"]);
    let cid = n.c.create_container(&n.pod.id, req, &n.pod.config).unwrap();
    let err =
        n.c.start_container(&cid)
            .expect_err("the cordoned device must reject");
    let st = n.c.container_status(&cid).unwrap();
    assert_eq!(st.state, ContainerState::ContainerExited as i32, "{st:?}");
    assert_eq!(st.reason, "StartError", "{st:?}");
    let shown = kubelet::describe_message(&st, Policy::File, 1);
    let exit: serde_json::Value = serde_json::from_slice(
        &fs::read(n.env.dir.join(format!("state/exits/{first}.json"))).unwrap(),
    )
    .unwrap();
    let stopped = exit["stopped"].as_str().unwrap();
    let previous = format!(
        "{REJECT_LINE}; the previous run of this container ({}) ended {stopped} with \
         DeviceFault/Cordoned on /dev/zero (1:5): cordoned by operator during the run: \
         \"xid 79 during run\"",
        &first[..12]
    );
    assert!(err.message().contains(&previous), "{err}");
    assert!(shown.contains(&previous), "{shown}");
    n.env.ok(&["uncordon", "/dev/zero"]);
}
