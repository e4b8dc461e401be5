//! What a cluster shows of devgate's verdicts, on a real node: kube-apiserver, scheduler,
//! controller-manager and kubelet built from Kubernetes' own modules (two releases, the
//! newest and the one before), containerd with devgate as docs/install.md installs it,
//! and GPUs handed out by a device plugin as NVIDIA's does (tests/common/k8s.rs). What
//! is asserted is what `kubectl get pod -o json` and the pod's events say.

mod common;
use common::fake_nvml;
use common::k8s::{self, K8sNode, Options};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;

/// What a host without pod sandboxes skips.
const CASES: &str = "real-kubelet cases (reject, retry, privileged pods, fault messages, 8 \
                     containers, the DaemonSet installer)";

#[test]
fn kubelet_v1_37_shows_what_devgate_says() {
    require_root!();
    k8s::on_release("v1.37", CASES, run_cases);
}

#[test]
fn kubelet_v1_36_shows_what_devgate_says() {
    require_root!();
    k8s::on_release("v1.36", CASES, run_cases);
}

fn run_cases(release: &str) {
    let tag = format!("k8s-{}", release.replace('.', ""));
    let opts = Options {
        devgate_by_hand: true,
        ..Options::default()
    };
    let mut n = K8sNode::start(&tag, release, opts);
    xid_rejects_a_start(&mut n);
    uncordon_lets_kubelets_retry_start_the_pod(&mut n);
    privileged_pods_start_beside_a_cordoned_gpu(&mut n);
    faults_during_runs_reach_the_pod_status(&mut n);
}

// ---- pods ----------------------------------------------------------------------------

const GO: &str = "/go";

/// A container of the test image running `script`, with the go dir mounted; `gpu` asks
/// for one nvidia.com/gpu.
fn container(name: &str, script: &str, policy: &str, gpu: bool) -> Value {
    let mut c = json!({
        "name": name,
        "image": TEST_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "terminationMessagePolicy": policy,
        "volumeMounts": [{"name": "go", "mountPath": GO}],
    });
    if gpu {
        c["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    }
    c
}

/// A pod of `containers`; `go` is a host dir the test and the apps talk through.
fn pod(name: &str, restart: &str, go: &Path, containers: Vec<Value>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "hostNetwork": true,
            "restartPolicy": restart,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "go", "hostPath": {"path": go, "type": "Directory"}}],
            "containers": containers,
        }
    })
}

/// The status of container `name` of `pod`.
fn status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

fn container_id(st: &Value) -> Option<String> {
    st["containerID"]
        .as_str()?
        .split_once("://")
        .map(|(_, id)| id.to_string())
}

/// The line devgate printed for the start of `cid` (its decision log).
fn decision_message(n: &K8sNode, cid: &str) -> Option<String> {
    n.env
        .log_lines()
        .into_iter()
        .find(|d| d["container_id"] == cid && d["message"].is_string())
        .map(|d| d["message"].as_str().unwrap().to_string())
}

/// The fault line devgate wrote when `cid` stopped, from its exit record's first fault
/// (`devgate: <code> on <device> (<GPU UUID>): <message>`, report::fault).
fn exit_text(n: &K8sNode, cid: &str) -> Option<String> {
    let rec = fs::read(n.env.dir.join(format!("state/exits/{cid}.json"))).ok()?;
    let rec: Value = serde_json::from_slice(&rec).ok()?;
    let f = &rec["faults"][0];
    Some(format!(
        "devgate: {} on {} ({}): {}",
        f["code"].as_str()?,
        f["device"].as_str()?,
        f["gpu_uuid"].as_str()?,
        f["message"].as_str()?
    ))
}

// ---- the kernel log ------------------------------------------------------------------

const DRIVER_LOAD: &str =
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Thu Feb 22 01:44:30 UTC 2024";

fn xid_79(i: usize) -> String {
    let bus = fake_nvml::bus(i);
    let bus = bus.rsplit_once('.').unwrap().0;
    format!("NVRM: Xid (PCI:{bus}): 79, pid=2241, GPU has fallen off the bus.")
}

