//! poststop: faults during a run reach the termination message, the exit record and
//! `devgate explain`; no fault leaves the app's message alone; unsafe files are refused.

mod common;
use common::*;
use serde_json::json;
use std::fs;
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

/// A devgate env whose kubelet_pods_dir holds one container's termination-log file.
fn env_with_pods(tag: &str) -> (Env, PathBuf, PathBuf) {
    let pods = tempdir(&format!("{tag}-kubelet")).join("pods");
    let env = Env::with(tag, json!({ "kubelet_pods_dir": pods }));
    let c = pods.join("8f0c1a2e/containers/app");
    fs::create_dir_all(&c).unwrap();
    let log = c.join("termination-log");
    fs::write(&log, b"").unwrap();
    (env, pods, log)
}

/// The pod uid and container name containerd's CRI annotations give this container.
const UID: &str = "8f0c1a2e";
const NAME: &str = "app";

fn bind_termination_log(b: &mut Bundle, host: &Path) {
    b.spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/dev/termination-log", "type": "bind", "source": host,
        "options": ["rbind", "rprivate", "rw"]
    }));
    b.spec["annotations"] = json!({"io.kubernetes.cri.sandbox-uid": UID,
                                   "io.kubernetes.cri.container-name": NAME});
}

#[test]
fn fault_during_run_reaches_termination_message_exit_record_and_explain() {
    require_root!();
    let (env, _pods, log) = env_with_pods("fault");
    let mut b = Bundle::new(
        "fault",
        &[
            "sh",
            "-c",
            "echo 'app: CUDA error: unspecified launch failure' > /dev/termination-log; \
                        while [ ! -e /out/go ]; do sleep 0.05; done; exit 3",
        ],
    );
    b.add_device("/dev/zero", "c", 1, 5);
    b.add_hooks(&env, &["prestart", "poststop"]);
    bind_termination_log(&mut b, &log);
    let id = unique_id("fault");
    let running = Running::start(&b, &id);
    wait_for("the app's termination message", || {
        fs::read_to_string(&log)
            .map(|s| !s.is_empty())
            .unwrap_or(false)
    });
    // The fault: an operator cordons the device while the container runs.
    env.ok(&["cordon", "/dev/zero", "--reason", "xid 79 seen on this GPU"]);
    fs::write(b.rootfs().join("out/go"), b"").unwrap();
    let out = running.wait();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));

    let msg = fs::read_to_string(&log).unwrap();
    assert_eq!(
        msg,
        "devgate: DeviceFault/Cordoned on /dev/zero (1:5): cordoned by operator during the run: \"xid 79 seen on this GPU\"\n\
         app: CUDA error: unspecified launch failure\n"
    );
    let exit: serde_json::Value =
        serde_json::from_slice(&fs::read(env.dir.join(format!("state/exits/{id}.json"))).unwrap())
            .unwrap();
    assert_eq!(exit["container_id"], id.as_str());
    assert_eq!(exit["faults"][0]["code"], "DeviceFault/Cordoned");
    // the code the quarantine probe gives the same finding at the next start
    assert_eq!(exit["faults"][0]["reason_code"], "quarantined");
    assert_eq!(exit["termination_message"]["written"], true);
    let explained = env.ok(&["explain", &id]);
    assert!(explained.contains("1 device fault(s)"), "{explained}");
    assert!(
        explained.contains("devgate: DeviceFault/Cordoned on /dev/zero (1:5)"),
        "{explained}"
    );
    let last = env.log_lines().pop().unwrap();
    assert_eq!(last["stage"], "poststop");
    assert_eq!(last["faults"][0]["code"], "DeviceFault/Cordoned");

    // poststop run twice: still one record and one appended line
    let state =
        json!({"ociVersion": "1.0.2", "id": id, "status": "stopped", "bundle": b.dir}).to_string();
    let again = hook(&env, "poststop", &state);
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(fs::read_to_string(&log).unwrap(), msg);
    assert_eq!(
        fs::read_dir(env.dir.join("state/exits")).unwrap().count(),
        1
    );
}

#[test]
fn no_fault_leaves_termination_message_untouched() {
    require_root!();
    let (env, _pods, log) = env_with_pods("nofault");
    let mut b = Bundle::new(
        "nofault",
        &["sh", "-c", "echo 'app: done' > /dev/termination-log"],
    );
    b.add_device("/dev/zero", "c", 1, 5);
    b.add_hooks(&env, &["prestart", "poststop"]);
    bind_termination_log(&mut b, &log);
    let id = unique_id("nofault");
    let out = runtime_run("runc", &b, &id);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read_to_string(&log).unwrap(), "app: done\n");
    let exit: serde_json::Value =
        serde_json::from_slice(&fs::read(env.dir.join(format!("state/exits/{id}.json"))).unwrap())
            .unwrap();
    assert_eq!(exit["faults"], json!([]));
    assert!(exit.get("termination_message").is_none());
}

