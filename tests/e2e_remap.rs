//! Remap end to end on both node shapes: this host (hybrid, runc on the v1 devices
//! controller) and a true cgroup v2 node (a private mount namespace with cgroup2 at
//! /sys/fs/cgroup, see common/node.rs), under the real runc and crun, and against
//! stand-in containers for the races (32 prestarts for 2 spares) and for crashes during
//! lease writes.
//!
//! The spares are /dev/fuse and /dev/loop-control: no runtime allows them by default, so a
//! spare that opens in the container was granted by the remap and nothing else.

mod common;
use common::fake::{have_v1_devices, FakeContainer};
use common::fake_nvml::*;
use common::*;
use devgate::store::lease::{Leases, Slot};
use serde_json::{json, Value};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Child;
use std::time::Duration;

const SPARE: &str = "/dev/fuse";
const SPARE_NUM: (u32, u32) = (10, 229);
const SPARE2: &str = "/dev/loop-control";
const SPARE2_NUM: (u32, u32) = (10, 237);

fn remap_env(tag: &str, spares: &[&str]) -> Env {
    Env::with(
        tag,
        json!({"policy": {"classes": {"char": "remap"}}, "spares": {"char": spares}}),
    )
}

/// Whether `node` can be made here; the v2 node needs only root, the host node its v1
/// devices controller.
fn node_ready(node: Node) -> bool {
    if node == Node::Host && !have_v1_devices() {
        eprintln!("skipped: no v1 devices controller at /sys/fs/cgroup/devices");
        return false;
    }
    for spare in [SPARE, SPARE2] {
        assert!(
            Path::new(spare).exists(),
            "{spare} is missing on this machine; the remap tests use it as a spare"
        );
    }
    true
}

/// What the container reports about its devices, one `key=value` per line.
const PROBE_SCRIPT: &str = "\
rm -f /tmp/bad /tmp/spare /tmp/other; \
if true 2>/out/zero.err <> /dev/zero; then echo zero-open=ok; else echo zero-open=failed; fi; \
stat -c 'zero-node=%t:%T' /dev/zero; \
if mknod /tmp/bad c 1 5 2>/out/bad.err; then \
  if true 2>/out/bad.err <> /tmp/bad; then echo bad=opened; else echo bad=open-denied; fi; \
else echo bad=mknod-denied; fi; \
mknod /tmp/spare c 10 229 2>/out/spare.err; \
if true 2>>/out/spare.err <> /tmp/spare; then echo spare=opened; else echo spare=denied; fi; \
if mknod /tmp/other c 10 237 2>/dev/null && true <> /tmp/other 2>/dev/null; then echo other=opened; else echo other=denied; fi; \
rm -f /tmp/bad /tmp/spare /tmp/other";

/// runc shows a hook's stderr only when the hook fails, and then with quotes escaped.
fn says(all: &str, line: &str) -> bool {
    all.contains(line) || all.contains(&line.replace('"', "\\\""))
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_default()
}

/// A bundle asking for /dev/zero, its prestart hook's stderr kept in a file (runtimes drop
/// a successful hook's stderr), and a poststop hook.
fn remap_bundle(env: &Env, tag: &str, cmd: &str) -> (Bundle, std::path::PathBuf) {
    let mut b = Bundle::new(tag, &["sh", "-c", cmd]);
    b.add_device("/dev/zero", "c", 1, 5);
    let hook_err = b.dir.join("prestart.err");
    b.spec["hooks"]["prestart"] = json!([{"path": "/bin/sh", "args": ["sh", "-c",
        format!("exec {} --config {} hook prestart 2>>{}", devgate_bin().display(), env.config.display(), hook_err.display())]}]);
    b.add_hooks(env, &["poststop"]);
    (b, hook_err)
}

