//! Forged XIDs, end to end on the real kernel and the real runc (issue: kernel-log trust).
//!
//! - An unprivileged user (`nobody`) runs a crashing binary whose file name is an NVRM XID
//!   line for GPU 1's PCI address. The kernel reports the segfault in /dev/kmsg with that
//!   name in it (and, run by that name, with the record *beginning* `NVRM: Xid (PCI:`, the
//!   task's 15-byte comm). A GPU container on GPU 1, with devgate reading the real
//!   /dev/kmsg, then starts with no warning.
//! - Root writes an XID line to /dev/kmsg (`<14>…`, and `<4>…` asking for the kernel
//!   facility, which the kernel does not grant): ignored.
//! - A forged driver load (a segfault report naming a binary called after the load line, a
//!   /dev/kmsg write) after a real XID does not hide that XID. Userspace cannot log with the
//!   kernel facility, so the real XID and load come from a file fixture.
//!
//! Segfault reports and /dev/kmsg writes are rate-limited, so each forgery is looked up in
//! /dev/kmsg after it is made, and tried again a few times; a kernel that does not report
//! unhandled signals (`/proc/sys/debug/exception-trace` = 0) skips the segfault case.

mod common;
use common::fake_nvml::*;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// GPU 1 of the fake node: /dev/nvidia1, PCI 0000:3b:00.0.
const GPU_PCI: &str = "0000:3b:00";

static NONCE: AtomicU32 = AtomicU32::new(0);

/// A pid no real report carries, so each run finds its own records in /dev/kmsg.
fn nonce() -> String {
    format!(
        "{}{:03}",
        std::process::id(),
        NONCE.fetch_add(1, Ordering::SeqCst)
    )
}

fn xid_line(nonce: &str) -> String {
    format!("NVRM: Xid (PCI:{GPU_PCI}): 79, pid={nonce}, GPU has fallen off the bus.")
}

const LOAD_LINE: &str =
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Thu Feb 22 01:44:30 UTC 2024";

/// Every record /dev/kmsg holds now, as `pri,seq,ts,flags;message` lines.
fn kmsg_records() -> Vec<String> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .expect("root can read /dev/kmsg");
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).trim_end().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // EPIPE: records were overwritten since the last read; go on
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("reading /dev/kmsg: {e}"),
        }
    }
    out
}

/// The /dev/kmsg record whose message contains `needle`, if it landed.
fn landed(needle: &str) -> Option<String> {
    kmsg_records().into_iter().find(|r| r.contains(needle))
}

/// Does `make` until `needle` shows up in /dev/kmsg, a few times across the kernel's
/// printk rate-limit interval (5 s by default).
fn until_landed(needle: &str, mut make: impl FnMut()) -> Option<String> {
    for attempt in 0..4 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_secs(6));
        }
        make();
        if let Some(r) = landed(needle) {
            return Some(r);
        }
    }
    None
}

/// A static program that writes to address 0, no libc needed.
fn build_crasher(dir: &Path) -> PathBuf {
    require_cmd("gcc", "gcc");
    let src = dir.join("crash.c");
    fs::write(
        &src,
        "void _start(void) { *(volatile int *)0 = 0; for (;;) ; }\n",
    )
    .unwrap();
    let bin = dir.join("crash");
    let out = Command::new("gcc")
        .args(["-nostdlib", "-static", "-O0", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap();
    assert!(out.status.success(), "gcc: {}", text(&out));
    bin
}

fn nobody() -> (u32, u32) {
    let u = nix::unistd::User::from_name("nobody")
        .unwrap()
        .expect("user nobody exists");
    (u.uid.as_raw(), u.gid.as_raw())
}

/// Runs `path` as nobody and checks it died of SIGSEGV.
fn crash_as_nobody(path: &Path) {
    let (uid, gid) = nobody();
    let status = Command::new(path)
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGSEGV),
        "{} did not segfault: {status:?}",
        path.display()
    );
}

fn exception_trace_on() -> bool {
    fs::read_to_string("/proc/sys/debug/exception-trace")
        .map(|s| s.trim() != "0")
        .unwrap_or(false)
}

