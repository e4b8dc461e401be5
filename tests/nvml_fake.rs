//! The NVML and XID probes through the devgate binary, on the fake NVML library: each
//! scenario of the fake, the deadline, selectors, status, and the no-GPU path that must
//! never load the library. The hook is run the way runtimes run it (state on stdin).
//!
//! `mod direct` drives the fake through nvml-wrapper itself, the way devgate's NVML code
//! calls it, to prove each scenario answers as NVML documents it (lost GPUs, a GPU missing
//! from the count, a hang on one GPU, idle links, recovery action and drain state, init
//! flags), and that its call log shows which GPUs were touched.

mod common;
use common::fake_nvml::{self, *};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A node: a dev_root with /dev/nvidia0..7, an empty kernel log, a devgate config on the
/// fake library.
struct Node {
    env: Env,
    dir: PathBuf,
    kmsg: PathBuf,
}

fn node(tag: &str, lib: &Path, extra: Value) -> Node {
    let dir = tempdir(tag);
    let dev_root = dir.join("dev");
    fs::create_dir_all(&dev_root).unwrap();
    make_gpu_nodes(&dev_root, 8);
    let kmsg = dir.join("kmsg");
    fs::write(&kmsg, "").unwrap();
    let mut cfg = json!({"dev_root": dev_root, "nvml_library": lib, "kmsg_path": kmsg,
                         "probe_timeout_ms": 2000});
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    Node {
        env: Env::with(tag, cfg),
        dir,
        kmsg,
    }
}

fn spec_with_gpus(minors: &[u32]) -> Value {
    let mut s = base_spec(&["true"]);
    for m in minors {
        s["linux"]["devices"].as_array_mut().unwrap().push(
            json!({"path": format!("/dev/nvidia{m}"), "type": "c", "major": 195, "minor": m}),
        );
    }
    s
}

impl Node {
    /// `devgate hook prestart` for a bundle with `spec`, the fake reading `scenario`.
    fn prestart(&self, spec: &Value, scenario: &Value) -> Output {
        self.prestart_env(spec, scenario, &[])
    }

    fn prestart_env(&self, spec: &Value, scenario: &Value, env: &[(&str, &Path)]) -> Output {
        self.prestart_with(Command::new(devgate_bin()), spec, scenario, env)
    }

