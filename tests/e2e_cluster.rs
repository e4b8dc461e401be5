//! devgate in the cluster (docs/cluster.md), on the real node (tests/common/k8s.rs) under
//! Node,RBAC authorization, with the fake DRA driver publishing the fake GPUs as NVIDIA's
//! does. devgate-agent runs as the ServiceAccount of packaging/kubernetes/daemonset.yaml,
//! with only the rights its ClusterRole grants. On 1.37 and on 1.36 (gates on) it shows:
//! - outward: a cordoned GPU gets a DeviceTaintRule selecting exactly its DRA device; with
//!   NoExecute the pod running on it is evicted; a restarted agent keeps the one rule;
//!   none of 21 new claims is allocated the GPU; the node condition names it, and an
//!   Event says so; `devgate uncordon` deletes the rule and the GPU is allocated again;
//! - inward: an operator's NoSchedule rule on the GPU a running pod holds makes devgate
//!   reject that pod's next start, naming the taint and the rule; a pod whose claim
//!   tolerates the taint starts; devgate publishes no rule of its own for it;
//! - an operator's NoExecute rule with the empty selector `{}` evicts a pod on the real
//!   node, and the gate's file names every GPU, so the restart is refused on any of them;
//! - the API server away: containers still start and are still gated; the agent says the
//!   API is down; once it is back, the rule for a GPU cordoned meanwhile appears.
//!
//! How long each publish took is printed, never asserted (the node's deadline bounds it).

mod common;
use common::k8s::{self, K8sNode, Options, DRA_DRIVER, NODE};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CASES: &str = "devgate-agent cases (DeviceTaintRules out and in, the node condition, \
                     the API server away)";
/// The GPU devgate judges bad (cordoned).
const K: usize = 3;
/// The GPU cordoned while the API server is away.
const M: usize = 6;
const OPERATOR_KEY: &str = "devgate.test/operator";
const OUR_KEY: &str = "devgate.io/unhealthy";
const MANAGED: &str = "app.kubernetes.io/managed-by=devgate-agent";

#[test]
fn agent_v1_37_verdicts_out_taints_in() {
    require_root!();
    k8s::on_release("v1.37", CASES, run_cases);
}

#[test]
fn agent_v1_36_verdicts_out_taints_in() {
    require_root!();
    k8s::on_release("v1.36", CASES, run_cases);
}

fn run_cases(release: &str) {
    let tag = format!("agent-{}", release.replace('.', ""));
    let opts = Options {
        devgate_by_hand: true,
        dra_driver: true,
        rbac: true,
    };
    let n = K8sNode::start(&tag, release, opts);
    n.apply(&k8s::one_gpu_template());
    let kc = agent_identity(&n);
    start_agent(&n, &kc, &["--effect", "NoExecute"]);
    wait_for(&n, "the condition DevgateDeviceFault False", || {
        (condition(&n)?.0 == "False").then_some(())
    });
    cordon_evicts_and_keeps_new_claims_off(&n, &kc);
    uncordon_deletes_the_rule(&n);
    operators_rule_rejects_a_restart_and_tolerating_claims_start(&n);
    an_empty_selector_evicts_and_the_gate_refuses_every_gpu(&n);
    the_gate_goes_on_without_the_api_server(&n);
}