/// A container given /dev/nvidia1 under runc, devgate's hooks reading the fake NVML's
/// healthy node and the kernel log `kmsg`.
fn run_gpu_container(tag: &str, kmsg: &Path) -> (Env, Bundle, Output) {
    let node = GpuNode::new(tag);
    let mut cfg = node.config();
    cfg["kmsg_path"] = json!(kmsg);
    let env = Env::with(tag, cfg);
    // A driver without NVML's recovery action field, so that the kernel log alone decides:
    // where the field says NONE, an old XID only warns (docs/gpus.md).
    let old_driver = node_with(1, json!({"not_supported": ["nvmlDeviceGetFieldValues"]}));
    let scenario = write_scenario(&node.dir, "node", &old_driver);
    let mut b = Bundle::new(
        tag,
        &["sh", "-c", "test -c /dev/nvidia1 && echo ran > /out/ran"],
    );
    b.add_device("/dev/nvidia1", "c", 195, 1);
    b.add_hooks(&env, &["prestart", "poststop"]);
    // runc gives a hook only the environment its entry names
    for stage in ["prestart", "poststop"] {
        for h in b.spec["hooks"][stage].as_array_mut().unwrap() {
            h["env"] = json!([format!("FAKE_NVML_CONFIG={}", scenario.display())]);
        }
    }
    let out = runtime_run("runc", &b, &unique_id(tag));
    (env, b, out)
}