// ---- the cases -----------------------------------------------------------------------

/// Every GPU of the fake node, with `edit` applied to each.
fn every_gpu(edit: Value) -> Value {
    let mut node = fake_nvml::node_with(0, json!({}));
    for g in node["gpus"].as_array_mut().unwrap() {
        for (k, v) in edit.as_object().unwrap() {
            g[k] = v.clone();
        }
    }
    node
}

/// XID 79 on every GPU, and NVML asking for a node reboot as after a real one: the start
/// is rejected, and the whole `devgate: rejected …` line is in the container's terminated
/// message and in kubelet's Failed event. A driver load then ends the XIDs.
fn xid_rejects_a_start(n: &mut K8sNode) {
    n.set_nvml(&every_gpu(
        json!({"recovery_action": fake_nvml::recovery::NODE_REBOOT}),
    ));
    let mut records: Vec<String> = (0..8).map(xid_79).collect();
    let refs: Vec<&str> = records.iter().map(String::as_str).collect();
    fs::write(&n.gpus.kmsg, fake_nvml::kmsg_records(&refs)).unwrap();
    let go = n.go_dir("xid");
    n.apply(&pod(
        "xid",
        "Always",
        &go,
        vec![container("app", "echo started > /go/started", "File", true)],
    ));
    let (cid, message) = n.wait_pod("xid", "rejected by devgate", |p| {
        let st = status(p, "app")?;
        let term = &st["lastState"]["terminated"];
        let term = if term.is_object() {
            term
        } else {
            &st["state"]["terminated"]
        };
        let msg = term["message"].as_str()?;
        msg.contains("devgate: rejected")
            .then(|| (container_id(st), msg.to_string()))
    });
    let cid = cid.or_else(|| {
        n.env
            .log_lines()
            .into_iter()
            .rev()
            .find(|d| d["action"] == "reject")
            .and_then(|d| d["container_id"].as_str().map(str::to_string))
    });
    let cid = cid.expect("the rejected container's id");
    let line = decision_message(n, &cid).expect("devgate's reject line in its log");
    assert!(line.starts_with("devgate: rejected /dev/nvidia"), "{line}");
    assert!(
        line.contains("xid 79 (GPU has fallen off the bus)"),
        "{line}"
    );
    assert!(
        message.contains(&line),
        "the pod's message lacks devgate's whole line:\n{message}\n{line}"
    );
    assert!(
        !go.join("started").exists(),
        "the app ran on a GPU with XID 79"
    );
    let events = n.events("xid");
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("Failed: ") && e.contains(&line)),
        "no Failed event with devgate's whole line: {events:#?}"
    );
    n.delete_pod("xid");
    n.set_nvml(&every_gpu(json!({})));
    records.push(DRIVER_LOAD.to_string());
    let refs: Vec<&str> = records.iter().map(String::as_str).collect();
    fs::write(&n.gpus.kmsg, fake_nvml::kmsg_records(&refs)).unwrap();
}

fn cordon_all(n: &K8sNode, reason: &str) {
    for i in 0..8 {
        n.env
            .ok(&["cordon", &format!("195:{i}"), "--reason", reason]);
    }
}

fn uncordon_all(n: &K8sNode) {
    for i in 0..8 {
        n.env.ok(&["uncordon", &format!("195:{i}")]);
    }
}