/// A node with the classic device plugin only (no DRA driver): the condition and Events
/// appear, no DeviceTaintRule, and the node taint (`--node-taint`) only once no healthy
/// GPU is left.
#[test]
fn agent_v1_37_node_without_dra() {
    require_root!();
    let Some(_one) = k8s::one_node(CASES) else {
        return;
    };
    let opts = Options {
        devgate_by_hand: true,
        rbac: true,
        ..Options::default()
    };
    let n = K8sNode::start("agent-nodra", &k8s::release_named("v1.37"), opts);
    let kc = agent_identity(&n);
    // What the chart's agent.nodeTaint adds to the ClusterRole.
    n.apply(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "devgate-agent-node-taint"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}],
    }));
    n.apply(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "devgate-agent-node-taint"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "devgate-agent-node-taint"},
        "subjects": [{"kind": "ServiceAccount", "name": "devgate-agent", "namespace": "kube-system"}],
    }));
    let taints = || {
        n.get_json(&["get", "node", NODE])
            .map(|o| o["spec"]["taints"].clone())
    };
    let before = taints().unwrap();
    start_agent(&n, &kc, &["--node-taint"]);
    wait_for(&n, "the condition False", || {
        (condition(&n)?.0 == "False").then_some(())
    });
    n.env.ok(&["cordon", "195:2", "--reason", "fan failed"]);
    let (message, took) = wait_for(&n, "the condition True", || {
        let (status, message) = condition(&n)?;
        (status == "True").then_some(message)
    });
    eprintln!(
        "{}: without DRA, the condition {took:?} after the cordon: {message}",
        n.release
    );
    assert!(
        message.contains("nvidia2") && message.contains("fan failed"),
        "{message}"
    );
    let events = node_events(&n, "DeviceUnhealthy");
    assert!(events.iter().any(|e| e.contains("nvidia2")), "{events:?}");
    assert!(our_rules(&n).is_empty());
    assert_eq!(
        taints(),
        Some(before.clone()),
        "a healthy GPU is left: no node taint"
    );
    for i in 0..8 {
        n.env
            .ok(&["cordon", &format!("195:{i}"), "--reason", "fan failed"]);
    }
    let (tainted, took) = wait_for(&n, "the node taint", || {
        let t = taints()?;
        t.as_array()?
            .iter()
            .any(|t| {
                t["key"] == OUR_KEY && t["value"] == "no-healthy-gpu" && t["effect"] == "NoSchedule"
            })
            .then_some(t)
    });
    eprintln!(
        "{}: no healthy GPU left: node taints {tainted} ({took:?})",
        n.release
    );
    for i in 0..8 {
        n.env.ok(&["uncordon", &format!("195:{i}")]);
    }
    wait_for(&n, "the condition False again", || {
        (condition(&n)?.0 == "False").then_some(())
    });
    wait_for(&n, "the node taint gone", || {
        (taints()? == before).then_some(())
    });
    assert!(our_rules(&n).is_empty());
}

// ---- the agent -----------------------------------------------------------------------

fn agent_bin() -> PathBuf {
    let p = devgate_bin().with_file_name("devgate-agent");
    assert!(
        p.exists(),
        "{} is missing: `cargo build -p devgate-agent` (make test builds it)",
        p.display()
    );
    p
}

/// The shipped RBAC objects applied, and a kubeconfig holding a token of the agent's
/// ServiceAccount: the agent has exactly the rights the manifest grants.
fn agent_identity(n: &K8sNode) -> PathBuf {
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/kubernetes/daemonset.yaml");
    let mut namespace = String::new();
    for o in n.manifest(&manifest) {
        let kind = o["kind"].as_str().unwrap_or("");
        let rbac = [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ];
        if rbac.contains(&kind) {
            if kind == "ServiceAccount" {
                namespace = o["metadata"]["namespace"].as_str().unwrap().to_string();
            }
            n.apply(&o);
        }
    }
    let token = n.kubectl(&[
        "create",
        "token",
        "devgate-agent",
        "-n",
        &namespace,
        "--duration=2h",
    ]);
    let kc = n.dir.join("agent.kubeconfig");
    fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
             https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\nusers:\n- name: a\n  \
             user:\n    token: {}\ncontexts:\n- name: a\n  context:\n    cluster: c\n    user: \
             a\ncurrent-context: a\n",
            token.trim()
        ),
    )
    .unwrap();
    kc
}

