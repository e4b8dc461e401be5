//! `devgate-hook`, the statically linked hook front the shipped hook files run, under the
//! real runc: it gates a container without NVIDIA devices itself, hands one with a GPU (the
//! state it read passed on as stdin) and every other command to the devgate beside it, and
//! runs that devgate only when root alone could have written it.

mod common;
use common::fake_nvml::*;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn front_bin() -> PathBuf {
    devgate_hook_bin()
}

/// A directory holding a copy of the front and, with `with_devgate`, of devgate: the
/// layout the packages install (/usr/bin/devgate-hook beside /usr/bin/devgate).
/// Copies an executable in a child process (cp), never through a descriptor of this
/// process: one open for writing is inherited by any child another test thread forks
/// before its exec, and running the file meanwhile fails with ETXTBSY (seen on the forky
/// stack).
fn copy_exe(src: &Path, dest: &Path) {
    let out = Command::new("cp").arg(src).arg(dest).output().unwrap();
    assert!(out.status.success(), "cp {src:?} {dest:?}: {}", text(&out));
}

/// A script at `dest`, written as copy_exe writes, mode 0755.
fn write_exe(dest: &Path, script: &str) {
    let src = dest.with_extension("src");
    fs::write(&src, script).unwrap();
    copy_exe(&src, dest);
    fs::set_permissions(dest, fs::Permissions::from_mode(0o755)).unwrap();
}

fn install_dir(tag: &str, with_devgate: bool) -> PathBuf {
    let dir = tempdir(tag).join("bin");
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    copy_exe(&front_bin(), &dir.join("devgate-hook"));
    if with_devgate {
        copy_exe(&devgate_bin(), &dir.join("devgate"));
    }
    dir
}

/// The hook entry the shipped files have, for this test's front and config; `env` is the
/// hook's whole environment (runc gives a hook only what its entry names).
fn front_hook(front: &Path, env: &Env, stage: &str, hook_env: &[String]) -> Value {
    json!({
        "path": front,
        "args": ["devgate", "--config", env.config, "hook", stage],
        "env": hook_env,
        "timeout": 10
    })
}

fn bundle(
    tag: &str,
    front: &Path,
    env: &Env,
    device: (&str, u32, u32),
    hook_env: &[String],
) -> Bundle {
    let mut b = Bundle::new(tag, &["sh", "-c", "echo ran > /out/ran"]);
    b.add_device(device.0, "c", device.1, device.2);
    for stage in ["prestart", "poststop"] {
        b.spec["hooks"][stage] = json!([front_hook(front, env, stage, hook_env)]);
    }
    b
}

/// devgate beside the front as a root-owned script that notes each call's first two
/// arguments in the returned log, then runs devgate: it shows whether the front handed the
/// hook on or asked NVML through it.
fn traced_devgate(bin: &Path) -> PathBuf {
    let calls = bin.join("calls.log");
    let real = bin.join("devgate.real");
    copy_exe(&devgate_bin(), &real);
    write_exe(
        &bin.join("devgate"),
        &format!(
            "#!/bin/sh\necho \"$1 $2\" >> '{}'\nexec '{}' \"$@\"\n",
            calls.display(),
            real.display()
        ),
    );
    calls
}

/// The fake NVML's scenario in which GPU 1 (minor 1, bus 3b) has a failed row remap.
fn broken_gpu1(node: &GpuNode) -> PathBuf {
    write_scenario(
        &node.dir,
        "broken",
        &node_with(
            1,
            json!({"remapped_rows": {"correctable": 0, "uncorrectable": 3, "pending": false, "failure": true}}),
        ),
    )
}

/// A char node `major:minor` at `path`, mode 0666 (needs root).
fn mknod_char(path: &Path, major: u64, minor: u64) {
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(major, minor),
    )
    .unwrap();
}