/// The whole remap story under one runtime: remapped, enforced, recorded, released,
/// remapped again, then rejected with no healthy spare left.
fn remap_cycle(rt: Runtime) {
    let env = remap_env(&format!("rm-{}", rt.node.name()), &[SPARE]);
    env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
    let (b, hook_err) = remap_bundle(&env, "rm", &format!("({PROBE_SCRIPT}) > /out/ran"));
    let id = unique_id(rt.node.name());
    let out = runtime_run_on(rt, &b, &id);
    let all = text(&out) + &read(&hook_err);
    assert!(out.status.success(), "{}: {all}", rt.name());
    let stderr = read(&hook_err);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("devgate: remapped"))
        .collect();
    assert_eq!(
        lines,
        vec![format!(
            r#"devgate: remapped /dev/zero (1:5) -> {SPARE} (10:229): quarantined by operator: "x""#
        )],
        "{all}"
    );

    // inside: the container's /dev/zero is the spare, a node made for 1:5 is refused, an
    // ungranted device too
    let ran = read(&b.marker());
    let out_file = |n: &str| read(&b.rootfs().join("out").join(n));
    assert!(ran.contains("zero-node=a:e5"), "{ran}");
    assert!(
        ran.contains("zero-open=ok"),
        "{ran}\n{}",
        out_file("zero.err")
    );
    assert!(
        ran.contains("bad=open-denied") || ran.contains("bad=mknod-denied"),
        "{ran}"
    );
    assert!(
        out_file("bad.err").contains("Operation not permitted"),
        "{}",
        out_file("bad.err")
    );
    assert!(
        ran.contains("spare=opened"),
        "{ran}\n{}",
        out_file("spare.err")
    );
    assert!(ran.contains("other=denied"), "the probe can fail: {ran}");

    // recorded: log line, record, explain
    let last = env.decisions().pop().expect("a decision line");
    assert_eq!(last["action"], "remap", "{last}");
    assert_eq!(
        last["remaps"][0]["spare"],
        json!({"type": "c", "major": 10, "minor": 229})
    );
    assert_eq!(last["remaps"][0]["spare_path"], SPARE);
    let cg = last["remaps"][0]["cgroup"].as_str().unwrap();
    match rt.node {
        Node::Host => assert!(cg.starts_with("cgroup v1 /sys/fs/cgroup/devices/"), "{cg}"),
        Node::V2 => assert!(
            cg.starts_with(&format!("cgroup v2 /sys/fs/cgroup/{id}: device programs ["))
                && cg.contains("] extended, replaced in place as ["),
            "{cg}"
        ),
    }
    let explained = env.ok(&["explain", &id]);
    assert!(
        explained.contains(&format!(
            r#"remapped /dev/zero (1:5) -> {SPARE} (10:229): quarantined by operator: "x""#
        )),
        "{explained}"
    );
    assert!(
        explained.contains("/dev/zero is now c 10:229 (mode 666, uid 0, gid 0)"),
        "{explained}"
    );

    // poststop gave the spare back
    let status: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let spare = status
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["host_path"] == SPARE)
        .expect("the spare in status");
    assert!(spare["roles"].as_array().unwrap().contains(&json!("spare")));
    assert_eq!(spare["lease"], Value::Null, "{spare}");

    // a second container gets the same spare again
    let out = runtime_run_on(rt, &b, &unique_id(rt.node.name()));
    assert!(out.status.success(), "{}", text(&out));

    // with the only spare cordoned too, the container is rejected saying why
    env.ok(&["cordon", SPARE, "--reason", "spare bad"]);
    fs::remove_file(b.marker()).unwrap();
    let out = runtime_run_on(rt, &b, &unique_id(rt.node.name()));
    let all = text(&out) + &read(&hook_err);
    assert!(!out.status.success(), "{all}");
    assert!(
        says(
            &all,
            &format!(
                r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "x"; remap impossible: no free healthy spare of class char ({SPARE} unhealthy: quarantined by operator: "spare bad"); policy remap"#
            )
        ),
        "{all}"
    );
    assert!(!b.marker().exists(), "the process ran although rejected");
}

#[test]
fn runc_v1_remap_cycle() {
    require_root!();
    if node_ready(Node::Host) {
        remap_cycle(Runtime::RUNC);
    }
}

#[test]
fn runc_v2_remap_cycle() {
    require_root!();
    if node_ready(Node::V2) {
        remap_cycle(Runtime::RUNC_V2);
    }
}

#[test]
fn crun_v2_with_cgroups_remap_cycle() {
    require_root!();
    assert!(
        have("crun"),
        "crun is not installed: .ci/run must install it"
    );
    if node_ready(Node::V2) {
        remap_cycle(Runtime::CRUN_V2);
    }
}

