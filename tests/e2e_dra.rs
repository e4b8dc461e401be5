//! The fake GPUs through DRA on the real node (tests/common/k8s.rs): a DRA driver
//! publishes them as NVIDIA's does (driver and DeviceClass `gpu.nvidia.com`, one pool named
//! after the node, devices `gpu-<minor>` with `uuid` and `resource.kubernetes.io/pciBusID`),
//! and claims are prepared with CDI. On both releases (1.36 with the device-taint gates
//! on, 1.37 by default) it shows:
//! - a pod's claim for one GPU is allocated, the pod runs, and devgate judges its
//!   /dev/nvidiaN (where containerd reads CDI: 1.7 and later);
//! - what the scheduler does with an operator's NoSchedule DeviceTaintRule on gpu-k: the
//!   issue measured a 1.36 tree's scheduler ignoring rules, so each release's behavior is
//!   printed and asserted as measured (`HONORS_RULES`);
//! - a claim that tolerates the taint is allocated gpu-k.
//!
//! Groundwork for issue 30 (devgate's verdicts as DeviceTaintRules, and rules as a
//! quarantine input).

mod common;
use common::fake_nvml;
use common::k8s::{self, K8sNode, Options, DRA_DRIVER, NODE};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;
use std::time::Instant;

/// What each release's kube-scheduler was measured to do with a NoSchedule DeviceTaintRule
/// (true: it allocates no tainted device to a claim that does not tolerate it). A release
/// whose scheduler changes fails the test, which says what it saw.
const HONORS_RULES: &[(&str, bool)] = &[("v1.36", true), ("v1.37", true)];

/// The GPU the operator taints: among the first six, so that a scheduler that ignores the
/// rule gives it to one of six pods (the allocator fills a slice's devices in order).
const TAINTED: usize = 2;

/// The pods that ask for a GPU while the rule is there, all holding theirs at once.
const PODS: usize = 6;

const TAINT_KEY: &str = "devgate.test/operator";

/// What a host without pod sandboxes skips.
const CASES: &str = "DRA cases (a claim's GPU judged, DeviceTaintRule NoSchedule, a \
                     tolerating claim)";

#[test]
fn dra_v1_37_claims_and_device_taint_rules() {
    require_root!();
    k8s::on_release("v1.37", CASES, run_cases);
}

#[test]
fn dra_v1_36_claims_and_device_taint_rules() {
    require_root!();
    k8s::on_release("v1.36", CASES, run_cases);
}

fn run_cases(release: &str) {
    let tag = format!("dra-{}", release.replace('.', ""));
    let opts = Options {
        devgate_by_hand: true,
        dra_driver: true,
        ..Options::default()
    };
    let n = K8sNode::start(&tag, release, opts);
    eprintln!(
        "{release}: the DRA driver's ResourceSlice:\n{}",
        n.kubectl(&["get", "resourceslices", "-o", "yaml"])
    );
    published_as_nvidias_driver_does(&n);
    n.apply(&k8s::one_gpu_template());
    a_claims_gpu_is_judged_by_devgate(&n);
    let rule = device_taint_rule_kind(&n);
    operator_taints_the_gpu(&n, &rule);
    let honors = scheduler_and_the_rule(&n);
    let holders = new_claims_and_the_tainted_gpu(&n, honors);
    a_tolerating_claim_gets_the_tainted_gpu(&n);
    for p in holders {
        n.delete_pod(&p);
    }
}

// ---- objects -------------------------------------------------------------------------

/// A pod whose one container runs `script` with the go dir mounted and the claim `gpu`:
/// from the template `one-gpu`, or the ResourceClaim `claim`.
fn pod(name: &str, go: &Path, script: &str, claim: Option<&str>) -> Value {
    let source = match claim {
        Some(c) => json!({"name": "gpu", "resourceClaimName": c}),
        None => json!({"name": "gpu", "resourceClaimTemplateName": "one-gpu"}),
    };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "hostNetwork": true,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "go", "hostPath": {"path": go, "type": "Directory"}}],
            "resourceClaims": [source],
            "containers": [{
                "name": "app",
                "image": TEST_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "go", "mountPath": "/go"}],
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        }
    })
}

/// What each app writes before it goes on: its /dev/nvidia* and NVIDIA_VISIBLE_DEVICES.
const SAY: &str =
    "{ ls /dev | grep '^nvidia[0-9]' || true; echo \"visible=$NVIDIA_VISIBLE_DEVICES\"; } \
                   > /go/said.tmp; mv /go/said.tmp /go/said";

fn container_id(pod: &Value) -> Option<String> {
    pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()?
        .split_once("://")
        .map(|(_, id)| id.to_string())
}

/// Waits for pod `name`'s app to have written what it sees; returns its container's id.
fn wait_said(n: &K8sNode, name: &str, go: &Path) -> String {
    n.wait_pod(name, "started, its app having said what it sees", |p| {
        let id = container_id(p)?;
        go.join("said").exists().then_some(id)
    })
}