/// Every GPU cordoned: kubelet's starts are rejected; after `devgate uncordon` kubelet's
/// own next retry starts the same pod, with no delete.
fn uncordon_lets_kubelets_retry_start_the_pod(n: &mut K8sNode) {
    cordon_all(n, "bad fan");
    let go = n.go_dir("retry");
    n.apply(&pod(
        "retry",
        "Always",
        &go,
        vec![container(
            "app",
            "echo started > /go/started; sleep 3600",
            "File",
            true,
        )],
    ));
    let uid = n.wait_pod("retry", "rejected by devgate", |p| {
        let st = status(p, "app")?;
        let msg = st["lastState"]["terminated"]["message"].as_str()?;
        msg.contains("devgate: rejected /dev/nvidia")
            .then(|| p["metadata"]["uid"].as_str().unwrap().to_string())
    });
    assert!(!go.join("started").exists());
    uncordon_all(n);
    n.wait_pod("retry", "running after uncordon", |p| {
        let st = status(p, "app")?;
        st["state"]["running"].is_object().then_some(())
    });
    assert_eq!(
        n.pod("retry")["metadata"]["uid"],
        uid.as_str(),
        "the pod was replaced"
    );
    wait_for("the app to start", || go.join("started").exists());
    n.delete_pod("retry");
}

/// A privileged container, as `securityContext.privileged` asks; `gpus` of them, if any.
fn privileged(name: &str, script: &str, env: &[(&str, &str)], gpus: u32) -> Value {
    let mut c = container(name, script, "File", false);
    c["securityContext"] = json!({"privileged": true});
    c["env"] = env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    if gpus > 0 {
        c["resources"] = json!({"limits": {"nvidia.com/gpu": gpus.to_string()}});
    }
    c
}

/// The pod ran to success, and devgate's line for its start names the cordoned GPU as
/// held and not assigned.
fn ran_holding(n: &K8sNode, name: &str, go: &Path, minor: u32) {
    let cid = n.wait_pod(name, "succeeded", |p| {
        (p["status"]["phase"] == "Succeeded").then(|| container_id(status(p, "app")?))?
    });
    assert!(go.join("started").exists(), "{name} did not run");
    let line = decision_message(n, &cid).expect("devgate's held line in its log");
    assert!(line.starts_with("devgate: warning: holds "), "{line}");
    assert!(
        line.contains(&format!(
            "nvidia{minor} (195:{minor}): quarantined by operator: \"bad fan\""
        )),
        "{line}"
    );
    n.delete_pod(name);
}

/// The pod's start was refused with devgate's line naming the cordoned GPU.
fn refused_on(n: &K8sNode, name: &str, go: &Path, minor: u32) {
    let msg = n.wait_pod(name, "rejected by devgate", |p| {
        let st = status(p, "app")?;
        let msg = st["state"]["terminated"]["message"].as_str()?;
        msg.contains("devgate: rejected").then(|| msg.to_string())
    });
    assert!(
        msg.contains(&format!("devgate: rejected /dev/nvidia{minor} "))
            && msg.contains(&format!("195:{minor}): quarantined by operator"))
            && msg.contains("policy reject"),
        "{msg}"
    );
    assert!(!go.join("started").exists(), "{name} ran on a cordoned GPU");
    n.delete_pod(name);
}