    /// The hook allowed one CPU only (taskset), so that its NVML processes are one, as on a
    /// node with fewer CPUs than GPUs.
    fn prestart_on_one_cpu(&self, spec: &Value, scenario: &Value) -> Output {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "0"]).arg(devgate_bin());
        self.prestart_with(cmd, spec, scenario, &[])
    }

    fn prestart_with(
        &self,
        mut cmd: Command,
        spec: &Value,
        scenario: &Value,
        env: &[(&str, &Path)],
    ) -> Output {
        let bundle = tempdir("bundle");
        fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let fake = write_scenario(&self.dir, "scenario", scenario);
        let state = json!({"ociVersion": "1.0.2", "id": unique_id("c"), "status": "creating",
                           "pid": std::process::id(), "bundle": bundle});
        cmd.arg("--config")
            .arg(&self.env.config)
            .args(["hook", "prestart"])
            .env_remove("DEVGATE_CONFIG")
            .env("FAKE_NVML_CONFIG", &fake)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(state.to_string().as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    fn status_json(&self, scenario: &Value) -> Value {
        let fake = write_scenario(&self.dir, "scenario", scenario);
        let out = Command::new(devgate_bin())
            .arg("--config")
            .arg(&self.env.config)
            .args(["status", "--json"])
            .env_remove("DEVGATE_CONFIG")
            .env("FAKE_NVML_CONFIG", &fake)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Node {
    /// What devgate said on stderr, with the test dev_root's host paths taken out: devgate
    /// names a GPU `/dev/nvidia1 (host /tmp/…/dev/nvidia1, 195:1)` here and
    /// `/dev/nvidia1 (195:1)` on a node whose dev_root is /dev.
    fn said(&self, out: &Output) -> String {
        let mut s = stderr(out);
        for m in 0..8 {
            s = s.replace(
                &format!(
                    "/dev/nvidia{m} (host {}/dev/nvidia{m}, 195:{m})",
                    self.dir.display()
                ),
                &format!("/dev/nvidia{m} (195:{m})"),
            );
        }
        s
    }

    fn rejected(&self, out: &Output, line: &str) {
        assert_eq!(out.status.code(), Some(1), "{}", text(out));
        assert_eq!(self.said(out).trim_end(), line, "{}", text(out));
    }

    /// The reason code of the nvml verdict on /dev/nvidia`minor` in the last decision.
    fn nvml_code(&self, minor: u32) -> String {
        let last = self.env.log_lines().pop().unwrap();
        let gpu = last["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["device"]["minor"] == minor)
            .unwrap_or_else(|| panic!("no /dev/nvidia{minor} in {last}"));
        let nvml = gpu["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["probe"] == "nvml")
            .unwrap_or_else(|| panic!("no nvml verdict in {gpu}"));
        nvml["code"].as_str().unwrap_or_default().to_string()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn healthy_eight_gpu_node_allows_every_gpu() {
    require_root!();
    let n = node("healthy", fake_nvml::lib(), json!({}));
    let out = n.prestart(&spec_with_gpus(&[0, 1, 2, 3, 4, 5, 6, 7]), &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(n.said(&out), "", "no warnings on a healthy node");
    let last = n.env.log_lines().pop().unwrap();
    assert_eq!(last["action"], "allow");
    let devices = last["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8);
    for d in devices {
        let probes: Vec<(&str, &str)> = d["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (v["probe"].as_str().unwrap(), v["status"].as_str().unwrap()))
            .collect();
        assert!(probes.contains(&("nvml", "healthy")), "{probes:?}");
        assert!(probes.contains(&("xid", "healthy")), "{probes:?}");
    }
}

#[test]
fn remap_failure_rejects_with_the_figures() {
    require_root!();
    let n = node("remap", fake_nvml::lib(), json!({}));
    let scenario = node_with(
        1,
        json!({"remapped_rows": {"correctable": 0, "uncorrectable": 3, "pending": false, "failure": true}}),
    );
    let out = n.prestart(&spec_with_gpus(&[0, 1]), &scenario);
    n.rejected(
        &out,
        &format!(
            "devgate: rejected /dev/nvidia1 (195:1): nvml: GPU {} (0000:3b:00.0): row remapping failed (3 uncorrectable rows, 0 correctable); policy reject",
            uuid(1)
        ),
    );
    // the decision log says the same by code
    assert_eq!(n.nvml_code(1), "row_remap_failed");
    // pending remap: reset required
    let scenario = node_with(
        1,
        json!({"remapped_rows": {"correctable": 2, "uncorrectable": 1, "pending": true, "failure": false}}),
    );
    let out = n.prestart(&spec_with_gpus(&[1]), &scenario);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out).contains(
            "row remapping pending, reset required (1 uncorrectable rows, 2 correctable)"
        ),
        "{}",
        text(&out)
    );
}

#[test]
fn pending_retirement_and_volatile_dbe_reject() {
    require_root!();
    let n = node("retire", fake_nvml::lib(), json!({}));
    let out = n.prestart(
        &spec_with_gpus(&[2]),
        &node_with(2, json!({"retired_pages_pending": true})),
    );
    n.rejected(
        &out,
        &format!("devgate: rejected /dev/nvidia2 (195:2): nvml: GPU {} (0000:5e:00.0): retired pages pending, reboot required; policy reject", uuid(2)),
    );
    let dbe = node_with(3, json!({"volatile_uncorrectable_ecc": 2}));
    let out = n.prestart(&spec_with_gpus(&[3]), &dbe);
    n.rejected(
        &out,
        &format!("devgate: rejected /dev/nvidia3 (195:3): nvml: GPU {} (0000:86:00.0): volatile uncorrectable ECC errors 2 > 0; policy reject", uuid(3)),
    );
    // the threshold is the operator's
    let lenient = node(
        "retire2",
        fake_nvml::lib(),
        json!({"gpu": {"max_volatile_uncorrectable_ecc": 2}}),
    );
    let out = lenient.prestart(&spec_with_gpus(&[3]), &dbe);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn lost_gpu_has_fallen_off_the_bus() {
    require_root!();
    let n = node("lost", fake_nvml::lib(), json!({}));
    let out = n.prestart(&spec_with_gpus(&[4]), &node_with(4, json!({"lost": true})));
    n.rejected(
        &out,
        &format!(
            "devgate: rejected /dev/nvidia4 (195:4): nvml: GPU {} (0000:af:00.0): GPU is lost (fallen off the bus); policy reject",
            uuid(4)
        ),
    );
    // a GPU NVML cannot even give a handle for
    let out = n.prestart(
        &spec_with_gpus(&[4]),
        &node_with(4, json!({"unreachable": true})),
    );
    n.rejected(
        &out,
        "devgate: rejected /dev/nvidia4 (195:4): nvml: no reachable GPU with minor number 4; unreachable index 4: GPU is lost (fallen off the bus); policy reject",
    );
}

/// With the driver's /proc list, each way NVML shows a lost GPU names it lost, by its PCI
/// address and UUID from /proc, not as a numbering problem; the others stay healthy.
#[test]
fn lost_gpu_is_named_lost_by_its_pci_address_in_each_way_nvml_shows_it() {
    require_root!();
    let n = node("lostproc", fake_nvml::lib(), json!({}));
    let mut cfg: Value = serde_json::from_slice(&fs::read(&n.env.config).unwrap()).unwrap();
    cfg["proc_root"] = json!(n.dir);
    fs::write(&n.env.config, cfg.to_string()).unwrap();
    write_proc_gpus(&n.dir, &node_with(2, json!({})));
    let want = format!(
        "devgate: rejected /dev/nvidia2 (195:2): nvml: GPU {} ({}): GPU is lost (fallen off the bus); policy reject",
        uuid(2),
        bus(2)
    );
    for (how, edit) in [
        ("handle", fault::lost_at_handle()),
        ("every query", fault::lost_at_every_query()),
        ("missing", fault::missing()),
    ] {
        let scenario = node_with(2, edit);
        let out = n.prestart(&spec_with_gpus(&[2]), &scenario);
        assert_eq!(out.status.code(), Some(1), "{how}: {}", text(&out));
        assert_eq!(n.said(&out).trim_end(), want, "{how}: {}", text(&out));
        // GPU 3 on the same node is judged on its own facts
        let out = n.prestart(&spec_with_gpus(&[3]), &scenario);
        assert!(out.status.success(), "{how}: {}", text(&out));
    }
}

/// A node with the driver's /proc list of `scenario`'s GPUs.
fn node_with_proc(tag: &str, extra: Value, scenario: &Value) -> Node {
    let n = node(tag, fake_nvml::lib(), extra);
    let mut cfg: Value = serde_json::from_slice(&fs::read(&n.env.config).unwrap()).unwrap();
    cfg["proc_root"] = json!(n.dir);
    fs::write(&n.env.config, cfg.to_string()).unwrap();
    write_proc_gpus(&n.dir, scenario);
    n
}

/// GPU 3 of 8 hangs inside NVML; with `on_unknown: reject`, a container on GPU 0 is decided
/// on GPU 0's own facts and starts, one on GPU 3 is unknown and rejected, and the hook
/// returns without waiting for the process stuck on GPU 3, which is still alive after.
#[test]
fn a_gpu_hanging_in_nvml_makes_only_its_own_containers_unknown() {
    require_root!();
    let scenario = node_with(3, fault::hangs(600_000));
    let n = node_with_proc(
        "hang-one",
        json!({"probe_timeout_ms": 500, "policy": {"on_unknown": "reject"}}),
        &scenario,
    );
    let pids = n.dir.join("hung-pids");
    let scenario = with_pid_log(scenario, &pids);

    let out = n.prestart(&spec_with_gpus(&[0]), &scenario);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(n.said(&out), "");
    let out = n.prestart(&spec_with_gpus(&[0, 1, 2, 4, 5, 6, 7]), &scenario);
    assert!(out.status.success(), "{}", text(&out));

    let out = n.prestart(&spec_with_gpus(&[0, 3]), &scenario);
    n.rejected(
        &out,
        &format!(
            "devgate: rejected /dev/nvidia3 (195:3): nvml unknown: nvml: GPU {} ({}): NVML did not answer for this GPU in 500 ms; policy on_unknown reject",
            uuid(3),
            bus(3)
        ),
    );
    assert_eq!(n.nvml_code(3), "nvml_timeout");
    // The hook has exited (its output is complete) while the process it left on GPU 3 is
    // still inside NVML, holding none of the hook's stdio.
    let hung = Hung::read(&pids);
    let on3: Vec<i32> = hung
        .pids
        .iter()
        .filter(|(b, _)| *b == bus(3))
        .map(|(_, p)| *p)
        .collect();
    assert!(!on3.is_empty(), "no process hung on GPU 3: {:?}", hung.pids);
    assert!(on3.iter().all(|p| *p != std::process::id() as i32));
    assert!(on3.iter().any(|p| Hung::alive(*p)), "{on3:?}");
    for p in &on3 {
        for fd in 0..3 {
            if let Ok(target) = fs::read_link(format!("/proc/{p}/fd/{fd}")) {
                assert_eq!(target, Path::new("/dev/null"), "process {p} fd {fd}");
            }
        }
    }
    assert!(
        hung.pids.iter().all(|(b, _)| *b == bus(3)),
        "{:?}",
        hung.pids
    );
    // While that process is stuck, GPU 3 is not asked again: unknown at once, saying why,
    // and no second process is left hanging on it.
    let out = n.prestart(&spec_with_gpus(&[3]), &scenario);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = n.said(&out);
    assert!(
        said.contains(&format!(
            "nvml unknown: nvml: GPU {} ({}): an NVML query on this GPU has been stuck for ",
            uuid(3),
            bus(3)
        )) && said.contains(&format!(
            "(pid {}); not asked again until it ends; policy on_unknown reject",
            on3[0]
        )),
        "{said}"
    );
    assert_eq!(n.nvml_code(3), "nvml_stuck");
    assert_eq!(Hung::logged(&pids).len(), hung.pids.len());
    // once it has ended, GPU 3 is asked again (and hangs again)
    drop(hung);
    wait_for("the stuck process to end", || {
        on3.iter().all(|p| !Hung::alive(*p))
    });
    let out = n.prestart(&spec_with_gpus(&[3]), &scenario);
    assert!(
        n.said(&out)
            .contains("NVML did not answer for this GPU in 500 ms"),
        "{}",
        text(&out)
    );
    let _again = Hung::read(&pids);
}

/// A container's GPU is found by its PCI address from the driver's list: NVML never counts
/// or enumerates GPUs, and no other GPU is attached or queried.
/// On a node with fewer CPUs than GPUs the GPUs share NVML processes, each answering its
/// GPUs in turn. A GPU that hangs there still holds only itself: the GPUs queued behind it
/// are asked again, each in a process of its own, and answered within the deadline.
#[test]
fn gpus_queued_behind_a_hanging_gpu_in_one_process_are_asked_again() {
    require_root!();
    require_cmd("taskset", "util-linux");
    let scenario = node_with(3, fault::hangs(600_000));
    let n = node_with_proc(
        "hang-shared",
        json!({"probe_timeout_ms": 2000, "policy": {"on_unknown": "reject"}}),
        &scenario,
    );
    let pids = n.dir.join("hung-pids");
    let scenario = with_pid_log(scenario, &pids);
    // one CPU: one process for all eight, GPU 3 first in its queue
    let out = n.prestart_on_one_cpu(&spec_with_gpus(&[3, 0, 1, 2, 4, 5, 6, 7]), &scenario);
    n.rejected(
        &out,
        &format!(
            "devgate: rejected /dev/nvidia3 (195:3): nvml unknown: nvml: GPU {} ({}): NVML did not answer for this GPU in 2000 ms; policy on_unknown reject",
            uuid(3),
            bus(3)
        ),
    );
    let hung = Hung::read(&pids);
    assert!(
        hung.pids.iter().all(|(b, _)| *b == bus(3)),
        "{:?}",
        hung.pids
    );
    // and with the hung GPU last in the queue, the seven before it are answered in turn
    let n = node_with_proc(
        "hang-shared-last",
        json!({"probe_timeout_ms": 2000, "policy": {"on_unknown": "reject"}}),
        &node_with(7, fault::hangs(600_000)),
    );
    let out = n.prestart_on_one_cpu(
        &spec_with_gpus(&[0, 1, 2, 3, 4, 5, 6, 7]),
        &node_with(7, fault::hangs(600_000)),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = n.said(&out);
    assert!(
        said.starts_with("devgate: rejected /dev/nvidia7 (195:7): nvml unknown"),
        "{said}"
    );
    assert_eq!(said.trim_end().lines().count(), 1, "{said}");
}

#[test]
fn a_healthy_gpu_is_never_enumerated_when_another_is_assigned() {
    require_root!();
    let scenario = healthy_node();
    let n = node_with_proc("no-enum", json!({}), &scenario);
    let log = n.dir.join("calls");
    let out = n.prestart(
        &spec_with_gpus(&[5]),
        &with_call_log(scenario.clone(), &log),
    );
    assert!(out.status.success(), "{}", text(&out));
    let seen = calls(&log);
    assert!(!seen.is_empty());
    for c in &seen {
        assert!(
            c.func != "nvmlDeviceGetCount_v2" && c.func != "nvmlDeviceGetHandleByIndex_v2",
            "enumerated: {seen:?}"
        );
    }
    assert_eq!(buses_touched(&log), vec![bus(5)], "{seen:?}");
    // without NVML_INIT_FLAG_NO_ATTACH, which leaves NVML no GPU at all
    assert!(
        seen.iter()
            .any(|c| c.func == "nvmlInitWithFlags" && c.target == "flags=0x1"),
        "{seen:?}"
    );
    // selectors too are resolved by the driver's list (UUIDs; an index is the position in
    // PCI address order, NVML's own order, which the fake's scenario order is not)
    let _ = fs::remove_file(&log);
    let mut spec = spec_with_gpus(&[]);
    spec["process"]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!(format!(
            "NVIDIA_VISIBLE_DEVICES={},{}",
            uuid(6),
            uuid(2)
        )));
    let out = n.prestart(&spec, &with_call_log(scenario, &log));
    assert!(out.status.success(), "{}", text(&out));
    let mut touched = buses_touched(&log);
    touched.sort();
    let mut want = vec![bus(2), bus(6)];
    want.sort();
    assert_eq!(touched, want, "{:?}", calls(&log));
    assert!(!calls(&log)
        .iter()
        .any(|c| c.func == "nvmlDeviceGetCount_v2" || c.func == "nvmlDeviceGetHandleByIndex_v2"));
    // an index is the position in PCI address order: GPU 0 is the one at bus 0x19
    let _ = fs::remove_file(&log);
    let mut spec = spec_with_gpus(&[]);
    spec["process"]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!("NVIDIA_VISIBLE_DEVICES=0"));
    let out = n.prestart(&spec, &with_call_log(healthy_node(), &log));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(BUSES[6], 0x19);
    assert_eq!(buses_touched(&log), vec![bus(6)], "{:?}", calls(&log));
}

/// A GPU whose NVML query crashes the process asking it is unknown, with that said; the
/// other GPUs of the same container are judged on their own answers.
#[test]
fn a_query_process_that_crashes_is_unknown_for_its_gpu_alone() {
    require_root!();
    let scenario = node_with(6, json!({"crash_at": "nvmlDeviceGetRemappedRows"}));
    let n = node_with_proc("crash", json!({}), &scenario);
    let out = n.prestart(&spec_with_gpus(&[5, 6]), &scenario);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        n.said(&out).trim_end(),
        format!(
            "devgate: warning: /dev/nvidia6 (195:6): nvml unknown: nvml: GPU {} ({}): the NVML query process ended without an answer (it crashed); policy on_unknown allow",
            uuid(6),
            bus(6)
        )
    );
}

/// The query process a hook with threads execs (`devgate __nvml-query LIB PROC FD=JOB…`): it
/// answers each job on the descriptor it names and ends at once, leaving a child stuck on a
/// hanging GPU behind.
#[test]
fn the_query_process_answers_each_gpu_on_its_own_pipe_and_leaves() {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let dir = tempdir("query-process");
    let pids = dir.join("hung-pids");
    let scenario = with_pid_log(node_with(3, fault::hangs(600_000)), &pids);
    // the driver's list: each child shows NVML its own GPU from it
    write_proc_gpus(&dir, &scenario);
    let fake = write_scenario(&dir, "scenario", &scenario);
    let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
    let (r0, w0): (OwnedFd, OwnedFd) = nix::unistd::pipe2(cloexec).unwrap();
    let (r3, w3): (OwnedFd, OwnedFd) = nix::unistd::pipe2(cloexec).unwrap();
    let (w0_fd, w3_fd) = (w0.as_raw_fd(), w3.as_raw_fd());
    let mut cmd = Command::new(devgate_bin());
    cmd.arg("__nvml-query")
        .arg(fake_nvml::lib())
        .arg(&dir)
        .arg(format!("20=0@{}", bus_id(0)))
        .arg(format!("21=3@{}", bus_id(3)))
        .env("FAKE_NVML_CONFIG", &fake)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only dup2 between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(w0_fd, 20) < 0 || libc::dup2(w3_fd, 21) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = cmd.status().unwrap();
    drop((w0, w3));
    // it forked and ended; it never waited for its children
    assert!(status.success(), "{status:?}");
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut fs::File::from(r0), &mut answer).unwrap();
    let a: Value = serde_json::from_str(&answer).unwrap();
    let g = &a["gpus"]["gpus"][0];
    assert_eq!(g["minor"]["value"], 0, "{a}");
    assert_eq!(g["uuid"]["value"], uuid(0), "{a}");
    assert_eq!(g["recovery_action"]["value"], 0, "{a}");
    // GPU 3's child is stuck in NVML and still holds its pipe open
    wait_for("GPU 3's child to hang", || !Hung::logged(&pids).is_empty());
    let hung = Hung::read(&pids);
    assert!(
        hung.pids
            .iter()
            .all(|(b, p)| *b == bus(3) && Hung::alive(*p)),
        "{:?}",
        hung.pids
    );
    let mut fds = [libc::pollfd {
        fd: r3.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    // SAFETY: one live pollfd; a zero timeout only looks.
    assert_eq!(
        unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) },
        0,
        "GPU 3's pipe ended"
    );
    drop(hung);
}

/// NVML's recovery action and drain state decide, and say when an XID stops counting.
#[test]
fn recovery_action_and_drain_state_decide_and_clear_old_xids() {
    require_root!();
    let mut scenario = healthy_node();
    scenario["gpus"][1]["recovery_action"] = json!(recovery::GPU_RESET);
    scenario["gpus"][2]["recovery_action"] = json!(recovery::DRAIN_P2P);
    scenario["gpus"][3]["drain"] = json!(true);
    scenario["gpus"][4]["recovery_action"] = json!(recovery::NODE_REBOOT);
    let n = node_with_proc("recovery", json!({}), &scenario);
    let label = |i: usize| format!("nvml: GPU {} ({})", uuid(i), bus(i));
    let out = n.prestart(&spec_with_gpus(&[1]), &scenario);
    n.rejected(
        &out,
        &format!("devgate: rejected /dev/nvidia1 (195:1): {}: NVML recovery action GPU_RESET: the GPU needs a reset (nvidia-smi -r) before new work; policy reject", label(1)),
    );
    let out = n.prestart(&spec_with_gpus(&[4]), &scenario);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out)
            .contains("NODE_REBOOT: the node needs a reboot"),
        "{}",
        text(&out)
    );
    let out = n.prestart(&spec_with_gpus(&[3]), &scenario);
    n.rejected(
        &out,
        &format!("devgate: rejected /dev/nvidia3 (195:3): {}: NVML drain state is on: the GPU is being drained and takes no new work; policy reject", label(3)),
    );
    // DRAIN_P2P: a one-GPU container does no peer-to-peer and starts, with a warning
    let out = n.prestart(&spec_with_gpus(&[2]), &scenario);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        n.said(&out).contains("NVML recovery action DRAIN_P2P: peer-to-peer traffic must drain; a container with one GPU does none"),
        "{}",
        text(&out)
    );
    // one with GPUs 2 and 5 could add peer-to-peer traffic: refused for GPU 2
    let out = n.prestart(&spec_with_gpus(&[2, 5]), &scenario);
    n.rejected(
        &out,
        &format!("devgate: rejected /dev/nvidia2 (195:2): {}: NVML recovery action DRAIN_P2P: peer-to-peer traffic must drain, and this container's 2 GPUs could add to it; policy reject", label(2)),
    );

    // XID 48 on GPU 1 (0000:3b) since the driver loaded: blocking while NVML asks for a
    // reset; after `nvidia-smi -r` (no driver reload, so the report stays in the log) NVML
    // says NONE and the GPU answers, and the report only warns.
    let xid48 = "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, DBE (0x1,0x2)";
    fs::write(&n.kmsg, fake_nvml::kmsg_records(&[xid48])).unwrap();
    let out = n.prestart(&spec_with_gpus(&[1]), &scenario);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(n.said(&out).contains("xid: xid 48"), "{}", text(&out));
    let after_reset = healthy_node();
    let out = n.prestart(&spec_with_gpus(&[1]), &after_reset);
    assert!(out.status.success(), "{}", text(&out));
    let said = n.said(&out);
    assert!(
        said.starts_with("devgate: warning: /dev/nvidia1 (195:1): xid: xid 48")
            && said.contains(
                "no longer blocking: NVML reports recovery action NONE and the GPU answers"
            ),
        "{said}"
    );
    // a driver without the field: the XID table decides, as before
    let old = node_with(1, json!({"not_supported": ["nvmlDeviceGetFieldValues"]}));
    let out = n.prestart(&spec_with_gpus(&[1]), &old);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

#[test]
fn hanging_nvml_is_abandoned_at_the_deadline() {
    require_root!();
    let hang = |func: &str| {
        let mut s = healthy_node();
        s["hang_ms"] = json!({ func: 60_000 });
        s
    };
    let n = node("hang", fake_nvml::lib(), json!({"probe_timeout_ms": 300}));
    let started = Instant::now();
    let out = n.prestart(&spec_with_gpus(&[1]), &hang("nvmlDeviceGetRemappedRows"));
    let took = started.elapsed();
    assert!(out.status.success(), "{}", text(&out));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(
        n.said(&out).trim_end(),
        "devgate: warning: /dev/nvidia1 (195:1): nvml unknown: NVML did not answer in 300 ms; policy on_unknown allow"
    );

    // on_unknown reject decides the other way
    let strict = node(
        "hang2",
        fake_nvml::lib(),
        json!({"probe_timeout_ms": 300, "policy": {"on_unknown": "reject"}}),
    );
    // (no driver list here: NVML enumerates, after a plain nvmlInit_v2)
    let out = strict.prestart(&spec_with_gpus(&[1]), &hang("nvmlInit_v2"));
    strict.rejected(
        &out,
        "devgate: rejected /dev/nvidia1 (195:1): nvml unknown: NVML did not answer in 300 ms; policy on_unknown reject",
    );

    // answers in time but hangs in nvmlShutdown: the verdict stands, the exit is prompt
    let started = Instant::now();
    let out = n.prestart(&spec_with_gpus(&[1]), &hang("nvmlShutdown"));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(n.said(&out), "");
}

#[test]
fn missing_library_is_unknown_and_other_probes_still_run() {
    require_root!();
    let n = node(
        "nolib",
        Path::new("/nonexistent/libnvidia-ml.so.1"),
        json!({}),
    );
    let out = n.prestart(&spec_with_gpus(&[0]), &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        n.said(&out).starts_with(
            "devgate: warning: /dev/nvidia0 (195:0): nvml unknown: cannot load /nonexistent/libnvidia-ml.so.1: "
        ),
        "{}",
        text(&out)
    );
    // the quarantine probe still decides
    n.env.ok(&["cordon", "195:0", "--reason", "bad"]);
    let out = n.prestart(&spec_with_gpus(&[0]), &healthy_node());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out).contains(
            "rejected /dev/nvidia0 (195:0): quarantined by operator: \"bad\"; policy reject"
        ),
        "{}",
        text(&out)
    );
    // init failure (driver not loaded) likewise names the cause
    let n = node("noinit", fake_nvml::lib(), json!({}));
    let out = n.prestart(&spec_with_gpus(&[0]), &json!({"init_error": 9}));
    assert!(
        n.said(&out).contains("nvml unknown: NVML init failed ("),
        "{}",
        text(&out)
    );
}

#[test]
fn missing_symbol_is_not_applicable_not_a_crash() {
    require_root!();
    let n = node("nosym", fake_nvml::lib_without_remapped_rows(), json!({}));
    // even a remap failure cannot be seen without the function; everything else works
    let scenario = node_with(
        1,
        json!({"remapped_rows": {"uncorrectable": 3, "failure": true}, "volatile_uncorrectable_ecc": 1}),
    );
    let out = n.prestart(&spec_with_gpus(&[1]), &scenario);
    n.rejected(
        &out,
        &format!("devgate: rejected /dev/nvidia1 (195:1): nvml: GPU {} (0000:3b:00.0): volatile uncorrectable ECC errors 1 > 0; policy reject", uuid(1)),
    );
    let st = n.status_json(&healthy_node());
    let g1 = st
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["minor"] == 1)
        .unwrap();
    let remap = g1["gpu"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "remapped_rows")
        .unwrap();
    assert_eq!(remap["status"], "not_applicable");
    assert_eq!(remap["code"], "not_reported");
    assert!(
        remap["reason"]
            .as_str()
            .unwrap()
            .contains("symbol missing from the NVML library"),
        "{remap}"
    );
    assert_eq!(g1["health"], "healthy");
}

#[test]
fn throttle_and_pcie_downtraining_are_warnings() {
    require_root!();
    let n = node("warn", fake_nvml::lib(), json!({}));
    let scenario = node_with(
        5,
        json!({"throttle_reasons": 0x48, "pcie": {"gen": 3, "max_gen": 4, "width": 8, "max_width": 16}}),
    );
    let out = n.prestart(&spec_with_gpus(&[5]), &scenario);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        n.said(&out).trim_end(),
        format!("devgate: warning: /dev/nvidia5 (195:5): nvml: GPU {} (0000:d8:00.0): clocks throttled by hw_slowdown, hw_thermal (reasons 0x48); PCIe link width x8 below max x16", uuid(5))
    );
    assert_eq!(n.env.log_lines().pop().unwrap()["action"], "warn");
}