/// Where containerd reads CDI, the app saw exactly GPU `minor` and its UUID, and devgate's
/// decision for container `cid` judged /dev/nvidia<minor>; where it does not (containerd
/// 1.6), the claim's device never reaches the container: said, and asserted as such.
fn judged(n: &K8sNode, name: &str, go: &Path, cid: &str, minor: usize) {
    let said = fs::read_to_string(go.join("said")).unwrap();
    // devgate logs a decision for a container with a device to judge, none for the rest.
    let decision = n
        .env
        .log_lines()
        .into_iter()
        .find(|d| d["container_id"] == cid && d["stage"] == "prestart")
        .unwrap_or(Value::Null);
    let paths: Vec<&str> = decision["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["device"]["container_path"].as_str())
        .collect();
    if n.cdi {
        assert!(
            decision.is_object(),
            "no decision of devgate's for {name} ({cid})"
        );
        assert_eq!(
            said,
            format!("nvidia{minor}\nvisible={}\n", fake_nvml::uuid(minor)),
            "{name}"
        );
        assert_eq!(paths, [format!("/dev/nvidia{minor}")], "{decision}");
        assert_eq!(decision["action"], "allow", "{decision}");
        eprintln!(
            "{}: {name}: gpu-{minor} injected by CDI; devgate judged /dev/nvidia{minor}: {}",
            n.release, decision["action"]
        );
    } else {
        eprintln!(
            "{}: {name}: containerd {} reads no CDI spec (1.7 and later do), so the claim's \
             gpu-{minor} is allocated and prepared but not in the container, and devgate \
             judges no GPU in it (the forky stack's containerd 2.x shows the judgement)",
            n.release,
            n.kubectl(&[
                "get",
                "node",
                NODE,
                "-o",
                "jsonpath={.status.nodeInfo.containerRuntimeVersion}"
            ]),
        );
        assert_eq!(said, "visible=\n", "{name}");
        assert!(paths.is_empty(), "{decision}");
    }
}

// ---- the cases -----------------------------------------------------------------------

/// One ResourceSlice of the node's pool, its devices gpu-<minor> with the fake GPUs' UUIDs
/// and PCI bus ids.
fn published_as_nvidias_driver_does(n: &K8sNode) {
    let list = n.get_json(&["get", "resourceslices"]).unwrap();
    let slices: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["spec"]["driver"] == DRA_DRIVER)
        .collect();
    assert_eq!(slices.len(), 1, "{list}");
    let spec = &slices[0]["spec"];
    assert_eq!(spec["pool"]["name"], NODE);
    assert_eq!(spec["nodeName"], NODE);
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["name"], format!("gpu-{i}"));
        assert_eq!(d["attributes"]["uuid"]["string"], fake_nvml::uuid(i), "{d}");
        assert_eq!(
            d["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
            fake_nvml::bus(i),
            "{d}"
        );
    }
}

/// A pod with a claim from the template gets one GPU, runs, and devgate judged its device.
fn a_claims_gpu_is_judged_by_devgate(n: &K8sNode) {
    let go = n.go_dir("claim");
    n.apply(&pod("claim", &go, &format!("{SAY}; sleep 3600"), None));
    let cid = wait_said(n, "claim", &go);
    let device = n.allocated("claim").expect("an allocated claim");
    let minor: usize = device.strip_prefix("gpu-").unwrap().parse().unwrap();
    judged(n, "claim", &go, &cid, minor);
    n.delete_pod("claim");
    // The template's claim goes with its pod, and its GPU is free again.
    n.wait_pod_gone_claims();
}

/// The DeviceTaintRule's apiVersion this release serves (`kubectl api-resources`).
fn device_taint_rule_kind(n: &K8sNode) -> String {
    let version = n.device_taint_rule_api();
    eprintln!("{}: DeviceTaintRule is {version}", n.release);
    version
}

/// An operator's NoSchedule DeviceTaintRule on gpu-TAINTED (driver, pool, device).
fn operator_taints_the_gpu(n: &K8sNode, api_version: &str) {
    n.apply(&json!({
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {"name": "operator-gpu"},
        "spec": {
            "deviceSelector": {"driver": DRA_DRIVER, "pool": NODE, "device": format!("gpu-{TAINTED}")},
            "taint": {"key": TAINT_KEY, "value": "maintenance", "effect": "NoSchedule"},
        },
    }));
    n.kubectl(&["get", "devicetaintrules", "operator-gpu"]);
}