/// The xid probe's verdict on the container's one device in its start decision.
fn xid_verdict(decision: &Value) -> Value {
    decision["devices"][0]["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["probe"] == "xid")
        .cloned()
        .unwrap_or_else(|| panic!("no xid verdict: {decision}"))
}

/// Started, ran, and devgate had nothing to say: allowed, the xid probe healthy (so it did
/// read the log: an unreadable log is `unknown`, a warning).
fn started_without_warning(env: &Env, b: &Bundle, out: &Output) {
    assert!(out.status.success(), "{}", text(out));
    assert_eq!(fs::read_to_string(b.marker()).unwrap(), "ran\n");
    let all = text(out);
    assert!(!all.contains("devgate: warning"), "{all}");
    let d = env.decisions().pop().expect("a start decision");
    assert_eq!(d["action"], "allow", "{d}");
    assert_eq!(xid_verdict(&d)["status"], "healthy", "{d}");
}

fn rejected_for_xid79(env: &Env, b: &Bundle, out: &Output) {
    let all = text(out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(&format!(
            "xid: xid 79 (GPU has fallen off the bus) on {GPU_PCI} reported 1 time since the driver loaded"
        )),
        "{all}"
    );
    assert!(!b.marker().exists(), "the container ran although rejected");
    let d = env.decisions().pop().unwrap();
    assert_eq!(d["action"], "reject");
    assert_eq!(xid_verdict(&d)["code"], "xid_critical", "{d}");
}

/// A kernel-log file of `records` (`(pri, message)`), numbered from 1.
fn kmsg_file(dir: &Path, records: &[(u32, &str)]) -> PathBuf {
    let text: String = records
        .iter()
        .enumerate()
        .map(|(i, (pri, msg))| format!("{pri},{},{},-;{msg}\n", i + 1, 5_000_000 + i * 1000))
        .collect();
    let p = dir.join("kmsg");
    fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_segfaulting_binary_named_after_an_xid_does_not_mark_its_gpu() {
    require_root!();
    if !exception_trace_on() {
        eprintln!(
            "skipped: /proc/sys/debug/exception-trace is 0, the kernel does not report segfaults"
        );
        return;
    }
    let dir = tempdir("forge-segv");
    let crasher = build_crasher(&dir);
    // world-executable, in a directory nobody can enter
    fs::set_permissions(&crasher, fs::Permissions::from_mode(0o755)).unwrap();

    // Run by its NVRM name: comm is `NVRM: Xid (PCI:`, so the kernel's record itself begins
    // with `NVRM: ` at the kernel facility; only the full XID parse keeps it out.
    let n1 = nonce();
    let named = dir.join(xid_line(&n1));
    fs::copy(&crasher, &named).unwrap();
    let by_name = until_landed(&format!("pid={n1}, GPU has fallen off the bus.["), || {
        crash_as_nobody(&named)
    });
    // Run through a link called gpujob: the report reads `gpujob[…]: segfault … in NVRM: …`.
    let n2 = nonce();
    let target = dir.join(xid_line(&n2));
    fs::copy(&crasher, &target).unwrap();
    let link = dir.join("gpujob");
    symlink(&target, &link).unwrap();
    let by_link = until_landed(&format!("pid={n2}, GPU has fallen off the bus.["), || {
        crash_as_nobody(&link)
    });
    let (Some(by_name), Some(by_link)) = (by_name, by_link) else {
        eprintln!(
            "skipped: the kernel's segfault reports did not reach /dev/kmsg (rate-limited \
             or filtered); nothing to test against"
        );
        return;
    };
    // what the kernel made of them: kernel facility, the forged line inside
    assert!(by_name.contains(";NVRM: Xid (PCI:["), "{by_name}");
    assert!(by_link.contains(";gpujob["), "{by_link}");
    for r in [&by_name, &by_link] {
        let pri: u32 = r.split(',').next().unwrap().parse().unwrap();
        assert_eq!(pri >> 3, 0, "a kernel-facility record: {r}");
        assert!(r.contains(": segfault at "), "{r}");
    }

    let (env, b, out) = run_gpu_container("forge-segv", Path::new("/dev/kmsg"));
    started_without_warning(&env, &b, &out);

    // The same records in a log file, then a real XID after them: that one rejects, so the
    // records above were read and discounted, not missed.
    let msg = |r: &str| r.split_once(';').unwrap().1.to_string();
    let (m1, m2) = (msg(&by_name), msg(&by_link));
    let files = tempdir("forge-segv-files");
    let only_forged = kmsg_file(&files, &[(6, &m1), (6, &m2)]);
    let (env, b, out) = run_gpu_container("forge-segv2", &only_forged);
    started_without_warning(&env, &b, &out);
    let real = xid_line(&nonce());
    let then_real = kmsg_file(&files, &[(6, &m1), (6, &m2), (3, &real)]);
    let (env, b, out) = run_gpu_container("forge-segv3", &then_real);
    rejected_for_xid79(&env, &b, &out);
}

#[test]
fn an_xid_line_root_writes_to_dev_kmsg_is_ignored() {
    require_root!();
    let n = nonce();
    let line = xid_line(&n);
    // <14>: user.info; <4>: asks for kern.warning, which the kernel turns into user (12).
    let written = until_landed(&format!("pid={n}, GPU"), || {
        for pri in [14, 4] {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .open("/dev/kmsg")
                .expect("root can open /dev/kmsg for writing");
            use std::io::Write;
            let _ = f.write_all(format!("<{pri}>{line}").as_bytes());
        }
    });
    let Some(_) = written else {
        eprintln!(
            "skipped: writes to /dev/kmsg do not land (printk_devkmsg is off or rate-limited)"
        );
        return;
    };
    let ours: Vec<String> = kmsg_records()
        .into_iter()
        .filter(|r| r.ends_with(&format!(";{line}")))
        .collect();
    assert!(!ours.is_empty());
    for r in &ours {
        let pri: u32 = r.split(',').next().unwrap().parse().unwrap();
        assert_eq!(pri >> 3, 1, "a /dev/kmsg write is user facility: {r}");
    }

    let (env, b, out) = run_gpu_container("forge-write", Path::new("/dev/kmsg"));
    started_without_warning(&env, &b, &out);

    // the same message with the kernel facility (only the kernel can log so) rejects
    let files = tempdir("forge-write-file");
    let kernel = kmsg_file(&files, &[(3, &line)]);
    let (env, b, out) = run_gpu_container("forge-write2", &kernel);
    rejected_for_xid79(&env, &b, &out);
}

#[test]
fn a_forged_driver_load_does_not_hide_an_earlier_real_xid() {
    require_root!();
    let xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.";
    // The kernel's own segfault reports (their shape copied from this kernel's), for a
    // binary named after the load line: run through a link `gpujob`, and by its own name,
    // when the record begins with its 15-byte comm `NVRM: loading N`.
    let via_link = format!(
        "gpujob[3700]: segfault at 0 ip 0000000000401009 sp 00007fff117c0948 error 6 in \
         {LOAD_LINE}[1009,401000+1000] likely on CPU 0 (core 0, socket 0)"
    );
    let by_name = format!(
        "NVRM: loading N[3701]: segfault at 0 ip 0000000000401009 sp 00007ffd2a1c0948 error 6 \
         in {LOAD_LINE}[1009,401000+1000] likely on CPU 1 (core 1, socket 0)"
    );
    let oom =
        format!("Out of memory: Killed process 3702 ({LOAD_LINE}) total-vm:1024kB, anon-rss:512kB");
    let open_load = "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release \
                     Build  (dvs-builder@U16-I3-B03-4-3)  Thu Feb 22 01:25:25 UTC 2024";
    let records: Vec<(u32, &str)> = vec![
        (4, LOAD_LINE), // the real load, at boot
        (3, xid),       // the real XID after it
        (6, &via_link),
        (6, &by_name),
        (3, &oom),
        (14, LOAD_LINE), // /dev/kmsg writes: user facility, whatever they asked for
        (12, open_load),
    ];
    let dir = tempdir("forge-load");
    let log = kmsg_file(&dir, &records);
    let (env, b, out) = run_gpu_container("forge-load", &log);
    rejected_for_xid79(&env, &b, &out);

    // a real load after the XID does clear it: the forged ones above were read and refused
    let mut cleared = records.clone();
    cleared.push((4, open_load));
    let log = kmsg_file(&dir, &cleared);
    let (env, b, out) = run_gpu_container("forge-load2", &log);
    started_without_warning(&env, &b, &out);
}