#[test]
fn containers_without_gpus_never_load_nvml() {
    require_root!();
    let n = node("nodlopen", fake_nvml::lib(), json!({}));
    let marker = n.dir.join("nvml-loaded");
    // a device, but not an NVIDIA one
    nix::sys::stat::mknod(
        &n.dir.join("dev/null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    let mut spec = base_spec(&["true"]);
    spec["linux"]["devices"] = json!([{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}]);
    let out = n.prestart_env(&spec, &healthy_node(), &[("FAKE_NVML_MARKER", &marker)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !marker.exists(),
        "NVML was loaded for a container without a GPU"
    );
    // no devices at all
    let out = n.prestart_env(
        &base_spec(&["true"]),
        &healthy_node(),
        &[("FAKE_NVML_MARKER", &marker)],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !marker.exists(),
        "NVML was loaded for a container without devices"
    );
    // the same check sees a GPU container load it: the marker works
    let out = n.prestart_env(
        &spec_with_gpus(&[0]),
        &healthy_node(),
        &[("FAKE_NVML_MARKER", &marker)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let said = fs::read_to_string(&marker).unwrap();
    assert!(said.starts_with("loaded pid "), "{said}");
    assert!(said.contains("\ninit pid "), "{said}");
}

#[test]
fn nvidia_visible_devices_and_cdi_select_gpus() {
    require_root!();
    let n = node("select", fake_nvml::lib(), json!({}));
    let mut bad = node_with(
        3,
        json!({"remapped_rows": {"uncorrectable": 1, "failure": true}}),
    );
    bad["gpus"][3]["minor"] = json!(6); // minors need not follow indices
    bad["gpus"][6]["minor"] = json!(3);

    // by UUID in process.env, no linux.devices at all: the GPU behind it is minor 6
    let mut spec = base_spec(&["true"]);
    spec["process"]["env"] = json!([
        "PATH=/bin",
        format!("NVIDIA_VISIBLE_DEVICES={}", uuid(3).to_lowercase())
    ]);
    let out = n.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out).starts_with(&format!(
            "devgate: rejected /dev/nvidia6 (195:6): nvml: GPU {} (0000:86:00.0): row remapping failed",
            uuid(3)
        )),
        "{}",
        text(&out)
    );
    let last = n.env.log_lines().pop().unwrap();
    assert_eq!(
        last["devices"][0]["device"]["source"],
        "nvidia-visible-devices"
    );

    // by index through a CDI annotation
    let mut spec = base_spec(&["true"]);
    spec["annotations"] = json!({"cdi.k8s.io/nvidia-device-plugin_gpu": "nvidia.com/gpu=3"});
    let out = n.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out).contains("rejected /dev/nvidia6 (195:6)"),
        "{}",
        text(&out)
    );

    // all (every CUDA image sets it): every GPU is checked, the bad one is named in a
    // warning, and the container starts
    let mut spec = base_spec(&["true"]);
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=all"]);
    let out = n.prestart(&spec, &bad);
    assert!(out.status.success(), "{}", text(&out));
    let said = n.said(&out);
    assert!(
        said.starts_with("devgate: warning: /dev/nvidia6 (195:6): nvml: GPU ")
            && said.contains("row remapping failed")
            && said
                .trim_end()
                .ends_with("selected only by all: warns, never rejects"),
        "{}",
        text(&out)
    );
    assert_eq!(
        n.env.log_lines().pop().unwrap()["devices"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
    assert!(!n.said(&out).contains(" | "), "one bad GPU: {}", text(&out));

    // void selects nothing; a healthy selection starts
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=void"]);
    assert!(n.prestart(&spec, &bad).status.success());
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=0,1"]);
    let out = n.prestart(&spec, &bad);
    assert!(out.status.success(), "{}", text(&out));

    // a GPU the node does not have is said, not checked
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=GPU-deadbeef"]);
    let out = n.prestart(&spec, &bad);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        n.said(&out).trim_end(),
        "devgate: warning: NVIDIA_VISIBLE_DEVICES selects GPU-deadbeef, which NVML does not report"
    );
}

/// Every form libnvidia-container accepts names the GPU it names there (index 3 is minor
/// 6 at 0000:86:00.0 here); a UUID prefix names nothing; a token NVIDIA refuses is an
/// unknown, which `policy.on_unknown: reject` turns into a refusal, never silently nothing.
#[test]
fn selector_forms_follow_libnvidia_container() {
    require_root!();
    let n = node("selforms", fake_nvml::lib(), json!({}));
    let mut bad = node_with(
        3,
        json!({"remapped_rows": {"uncorrectable": 1, "failure": true}}),
    );
    bad["gpus"][3]["minor"] = json!(6);
    bad["gpus"][6]["minor"] = json!(3);
    let with_env = |v: &str| {
        let mut spec = base_spec(&["true"]);
        spec["process"]["env"] = json!([format!("NVIDIA_VISIBLE_DEVICES={v}")]);
        spec
    };
    for form in [
        "3",
        "00003",
        "+3",
        "0:86:00.0",
        "00000000:86:00.0",
        "0000:86:00",
        "3:0",
        // glibc reads these as NVIDIA's tooling does: GPU 3, or the GPU at 0000:86:00
        "\u{b}3",
        "-18446744073709551613",
        &format!("{}3", "0".repeat(200)),
        "0x0:86:00.0",
        "100000000:86:00.0",
        // libnvidia-container takes a UUID's prefix, any case: the first 12 characters
        // of GPU 3's UUID are GPU 3
        &uuid(3)[..12],
        &uuid(3)[..12].to_lowercase(),
    ] {
        let out = n.prestart(&with_env(form), &bad);
        assert_eq!(out.status.code(), Some(1), "{form}: {}", text(&out));
        assert!(
            n.said(&out).contains("rejected /dev/nvidia6 (195:6)"),
            "{form}: {}",
            text(&out)
        );
    }
    // a token longer than the UUID begins no UUID
    let longer = format!("{}0", uuid(3));
    let out = n.prestart(&with_env(&longer), &bad);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        n.said(&out).trim_end(),
        format!(
            "devgate: warning: NVIDIA_VISIBLE_DEVICES selects {longer}, which NVML does not report"
        )
    );
    // tokens NVIDIA refuses: said, with the reason
    let out = n.prestart(&with_env("0,3b:00.0"), &bad);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        n.said(&out).trim_end(),
        "devgate: warning: NVIDIA_VISIBLE_DEVICES value \"3b:00.0\" is not a GPU index, GPU-/MIG- UUID, PCI bus id, MIG <gpu>:<mig>, all, none or void, which NVIDIA's tooling refuses"
    );
    let strict = node(
        "selstrict",
        fake_nvml::lib(),
        json!({"policy": {"on_unknown": "reject"}}),
    );
    let out = strict.prestart(&with_env("0,junk"), &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        strict.said(&out).trim_end(),
        "devgate: rejected: NVIDIA_VISIBLE_DEVICES value \"junk\" is not a GPU index, GPU-/MIG- UUID, PCI bus id, MIG <gpu>:<mig>, all, none or void, which NVIDIA's tooling refuses; policy on_unknown reject"
    );
    // recorded like any decision
    let last = strict.env.log_lines().pop().unwrap();
    assert_eq!(last["action"], "reject");
    assert!(
        last["message"].as_str().unwrap().contains("\"junk\""),
        "{last}"
    );
    // under the same policy a selector that resolves starts
    let out = strict.prestart(&with_env("0"), &bad);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn xid_reports_in_the_kernel_log_reject_until_the_driver_reloads() {
    require_root!();
    let n = node("xid", fake_nvml::lib(), json!({}));
    let xid79 =
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.";
    fs::write(
        &n.kmsg,
        fake_nvml::kmsg_records(&[
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
            "NVRM: Xid (PCI:0000:1b:00): 13, pid=1, Graphics Exception",
            xid79,
        ]),
    )
    .unwrap();
    // A driver without the recovery action field: the XID table alone decides (the field
    // decides where there is one: an_xid_stops_blocking_once_nvml_says_the_gpu_recovered).
    let old_driver = json!({"not_supported": ["nvmlDeviceGetFieldValues"]});
    let out = n.prestart(&spec_with_gpus(&[0, 1]), &node_with(1, old_driver.clone()));
    n.rejected(
        &out,
        "devgate: rejected /dev/nvidia1 (195:1): xid: xid 79 (GPU has fallen off the bus) on 0000:3b:00 reported 1 time since the driver loaded, last at 5.002000 s after boot (kmsg seq 1002): \"pid=4242, name=python, GPU has fallen off the bus.\"; node reboot required; policy reject",
    );
    // the driver was loaded again after it: the GPU was re-initialised
    fs::write(
        &n.kmsg,
        fake_nvml::kmsg_records(&[
            xid79,
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        ]),
    )
    .unwrap();
    let out = n.prestart(&spec_with_gpus(&[1]), &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    // the operator can demote an XID
    let lenient = node(
        "xid2",
        fake_nvml::lib(),
        json!({"gpu": {"xid_actions": {"79": "warn"}}}),
    );
    fs::write(&lenient.kmsg, fake_nvml::kmsg_records(&[xid79])).unwrap();
    let out = lenient.prestart(&spec_with_gpus(&[1]), &node_with(1, old_driver));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        lenient
            .said(&out)
            .starts_with("devgate: warning: /dev/nvidia1 (195:1): xid: xid 79"),
        "{}",
        text(&out)
    );
    // an unreadable log is unknown, not a failure
    let gone = node("xid3", fake_nvml::lib(), json!({}));
    fs::remove_file(&gone.kmsg).unwrap();
    let out = gone.prestart(&spec_with_gpus(&[1]), &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        gone.said(&out)
            .contains("xid unknown: cannot open kernel log "),
        "{}",
        text(&out)
    );
}

/// XID 154 carries the driver's recovery action in the line itself: a GPU reset required
/// rejects without asking NVML, drain P2P only warns, and a later "to 0x0 (None)" (the
/// driver after `nvidia-smi -r`) ends the earlier reports without a driver reload.
#[test]
fn xid_154_lines_decide_by_the_recovery_action_they_name() {
    require_root!();
    let n = node("xid154", fake_nvml::lib(), json!({}));
    // NVML answers but gives no recovery action field (NOT_SUPPORTED): the line decides.
    // (Where NVML gives it, its live value wins: `recovery_action_and_drain_state_decide_and_clear_old_xids`.)
    let no_field = node_with(1, json!({"recovery_action": null}));
    let xid79 =
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.";
    // the line as published (tests/fixtures/kmsg/nvrm-lines.txt), moved to GPU 1's slot
    let reset = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)";
    fs::write(&n.kmsg, fake_nvml::kmsg_records(&[reset])).unwrap();
    let out = n.prestart(&spec_with_gpus(&[1]), &no_field);
    n.rejected(
        &out,
        "devgate: rejected /dev/nvidia1 (195:1): xid: xid 154 on 0000:3b:00: the driver's recovery action is GPU reset required, at 5.000000 s after boot (kmsg seq 1000): \"GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)\"; policy reject",
    );
    let drain = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)";
    fs::write(&n.kmsg, fake_nvml::kmsg_records(&[drain])).unwrap();
    let out = n.prestart(&spec_with_gpus(&[1]), &no_field);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        n.said(&out).starts_with(
            "devgate: warning: /dev/nvidia1 (195:1): xid: xid 154 on 0000:3b:00: the driver's recovery action is drain peer-to-peer traffic"
        ),
        "{}",
        text(&out)
    );
    // XID 79, the reset the driver asked for, then its word that nothing more is needed
    fs::write(
        &n.kmsg,
        fake_nvml::kmsg_records(&[
            xid79,
            "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
        ]),
    )
    .unwrap();
    let out = n.prestart(&spec_with_gpus(&[1]), &no_field);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(n.said(&out), "", "{}", text(&out));
}

