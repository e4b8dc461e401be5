//! A real one-node Kubernetes cluster for the tests, built from Kubernetes' own modules
//! (scripts/k8s-binaries.sh): etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager, containerd with devgate installed as docs/install.md says, the
//! fake GPUs' device plugin, and kubelet. Everything lives under one temp dir; each
//! process is started and stopped by pid.
//!
//! The processes share one private mount namespace in which /run, /var/tmp, /var/lib and
//! /var/log are fresh tmpfs mounts: kubelet and containerd use some fixed paths whatever
//! their configuration says (/var/lib/kubelet/device-plugins, /var/log/containers, shim
//! sockets), and a test never writes into the host's.
//!
//! The node has a network namespace of its own: its components listen on its loopback
//! at their usual ports, and pods that are not hostNetwork get addresses on a bridge
//! there (the CNI bridge plugin); nothing reaches the host's network. Pods ask for `nvidia.com/gpu` as on a GPU node; the
//! device plugin hands out /dev/nvidiaN (char 195:N under the test's dev root) and
//! NVIDIA_VISIBLE_DEVICES as NVIDIA's does.
//! With `Options::dra_driver`, a fake DRA driver publishes the same GPUs as NVIDIA's DRA
//! driver does (`gpu.nvidia.com`) and containerd reads its CDI spec where it can (1.7+).
//!
//! `DEVGATE_K8S_KEEP=1` leaves the node up at the end of a test and prints how to reach it
//! (docs/development.md, "The real node").

use super::cri::Config as CriConfig;
use super::fake_nvml;
use super::*;
use std::cell::{Cell, RefCell};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Child;
use std::time::{Duration, Instant};

/// Longer than any step takes on a 2-core machine; a step that never happens fails the
/// test with the logs that say why instead of hanging it.
pub const STEP_DEADLINE: Duration = Duration::from_secs(240);

/// The node's name, as kubelet registers it.
pub const NODE: &str = "devgate-node";