/// Two hooks that each prepend rules to the container's device programs, as NVIDIA's
/// legacy hook and devgate do: the second must keep what the first added. Here both are
/// devgate with its own config, remapping one device each: /dev/zero to /dev/fuse, then
/// /dev/full to /dev/loop-control. A remap rebuilt from the spec would drop the first
/// hook's spare.
#[test]
fn runc_second_hook_keeps_the_first_hooks_rules() {
    require_root!();
    for node in Node::ALL {
        if !node_ready(node) {
            continue;
        }
        let first = remap_env(&format!("rm-first-{}", node.name()), &[SPARE]);
        first.ok(&["cordon", "/dev/zero", "--reason", "first"]);
        let second = remap_env(&format!("rm-second-{}", node.name()), &[SPARE2]);
        second.ok(&["cordon", "/dev/full", "--reason", "second"]);
        let probe = "for d in zero full; do if true 2>/dev/null <> /dev/$d; then echo $d=opened; \
                     else echo $d=denied; fi; done; \
                     for n in 5 7; do if mknod /tmp/b$n c 1 $n 2>/dev/null && true 2>/dev/null <> /tmp/b$n; \
                     then echo 1:$n=opened; else echo 1:$n=denied; fi; rm -f /tmp/b$n; done; \
                     stat -c '%n=%t:%T' /dev/zero /dev/full";
        let mut b = Bundle::new("rm-two", &["sh", "-c", &format!("({probe}) > /out/ran")]);
        b.add_device("/dev/zero", "c", 1, 5);
        b.add_device("/dev/full", "c", 1, 7);
        b.add_hooks(&first, &["prestart", "poststop"]);
        b.add_hooks(&second, &["prestart", "poststop"]);
        let rt = Runtime {
            node,
            ..Runtime::RUNC
        };
        let out = runtime_run_on(rt, &b, &unique_id("two"));
        assert!(out.status.success(), "{}: {}", rt.name(), text(&out));
        let ran = read(&b.marker());
        for want in [
            "zero=opened",
            "full=opened",
            "1:5=denied",
            "1:7=denied",
            "/dev/zero=a:e5",
            "/dev/full=a:ed",
        ] {
            assert!(
                ran.lines().any(|l| l == want),
                "{}: {want}: {ran}",
                rt.name()
            );
        }
        assert_eq!(first.decisions().pop().unwrap()["action"], "remap");
        assert_eq!(second.decisions().pop().unwrap()["action"], "remap");
    }
}

#[test]
fn runc_remap_without_spare_configured_is_rejected() {
    require_root!();
    for node in Node::ALL {
        if !node_ready(node) {
            continue;
        }
        let env = Env::with(
            &format!("rm-nospare-{}", node.name()),
            json!({"policy": {"classes": {"char": "remap"}}}),
        );
        env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
        let mut b = Bundle::new("rm-nospare", &["sh", "-c", "echo ran > /out/ran"]);
        b.add_device("/dev/zero", "c", 1, 5);
        b.add_hooks(&env, &["prestart", "poststop"]);
        let rt = Runtime {
            node,
            ..Runtime::RUNC
        };
        let out = runtime_run_on(rt, &b, &unique_id("ns"));
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(
            says(
                &all,
                r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "x"; remap impossible: no spare configured for class char; policy remap"#
            ),
            "{}: {all}",
            rt.name()
        );
        assert!(!b.marker().exists());
    }
}