fn start_agent(n: &K8sNode, kc: &Path, extra: &[&str]) {
    let args: Vec<String> = [
        "--node-name",
        NODE,
        "--kubeconfig",
        kc.to_str().unwrap(),
        "--devgate",
        devgate_bin().to_str().unwrap(),
        "--devgate-config",
        n.env.config.to_str().unwrap(),
        "--interval",
        "2",
        "--resync",
        "5",
        "--metrics-address",
        "127.0.0.1:9478",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    n.spawn("devgate-agent", &agent_bin(), &args);
}

fn state_dir(n: &K8sNode) -> PathBuf {
    n.env.dir.join("state")
}

fn agent_status(n: &K8sNode) -> Option<Value> {
    serde_json::from_slice(&fs::read(state_dir(n).join("agent-status.json")).ok()?).ok()
}

fn cluster_taints(n: &K8sNode) -> Value {
    fs::read(state_dir(n).join("cluster-taints.json"))
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or(json!({"taints": []}))
}

// ---- what the cluster shows ----------------------------------------------------------

/// Waits for `check`, up to the node's step deadline; returns its value and how long.
fn wait_for<T>(n: &K8sNode, what: &str, mut check: impl FnMut() -> Option<T>) -> (T, Duration) {
    let start = Instant::now();
    loop {
        n.serve_systemd();
        if let Some(v) = check() {
            return (v, start.elapsed());
        }
        assert!(
            start.elapsed() < k8s::STEP_DEADLINE,
            "no {what} within {:?}; the agent's last lines:\n{}",
            k8s::STEP_DEADLINE,
            k8s::tail(&n.dir.join("devgate-agent.log"), 40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// This agent's DeviceTaintRules.
fn our_rules(n: &K8sNode) -> Vec<Value> {
    n.get_json(&["get", &n.device_taint_rules(), "-l", MANAGED])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
}

fn selects(rule: &Value, minor: usize) -> bool {
    let s = &rule["spec"]["deviceSelector"];
    s["driver"] == DRA_DRIVER && s["pool"] == NODE && s["device"] == format!("gpu-{minor}")
}

/// The node condition DevgateDeviceFault: (status, message).
fn condition(n: &K8sNode) -> Option<(String, String)> {
    let node = n.get_json(&["get", "node", NODE])?;
    let c = node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "DevgateDeviceFault")?
        .clone();
    Some((
        c["status"].as_str()?.to_string(),
        c["message"].as_str().unwrap_or("").to_string(),
    ))
}

/// The node's Events of `reason`, their messages.
fn node_events(n: &K8sNode, reason: &str) -> Vec<String> {
    let sel = format!("involvedObject.kind=Node,reason={reason}");
    n.get_json(&["get", "events", "-A", "--field-selector", &sel])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .collect()
}

// ---- objects -------------------------------------------------------------------------

/// A pod of one container running `script` with the go dir; its GPU from the claim
/// `claim`, the template (`Some("")`), or the device plugin (None).
fn pod(name: &str, go: &Path, script: &str, restart: &str, claim: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "hostNetwork": true,
            "restartPolicy": restart,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "go", "hostPath": {"path": go, "type": "Directory"}}],
            "containers": [{
                "name": "app",
                "image": TEST_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "go", "mountPath": "/go"}],
            }],
        }
    });
    let c = &mut p["spec"]["containers"][0];
    match claim {
        None => c["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}}),
        Some(claim) => {
            c["resources"] = json!({"claims": [{"name": "gpu"}]});
            p["spec"]["resourceClaims"] = if claim.is_empty() {
                json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}])
            } else {
                json!([{"name": "gpu", "resourceClaimName": claim}])
            };
        }
    }
    p
}

const SAY: &str =
    "{ ls /dev | grep '^nvidia[0-9]' || true; } > /go/said.tmp; mv /go/said.tmp /go/said";

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
}

// ---- the cases -----------------------------------------------------------------------