/// One node at a time in a test process: each is a whole control plane on a 2-core machine.
static ONE_NODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The right to start a node, where this host can start pods: a CRI pod sandbox sets
/// cpu.weight, which a unified node without the cpu controller (this project's machines'
/// cgroup2) cannot give. There it says so, naming the `cases` it skips, and gives None.
pub fn one_node(cases: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    if let Some(why) = super::node::unified_without("cpu") {
        eprintln!(
            "skipped: {why}: no pod sandbox can start, so the {cases} run on the hybrid \
             layout only"
        );
        return None;
    }
    Some(ONE_NODE.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Runs `cases` (`run`, given the release) on release `minor` (`v1.37`), holding the one
/// node's lock; where this host can start no pod, says so and runs nothing.
pub fn on_release(minor: &str, cases: &str, run: impl FnOnce(&str)) {
    let Some(_one) = one_node(cases) else {
        return;
    };
    run(&release_named(minor));
}

/// `minor` (`v1.37`), checked to be among the releases under tests/k8s.
pub fn release_named(minor: &str) -> String {
    let all = releases();
    assert!(
        all.iter().any(|r| r == minor),
        "{minor} is not among {all:?}"
    );
    minor.to_string()
}

/// The releases under tests/k8s, oldest first (`v1.36`, `v1.37`).
pub fn releases() -> Vec<String> {
    let out = output_of(Command::new(script()).arg("releases"));
    assert!(
        out.status.success(),
        "k8s-binaries.sh releases: {}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/k8s-binaries.sh")
}

/// The bin dir of `release`'s binaries (or of the suite's plugins, for "plugins"): built now where they are not cached (minutes),
/// found at once where they are. A build that fails fails the test with its output.
pub fn binaries(release: &str) -> PathBuf {
    let out = output_of(Command::new(script()).args(["build", release]));
    let said = text(&out);
    assert!(
        out.status.success(),
        "k8s-binaries.sh build {release}:\n{said}"
    );
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let bin = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(PathBuf::from)
        .unwrap_or_default();
    assert!(bin.is_dir(), "no {}: {said}", bin.display());
    bin
}

/// One process of the node, stopped by pid when dropped.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of `path`.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What a test sets up beyond the defaults.
#[derive(Default)]
pub struct Options {
    /// devgate installed by hand, as docs/install.md says (else the node has no devgate
    /// until a test installs it).
    pub devgate_by_hand: bool,
    /// The fake DRA driver too (tests/k8s/plugins/fake-dra-driver): the GPUs published
    /// as NVIDIA's DRA driver publishes them (driver and DeviceClass `gpu.nvidia.com`, a
    /// pool named after the node, devices `gpu-<minor>`), beside the device plugin;
    /// containerd reads its CDI spec where it can (`K8sNode::cdi`).
    pub dra_driver: bool,
    /// Authorization by Node and RBAC (else AlwaysAllow), so a test can hold a component
    /// to the rights its manifests grant; the scheduler and controller-manager then run
    /// as system:masters, as no test here is about theirs.
    pub rbac: bool,
}

/// The DRA driver's name, its DeviceClass's and the CDI vendor's.
pub const DRA_DRIVER: &str = "gpu.nvidia.com";

pub struct K8sNode {
    pub release: String,
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub env: Env,
    pub gpus: fake_nvml::GpuNode,
    pub kubeconfig: PathBuf,
    pub kubelet_root: PathBuf,
    pub pod_logs: PathBuf,
    holder: RefCell<Option<Proc>>,
    procs: RefCell<Vec<Proc>>,
    api_args: RefCell<Vec<String>>,
    rbac: bool,
    /// The node's systemctl's requests (a FIFO) and what was read of them.
    systemd: RefCell<Option<(fs::File, Vec<u8>)>>,
    /// How many times the node's systemctl restarted containerd.
    pub restarts: Cell<u32>,
    /// Whether containerd reads CDI specs (1.7 and later): a DRA claim's device reaches
    /// the container only then.
    pub cdi: bool,
    dra_driver: bool,
}

impl K8sNode {
    /// Starts the whole node for `release` and waits until it is Ready with its GPUs
    /// allocatable. Fails the test, with the last log lines of the process that did not
    /// come up, where one does not.
    pub fn start(tag: &str, release: &str, opts: Options) -> K8sNode {
        let bin = binaries(release);
        let dir = tempdir(tag);
        let gpus = fake_nvml::GpuNode::new(&format!("{tag}-gpus"));
        let nvml = fake_nvml::private_lib(&gpus.dir, &fake_nvml::node_with(0, json!({})));
        let kubelet_root = dir.join("kubelet");
        let pod_logs = dir.join("pod-logs");
        let mut config = gpus.config();
        config["nvml_library"] = json!(nvml);
        config["kubelet_pods_dir"] = json!(kubelet_root.join("pods"));
        config["kubelet_pod_logs_dir"] = json!(pod_logs);
        let env = Env::with(&format!("{tag}-devgate"), config);
        let mut node = K8sNode {
            release: release.to_string(),
            kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            bin,
            env,
            gpus,
            kubelet_root,
            pod_logs,
            holder: RefCell::new(None),
            procs: RefCell::new(Vec::new()),
            api_args: RefCell::new(Vec::new()),
            rbac: opts.rbac,
            systemd: RefCell::new(None),
            restarts: Cell::new(0),
            cdi: containerd_has_cdi(),
            dra_driver: opts.dra_driver,
        };
        node.start_namespace();
        node.start_control_plane();
        node.start_containerd(opts.devgate_by_hand);
        node.start_kubelet();
        node.wait_ready();
        if node.dra_driver {
            node.start_dra_driver();
        }
        node
    }

    /// The namespace every process of the node enters, held by a sleeping process: /etc
    /// and /usr are overlays whose writes go to a tmpfs, /run, /var/tmp, /var/lib and
    /// /var/log are fresh tmpfs mounts; systemd's socket directory is there, with
    /// `SYSTEMCTL` as the node's systemctl.
    fn start_namespace(&mut self) {
        let ready = self.dir.join("ns-ready");
        let log = self.dir.join("namespace.log");
        let upper = self.dir.join("ns-upper");
        fs::create_dir_all(&upper).unwrap();
        let child = Command::new("unshare")
            .args(["--mount", "--net", "--propagation", "private", "sh", "-ec"])
            .arg(
                r#"ready=$0 up=$1 systemctl=$2
                   ip link set lo up
                   mount -t tmpfs -o mode=755 tmpfs "$up"
                   for d in etc usr; do
                       mkdir -p "$up/$d/upper" "$up/$d/work"
                       mount -t overlay overlay \
                           -o "lowerdir=/$d,upperdir=$up/$d/upper,workdir=$up/$d/work" "/$d"
                   done
                   for d in /run /var/tmp /var/lib /var/log; do
                       mount -t tmpfs -o mode=755 tmpfs "$d"
                   done
                   mkdir -p /run/containerd /run/systemd/system /run/devgate-test-systemd/answers \
                            /var/log/containers /var/lib/containers \
                            /var/lib/kubelet/device-plugins /etc/containerd
                   mkfifo -m 600 /run/devgate-test-systemd/requests
                   printf '%s' "$systemctl" > /usr/bin/systemctl
                   chmod 755 /usr/bin/systemctl
                   : > "$ready"; exec sleep infinity"#,
            )
            .arg(&ready)
            .arg(&upper)
            .arg(SYSTEMCTL)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log).unwrap())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        *self.holder.borrow_mut() = Some(Proc {
            name: "namespace",
            child,
            log: log.clone(),
        });
        self.wait(
            "the node's mount namespace",
            || ready.exists().then_some(()),
            "namespace",
        );
        // Opened without waiting for a writer; kept open, so that a writer never waits.
        let fifo = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(self.ns_path("/run/devgate-test-systemd/requests"))
            .unwrap();
        *self.systemd.borrow_mut() = Some((fifo, Vec::new()));
    }

    /// A path of the node's mount namespace, as this process reaches it.
    pub fn ns_path(&self, path: &str) -> PathBuf {
        let holder = self.holder.borrow().as_ref().unwrap().child.id();
        PathBuf::from(format!("/proc/{holder}/root")).join(path.trim_start_matches('/'))
    }

    /// Answers what the node's systemctl asked since the last look: the test acts as the
    /// node's systemd for containerd, which it started by pid.
    pub fn serve_systemd(&self) {
        let mut lines = Vec::new();
        if let Some((fifo, buf)) = self.systemd.borrow_mut().as_mut() {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = fifo.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                lines.push(String::from_utf8_lossy(&line).trim().to_string());
            }
        }
        for line in lines {
            let (id, args) = line.split_once(' ').unwrap_or((&line, ""));
            let rc = match args {
                "restart containerd.service" | "restart containerd" => {
                    self.restarts.set(self.restarts.get() + 1);
                    eprintln!("k8s node: systemctl {args}");
                    self.restart_containerd();
                    0
                }
                "is-active --quiet containerd.service" | "is-active --quiet containerd" => {
                    if self.containerd_running() {
                        0
                    } else {
                        3
                    }
                }
                _ => {
                    eprintln!("k8s node: systemctl {args}: not served by the test node");
                    1
                }
            };
            let dir = self.ns_path("/run/devgate-test-systemd/answers");
            fs::write(dir.join(format!("{id}.tmp")), rc.to_string()).unwrap();
            fs::rename(dir.join(format!("{id}.tmp")), dir.join(id)).unwrap();
        }
    }

    /// `program` inside the node's mount and network namespaces.
    pub fn command(&self, program: &Path) -> Command {
        let holder = self.holder.borrow().as_ref().unwrap().child.id();
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount=/proc/{holder}/ns/mnt"))
            .arg(format!("--net=/proc/{holder}/ns/net"))
            .arg("--")
            .arg(program);
        c
    }

    /// Starts `program` in the node's namespaces as one of its processes: stopped with the
    /// node, and a test fails when it exits while the node waits.
    pub fn spawn(&self, name: &'static str, program: &Path, args: &[String]) {
        let log = self.dir.join(format!("{name}.log"));
        let out = fs::File::create(&log).unwrap();
        let child = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        eprintln!("k8s node: started {name} (pid {})", child.id());
        self.procs.borrow_mut().push(Proc { name, child, log });
    }

    /// Waits for `check` to give a value, failing with `process`'s last log lines when it
    /// exits first or the deadline passes.
    fn wait<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>, process: &str) -> T {
        let end = Instant::now() + STEP_DEADLINE;
        loop {
            self.serve_systemd();
            if let Some(v) = check() {
                return v;
            }
            let mut procs = self.procs.borrow_mut();
            let mut holder = self.holder.borrow_mut();
            for p in procs.iter_mut().chain(holder.iter_mut()) {
                if let Ok(Some(st)) = p.child.try_wait() {
                    // What it wrote last may still be on its way to the file.
                    std::thread::sleep(Duration::from_millis(500));
                    panic!(
                        "k8s node: {} exited ({st}) while waiting for {what}; its last lines:\n{}",
                        p.name,
                        tail(&p.log, 40)
                    );
                }
            }
            if Instant::now() > end {
                let log = self.dir.join(format!("{process}.log"));
                panic!(
                    "k8s node: no {what} within {STEP_DEADLINE:?}; {process}'s last lines:\n{}",
                    tail(&log, 40)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn start_control_plane(&mut self) {
        let (etcd_port, peer_port, api_port) = (2379, 2380, 6443);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let dir = self.dir.clone();
        let d = |p: &str| dir.join(p).display().to_string();
        let etcd_args = vec![
            "--name=default".to_string(),
            format!("--data-dir={}", d("etcd")),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
        ];
        let etcd = self.bin.join("etcd");
        self.spawn("etcd", &etcd, &etcd_args);

        // The service-account signing key, and a token per identity (static tokens: the
        // identities are the ones a kubeadm cluster's components have).
        let key = self.dir.join("sa.key");
        let out = output_of(
            Command::new("openssl")
                .args(["genrsa", "-out"])
                .arg(&key)
                .arg("2048"),
        );
        assert!(out.status.success(), "openssl genrsa: {}", text(&out));
        let masters = if self.rbac { "system:masters" } else { "" };
        let tokens = [
            ("admin", "admin", "system:masters"),
            ("kubelet", "system:node:devgate-node", "system:nodes"),
            ("scheduler", "system:kube-scheduler", masters),
            (
                "controller-manager",
                "system:kube-controller-manager",
                masters,
            ),
        ];
        let mut csv = String::new();
        for (name, user, group) in tokens {
            csv.push_str(&format!("{name}-token,{user},{name},\"{group}\"\n"));
        }
        fs::write(self.dir.join("tokens.csv"), csv).unwrap();
        let server = format!("https://127.0.0.1:{api_port}");
        for (name, _, _) in tokens {
            fs::write(
                self.dir.join(format!("{name}.kubeconfig")),
                kubeconfig(&server, &format!("{name}-token")),
            )
            .unwrap();
        }
        let gates = self.feature_gates();
        let mut api_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_string(),
            "--advertise-address=127.0.0.1".to_string(),
            // 1.37 refuses a loopback address for the kubernetes Service's endpoints; no
            // test reaches the API through that Service.
            "--endpoint-reconciler-type=none".to_string(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", d("apiserver-certs")),
            format!("--token-auth-file={}", d("tokens.csv")),
            format!(
                "--authorization-mode={}",
                if self.rbac {
                    "Node,RBAC"
                } else {
                    "AlwaysAllow"
                }
            ),
            "--service-account-issuer=https://kubernetes.default.svc".to_string(),
            format!("--service-account-key-file={}", key.display()),
            format!("--service-account-signing-key-file={}", key.display()),
            "--service-cluster-ip-range=10.96.0.0/24".to_string(),
            "--allow-privileged=true".to_string(),
        ];
        api_args.extend(gates.iter().cloned());
        if let Some(rc) = self.runtime_config() {
            api_args.push(rc);
        }
        *self.api_args.borrow_mut() = api_args;
        self.start_apiserver();

        let mut cm_args = vec![
            format!("--kubeconfig={}", d("controller-manager.kubeconfig")),
            "--bind-address=127.0.0.1".to_string(),
            "--secure-port=10257".to_string(),
            "--leader-elect=false".to_string(),
            format!("--service-account-private-key-file={}", key.display()),
            "--use-service-account-credentials=false".to_string(),
            "--controllers=*".to_string(),
        ];
        cm_args.extend(gates.iter().cloned());
        let cm = self.bin.join("kube-controller-manager");
        self.spawn("kube-controller-manager", &cm, &cm_args);
        let mut sched_args = vec![
            format!("--kubeconfig={}", d("scheduler.kubeconfig")),
            "--bind-address=127.0.0.1".to_string(),
            "--secure-port=10259".to_string(),
            "--leader-elect=false".to_string(),
        ];
        sched_args.extend(gates.iter().cloned());
        let sched = self.bin.join("kube-scheduler");
        self.spawn("kube-scheduler", &sched, &sched_args);
    }

    /// kube-apiserver with the node's arguments; waits until it is ready.
    pub fn start_apiserver(&self) {
        let apiserver = self.bin.join("kube-apiserver");
        let args = self.api_args.borrow().clone();
        self.spawn("kube-apiserver", &apiserver, &args);
        self.wait(
            "kube-apiserver ready",
            || {
                let out = self.kubectl_out(&["get", "--raw", "/readyz"]);
                (out.status.success()).then_some(())
            },
            "kube-apiserver",
        );
    }

    /// Stops one of the node's processes (SIGTERM, then SIGKILL) and forgets it.
    pub fn stop_process(&self, name: &str) {
        let mut procs = self.procs.borrow_mut();
        if let Some(i) = procs.iter().position(|p| p.name == name) {
            let mut p = procs.remove(i);
            p.stop();
        }
    }

    /// The feature gates the DRA device-taint API needs where it is not on by default.
    fn feature_gates(&self) -> Vec<String> {
        if self.release == "v1.36" {
            vec!["--feature-gates=DRADeviceTaints=true,DRADeviceTaintRules=true".to_string()]
        } else {
            Vec::new()
        }
    }

    fn runtime_config(&self) -> Option<String> {
        (self.release == "v1.36").then(|| "--runtime-config=resource.k8s.io/v1beta2=true".into())
    }

    /// containerd as the node's service: its config at /etc/containerd/config.toml, its
    /// socket at /run/containerd/containerd.sock, with the CRI settings a node without a
    /// registry needs, and devgate's snippet and base spec as docs/install.md lays them
    /// where `by_hand`.
    fn start_containerd(&mut self, by_hand: bool) {
        let config = CriConfig::of_containerd();
        let mut text = self.containerd_config(config);
        if by_hand {
            let base_spec = self.dir.join("devgate-base-spec.json");
            fs::write(&base_spec, containerd_base_spec_for(&self.env)).unwrap();
            let name = format!("hooks/containerd/{}", config.snippet());
            let snippet = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let tables: Vec<&str> = snippet
                .lines()
                .filter(|l| !l.trim_start().starts_with("version ="))
                .collect();
            text.push_str(&tables.join("\n").replace(
                "/etc/containerd/devgate-base-spec.json",
                base_spec.to_str().unwrap(),
            ));
            text.push('\n');
            config.say_loaded(&name);
        }
        fs::write(self.ns_path("/etc/containerd/config.toml"), text).unwrap();
        self.spawn_containerd();
        self.import_images();
    }

    /// The node's containerd config.toml without devgate: what a node has before it.
    fn containerd_config(&self, config: CriConfig) -> String {
        let cd = self.dir.join("containerd");
        let cni = self.dir.join("cni");
        fs::create_dir_all(&cni).unwrap();
        fs::write(cni.join("10-bridge.conflist"), CNI_BRIDGE).unwrap();
        let cni_table = match config {
            CriConfig::V2 => format!(
                "[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  conf_dir = \"{}\"\n  bin_dir = \"{CNI_BIN}\"\n",
                cni.display(),
            ),
            CriConfig::V3 => format!(
                "[plugins.'io.containerd.cri.v1.runtime'.cni]\n  conf_dir = '{}'\n  bin_dirs = ['{CNI_BIN}']\n",
                cni.display(),
            ),
        };
        let mut settings = config.plugin_settings(PAUSE_IMAGE);
        if self.dra_driver && self.cdi {
            // The DRA driver's CDI spec dir, in the CRI plugin's own table (the key is
            // `enable_cdi` in 1.7 and 2.x alike; 2.x has it on by default).
            let table = match config {
                CriConfig::V2 => "[plugins.\"io.containerd.grpc.v1.cri\"]\n",
                CriConfig::V3 => "[plugins.'io.containerd.cri.v1.runtime']\n",
            };
            let dirs = format!(
                "{table}  enable_cdi = true\n  cdi_spec_dirs = [\"{}\"]\n",
                self.cdi_dir().display()
            );
            settings = settings.replacen(table, &dirs, 1);
            assert!(settings.contains("enable_cdi"), "{settings}");
        }
        format!(
            "{}\nroot = \"{}\"\nstate = \"/run/containerd\"\n\n[grpc]\n  address = \"{SOCKET}\"\n\n\
             {}\n{cni_table}\n",
            config.top(),
            cd.join("root").display(),
            settings,
        )
    }

    /// Where the DRA driver writes its CDI spec and containerd reads it.
    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.join("cdi")
    }

    /// containerd as its unit starts it (the default config path), until its socket is up.
    fn spawn_containerd(&self) {
        self.spawn("containerd", Path::new("/usr/bin/containerd"), &[]);
        let sock = self.ns_path(SOCKET);
        self.wait(
            "containerd's socket",
            || sock.exists().then_some(()),
            "containerd",
        );
    }

    fn containerd_running(&self) -> bool {
        let mut procs = self.procs.borrow_mut();
        let Some(p) = procs.iter_mut().find(|p| p.name == "containerd") else {
            return false;
        };
        matches!(p.child.try_wait(), Ok(None)) && self.ns_path(SOCKET).exists()
    }

    /// What `systemctl restart containerd` does on a node: containerd stops (its shims and
    /// containers stay, KillMode=process) and starts again on its config.
    fn restart_containerd(&self) {
        let old = {
            let mut procs = self.procs.borrow_mut();
            let i = procs.iter().position(|p| p.name == "containerd").unwrap();
            procs.remove(i)
        };
        let mut old = old;
        old.stop();
        let log = self.dir.join("containerd.log");
        let prev = fs::read_to_string(&log).unwrap_or_default();
        fs::write(self.dir.join("containerd.log.previous"), prev).unwrap();
        self.spawn("containerd", Path::new("/usr/bin/containerd"), &[]);
        let sock = self.ns_path(SOCKET);
        let end = Instant::now() + STEP_DEADLINE;
        while !sock.exists() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The test image (busybox) and the sandbox image (pause, built from the release's
    /// tree), imported into containerd's k8s.io namespace.
    fn import_images(&mut self) {
        let podman = Podman::new("k8s-img");
        let archive = podman.dir.join("image.tar");
        podman.save(&archive);
        self.ctr_ok(&["images", "import", archive.to_str().unwrap()]);
        let rootfs = self.dir.join("pause-rootfs");
        fs::create_dir_all(&rootfs).unwrap();
        fs::copy(self.bin.join("pause"), rootfs.join("pause")).unwrap();
        let tar = self.dir.join("pause-rootfs.tar");
        let out = output_of(
            Command::new("tar")
                .arg("-C")
                .arg(&rootfs)
                .arg("-cf")
                .arg(&tar)
                .arg("."),
        );
        assert!(out.status.success(), "tar: {}", text(&out));
        let out = output_of(
            podman
                .cmd()
                .args(["import", "--change", "ENTRYPOINT=[\"/pause\"]"])
                .arg(&tar)
                .arg(PAUSE_IMAGE),
        );
        assert!(out.status.success(), "podman import: {}", text(&out));
        let pause = self.dir.join("pause.tar");
        podman.save_image(&pause, PAUSE_IMAGE);
        self.ctr_ok(&["images", "import", pause.to_str().unwrap()]);
    }

    /// What the fake NVML answers from now on (every hook call loads it anew).
    pub fn set_nvml(&self, scenario: &Value) {
        let path = self.gpus.dir.join("libnvidia-ml.so.1.json");
        let tmp = self.gpus.dir.join("libnvidia-ml.so.1.json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(scenario).unwrap()).unwrap();
        fs::rename(&tmp, &path).unwrap();
    }

    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = output_of(
            self.command(Path::new("/usr/bin/ctr"))
                .arg("--address")
                .arg(SOCKET)
                .args(["--namespace", "k8s.io"])
                .args(args),
        );
        assert!(out.status.success(), "ctr {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn start_kubelet(&mut self) {
        let root = self.kubelet_root.clone();
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&self.pod_logs).unwrap();
        let config = self.dir.join("kubelet-config.yaml");
        fs::write(&config, self.kubelet_config()).unwrap();
        // kubelet's own config where devgate doctor looks for it.
        fs::copy(&config, root.join("config.yaml")).unwrap();
        let args = vec![
            format!("--config={}", config.display()),
            format!(
                "--kubeconfig={}",
                self.dir.join("kubelet.kubeconfig").display()
            ),
            format!("--root-dir={}", root.display()),
            format!("--hostname-override={NODE}"),
            "--node-ip=127.0.0.1".to_string(),
            "--v=2".to_string(),
        ];
        let kubelet = self.bin.join("kubelet");
        self.spawn("kubelet", &kubelet, &args);
        let gpus = (0..8)
            .map(|i| format!("{}={i}", fake_nvml::uuid(i)))
            .collect::<Vec<_>>()
            .join(",");
        let args = vec![
            // kubelet's device-plugin socket is always here, whatever --root-dir says.
            "--plugin-dir=/var/lib/kubelet/device-plugins".to_string(),
            format!("--dev-root={}", self.gpus.dev_root.display()),
            format!("--gpus={gpus}"),
        ];
        let plugin = binaries("plugins").join("fake-gpu-plugin");
        self.spawn("fake-gpu-plugin", &plugin, &args);
    }

    /// The fake DRA driver, once kubelet is up (it registers through kubelet's plugin
    /// registry and publishes its ResourceSlice as the node), and the DeviceClass
    /// `gpu.nvidia.com`; waits for the pool's 8 devices.
    fn start_dra_driver(&mut self) {
        let gpus = (0..8)
            .map(|i| format!("{}={i}={}", fake_nvml::uuid(i), fake_nvml::bus(i)))
            .collect::<Vec<_>>()
            .join(",");
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--node-name={NODE}"),
            format!(
                "--registrar-dir={}",
                self.kubelet_root.join("plugins_registry").display()
            ),
            format!(
                "--plugin-dir={}",
                self.kubelet_root.join("plugins").join(DRA_DRIVER).display()
            ),
            format!("--cdi-dir={}", self.cdi_dir().display()),
            format!("--dev-root={}", self.gpus.dev_root.display()),
            format!("--gpus={gpus}"),
        ];
        let driver = binaries("plugins").join("fake-dra-driver");
        self.spawn("fake-dra-driver", &driver, &args);
        self.apply(&json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRA_DRIVER},
            "spec": {"selectors": [{"cel": {
                "expression": format!("device.driver == \"{DRA_DRIVER}\"")
            }}]},
        }));
        self.wait(
            "the DRA driver's ResourceSlice with 8 devices",
            || {
                let list = self.get_json(&["get", "resourceslices"])?;
                let devices: usize = list["items"]
                    .as_array()?
                    .iter()
                    .filter(|s| s["spec"]["driver"] == DRA_DRIVER && s["spec"]["nodeName"] == NODE)
                    .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
                    .sum();
                (devices == 8).then_some(())
            },
            "fake-dra-driver",
        );
        eprintln!(
            "k8s node: DRA driver {DRA_DRIVER} published 8 GPUs (CDI in containerd: {})",
            self.cdi
        );
    }

    fn kubelet_config(&self) -> String {
        format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine's hybrid cgroups (kubelet 1.35+ refuses cgroup v1 by default).
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
containerRuntimeEndpoint: unix://{SOCKET}
podLogsDir: {logs}
volumePluginDir: {plugins}
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzPort: 0
failSwapOn: false
resolvConf: ""
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
# A test machine's disk is shared: evict nothing, collect no images.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "0%"
  imagefs.available: "0%"
  nodefs.inodesFree: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
"#,
            logs = self.pod_logs.display(),
            plugins = self.dir.join("volume-plugins").display(),
        )
    }

    fn wait_ready(&mut self) {
        self.wait(
            "the node Ready with 8 nvidia.com/gpu allocatable",
            || {
                let node = self.get_json(&["get", "node", NODE])?;
                let ready = node["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                let gpus = node["status"]["allocatable"]["nvidia.com/gpu"].as_str() == Some("8");
                (ready && gpus).then_some(())
            },
            "kubelet",
        );
        self.wait(
            "the default service account",
            || {
                self.kubectl_out(&["get", "serviceaccount", "default"])
                    .status
                    .success()
                    .then_some(())
            },
            "kube-controller-manager",
        );
        eprintln!(
            "k8s node: {} Ready (kubelet {}, containerd {})",
            self.release,
            self.kubectl(&[
                "get",
                "node",
                NODE,
                "-o",
                "jsonpath={.status.nodeInfo.kubeletVersion}"
            ]),
            self.kubectl(&[
                "get",
                "node",
                NODE,
                "-o",
                "jsonpath={.status.nodeInfo.containerRuntimeVersion}"
            ]),
        );
    }

    pub fn kubectl_out(&self, args: &[&str]) -> Output {
        output_of(
            self.command(&self.bin.join("kubectl"))
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .arg("--request-timeout=30s")
                .args(args)
                .stdin(Stdio::null()),
        )
    }

    /// kubectl's output; fails the test where kubectl fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_out(args);
        assert!(out.status.success(), "kubectl {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `object`.
    pub fn apply(&self, object: &Value) {
        let out = output_with_input(
            self.command(&self.bin.join("kubectl"))
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .args(["apply", "-f", "-"]),
            object.to_string().as_bytes(),
        );
        assert!(out.status.success(), "kubectl apply: {}", text(&out));
    }

    /// An object as JSON, or None where kubectl cannot get it.
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.kubectl_out(&a);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    pub fn pod(&self, name: &str) -> Value {
        self.get_json(&["get", "pod", name])
            .unwrap_or_else(|| panic!("no pod {name}"))
    }

    /// Waits until `check` says yes of pod `name`; on the deadline, fails with the pod,
    /// its events and kubelet's last lines.
    pub fn wait_pod<T>(
        &self,
        name: &str,
        what: &str,
        mut check: impl FnMut(&Value) -> Option<T>,
    ) -> T {
        let end = Instant::now() + STEP_DEADLINE;
        loop {
            self.serve_systemd();
            if let Some(pod) = self.get_json(&["get", "pod", name]) {
                if let Some(v) = check(&pod) {
                    return v;
                }
            }
            if Instant::now() > end {
                let pod = self.kubectl_out(&["get", "pod", name, "-o", "yaml"]);
                panic!(
                    "pod {name}: not {what} within {STEP_DEADLINE:?}:\n{}\nevents:\n{}\nkubelet:\n{}",
                    text(&pod),
                    self.events(name).join("\n"),
                    tail(&self.dir.join("kubelet.log"), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The messages of the events about pod `name`, each as `reason: message`.
    pub fn events(&self, name: &str) -> Vec<String> {
        let sel = format!("involvedObject.name={name}");
        let Some(list) = self.get_json(&["get", "events", "--field-selector", &sel]) else {
            return Vec::new();
        };
        list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|e| {
                        format!(
                            "{}: {}",
                            e["reason"].as_str().unwrap_or(""),
                            e["message"].as_str().unwrap_or("")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Deletes pod `name` and waits until it is gone (its GPU free again).
    pub fn delete_pod(&self, name: &str) {
        self.kubectl(&["delete", "pod", name, "--wait=true", "--timeout=120s"]);
    }

    /// Prints where the node is and leaves it up (DEVGATE_K8S_KEEP=1).
    fn keep(&mut self) {
        eprintln!(
            "k8s node kept up (DEVGATE_K8S_KEEP): {rel}\n  kubectl: nsenter --mount=/proc/{ns}/ns/mnt \
             --net=/proc/{ns}/ns/net {bin}/kubectl --kubeconfig {kc}\n  \
             logs: {dir}/*.log\n  devgate: {dg} --config {cfg}\n  stop: kill {pids}",
            rel = self.release,
            ns = self.holder.borrow().as_ref().map_or(0, |h| h.child.id()),
            bin = self.bin.display(),
            kc = self.kubeconfig.display(),
            dir = self.dir.display(),
            dg = devgate_bin().display(),
            cfg = self.env.config.display(),
            pids = self
                .procs
                .borrow()
                .iter()
                .chain(self.holder.borrow().iter())
                .map(|p| p.child.id().to_string())
                .collect::<Vec<_>>()
                .join(" "),
        );
        // A dropped Child leaves its process running.
        self.procs.borrow_mut().clear();
        *self.holder.borrow_mut() = None;
    }
}

impl Drop for K8sNode {
    fn drop(&mut self) {
        if std::env::var_os("DEVGATE_K8S_KEEP").is_some() {
            return self.keep();
        }
        // kubelet first, so that it starts nothing more; then the containers it left,
        // then the rest in the reverse order of their start.
        for name in ["fake-dra-driver", "fake-gpu-plugin", "kubelet"] {
            if let Some(p) = self.procs.borrow_mut().iter_mut().find(|p| p.name == name) {
                p.stop();
            }
        }
        self.remove_tasks();
        for p in self.procs.borrow_mut().iter_mut().rev() {
            p.stop();
        }
        if let Some(h) = self.holder.borrow_mut().as_mut() {
            h.stop();
        }
        unmount_under(&self.dir);
    }
}

impl K8sNode {
    /// Kills and removes every task kubelet left in containerd, so that their shims end.
    fn remove_tasks(&self) {
        let ctr = |args: &[&str]| {
            self.command(Path::new("/usr/bin/ctr"))
                .arg("--address")
                .arg(SOCKET)
                .args(["--namespace", "k8s.io"])
                .args(args)
                .stdin(Stdio::null())
                .output()
        };
        let Ok(tasks) = ctr(&["tasks", "ls", "-q"]) else {
            return;
        };
        for id in String::from_utf8_lossy(&tasks.stdout).lines() {
            let _ = ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
            let _ = ctr(&["tasks", "rm", "-f", id]);
        }
    }
}

/// Whether the containerd on PATH reads CDI specs (1.7 and later).
fn containerd_has_cdi() -> bool {
    let out = Command::new("containerd").arg("--version").output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let version = text.unwrap_or_default();
    let v = version.split_whitespace().nth(2).unwrap_or("");
    let mut parts = v.trim_start_matches('v').split(['.', '~', '-', '+']);
    let major: u32 = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    major >= 2 || (major == 1 && minor >= 7)
}

/// The pod network: a bridge in the node's own network namespace (Debian's
/// containernetworking-plugins).
const CNI_BRIDGE: &str = r#"{"cniVersion": "1.0.0", "name": "devgate-test", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]]}}]}"#;
const CNI_BIN: &str = "/usr/lib/cni";

/// containerd's socket on the node, as its packages place it.
pub const SOCKET: &str = "/run/containerd/containerd.sock";

/// The node's systemctl: asks the test, which starts and stops the node's processes by
/// pid, through a FIFO it reads (the installer runs it inside the host root, read-only).
const SYSTEMCTL: &str = r#"#!/bin/sh
# The devgate test node's systemctl: the test serves it (tests/common/k8s.rs).
d=/run/devgate-test-systemd
id=$$.$(date +%s%N)
echo "$id $*" > $d/requests
i=0
while [ ! -e "$d/answers/$id" ]; do
    i=$((i + 1))
    [ $i -lt 1800 ] || { echo "systemctl: the test node did not answer" >&2; exit 1; }
    sleep 0.1
done
exit "$(cat "$d/answers/$id")"
"#;

/// The sandbox image: pause, built from the release's own tree.
pub const PAUSE_IMAGE: &str = "localhost/devgate-pause:test";

fn kubeconfig(server: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: devgate\n  cluster:\n    server: {server}\n    \
         insecure-skip-tls-verify: true\nusers:\n- name: devgate\n  user:\n    token: {token}\n\
         contexts:\n- name: devgate\n  context:\n    cluster: devgate\n    user: devgate\n\
         current-context: devgate\n"
    )
}

impl K8sNode {
    /// The installer image, built as docs/install.md says: `podman build -f
    /// packaging/kubernetes/Containerfile` over this build's programs, FROM the cached
    /// stand-in of debian:bookworm-slim; imported into containerd as `name`.
    pub fn import_installer_image(&self, name: &str) {
        let base = binaries("base").join("rootfs.tar");
        let podman = Podman::new("k8s-installer");
        let out = output_of(
            podman
                .cmd()
                .arg("import")
                .arg(&base)
                .arg("docker.io/library/debian:bookworm-slim"),
        );
        assert!(out.status.success(), "podman import: {}", text(&out));
        let ctx = self.dir.join("installer-context");
        fs::create_dir_all(ctx.join("target/release")).unwrap();
        fs::create_dir_all(ctx.join("packaging")).unwrap();
        for (bin, name) in [
            (devgate_bin(), "devgate"),
            (devgate_runtime_bin(), "devgate-runtime"),
            (devgate_hook_bin(), "devgate-hook"),
            (
                devgate_bin().with_file_name("devgate-agent"),
                "devgate-agent",
            ),
        ] {
            fs::copy(&bin, ctx.join("target/release").join(name))
                .unwrap_or_else(|e| panic!("{}: {e} (make test builds the agent)", bin.display()));
        }
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        fs::copy(
            repo.join("packaging/config.json"),
            ctx.join("packaging/config.json"),
        )
        .unwrap();
        let out = output_of(
            podman
                .cmd()
                .args(["build", "--pull=never", "-f"])
                .arg(repo.join("packaging/kubernetes/Containerfile"))
                .args(["-t", name])
                .arg(&ctx),
        );
        assert!(out.status.success(), "podman build: {}", text(&out));
        let archive = self.dir.join("installer.tar");
        podman.save_image(&archive, name);
        self.ctr_ok(&["images", "import", archive.to_str().unwrap()]);
    }

    /// The objects of a manifest file, as JSON (kubectl reads the YAML; nothing is sent).
    pub fn manifest(&self, path: &Path) -> Vec<Value> {
        let out = self.kubectl(&[
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            path.to_str().unwrap(),
        ]);
        // One JSON document per object, one after the other.
        serde_json::Deserializer::from_str(&out)
            .into_iter::<Value>()
            .map(Result::unwrap)
            .collect()
    }
}

// ---- DRA objects and what the cluster allocated (tests/e2e_dra.rs, e2e_cluster.rs) ----

/// A ResourceClaimTemplate `one-gpu`: one GPU of the DRA driver's class.
pub fn one_gpu_template() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRA_DRIVER}}
        ]}}},
    })
}