/// `hostUsers: false`: the container's /dev belongs to its user namespace, where a node the
/// hook makes cannot be opened. The hook refuses the remap in one line, before touching it.
#[test]
fn runc_user_namespaced_container_is_not_remapped() {
    require_root!();
    for node in Node::ALL {
        if !node_ready(node) {
            continue;
        }
        let env = remap_env(&format!("rm-userns-{}", node.name()), &[SPARE]);
        env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
        let mut b = Bundle::new("rm-userns", &["sh", "-c", "echo ran > /out/ran"]);
        b.add_device("/dev/zero", "c", 1, 5);
        b.add_hooks(&env, &["prestart", "poststop"]);
        // A network namespace too: sysfs is mounted only by its netns's owner.
        let ns = b.spec["linux"]["namespaces"].as_array_mut().unwrap();
        ns.push(json!({"type": "user"}));
        ns.push(json!({"type": "network"}));
        let map = json!([{"containerID": 0, "hostID": 0, "size": 65536}]);
        b.spec["linux"]["uidMappings"] = map.clone();
        b.spec["linux"]["gidMappings"] = map;
        let rt = Runtime {
            node,
            ..Runtime::RUNC
        };
        let out = runtime_run_on(rt, &b, &unique_id("rm-userns"));
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(
            says(
                &all,
                r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "x"; remap impossible: the container has its own user namespace (hostUsers: false)"#
            ),
            "{}: {all}",
            rt.name()
        );
        assert!(!b.marker().exists());
        assert!(lease_files(&env).is_empty(), "no spare taken");
    }
}

#[test]
fn runc_rootfs_with_dev_symlink_is_rejected_and_host_untouched() {
    require_root!();
    for node in Node::ALL {
        if !node_ready(node) {
            continue;
        }
        let env = remap_env(&format!("rm-sym-{}", node.name()), &[SPARE]);
        env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
        let mut b = Bundle::new("rm-sym", &["sh", "-c", "echo ran > /out/ran"]);
        b.add_device("/dev/zero", "c", 1, 5);
        b.add_hooks(&env, &["prestart", "poststop"]);
        // The container's /dev is a symlink to an absolute path outside the rootfs: a
        // scratch directory this test owns, standing in for a host directory such as /etc.
        // It holds a /dev/zero (1:5) of its own, the node devgate would replace if it
        // followed the link. runc itself creates its /dev symlinks (fd, stdin, ...) through
        // that link before the hook runs; what is checked is what devgate did.
        let scratch = b.dir.join("host-lookalike");
        fs::create_dir(&scratch).unwrap();
        mknod_char(&scratch.join("zero"), 1, 5);
        fs::remove_dir(b.rootfs().join("dev")).unwrap();
        std::os::unix::fs::symlink(&scratch, b.rootfs().join("dev")).unwrap();
        let rt = Runtime {
            node,
            ..Runtime::RUNC
        };
        let out = runtime_run_on(rt, &b, &unique_id("sym"));
        let all = text(&out);
        assert!(!out.status.success(), "{all}");
        assert!(says(&all, "devgate: rejected /dev/zero (1:5): quarantined by operator: \"x\"; remap impossible: cannot replace the node in the container: container path /dev/zero: /dev is a symlink in the container's rootfs; devgate never follows a container's symlinks; policy remap"), "{}: {all}", rt.name());
        assert!(!b.marker().exists());
        // devgate followed the link nowhere: neither the link's target on the host nor the
        // same path under the rootfs (where runc made the container's nodes) got the spare's
        // node or one of devgate's temporary names, and the host's /dev/zero is still 1:5.
        let under_rootfs = b.rootfs().join(scratch.strip_prefix("/").unwrap());
        for dir in [&scratch, &under_rootfs] {
            for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                assert!(!name.starts_with(".devgate"), "devgate left {dir:?}/{name}");
                let m = fs::symlink_metadata(e.path()).unwrap();
                assert_ne!(
                    (libc::major(m.rdev()), libc::minor(m.rdev())),
                    SPARE_NUM,
                    "{dir:?}/{name} is the spare's node"
                );
            }
        }
        assert_eq!(char_node(&scratch.join("zero")), (1, 5));
        assert_eq!(char_node(Path::new("/dev/zero")), (1, 5));
        // the lease taken for it was given back
        let leases = Leases::new(&env.dir.join("state")).list().unwrap();
        assert!(leases.is_empty(), "{}: {leases:?}", rt.name());
    }
}

fn mknod_char(path: &Path, major: u64, minor: u64) {
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(major, minor),
    )
    .unwrap();
}

/// major:minor of a char node, without following a final symlink.
fn char_node(path: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(path).unwrap();
    assert!(
        m.file_type().is_char_device(),
        "{path:?} is not a char node"
    );
    (libc::major(m.rdev()), libc::minor(m.rdev()))
}

