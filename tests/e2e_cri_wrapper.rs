//! containerd's CRI plugin with devgate's runtime wrapper as the runc.v2 shim's
//! `BinaryName` (the snippet `hooks-config --runtime containerd --wrapper` generates, config
//! version 2 or 3 by the containerd under test: tests/common/cri.rs `Config`) and devgate's
//! hooks in the base runtime spec, driven as kubelet drives it through the typed CRI client
//! (tests/common/cri.rs): a pod, a container with a device the operator cordoned, the
//! remap, then UpdateContainerResources (kubelet's CPU manager), and the spare still opens
//! and the bad device is still denied. Under runc on this host's v1, and under crun with a
//! v1-only cgroup view, where `update` rewrites device rules.

mod common;
use common::cri::{self, Cri, PodGuard};
use common::wrapper::*;
use common::*;
use std::fs;
use std::path::{Path, PathBuf};

/// The wrapper snippet for containerd with this test's paths: the base spec, the wrapper
/// (a script that records its arguments, then runs the devgate-runtime program with the
/// test's config), and
/// the runtime's state root under the test's directory instead of /run/containerd/runc.
fn wrapper_config(work: &Path, env: &Env, config: cri::Config) -> (String, PathBuf) {
    let base_spec = work.join("devgate-base-spec.json");
    fs::write(&base_spec, containerd_base_spec_for(env)).unwrap();
    let bin = work.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let trace = work.join("runtime-calls.log");
    let wrapper = bin.join("devgate-runtime");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nDEVGATE_CONFIG='{}' exec '{}' \"$@\"\n",
            trace.display(),
            env.config.display(),
            devgate_runtime_bin().display()
        ),
    )
    .unwrap();
    fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let snippets = work.join("snippets");
    hooks_config(&[
        "hooks-config",
        "--runtime",
        "containerd",
        "--wrapper",
        "--bin",
        bin.join("devgate").to_str().unwrap(),
        "--out",
        snippets.to_str().unwrap(),
    ]);
    let snippet = fs::read_to_string(snippets.join(config.wrapper_snippet())).unwrap();
    assert!(
        snippet.contains(&format!("\n{}\n", config.top())),
        "{snippet}"
    );
    config.say_loaded(&format!("the generated {}", config.wrapper_snippet()));
    let binary_name = format!("  BinaryName = \"{}\"\n", wrapper.display());
    assert!(snippet.contains(&binary_name), "{snippet}");
    let tables: Vec<&str> = snippet
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("version ="))
        .collect();
    let tables = tables
        .join("\n")
        .replace(
            "/etc/containerd/devgate-base-spec.json",
            base_spec.to_str().unwrap(),
        )
        .replace(
            binary_name.trim_end(),
            &format!(
                "{}\n  Root = \"{}\"",
                binary_name.trim_end(),
                work.join("runtime-root").display()
            ),
        );
    (
        format!("{tables}\n\n{}", config.plugin_settings(TEST_IMAGE)),
        trace,
    )
}

fn remap_survives_update_over_cri(runtime: &str, under: &[&str]) {
    if let Some(why) = node::unified_without("cpu") {
        eprintln!("skipped: {why}: a CRI pod sandbox sets cpu.weight");
        return;
    }
    let tag = format!("cri-wr-{runtime}");
    let work = tempdir(&tag);
    let env = remap_env(&format!("{tag}-env"), runtime);
    let version = cri::Config::of_containerd();
    let (config, trace) = wrapper_config(&work, &env, version);
    let cd = Containerd::start_under(&tag, version.top(), &config, under);
    cd.import_test_image("k8s.io");
    let mut c = Cri::connect(&cd.socket);
    assert_eq!(c.version().unwrap().runtime_api_version, "v1");

    let uid = format!("{tag}-uid");
    let pod = cri::host_network_pod("gpu-pod", &uid, "ml", &work.join("pods").join(&uid));
    let pod_id = c
        .run_pod_sandbox(&pod)
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", cd.log()));
    let _guard = PodGuard {
        socket: cd.socket.clone(),
        id: pod_id.clone(),
    };
    let spec = cri::container("trainer", TEST_IMAGE, &["sleep", "600"], &[BAD]);
    let cid = c
        .create_container(&pod_id, spec, &pod)
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", cd.log()));
    c.start_container(&cid)
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", cd.log()));
    let probe = |c: &mut Cri| {
        let r = c.exec_sync(&cid, &["sh", "-c", PROBE]).unwrap();
        assert_eq!(r.exit_code, 0, "{r:?}");
        probe_says(&String::from_utf8_lossy(&r.stdout))
    };
    assert_eq!(probe(&mut c), remapped());
    // The wrapper decided at create; the hook at prestart did not decide again.
    let mine: Vec<_> = env
        .decisions()
        .into_iter()
        .filter(|d| d["container_id"] == cid.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(mine[0]["stage"], "create");
    assert_eq!(mine[0]["action"], "remap");
    assert_eq!(leases(&env), vec![(cid.clone(), BAD_NUM.1, SPARE_NUM.1)]);

    // kubelet's CPU manager: containerd passes the whole stored resources, device rules
    // from before the remap included, to `<runtime> update`.
    c.update_container_resources(
        &cid,
        cri::LinuxContainerResources {
            cpu_shares: 512,
            cpuset_cpus: "0".into(),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("UpdateContainerResources: {e}\n{}", cd.log()));
    let calls = fs::read_to_string(&trace).unwrap();
    assert!(
        calls
            .lines()
            .any(|l| l.contains(" update ") && l.contains("--resources") && l.ends_with(&cid)),
        "{calls}"
    );
    assert_eq!(probe(&mut c), remapped());

    // Removing the container gives the spare back.
    c.stop_container(&cid).unwrap();
    c.remove_container(&cid).unwrap();
    assert_eq!(leases(&env), vec![]);
    assert!(!env.dir.join(format!("state/decided/{cid}.json")).exists());
    c.stop_pod_sandbox(&pod_id).unwrap();
    c.remove_pod_sandbox(&pod_id).unwrap();
}

#[test]
fn cri_remap_then_update_container_resources_under_runc() {
    require_root!();
    if !have_devices() {
        return;
    }
    remap_survives_update_over_cri("runc", &[]);
}

/// crun 1.8 refuses this host's hybrid layout: containerd, its shims and crun run in a
/// private mount namespace whose /sys/fs/cgroup has the v1 controllers only.
#[test]
fn cri_remap_then_update_container_resources_under_crun_v1() {
    require_root!();
    if !have_devices() || !fake::v1_devices_or_skip() {
        return;
    }
    remap_survives_update_over_cri(
        "crun",
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "umount /sys/fs/cgroup/unified && exec \"$0\" \"$@\"",
        ],
    );
}