/// GPU 3 cordoned, policy reject (issue 35): the node's own privileged pods start (no GPU
/// variable, `NVIDIA_VISIBLE_DEVICES=all`, `kubectl debug node --profile=sysadmin`), each
/// with devgate's line naming the GPU it holds; a privileged pod whose device-plugin
/// allocation holds GPU 3, and an unprivileged one, are refused with devgate's line.
fn privileged_pods_start_beside_a_cordoned_gpu(n: &mut K8sNode) {
    const BAD: u32 = 3;
    n.env
        .ok(&["cordon", &format!("195:{BAD}"), "--reason", "bad fan"]);
    let run = "echo started > /go/started";
    for (name, env) in [
        ("priv-none", vec![]),
        ("priv-all", vec![("NVIDIA_VISIBLE_DEVICES", "all")]),
    ] {
        let go = n.go_dir(name);
        let app = privileged("app", run, &env, 0);
        n.apply(&pod(name, "Never", &go, vec![app]));
        ran_holding(n, name, &go, BAD);
    }

    // The operator's way in at 3 a.m.: a privileged pod with the host's namespaces.
    let out = n.kubectl(&[
        "debug",
        &format!("node/{}", k8s::NODE),
        "--profile=sysadmin",
        &format!("--image={TEST_IMAGE}"),
        "--",
        "sh",
        "-c",
        "echo debugged",
    ]);
    let debug_pod = out
        .split_whitespace()
        .find(|w| w.starts_with("node-debugger-"))
        .unwrap_or_else(|| panic!("no debug pod named in: {out}"))
        .to_string();
    let cid = n.wait_pod(&debug_pod, "succeeded", |p| {
        let st = p["status"]["containerStatuses"].as_array()?.first()?;
        (p["status"]["phase"] == "Succeeded").then(|| container_id(st))?
    });
    let line = decision_message(n, &cid).expect("devgate's held line for the debug pod");
    assert!(line.starts_with("devgate: warning: holds "), "{line}");
    n.delete_pod(&debug_pod);

    // All 8 GPUs allocated: the allocation names the cordoned one.
    let go = n.go_dir("priv-gpus");
    let app = privileged("app", run, &[], 8);
    n.apply(&pod("priv-gpus", "Never", &go, vec![app]));
    refused_on(n, "priv-gpus", &go, BAD);
    let go = n.go_dir("unpriv-gpus");
    let mut app = container("app", run, "File", false);
    app["resources"] = json!({"limits": {"nvidia.com/gpu": "8"}});
    n.apply(&pod("unpriv-gpus", "Never", &go, vec![app]));
    refused_on(n, "unpriv-gpus", &go, BAD);
    n.env.ok(&["uncordon", &format!("195:{BAD}")]);
}

/// What each faulted app does before it waits: write its GPU's name, then wait for the
/// test to cordon it and say go.
fn faulted(app: &str) -> String {
    format!(
        "{app}; ls /dev | grep '^nvidia[0-9]' > /go/dev.tmp; mv /go/dev.tmp /go/dev; \
         while [ ! -e /go/now ]; do sleep 0.1; done; exit 1"
    )
}

/// Waits for the app behind `go` to name its GPU, cordons that GPU, and lets the app exit.
fn fault_during_run(n: &K8sNode, go: &Path) -> u32 {
    wait_for("the app to name its GPU", || go.join("dev").exists());
    let dev = fs::read_to_string(go.join("dev")).unwrap();
    let minor: u32 = dev.trim().trim_start_matches("nvidia").parse().unwrap();
    n.env.ok(&[
        "cordon",
        &format!("195:{minor}"),
        "--reason",
        "xid 79 during run",
    ]);
    fs::write(go.join("now"), "").unwrap();
    minor
}