/// What this release's scheduler does with the rule, from a claim for gpu-TAINTED (by its
/// `uuid` attribute) that does not tolerate it: its pod Unschedulable (the rule honored),
/// or gpu-TAINTED allocated (ignored). Printed, and asserted against HONORS_RULES.
fn scheduler_and_the_rule(n: &K8sNode) -> bool {
    // The scheduler learns of the rule through its informer and shows no sign of having
    // it: a claim allocated gpu-TAINTED may have been judged before the rule arrived, so
    // it is asked again until the node's deadline; only then is the rule taken as ignored.
    let end = Instant::now() + k8s::STEP_DEADLINE;
    let go = n.go_dir("untolerating");
    let seen = loop {
        n.apply(&tainted_gpu_claim("untolerating", false));
        n.apply(&pod("untolerating", &go, SAY, Some("untolerating")));
        let seen = n.wait_pod("untolerating", "Unschedulable or allocated", |p| {
            if let Some(device) = n.claim_device("untolerating") {
                return Some(Err(device));
            }
            p["status"]["conditions"].as_array()?.iter().find_map(|c| {
                (c["type"] == "PodScheduled" && c["reason"] == "Unschedulable")
                    .then(|| Ok(c["message"].as_str().unwrap_or("").to_string()))
            })
        });
        if seen.is_ok() || Instant::now() > end {
            break seen;
        }
        n.delete_pod("untolerating");
        n.kubectl(&["delete", "resourceclaim", "untolerating", "--wait=true"]);
        let _ = fs::remove_file(go.join("said"));
    };
    let honors = match &seen {
        Ok(why) => {
            eprintln!(
                "{}: kube-scheduler honors the NoSchedule DeviceTaintRule: a claim for \
                 gpu-{TAINTED} without the toleration is Unschedulable: {why}",
                n.release
            );
            assert!(!go.join("said").exists());
            true
        }
        Err(device) => {
            eprintln!(
                "{}: kube-scheduler IGNORES the NoSchedule DeviceTaintRule: a claim for \
                 gpu-{TAINTED} without the toleration was allocated {device}",
                n.release
            );
            assert_eq!(*device, format!("gpu-{TAINTED}"));
            false
        }
    };
    n.delete_pod("untolerating");
    n.kubectl(&["delete", "resourceclaim", "untolerating", "--wait=true"]);
    let expected = HONORS_RULES
        .iter()
        .find(|(r, _)| *r == n.release)
        .map(|(_, h)| *h)
        .unwrap_or_else(|| panic!("{}: not in HONORS_RULES", n.release));
    assert_eq!(
        honors,
        expected,
        "{}: kube-scheduler {} the NoSchedule rule, not as measured before (HONORS_RULES)",
        n.release,
        if honors { "honors" } else { "ignores" }
    );
    honors
}

/// PODS pods ask for any GPU at once and hold it: where the scheduler honors the rule, none
/// is allocated gpu-TAINTED; where it ignores it, one is (the allocator fills devices in
/// order). Returns the pods.
fn new_claims_and_the_tainted_gpu(n: &K8sNode, honors: bool) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..PODS {
        let name = format!("held-{i}");
        let go = n.go_dir(&name);
        n.apply(&pod(&name, &go, &format!("{SAY}; sleep 3600"), None));
        names.push((name, go));
    }
    let mut devices = Vec::new();
    for (name, go) in &names {
        let cid = wait_said(n, name, go);
        let device = n.allocated(name).expect("an allocated claim");
        let minor: usize = device.strip_prefix("gpu-").unwrap().parse().unwrap();
        judged(n, name, go, &cid, minor);
        devices.push(device);
    }
    let mut distinct = devices.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), PODS, "two pods share a GPU: {devices:?}");
    let tainted = format!("gpu-{TAINTED}");
    let on_tainted = devices.iter().filter(|d| **d == tainted).count();
    eprintln!(
        "{}: {PODS} new claims got {devices:?}: {on_tainted} on the tainted {tainted}",
        n.release
    );
    assert_eq!(on_tainted, usize::from(!honors), "{devices:?}");
    // The tolerating claim comes next and needs the tainted GPU free.
    let mut held = Vec::new();
    for ((name, _), device) in names.into_iter().zip(&devices) {
        if *device == tainted {
            n.delete_pod(&name);
        } else {
            held.push(name);
        }
    }
    held
}

/// A ResourceClaim `name` for gpu-TAINTED, selected by its `uuid` attribute, its request
/// tolerating the operator's taint where `tolerate`.
fn tainted_gpu_claim(name: &str, tolerate: bool) -> Value {
    let tolerations = json!([{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]);
    k8s::gpu_claim(name, TAINTED, tolerate.then_some(tolerations))
}

/// A claim whose request tolerates the operator's taint, selecting gpu-TAINTED by its
/// `uuid` attribute, is allocated it, and its pod runs there.
fn a_tolerating_claim_gets_the_tainted_gpu(n: &K8sNode) {
    n.apply(&tainted_gpu_claim("tolerates", true));
    let go = n.go_dir("tolerates");
    n.apply(&pod("tolerates", &go, SAY, Some("tolerates")));
    let cid = wait_said(n, "tolerates", &go);
    let device = n.claim_device("tolerates").expect("an allocated claim");
    assert_eq!(device, format!("gpu-{TAINTED}"));
    judged(n, "tolerates", &go, &cid, TAINTED);
    eprintln!(
        "{}: a claim tolerating {TAINT_KEY}:NoSchedule was allocated gpu-{TAINTED}",
        n.release
    );
    n.delete_pod("tolerates");
}
