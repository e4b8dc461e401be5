//! `make install DESTDIR=…` / `make uninstall` and `devgate install-host` (the Kubernetes
//! installer's entrypoint) lay out the expected tree, with hook paths that exclude DESTDIR
//! and the host root, and never replace an operator's config.

mod common;
use common::*;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `make` with the test build as BIN; generated files go to a directory of the test's own
/// (GEN), so tests running in parallel do not share target/install.
fn make(dest: &Path, args: &[&str]) -> String {
    let out = Command::new("make")
        .arg("--no-print-directory")
        .arg("-C")
        .arg(repo())
        .args(args)
        .arg(format!("BIN={}", devgate_bin().display()))
        .arg(format!("DESTDIR={}", dest.join("root").display()))
        .arg(format!("GEN={}", dest.join("gen").display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "make {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(p: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

fn assert_hook(v: &Value, bin: &str, args: &[&str]) {
    assert_eq!(v["path"], bin, "{v}");
    assert_eq!(v["args"], serde_json::json!(args), "{v}");
}

#[test]
fn make_install_lays_out_the_tree_and_keeps_operator_config() {
    assert!(
        have("make"),
        "make is not installed: scripts/install-test-deps.sh installs it"
    );
    let work = tempdir("destdir");
    let dest = work.join("root");
    make(&work, &["install", "PREFIX=/opt/dg"]);

    let bin = dest.join("opt/dg/bin/devgate");
    assert_eq!(fs::read(&bin).unwrap(), fs::read(devgate_bin()).unwrap());
    assert_eq!(
        fs::metadata(&bin).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let wrapper = dest.join("opt/dg/bin/devgate-runtime");
    assert_eq!(
        fs::read(&wrapper).unwrap(),
        fs::read(devgate_runtime_bin()).unwrap()
    );
    let front = dest.join("opt/dg/bin/devgate-hook");
    assert_eq!(
        fs::read(&front).unwrap(),
        fs::read(devgate_hook_bin()).unwrap()
    );
    let hooks = dest.join("opt/dg/share/containers/oci/hooks.d");
    let v = json(&hooks.join("devgate.json"));
    assert_eq!(v["version"], "1.0.0");
    assert_eq!(v["stages"], serde_json::json!(["prestart", "poststop"]));
    assert_hook(
        &v["hook"],
        "/opt/dg/bin/devgate-hook",
        &["devgate", "hook", "auto"],
    );
    let config = dest.join("etc/devgate/config.json");
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        fs::read_to_string(repo().join("packaging/config.json")).unwrap()
    );
    let spec = json(&dest.join("etc/containerd/devgate-base-spec.json"));
    assert_hook(
        &spec["hooks"]["prestart"][0],
        "/opt/dg/bin/devgate-hook",
        &["devgate", "hook", "prestart"],
    );
    assert!(dest.join("var/lib/devgate/quarantine").is_dir());

    // Reinstall over an operator's config: kept, the new default beside it.
    fs::write(&config, r#"{"policy":{"default":"warn"}}"#).unwrap();
    let said = make(&work, &["install", "PREFIX=/opt/dg"]);
    assert!(said.contains("kept"), "{said}");
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        r#"{"policy":{"default":"warn"}}"#
    );
    assert!(dest.join("etc/devgate/config.json.new").is_file());

    // Uninstall removes what install put there, and leaves the operator's data.
    make(&work, &["uninstall", "PREFIX=/opt/dg"]);
    assert!(!bin.exists());
    assert!(fs::symlink_metadata(&wrapper).is_err());
    assert!(fs::symlink_metadata(&front).is_err());
    assert!(!hooks.join("devgate.json").exists());
    assert!(!dest.join("etc/containerd/devgate-base-spec.json").exists());
    assert!(config.is_file());
    assert!(dest.join("var/lib/devgate/quarantine").is_dir());
}

#[test]
fn make_install_with_another_sysconfdir_names_the_config_in_the_hooks() {
    let work = tempdir("destdir-etc");
    let dest = work.join("root");
    make(
        &work,
        &["install", "PREFIX=/opt/dg", "SYSCONFDIR=/opt/dg/etc"],
    );
    let v = json(&dest.join("opt/dg/share/containers/oci/hooks.d/devgate.json"));
    assert_hook(
        &v["hook"],
        "/opt/dg/bin/devgate-hook",
        &[
            "devgate",
            "--config",
            "/opt/dg/etc/devgate/config.json",
            "hook",
            "auto",
        ],
    );
    assert!(dest.join("opt/dg/etc/devgate/config.json").is_file());
}

fn install_host(root: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(devgate_bin())
        .arg("install-host")
        .arg("--root")
        .arg(root)
        .args(extra)
        .env_remove("DEVGATE_CONFIG")
        .output()
        .unwrap()
}

#[test]
fn install_host_copies_binary_and_configuration_onto_a_host_root() {
    let root = tempdir("host");
    let out = install_host(&root, &[]);
    assert!(out.status.success(), "{}", text(&out));

    let bin = root.join("usr/local/bin/devgate");
    assert_eq!(fs::read(&bin).unwrap(), fs::read(devgate_bin()).unwrap());
    assert_eq!(
        fs::read(root.join("usr/local/bin/devgate-runtime")).unwrap(),
        fs::read(devgate_runtime_bin()).unwrap()
    );
    assert_eq!(
        fs::read(root.join("usr/local/bin/devgate-hook")).unwrap(),
        fs::read(devgate_hook_bin()).unwrap()
    );
    assert_eq!(
        fs::metadata(&bin).unwrap().permissions().mode() & 0o777,
        0o755
    );
    // Where podman and CRI-O read by default (containers/common's DefaultHooksDirs); they
    // do not read /etc/containers/oci/hooks.d unless hooks_dir names it.
    assert!(!root.join("etc/containers/oci/hooks.d").exists());
    let v = json(&root.join("usr/share/containers/oci/hooks.d/devgate.json"));
    assert_hook(
        &v["hook"],
        "/usr/local/bin/devgate-hook",
        &["devgate", "hook", "auto"],
    );
    let spec = json(&root.join("etc/containerd/devgate-base-spec.json"));
    assert_hook(
        &spec["hooks"]["poststop"][0],
        "/usr/local/bin/devgate-hook",
        &["devgate", "hook", "poststop"],
    );
    let config = root.join("etc/devgate/config.json");
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        fs::read_to_string(repo().join("packaging/config.json")).unwrap()
    );
    assert!(root.join("var/lib/devgate/quarantine").is_dir());

    // An operator's config on the host is kept on a rerun (upgrade).
    let mine = r#"{"policy":{"default":"warn"}}"#;
    fs::write(&config, mine).unwrap();
    let out = install_host(&root, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(&config).unwrap(), mine);

    // --config-file (a ConfigMap) replaces it, but only with a config devgate accepts.
    let cm = root.join("configmap.json");
    fs::write(&cm, r#"{"policy":{"default":"reject"}}"#).unwrap();
    let out = install_host(&root, &["--config-file", cm.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        r#"{"policy":{"default":"reject"}}"#
    );
    fs::write(&cm, r#"{"polcy":{}}"#).unwrap();
    let out = install_host(&root, &["--config-file", cm.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("devgate: error: "), "{err}");
    assert!(err.contains("unknown field `polcy`"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        r#"{"policy":{"default":"reject"}}"#
    );

    // Another hooks directory (a node whose /usr is read-only, with hooks_dir naming it).
    let out = install_host(&root, &["--hooks-dir", "/etc/containers/oci/hooks.d"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(root
        .join("etc/containers/oci/hooks.d/devgate.json")
        .is_file());

    // Bad command lines are one-line errors.
    let out = install_host(Path::new("relative"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an absolute path"));
}

/// A node installed by an older install-host has devgate.json in /etc/containers/oci/hooks.d,
/// which podman and CRI-O read only where hooks_dir names it (the old instructions): a rerun
/// refreshes that file too, so such a node keeps running the current hook. Same name, so a
/// runtime reading both directories runs it once.
#[test]
fn install_host_refreshes_the_hook_an_older_install_left_in_etc() {
    let root = tempdir("host-upgrade");
    let old = root.join("etc/containers/oci/hooks.d/devgate.json");
    fs::create_dir_all(old.parent().unwrap()).unwrap();
    fs::write(&old, r#"{"version":"1.0.0","hook":{"path":"/old"},"when":{"always":true},"stages":["prestart"]}"#).unwrap();
    let out = install_host(&root, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read(&old).unwrap(),
        fs::read(root.join("usr/share/containers/oci/hooks.d/devgate.json")).unwrap()
    );
    assert!(
        text(&out).contains(&format!("devgate: installed {}", old.display())),
        "{}",
        text(&out)
    );
}

/// The DaemonSet's ConfigMap holds the default config, and its init container's command
/// line is one install-host accepts (run here against a scratch root).
#[test]
fn daemonset_manifest_matches_the_installer() {
    let yaml = fs::read_to_string(repo().join("packaging/kubernetes/daemonset.yaml")).unwrap();
    let lines: Vec<&str> = yaml.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == "config.json: |")
        .expect("ConfigMap key config.json");
    let body: Vec<&str> = lines[start + 1..]
        .iter()
        .take_while(|l| l.starts_with("    "))
        .map(|l| &l[4..])
        .collect();
    let cm: Value = serde_json::from_str(&body.join("\n")).unwrap();
    assert_eq!(cm, json(&repo().join("packaging/config.json")));

    let start = lines
        .iter()
        .position(|l| l.trim() == "- install-host")
        .expect("install-host in the init container's command");
    let args: Vec<&str> = lines[start..]
        .iter()
        .take_while(|l| l.trim_start().starts_with("- ") && !l.contains(':'))
        .map(|l| l.trim_start().trim_start_matches("- "))
        .collect();
    assert_eq!(
        args,
        [
            "install-host",
            "--root",
            "/host",
            "--prefix",
            "/usr/local",
            "--config-file",
            "/etc/devgate-configmap/config.json",
            "--enable",
            "--restart"
        ]
    );
    let root = tempdir("ds-host");
    let cm_file = root.join("cm.json");
    fs::write(&cm_file, body.join("\n")).unwrap();
    let mut argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    argv[2] = root.join("host").display().to_string();
    argv[6] = cm_file.display().to_string();
    // A scratch root runs no systemd: the restart is the booted node's test
    // (tests/e2e_install_enable.rs); here, what the installer writes.
    argv.retain(|a| a != "--restart");
    // With containerd's config there, so that --enable writes it too.
    let conf = root.join("host/etc/containerd/config.toml");
    fs::create_dir_all(conf.parent().unwrap()).unwrap();
    fs::write(&conf, "version = 2\n").unwrap();
    let out = Command::new(devgate_bin()).args(&argv).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(root.join("host/usr/local/bin/devgate").is_file());
    assert!(
        fs::read_to_string(&conf)
            .unwrap()
            .contains("# devgate install-host"),
        "{}",
        text(&out)
    );
    // Every host path install-host wrote is under one the DaemonSet mounts writable.
    let mounts: Vec<&str> = lines
        .iter()
        .filter(|l| !l.contains("readOnly: true"))
        .filter_map(|l| l.split("mountPath: ").nth(1))
        .filter_map(|m| m.split([' ', ',']).next())
        .collect();
    let host = root.join("host");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in said.lines() {
        let Some(p) = line
            .split(' ')
            .find(|w| w.starts_with(host.to_str().unwrap()))
        else {
            continue;
        };
        let p = format!("/host{}", &p[host.to_str().unwrap().len()..]);
        assert!(
            mounts
                .iter()
                .any(|m| p.starts_with(&format!("{m}/")) || p == *m),
            "{p} is not under a mount of the DaemonSet: {mounts:?}"
        );
    }
}

/// An image with devgate alone (no static programs beside it) still installs a working
/// node: the hook front and the wrapper become links to devgate, which does their jobs
/// when started by their names.
#[test]
fn install_host_links_the_fronts_to_devgate_where_they_are_missing() {
    let image = tempdir("lone-image");
    let lone = image.join("devgate");
    fs::copy(devgate_bin(), &lone).unwrap();
    let root = tempdir("lone-host");
    let out = Command::new(&lone)
        .arg("install-host")
        .arg("--root")
        .arg(&root)
        .env_remove("DEVGATE_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for name in ["devgate-hook", "devgate-runtime"] {
        let p = root.join("usr/local/bin").join(name);
        assert_eq!(fs::read_link(&p).unwrap(), Path::new("devgate"), "{name}");
        assert!(
            text(&out).contains(&format!("devgate: installed {} -> devgate", p.display())),
            "{}",
            text(&out)
        );
    }
    // The hook files run the front by its name, which is devgate there.
    let v = json(&root.join("usr/share/containers/oci/hooks.d/devgate.json"));
    assert_eq!(v["hook"]["path"], "/usr/local/bin/devgate-hook");
}
