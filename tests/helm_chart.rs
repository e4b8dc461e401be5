//! The Helm chart (packaging/kubernetes/chart/devgate) against the plain manifest
//! (packaging/kubernetes/daemonset.yaml) and the agent's RBAC (issue #30; docs/cluster.md,
//! "RBAC"): `helm lint` passes, its defaults render the manifest's objects (labels and the
//! config's checksum aside), the installer init container is the manifest's in every
//! render, and the ClusterRole's rules are that table's, with `patch` on nodes only where
//! `agent.nodeTaint` is on.
//!
//! helm is tests/k8s/helm's pin and kubectl the newest release's, both from
//! scripts/k8s-binaries.sh's cache (`make k8s-binaries`; built here where missing). kubectl
//! reads the YAML (`label --local`: no API server) so that the test compares JSON.

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("packaging/kubernetes/chart/devgate")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `k8s-binaries.sh ARGS`' stdout; fails the test with its output where it fails.
fn k8s_binaries(args: &[&str]) -> String {
    let out = Command::new(repo().join("scripts/k8s-binaries.sh"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "k8s-binaries.sh {args:?}: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A program from the cache: helm, or kubectl of the newest release.
fn tool(name: &str) -> PathBuf {
    let what = if name == "helm" {
        "helm".to_string()
    } else {
        let releases = k8s_binaries(&["releases"]);
        releases.lines().last().expect("no release").to_string()
    };
    let bin = k8s_binaries(&["build", &what]);
    let path = PathBuf::from(bin.lines().last().unwrap_or_default()).join(name);
    assert!(path.is_file(), "no {}", path.display());
    path
}

fn scratch(name: &str) -> PathBuf {
    // Under target/ (cargo's scratch for integration tests), one set per test process.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("helm-chart-{}", std::process::id()))
        .join(name);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn helm(args: &[&str]) -> Output {
    Command::new(tool("helm"))
        .args(args)
        // No user's helm configuration or cache.
        .env("HELM_CONFIG_HOME", scratch("config"))
        .env("HELM_CACHE_HOME", scratch("cache"))
        .env("HELM_DATA_HOME", scratch("data"))
        .output()
        .unwrap()
}

/// The objects of a YAML file, as kubectl reads them.
fn objects_of(path: &Path) -> Vec<Value> {
    let out = Command::new(tool("kubectl"))
        .args(["label", "--local", "-o", "json", "-f"])
        .arg(path)
        .arg("devgate.test/read=true")
        .env("KUBECONFIG", "/dev/null")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl label --local: {}",
        text(&out)
    );
    let objects: Vec<Value> = serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .map(Result::unwrap)
        .collect();
    assert!(!objects.is_empty(), "no objects in {}", path.display());
    objects
}

/// `helm template` of the chart with `sets`, in kube-system as docs/cluster.md installs it.
fn render(sets: &[&str]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec!["template", "devgate", chart.to_str().unwrap()];
    args.extend(["--namespace", "kube-system"]);
    for s in sets {
        args.extend(["--set", s]);
    }
    let out = helm(&args);
    assert!(out.status.success(), "helm {args:?}: {}", text(&out));
    // kubectl -f reads a comma as a list of paths: a plain name for each render.
    static RENDERS: AtomicUsize = AtomicUsize::new(0);
    let n = RENDERS.fetch_add(1, Ordering::Relaxed);
    let file = scratch("render").join(format!("{n}.yaml"));
    fs::write(&file, &out.stdout).unwrap();
    objects_of(&file)
}

fn plain() -> Vec<Value> {
    objects_of(&repo().join("packaging/kubernetes/daemonset.yaml"))
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}: {objects:#?}");
    found[0]
}

fn pod_spec(objects: &[Value]) -> &Value {
    &find(objects, "DaemonSet")["spec"]["template"]["spec"]
}

fn agent_args(objects: &[Value]) -> Vec<String> {
    let containers = pod_spec(objects)["containers"].as_array().unwrap();
    let agent = containers
        .iter()
        .find(|c| c["name"] == "agent")
        .expect("agent container");
    agent["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// (apiGroup, resource, verb) of every rule: the rules' meaning, however grouped.
fn grants(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        let strings = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .unwrap_or_else(|| panic!("{k} in {rule}"))
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        for g in strings("apiGroups") {
            for r in strings("resources") {
                for v in strings("verbs") {
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

/// The ClusterRole devgate-agent of issue #30 (docs/cluster.md's table); `node_taint` adds
/// patch on nodes. Events are a Role's, in `default` alone ([`events_role_only_in_default`]).
fn contract_grants(node_taint: bool) -> BTreeSet<(String, String, String)> {
    let mut rules = vec![
        json!({"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"],
               "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}),
        json!({"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices", "resourceclaims"],
               "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}),
        json!({"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}),
    ];
    if node_taint {
        rules.push(json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}));
    }
    grants(&json!({ "rules": rules }))
}

/// Events are granted by a Role in `default`, where the agent writes a Node's, bound to its
/// ServiceAccount: no other namespace's events.
fn events_role_only_in_default(objects: &[Value]) {
    let role = find(objects, "Role");
    assert_eq!(role["metadata"]["namespace"], "default", "{role}");
    let events = json!({"rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]});
    assert_eq!(grants(role), grants(&events));
    let binding = find(objects, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "default");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "devgate-agent", "namespace": "kube-system"}])
    );
}

/// An object as the two sources may differ in it alone: labels (the chart adds Helm's),
/// the pod template's config checksum, and the config's JSON formatting.
fn comparable(o: &Value) -> Value {
    let mut o = o.clone();
    o["metadata"].as_object_mut().unwrap().remove("labels");
    if o["kind"] == "DaemonSet" {
        let meta = o["spec"]["template"]["metadata"].as_object_mut().unwrap();
        meta.remove("labels");
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove("devgate.io/config-sha256");
        }
    }
    if o["kind"] == "ConfigMap" {
        let config: Value =
            serde_json::from_str(o["data"]["config.json"].as_str().unwrap()).unwrap();
        o["data"]["config.json"] = config;
    }
    o
}

fn names(objects: &[Value]) -> BTreeSet<(String, String)> {
    objects
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_string(),
                o["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn helm_lint_passes_with_the_defaults_and_with_no_execute_and_the_node_taint() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    for sets in [
        vec![],
        vec!["agent.effect=NoExecute", "agent.nodeTaint=true"],
        vec!["serviceMonitor.enabled=true", "installer.enabled=false"],
    ] {
        let mut args = vec!["lint", "--strict", chart];
        for s in &sets {
            args.extend(["--set", s]);
        }
        let out = helm(&args);
        assert!(out.status.success(), "helm {args:?}: {}", text(&out));
    }
    // The schema refuses an effect the agent does not know.
    let out = helm(&[
        "template",
        "devgate",
        chart,
        "--set",
        "agent.effect=Sometimes",
    ]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("agent/effect"), "{}", text(&out));
}

#[test]
fn the_defaults_render_the_plain_manifest() {
    let plain = plain();
    let chart = render(&[]);
    assert_eq!(names(&chart), names(&plain));
    for p in &plain {
        let c = chart
            .iter()
            .find(|c| c["kind"] == p["kind"] && c["metadata"]["name"] == p["metadata"]["name"])
            .unwrap();
        assert_eq!(
            comparable(c),
            comparable(p),
            "{} {} differs from the manifest's",
            p["kind"],
            p["metadata"]["name"]
        );
    }
    // The selector and the pods' name label are the manifest's.
    let (c, p) = (find(&chart, "DaemonSet"), find(&plain, "DaemonSet"));
    assert_eq!(c["spec"]["selector"], p["spec"]["selector"]);
    assert_eq!(
        c["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
        p["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
    );
    let config = comparable(find(&chart, "ConfigMap"))["data"]["config.json"].clone();
    let shipped: Value =
        serde_json::from_slice(&fs::read(repo().join("packaging/config.json")).unwrap()).unwrap();
    assert_eq!(config, shipped);
}

#[test]
fn every_render_keeps_the_manifests_installer_and_the_contracts_rules() {
    let plain = plain();
    let installer = &pod_spec(&plain)["initContainers"];
    assert_eq!(installer.as_array().unwrap().len(), 1, "{installer}");
    assert_eq!(grants(find(&plain, "ClusterRole")), contract_grants(false));
    events_role_only_in_default(&plain);

    let defaults = render(&[]);
    let tainting = render(&["agent.effect=NoExecute", "agent.nodeTaint=true"]);
    for (objects, node_taint) in [(&defaults, false), (&tainting, true)] {
        assert_eq!(&pod_spec(objects)["initContainers"], installer);
        assert_eq!(
            grants(find(objects, "ClusterRole")),
            contract_grants(node_taint)
        );
        events_role_only_in_default(objects);
        let binding = find(objects, "ClusterRoleBinding");
        assert_eq!(binding["roleRef"]["name"], "devgate-agent");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "devgate-agent", "namespace": "kube-system"}])
        );
        // The token is the agent's alone.
        assert_eq!(pod_spec(objects)["automountServiceAccountToken"], false);
        assert_eq!(pod_spec(objects)["serviceAccountName"], "devgate-agent");
    }
    let args = agent_args(&defaults);
    for pair in [
        ["--host-root", "/host"],
        ["--node-name", "$(NODE_NAME)"],
        ["--effect", "NoSchedule"],
        ["--metrics-address", "0.0.0.0:9478"],
    ] {
        assert!(args.windows(2).any(|w| w == pair), "{pair:?} in {args:?}");
    }
    assert!(!args.contains(&"--node-taint".to_string()), "{args:?}");
    let args = agent_args(&tainting);
    assert!(
        args.windows(2).any(|w| w == ["--effect", "NoExecute"]),
        "{args:?}"
    );
    assert!(args.contains(&"--node-taint".to_string()), "{args:?}");
}

#[test]
fn the_agent_and_the_installer_each_turn_off() {
    // Nodes built from images with the package: the agent alone, no ConfigMap.
    let agent_only = render(&["installer.enabled=false"]);
    assert!(pod_spec(&agent_only).get("initContainers").is_none());
    assert!(agent_only.iter().all(|o| o["kind"] != "ConfigMap"));
    assert_eq!(agent_args(&agent_only)[..2], ["--host-root", "/host"]);
    // The installer alone: a pause container, no RBAC and no token.
    let installer_only = render(&["agent.enabled=false"]);
    assert_eq!(pod_spec(&installer_only)["containers"][0]["name"], "pause");
    assert_eq!(
        names(&installer_only),
        BTreeSet::from([
            ("ConfigMap".to_string(), "devgate-config".to_string()),
            ("DaemonSet".to_string(), "devgate-installer".to_string()),
        ])
    );
    // The ServiceMonitor scrapes the agents through a headless Service.
    let monitored = render(&["serviceMonitor.enabled=true"]);
    assert_eq!(find(&monitored, "Service")["spec"]["clusterIP"], "None");
    assert_eq!(
        find(&monitored, "ServiceMonitor")["spec"]["endpoints"][0]["port"],
        "metrics"
    );
}