/// NVML stuck at init: the driver's /proc list still says GPU 1 (minor 1) is 0000:3b:00,
/// and XID 154's line says it needs a reset. The reject carries the driver's word, not
/// only "NVML did not answer".
#[test]
fn xid_154_rejects_through_the_drivers_list_when_nvml_hangs() {
    require_root!();
    let dir = tempdir("xid154-hang-proc");
    let n = node(
        "xid154hang",
        fake_nvml::lib(),
        json!({"probe_timeout_ms": 300, "proc_root": dir}),
    );
    let mut stuck = healthy_node();
    write_proc_gpus(&dir, &stuck);
    stuck["hang_ms"] = json!({"nvmlInitWithFlags": 60_000});
    fs::write(
        &n.kmsg,
        fake_nvml::kmsg_records(&["NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"]),
    )
    .unwrap();
    let out = n.prestart(&spec_with_gpus(&[1]), &stuck);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = n.said(&out);
    assert!(
        said.starts_with("devgate: rejected /dev/nvidia1 (195:1): xid: xid 154 on 0000:3b:00: the driver's recovery action is GPU reset required"),
        "{said}"
    );
}

#[test]
fn status_shows_each_gpu_and_every_check() {
    require_root!();
    let n = node("status", fake_nvml::lib(), json!({}));
    let scenario = node_with(2, json!({"retired_pages_pending": true}));
    let rows = n.status_json(&scenario);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 8, "{rows:?}");
    for (i, r) in rows.iter().enumerate() {
        let g = &r["gpu"];
        assert_eq!(g["minor"], i as u64);
        assert_eq!(g["uuid"], uuid(i));
        assert_eq!(g["pci_bus_id"], format!("0000:{:02x}:00.0", BUSES[i]));
        let checks: Vec<&str> = g["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["check"].as_str().unwrap())
            .collect();
        assert_eq!(
            checks,
            [
                "reachable",
                "remapped_rows",
                "retired_pages",
                "volatile_ecc",
                "throttle",
                "pcie_link",
                "recovery_action",
                "drain",
                "xid"
            ]
        );
    }
    assert_eq!(rows[2]["health"], "unhealthy");
    assert_eq!(rows[1]["health"], "healthy");
    // the text form lists the same
    let fake = write_scenario(&n.dir, "scenario", &scenario);
    let out = Command::new(devgate_bin())
        .arg("--config")
        .arg(&n.env.config)
        .arg("status")
        .env("FAKE_NVML_CONFIG", &fake)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(&format!(
            "    gpu minor 2 uuid {} pci 0000:5e:00.0",
            uuid(2)
        )),
        "{shown}"
    );
    assert!(
        shown.contains(
            "      retired_pages   unhealthy      retired pages pending, reboot required"
        ),
        "{shown}"
    );
}

