//! The cluster's device taints (issue #30) end to end under the real runc: the node agent's
//! `state_dir/cluster-taints.json`, written here through the same library call the agent
//! makes, keeps a container off a tainted GPU unless its pod tolerates the taint; a file
//! devgate cannot trust is unknown, which `policy.on_unknown` decides; `devgate status`
//! shows the taint on the GPU.

mod common;
use common::fake_nvml::*;
use common::*;
use devgate::store::cluster::{self, ClusterTaint, ClusterTaints, Effect};
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const POD: &str = "9f1c6a2e-5b7d-4e3a-8c21-0d4f6b8a1e37";
const OTHER_POD: &str = "11111111-2222-4333-8444-555555555555";
const K: usize = 3;

/// A GPU node with the fake NVML's 8 healthy GPUs, its config extended by `extra`.
struct Cluster {
    node: GpuNode,
    env: Env,
    fake: PathBuf,
    state: PathBuf,
}

impl Cluster {
    fn new(tag: &str, extra: Value) -> Cluster {
        let node = GpuNode::new(tag);
        let mut cfg = node.config();
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        let env = Env::with(tag, cfg);
        let fake = write_scenario(&node.dir, "healthy", &healthy_node());
        let state = env.dir.join("state");
        Cluster {
            node,
            env,
            fake,
            state,
        }
    }

    /// The agent's file, written now.
    fn taints(&self, taints: Vec<ClusterTaint>) {
        self.taints_written(taints, devgate::model::clock::now_unix());
    }

    fn taints_written(&self, taints: Vec<ClusterTaint>, written_unix: u64) {
        let file = ClusterTaints {
            node: "node-1".into(),
            written_unix,
            taints,
            overflow: None,
        };
        cluster::write(&self.state, &file).unwrap();
    }

    /// A container given GPU `minor`, in the pod whose annotations are `annotations`.
    fn run(&self, tag: &str, minor: u32, annotations: Value) -> (bool, String, Bundle) {
        let dev = format!("/dev/nvidia{minor}");
        let mut b = Bundle::new(tag, &["sh", "-c", "echo ran > /out/ran"]);
        b.add_device(&dev, "c", 195, minor);
        b.add_hooks(&self.env, &["prestart", "poststop"]);
        for stage in ["prestart", "poststop"] {
            for h in b.spec["hooks"][stage].as_array_mut().unwrap() {
                h["env"] = json!([format!("FAKE_NVML_CONFIG={}", self.fake.display())]);
            }
        }
        b.spec["annotations"] = annotations;
        let out = runtime_run("runc", &b, &unique_id(tag));
        let started = out.status.success();
        assert_eq!(started, b.marker().exists(), "{}", text(&out));
        (started, text(&out), b)
    }

    fn reject_prefix(&self, minor: u32) -> String {
        format!(
            "devgate: rejected /dev/nvidia{minor} (host {}/nvidia{minor}, 195:{minor}): ",
            self.node.dev_root.display()
        )
    }

