//! Remap end to end: under the real runc on cgroup v1, and against stand-in containers for
//! the races (32 prestarts for 2 spares) and for crashes during lease writes.

mod common;
use common::fake::{have_v1_devices, FakeContainer};
use common::*;
use devgate::store::lease::{Leases, Slot};
use serde_json::{json, Value};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Child;
use std::time::Duration;

fn remap_env(tag: &str, spares: &[&str]) -> Env {
    Env::with(
        tag,
        json!({"policy": {"classes": {"char": "remap"}}, "spares": {"char": spares}}),
    )
}

fn require_v1() -> bool {
    if !have_v1_devices() {
        eprintln!("skipped: no v1 devices controller at /sys/fs/cgroup/devices");
        return false;
    }
    true
}

const PROBE_SCRIPT: &str = "\
if echo x > /dev/zero 2>/out/zero.err; then echo zero-write=ok; else echo zero-write=failed; fi; \
stat -c 'zero-node=%t:%T' /dev/zero; \
mknod /tmp/bad c 1 5 && echo mknod-bad=ok; \
if head -c 1 /tmp/bad >/dev/null 2>/out/bad.err; then echo open-bad=ok; else echo open-bad=failed; fi; \
mknod /tmp/spare c 1 7; \
if head -c 1 /tmp/spare >/dev/null 2>/out/spare.err; then echo open-spare=ok; else echo open-spare=failed; fi; \
rm -f /tmp/bad /tmp/spare";

/// runc shows a hook's stderr only when the hook fails, and then with quotes escaped.
fn says(all: &str, line: &str) -> bool {
    all.contains(line) || all.contains(&line.replace('"', "\\\""))
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_default()
}

#[test]
fn runc_v1_remap_zero_to_full_and_back() {
    require_root!();
    if !require_v1() {
        return;
    }
    let env = remap_env("rm-v1", &["/dev/full"]);
    env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
    let mut b = Bundle::new(
        "rm-v1",
        &["sh", "-c", &format!("({PROBE_SCRIPT}) > /out/ran")],
    );
    b.add_device("/dev/zero", "c", 1, 5);
    // runc drops a successful hook's stderr; keep it through a shell.
    let hook_err = env.dir.join("prestart.err");
    b.spec["hooks"]["prestart"] = json!([{"path": "/bin/sh", "args": ["sh", "-c",
        format!("exec {} --config {} hook prestart 2>>{}", devgate_bin().display(), env.config.display(), hook_err.display())]}]);
    b.add_hooks(&env, &["poststop"]);
    let id = unique_id("v1");
    let out = runtime_run("runc", &b, &id);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let stderr = read(&hook_err);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("devgate: remapped"))
        .collect();
    assert_eq!(
        lines,
        vec![
            r#"devgate: remapped /dev/zero (1:5) -> /dev/full (1:7): quarantined by operator: "x""#
        ],
        "{all}"
    );

    // inside: the container's /dev/zero is /dev/full, and 1:5 itself is denied
    let ran = read(&b.marker());
    assert!(ran.contains("zero-write=failed"), "{ran}");
    assert!(ran.contains("zero-node=1:7"), "{ran}");
    assert!(
        read(&b.rootfs().join("out/zero.err")).contains("No space left on device"),
        "{}",
        read(&b.rootfs().join("out/zero.err"))
    );
    assert!(ran.contains("mknod-bad=ok"), "{ran}");
    assert!(ran.contains("open-bad=failed"), "{ran}");
    assert!(
        read(&b.rootfs().join("out/bad.err")).contains("Operation not permitted"),
        "{}",
        read(&b.rootfs().join("out/bad.err"))
    );
    assert!(
        ran.contains("open-spare=ok"),
        "{ran}\n{}",
        read(&b.rootfs().join("out/spare.err"))
    );

    // recorded: log line, record, explain
    let last = env.decisions().pop().expect("a decision line");
    assert_eq!(last["action"], "remap", "{last}");
    assert_eq!(
        last["remaps"][0]["spare"],
        json!({"type": "c", "major": 1, "minor": 7})
    );
    assert_eq!(last["remaps"][0]["spare_path"], "/dev/full");
    assert!(
        last["remaps"][0]["cgroup"]
            .as_str()
            .unwrap()
            .starts_with("cgroup v1 /sys/fs/cgroup/devices/"),
        "{last}"
    );
    let explained = env.ok(&["explain", &id]);
    assert!(
        explained.contains(
            r#"remapped /dev/zero (1:5) -> /dev/full (1:7): quarantined by operator: "x""#
        ),
        "{explained}"
    );
    assert!(
        explained.contains("/dev/zero is now c 1:7 (mode 666, uid 0, gid 0)"),
        "{explained}"
    );

    // poststop gave the spare back
    let status: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let spare = status
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["host_path"] == "/dev/full")
        .expect("the spare in status");
    assert!(spare["roles"].as_array().unwrap().contains(&json!("spare")));
    assert_eq!(spare["lease"], Value::Null, "{spare}");

    // a second container gets the same spare again
    let out = runtime_run("runc", &b, &unique_id("v1b"));
    assert!(out.status.success(), "{}", text(&out));

    // with the only spare cordoned too, the container is rejected saying why
    env.ok(&["cordon", "/dev/full", "--reason", "spare bad"]);
    fs::remove_file(b.marker()).unwrap();
    let out = runtime_run("runc", &b, &unique_id("v1c"));
    let all = text(&out) + &read(&hook_err);
    assert!(!out.status.success(), "{all}");
    assert!(
        says(
            &all,
            r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "x"; remap impossible: no free healthy spare of class char (/dev/full unhealthy: quarantined by operator: "spare bad"); policy remap"#
        ),
        "{all}"
    );
    assert!(!b.marker().exists(), "the process ran although rejected");
}