mod direct {
    use super::common::fake_nvml::*;
    use super::common::{tempdir, wait_for};
    use nvml_wrapper::bitmasks::InitFlags;
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::error::NvmlError;
    use nvml_wrapper::struct_wrappers::device::FieldValueSample;
    use nvml_wrapper::structs::device::FieldId;
    use nvml_wrapper::Nvml;
    use serde_json::{json, Value};
    use std::path::PathBuf;
    use std::sync::{mpsc, Arc};

    /// A private copy of the fake, its scenario and its call log.
    struct Fake {
        lib: PathBuf,
        log: PathBuf,
    }

    fn fake(tag: &str, scenario: Value) -> Fake {
        let dir = tempdir(tag);
        let log = dir.join("calls");
        let lib = private_lib(&dir, &with_call_log(scenario, &log));
        Fake { lib, log }
    }

    impl Fake {
        fn open(&self, flags: InitFlags) -> Result<Nvml, NvmlError> {
            Nvml::builder()
                .lib_path(self.lib.as_os_str())
                .flags(flags)
                .init()
        }

        /// A plain init, as devgate's: every GPU the scenario lists is counted and attached.
        fn nvml(&self) -> Nvml {
            self.open(InitFlags::empty()).unwrap()
        }

        fn calls(&self) -> Vec<Call> {
            calls(&self.log)
        }

        fn logged(&self, func: &str, target: &str) -> bool {
            self.calls()
                .iter()
                .any(|c| c.func == func && c.target == target)
        }
    }

    fn lost<T: std::fmt::Debug>(r: Result<T, NvmlError>) {
        assert!(matches!(r, Err(NvmlError::GpuLost)), "{r:?}");
    }

    /// One field's answer from nvmlDeviceGetFieldValues; errors as their names, since
    /// NvmlError has no equality.
    fn field(got: &[Result<FieldValueSample, NvmlError>], k: usize) -> Result<SampleValue, String> {
        match &got[k] {
            Ok(s) => match &s.value {
                Ok(v) => Ok(v.clone()),
                Err(e) => Err(format!("{e:?}")),
            },
            Err(e) => Err(format!("sample: {e:?}")),
        }
    }

    /// The thread's answer has not come.
    fn still_waiting<T: std::fmt::Debug>(rx: &mpsc::Receiver<T>, what: &str) {
        let r = rx.try_recv();
        assert!(
            matches!(r, Err(mpsc::TryRecvError::Empty)),
            "{what} returned although its GPU hangs: {r:?}"
        );
    }

    /// NVML_INIT_FLAG_NO_ATTACH leaves NVML with no GPU at all, as measured on an H200
    /// (driver 580.159.04): nothing counted, lookups by address or UUID NOT_FOUND, by index
    /// INVALID_ARGUMENT. It does not defer the attach to the lookup.
    #[test]
    fn init_flags_are_recorded_and_no_attach_leaves_nvml_no_gpu() {
        for flags in [
            InitFlags::NO_ATTACH,
            InitFlags::NO_GPUS | InitFlags::NO_ATTACH,
        ] {
            let f = fake("nvml-flags", healthy_node());
            let nvml = f.open(flags).unwrap();
            assert_eq!(nvml.device_count().unwrap(), 0, "{flags:?}");
            let r = nvml.device_by_pci_bus_id(bus(1)).map(|_| ());
            assert!(matches!(r, Err(NvmlError::NotFound)), "{flags:?}: {r:?}");
            let r = nvml.device_by_uuid(uuid(1)).map(|_| ());
            assert!(matches!(r, Err(NvmlError::NotFound)), "{flags:?}: {r:?}");
            let r = nvml.device_by_index(0).map(|_| ());
            assert!(matches!(r, Err(NvmlError::InvalidArg)), "{flags:?}: {r:?}");
            drop(nvml);
            assert_eq!(
                f.calls()[0],
                Call {
                    func: "nvmlInitWithFlags".into(),
                    target: format!("flags={:#x}", flags.bits())
                }
            );
            assert!(
                !f.calls().iter().any(|c| c.func == "attach"),
                "{:?}",
                f.calls()
            );
            assert_eq!(f.calls().last().unwrap().func, "nvmlShutdown");
        }
        assert_eq!(INIT_FLAG_NO_ATTACH | INIT_FLAG_NO_GPUS, 3);

        // plain nvmlInit_v2 attaches every GPU NVML counts
        let f = fake("nvml-flags2", healthy_node());
        drop(f.open(InitFlags::empty()).unwrap());
        assert_eq!(f.calls()[0].func, "nvmlInit_v2");
        assert_eq!(f.calls()[0].target, "flags=0x0");
        let attached: Vec<String> = f
            .calls()
            .into_iter()
            .filter(|c| c.func == "attach")
            .map(|c| c.target)
            .collect();
        assert_eq!(attached, (0..8).map(bus).collect::<Vec<_>>());

        // NO_GPUS counts and attaches them too
        let f = fake("nvml-flags1", healthy_node());
        let nvml = f.open(InitFlags::NO_GPUS).unwrap();
        assert_eq!(nvml.device_count().unwrap(), 8);
        assert_eq!(
            nvml.device_by_pci_bus_id(bus(1))
                .unwrap()
                .minor_number()
                .unwrap(),
            1
        );
        assert_eq!(f.calls()[0].target, "flags=0x1");
    }