/// Six pods at once, each on its own GPU, each faulted during its run:
/// - restartPolicy Never, ~4 KB in the termination file: devgate's whole DeviceFault line
///   and the app's last line;
/// - restartPolicy Always: the restart is rejected and, once the pod settles in
///   CrashLoopBackOff, its status still names the DeviceFault;
/// - FallbackToLogsOnError: the app's last log line and devgate's line;
/// - a pod of 8 containers: devgate's line survives the status manager's share;
/// - FallbackToLogsOnError with a long log: kubelet keeps the log's end, devgate's line;
/// - File: devgate's line alone, the app's log untouched.
fn faults_during_runs_reach_the_pod_status(n: &mut K8sNode) {
    let big = "head -c 3990 /dev/zero | tr '\\0' x > /dev/termination-log; \
               echo ' app: CUDA error' >> /dev/termination-log";
    let log = "echo 'app: CUDA error: an illegal memory access was encountered'";
    // 80 lines of far more than kubelet's 2048 bytes: kubelet keeps their end.
    let chatty = "i=0; while [ $i -lt 100 ]; do echo \"app: step $i of a long and chatty \
                  training loop\"; i=$((i+1)); done";
    let cases = [
        ("never", "Never", "File", big),
        ("always", "Always", "File", "true"),
        ("fallback", "Never", "FallbackToLogsOnError", log),
        ("eight", "Never", "File", big),
        ("chatty", "Never", "FallbackToLogsOnError", chatty),
        ("file", "Never", "File", log),
    ];
    let mut gos = Vec::new();
    for (name, restart, policy, app) in cases {
        let go = n.go_dir(name);
        let mut containers = vec![container("app", &faulted(app), policy, true)];
        if name == "eight" {
            for i in 1..8 {
                containers.push(container(&format!("side{i}"), "sleep 3600", "File", false));
            }
        }
        n.apply(&pod(name, restart, &go, containers));
        gos.push(go);
    }
    let minors: Vec<u32> = gos.iter().map(|go| fault_during_run(n, go)).collect();

    // Never, a full termination file.
    let (cid, msg) = terminated(n, "never", "state");
    let line = exit_text(n, &cid).expect("an exit record");
    assert_eq!(line, fault_line(minors[0]));
    assert!(
        msg.contains(&line),
        "no whole fault line in:\n{msg}\n{line}"
    );
    assert!(msg.ends_with("x app: CUDA error\n"), "{msg}");

    // Always: the restart rejected; CrashLoopBackOff still names the fault.
    let last = n.wait_pod("always", "in CrashLoopBackOff", |p| {
        let st = status(p, "app")?;
        (st["state"]["waiting"]["reason"] == "CrashLoopBackOff")
            .then(|| {
                st["lastState"]["terminated"]["message"]
                    .as_str()
                    .map(str::to_string)
            })
            .flatten()
    });
    assert!(last.contains("devgate: rejected /dev/nvidia"), "{last}");
    assert!(
        last.contains(&format!("DeviceFault/Cordoned on /dev/nvidia{}", minors[1])),
        "{last}"
    );

    // FallbackToLogsOnError.
    let (cid, msg) = terminated(n, "fallback", "state");
    let line = exit_text(n, &cid).expect("an exit record");
    assert!(
        msg.contains("app: CUDA error: an illegal memory access was encountered\n"),
        "{msg}"
    );
    assert!(msg.contains(&line), "no fault line in:\n{msg}\n{line}");

    // 8 containers: 12288 / 8 bytes each, devgate's line first.
    let (cid, msg) = terminated(n, "eight", "state");
    let line = exit_text(n, &cid).expect("an exit record");
    assert!(msg.len() <= 12288 / 8, "{}", msg.len());
    assert!(
        msg.starts_with(&line),
        "devgate's line is not first in the share:\n{msg}"
    );

    // FallbackToLogsOnError, a log longer than kubelet reads: devgate's line is last.
    let (cid, msg) = terminated(n, "chatty", "state");
    let line = exit_text(n, &cid).expect("an exit record");
    assert!(msg.contains("app: step 99 of"), "{msg}");
    assert!(!msg.contains("app: step 20 of"), "{msg}");
    assert!(msg.ends_with(&format!("{line}\n")), "{msg}");

    // File: devgate's line alone; the app's log is left as it wrote it.
    let (cid, msg) = terminated(n, "file", "state");
    let line = exit_text(n, &cid).expect("an exit record");
    assert_eq!(msg, format!("{line}\n"));
    let logs = fs::read_dir(&n.pod_logs).unwrap().flatten();
    let dir = logs
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("default_file_")
        })
        .expect("the file pod's log dir");
    let log = fs::read_to_string(dir.join("app/0.log")).unwrap();
    assert!(!log.contains("devgate"), "{log}");

    uncordon_all(n);
    for (name, ..) in cases {
        n.delete_pod(name);
    }
}

fn fault_line(minor: u32) -> String {
    format!(
        "devgate: DeviceFault/Cordoned on /dev/nvidia{minor} ({}): cordoned by operator \
         during the run: \"xid 79 during run\"",
        fake_nvml::uuid(minor as usize)
    )
}