#[test]
fn runc_remap_without_spare_configured_is_rejected() {
    require_root!();
    let env = Env::with(
        "rm-nospare",
        json!({"policy": {"classes": {"char": "remap"}}}),
    );
    env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
    let mut b = Bundle::new("rm-nospare", &["sh", "-c", "echo ran > /out/ran"]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.add_hooks(&env, &["prestart", "poststop"]);
    let out = runtime_run("runc", &b, &unique_id("ns"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        says(
            &all,
            r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "x"; remap impossible: no spare configured for class char; policy remap"#
        ),
        "{all}"
    );
    assert!(!b.marker().exists());
}

#[test]
fn runc_rootfs_with_dev_symlink_is_rejected_and_host_untouched() {
    require_root!();
    if !require_v1() {
        return;
    }
    let env = remap_env("rm-sym", &["/dev/full"]);
    env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
    let mut b = Bundle::new("rm-sym", &["sh", "-c", "echo ran > /out/ran"]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.add_hooks(&env, &["prestart", "poststop"]);
    // The container's /dev is a symlink to an absolute path outside the rootfs: a scratch
    // directory this test owns, standing in for a host directory such as /etc. It holds
    // a /dev/zero (1:5) of its own, the node devgate would replace if it followed the link.
    // runc itself creates its /dev symlinks (fd, stdin, ...) through that link before the
    // hook runs; what is checked is what devgate did.
    let scratch = b.dir.join("host-lookalike");
    fs::create_dir(&scratch).unwrap();
    mknod_char(&scratch.join("zero"), 1, 5);
    fs::remove_dir(b.rootfs().join("dev")).unwrap();
    std::os::unix::fs::symlink(&scratch, b.rootfs().join("dev")).unwrap();
    let out = runtime_run("runc", &b, &unique_id("sym"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(says(&all, "devgate: rejected /dev/zero (1:5): quarantined by operator: \"x\"; remap impossible: cannot replace the node in the container: container path /dev/zero: /dev is a symlink in the container's rootfs; devgate never follows a container's symlinks; policy remap"), "{all}");
    assert!(!b.marker().exists());
    // devgate followed the link nowhere: neither the link's target on the host nor the same
    // path under the rootfs (where runc made the container's nodes) got the spare's node
    // or one of devgate's temporary names, and the host's /dev/zero is still 1:5.
    let under_rootfs = b.rootfs().join(scratch.strip_prefix("/").unwrap());
    for dir in [&scratch, &under_rootfs] {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(!name.starts_with(".devgate"), "devgate left {dir:?}/{name}");
            let m = fs::symlink_metadata(e.path()).unwrap();
            assert_ne!(
                (libc::major(m.rdev()), libc::minor(m.rdev())),
                (1, 7),
                "{dir:?}/{name} is the spare's node"
            );
        }
    }
    assert_eq!(char_node(&scratch.join("zero")), (1, 5));
    assert_eq!(char_node(Path::new("/dev/zero")), (1, 5));
    // the lease taken for it was given back
    let leases = Leases::new(&env.dir.join("state")).list().unwrap();
    assert!(leases.is_empty(), "{leases:?}");
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

fn hook(env: &Env, stage: &str) -> Child {
    env.hook_cmd(stage).spawn().unwrap()
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

#[test]
fn thirty_two_prestarts_two_spares() {
    require_root!();
    if !require_v1() {
        return;
    }
    let env = remap_env("rm-conc", &["/dev/full", "/dev/urandom"]);
    env.ok(&["cordon", "/dev/zero", "--reason", "x"]);
    let tag = std::process::id();
    let fakes: Vec<FakeContainer> = (0..32)
        .map(|i| FakeContainer::new(&format!("c{tag}-{i}")))
        .collect();
    let mut kids: Vec<Child> = fakes.iter().map(|_| hook(&env, "prestart")).collect();
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
                err.starts_with(r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "x"; remap impossible: no free healthy spare of class char (/dev/full leased to "#)
                    && err.contains("; /dev/urandom leased to ")
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
            assert!(n == (1, 7) || n == (1, 9), "{n:?}");
            nodes.push(n);
            let list = f.devices_list();
            assert!(!list.contains("c 1:5 "), "{list}");
            assert!(list.contains(&format!("c 1:{} rwm", n.1)), "{list}");
        } else {
            assert_eq!(f.node(), (1, 5), "a rejected container's node is untouched");
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
    let mut kids: Vec<Child> = fakes.iter().map(|_| hook(&env, "poststop")).collect();
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
    let mut k = hook(&env, "poststop");
    k.stdin
        .take()
        .unwrap()
        .write_all(fakes[winners[0]].state_json().as_bytes())
        .unwrap();
    assert!(k.wait_with_output().unwrap().status.success());
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
    if !require_v1() {
        return;
    }
    let env = remap_env("rm-crash", &["/dev/full"]);
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
        let mut k = hook(&env, stage);
        k.stdin
            .take()
            .unwrap()
            .write_all(f.state_json().as_bytes())
            .unwrap();
        assert!(k.wait_with_output().unwrap().status.success());
        span[j] = t.elapsed().as_micros() as u64 + 1;
    }
    let mut killed = 0;
    const ROUNDS: usize = 200;
    for i in 0..ROUNDS {
        let stage = if i % 2 == 0 { "prestart" } else { "poststop" };
        let mut k = hook(&env, stage);
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
    let mut k = hook(&env, "prestart");
    k.stdin
        .take()
        .unwrap()
        .write_all(f.state_json().as_bytes())
        .unwrap();
    let o = k.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(f.node(), (1, 7));
    assert_eq!(lease_files(&env).len(), 1);
    let mut k = hook(&env, "poststop");
    k.stdin
        .take()
        .unwrap()
        .write_all(f.state_json().as_bytes())
        .unwrap();
    assert!(k.wait_with_output().unwrap().status.success());
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