    /// NVML counts the GPUs the driver lists in /proc/driver/nvidia/gpus at init: with only
    /// GPU 5's directory there, init attaches GPU 5 alone and nothing else is touched.
    #[test]
    fn only_the_gpus_the_drivers_list_shows_are_counted_and_attached() {
        let dir = tempdir("nvml-one-listed");
        let gpus = dir.join("gpus");
        std::fs::create_dir_all(gpus.join(bus(5))).unwrap();
        let f = fake("nvml-one", with_proc_gpus(healthy_node(), &gpus));
        let nvml = f.nvml();
        assert_eq!(nvml.device_count().unwrap(), 1);
        let dev = nvml.device_by_pci_bus_id(bus(5)).unwrap();
        assert_eq!(dev.minor_number().unwrap(), 5);
        assert_eq!(dev.uuid().unwrap(), uuid(5));
        assert_eq!(dev.pci_info().unwrap().bus_id, bus_id(5));
        assert_eq!(nvml.device_by_index(0).unwrap().minor_number().unwrap(), 5);
        assert_eq!(buses_touched(&f.log), [bus(5)], "{:?}", f.calls());
        assert!(f.logged("attach", &bus(5)));
        let r = nvml.device_by_pci_bus_id(bus(3)).map(|_| ());
        assert!(matches!(r, Err(NvmlError::NotFound)), "{r:?}");

        // the log does see every GPU where every GPU is listed, so a test built on it can
        // fail
        let f = fake("nvml-all", healthy_node());
        let nvml = f.nvml();
        nvml.device_by_pci_bus_id(bus(5)).unwrap();
        assert_eq!(buses_touched(&f.log), (0..8).map(bus).collect::<Vec<_>>());
    }

    #[test]
    fn pci_bus_ids_are_accepted_in_every_form_nvml_documents() {
        let f = fake("nvml-busid", healthy_node());
        let nvml = f.nvml();
        // domain:bus:device.function, domain:bus:device, bus:device.function; hex, any case
        for id in [
            "0000:3b:00.0",
            "00000000:3B:00.0",
            "0:3b:0",
            "3b:00.0",
            "3B:0.0",
        ] {
            let dev = nvml.device_by_pci_bus_id(id).unwrap();
            assert_eq!(dev.minor_number().unwrap(), 1, "{id}");
        }
        for id in ["0000:3b:00.1", "0000:3c:00.0", "0001:3b:00.0"] {
            let r = nvml.device_by_pci_bus_id(id).map(|_| ());
            assert!(matches!(r, Err(NvmlError::NotFound)), "{id}: {r:?}");
        }
        for id in [
            "",
            "3b",
            "zz:00.0",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "0000:100:00.0",
        ] {
            let r = nvml.device_by_pci_bus_id(id).map(|_| ());
            assert!(matches!(r, Err(NvmlError::InvalidArg)), "{id}: {r:?}");
        }
        assert_eq!(
            nvml.device_by_uuid(uuid(6))
                .unwrap()
                .minor_number()
                .unwrap(),
            6
        );
        let r = nvml.device_by_uuid("GPU-deadbeef").map(|_| ());
        assert!(matches!(r, Err(NvmlError::NotFound)), "{r:?}");
    }

    #[test]
    fn a_gpu_lost_at_its_handle_lookup_is_lost_by_index_bus_id_and_uuid() {
        let f = fake("nvml-lost-handle", node_with(4, fault::lost_at_handle()));
        let nvml = f.nvml();
        assert_eq!(nvml.device_count().unwrap(), 8, "still counted");
        lost(nvml.device_by_index(4));
        lost(nvml.device_by_pci_bus_id(bus(4)));
        lost(nvml.device_by_uuid(uuid(4)));
        assert_eq!(nvml.device_by_index(3).unwrap().minor_number().unwrap(), 3);
        assert_eq!(nvml.device_by_index(5).unwrap().minor_number().unwrap(), 5);

        // the old spelling, `unreachable`, is the same fault
        let f = fake(
            "nvml-lost-handle2",
            node_with(4, json!({"unreachable": true})),
        );
        lost(f.nvml().device_by_pci_bus_id(bus(4)));
    }

    #[test]
    fn a_gpu_lost_at_every_query_answers_gpu_is_lost_to_its_minor_number_too() {
        let f = fake("nvml-lost-all", node_with(2, fault::lost_at_every_query()));
        let nvml = f.nvml();
        let dev = nvml.device_by_pci_bus_id(bus(2)).unwrap();
        lost(dev.minor_number());
        lost(dev.uuid());
        lost(dev.pci_info());
        lost(dev.current_pcie_link_gen());
        lost(dev.pcie_replay_counter());
        lost(dev.field_values_for(&[FieldId(230)]));
        lost(dev.is_drain_enabled(None));
        // by index too; by UUID NVML cannot match a GPU that cannot say its UUID
        lost(nvml.device_by_index(2).unwrap().minor_number());
        let r = nvml.device_by_uuid(uuid(2)).map(|_| ());
        assert!(matches!(r, Err(NvmlError::NotFound)), "{r:?}");
        // the others answer
        let other = nvml.device_by_pci_bus_id(bus(3)).unwrap();
        assert_eq!(other.minor_number().unwrap(), 3);

        // `lost: true` (lost at query): identity still answers, health queries do not
        let f = fake("nvml-lost-query", node_with(2, json!({"lost": true})));
        let nvml = f.nvml();
        let dev = nvml.device_by_pci_bus_id(bus(2)).unwrap();
        assert_eq!(dev.minor_number().unwrap(), 2);
        assert_eq!(dev.uuid().unwrap(), uuid(2));
        lost(dev.current_pcie_link_gen());
        lost(dev.field_values_for(&[FieldId(230)]));
    }

    #[test]
    fn a_gpu_missing_from_the_count_is_not_found_and_indices_close_up() {
        let f = fake("nvml-missing", node_with(2, fault::missing()));
        let nvml = f.nvml();
        assert_eq!(nvml.device_count().unwrap(), 7);
        let uuids: Vec<String> = (0..7)
            .map(|i| nvml.device_by_index(i).unwrap().uuid().unwrap())
            .collect();
        let expected: Vec<String> = [0, 1, 3, 4, 5, 6, 7].into_iter().map(uuid).collect();
        assert_eq!(uuids, expected);
        let r = nvml.device_by_index(7).map(|_| ());
        assert!(matches!(r, Err(NvmlError::InvalidArg)), "{r:?}");
        let r = nvml.device_by_pci_bus_id(bus(2)).map(|_| ());
        assert!(matches!(r, Err(NvmlError::NotFound)), "{r:?}");
        let r = nvml.device_by_uuid(uuid(2)).map(|_| ());
        assert!(matches!(r, Err(NvmlError::NotFound)), "{r:?}");
        // asked for by address, never attached nor queried
        assert!(!f
            .calls()
            .iter()
            .any(|c| c.target == bus(2) && !c.func.starts_with("nvmlDeviceGetHandleBy")));
    }

    #[test]
    fn a_hang_on_one_gpu_of_four_leaves_the_other_three_answering() {
        const FOREVER: u64 = 600_000;
        let scenario = node_of_with(4, 3, fault::hangs(FOREVER));

        // GPU 3 hidden from the driver's list (as devgate's query child for another GPU
        // sees it): init never attaches it, GPUs 0-2 answer
        let dir = tempdir("nvml-hang-view");
        let gpus = dir.join("gpus");
        for i in 0..3 {
            std::fs::create_dir_all(gpus.join(bus(i))).unwrap();
        }
        let f = fake("nvml-hang", with_proc_gpus(scenario.clone(), &gpus));
        let nvml = f.nvml();
        for i in 0..3 {
            let dev = nvml.device_by_pci_bus_id(bus(i)).unwrap();
            assert_eq!(dev.minor_number().unwrap(), i as u32);
            assert_eq!(dev.current_pcie_link_gen().unwrap(), 4);
            assert!(!dev.is_drain_enabled(None).unwrap());
        }
        assert!(
            !f.calls().iter().any(|c| c.target == bus(3)),
            "{:?}",
            f.calls()
        );

        // a GPU that attaches but hangs in one query: only that query is stuck
        let f = fake(
            "nvml-hang-query",
            node_of_with(
                4,
                3,
                json!({"hang_ms": {"nvmlDeviceGetMinorNumber": FOREVER}}),
            ),
        );
        let nvml = Arc::new(f.nvml());
        let dev3 = nvml.device_by_pci_bus_id(bus(3)).unwrap();
        assert_eq!(dev3.uuid().unwrap(), uuid(3));
        let (tx, rx) = mpsc::channel();
        let stuck = Arc::clone(&nvml);
        std::thread::spawn(move || {
            let r = stuck
                .device_by_pci_bus_id(bus(3))
                .and_then(|d| d.minor_number());
            let _ = tx.send(r);
        });
        wait_for("GPU 3's minor query to start", || {
            f.logged("nvmlDeviceGetMinorNumber", &bus(3))
        });
        assert_eq!(
            nvml.device_by_pci_bus_id(bus(1))
                .unwrap()
                .minor_number()
                .unwrap(),
            1
        );
        still_waiting(&rx, "GPU 3's query");

        // plain nvmlInit_v2 attaches every GPU: the whole init hangs on GPU 3
        let f = fake("nvml-hang-init", scenario);
        let (tx, rx) = mpsc::channel();
        let lib = f.lib.clone();
        std::thread::spawn(move || {
            let r = Nvml::builder()
                .lib_path(lib.as_os_str())
                .init()
                .map(std::mem::forget);
            let _ = tx.send(r.is_ok());
        });
        wait_for("init to reach GPU 3", || f.logged("attach", &bus(3)));
        for i in 0..3 {
            assert!(f.logged("attach", &bus(i)), "{:?}", f.calls());
        }
        still_waiting(&rx, "nvmlInit_v2");
    }