    fn status_json(&self) -> Value {
        let out = Command::new(devgate_bin())
            .arg("--config")
            .arg(&self.env.config)
            .args(["status", "--json"])
            .env_remove("DEVGATE_CONFIG")
            .env("FAKE_NVML_CONFIG", &self.fake)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// The contract's example taint on GPU `i`, by its uuid.
fn taint_on(i: usize, effect: Effect, tolerated_by: &[&str]) -> ClusterTaint {
    ClusterTaint {
        uuid: Some(uuid(i)),
        pci_bus_id: None,
        device: format!("gpu-{i}"),
        driver: "gpu.nvidia.com".into(),
        pool: "node-1".into(),
        key: "example.com/maintenance".into(),
        value: "swap".into(),
        effect,
        source: "DeviceTaintRule example-rule".into(),
        tolerated_by: tolerated_by.iter().map(|s| s.to_string()).collect(),
        tolerated_until: vec![],
    }
}

fn containerd_pod(uid: &str) -> Value {
    json!({"io.kubernetes.cri.sandbox-uid": uid})
}

#[test]
fn a_tainted_gpu_refuses_pods_that_do_not_tolerate_it() {
    require_root!();
    let c = Cluster::new("taint-gate", json!({}));
    let line = format!(
        "{}tainted in the cluster: example.com/maintenance=swap:NoSchedule \
         (DeviceTaintRule example-rule on gpu.nvidia.com/node-1/gpu-{K}); policy reject",
        c.reject_prefix(K as u32)
    );

    // No file (no agent on this node): the container starts.
    let (started, all, _) = c.run("none", K as u32, containerd_pod(POD));
    assert!(started, "{all}");

    // NoSchedule on GPU k's uuid (written in lower case), tolerated by another pod only.
    let mut t = taint_on(K, Effect::NoSchedule, &[OTHER_POD]);
    t.uuid = t.uuid.map(|u| u.to_ascii_lowercase());
    c.taints(vec![t]);
    let (started, all, _) = c.run("rejected", K as u32, containerd_pod(POD));
    assert!(!started && all.contains(&line), "{all}");
    let last = c.env.decisions().pop().unwrap();
    assert_eq!(last["action"], "reject");
    assert!(last.to_string().contains("\"cluster_taint\""), "{last}");
    // outside a pod, too
    let (started, all, _) = c.run("no-pod", K as u32, json!({}));
    assert!(!started && all.contains(&line), "{all}");
    // another GPU is not touched
    let (started, all, _) = c.run("other-gpu", 1, containerd_pod(POD));
    assert!(started, "{all}");

    // The pod tolerates it, under either runtime's key: it starts.
    c.taints(vec![taint_on(K, Effect::NoSchedule, &[OTHER_POD, POD])]);
    let (started, all, _) = c.run("tolerated", K as u32, containerd_pod(POD));
    assert!(started, "{all}");
    let crio = json!({"io.kubernetes.pod.uid": POD});
    let (started, all, _) = c.run("tolerated-crio", K as u32, crio);
    assert!(started, "{all}");

    // Effect None only informs.
    c.taints(vec![taint_on(K, Effect::None, &[])]);
    let (started, all, _) = c.run("effect-none", K as u32, containerd_pod(POD));
    assert!(started, "{all}");

    // A taint with no uuid is matched by the GPU's PCI address, NoExecute too.
    let mut t = taint_on(K, Effect::NoExecute, &[]);
    t.uuid = None;
    t.pci_bus_id = Some(bus(K));
    c.taints(vec![t]);
    let (started, all, _) = c.run("by-pci", K as u32, containerd_pod(POD));
    assert!(!started, "{all}");
    assert!(
        all.contains("tainted in the cluster: example.com/maintenance=swap:NoExecute"),
        "{all}"
    );
}

/// The attacker's pod: CRI-O copies a pod's annotations into the spec, so a pod can write
/// containerd's uid key with the uid of a pod that tolerates the taint. The runtime's own
/// key then disagrees, and a disagreement names no pod: nothing is tolerated.
#[test]
fn a_pod_forging_the_other_runtimes_uid_is_not_tolerated() {
    require_root!();
    let c = Cluster::new("taint-forged", json!({}));
    c.taints(vec![taint_on(K, Effect::NoSchedule, &[OTHER_POD])]);
    let forged = json!({
        "io.kubernetes.pod.uid": POD,
        "io.kubernetes.cri.sandbox-uid": OTHER_POD,
    });
    let (started, all, _) = c.run("forged", K as u32, forged);
    assert!(!started, "{all}");
    assert!(all.contains("tainted in the cluster: "), "{all}");
    // The tolerating pod itself, with both keys agreeing, starts.
    let honest = json!({
        "io.kubernetes.pod.uid": OTHER_POD,
        "io.kubernetes.cri.sandbox-uid": OTHER_POD,
    });
    let (started, all, _) = c.run("honest", K as u32, honest);
    assert!(started, "{all}");
}

/// Strings from API objects others can write (a rule's name, a key, a slice's device
/// name) reach the reject line escaped and cut, never as lines of their own.
#[test]
fn hostile_taint_strings_are_escaped_and_bounded_in_the_reject_line() {
    require_root!();
    let c = Cluster::new("taint-hostile", json!({}));
    let mut t = taint_on(K, Effect::NoSchedule, &[]);
    t.key = "k\ndevgate: allowed /dev/nvidia3\x1b[2K".into();
    t.value = "\u{202e}evil".into();
    t.source = format!("DeviceTaintRule {}", "r".repeat(1000));
    t.device = "\u{2028}".repeat(1024);
    c.taints(vec![t]);
    let (started, all, _) = c.run("hostile", K as u32, containerd_pod(POD));
    assert!(!started, "{all}");
    let line = all
        .lines()
        .find(|l| l.contains("tainted in the cluster: "))
        .unwrap_or_else(|| panic!("no reject line: {all}"));
    // runc quotes the hook's stderr in its error, doubling each backslash
    let line = line.replace("\\\\", "\\");
    assert!(
        line.contains("k\\x0adevgate: allowed /dev/nvidia3\\x1b[2K=\\u{202e}evil:NoSchedule"),
        "{line}"
    );
    assert!(!all.contains('\x1b') && !all.contains('\u{2028}'), "{all}");
    assert!(line.len() < 3000, "{} bytes: {line}", line.len());
}

/// A file devgate cannot trust or read is no answer either way: unknown, and
/// `policy.on_unknown` decides. Under the default (allow) the container starts.
#[test]
fn an_untrusted_or_damaged_file_follows_on_unknown() {
    require_root!();
    let c = Cluster::new("taint-unknown", json!({"policy": {"on_unknown": "reject"}}));
    let file = cluster::path(&c.state);
    let unknown = |what: &str, tag: &str| {
        let (started, all, _) = c.run(tag, K as u32, containerd_pod(POD));
        assert!(!started, "{tag}: {all}");
        let prefix = c.reject_prefix(K as u32);
        let line = all
            .lines()
            .find(|l| l.contains(&prefix))
            .unwrap_or_else(|| panic!("{tag}: no reject line: {all}"));
        assert!(
            line.contains("cluster unknown: cluster taints unreadable: ")
                && line.contains(what)
                && line.contains("; policy on_unknown reject"),
            "{tag}: {line}"
        );
        let last = c.env.decisions().pop().unwrap();
        assert!(
            last.to_string().contains("\"cluster_taints_unreadable\""),
            "{last}"
        );
    };
    fs::create_dir_all(&c.state).unwrap();
    fs::write(&file, b"{\"node\": ").unwrap();
    unknown(&file.display().to_string(), "damaged");

    // group-writable: anyone in the group could clear a taint, or taint every GPU
    c.taints(vec![]);
    fs::set_permissions(&file, fs::Permissions::from_mode(0o664)).unwrap();
    unknown(
        "is writable by group or others (mode 664)",
        "group-writable",
    );

    // a symlink to a file that would pass is not followed
    let real = c.env.dir.join("elsewhere.json");
    fs::rename(&file, &real).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&real, &file).unwrap();
    unknown("cannot open cluster taints", "symlink");
    fs::remove_file(&file).unwrap();

    // The default policy allows an unknown: the container starts, with a warning.
    let d = Cluster::new("taint-unknown-allow", json!({}));
    fs::create_dir_all(&d.state).unwrap();
    fs::write(cluster::path(&d.state), b"not json").unwrap();
    let (started, all, _) = d.run("allowed", K as u32, containerd_pod(POD));
    assert!(started, "{all}");
    let last = d.env.decisions().pop().unwrap();
    assert!(
        last.to_string().contains("cluster_taints_unreadable"),
        "{last}"
    );
}

/// A file no agent has confirmed for longer than `cluster_taints_max_age_s` (the agent
/// stopped, or cannot reach the API server) is not read: a taint cleared in the cluster
/// must not refuse pods forever. Each GPU's cluster verdict is unknown: with the default
/// policy the container starts with a warning, under `on_unknown: reject` it is refused.
/// doctor and the metrics say the file is stale.
#[test]
fn a_stale_file_is_unknown_not_in_force() {
    require_root!();
    let now = devgate::model::clock::now_unix();
    let stale = now - 301;
    let allow = Cluster::new("taint-stale-allow", json!({}));
    allow.taints_written(vec![taint_on(K, Effect::NoSchedule, &[])], stale);
    let (started, all, _) = allow.run("stale-allowed", K as u32, containerd_pod(POD));
    assert!(started, "a stale taint refused the start: {all}");
    let last = allow.env.decisions().pop().unwrap().to_string();
    assert!(last.contains("\"cluster_taints_stale\""), "{last}");
    assert!(
        last.contains("cluster taints stale: written ")
            && last.contains(" s ago, more than cluster_taints_max_age_s 300"),
        "{last}"
    );
    // fresh again: the taint is in force
    allow.taints(vec![taint_on(K, Effect::NoSchedule, &[])]);
    let (started, all, _) = allow.run("fresh-refused", K as u32, containerd_pod(POD));
    assert!(!started, "{all}");
    assert!(all.contains("tainted in the cluster"), "{all}");

    let reject = Cluster::new(
        "taint-stale-reject",
        json!({"policy": {"on_unknown": "reject"}, "cluster_taints_max_age_s": 120}),
    );
    reject.taints_written(vec![], now - 121);
    let (started, all, _) = reject.run("stale-refused", K as u32, containerd_pod(POD));
    assert!(!started, "{all}");
    let line = all
        .lines()
        .find(|l| l.contains(&reject.reject_prefix(K as u32)))
        .unwrap_or_else(|| panic!("no reject line: {all}"));
    assert!(
        line.contains("cluster unknown: cluster taints stale: written ")
            && line.contains("more than cluster_taints_max_age_s 120")
            && line.contains("; policy on_unknown reject"),
        "{line}"
    );
    let doctor = text(&reject.env.devgate(&["doctor"]));
    assert!(
        doctor
            .lines()
            .any(|l| l.starts_with("⚠ cluster taints: written ")
                && l.contains("more than cluster_taints_max_age_s 120")),
        "{doctor}"
    );
    let prom = reject.env.dir.join("devgate.prom");
    reject
        .env
        .ok(&["metrics", "--textfile", prom.to_str().unwrap()]);
    let metrics = fs::read_to_string(&prom).unwrap();
    assert!(
        metrics.contains("\ndevgate_cluster_taints_stale 1\n"),
        "{metrics}"
    );
    let age: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("devgate_cluster_taints_age_seconds "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no age: {metrics}"));
    assert!(age > 120, "{metrics}");
}

/// `devgate status` (no pod) shows the taint as the GPU's reason, tolerated or not.
#[test]
fn status_shows_the_taint_on_the_gpu() {
    require_root!();
    let c = Cluster::new("taint-status", json!({}));
    c.taints(vec![taint_on(K, Effect::NoSchedule, &[POD])]);
    let rows = c.status_json();
    let row = gpu_row(&rows, &c.node.dev_root, K);
    assert_eq!(row["health"], "unhealthy", "{row}");
    let v = row["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["probe"] == "cluster")
        .unwrap_or_else(|| panic!("{row}"));
    assert_eq!(v["code"], "cluster_taint", "{v}");
    assert!(
        v.to_string()
            .contains("tainted in the cluster: example.com/maintenance=swap:NoSchedule"),
        "{v}"
    );
    assert_eq!(gpu_row(&rows, &c.node.dev_root, 1)["health"], "healthy");
}

fn gpu_row<'a>(rows: &'a Value, dev_root: &Path, i: usize) -> &'a Value {
    let path = dev_root.join(format!("nvidia{i}"));
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r.to_string().contains(&format!("\"{}\"", path.display())))
        .unwrap_or_else(|| panic!("no row for {}: {rows}", path.display()))
}