/// A GPU node whose config classes char major 240 as `nvidia-gpu`, with `/dev/gpu1` (240:1)
/// under its dev_root: a GPU the spec's text does not show as NVIDIA's.
fn classed_gpu_node(tag: &str) -> (GpuNode, Env) {
    let node = GpuNode::new(tag);
    let mut cfg = node.config();
    cfg["device_classes"] =
        json!([{"class": "nvidia-gpu", "type": "c", "major": 240, "minors": [0, 253]}]);
    let env = Env::with(tag, cfg);
    mknod_char(&node.dev_root.join("gpu1"), 240, 1);
    (node, env)
}

fn is_static(program: &Path) -> bool {
    // A dynamically linked program names its interpreter; `file` is not on every node, the
    // ELF program headers are: PT_INTERP is type 3.
    let elf = fs::read(program).unwrap();
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let phentsize = u16::from_le_bytes(elf[0x36..0x38].try_into().unwrap()) as usize;
    let phnum = u16::from_le_bytes(elf[0x38..0x3a].try_into().unwrap()) as usize;
    !(0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3
    })
}

#[test]
fn the_front_is_linked_statically_and_devgate_is_not() {
    // What the front is for: no dynamic loader on the path of every container start.
    // devgate must stay dynamic: it loads NVML.
    assert!(is_static(&front_bin()), "devgate-hook has an interpreter");
    assert!(!is_static(&devgate_bin()), "devgate has no interpreter");
}