/// The container id and terminated message of container `app` of `pod`, once it
/// terminated and devgate's poststop wrote its exit record.
fn terminated(n: &mut K8sNode, pod: &str, which: &str) -> (String, String) {
    let (cid, msg) = n.wait_pod(pod, "terminated", |p| {
        let st = status(p, "app")?;
        let t = &st[which]["terminated"];
        Some((container_id(st)?, t["message"].as_str()?.to_string()))
    });
    let exits = n.env.dir.join(format!("state/exits/{cid}.json"));
    wait_for("devgate's exit record", || exits.exists());
    (cid, msg)
}

// ---- the cluster installer -----------------------------------------------------------

const INSTALLER_IMAGE: &str = "localhost/devgate:test";

/// packaging/kubernetes/daemonset.yaml on the real DaemonSet controller, with the image
/// built from packaging/kubernetes/Containerfile and the ConfigMap's config pointed at the
/// fake GPUs: the installer pod becomes Ready and devgate is on (an XID-79 pod is
/// rejected, a healthy one runs); a rerun changes nothing; deleting the DaemonSet leaves
/// devgate on; the documented uninstall gives config.toml back byte for byte and pods
/// start. Every pod's open-file limit is what it was before devgate.
#[test]
fn the_daemonset_installs_devgate_and_the_documented_uninstall_removes_it() {
    require_root!();
    let Some(_one) = k8s::one_node(CASES) else {
        return;
    };
    let release = k8s::releases().pop().unwrap();
    let n = K8sNode::start("k8s-installer", &release, Options::default());
    n.import_installer_image(INSTALLER_IMAGE);
    // The DaemonSet's pause container, under the name the manifest gives it.
    n.ctr_ok(&[
        "images",
        "tag",
        k8s::PAUSE_IMAGE,
        "registry.k8s.io/pause:3.9",
    ]);
    n.kubectl(&["label", "node", k8s::NODE, "nvidia.com/gpu.present=true"]);
    let config_toml = n.ns_path("/etc/containerd/config.toml");
    let before = fs::read(&config_toml).unwrap();
    let nofile_before = open_file_limit(&n, "nofile-before");

    // The agent's token volume names the CA ConfigMap that kube-controller-manager
    // publishes from its --root-ca-file, which this node's does not set.
    let ca = ["configmap", "kube-root-ca.crt", "-n", "kube-system"];
    if n.get_json(&[&["get"][..], &ca[..]].concat()).is_none() {
        n.kubectl_out(
            &[
                &["create"][..],
                &ca[..],
                &["--from-literal=ca.crt=none"][..],
            ]
            .concat(),
        );
    }
    let objects = installer_objects(&n, &["--enable", "--restart"]);
    for o in &objects {
        n.apply(o);
    }
    let first = installer_ready(&n, None);
    assert_eq!(n.restarts.get(), 1, "containerd restarts");
    let installed = fs::read(&config_toml).unwrap();
    assert_ne!(
        installed, before,
        "config.toml does not name devgate's spec"
    );
    doctor_passes_every_runtime(&n);
    devgate_rejects_an_xid_79(&n, "installed");
    assert_eq!(open_file_limit(&n, "nofile-installed"), nofile_before);

    // A rerun (the pod made anew) changes nothing and restarts nothing.
    n.kubectl(&["-n", "kube-system", "delete", "pod", &first, "--wait=true"]);
    installer_ready(&n, Some(&first));
    assert_eq!(
        fs::read(&config_toml).unwrap(),
        installed,
        "a rerun changed config.toml"
    );
    assert_eq!(n.restarts.get(), 1, "a rerun restarted containerd");

    // Deleting the DaemonSet first leaves devgate on, and the node starts pods.
    n.kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "daemonset",
        "devgate-installer",
        "--wait=true",
    ]);
    devgate_rejects_an_xid_79(&n, "after-delete");
    assert_eq!(open_file_limit(&n, "nofile-after-delete"), nofile_before);

    // The documented removal: the init container's args are uninstall-host's.
    let uninstall = installer_objects(&n, &[]);
    for o in &uninstall {
        n.apply(o);
    }
    installer_ready(&n, None);
    assert_eq!(n.restarts.get(), 2, "containerd restarts");
    assert_eq!(
        String::from_utf8_lossy(&fs::read(&config_toml).unwrap()),
        String::from_utf8_lossy(&before),
        "config.toml is not as it was"
    );
    // devgate is off: XID 79 on every GPU no longer stops a start.
    set_xid_79_everywhere(&n);
    assert_eq!(open_file_limit(&n, "nofile-removed"), nofile_before);
    assert!(
        !n.ns_path("/usr/local/bin/devgate").exists(),
        "the programs stayed"
    );
}