fn hook(env: &Env, node: Node, stage: &str) -> Child {
    env.hook_cmd_on(node, stage).spawn().unwrap()
}

fn run_hook(env: &Env, node: Node, stage: &str, f: &FakeContainer) -> std::process::Output {
    let mut k = hook(env, node, stage);
    k.stdin
        .take()
        .unwrap()
        .write_all(f.state_json().as_bytes())
        .unwrap();
    k.wait_with_output().unwrap()
}

fn lease_files(env: &Env) -> Vec<(String, Value)> {
    let dir = env.dir.join("state/leases");
    let mut out = Vec::new();
    for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let text = fs::read_to_string(e.path()).unwrap();
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|err| panic!("lease file {name} does not parse: {err}: {text:?}"));
        out.push((name, v));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn thirty_two_prestarts_two_spares(node: Node) {
    let env = remap_env(&format!("rm-conc-{}", node.name()), &[SPARE, SPARE2]);
    env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
    let tag = std::process::id();
    let fakes: Vec<FakeContainer> = (0..32)
        .map(|i| FakeContainer::on(node, &format!("c{tag}-{}-{i}", node.name())))
        .collect();
    for f in &fakes {
        assert!(f.opens("/dev/zero") && !f.opens(SPARE), "runc-like start");
    }
    let mut kids: Vec<Child> = fakes.iter().map(|_| hook(&env, node, "prestart")).collect();
    for (k, f) in kids.iter_mut().zip(&fakes) {
        k.stdin
            .take()
            .unwrap()
            .write_all(f.state_json().as_bytes())
            .unwrap();
    }
    let outs: Vec<_> = kids
        .into_iter()
        .map(|k| k.wait_with_output().unwrap())
        .collect();
    let mut winners = Vec::new();
    for (i, o) in outs.iter().enumerate() {
        let err = String::from_utf8_lossy(&o.stderr);
        match o.status.code() {
            Some(0) => {
                assert!(err.starts_with("devgate: remapped /dev/zero (1:5) -> /dev/"), "{err}");
                winners.push(i);
            }
            Some(1) => assert!(
                err.starts_with(&format!(r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "x"; remap impossible: no free healthy spare of class char ({SPARE} leased to "#))
                    && err.contains(&format!("; {SPARE2} leased to "))
                    && err.trim_end().ends_with("; policy remap"),
                "{err}"
            ),
            c => panic!("prestart {i} exited {c:?}: {err}"),
        }
    }
    assert_eq!(winners.len(), 2, "exactly two remaps");
    let leases = lease_files(&env);
    assert_eq!(leases.len(), 2, "{leases:?}");
    let holders: Vec<&str> = leases
        .iter()
        .map(|(_, v)| v["container_id"].as_str().unwrap())
        .collect();
    assert_ne!(holders[0], holders[1], "one spare each");
    let mut nodes = Vec::new();
    for (i, f) in fakes.iter().enumerate() {
        if winners.contains(&i) {
            assert!(holders.contains(&f.id.as_str()));
            let n = f.node();
            assert!(n == SPARE_NUM || n == SPARE2_NUM, "{n:?}");
            nodes.push(n);
            let (mine, other) = if n == SPARE_NUM {
                (SPARE, SPARE2)
            } else {
                (SPARE2, SPARE)
            };
            assert!(
                !f.opens("/dev/zero"),
                "{}: the bad device still opens",
                f.id
            );
            assert!(f.opens(mine), "{}: its spare {mine} does not open", f.id);
            assert!(!f.opens(other), "{}: another's spare {other} opens", f.id);
            assert!(f.opens("/dev/null"), "{}: the rest of its rules lost", f.id);
        } else {
            assert_eq!(f.node(), (1, 5), "a rejected container's node is untouched");
            assert!(f.opens("/dev/zero") && !f.opens(SPARE) && !f.opens(SPARE2));
        }
    }
    assert_ne!(nodes[0], nodes[1], "no spare given twice");

    // status shows both leases
    let status: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let leased: Vec<&Value> = status
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["lease"].is_null())
        .collect();
    assert_eq!(leased.len(), 2, "{status}");

    // every poststop at once: both spares free
    let mut kids: Vec<Child> = fakes.iter().map(|_| hook(&env, node, "poststop")).collect();
    for (k, f) in kids.iter_mut().zip(&fakes) {
        k.stdin
            .take()
            .unwrap()
            .write_all(f.state_json().as_bytes())
            .unwrap();
    }
    for k in kids {
        let o = k.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(lease_files(&env).is_empty());
    // and poststop again is harmless
    let o = run_hook(&env, node, "poststop", &fakes[winners[0]]);
    assert!(o.status.success());
}

#[test]
fn thirty_two_prestarts_two_spares_v1() {
    require_root!();
    if node_ready(Node::Host) {
        thirty_two_prestarts_two_spares(Node::Host);
    }
}

#[test]
fn thirty_two_prestarts_two_spares_v2() {
    require_root!();
    if node_ready(Node::V2) {
        thirty_two_prestarts_two_spares(Node::V2);
    }
}

/// A pid whose process is in another cgroup than its spec's cgroupsPath (a pid reused by
/// another process), or in the hierarchy's root, is never edited.
#[test]
fn wrong_or_root_cgroup_is_never_edited() {
    require_root!();
    for node in Node::ALL {
        if !node_ready(node) {
            continue;
        }
        let env = remap_env(&format!("rm-wrongcg-{}", node.name()), &[SPARE]);
        env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
        let f = FakeContainer::on(node, &format!("wcg{}-{}", std::process::id(), node.name()));
        let mut spec: Value = serde_json::from_str(&read(&f.bundle.join("config.json"))).unwrap();
        spec["linux"]["cgroupsPath"] = json!("/kubepods/pod1/other");
        fs::write(f.bundle.join("config.json"), spec.to_string()).unwrap();
        let o = run_hook(&env, node, "prestart", &f);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!(
                "remap impossible: the container's process is in cgroup \"/dg-fake-{}\", not where its spec puts it (cgroupsPath \"/kubepods/pod1/other\"); its pid may belong to another process now",
                f.id
            )),
            "{err}"
        );
        assert_eq!(f.node(), (1, 5));
        assert!(f.opens("/dev/zero") && !f.opens(SPARE));
        assert!(lease_files(&env).is_empty());

        // the process moved into the root cgroup, its spec naming the root
        spec["linux"]["cgroupsPath"] = json!("/");
        fs::write(f.bundle.join("config.json"), spec.to_string()).unwrap();
        let root = f.cgroup.parent().unwrap().join("cgroup.procs");
        fs::write(&root, f.pid().to_string()).unwrap();
        let o = run_hook(&env, node, "prestart", &f);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains("; devgate never edits the root cgroup; policy remap"),
            "{err}"
        );
        assert_eq!(f.node(), (1, 5));
        assert!(lease_files(&env).is_empty());
        // back, so that the fake's cgroup can be removed
        fs::write(f.cgroup.join("cgroup.procs"), f.pid().to_string()).unwrap();
    }
}