fn hook(env: &Env, stage: &str, state: &str) -> std::process::Output {
    env.hook_stdin(stage, state.as_bytes())
}

/// prestart and poststop called directly, as a runtime would, with a cordon in between.
fn run_with_fault(env: &Env, source: &Path) -> (std::process::Output, String) {
    let mut b = Bundle::new("direct", &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    bind_termination_log(&mut b, source);
    b.write();
    let id = unique_id("direct");
    let state = b.state_json(&id);
    let pre = hook(env, "prestart", &state);
    assert!(pre.status.success(), "{}", text(&pre));
    env.ok(&["cordon", "1:5", "--reason", "bad"]);
    let post = hook(env, "poststop", &state);
    env.ok(&["uncordon", "1:5"]);
    (post, id)
}

#[test]
fn termination_log_outside_pods_dir_is_not_written() {
    let (env, _pods, _log) = env_with_pods("outside");
    let outside = env.dir.join("outside-log");
    fs::write(&outside, b"host file\n").unwrap();
    let (post, id) = run_with_fault(&env, &outside);
    assert!(post.status.success(), "{}", text(&post));
    assert!(String::from_utf8_lossy(&post.stderr)
        .contains("devgate: DeviceFault/Cordoned on /dev/zero"));
    assert_eq!(fs::read(&outside).unwrap(), b"host file\n");
    let exit: serde_json::Value =
        serde_json::from_slice(&fs::read(env.dir.join(format!("state/exits/{id}.json"))).unwrap())
            .unwrap();
    assert_eq!(exit["termination_message"]["written"], false);
    assert!(exit["termination_message"]["note"]
        .as_str()
        .unwrap()
        .contains("no bind mount of kubelet's termination file"));
}

#[test]
fn termination_log_symlink_and_fifo_are_not_written() {
    let (env, pods, _log) = env_with_pods("symlink");
    let target = env.dir.join("etc-shadow-lookalike");
    fs::write(&target, b"secret\n").unwrap();
    let link = pods.join("8f0c1a2e/containers/app/link-log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (post, _) = run_with_fault(&env, &link);
    assert!(post.status.success(), "{}", text(&post));
    assert_eq!(fs::read(&target).unwrap(), b"secret\n");

    let fifo = pods.join("8f0c1a2e/containers/app/fifo-log");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let started = Instant::now();
    let (post, id) = run_with_fault(&env, &fifo);
    assert!(post.status.success(), "{}", text(&post));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "poststop blocked on a FIFO"
    );
    let exit: serde_json::Value =
        serde_json::from_slice(&fs::read(env.dir.join(format!("state/exits/{id}.json"))).unwrap())
            .unwrap();
    assert!(
        exit["termination_message"]["note"]
            .as_str()
            .unwrap()
            .contains("not a regular file"),
        "{exit}"
    );
}

/// kubelet keeps the file's last 4096 bytes, then a pod's container its share of 12 KiB
/// from the front: devgate's line goes first and whole, the app's last bytes after it.
#[test]
fn a_full_app_message_follows_devgates_whole_line() {
    let (env, _pods, log) = env_with_pods("full");
    for size in [4096, 4050, 9000] {
        let mut app = vec![b'a'; size - 4];
        app.extend_from_slice(b"end\n");
        fs::write(&log, &app).unwrap();
        let (post, _) = run_with_fault(&env, &log);
        assert!(post.status.success(), "{}", text(&post));
        let got = fs::read(&log).unwrap();
        assert_eq!(got.len(), 4096, "{size}");
        let text = String::from_utf8(got).unwrap();
        let (ours, rest) = text.split_once('\n').unwrap();
        assert!(
            ours.starts_with("devgate: DeviceFault/Cordoned on /dev/zero (1:5): ")
                && ours.ends_with("during the run: \"bad\""),
            "{ours:?}"
        );
        assert!(rest.ends_with("aaend\n"), "{size}");
    }
}

#[test]
fn a_reused_container_id_gets_its_own_exit_record() {
    let (env, _pods, log) = env_with_pods("reuse");
    let mut b = Bundle::new("reuse", &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    bind_termination_log(&mut b, &log);
    b.write();
    let state = b.state_json("same-id");
    let exit_file = env.dir.join("state/exits/same-id.json");

    // first run: no fault
    assert!(hook(&env, "prestart", &state).status.success());
    assert!(hook(&env, "poststop", &state).status.success());
    let first: serde_json::Value = serde_json::from_slice(&fs::read(&exit_file).unwrap()).unwrap();
    assert_eq!(first["faults"], json!([]));

    // the same id starts again: the old exit record is gone until this run stops
    assert!(hook(&env, "prestart", &state).status.success());
    assert!(
        !exit_file.exists(),
        "a stale exit record would make this run's poststop a no-op"
    );
    env.ok(&["cordon", "1:5", "--reason", "second run"]);
    let post = hook(&env, "poststop", &state);
    assert!(post.status.success(), "{}", text(&post));
    let second: serde_json::Value = serde_json::from_slice(&fs::read(&exit_file).unwrap()).unwrap();
    assert_eq!(
        second["faults"][0]["code"], "DeviceFault/Cordoned",
        "{second}"
    );
    assert!(fs::read_to_string(&log).unwrap().contains("second run"));
}

/// Runs `b` under runc with a cordon during the run (the fault) and returns the exit record.
fn fault_under_runc(env: &Env, b: &mut Bundle, tag: &str) -> serde_json::Value {
    b.spec["process"]["args"] = json!([
        "sh",
        "-c",
        "touch /out/up; while [ ! -e /out/go ]; do sleep 0.05; done; exit 3"
    ]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.add_hooks(env, &["prestart", "poststop"]);
    let id = unique_id(tag);
    let running = Running::start(b, &id);
    let up = b.rootfs().join("out/up");
    wait_for("the container to run", || up.exists());
    env.ok(&["cordon", "/dev/zero", "--reason", "fault during the run"]);
    fs::write(b.rootfs().join("out/go"), b"").unwrap();
    let out = running.wait();
    env.ok(&["uncordon", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    serde_json::from_slice(&fs::read(env.dir.join(format!("state/exits/{id}.json"))).unwrap())
        .unwrap()
}

/// The attack of issue 10: terminationMessagePath names a read-only subPath mount, whose
/// source is a host file under volume-subpaths. Only kubelet's own file gets the line.
#[test]
fn subpath_named_by_termination_path_is_never_written() {
    require_root!();
    let (env, pods, log) = env_with_pods("subpath");
    let sub = pods.join(UID).join("volume-subpaths/config/app/0");
    fs::create_dir_all(sub.parent().unwrap()).unwrap();
    fs::write(&sub, b"host config\n").unwrap();
    let mut b = Bundle::new("subpath", &["true"]);
    b.spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/etc/app.conf", "type": "bind", "source": sub,
        "options": ["rbind", "rprivate", "ro"]
    }));
    bind_termination_log(&mut b, &log);
    b.spec["annotations"]["io.kubernetes.container.terminationMessagePath"] =
        json!("/etc/app.conf");
    let exit = fault_under_runc(&env, &mut b, "subpath");
    assert_eq!(fs::read(&sub).unwrap(), b"host config\n");
    let msg = fs::read_to_string(&log).unwrap();
    assert!(
        msg.starts_with("devgate: DeviceFault/Cordoned on /dev/zero (1:5)"),
        "{msg:?}"
    );
    assert_eq!(exit["termination_message"]["written"], true, "{exit}");
    assert_eq!(
        exit["termination_message"]["host_path"],
        log.to_str().unwrap()
    );
}

/// kubelet's file name, but a symlink (at the file or at a directory on the way) to a
/// host file: not followed, not written, and the exit record says why.
#[test]
fn symlinked_termination_file_is_not_written_under_runc() {
    require_root!();
    let (env, pods, _log) = env_with_pods("symrunc");
    let target = env.dir.join("host-file");
    fs::write(&target, b"host\n").unwrap();
    let link = pods
        .join(UID)
        .join("containers")
        .join(NAME)
        .join("0badc0de");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let mut b = Bundle::new("symrunc", &["true"]);
    bind_termination_log(&mut b, &link);
    let exit = fault_under_runc(&env, &mut b, "symrunc");
    assert_eq!(fs::read(&target).unwrap(), b"host\n");
    assert_eq!(exit["termination_message"]["written"], false, "{exit}");
    assert!(
        exit["termination_message"]["note"]
            .as_str()
            .unwrap()
            .contains("a component is a symlink"),
        "{exit}"
    );

    // a symlinked directory: <pods>/<uid>/containers/<name> -> a dir elsewhere
    let (env, pods, _log) = env_with_pods("symdir");
    let elsewhere = env.dir.join("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    fs::write(elsewhere.join("0badc0de"), b"host\n").unwrap();
    let cdir = pods.join(UID).join("containers").join(NAME);
    fs::remove_dir_all(&cdir).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &cdir).unwrap();
    let mut b = Bundle::new("symdir", &["true"]);
    bind_termination_log(&mut b, &cdir.join("0badc0de"));
    let exit = fault_under_runc(&env, &mut b, "symdir");
    assert_eq!(fs::read(elsewhere.join("0badc0de")).unwrap(), b"host\n");
    assert_eq!(exit["termination_message"]["written"], false, "{exit}");
}

/// Unmounts on drop, so a failed assertion leaves no mount behind.
struct Unmount(PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The container's directory is another mount (here a tmpfs): reaching kubelet's file
/// would cross a mount point, so it is not written.
#[test]
fn termination_file_across_a_mount_point_is_not_written() {
    require_root!();
    let (env, pods, _log) = env_with_pods("xdev");
    let cdir = pods.join(UID).join("containers").join(NAME);
    nix::mount::mount(
        Some("tmpfs"),
        &cdir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("mode=0755"),
    )
    .unwrap();
    let _guard = Unmount(cdir.clone());
    let file = cdir.join("0badc0de");
    fs::write(&file, b"").unwrap();
    let mut b = Bundle::new("xdev", &["true"]);
    bind_termination_log(&mut b, &file);
    let exit = fault_under_runc(&env, &mut b, "xdev");
    assert_eq!(fs::read(&file).unwrap(), b"");
    assert_eq!(exit["termination_message"]["written"], false, "{exit}");
    assert!(
        exit["termination_message"]["note"]
            .as_str()
            .unwrap()
            .contains("crosses a mount point"),
        "{exit}"
    );
}

/// CRI-O copies a pod's own annotations into the container's spec and sets only its own
/// keys (`io.kubernetes.pod.*`, `io.kubernetes.container.name`) after them: a pod author
/// there writes containerd's keys. They named the pod in the records, the decision log and
/// `devgate explain` (here another team's `kube-system/etcd-0`), and chose whose
/// termination file was looked for. Two runtimes' keys that disagree name nothing.
#[test]
fn a_crio_pod_writing_containerds_keys_names_no_other_pod() {
    let (env, pods, log) = env_with_pods("crio-forged");
    let victim = pods.join("victim-uid/containers/etcd/termination-log");
    fs::create_dir_all(victim.parent().unwrap()).unwrap();
    fs::write(&victim, b"etcd: ok\n").unwrap();
    let mut b = Bundle::new("crio-forged", &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    bind_termination_log(&mut b, &log);
    b.spec["annotations"] = json!({
        // CRI-O's own, set after the pod's
        "io.kubernetes.pod.namespace": "team-a", "io.kubernetes.pod.name": "attacker",
        "io.kubernetes.pod.uid": UID, "io.kubernetes.container.name": NAME,
        // the pod's, copied in by CRI-O
        "io.kubernetes.cri.sandbox-namespace": "kube-system",
        "io.kubernetes.cri.sandbox-name": "etcd-0",
        "io.kubernetes.cri.sandbox-uid": "victim-uid",
        "io.kubernetes.cri.container-name": "etcd",
    });
    b.write();
    let id = unique_id("crio-forged");
    let state = b.state_json(&id);
    let pre = hook(&env, "prestart", &state);
    assert!(pre.status.success(), "{}", text(&pre));
    env.ok(&["cordon", "1:5", "--reason", "bad"]);
    let post = hook(&env, "poststop", &state);
    env.ok(&["uncordon", "1:5"]);
    assert!(post.status.success(), "{}", text(&post));

    assert_eq!(fs::read(&victim).unwrap(), b"etcd: ok\n");
    let exit: serde_json::Value =
        serde_json::from_slice(&fs::read(env.dir.join(format!("state/exits/{id}.json"))).unwrap())
            .unwrap();
    assert!(exit.get("pod").is_none(), "{exit}");
    assert_eq!(exit["termination_message"]["written"], false);
    let note = exit["termination_message"]["note"].as_str().unwrap();
    assert!(note.contains("disagree"), "{note}");
    for line in env.log_lines() {
        assert!(line.get("pod").is_none(), "{line}");
    }
    let explained = env.ok(&["explain", &id]);
    assert!(!explained.contains("kube-system"), "{explained}");
}