/// `devgate doctor` on the node, as its operator runs it after the DaemonSet: ✓ on every
/// runtime the node has and on kubelet's directories.
fn doctor_passes_every_runtime(n: &K8sNode) {
    let out = output_of(n.command(Path::new("/usr/local/bin/devgate")).arg("doctor"));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("devgate doctor on the node:\n{said}");
    let failed: Vec<&str> = said
        .lines()
        .filter(|l| {
            ["✗ podman", "✗ cri-o", "✗ containerd", "✗ kubelet_"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    assert!(failed.is_empty(), "{failed:#?}\n{said}");
    assert!(
        said.lines().any(|l| l.starts_with("✓ containerd")),
        "{said}"
    );
    for check in [
        "✓ kubelet_pods_dir",
        "✓ kubelet_pod_logs_dir",
        "✓ containerd annotations",
    ] {
        assert!(
            said.lines().any(|l| l.starts_with(check)),
            "{check}: {said}"
        );
    }
}

/// The manifest's objects, with the image built here, the ConfigMap's config pointed at
/// the fake GPUs, and the init container's args: install-host's plus `install` where
/// given, else the uninstall docs/install.md gives.
fn installer_objects(n: &K8sNode, install: &[&str]) -> Vec<Value> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut objects = n.manifest(&repo.join("packaging/kubernetes/daemonset.yaml"));
    // The node's GPUs and kubelet's directories, beside the ConfigMap's own settings.
    let ours: Value = serde_json::from_slice(&fs::read(&n.env.config).unwrap()).unwrap();
    for o in &mut objects {
        match o["kind"].as_str() {
            Some("ConfigMap") => {
                let text = o["data"]["config.json"].as_str().unwrap();
                let mut config: Value = serde_json::from_str(text).unwrap();
                for key in [
                    "dev_root",
                    "nvml_library",
                    "kmsg_path",
                    "kubelet_pods_dir",
                    "kubelet_pod_logs_dir",
                ] {
                    config[key] = ours[key].clone();
                }
                o["data"]["config.json"] = json!(config.to_string());
            }
            Some("DaemonSet") => {
                // The agent (docs/cluster.md) runs from the same image; here it finds no
                // API server through the kubernetes Service and says so, which this test
                // does not look at.
                let agent = &mut o["spec"]["template"]["spec"]["containers"][0];
                assert_eq!(agent["image"], "REGISTRY/devgate:0.1.0");
                agent["image"] = json!(INSTALLER_IMAGE);
                let init = &mut o["spec"]["template"]["spec"]["initContainers"][0];
                assert_eq!(init["image"], "REGISTRY/devgate:0.1.0");
                init["image"] = json!(INSTALLER_IMAGE);
                if install.is_empty() {
                    init["args"] = json!([
                        "uninstall-host",
                        "--root",
                        "/host",
                        "--prefix",
                        "/usr/local",
                        "--restart",
                        "--programs"
                    ]);
                } else {
                    let args: Vec<&str> = init["args"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|a| a.as_str().unwrap())
                        .collect();
                    assert!(args.ends_with(install), "{args:?}");
                }
            }
            _ => {}
        }
    }
    objects
}

/// The last lines the installer's init containers wrote, from kubelet's pod logs.
fn installer_log(n: &K8sNode) -> String {
    let mut logs = Vec::new();
    for pod in fs::read_dir(&n.pod_logs).into_iter().flatten().flatten() {
        let name = pod.file_name().to_string_lossy().into_owned();
        if !name.starts_with("kube-system_devgate-installer-") {
            continue;
        }
        for f in fs::read_dir(pod.path().join("install"))
            .into_iter()
            .flatten()
            .flatten()
        {
            logs.push(f.path());
        }
    }
    logs.sort_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok());
    logs.iter()
        .rev()
        .take(2)
        .map(|p| format!("{}:\n{}", p.display(), k8s::tail(p, 15)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the DaemonSet's pod (other than `not`) is Ready; returns its name. On the
/// deadline, fails with what the installer said.
fn installer_ready(n: &K8sNode, not: Option<&str>) -> String {
    let end = std::time::Instant::now() + k8s::STEP_DEADLINE;
    loop {
        n.serve_systemd();
        let pods = n.get_json(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=devgate",
        ]);
        let ready = pods.as_ref().and_then(|p| {
            p["items"].as_array()?.iter().find_map(|pod| {
                let name = pod["metadata"]["name"].as_str()?;
                let ok = Some(name) != not
                    && pod["metadata"]["deletionTimestamp"].is_null()
                    && pod["status"]["conditions"]
                        .as_array()?
                        .iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True");
                ok.then(|| name.to_string())
            })
        });
        if let Some(name) = ready {
            return name;
        }
        if std::time::Instant::now() > end {
            panic!(
                "the installer pod is not Ready: {pods:#?}\ninstaller:\n{}\nkubelet:\n{}",
                installer_log(n),
                k8s::tail(&n.dir.join("kubelet.log"), 30)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

fn set_xid_79_everywhere(n: &K8sNode) {
    n.set_nvml(&every_gpu(
        json!({"recovery_action": fake_nvml::recovery::NODE_REBOOT}),
    ));
    let records: Vec<String> = (0..8).map(xid_79).collect();
    let refs: Vec<&str> = records.iter().map(String::as_str).collect();
    fs::write(&n.gpus.kmsg, fake_nvml::kmsg_records(&refs)).unwrap();
}

fn clear_xids(n: &K8sNode) {
    n.set_nvml(&every_gpu(json!({})));
    let mut records: Vec<String> = (0..8).map(xid_79).collect();
    records.push(DRIVER_LOAD.to_string());
    let refs: Vec<&str> = records.iter().map(String::as_str).collect();
    fs::write(&n.gpus.kmsg, fake_nvml::kmsg_records(&refs)).unwrap();
}

/// With XID 79 on every GPU a GPU pod is rejected by devgate; once the driver reloads, a
/// GPU pod runs.
fn devgate_rejects_an_xid_79(n: &K8sNode, tag: &str) {
    set_xid_79_everywhere(n);
    let name = format!("xid-{tag}");
    let go = n.go_dir(&name);
    n.apply(&pod(
        &name,
        "Always",
        &go,
        vec![container("app", "echo started > /go/started", "File", true)],
    ));
    n.wait_pod(&name, "rejected by devgate", |p| {
        let st = status(p, "app")?;
        let msg = st["lastState"]["terminated"]["message"].as_str()?;
        msg.contains("devgate: rejected /dev/nvidia").then_some(())
    });
    assert!(!go.join("started").exists());
    n.delete_pod(&name);
    clear_xids(n);
}

/// The open-file limits (soft and hard) a GPU pod's app sees, once it ran.
fn open_file_limit(n: &K8sNode, name: &str) -> String {
    let go = n.go_dir(name);
    n.apply(&pod(
        name,
        "Never",
        &go,
        vec![container(
            "app",
            "echo \"$(ulimit -n) $(ulimit -Hn)\" > /go/nofile.tmp; mv /go/nofile.tmp /go/nofile",
            "File",
            true,
        )],
    ));
    n.wait_pod(name, "succeeded", |p| {
        (p["status"]["phase"] == "Succeeded").then_some(())
    });
    n.delete_pod(name);
    fs::read_to_string(go.join("nofile")).unwrap()
}