    #[test]
    fn an_idle_link_trains_down_its_generation_not_its_width() {
        let mut scenario = node_with(6, fault::idle_link());
        scenario["gpus"][5]["pcie"] =
            json!({"gen": 4, "max_gen": 5, "width": 8, "max_width": 16, "replay_counter": 37});
        let f = fake("nvml-link", scenario);
        let nvml = f.nvml();
        let idle = nvml.device_by_pci_bus_id(bus(6)).unwrap();
        assert_eq!(idle.current_pcie_link_gen().unwrap(), 1);
        assert_eq!(idle.max_pcie_link_gen().unwrap(), 5);
        assert_eq!(idle.current_pcie_link_width().unwrap(), 16);
        assert_eq!(idle.max_pcie_link_width().unwrap(), 16);
        assert_eq!(idle.pcie_replay_counter().unwrap(), 0);
        let narrow = nvml.device_by_pci_bus_id(bus(5)).unwrap();
        assert_eq!(narrow.current_pcie_link_width().unwrap(), 8);
        assert_eq!(narrow.pcie_replay_counter().unwrap(), 37);
    }

    #[test]
    fn the_replay_counter_answers_through_its_pointer_or_not_supported() {
        let mut scenario = node_of_with(2, 1, json!({}));
        scenario["gpus"][0]["pcie"] = json!({"gen": 4, "max_gen": 4, "width": 16, "max_width": 16});
        scenario["gpus"][1]["pcie"]["replay_counter"] = json!(4_000_000_000u64);
        let f = fake("nvml-replay", scenario);
        let nvml = f.nvml();
        // a GPU whose scenario has no counter: NOT_SUPPORTED, as a GPU without one answers
        let without = nvml.device_by_pci_bus_id(bus(0)).unwrap();
        assert!(
            matches!(without.pcie_replay_counter(), Err(NvmlError::NotSupported)),
            "{:?}",
            without.pcie_replay_counter()
        );
        // an unsigned int, as nvml.h declares it
        let with = nvml.device_by_pci_bus_id(bus(1)).unwrap();
        assert_eq!(with.pcie_replay_counter().unwrap(), 4_000_000_000);
        assert!(
            f.logged("nvmlDeviceGetPcieReplayCounter", &bus(1)),
            "{:?}",
            f.calls()
        );
    }

    #[test]
    fn recovery_action_and_drain_state_read_as_nvml_defines_them() {
        let actions = [
            recovery::NONE,
            recovery::GPU_RESET,
            recovery::NODE_REBOOT,
            recovery::DRAIN_P2P,
            recovery::DRAIN_AND_RESET,
        ];
        assert_eq!(actions, [0, 1, 2, 3, 4]);
        let mut scenario = healthy_node();
        for (i, a) in actions.iter().enumerate() {
            scenario["gpus"][i]["recovery_action"] = json!(a);
        }
        scenario["gpus"][3]["drain"] = json!(true);
        // an older driver does not know the field: that field alone says so
        scenario["gpus"][5]
            .as_object_mut()
            .unwrap()
            .remove("recovery_action");
        scenario["gpus"][6]["not_supported"] =
            json!(["nvmlDeviceGetFieldValues", "nvmlDeviceQueryDrainState"]);
        scenario["gpus"][7]["field_values"] = json!({"94": 12});
        let f = fake("nvml-recovery", scenario);
        let nvml = f.nvml();
        for (i, a) in actions.iter().enumerate() {
            let dev = nvml.device_by_pci_bus_id(bus(i)).unwrap();
            let got = dev.field_values_for(&[FieldId(230)]).unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].as_ref().unwrap().field, FieldId(230));
            assert_eq!(field(&got, 0), Ok(SampleValue::U32(*a)), "GPU {i}");
            assert_eq!(dev.is_drain_enabled(None).unwrap(), i == 3, "GPU {i}");
        }
        let old = nvml.device_by_pci_bus_id(bus(5)).unwrap();
        let got = old.field_values_for(&[FieldId(230)]).unwrap();
        assert_eq!(field(&got, 0), Err("NotSupported".into()));
        let none = nvml.device_by_pci_bus_id(bus(6)).unwrap();
        let r = none.field_values_for(&[FieldId(230)]);
        assert!(matches!(r, Err(NvmlError::NotSupported)), "{r:?}");
        let r = none.is_drain_enabled(None);
        assert!(matches!(r, Err(NvmlError::NotSupported)), "{r:?}");
        // several fields at once, each answered on its own
        let dev = nvml.device_by_pci_bus_id(bus(7)).unwrap();
        let got = dev
            .field_values_for(&[FieldId(94), FieldId(230), FieldId(999)])
            .unwrap();
        assert_eq!(field(&got, 0), Ok(SampleValue::U64(12)));
        assert_eq!(field(&got, 1), Ok(SampleValue::U32(0)));
        assert_eq!(field(&got, 2), Err("NotSupported".into()));
    }

    #[test]
    fn proc_information_matches_the_drivers_format() {
        let real = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/nvidia-proc/L4-information"
        ))
        .unwrap();
        let ours = ProcInfo {
            model: "NVIDIA L4",
            irq: 16,
            uuid: "GPU-3291dfa4-fcc4-0110-615b-c894a0d7c689",
            vbios: "95.04.65.00.13",
            dma_bits: 47,
            bus_location: "0000:70:00.0",
            minor: 0,
            firmware: None,
            excluded: false,
        };
        assert_eq!(ours.render(), real);

        // a node's tree: one entry per GPU the driver probed, NVML's view notwithstanding
        let mut scenario = node_with(2, fault::missing());
        scenario["gpus"][3]["minor"] = json!(6);
        let root = tempdir("proc");
        let gpus = write_proc_gpus(&root, &scenario);
        assert_eq!(gpus, root.join("driver/nvidia/gpus"));
        let mut names: Vec<String> = std::fs::read_dir(&gpus)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let mut expected: Vec<String> = (0..8).map(bus).collect();
        expected.sort();
        assert_eq!(names, expected);
        let info = std::fs::read_to_string(gpus.join(bus(3)).join("information")).unwrap();
        let field = |key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim_start_matches([':', ' ', '\t']).to_string())
                .unwrap()
        };
        assert_eq!(field("Device Minor"), "6");
        assert_eq!(field("Bus Location"), bus(3));
        assert_eq!(field("GPU UUID"), uuid(3));
        assert_eq!(field("GPU Excluded"), "No");
    }
}

/// A node with no NVIDIA driver (no /proc/driver/nvidia, no NVML): env and CDI selectors do
/// nothing. With an NVIDIA PCI function in sysfs but no driver, it is a GPU node with a
/// broken driver, and the selector is judged (unknown, per on_unknown).
#[test]
fn selectors_do_nothing_on_a_node_without_nvidia_and_are_judged_with_a_broken_driver() {
    require_root!();
    let dir = tempdir("nodriver");
    let (proc_root, sysfs_root) = (dir.join("proc"), dir.join("sys"));
    fs::create_dir_all(&proc_root).unwrap();
    fs::create_dir_all(sysfs_root.join("bus/pci/devices")).unwrap();
    let n = node(
        "nodriver",
        Path::new("/nonexistent/libnvidia-ml.so.1"),
        json!({"proc_root": proc_root, "sysfs_root": sysfs_root,
               "policy": {"on_unknown": "reject"}}),
    );
    let mut spec = base_spec(&["true"]);
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=0"]);
    let out = n.prestart(&spec, &healthy_node());
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stderr(&out), "", "{}", text(&out));

    let f = sysfs_root.join("bus/pci/devices/0000:3b:00.0");
    fs::create_dir_all(&f).unwrap();
    fs::write(f.join("vendor"), "0x10de\n").unwrap();
    let out = n.prestart(&spec, &healthy_node());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out)
            .contains("nvml unknown: cannot load /nonexistent/libnvidia-ml.so.1"),
        "{}",
        text(&out)
    );
}

/// `gpu.env_selectors: false`: NVIDIA_VISIBLE_DEVICES selects nothing; a CDI annotation
/// still does.
#[test]
fn env_selectors_false_ignores_nvidia_visible_devices() {
    require_root!();
    let n = node(
        "envsel",
        fake_nvml::lib(),
        json!({"gpu": {"env_selectors": false}}),
    );
    let bad = node_with(
        3,
        json!({"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": false, "failure": true}}),
    );
    let mut spec = base_spec(&["true"]);
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=3"]);
    let out = n.prestart(&spec, &bad);
    assert!(out.status.success(), "{}", text(&out));
    spec["annotations"] = json!({"cdi.k8s.io/x": "nvidia.com/gpu=3"});
    let out = n.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // The toolkit's secure setup turns the variable off for unprivileged containers and
    // lets the device plugin name GPUs by volume mounts instead: those are not the
    // variable, and still select
    let mut spec = base_spec(&["true"]);
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"]);
    spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": format!("/var/run/nvidia-container-devices/{}", uuid(3)),
        "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"]
    }));
    let out = n.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(n.said(&out).contains("remapping failed"), "{}", text(&out));
}