/// The hook's container pid had exited before the hook ran: no pidfd, nothing edited.
#[test]
fn exited_container_process_is_never_edited() {
    require_root!();
    let env = remap_env("rm-exited", &[SPARE]);
    env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
    let mut f = FakeContainer::on(Node::V2, &format!("gone{}", std::process::id()));
    let state = f.state_json();
    let pid = f.pid();
    f.child.kill().unwrap();
    f.child.wait().unwrap();
    let mut k = hook(&env, Node::V2, "prestart");
    k.stdin.take().unwrap().write_all(state.as_bytes()).unwrap();
    let o = k.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "remap impossible: cannot open a pidfd for container process {pid}: no such process"
        )),
        "{err}"
    );
    assert!(lease_files(&env).is_empty());
}

/// A GPU named only by NVIDIA_VISIBLE_DEVICES was never granted to the pod: under a remap
/// policy it is gated (here rejected, NVML says it is broken) and no spare is leased or
/// granted for it, even with a node for it prepared in the rootfs.
#[test]
fn selector_only_gpu_gets_no_spare() {
    require_root!();
    let node = GpuNode::new("rm-sel");
    let mut cfg = node.config();
    cfg["policy"] = json!({"classes": {"nvidia-gpu": "remap"}});
    cfg["spares"] = json!({"nvidia-gpu": [node.dev_root.join("nvidia7")]});
    let env = Env::with("rm-sel", cfg);
    let broken = write_scenario(
        &node.dir,
        "broken",
        &node_with(
            1,
            json!({"remapped_rows": {"correctable": 0, "uncorrectable": 3, "pending": false, "failure": true}}),
        ),
    );
    let mut b = Bundle::new("rm-sel", &["sh", "-c", "echo ran > /out/ran"]);
    b.spec["process"]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!("NVIDIA_VISIBLE_DEVICES=1"));
    // what a pod could prepare: nodes for the GPU and for the spare in its rootfs
    for (name, minor) in [("nvidia1", 1), ("nvidia7", 7)] {
        nix::sys::stat::mknod(
            &b.rootfs().join("dev").join(name),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, minor),
        )
        .unwrap();
    }
    b.add_hooks(&env, &["prestart", "poststop"]);
    for stage in ["prestart", "poststop"] {
        for h in b.spec["hooks"][stage].as_array_mut().unwrap() {
            h["env"] = json!([format!("FAKE_NVML_CONFIG={}", broken.display())]);
        }
    }
    let out = runtime_run("runc", &b, &unique_id("sel"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        says(&all, "policy remap; not remapped: named only by NVIDIA_VISIBLE_DEVICES, not granted by the spec"),
        "{all}"
    );
    assert!(!b.marker().exists());
    let last = env.decisions().pop().expect("a decision line");
    assert_eq!(last["action"], "reject", "{last}");
    assert_eq!(last["remaps"], Value::Null, "{last}");
    assert!(lease_files(&env).is_empty(), "no spare leased");
}