/// A ResourceClaim `name` for gpu-`minor`, selected by its `uuid` attribute, its request
/// holding `tolerations` (a JSON list) where given.
pub fn gpu_claim(name: &str, minor: usize, tolerations: Option<Value>) -> Value {
    let uuid = fake_nvml::uuid(minor);
    let mut exactly = json!({
        "deviceClassName": DRA_DRIVER,
        "selectors": [{"cel": {"expression":
            format!("device.attributes[\"{DRA_DRIVER}\"].uuid == \"{uuid}\"")}}],
    });
    if let Some(t) = tolerations {
        exactly["tolerations"] = t;
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    })
}

impl K8sNode {
    /// A directory the test and a pod's app talk through (mounted at /go).
    pub fn go_dir(&self, name: &str) -> PathBuf {
        let d = self.dir.join(format!("go-{name}"));
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// The device allocated to ResourceClaim `claim` (None before), from the DRA driver's
    /// pool on this node.
    pub fn claim_device(&self, claim: &str) -> Option<String> {
        let claim = self.get_json(&["get", "resourceclaim", claim])?;
        let result = &claim["status"]["allocation"]["devices"]["results"][0];
        result.as_object()?;
        assert_eq!(result["driver"], DRA_DRIVER, "{claim}");
        assert_eq!(result["pool"], NODE, "{claim}");
        result["device"].as_str().map(str::to_string)
    }

    /// The device allocated to pod `name`'s claim `gpu` made from a template (None before).
    pub fn allocated(&self, name: &str) -> Option<String> {
        let pod = self.get_json(&["get", "pod", name])?;
        let claim = pod["status"]["resourceClaimStatuses"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "gpu")?["resourceClaimName"]
            .as_str()?
            .to_string();
        self.claim_device(&claim)
    }

    /// The apiVersion this release serves DeviceTaintRules as (`kubectl api-resources`).
    pub fn device_taint_rule_api(&self) -> String {
        let out = self.kubectl(&[
            "api-resources",
            "--api-group=resource.k8s.io",
            "--no-headers",
        ]);
        out.lines()
            .find(|l| l.split_whitespace().last() == Some("DeviceTaintRule"))
            .and_then(|l| {
                l.split_whitespace()
                    .find(|w| w.starts_with("resource.k8s.io/"))
            })
            .unwrap_or_else(|| panic!("{}: no DeviceTaintRule served:\n{out}", self.release))
            .to_string()
    }

    /// DeviceTaintRules as kubectl names them with their version: on 1.36, kubectl takes
    /// the group's preferred v1 for a bare `devicetaintrules`, which does not serve them.
    pub fn device_taint_rules(&self) -> String {
        let api = self.device_taint_rule_api();
        let version = api.trim_start_matches("resource.k8s.io/");
        format!("devicetaintrules.{version}.resource.k8s.io")
    }

    /// Waits until no ResourceClaim is left in the namespace (a template's claim is
    /// deleted with its pod by kube-controller-manager).
    pub fn wait_pod_gone_claims(&self) {
        let end = Instant::now() + STEP_DEADLINE;
        loop {
            let left = self
                .get_json(&["get", "resourceclaims"])
                .and_then(|l| l["items"].as_array().map(Vec::len));
            if left == Some(0) {
                return;
            }
            assert!(
                Instant::now() < end,
                "claims left after their pods: {}",
                self.kubectl(&["get", "resourceclaims", "-o", "yaml"])
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}
