//! Wall time of `devgate hook prestart` on realistic Kubernetes configs, against exec'ing
//! /bin/true with the same stdin. Run with `make bench` (cargo bench --bench prestart).
//!
//! Cases: a containerd CRI config with no devices (the path every container on the node
//! takes), and the same config with 8 devices in linux.devices.

use serde_json::{json, Value};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 400;

fn seccomp() -> Value {
    // containerd's RuntimeDefault profile lists a few hundred syscalls; the size matters
    // because devgate must skip over it while parsing.
    let names: Vec<String> = (0..360).map(|i| format!("syscall_name_{i}")).collect();
    json!({"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
           "syscalls": [{"names": names, "action": "SCMP_ACT_ALLOW"}]})
}

fn k8s_spec(devices: Value, rules: Value) -> Value {
    let caps = json!([
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FSETID",
        "CAP_FOWNER",
        "CAP_MKNOD",
        "CAP_NET_RAW",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETFCAP",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_KILL",
        "CAP_AUDIT_WRITE"
    ]);
    let pod = "/var/lib/kubelet/pods/8f0c1a2e-4b7d-4c39-9e61-0d6a1b2c3d4e";
    let mut env: Vec<String> = vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        "HOSTNAME=trainer-0".into(),
    ];
    for i in 0..24 {
        env.push(format!("SERVICE_{i}_PORT=tcp://10.96.{i}.1:443"));
    }
    json!({
        "ociVersion": "1.1.0",
        "process": {"user": {"uid": 0, "gid": 0, "additionalGids": [0, 1, 2, 3, 4, 6, 10, 11, 20, 26, 27]},
                    "args": ["python", "train.py", "--epochs", "100"], "env": env, "cwd": "/workspace",
                    "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
                    "apparmorProfile": "cri-containerd.apparmor.d", "oomScoreAdj": 1000},
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
            {"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts", "options": ["rbind", "rprivate", "rw"]},
            {"destination": "/dev/termination-log", "type": "bind", "source": "/etc/hostname", "options": ["rbind", "rprivate", "rw"]},
            {"destination": "/etc/hostname", "type": "bind", "source": "/etc/hostname", "options": ["rbind", "rprivate", "rw"]},
            {"destination": "/etc/resolv.conf", "type": "bind", "source": "/etc/resolv.conf", "options": ["rbind", "rprivate", "rw"]},
            {"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "rprivate", "rw"]},
            {"destination": "/var/run/secrets/kubernetes.io/serviceaccount", "type": "bind",
             "source": format!("{pod}/volumes/kubernetes.io~projected/kube-api-access-x2x9z"), "options": ["rbind", "rprivate", "ro"]}
        ],
        "annotations": {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": "trainer",
            "io.kubernetes.cri.image-name": "registry.example/ml/trainer:1.4.2",
            "io.kubernetes.cri.sandbox-id": "4f0e8a3d1c2b5a6978e0d1c2b3a4958675a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0",
            "io.kubernetes.cri.sandbox-name": "trainer-0",
            "io.kubernetes.cri.sandbox-namespace": "ml",
            "io.kubernetes.cri.sandbox-uid": "8f0c1a2e-4b7d-4c39-9e61-0d6a1b2c3d4e"
        },
        "linux": {
            "resources": {"devices": rules, "memory": {"limit": 68719476736_u64, "swap": 68719476736_u64},
                          "cpu": {"shares": 8192, "quota": 800000, "period": 100000}},
            "cgroupsPath": "/kubepods/burstable/pod8f0c1a2e-4b7d-4c39-9e61-0d6a1b2c3d4e/4f0e8a3d1c2b",
            "namespaces": [{"type": "pid"}, {"type": "ipc", "path": "/proc/4242/ns/ipc"}, {"type": "uts", "path": "/proc/4242/ns/uts"},
                           {"type": "mount"}, {"type": "network", "path": "/proc/4242/ns/net"}],
            "devices": devices,
            "seccomp": seccomp(),
            "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                            "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"],
            "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

fn default_rules() -> Vec<Value> {
    vec![
        json!({"allow": false, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": 1, "minor": 5, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": 1, "minor": 7, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": 1, "minor": 8, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": 1, "minor": 9, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": 5, "minor": 0, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": 5, "minor": 2, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": 136, "access": "rwm"}),
        json!({"allow": true, "type": "c", "major": 10, "minor": 200, "access": "rwm"}),
    ]
}

struct Case {
    name: &'static str,
    state: PathBuf,
}

fn setup(dir: &Path) -> (PathBuf, Vec<Case>) {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir.join("dev")).unwrap();
    let config = dir.join("devgate.json");
    // state_dir lives on tmpfs in production (/run/devgate); keep it there so the numbers
    // are a node's, not an ext4 journal's.
    let run = Path::new("/dev/shm").join(dir.file_name().unwrap());
    fs::write(
        &config,
        json!({
            "state_dir": run.join("state"), "quarantine_dir": dir.join("quarantine"),
            "dev_root": dir.join("dev"), "log_file": dir.join("log/decisions.jsonl")
        })
        .to_string(),
    )
    .unwrap();

    let mut cases = Vec::new();
    for (name, ndev) in [("no devices", 0u32), ("8 devices", 8)] {
        let bundle = dir.join(format!("bundle-{ndev}"));
        fs::create_dir_all(&bundle).unwrap();
        let mut devices = Vec::new();
        let mut rules = default_rules();
        for i in 0..ndev {
            // Char nodes of a driver with no sysfs entry, as NVIDIA's are.
            let node = dir.join(format!("dev/accel{i}"));
            let _ = nix::sys::stat::mknod(
                &node,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(240, i as u64),
            );
            devices.push(json!({"path": format!("/dev/accel{i}"), "type": "c", "major": 240, "minor": i, "fileMode": 438, "uid": 0, "gid": 0}));
            rules.push(
                json!({"allow": true, "type": "c", "major": 240, "minor": i, "access": "rw"}),
            );
        }
        fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&k8s_spec(json!(devices), json!(rules))).unwrap(),
        )
        .unwrap();
        let state = dir.join(format!("state-{ndev}.json"));
        fs::write(
            &state,
            json!({"ociVersion": "1.1.0", "id": format!("4f0e8a3d1c2b{ndev}"), "status": "created",
                                 "pid": 4242, "bundle": bundle, "annotations": {}})
            .to_string(),
        )
        .unwrap();
        cases.push(Case { name, state });
    }
    (config, cases)
}

fn time_runs(mut cmd: impl FnMut() -> Command, stdin: &Path) -> Vec<Duration> {
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let mut c = cmd();
        c.stdin(File::open(stdin).unwrap())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let t = Instant::now();
        let status = c.status().unwrap();
        times.push(t.elapsed());
        assert!(
            status.success() || status.code() == Some(1),
            "benchmarked command failed"
        );
    }
    times.sort();
    times
}

fn median(t: &[Duration]) -> f64 {
    t[t.len() / 2].as_secs_f64() * 1e6
}

fn p90(t: &[Duration]) -> f64 {
    t[t.len() * 9 / 10].as_secs_f64() * 1e6
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --all-targets` lists benches; nothing to run then
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_devgate"));
    let dir = std::env::temp_dir().join(format!("devgate-bench-{}", std::process::id()));
    let (config, cases) = setup(&dir);
    println!("devgate prestart benchmark: {RUNS} runs each, median and p90 wall time (µs)");
    println!("{:<34} {:>10} {:>10}", "case", "median", "p90");
    for case in &cases {
        let base = time_runs(|| Command::new("/bin/true"), &case.state);
        let dg = time_runs(
            || {
                let mut c = Command::new(&bin);
                c.arg("--config").arg(&config).args(["hook", "prestart"]);
                c
            },
            &case.state,
        );
        println!(
            "{:<34} {:>10.0} {:>10.0}",
            format!("/bin/true ({})", case.name),
            median(&base),
            p90(&base)
        );
        println!(
            "{:<34} {:>10.0} {:>10.0}",
            format!("devgate prestart ({})", case.name),
            median(&dg),
            p90(&dg)
        );
        println!(
            "{:<34} {:>10.2}x",
            "  ratio (median)",
            median(&dg) / median(&base)
        );
    }
    let _ = fs::remove_dir_all(&dir);
    let _ = fs::remove_dir_all(Path::new("/dev/shm").join(dir.file_name().unwrap()));
}