#[test]
fn the_front_gates_a_container_without_gpus_itself() {
    require_root!();
    // No devgate beside the front: whatever it decides, it decided in its own process.
    let bin = install_dir("front-alone", false);
    let front = bin.join("devgate-hook");
    let env = Env::new("front-alone");
    let b = bundle("front-alone", &front, &env, ("/dev/zero", 1, 5), &[]);

    let out = runtime_run("runc", &b, &unique_id("fa"));
    assert!(out.status.success(), "{}", text(&out));
    assert!(b.marker().exists());
    fs::remove_file(b.marker()).unwrap();

    env.ok(&["cordon", "/dev/zero", "--reason", "xid 79 seen"]);
    let out = runtime_run("runc", &b, &unique_id("fb"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(r#"devgate: rejected /dev/zero (1:5): quarantined by operator: \"xid 79 seen\"; policy reject"#)
            || all.contains(r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "xid 79 seen"; policy reject"#),
        "{all}"
    );
    assert!(!b.marker().exists(), "the container ran although rejected");
    // Both starts were recorded, and the allowed one's poststop wrote its exit record.
    let starts: Vec<_> = env
        .decisions()
        .iter()
        .map(|l| l["action"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(starts, ["allow", "reject"]);
    assert!(env.log_lines().iter().any(|l| l["stage"] == "poststop"));
}

#[test]
fn the_front_hands_a_gpu_container_to_devgate_with_its_state() {
    require_root!();
    let node = GpuNode::new("front-gpu");
    let env = Env::with("front-gpu", node.config());
    let broken = broken_gpu1(&node);
    let fake_env = vec![format!("FAKE_NVML_CONFIG={}", broken.display())];

    // Alone, the front cannot load NVML: the start fails with why, naming the devgate it
    // looked for, rather than pass the GPU unchecked.
    let alone = install_dir("front-gpu-alone", false);
    let b = bundle(
        "front-gpu-alone",
        &alone.join("devgate-hook"),
        &env,
        ("/dev/nvidia1", 195, 1),
        &fake_env,
    );
    let out = runtime_run("runc", &b, &unique_id("ga"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(&format!(
            "devgate: error: prestart: cannot find {}",
            alone.join("devgate").display()
        )),
        "{all}"
    );
    assert!(!b.marker().exists());

    // With devgate beside it, devgate judges the GPU on NVML's answer, for this container.
    let bin = install_dir("front-gpu", true);
    let b = bundle(
        "front-gpu",
        &bin.join("devgate-hook"),
        &env,
        ("/dev/nvidia1", 195, 1),
        &fake_env,
    );
    let id = unique_id("gb");
    let out = runtime_run("runc", &b, &id);
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("nvml: GPU GPU-00000001-1111-2222-3333-444444444444 (0000:3b:00.0): row remapping failed"),
        "{all}"
    );
    let last = env.decisions().pop().unwrap();
    assert_eq!(
        (last["action"].as_str(), last["container_id"].as_str()),
        (Some("reject"), Some(id.as_str()))
    );

    // Healthy: it starts, and poststop (handed on too) writes the exit record.
    let healthy = write_scenario(&node.dir, "healthy", &healthy_node());
    let b = bundle(
        "front-gpu-ok",
        &bin.join("devgate-hook"),
        &env,
        ("/dev/nvidia1", 195, 1),
        &[format!("FAKE_NVML_CONFIG={}", healthy.display())],
    );
    let id = unique_id("gc");
    let out = runtime_run("runc", &b, &id);
    assert!(out.status.success(), "{}", text(&out));
    assert!(b.marker().exists());
    let explained = env.ok(&["explain", &id, "--json"]);
    let v: Value = serde_json::from_str(&explained).unwrap();
    assert!(!v["stop"].is_null(), "no exit record: {explained}");
}

#[test]
fn the_front_runs_only_a_devgate_that_root_alone_could_have_written() {
    require_root!();
    let node = GpuNode::new("front-trust");
    let env = Env::with("front-trust", node.config());
    let bin = install_dir("front-trust", true);
    // Anyone could replace a group- or world-writable devgate with their own program.
    fs::set_permissions(bin.join("devgate"), fs::Permissions::from_mode(0o777)).unwrap();
    let b = bundle(
        "front-trust",
        &bin.join("devgate-hook"),
        &env,
        ("/dev/nvidia1", 195, 1),
        &[],
    );
    let out = runtime_run("runc", &b, &unique_id("t"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("writable by group or others (mode 777)"),
        "{all}"
    );
    assert!(!b.marker().exists());
    // Nothing was decided or recorded by a program the front refused to run.
    assert!(env.decisions().is_empty());
}

#[test]
fn every_other_command_goes_to_devgate() {
    let bin = install_dir("front-cmds", true);
    let env = Env::new("front-cmds");
    let run = |program: &Path, args: &[&str]| {
        Command::new(program)
            .arg("--config")
            .arg(&env.config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    for args in [&["version"][..], &["status"], &["hook"], &["nonsense"]] {
        let front = run(&bin.join("devgate-hook"), args);
        let devgate = run(&bin.join("devgate"), args);
        assert_eq!(
            (front.status.code(), &front.stdout, &front.stderr),
            (devgate.status.code(), &devgate.stdout, &devgate.stderr),
            "{args:?}"
        );
    }
    // Its own hook path reads the state as devgate does: a terminal or bad input is one
    // line and exit 2, before anything is handed on.
    let out = Command::new(bin.join("devgate-hook"))
        .args(["--config"])
        .arg(&env.config)
        .args(["hook", "prestart"])
        .stdin(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("devgate: error: prestart: state on stdin"),
        "{}",
        text(&out)
    );
}

/// A config that classes a node the spec's text does not show as NVIDIA's (another major,
/// another path) as `nvidia-gpu`: the front gates it itself, and its NVML queries run in
/// the devgate beside it (`__nvml-query`, exec'd), never in the static process.
#[test]
fn a_gpu_only_the_config_names_is_asked_about_through_the_devgate_beside_the_front() {
    require_root!();
    let (node, env) = classed_gpu_node("front-classed");
    let broken = broken_gpu1(&node);
    let bin = install_dir("front-classed", false);
    let calls = traced_devgate(&bin);

    let b = bundle(
        "front-classed",
        &bin.join("devgate-hook"),
        &env,
        ("/dev/gpu1", 240, 1),
        &[format!("FAKE_NVML_CONFIG={}", broken.display())],
    );
    let out = runtime_run("runc", &b, &unique_id("cl"));
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("row remapping failed"), "{all}");
    assert!(!b.marker().exists());
    let calls = fs::read_to_string(&calls).unwrap_or_default();
    assert!(
        calls.lines().any(|l| l.starts_with("__nvml-query ")),
        "{calls}"
    );
    assert!(
        calls.lines().all(|l| l.starts_with("__nvml-query ")),
        "the front handed the hook on: {calls}"
    );
}

/// The front run with its state on stdin as a runtime runs it, each stream piped. Bounded
/// by 64 file descriptors and 20 s of CPU time, so a front that hands the call on to itself
/// ends (each hand-on keeps one descriptor) instead of looping for the whole test run.
fn run_front(front: &Path, args: &[&str], stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(front);
    cmd.args(args)
        .env_remove("DEVGATE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for (what, n) in [(libc::RLIMIT_NOFILE, 64), (libc::RLIMIT_CPU, 20)] {
                let lim = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                if libc::setrlimit(what, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

/// A devgate beside the front that is the front again (a link to it, or a copy: statically
/// linked, it cannot load NVML either) is refused with one line saying so: the front would
/// otherwise hand the call to itself over and over, until the runtime's hook timeout or the
/// file descriptor limit ended it, and a query process (`__nvml-query`) or any other
/// command for ever. A prestart fails; a poststop still exits 0.
#[test]
fn a_devgate_that_is_the_front_again_is_refused_not_run_in_a_loop() {
    let env = Env::new("front-loop");
    let mut b = Bundle::new("front-loop-bundle", &["true"]);
    b.add_device("/dev/nvidia1", "c", 195, 1);
    b.write();
    let state = b.state_json(&unique_id("lp"));
    let stopped = state.replace("\"creating\"", "\"stopped\"");
    for kind in ["link", "copy"] {
        let bin = install_dir(&format!("front-loop-{kind}"), false);
        let front = bin.join("devgate-hook");
        match kind {
            "link" => std::os::unix::fs::symlink("devgate-hook", bin.join("devgate")).unwrap(),
            _ => {
                copy_exe(&front, &bin.join("devgate"));
            }
        }
        let config = env.config.to_str().unwrap();
        for (stage, input, code) in [
            ("prestart", state.as_bytes(), 2),
            ("poststop", stopped.as_bytes(), 0),
        ] {
            let out = run_front(&front, &["--config", config, "hook", stage], input);
            let all = text(&out);
            assert_eq!(out.status.code(), Some(code), "{kind} {stage}: {all}");
            assert!(
                all.contains("is linked statically, as the hook front is"),
                "{kind} {stage}: {all}"
            );
        }
        let out = run_front(&front, &["version"], b"");
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{kind} version: {all}");
        assert!(
            all.contains("is linked statically, as the hook front is"),
            "{kind} version: {all}"
        );
    }
    assert!(env.decisions().is_empty());
}

/// The live processes whose program is a file in `dir`.
fn running_from(dir: &Path) -> Vec<String> {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let exe = fs::read_link(e.path().join("exe")).ok()?;
            exe.starts_with(dir)
                .then(|| format!("{} {}", e.file_name().to_string_lossy(), exe.display()))
        })
        .collect()
}

/// The front's NVML query process for a GPU only the config names is the devgate beside
/// it: where that is the front again, the query process it starts is refused there too,
/// and ends, rather than handing `__nvml-query` on to itself for ever after the hook has
/// given up on its answer. The GPU is unknown, as for any query process that died.
#[test]
fn a_query_process_that_is_the_front_again_ends() {
    require_root!();
    let (_node, env) = classed_gpu_node("front-loop-query");
    let mut b = Bundle::new("front-loop-query-bundle", &["true"]);
    b.add_device("/dev/gpu1", "c", 240, 1);
    b.write();
    let bin = install_dir("front-loop-query", false);
    std::os::unix::fs::symlink("devgate-hook", bin.join("devgate")).unwrap();
    let out = run_front(
        &bin.join("devgate-hook"),
        &["--config", env.config.to_str().unwrap(), "hook", "prestart"],
        b.state_json(&unique_id("lq")).as_bytes(),
    );
    let all = text(&out);
    assert!(all.contains("nvml unknown: "), "{all}");
    let left = running_from(&bin);
    assert!(left.is_empty(), "still running: {left:?}\n{all}");
}

/// The state the front hands on is devgate's stdin and nothing else: the anonymous file
/// holding it is open once, as fd 0, in the devgate it runs (and in what that devgate
/// starts: NVML query processes a hung GPU can keep for minutes), not also under a second
/// descriptor, writable, that nothing reads.
#[test]
fn the_handed_state_is_open_only_as_devgates_stdin() {
    let env = Env::new("front-fds");
    let mut b = Bundle::new("front-fds-bundle", &["true"]);
    b.add_device("/dev/nvidia1", "c", 195, 1);
    b.write();
    let bin = install_dir("front-fds", false);
    let fds = bin.join("fds.txt");
    write_exe(
        &bin.join("devgate"),
        &format!("#!/bin/sh\nls -l /proc/$$/fd > '{}'\n", fds.display()),
    );
    let out = run_front(
        &bin.join("devgate-hook"),
        &["--config", env.config.to_str().unwrap(), "hook", "prestart"],
        b.state_json(&unique_id("fd")).as_bytes(),
    );
    assert!(out.status.success(), "{}", text(&out));
    let listed = fs::read_to_string(&fds).unwrap();
    let state: Vec<&str> = listed
        .lines()
        .filter(|l| l.contains("memfd:devgate-state"))
        .collect();
    assert_eq!(state.len(), 1, "{listed}");
    assert!(state[0].contains(" 0 -> "), "{listed}");
}

/// A GPU the spec's text does not show as NVIDIA's though the built-in classes make it one:
/// a bind mount of `/dev/char/195:1`, udev's link to `nvidia1`, is stat'ed by discovery
/// (links inside dev_root resolve) and is the GPU, while `may_name_nvidia` reads only the
/// text. The front gates it itself, and asks NVML through the devgate beside it: the GPU is
/// judged on NVML's answer, not passed unchecked or unknown.
#[test]
fn a_gpu_bound_through_dev_char_is_judged_on_nvml_through_the_devgate_beside_the_front() {
    require_root!();
    let node = GpuNode::new("front-devchar");
    let env = Env::with("front-devchar", node.config());
    fs::create_dir_all(node.dev_root.join("char")).unwrap();
    std::os::unix::fs::symlink("../nvidia1", node.dev_root.join("char/195:1")).unwrap();
    mknod_char(&node.dev_root.join("zero"), 1, 5);
    let broken = broken_gpu1(&node);
    let bin = install_dir("front-devchar", false);
    let calls = traced_devgate(&bin);
    let mut b = Bundle::new("front-devchar-bundle", &["true"]);
    // /dev/zero makes the spec one with devices before the config is read (binds count
    // there only below the host's /dev; this test's dev_root is elsewhere).
    b.add_device("/dev/zero", "c", 1, 5);
    b.spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/dev/gpu",
        "type": "bind",
        "source": node.dev_root.join("char/195:1"),
        "options": ["bind"]
    }));
    b.write();
    let out = {
        use std::io::Write;
        let mut child = Command::new(bin.join("devgate-hook"))
            .args(["--config", env.config.to_str().unwrap(), "hook", "prestart"])
            .env_remove("DEVGATE_CONFIG")
            .env("FAKE_NVML_CONFIG", &broken)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let state = b.state_json(&unique_id("dc"));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(state.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(!all.contains("/dev/zero"), "{all}");
    assert!(all.contains("devgate: rejected /dev/gpu"), "{all}");
    assert!(all.contains("row remapping failed"), "{all}");
    let calls = fs::read_to_string(&calls).unwrap_or_default();
    assert!(
        calls.lines().any(|l| l.starts_with("__nvml-query ")),
        "{calls}"
    );
    assert!(
        calls.lines().all(|l| l.starts_with("__nvml-query ")),
        "the front handed the hook on: {calls}"
    );
}