/// A spec that lists no GPU but allows every device (runc reads any rule of type `a`, or
/// of no type, as allow-all; a -1 or missing number as any) lets a container with CAP_MKNOD
/// make and open a broken GPU's node: every GPU under dev_root is checked, and the broken
/// one rejects the start. Access `m` alone (containerd's default) opens nothing. The one
/// exception is the allow-all `rwm` of a privileged container, which holds every device:
/// judged on its assigned devices, it starts with the held line, unless
/// `policy.strict_privileged` is set (issue 35).
#[test]
fn a_wildcard_allow_rule_checks_every_gpu() {
    require_root!();
    let n = node("wildallow", fake_nvml::lib(), json!({}));
    let bad = node_with(
        3,
        json!({"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": false, "failure": true}}),
    );
    let allow_all = json!({"allow": true, "access": "rwm"});
    let mut spec = base_spec(&["true"]);
    spec["linux"]["resources"]["devices"] = json!([allow_all]);
    let out = n.prestart(&spec, &bad);
    assert!(out.status.success(), "{}", text(&out));
    let said = n.said(&out);
    assert!(
        said.contains("devgate: warning: holds ") && said.contains("195:3"),
        "{said}"
    );
    let strict = node(
        "wildallow-strict",
        fake_nvml::lib(),
        json!({"policy": {"strict_privileged": true}}),
    );
    let out = strict.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(strict.said(&out).contains("195:3"), "{}", text(&out));
    for rule in [
        json!({"allow": true, "type": "a", "major": 1, "minor": 3, "access": "rw"}),
        json!({"allow": true, "type": "c", "major": 195, "access": "rwm"}),
        json!({"allow": true, "access": "m"}),
    ] {
        let mut spec = base_spec(&["true"]);
        spec["linux"]["resources"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(rule.clone());
        let out = n.prestart(&spec, &bad);
        assert_eq!(out.status.code(), Some(1), "{rule}: {}", text(&out));
        assert!(n.said(&out).contains("195:3"), "{rule}: {}", text(&out));
    }
    let mut spec = base_spec(&["true"]);
    spec["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({"allow": true, "type": "c", "access": "m"}));
    let out = n.prestart(&spec, &bad);
    assert!(out.status.success(), "{}", text(&out));
}

/// The NVIDIA toolkit's config.toml is read as the toolkit reads it (TOML, top-level key
/// only), and in doubt NVIDIA_VISIBLE_DEVICES selects: devgate checks more GPUs, never fewer.
#[test]
fn toolkit_config_is_read_as_toml_and_doubt_checks_the_gpu() {
    require_root!();
    let dir = tempdir("toolkit-toml");
    let toolkit = dir.join("config.toml");
    let key = "accept-nvidia-visible-devices-envvar-when-unprivileged";
    let n = node(
        "toolkit-toml",
        fake_nvml::lib(),
        json!({"nvidia_toolkit_config": toolkit}),
    );
    let bad = node_with(
        3,
        json!({"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": false, "failure": true}}),
    );
    let mut spec = base_spec(&["true"]);
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=3"]);
    // A key under a table is that table's: the toolkit's top-level switch stays true.
    fs::write(&toolkit, format!("[nvidia-container-cli]\n{key} = false\n")).unwrap();
    let out = n.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // The toolkit cannot load a file that is not TOML; devgate checks the GPU and says why.
    fs::write(&toolkit, format!("{key} = false\n[broken\n")).unwrap();
    let out = n.prestart(&spec, &bad);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        n.said(&out).contains("warning: NVIDIA toolkit config"),
        "{}",
        text(&out)
    );
    fs::write(&toolkit, format!("{key} = false\n")).unwrap();
    let out = n.prestart(&spec, &bad);
    assert!(out.status.success(), "the file says false: {}", text(&out));
}

/// Unset `nvidia_toolkit_config`: the file NVIDIA_CTK_CONFIG_FILE_PATH names (as the GPU
/// operator's wrappers set it) is one the toolkit reads, so its `false` counts.
#[test]
fn toolkit_config_named_by_the_toolkits_variable_counts() {
    require_root!();
    for p in [
        "/etc/nvidia-container-runtime/config.toml",
        "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
    ] {
        if Path::new(p).exists() {
            eprintln!("skipped: this host has {p}, which devgate reads too");
            return;
        }
    }
    let dir = tempdir("toolkit-env");
    let toolkit = dir.join("config.toml");
    fs::write(
        &toolkit,
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n",
    )
    .unwrap();
    let n = node("toolkit-env", fake_nvml::lib(), json!({}));
    let bad = node_with(
        3,
        json!({"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": false, "failure": true}}),
    );
    let mut spec = base_spec(&["true"]);
    spec["process"]["env"] = json!(["NVIDIA_VISIBLE_DEVICES=3"]);
    let out = n.prestart(&spec, &bad);
    assert_eq!(
        out.status.code(),
        Some(1),
        "no toolkit file: {}",
        text(&out)
    );
    let out = n.prestart_env(
        &spec,
        &bad,
        &[("NVIDIA_CTK_CONFIG_FILE_PATH", toolkit.as_path())],
    );
    assert!(out.status.success(), "{}", text(&out));
}

/// A container's own environment and annotations only add GPUs to check, never take one
/// off: a bad GPU its spec lists is rejected just as without them, whatever it sets. That
/// holds for `all` (which alone only warns: the GPU stays the listed one, not one `all`
/// chose), `void` and `none` (which alone select nothing), a CDI `all`, and devgate's own
/// variables and the toolkit's, which in a container's env are not devgate's.
#[test]
fn a_containers_environment_never_takes_a_listed_gpu_off_the_check() {
    require_root!();
    let n = node("envlift", fake_nvml::lib(), json!({}));
    let bad = node_with(
        3,
        json!({"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": false, "failure": true}}),
    );
    // what a devgate that read the container's DEVGATE_CONFIG would then go by
    let mut lenient: Value = serde_json::from_slice(&fs::read(&n.env.config).unwrap()).unwrap();
    lenient["policy"] = json!({"default": "allow", "on_unknown": "allow"});
    let lenient_path = n.dir.join("lenient.json");
    fs::write(&lenient_path, lenient.to_string()).unwrap();

    let listed = spec_with_gpus(&[3]);
    let plain = n.prestart(&listed, &bad);
    assert_eq!(plain.status.code(), Some(1), "{}", text(&plain));
    assert!(n.said(&plain).contains("195:3"), "{}", text(&plain));
    let env_of = |vars: &[&str]| {
        let mut s = listed.clone();
        s["process"]["env"] = json!(vars);
        s
    };
    let devgate_config = format!("DEVGATE_CONFIG={}", lenient_path.display());
    let mut cdi_all = listed.clone();
    cdi_all["annotations"] = json!({"cdi.k8s.io/x": "nvidia.com/gpu=all"});
    let hostile = [
        ("all", env_of(&["NVIDIA_VISIBLE_DEVICES=all"])),
        ("void", env_of(&["NVIDIA_VISIBLE_DEVICES=void"])),
        ("none", env_of(&["NVIDIA_VISIBLE_DEVICES=none"])),
        ("empty", env_of(&["NVIDIA_VISIBLE_DEVICES="])),
        (
            "devgate's and the toolkit's variables",
            env_of(&[
                &devgate_config,
                "DEVGATE_HANDED_ON=1",
                "DEVGATE_RUNTIME_WRAPPED=1",
                "NVIDIA_DISABLE_REQUIRE=true",
                "NVIDIA_DRIVER_CAPABILITIES=all",
            ]),
        ),
        ("a CDI all", cdi_all),
    ];
    for (what, spec) in hostile {
        let out = n.prestart(&spec, &bad);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
        assert_eq!(n.said(&out), n.said(&plain), "{what}");
    }
}

/// Round 4's selectors through the hook. nvidia-container-cli reads `3:0:0` as a PCI bus id,
/// and where no GPU has it, as MIG device 3:0, which it hands over with GPU 3: so GPU 3 is
/// checked, and its failure rejects the start (not an unknown that only warns). A legacy
/// CUDA image with a device plugin mount of GPU 0 gets every GPU from a toolkit at its
/// defaults (`accept-nvidia-visible-devices-as-volume-mounts` false): GPU 3 is checked as
/// one of `all`, a warning; where the node's toolkit reads the mounts, GPU 0 alone.
#[test]
fn round_4_selectors_check_the_gpu_the_toolkit_hands_over() {
    require_root!();
    let dir = tempdir("round4-toolkit");
    let mounts_on = dir.join("config.toml");
    fs::write(
        &mounts_on,
        "accept-nvidia-visible-devices-as-volume-mounts = true\n",
    )
    .unwrap();
    let bad = node_with(
        3,
        json!({"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": false, "failure": true}}),
    );
    let defaults = node(
        "round4",
        fake_nvml::lib(),
        json!({"nvidia_toolkit_config": dir.join("absent.toml")}),
    );
    for token in ["3:0:0", "3:0:ff", "+3:0:0", "3:2:-1"] {
        let mut spec = base_spec(&["true"]);
        spec["process"]["env"] = json!([format!("NVIDIA_VISIBLE_DEVICES={token}")]);
        let out = defaults.prestart(&spec, &bad);
        assert_eq!(out.status.code(), Some(1), "{token}: {}", text(&out));
        assert!(
            defaults.said(&out).contains("remapping failed"),
            "{}",
            text(&out)
        );
    }
    let mut legacy = base_spec(&["true"]);
    legacy["process"]["env"] = json!(["CUDA_VERSION=12.2"]);
    legacy["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/var/run/nvidia-container-devices/0",
        "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"]
    }));
    let out = defaults.prestart(&legacy, &bad);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        defaults.said(&out).contains("remapping failed"),
        "{}",
        text(&out)
    );
    let reads_mounts = node(
        "round4-mounts",
        fake_nvml::lib(),
        json!({"nvidia_toolkit_config": mounts_on}),
    );
    let out = reads_mounts.prestart(&legacy, &bad);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !reads_mounts.said(&out).contains("remapping failed"),
        "{}",
        text(&out)
    );
}