/// A small xorshift so the kill times differ run to run without a dependency.
fn rand(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn killed_at_random_during_lease_writes_leaves_a_ledger_that_parses() {
    require_root!();
    if !node_ready(Node::Host) {
        return;
    }
    let env = remap_env("rm-crash", &[SPARE]);
    env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
    let f = FakeContainer::new(&format!("crash{}", std::process::id()));
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let leases = Leases::new(&env.dir.join("state"));
    // How long a whole hook takes here, so the kills land anywhere inside one.
    let mut span = [0u64; 2];
    for (j, stage) in ["prestart", "poststop"].iter().enumerate() {
        let t = std::time::Instant::now();
        let o = run_hook(&env, Node::Host, stage, &f);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        span[j] = t.elapsed().as_micros() as u64 + 1;
    }
    let mut killed = 0;
    const ROUNDS: usize = 200;
    for i in 0..ROUNDS {
        let stage = if i % 2 == 0 { "prestart" } else { "poststop" };
        let mut k = hook(&env, Node::Host, stage);
        k.stdin
            .take()
            .unwrap()
            .write_all(f.state_json().as_bytes())
            .unwrap();
        std::thread::sleep(Duration::from_micros(rand(&mut seed) % span[i % 2]));
        if k.try_wait().unwrap().is_none() {
            killed += 1;
        }
        let _ = k.kill();
        let _ = k.wait();
        for (_, v) in lease_files(&env) {
            assert_eq!(v["container_id"], f.id.as_str());
        }
        for (num, slot) in leases.list().unwrap() {
            assert!(matches!(slot, Slot::Held(_)), "{num}: {slot:?}");
        }
    }
    eprintln!("{killed} of {ROUNDS} hooks killed while running (spans {span:?} us)");
    assert!(
        killed > 0,
        "no hook was ever killed mid-run; the test proved nothing"
    );
    // the ledger still works: a clean prestart remaps, a clean poststop frees
    let o = run_hook(&env, Node::Host, "prestart", &f);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(f.node(), SPARE_NUM);
    assert_eq!(lease_files(&env).len(), 1);
    let o = run_hook(&env, Node::Host, "poststop", &f);
    assert!(o.status.success());
    assert!(lease_files(&env).is_empty());
    let strays: Vec<_> = fs::read_dir(env.dir.join("state/leases"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp."))
        .collect();
    assert!(
        strays.is_empty(),
        "temp files left after a clean run: {strays:?}"
    );
}
