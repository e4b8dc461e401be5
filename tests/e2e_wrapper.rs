//! The OCI runtime wrapper end to end: devgate linked as `devgate-runtime` in front of the
//! real runc and crun, as containerd's shim, CRI-O and podman run it. A remap written into
//! the spec, the runtime granting the spare itself; a reject in the runtime's JSON log;
//! spares given back at delete; a remap that survives `update`, on cgroup v1 (this host)
//! and v2 (a private mount namespace with a cgroup2 /sys/fs/cgroup).

mod common;
use common::wrapper::*;
use common::*;
use serde_json::Value;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn runc_run_through_the_wrapper_remaps_in_the_spec_and_the_hooks_skip() {
    require_root!();
    if !have_devices() {
        return;
    }
    let env = remap_env("wr-runc", "runc");
    let mut b = bundle("wr-runc", &["sh", "-c", PROBE]);
    // The recommended setup: the wrapper and the hooks.
    b.add_hooks(&env, &["prestart", "poststop"]);
    b.write();
    let w = Wrapper::new(&env);

    // Control: the same container with the device healthy is not remapped and may open
    // the bad device's node, so the checks below can fail.
    env.ok(&["uncordon", BAD]);
    let id = unique_id("wr-ctl");
    let out = w.run(&["run", "--bundle", s(&b.dir), &id]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        probe_says(&String::from_utf8_lossy(&out.stdout)),
        not_remapped()
    );
    b.write(); // as it was: nothing rewrote it, but each run starts from the original

    env.ok(&["cordon", BAD, "--reason", "wrapper test"]);
    let id = unique_id("wr");
    let out = w.run(&["run", "--bundle", s(&b.dir), &id]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert_eq!(
        probe_says(&String::from_utf8_lossy(&out.stdout)),
        remapped(),
        "{all}"
    );
    assert!(
        all.contains(
            r#"devgate: remapped /dev/fuse (10:229) -> /dev/loop-control (10:237): quarantined by operator: "wrapper test""#
        ),
        "{all}"
    );
    // The spec the runtime read: the entry keeps its path and mode, the rules are a
    // deny-all, the allows without the bad device, the spare.
    let spec: Value =
        serde_json::from_slice(&fs::read(b.dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(spec["linux"]["devices"][0]["path"], BAD);
    assert_eq!(spec["linux"]["devices"][0]["minor"], SPARE_NUM.1);
    assert_eq!(spec["linux"]["devices"][0]["fileMode"], 0o666);
    let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
    assert_eq!(
        rules[0],
        serde_json::json!({"allow": false, "type": "a", "access": "rwm"})
    );
    assert!(rules[1..].iter().all(|r| r["allow"] == true), "{rules:?}");
    assert!(rules.iter().all(|r| r["minor"] != BAD_NUM.1), "{rules:?}");
    assert_eq!(rules[rules.len() - 1]["minor"], SPARE_NUM.1);

    // One decision, the wrapper's: prestart found the marker and neither probed nor
    // remapped again.
    let mine: Vec<Value> = env
        .decisions()
        .into_iter()
        .filter(|d| d["container_id"] == id.as_str())
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(mine[0]["stage"], "run");
    assert_eq!(mine[0]["action"], "remap");
    assert_eq!(
        mine[0]["remaps"][0]["cgroup"],
        "config.json linux.resources.devices: deny all first, allows without c 10:229, allow c 10:237 rwm, applied by the runtime"
    );
    assert_eq!(
        mine[0]["remaps"][0]["node"],
        "config.json linux.devices /dev/fuse is now c 10:237 (mode 666, uid 0, gid 0)"
    );
    // prestart pointed the record at the container's process; poststop found it, wrote
    // the exit record and gave the spare back.
    let rec: Value = serde_json::from_slice(
        &fs::read(env.dir.join(format!("state/containers/{id}.json"))).unwrap(),
    )
    .unwrap();
    assert!(rec["pid"].as_i64().is_some_and(|p| p > 0), "{rec}");
    assert!(env.dir.join(format!("state/exits/{id}.json")).exists());
    assert_eq!(leases(&env), vec![]);
    let explained = env.ok(&["explain", &id]);
    assert!(
        explained.contains("remapped /dev/fuse (10:229) -> /dev/loop-control (10:237)"),
        "{explained}"
    );
}

#[test]
fn reject_reaches_the_runtime_log_as_json_and_the_runtime_never_runs() {
    require_root!();
    if !have_devices() {
        return;
    }
    let env = Env::with("wr-rej", serde_json::json!({}));
    env.ok(&["cordon", BAD, "--reason", "wrapper test"]);
    let b = bundle("wr-rej", &["sh", "-c", "echo ran > /out/ran"]);
    b.write();
    let w = Wrapper::new(&env);
    let id = unique_id("wr-rej");
    let out = w.run(&["create", "--bundle", s(&b.dir), &id]);
    let all = text(&out);
    let line = r#"devgate: rejected /dev/fuse (10:229): quarantined by operator: "wrapper test"; policy reject"#;
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains(line), "{all}");
    // What containerd's shim reads for "OCI runtime create failed: ...".
    let entries = w.log_entries();
    let last = entries.last().expect("a log entry");
    assert_eq!(last["level"], "error", "{last}");
    assert_eq!(last["msg"], line);
    assert!(last["time"].as_str().is_some_and(|t| t.ends_with('Z')));
    // runc never ran: it has no such container, and nothing was decided for the hooks.
    let state = Command::new("runc")
        .arg("--root")
        .arg(&w.root)
        .args(["state", &id])
        .output()
        .unwrap();
    assert!(!state.status.success(), "{}", text(&state));
    assert!(!b.marker().exists());
    assert!(!env.dir.join(format!("state/decided/{id}.json")).exists());
}

#[test]
fn a_create_that_fails_gives_its_spare_back_at_delete() {
    require_root!();
    if !have_devices() {
        return;
    }
    let env = remap_env("wr-fail", "runc");
    let mut b = bundle("wr-fail", &["true"]);
    // runc fails inside create: a bind mount of nothing.
    b.spec["mounts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!(
        {"destination": "/x", "type": "bind", "source": "/nonexistent-devgate-test",
         "options": ["rbind"]}));
    b.write();
    let w = Wrapper::new(&env);
    let id = unique_id("wr-fail");
    let out = w.run(&["create", "--bundle", s(&b.dir), &id]);
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(leases(&env), vec![(id.clone(), BAD_NUM.1, SPARE_NUM.1)]);
    assert!(env.dir.join(format!("state/decided/{id}.json")).exists());
    // No poststop will ever run for it; the shim's delete gives the spare back.
    let out = w.run(&["delete", "--force", &id]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(leases(&env), vec![]);
    assert!(!env.dir.join(format!("state/decided/{id}.json")).exists());
}

/// containerd 2.x asks `<BinaryName> features` with no global options.
#[test]
fn features_without_global_options_passes_through() {
    require_root!();
    let env = Env::new("wr-feat");
    let link = runtime_link(&env.dir);
    let out = Command::new(&link)
        .arg("features")
        .env("DEVGATE_CONFIG", &env.config)
        .output()
        .unwrap();
    let direct = Command::new("runc").arg("features").output().unwrap();
    assert_eq!(out.status.code(), direct.status.code(), "{}", text(&out));
    assert_eq!(out.stdout, direct.stdout);
}

/// The cgroup view a runtime gets: this host's (v1 controllers plus a cgroup2 with a
/// controller: hybrid), v1 alone (crun 1.8 refuses the hybrid), or v2 alone.
#[derive(Clone, Copy, Debug)]
enum View {
    Host,
    V1,
    V2,
}

impl View {
    fn setup(self) -> &'static str {
        match self {
            View::Host => "",
            View::V1 => "mount --make-rprivate / && umount /sys/fs/cgroup/unified && ",
            View::V2 => "mount --make-rprivate / && mount -t cgroup2 none /sys/fs/cgroup && ",
        }
    }
}

/// A container remapped through the wrapper, then `update` with the resources containerd
/// sends (the stored spec's, from before the remap): through the wrapper, then straight to
/// the runtime. Returns the probe's answers after start, after each update, and the
/// script's notes; None when the runtime cannot create containers in this view here.
fn update_sequence(runtime: &str, view: View) -> Option<[Vec<String>; 3]> {
    let tag = format!("wr-upd-{runtime}-{view:?}").to_lowercase();
    let env = remap_env(&tag, runtime);
    let mut b = bundle(&tag, &["sleep", "600"]);
    let id = unique_id(&tag);
    b.spec["linux"]["cgroupsPath"] = Value::String(format!("/{id}"));
    b.write();
    let resources = env.dir.join("resources.json");
    fs::write(&resources, b.spec["linux"]["resources"].to_string()).unwrap();
    let w = Wrapper::new(&env);
    let wr = format!(
        "env DEVGATE_CONFIG={} {} --root {} --log {} --log-format json",
        env.config.display(),
        w.link.display(),
        w.root.display(),
        w.log.display()
    );
    let script = format!(
        "{setup}\
         {wr} run -d --bundle {bundle} {id} </dev/null >/dev/null 2>{dir}/run.err \
           || {{ echo run-failed; cat {dir}/run.err; exit 0; }}; \
         echo '== started'; {wr} exec {id} sh -c \"$0\"; \
         echo '== wrapper update'; {wr} update --resources - {id} <{res} || echo update-failed; \
         {wr} exec {id} sh -c \"$0\"; \
         echo '== direct update'; {runtime} --root {root} update --resources - {id} <{res} \
           || echo direct-update-failed; \
         {wr} exec {id} sh -c \"$0\"; \
         {wr} delete --force {id} || echo delete-failed",
        setup = view.setup(),
        bundle = b.dir.display(),
        dir = env.dir.display(),
        res = resources.display(),
        root = w.root.display(),
    );
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            PROBE,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let all = text(&out);
    if all.contains("run-failed") && all.contains("setrlimit (RLIM_MEMLOCK)") {
        // crun 1.8 raises RLIMIT_MEMLOCK to infinity before loading any device program
        // and fails when it may not (no CAP_SYS_RESOURCE, as on this machine).
        eprintln!("skipped: {runtime} cannot load device programs here: {all}");
        return None;
    }
    assert!(!all.contains("failed"), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let parts: Vec<&str> = stdout.split("== ").collect();
    assert_eq!(parts.len(), 4, "{all}");
    // delete through the wrapper gave the spare back
    assert_eq!(leases(&env), vec![], "{all}");
    Some([
        probe_says(parts[1]),
        probe_says(parts[2]),
        probe_says(parts[3]),
    ])
}

#[test]
fn update_keeps_the_remap_under_runc_v1() {
    require_root!();
    if !have_devices() || !fake::v1_devices_or_skip() {
        return;
    }
    let [started, wrapped, direct] = update_sequence("runc", View::Host).unwrap();
    assert_eq!(started, remapped());
    assert_eq!(wrapped, remapped());
    // runc leaves device rules alone on update (SkipDevices).
    assert_eq!(direct, remapped());
}

#[test]
fn update_keeps_the_remap_under_crun_v1() {
    require_root!();
    if !have_devices() || !fake::v1_devices_or_skip() {
        return;
    }
    let [started, wrapped, direct] = update_sequence("crun", View::V1).unwrap();
    assert_eq!(started, remapped());
    assert_eq!(wrapped, remapped());
    // crun 1.8 writes the device rules it is given: without the wrapper the bad device is
    // allowed again and the spare denied.
    assert_eq!(
        direct,
        [
            format!("node={:x}:{:x}", SPARE_NUM.0, SPARE_NUM.1),
            "dev=denied".to_string(),
            "bad=ok".to_string(),
            "spare=denied".to_string(),
        ]
    );
}

#[test]
fn update_keeps_the_remap_under_runc_v2() {
    require_root!();
    if !have_devices() {
        return;
    }
    let [started, wrapped, direct] = update_sequence("runc", View::V2).unwrap();
    assert_eq!(started, remapped());
    assert_eq!(wrapped, remapped());
    assert_eq!(direct, remapped());
}

#[test]
fn update_keeps_the_remap_under_crun_v2() {
    require_root!();
    if !have_devices() {
        return;
    }
    let Some([started, wrapped, direct]) = update_sequence("crun", View::V2) else {
        return;
    };
    assert_eq!(started, remapped());
    assert_eq!(wrapped, remapped());
    assert_ne!(direct, remapped());
}

/// podman with `--runtime` naming the wrapper, and devgate's hooks from the generated
/// hooks.d file: the wrapper remaps, prestart skips, poststop gives the spare back.
/// conmon starts the runtime without podman's environment, so the wrapper here is a
/// script running `devgate --config FILE runtime` (on a node: /etc/devgate/config.json).
#[test]
fn podman_with_the_wrapper_as_runtime_remaps() {
    require_root!();
    if !have_devices() {
        return;
    }
    let podman = Podman::new("podman-wr");
    let env = remap_env("podman-wr", "runc");
    let hooks_dir = env.dir.join("hooks.d");
    hooks_config(&[
        "--config",
        s(&env.config),
        "hooks-config",
        "--runtime",
        "podman",
        "--bin",
        s(&devgate_bin()),
        "--out",
        s(&hooks_dir),
    ]);
    let runtime = env.dir.join("devgate-runtime.sh");
    fs::write(
        &runtime,
        format!(
            "#!/bin/sh\nexec '{}' --config '{}' runtime \"$@\"\n",
            devgate_bin().display(),
            env.config.display()
        ),
    )
    .unwrap();
    fs::set_permissions(
        &runtime,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let run = || {
        podman
            .cmd_with_runtime(&runtime)
            .arg("--hooks-dir")
            .arg(&hooks_dir)
            .args(["run", "--rm", "--network", "none", "--device", BAD])
            // the PROBE makes its nodes with mknod: podman 4 grants CAP_MKNOD by default,
            // podman 5 does not
            .args(["--cap-add", "MKNOD"])
            .arg(TEST_IMAGE)
            .args(["sh", "-c", PROBE])
            .output()
            .unwrap()
    };
    let out = run();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert_eq!(
        probe_says(&String::from_utf8_lossy(&out.stdout)),
        remapped(),
        "{all}"
    );
    let decisions = env.decisions();
    assert_eq!(decisions.len(), 1, "the hook decided again: {decisions:?}");
    assert_eq!(decisions[0]["stage"], "create");
    assert_eq!(decisions[0]["action"], "remap");
    let id = decisions[0]["container_id"].as_str().unwrap().to_string();
    assert!(env.dir.join(format!("state/exits/{id}.json")).exists());
    assert_eq!(leases(&env), vec![]);

    // Control: healthy, the same run is not remapped.
    env.ok(&["uncordon", BAD]);
    let out = run();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        probe_says(&String::from_utf8_lossy(&out.stdout)),
        not_remapped()
    );
}

/// Under the systemd cgroup driver a spare whose /dev/char link is missing would be taken
/// away by systemd's next daemon-reload: the wrapper does not hand it out, and says why.
#[test]
fn systemd_driver_needs_the_spare_in_dev_char() {
    require_root!();
    if !have_devices() {
        return;
    }
    // A dev_root of the test's own, with an empty char/ directory.
    let dev = tempdir("wr-sd-dev");
    fs::create_dir_all(dev.join("char")).unwrap();
    let env = Env::with(
        "wr-sd",
        serde_json::json!({"policy": {"classes": {"char": "remap"}}, "spares": {"char": [SPARE]},
                           "dev_root": dev}),
    );
    env.ok(&["cordon", BAD, "--reason", "wrapper test"]);
    let b = bundle("wr-sd", &["true"]);
    b.write();
    let w = Wrapper::new(&env);
    let id = unique_id("wr-sd");
    let out = w.run(&["--systemd-cgroup", "create", "--bundle", s(&b.dir), &id]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let why = format!(
        "remap impossible: no free healthy spare of class char ({SPARE}: {}/char/10:237 is missing",
        dev.display()
    );
    assert!(all.contains(&why), "{all}");
    assert!(w.log_entries().last().unwrap()["msg"]
        .as_str()
        .unwrap()
        .contains(&why));
    assert_eq!(leases(&env), vec![]);
}

/// runtime.path naming something that runs devgate-runtime again (a wrapper configured
/// around devgate, or a link) fails with a reason instead of starting itself forever.
#[test]
fn a_chain_of_wrappers_back_to_devgate_fails_instead_of_looping() {
    require_root!();
    let dir = tempdir("wr-loop");
    let link = runtime_link(&dir);
    // Another wrapper, and a script that calls itself runc: neither is runc itself.
    for name in ["other-wrapper", "runc"] {
        let sub = dir.join(format!("{name}.d"));
        fs::create_dir_all(&sub).unwrap();
        let other = sub.join(name);
        fs::write(
            &other,
            format!("#!/bin/sh\nexec '{}' \"$@\"\n", link.display()),
        )
        .unwrap();
        fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let env = Env::with("wr-loop", serde_json::json!({"runtime": {"path": other}}));
        let log = dir.join("log.json");
        let out = Command::new(&link)
            .env("DEVGATE_CONFIG", &env.config)
            .env_remove("DEVGATE_RUNTIME_WRAPPED")
            .arg("--log")
            .arg(&log)
            .args(["--log-format", "json", "state", "x"])
            .output()
            .unwrap();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {all}");
        assert!(
            all.contains("devgate: error: runtime.path: leads back to devgate's runtime wrapper"),
            "{name}: {all}"
        );
    }
    // Naming devgate itself is refused before anything runs.
    let env = Env::with(
        "wr-self",
        serde_json::json!({"runtime": {"path": devgate_bin()}}),
    );
    let out = Command::new(&link)
        .env("DEVGATE_CONFIG", &env.config)
        .env_remove("DEVGATE_RUNTIME_WRAPPED")
        .args(["state", "x"])
        .output()
        .unwrap();
    assert!(text(&out).contains("is devgate itself"), "{}", text(&out));
}

/// 32 creates at once through the wrapper for 2 spares: exactly two are remapped, each to
/// its own spare, the others rejected naming both leases. The real runtime is /bin/true;
/// each container's runtime state directory exists, as runc's would after create, and
/// keeps its lease held after the wrapper's process is gone.
#[test]
fn thirty_two_creates_two_spares() {
    require_root!();
    const SECOND: &str = "/dev/btrfs-control";
    if !have_devices() {
        return;
    }
    if !Path::new(SECOND).exists() {
        eprintln!("skipped: the kernel has no {SECOND} for a second spare");
        return;
    }
    let env = Env::with(
        "wr-32",
        serde_json::json!({"policy": {"classes": {"char": "remap"}},
                           "spares": {"char": [SPARE, SECOND]},
                           "runtime": {"path": "/bin/true"}}),
    );
    env.ok(&["cordon", BAD, "--reason", "wrapper test"]);
    let w = Wrapper::new(&env);
    let started: Vec<(String, Bundle, std::process::Child)> = (0..32)
        .map(|i| {
            let b = bundle(&format!("wr-32-{i}"), &["true"]);
            b.write();
            let id = unique_id(&format!("wr32-{i}"));
            fs::create_dir_all(w.root.join(&id)).unwrap();
            let child = w
                .cmd(&["create", "--bundle", s(&b.dir), &id])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (id, b, child)
        })
        .collect();
    let mut remapped_to = Vec::new();
    for (id, b, child) in started {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        match out.status.code() {
            Some(0) => {
                assert!(
                    err.starts_with("devgate: remapped /dev/fuse (10:229) -> /dev/"),
                    "{err}"
                );
                let spec: Value =
                    serde_json::from_slice(&fs::read(b.dir.join("config.json")).unwrap()).unwrap();
                remapped_to.push((id, spec["linux"]["devices"][0]["minor"].as_u64().unwrap()));
            }
            Some(1) => assert!(
                err.contains("remap impossible: no free healthy spare of class char (")
                    && err.contains(&format!("{SPARE} leased to "))
                    && err.contains(&format!("{SECOND} leased to ")),
                "{err}"
            ),
            c => panic!("{id} exited {c:?}: {err}"),
        }
    }
    assert_eq!(remapped_to.len(), 2, "{remapped_to:?}");
    assert_ne!(remapped_to[0].1, remapped_to[1].1, "one spare each");
    let mut held = leases(&env);
    held.sort();
    let mut want: Vec<(String, u32, u32)> = remapped_to
        .iter()
        .map(|(id, minor)| (id.clone(), BAD_NUM.1, *minor as u32))
        .collect();
    want.sort();
    assert_eq!(held, want);
    // delete through the wrapper, once the runtime's state is gone, frees both
    for (id, _) in &remapped_to {
        fs::remove_dir(w.root.join(id)).unwrap();
        w.ok(&["delete", id]);
    }
    assert_eq!(leases(&env), vec![]);
}

/// Whether an ELF file asks for a program interpreter (PT_INTERP): a dynamically linked
/// program does, a static one does not.
fn has_interpreter(path: &Path) -> bool {
    let elf = fs::read(path).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF", "{}", path.display());
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let o = phoff + i * size;
        u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) == 3
    })
}

