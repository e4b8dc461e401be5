//! Configs as runc, crun, containerd, podman and CRI-O write them, old and new spec
//! versions: every one parses, and discovery finds exactly the assigned devices.

use devgate::discover;
use devgate::gpu;
use devgate::model::class;
use devgate::model::device::Source;
use devgate::oci::spec::Spec;
use std::path::Path;

fn load(name: &str) -> Spec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/specs")
        .join(name);
    let bytes = std::fs::read(&path).unwrap();
    Spec::parse(&bytes, &path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn assigned(spec: &Spec) -> Vec<(String, String, Source)> {
    discover::discover(
        spec,
        &class::builtin(),
        Path::new("/nonexistent"),
        Path::new("/nonexistent"),
    )
    .unwrap()
    .into_iter()
    .map(|d| (d.name(), d.class.to_string(), d.source))
    .collect()
}

#[test]
fn runtime_default_specs_have_no_assigned_devices() {
    for name in [
        "runc-1.1-spec.json",
        "runc-1.1-rootless-spec.json",
        "crun-1.8-spec.json",
        "containerd-1.6-ctr-oci-spec.json",
    ] {
        let s = load(name);
        assert!(!gpu::may_have_devices(&s), "{name}");
        assert!(assigned(&s).is_empty(), "{name}");
    }
}

#[test]
fn crio_kubernetes_gpu_spec_with_new_fields() {
    let s = load("crio-1.28-k8s-gpu.json");
    let a = assigned(&s);
    assert!(
        a.contains(&(
            "/dev/nvidia3".into(),
            "nvidia-gpu".into(),
            Source::LinuxDevices
        )),
        "{a:?}"
    );
    assert!(
        a.contains(&(
            "/dev/nvidiactl".into(),
            "nvidia-ctl".into(),
            Source::LinuxDevices
        )),
        "{a:?}"
    );
    // the rule for 195:3 is the same device as the linux.devices entry
    assert_eq!(
        a.iter().filter(|(n, ..)| n == "/dev/nvidia3").count(),
        1,
        "{a:?}"
    );
    assert_eq!(s.annotations["io.kubernetes.pod.namespace"], "ml");
}

#[test]
fn old_rc5_spec_with_capability_list() {
    let s = load("old-1.0.0-rc5.json");
    assert_eq!(
        assigned(&s),
        vec![("/dev/dri/card0".into(), "dri".into(), Source::LinuxDevices)]
    );
}

#[test]
fn podman_spec_with_device() {
    let s = load("podman-4.3-device.json");
    assert_eq!(
        assigned(&s),
        vec![("/dev/zero".into(), "char".into(), Source::LinuxDevices)]
    );
}

#[test]
fn shipped_containerd_base_spec_parses() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/containerd/devgate-base-spec.json");
    let s = Spec::parse(&std::fs::read(&path).unwrap(), &path).unwrap();
    assert!(!gpu::may_have_devices(&s));
}
