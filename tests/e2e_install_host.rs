//! `devgate install-host` and `devgate uninstall-host` against a scratch host root: a
//! reinstall keeps an operator's edit of the base spec, the containerd snippets land on the
//! node, and removal leaves a base spec containerd can still load with no hook to run.

mod common;
use common::*;
use serde_json::Value;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

const SPEC: &str = "etc/containerd/devgate-base-spec.json";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn devgate_on(root: &Path, command: &str) -> Output {
    let mut words = command.split(' ');
    Command::new(devgate_bin())
        .arg(words.next().unwrap())
        .arg("--root")
        .arg(root)
        .args(words)
        .env_remove("DEVGATE_CONFIG")
        .output()
        .unwrap()
}

fn ok_on(root: &Path, command: &str) -> String {
    let out = devgate_on(root, command);
    assert!(out.status.success(), "{command}: {}", text(&out));
    text(&out)
}

fn json(p: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

#[test]
fn install_host_keeps_an_edited_base_spec_and_writes_new() {
    let root = tempdir("host-edit");
    ok_on(&root, "install-host");
    let spec = root.join(SPEC);
    let shipped = fs::read_to_string(&spec).unwrap();

    // An unedited spec is replaced on a rerun (upgrade), with no .new beside it.
    ok_on(&root, "install-host");
    assert_eq!(fs::read_to_string(&spec).unwrap(), shipped);
    assert!(!root.join(format!("{SPEC}.new")).exists());

    // An operator's edit is kept; the installer's version goes to .new, and it says so.
    let mine = shipped.replace("\"timeout\": 30", "\"timeout\": 20");
    assert_ne!(mine, shipped);
    fs::write(&spec, &mine).unwrap();
    let said = ok_on(&root, "install-host");
    assert_eq!(fs::read_to_string(&spec).unwrap(), mine);
    let new = root.join(format!("{SPEC}.new"));
    assert_eq!(fs::read_to_string(&new).unwrap(), shipped);
    assert!(
        said.contains(&format!("devgate: kept edited {}", spec.display())),
        "{said}"
    );

    // Once the operator takes the new one, reruns replace it again.
    fs::rename(&new, &spec).unwrap();
    ok_on(&root, "install-host");
    assert!(!new.exists());
}

#[test]
fn install_host_puts_the_containerd_snippets_on_the_node() {
    let root = tempdir("host-snippet");
    ok_on(&root, "install-host");
    for name in ["config.toml", "config-v3.toml"] {
        assert_eq!(
            fs::read_to_string(root.join("usr/share/devgate/containerd").join(name)).unwrap(),
            fs::read_to_string(repo().join("hooks/containerd").join(name)).unwrap(),
            "{name}"
        );
    }
    // The runtime wrapper's snippets too, naming the wrapper where install-host put it.
    for (dir, name) in [
        ("containerd", "containerd-runtime-wrapper.toml"),
        ("containerd", "containerd-runtime-wrapper-v3.toml"),
        ("crio", "10-devgate-runtime.conf"),
        ("podman", "devgate-runtime.conf"),
    ] {
        let text = fs::read_to_string(root.join("usr/share/devgate").join(dir).join(name))
            .unwrap_or_else(|e| panic!("{dir}/{name}: {e}"));
        assert!(
            text.contains("/usr/local/bin/devgate-runtime"),
            "{dir}/{name}: {text}"
        );
    }
}

/// A containerd config the operator wrote by hand, naming devgate's base spec.
const OPERATORS_CONFIG: &str = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n  base_runtime_spec = \"/etc/containerd/devgate-base-spec.json\"\n";

/// containerd keeps naming the base spec where the operator's config does (it reads it at
/// start), so removal takes the hooks out of the spec first, keeping the programs until the
/// runtime has restarted (`--programs`).
#[test]
fn uninstall_host_leaves_a_hookless_spec_and_removes_the_programs() {
    let root = tempdir("host-remove");
    ok_on(&root, "install-host");
    let conf = root.join("etc/containerd/config.toml");
    fs::write(&conf, OPERATORS_CONFIG).unwrap();
    let installed = json(&root.join(SPEC));
    let said = ok_on(&root, "uninstall-host");

    let mut expect = installed;
    expect.as_object_mut().unwrap().remove("hooks");
    assert_eq!(json(&root.join(SPEC)), expect);
    assert!(!root
        .join("usr/share/containers/oci/hooks.d/devgate.json")
        .exists());
    // A containerd that has not restarted still runs the hooks it read: they stay.
    assert!(root.join("usr/local/bin/devgate-hook").is_file(), "{said}");
    assert!(said.contains("--programs"), "{said}");

    let said = ok_on(&root, "uninstall-host --programs");
    for gone in [
        "usr/local/bin/devgate",
        "usr/local/bin/devgate-hook",
        "usr/local/bin/devgate-runtime",
    ] {
        assert!(!root.join(gone).exists(), "{gone} left: {said}");
    }
    assert!(!root.join("usr/share/devgate").exists(), "{said}");
    assert_eq!(json(&root.join(SPEC)), expect);
    // Not devgate's lines: the operator's config is left as it is.
    assert_eq!(fs::read_to_string(&conf).unwrap(), OPERATORS_CONFIG);
    // The operator's config and quarantine marks stay, as a package's remove keeps them.
    assert!(root.join("etc/devgate/config.json").is_file());
    assert!(root.join("var/lib/devgate/quarantine").is_dir());
    // Removing again is a no-op that succeeds; reinstalling lays the hooks again.
    ok_on(&root, "uninstall-host --programs");
    ok_on(&root, "install-host");
    assert!(json(&root.join(SPEC))["hooks"]["prestart"].is_array());
}

/// An edited spec may still name the hook front: removal keeps both and says so.
#[test]
fn uninstall_host_keeps_the_hook_front_an_edited_spec_names() {
    let root = tempdir("host-remove-edited");
    ok_on(&root, "install-host");
    let spec = root.join(SPEC);
    let mine = fs::read_to_string(&spec)
        .unwrap()
        .replace("\"timeout\": 30", "\"timeout\": 20");
    fs::write(&spec, &mine).unwrap();
    let said = ok_on(&root, "uninstall-host");
    assert!(said.contains("kept edited"), "{said}");
    let out = devgate_on(&root, "uninstall-host --programs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(fs::read_to_string(&spec).unwrap(), mine);
    assert!(root.join("usr/local/bin/devgate-hook").is_file());
}

/// A runtime whose config still names devgate's runtime wrapper (containerd's
/// `BinaryName`, CRI-O's `runtime_path`) would fail every start once it is gone: the
/// programs stay, and the line names the file.
#[test]
fn uninstall_host_keeps_the_programs_a_runtime_config_names() {
    let root = tempdir("host-remove-wrapper");
    ok_on(&root, "install-host");
    let conf = root.join("etc/containerd/config.toml");
    fs::create_dir_all(conf.parent().unwrap()).unwrap();
    fs::write(
        &conf,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  \
         BinaryName = \"/usr/local/bin/devgate-runtime\"\n",
    )
    .unwrap();
    ok_on(&root, "uninstall-host");
    let out = devgate_on(&root, "uninstall-host --programs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("/etc/containerd/config.toml names /usr/local/bin/devgate-runtime"),
        "{}",
        text(&out)
    );
    assert!(root.join("usr/local/bin/devgate-runtime").exists());
    // once the operator takes it out, the programs go
    fs::write(&conf, "version = 2\n").unwrap();
    ok_on(&root, "uninstall-host --programs");
    assert!(!root.join("usr/local/bin/devgate-runtime").exists());
    assert!(!root.join("usr/local/bin/devgate").exists());
}

/// NVIDIA's runtime runs the wrapper where docs/wrapper.md puts it (first in its
/// `runtimes` list, /etc/nvidia-container-runtime/config.toml): removing the programs
/// under it would fail every GPU container's start. They stay, and the line names the file.
#[test]
fn uninstall_host_keeps_the_programs_nvidias_runtime_names() {
    let root = tempdir("host-remove-nvidia");
    ok_on(&root, "install-host");
    let conf = root.join("etc/nvidia-container-runtime/config.toml");
    fs::create_dir_all(conf.parent().unwrap()).unwrap();
    fs::write(
        &conf,
        "[nvidia-container-runtime]\nmode = \"cdi\"\nruntimes = [\"/usr/local/bin/devgate-runtime\", \"runc\"]\n",
    )
    .unwrap();
    ok_on(&root, "uninstall-host");
    let out = devgate_on(&root, "uninstall-host --programs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(
            "/etc/nvidia-container-runtime/config.toml names /usr/local/bin/devgate-runtime"
        ),
        "{}",
        text(&out)
    );
    assert!(root.join("usr/local/bin/devgate-runtime").exists());
}

/// containerd (and CRI-O) read their config only at start: in the run that takes devgate
/// out of it without `--restart`, the running containerd still names devgate's programs
/// (its base spec's hooks, its runtime wrapper), so `--programs` must keep them, or every
/// container start fails until the restart.
#[test]
fn uninstall_host_programs_wait_for_the_restart() {
    let root = tempdir("host-programs-wait");
    let conf = root.join("etc/containerd/config.toml");
    fs::create_dir_all(conf.parent().unwrap()).unwrap();
    let debian = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n";
    fs::write(&conf, debian).unwrap();
    ok_on(&root, "install-host --enable");
    let out = devgate_on(&root, "uninstall-host --programs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("restart it"), "{}", text(&out));
    assert_eq!(fs::read_to_string(&conf).unwrap(), debian);
    assert!(root.join("usr/local/bin/devgate").exists());
    assert!(root.join("usr/local/bin/devgate-hook").exists());
    // Rerun once it has restarted: nothing changed this time, and the programs go.
    ok_on(&root, "uninstall-host --programs");
    assert!(!root.join("usr/local/bin/devgate").exists());
}

/// A spec no containerd config names goes with the rest: the node is as it was.
#[test]
fn uninstall_host_removes_a_spec_no_config_names() {
    let root = tempdir("host-remove-unnamed");
    ok_on(&root, "install-host");
    let said = ok_on(&root, "uninstall-host");
    assert!(!root.join(SPEC).exists(), "{said}");
    assert!(!root
        .join("var/lib/devgate/installed/devgate-base-spec.json")
        .exists());
    ok_on(&root, "uninstall-host --programs");
    assert!(!root.join("usr/local/bin/devgate").exists());
}

/// `--enable` points containerd's default runtime at the base spec with marked lines,
/// after everything the spec names is laid; removal gives the file back byte for byte.
/// `--restart` on a host without systemd fails before anything changes.
#[test]
fn install_host_enable_marks_containerds_config_and_removal_restores_it() {
    let root = tempdir("host-enable");
    let conf = root.join("etc/containerd/config.toml");
    fs::create_dir_all(conf.parent().unwrap()).unwrap();
    let debian = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n";
    fs::write(&conf, debian).unwrap();

    // No /run/systemd/system under this root: refused, and nothing laid.
    let out = devgate_on(&root, "install-host --enable --restart");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("does not run systemd"),
        "{}",
        text(&out)
    );
    assert!(!root.join(SPEC).exists());
    assert!(!root.join("usr/local/bin/devgate").exists());
    assert_eq!(fs::read_to_string(&conf).unwrap(), debian);
    let out = devgate_on(&root, "install-host --restart");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--restart goes with --enable"),
        "{}",
        text(&out)
    );

    let said = ok_on(&root, "install-host --enable");
    assert!(
        said.contains("restart it (or rerun with --restart)"),
        "{said}"
    );
    let enabled = fs::read_to_string(&conf).unwrap();
    let toml: toml::Table = enabled.parse().unwrap();
    let runc = &toml["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"];
    assert_eq!(
        runc["base_runtime_spec"].as_str(),
        Some("/etc/containerd/devgate-base-spec.json")
    );
    assert_eq!(
        runc["container_annotations"][0].as_str(),
        Some("io.kubernetes.container.terminationMessagePolicy")
    );
    assert!(enabled.starts_with(debian), "{enabled}");
    for l in enabled[debian.len()..].lines() {
        assert!(
            l.ends_with("# devgate install-host") || l.starts_with("# devgate install-host"),
            "{l}"
        );
    }
    // Twice is once: nothing changes, nothing to restart.
    let said = ok_on(&root, "install-host --enable");
    assert!(said.contains("already names devgate's base spec"), "{said}");
    assert!(!said.contains("restart it"), "{said}");
    assert_eq!(fs::read_to_string(&conf).unwrap(), enabled);

    // A config devgate cannot edit safely is refused, naming what to do.
    fs::write(&conf, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  base_runtime_spec = \"/etc/mine.json\"\n").unwrap();
    let out = devgate_on(&root, "install-host --enable");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("already starts from base spec"),
        "{}",
        text(&out)
    );
    fs::write(&conf, &enabled).unwrap();

    let said = ok_on(&root, "uninstall-host");
    assert_eq!(fs::read_to_string(&conf).unwrap(), debian, "{said}");
    assert!(said.contains("removed devgate's lines from"), "{said}");
    // Nothing names the spec now: it goes; the programs wait for the restart.
    assert!(!root.join(SPEC).exists(), "{said}");
    assert!(root.join("usr/local/bin/devgate-hook").is_file());
    let out = devgate_on(&root, "uninstall-host --enable");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // A node without containerd (CRI-O, podman) gets no containerd config.
    let crio = tempdir("host-enable-crio");
    let said = ok_on(&crio, "install-host --enable");
    assert!(said.contains("nothing to enable"), "{said}");
    assert!(!crio.join("etc/containerd/config.toml").exists());
}