/// The wrapper every container starts through is linked statically (build.rs), so no
/// dynamic loader runs on each start; devgate, which loads NVML, is not. A create with
/// devices is handed to that devgate: the remap tests above go through it.
#[test]
fn the_wrapper_is_linked_statically_and_devgate_is_not() {
    let libc_a = Command::new("cc")
        .arg("-print-file-name=libc.a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if !Path::new(&libc_a).is_absolute() {
        eprintln!("skipped: the C toolchain has no static libc.a, so the wrapper is dynamic");
        return;
    }
    assert!(
        !has_interpreter(&devgate_runtime_bin()),
        "devgate-runtime is dynamic"
    );
    assert!(
        has_interpreter(&devgate_bin()),
        "devgate must stay dynamic to load NVML"
    );
}

/// `devgate-runtime` placed in `dir` as its own file (a link would make /proc/self/exe,
/// and so the `devgate` it hands on to, the build directory's).
fn wrapper_in(dir: &Path) -> std::path::PathBuf {
    let w = dir.join("devgate-runtime");
    if fs::hard_link(devgate_runtime_bin(), &w).is_err() {
        fs::copy(devgate_runtime_bin(), &w).unwrap();
    }
    w
}

fn script(path: &Path, body: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The attacks on the handoff of a create with devices: it runs only a `devgate` beside
/// the wrapper's own file that is root's and writable by nobody else, with `runtime` first
/// and the runtime's arguments after it untouched (a leading `--config=` of the caller's
/// stays the runtime's); anything else fails the create and the runtime never runs. A spec
/// with no device goes straight to the runtime, never to devgate.
#[test]
fn the_handoff_runs_only_a_root_owned_devgate_beside_the_wrapper() {
    require_root!();
    let dir = tempdir("wr-hand");
    let wrapper = wrapper_in(&dir);
    let ran = dir.join("ran");
    let runtime = dir.join("runtime");
    script(
        &runtime,
        &format!("echo runtime \"$@\" >> '{}'", ran.display()),
        0o755,
    );
    let env = Env::with("wr-hand", serde_json::json!({"runtime": {"path": runtime}}));
    let mut bundle = Bundle::new("wr-hand-b", &["true"]);
    bundle.add_device("/dev/fuse", "c", 10, 229);
    bundle.write();
    let b = bundle.dir.to_str().unwrap().to_string();
    let args = ["--config=/nonexistent", "create", "--bundle", &b, "hand-1"];
    let start = || {
        let _ = fs::remove_file(&ran);
        output_of(
            Command::new(&wrapper)
                .env("DEVGATE_CONFIG", &env.config)
                .env_remove("DEVGATE_RUNTIME_WRAPPED")
                .args(args),
        )
    };
    let devgate = dir.join("devgate");
    let refused = |why: &str| {
        let out = start();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{why}: {all}");
        assert!(all.contains(why), "{why}: {all}");
        assert!(!ran.exists(), "{why}: something ran: {all}");
    };
    // No devgate beside.
    refused("cannot find");
    // A devgate others may write.
    let record = format!("echo devgate \"$@\" >> '{}'", ran.display());
    script(&devgate, &record, 0o775);
    refused("writable by group or others");
    script(&devgate, &record, 0o757);
    refused("writable by group or others");
    // A devgate someone else owns, directly or through a link.
    std::os::unix::fs::chown(&devgate, Some(65534), Some(65534)).unwrap();
    fs::set_permissions(
        &devgate,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    refused("owned by uid 65534");
    let theirs = dir.join("theirs");
    fs::rename(&devgate, &theirs).unwrap();
    std::os::unix::fs::symlink(&theirs, &devgate).unwrap();
    refused("owned by uid 65534");
    fs::remove_file(&devgate).unwrap();
    // A directory, or a file nobody may run, by that name.
    fs::create_dir(&devgate).unwrap();
    refused("is not an executable file");
    fs::remove_dir(&devgate).unwrap();
    script(&devgate, &record, 0o644);
    refused("is not an executable file");

    // Root's devgate runs, with the arguments as they came.
    script(&devgate, &record, 0o755);
    let out = start();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read_to_string(&ran).unwrap(),
        format!("devgate runtime --config=/nonexistent create --bundle {b} hand-1\n")
    );
    // No device: the runtime itself, devgate untouched.
    bundle.spec["linux"]["devices"] = serde_json::json!([]);
    bundle.spec["linux"]["resources"]["devices"] = serde_json::json!([]);
    bundle.write();
    let out = start();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        fs::read_to_string(&ran).unwrap(),
        format!("runtime --config=/nonexistent create --bundle {b} hand-1\n")
    );
}