/// gpu-K runs a pod; `devgate cordon` judges it bad. The agent (NoExecute) publishes a
/// rule selecting exactly gpu-K, the pod is evicted, the condition and an Event name it.
/// Restarted with the default NoSchedule, the agent keeps one rule, now NoSchedule, and
/// 21 new claims never get gpu-K.
fn cordon_evicts_and_keeps_new_claims_off(n: &K8sNode, kc: &Path) {
    let go = n.go_dir("victim");
    n.apply(&k8s::gpu_claim("victim", K, None));
    n.apply(&pod(
        "victim",
        &go,
        &format!("{SAY}; sleep 3600"),
        "Never",
        Some("victim"),
    ));
    n.wait_pod("victim", "running on gpu-K", |p| running(p).then_some(()));
    let uid = n.pod("victim")["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();

    n.env
        .ok(&["cordon", &format!("195:{K}"), "--reason", "fan failed"]);
    let (rule, took) = wait_for(n, "a DeviceTaintRule for gpu-K", || {
        our_rules(n).into_iter().find(|r| selects(r, K))
    });
    eprintln!(
        "{}: the rule for gpu-{K} was there {took:?} after the cordon",
        n.release
    );
    assert_eq!(our_rules(n).len(), 1, "{:?}", our_rules(n));
    let taint = &rule["spec"]["taint"];
    assert_eq!(taint["key"], OUR_KEY, "{rule}");
    assert_eq!(taint["effect"], "NoExecute", "{rule}");
    assert_eq!(taint["value"], "quarantined", "{rule}");
    let ann = &rule["metadata"]["annotations"];
    assert_eq!(ann["devgate.io/node"], NODE, "{rule}");
    assert!(
        ann["devgate.io/reason"]
            .as_str()
            .unwrap()
            .contains("fan failed"),
        "{rule}"
    );
    // devgate's own rule is not read back into the gate.
    assert_eq!(cluster_taints(n)["taints"], json!([]));

    let (_, took) = wait_for(n, "the pod on gpu-K evicted", || {
        let p = n.get_json(&["get", "pod", "victim"]);
        let gone = p
            .as_ref()
            .map_or(true, |p| p["metadata"]["uid"] != uid.as_str());
        let target = p.as_ref().is_some_and(|p| {
            p["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "DisruptionTarget"))
        });
        (gone || target).then_some(())
    });
    eprintln!(
        "{}: the pod on gpu-{K} was evicted {took:?} after the cordon",
        n.release
    );
    let (status, message) = condition(n).unwrap();
    assert_eq!(status, "True");
    assert!(
        message.contains(&format!("nvidia{K}")) && message.contains("fan failed"),
        "{message}"
    );
    assert!(
        message.contains(&format!("gpu.nvidia.com/{NODE}/gpu-{K}")),
        "{message}"
    );
    let events = node_events(n, "DeviceUnhealthy");
    assert!(
        events.iter().any(|e| e.contains(&format!("nvidia{K}"))),
        "{events:?}"
    );
    n.kubectl(&[
        "delete",
        "pod",
        "victim",
        "--ignore-not-found",
        "--wait=true",
    ]);
    n.kubectl(&["delete", "resourceclaim", "victim", "--wait=true"]);

    n.stop_process("devgate-agent");
    start_agent(n, kc, &[]);
    wait_for(n, "the rule NoSchedule after the agent's restart", || {
        let rules = our_rules(n);
        (rules.len() == 1 && rules[0]["spec"]["taint"]["effect"] == "NoSchedule").then_some(())
    });
    assert_eq!(
        our_rules(n)[0]["metadata"]["name"],
        rule["metadata"]["name"]
    );

    let mut got = Vec::new();
    for round in 0..3 {
        let names: Vec<String> = (0..7).map(|i| format!("new-{round}-{i}")).collect();
        for name in &names {
            let go = n.go_dir(name);
            n.apply(&pod(name, &go, "sleep 3600", "Never", Some("")));
        }
        for name in &names {
            got.push(n.wait_pod(name, "allocated", |_| n.allocated(name)));
        }
        for name in &names {
            n.kubectl(&["delete", "pod", name, "--wait=false"]);
        }
        n.wait_pod_gone_claims();
    }
    let on_k = got.iter().filter(|d| **d == format!("gpu-{K}")).count();
    eprintln!(
        "{}: 21 new claims got {got:?}: {on_k} on gpu-{K}",
        n.release
    );
    assert_eq!(on_k, 0, "{got:?}");
}

/// `devgate uncordon`: the rule goes, the condition clears with an Event, and a claim for
/// gpu-K is allocated it and its pod runs.
fn uncordon_deletes_the_rule(n: &K8sNode) {
    n.env.ok(&["uncordon", &format!("195:{K}")]);
    let (_, took) = wait_for(n, "the rule deleted", || {
        our_rules(n).is_empty().then_some(())
    });
    eprintln!(
        "{}: the rule for gpu-{K} was gone {took:?} after the uncordon",
        n.release
    );
    wait_for(n, "the condition False", || {
        (condition(n)?.0 == "False").then_some(())
    });
    let events = node_events(n, "DeviceRecovered");
    assert!(
        events.iter().any(|e| e.contains(&format!("195:{K}"))),
        "{events:?}"
    );
    let go = n.go_dir("again");
    n.apply(&k8s::gpu_claim("again", K, None));
    n.apply(&pod("again", &go, "sleep 3600", "Never", Some("again")));
    n.wait_pod("again", "running on gpu-K again", |p| {
        running(p).then_some(())
    });
    assert_eq!(
        n.claim_device("again").as_deref(),
        Some(format!("gpu-{K}").as_str())
    );
    n.delete_pod("again");
    n.kubectl(&["delete", "resourceclaim", "again", "--wait=true"]);
}

/// A pod holds a GPU (the device plugin's) and restarts now and then. An operator's
/// NoSchedule rule on that GPU's DRA device reaches the gate: the pod's next start is
/// rejected with a line naming the taint and the rule, and devgate publishes no rule of
/// its own. A pod whose claim tolerates the taint starts on the same GPU.
fn operators_rule_rejects_a_restart_and_tolerating_claims_start(n: &K8sNode) {
    let go = n.go_dir("bound");
    let script = format!("{SAY}; echo start >> /go/starts; sleep 2; exit 1");
    n.apply(&pod("bound", &go, &script, "Always", None));
    let said = wait_for(n, "the bound pod's first start", || {
        fs::read_to_string(go.join("said")).ok()
    })
    .0;
    let j: usize = said
        .trim()
        .strip_prefix("nvidia")
        .expect("one GPU")
        .parse()
        .unwrap();
    let api = n.device_taint_rule_api();
    n.apply(&json!({
        "apiVersion": api,
        "kind": "DeviceTaintRule",
        "metadata": {"name": "operator-gpu"},
        "spec": {
            "deviceSelector": {"driver": DRA_DRIVER, "pool": NODE, "device": format!("gpu-{j}")},
            "taint": {"key": OPERATOR_KEY, "value": "maintenance", "effect": "NoSchedule"},
        },
    }));
    let expected = format!(
        "tainted in the cluster: {OPERATOR_KEY}=maintenance:NoSchedule (DeviceTaintRule operator-gpu on {DRA_DRIVER}/{NODE}/gpu-{j})"
    );
    let message = n.wait_pod("bound", "a restart rejected by the operator's rule", |p| {
        let st = &p["status"]["containerStatuses"][0];
        let msg = st["lastState"]["terminated"]["message"].as_str()?;
        msg.contains("devgate: rejected").then(|| msg.to_string())
    });
    assert!(
        message.contains(&expected),
        "{message}\nexpected: {expected}"
    );
    eprintln!(
        "{}: the bound pod's restart on gpu-{j}: {message}",
        n.release
    );
    assert!(our_rules(n).is_empty(), "{:?}", our_rules(n));
    n.delete_pod("bound");

    let go = n.go_dir("tolerates");
    n.apply(&k8s::gpu_claim(
        "tolerates",
        j,
        Some(json!([{"key": OPERATOR_KEY, "operator": "Exists"}])),
    ));
    n.apply(&pod(
        "tolerates",
        &go,
        &format!("{SAY}; sleep 3600"),
        "Always",
        Some("tolerates"),
    ));
    n.wait_pod("tolerates", "the tolerating pod running", |p| {
        (running(p) && go.join("said").exists()).then_some(())
    });
    let said = fs::read_to_string(go.join("said")).unwrap();
    if n.cdi {
        assert_eq!(
            said.trim(),
            format!("nvidia{j}"),
            "the claim's GPU through CDI"
        );
        let file = cluster_taints(n);
        let uid = n.pod("tolerates")["metadata"]["uid"].clone();
        assert!(
            file["taints"][0]["tolerated_by"]
                .as_array()
                .unwrap()
                .contains(&uid),
            "{file}"
        );
    } else {
        eprintln!(
            "{}: containerd reads no CDI (1.7 and later do): the tolerating claim's pod runs, \
             its GPU not in the container (the forky stack shows the gate let it through)",
            n.release
        );
    }
    n.delete_pod("tolerates");
    n.kubectl(&["delete", "resourceclaim", "tolerates", "--wait=true"]);
    n.kubectl(&["delete", &n.device_taint_rules(), "operator-gpu"]);
    wait_for(n, "the operator's taint gone from the gate's file", || {
        cluster_taints(n)["taints"]
            .as_array()?
            .is_empty()
            .then_some(())
    });
}

/// An operator's emergency rule, "stop all GPU work": `deviceSelector: {}` and NoExecute.
/// The eviction controller reads the empty selector as every device and evicts the pod
/// on gpu-K; the gate's file then names all 8 GPUs, so no GPU starts a container.
fn an_empty_selector_evicts_and_the_gate_refuses_every_gpu(n: &K8sNode) {
    let go = n.go_dir("everyone");
    n.apply(&k8s::gpu_claim("everyone", K, None));
    n.apply(&pod(
        "everyone",
        &go,
        &format!("{SAY}; sleep 3600"),
        "Never",
        Some("everyone"),
    ));
    n.wait_pod("everyone", "running on gpu-K", |p| running(p).then_some(()));
    let uid = n.pod("everyone")["metadata"]["uid"].clone();
    n.apply(&json!({
        "apiVersion": n.device_taint_rule_api(),
        "kind": "DeviceTaintRule",
        "metadata": {"name": "operator-all"},
        "spec": {
            "deviceSelector": {},
            "taint": {"key": OPERATOR_KEY, "value": "stop", "effect": "NoExecute"},
        },
    }));
    let (_, took) = wait_for(n, "the pod evicted by the empty selector", || {
        let p = n.get_json(&["get", "pod", "everyone"]);
        let gone = p.as_ref().map_or(true, |p| p["metadata"]["uid"] != uid);
        let target = p.as_ref().is_some_and(|p| {
            p["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "DisruptionTarget"))
        });
        (gone || target).then_some(())
    });
    eprintln!(
        "{}: the empty selector's rule evicted the pod on gpu-{K} ({took:?})",
        n.release
    );
    let (gpus, _) = wait_for(n, "every GPU in the gate's file", || {
        let file = cluster_taints(n);
        let mut uuids: Vec<String> = (file["taints"].as_array()?.iter())
            .filter(|t| t["source"] == "DeviceTaintRule operator-all")
            .filter_map(|t| t["uuid"].as_str().map(str::to_string))
            .collect();
        uuids.sort();
        uuids.dedup();
        (uuids.len() == 8).then_some(uuids)
    });
    for i in 0..8 {
        assert!(gpus.contains(&fake_nvml::uuid(i)), "{gpus:?}");
    }
    for i in [0, K] {
        assert!(
            !runc_start(n, &format!("all-{i}"), i),
            "gpu-{i}'s container started under the empty selector's NoExecute rule"
        );
    }
    n.kubectl(&[
        "delete",
        "pod",
        "everyone",
        "--ignore-not-found",
        "--wait=true",
    ]);
    n.kubectl(&["delete", "resourceclaim", "everyone", "--wait=true"]);
    n.kubectl(&["delete", &n.device_taint_rules(), "operator-all"]);
    wait_for(
        n,
        "the empty selector's taints gone from the gate's file",
        || {
            cluster_taints(n)["taints"]
                .as_array()?
                .is_empty()
                .then_some(())
        },
    );
}

/// A container given gpu-`minor` under runc with the node's devgate: whether it started.
fn runc_start(n: &K8sNode, tag: &str, minor: usize) -> bool {
    let mut b = Bundle::new(tag, &["sh", "-c", "echo ran > /out/ran"]);
    b.add_device(&format!("/dev/nvidia{minor}"), "c", 195, minor as u32);
    b.add_hooks(&n.env, &["prestart", "poststop"]);
    let out = runtime_run("runc", &b, &unique_id(tag));
    out.status.success()
}

/// kube-apiserver stopped: containers start and are gated as ever, the agent says the API
/// is down; GPU M cordoned meanwhile gets its rule once the API server is back.
fn the_gate_goes_on_without_the_api_server(n: &K8sNode) {
    n.stop_process("kube-apiserver");
    wait_for(n, "the agent to see the API server away", || {
        (agent_status(n)?["api_ok"] == false).then_some(())
    });
    n.env
        .ok(&["cordon", &format!("195:{M}"), "--reason", "ecc storm"]);
    assert!(
        runc_start(n, "away-ok", 1),
        "a healthy GPU's container did not start"
    );
    assert!(
        !runc_start(n, "away-bad", M),
        "a cordoned GPU's container started"
    );
    let doctor = n.env.devgate(&["doctor"]);
    eprintln!(
        "{}: doctor with the API server away:\n{}",
        n.release,
        text(&doctor)
    );
    n.start_apiserver();
    let (_, took) = wait_for(
        n,
        "the rule for gpu-M after the API server's return",
        || our_rules(n).into_iter().find(|r| selects(r, M)),
    );
    eprintln!(
        "{}: the rule for gpu-{M} was there {took:?} after the API server came back",
        n.release
    );
    wait_for(n, "the agent to see the API server back", || {
        (agent_status(n)?["api_ok"] == true).then_some(())
    });
    let (status, message) = condition(n).unwrap();
    assert_eq!(status, "True");
    assert!(message.contains(&format!("nvidia{M}")), "{message}");
    n.env.ok(&["uncordon", &format!("195:{M}")]);
    wait_for(n, "the rule for gpu-M deleted", || {
        our_rules(n).is_empty().then_some(())
    });
}