/// A pod with `hostUsers: false` has a user namespace of its own: runc and crun bind the
/// host's node named by the container's path instead of making the spare's, so the spec's
/// remap would hand the container the bad device's node. The wrapper refuses it in one line.
#[test]
fn a_user_namespaced_container_is_not_remapped_and_says_why() {
    require_root!();
    if !have_devices() {
        return;
    }
    let env = remap_env("wr-userns", "runc");
    let mut b = bundle("wr-userns", &["true"]);
    b.spec["linux"]["namespaces"] = serde_json::json!([{"type": "mount"}, {"type": "user"}]);
    b.spec["linux"]["uidMappings"] =
        serde_json::json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
    b.spec["linux"]["gidMappings"] = b.spec["linux"]["uidMappings"].clone();
    b.write();
    let before = fs::read(b.dir.join("config.json")).unwrap();
    let w = Wrapper::new(&env);
    let id = unique_id("wr-userns");
    let out = w.run(&["create", "--bundle", s(&b.dir), &id]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let why = "remap impossible: the container has its own user namespace (hostUsers: false)";
    let line = all.lines().find(|l| l.contains(why));
    assert!(
        line.is_some_and(|l| l.contains("devgate: rejected /dev/fuse (10:229): ")),
        "{all}"
    );
    assert_eq!(
        fs::read(b.dir.join("config.json")).unwrap(),
        before,
        "spec untouched"
    );
    assert_eq!(leases(&env), vec![]);
}
