//! `devgate install-host --enable [--restart]` and `uninstall-host [--restart]` on real
//! nodes, as the DaemonSet runs them:
//!
//! - A booted 2026 node: the forky image under systemd-nspawn, systemd as PID 1 and
//!   containerd 2.1 as its `containerd.service`. install-host edits containerd's own
//!   config.toml (Debian's), restarts containerd through the node's systemctl, and the CRI
//!   plugin comes back loaded; a rerun restarts nothing; a containerd that cannot start with
//!   the edit, or starts but without its CRI plugin, gets the node's files back and is
//!   restarted again; uninstall-host gives the config back byte for byte; and all of it through `--root /host` (an rbind of the node's
//!   root in a private mount namespace, the DaemonSet's view), where systemctl runs chrooted.
//!   It boots the image itself from the host's pass (scripts/forky-stack.sh builds or finds
//!   it) and skips inside the forky pass, where there is no systemd.
//! - A node without systemd (this machine; the forky pass on the host's cgroups): `--restart`
//!   is refused before anything changes, and `--enable` followed by a restart by hand turns
//!   devgate on for CRI pods; uninstall-host and a restart turn it off again.

mod common;
use common::boot::{image_to_boot, skip_in_forky_pass, Boot};
use common::cri::{self, ContainerState, Cri};
use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// What ends every line install-host adds to containerd's config.
const MARK: &str = "# devgate install-host";
const SPEC_LINE: &str = r#"base_runtime_spec = "/etc/containerd/devgate-base-spec.json""#;
const ANNOTATIONS_LINE: &str =
    r#"container_annotations = ["io.kubernetes.container.terminationMessagePolicy"]"#;
const PROGRAMS: [&str; 3] = ["devgate", "devgate-hook", "devgate-runtime"];
/// A plain podman container.
/// `podman run` of a container given /dev/zero.
const ON_ZERO: &[&str] = &[
    "run",
    "--rm",
    "--network",
    "none",
    "--device",
    "/dev/zero",
    TEST_IMAGE,
    "true",
];
const PLAIN: &[&str] = &[
    "run",
    "--rm",
    "--network",
    "none",
    TEST_IMAGE,
    "echo",
    "ran",
];
/// install-host's podman drop-in: crun's name resolves to devgate's wrapper.
const PODMAN_DROPIN: &str = "/etc/containers/containers.conf.d/99-devgate-runtime.conf";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `text` without the lines install-host marks as its own.
fn unmarked(text: &str) -> String {
    text.split_inclusive('\n')
        .filter(|l| !l.trim_end().ends_with(MARK) && !l.trim_start().starts_with(MARK))
        .collect()
}

/// `edited` is `orig` plus marked lines that set devgate's two keys, and nothing else.
fn assert_enabled(orig: &str, edited: &str, what: &str) {
    assert_eq!(
        unmarked(edited),
        orig,
        "{what}: only marked lines added:\n{edited}"
    );
    for key in [SPEC_LINE, ANNOTATIONS_LINE] {
        assert!(
            edited
                .lines()
                .any(|l| l.trim_start().starts_with(key) && l.trim_end().ends_with(MARK)),
            "{what}: no marked `{key}`:\n{edited}"
        );
    }
}

// ---- The booted node -------------------------------------------------------------------

/// Boots the image with `out/run.sh` as a unit that powers the machine off when done; the
/// build dir is bound at its own path. containerd's root is a tmpfs: the image's root is an
/// overlay (`--volatile=overlay`), which overlayfs snapshots cannot sit on.
fn boot(root: &Path, out: &Path) -> String {
    let b = Boot {
        description: "devgate install-host --enable test",
        tag: "dg-enable",
        nspawn_timeout_s: 540,
        script_timeout_s: Some(400),
        args: vec![
            "--tmpfs=/var/lib/containerd".into(),
            format!("--bind-ro={}", devgate_bin().parent().unwrap().display()),
        ],
        run_tail: Some(60),
    };
    common::boot::boot(root, out, &b)
}

/// The script the booted node runs. Each step `NAME` leaves `NAME.rc`, `NAME.out`,
/// `NAME.err` (devgate's), and what the node is after it: containerd's `MainPID`, whether
/// it is active, its plugins, config.toml (or `NAME.noconfig`), the base spec (or
/// `NAME.nospec`) and the programs under /usr/local/bin.
fn node_script(image: &str) -> String {
    let dg = s(&devgate_bin()).to_string();
    format!(
        r#"O=/dgout
DG={dg}
unit=containerd.service
rec=/var/lib/devgate/installed/devgate-base-spec.json
snap() {{
  systemctl show -p MainPID --value $unit >$O/$1.pid
  systemctl is-active $unit >$O/$1.active 2>&1
  ctr plugins ls >$O/$1.plugins 2>&1
  if [ -e /etc/containerd/config.toml ]; then cp /etc/containerd/config.toml $O/$1.config; else : >$O/$1.noconfig; fi
  if [ -e /etc/containerd/devgate-base-spec.json ]; then cp /etc/containerd/devgate-base-spec.json $O/$1.spec; else : >$O/$1.nospec; fi
  if [ -e $rec ]; then cp $rec $O/$1.record; else : >$O/$1.norecord; fi
  ls /usr/local/bin >$O/$1.bin 2>&1
}}
# The test restarts containerd faster than any operator: systemd's start rate limit
# (5 starts in 10 s by default) is reset before each step, so that it never refuses one.
step() {{
  s=$1; shift
  systemctl reset-failed $unit
  "$@" >$O/$s.out 2>$O/$s.err; echo $? >$O/$s.rc
  snap $s
}}
# ctr runs a busybox container from the imported image, mounted once (ctr does not use the
# CRI base spec: this says containerd, its snapshots and runc still work). Its spec is the
# tests' own: ctr's default one asks for cpu.weight, which this host's cgroup2 lacks.
runs() {{
  ctr -n default run --rm --config $O/spec.json dg-$1 >$O/$1.ctr 2>&1
}}
# podman as the node's operator runs it (its crun, through devgate's wrapper once enabled),
# on vfs: the image's root is an overlay, which podman's overlay driver cannot sit on; no
# pids limit: the node's cgroup has no pids controller.
pm() {{
  podman --storage-driver vfs "$@"
}}
prun() {{
  s=$1; shift
  pm run --rm --network none --pids-limit 0 "$@" >$O/$s.podman 2>&1; echo $? >$O/$s.podmanrc
}}
dropin=/etc/containers/containers.conf.d/99-devgate-runtime.conf
# The DaemonSet's view: the node's root at /host in a mount namespace of its own.
at_host() {{
  unshare -m --propagation private sh -c 'mount --rbind / /host && exec "$0" "$@"' "$@"
}}
systemctl is-enabled $unit >$O/enabled 2>&1
systemctl start $unit
snap orig
ctr -n default images import $O/image.tar >$O/import.out 2>&1 &&
  mkdir -p /run/dg-rootfs && ctr -n default images mount --rw {image} /run/dg-rootfs >>$O/import.out 2>&1
echo $? >$O/import.rc
runs orig
pm load -i $O/image.tar >$O/podman-load.out 2>&1; echo $? >$O/podman-load.rc
prun orig {image} echo ran
step install $DG install-host --root / --prefix /usr/local --enable --restart
runs install
if [ -e $dropin ]; then cp $dropin $O/install.podmandropin; fi
cp /etc/devgate/config.json $O/install.devgateconfig
$DG cordon /dev/zero --reason forky >$O/cordon.out 2>&1
prun installreject --device /dev/zero {image} true
prun install {image} echo ran
pm info --format '{{{{.Host.OCIRuntime.Name}}}} {{{{.Host.OCIRuntime.Path}}}}' >$O/install.podmanruntime 2>&1
$DG doctor >$O/install.doctor 2>&1
$DG uncordon /dev/zero >>$O/cordon.out 2>&1
step again $DG install-host --root / --prefix /usr/local --enable --restart
step uninstall $DG uninstall-host --root / --restart
runs uninstall
if [ -e $dropin ]; then cp $dropin $O/uninstall.podmandropin; fi
prun uninstall {image} echo ran
# A containerd that cannot start while its config holds devgate's lines.
mkdir -p /run/systemd/system/$unit.d
cat >/run/systemd/system/$unit.d/x.conf <<'EOF'
[Service]
ExecStartPre=/bin/sh -c '! grep -q "devgate install-host" /etc/containerd/config.toml'
EOF
systemctl daemon-reload
snap prefail
step fail $DG install-host --root / --prefix /usr/local --enable --restart
runs fail
rm -r /run/systemd/system/$unit.d
systemctl daemon-reload
# A containerd that starts, active, but whose CRI plugin cannot read devgate's base spec:
# the drop-in breaks the spec whenever config.toml names it. The spec is there before.
step precri $DG install-host --root / --prefix /usr/local
mkdir -p /run/systemd/system/$unit.d
cat >/run/systemd/system/$unit.d/y.conf <<'EOF'
[Service]
ExecStartPre=/bin/sh -c 'grep -q "devgate install-host" /etc/containerd/config.toml && echo "{{" > /etc/containerd/devgate-base-spec.json || true'
EOF
systemctl daemon-reload
step crifail $DG install-host --root / --prefix /usr/local --enable --restart
runs crifail
rm -r /run/systemd/system/$unit.d
systemctl daemon-reload
step reinstall $DG install-host --root / --prefix /usr/local --enable --restart
step remove $DG uninstall-host --root / --restart --programs
runs remove
mkdir -p /host
step hostinstall at_host $DG install-host --root /host --prefix /usr/local --enable --restart
runs hostinstall
if [ -e $dropin ]; then cp $dropin $O/hostinstall.podmandropin; fi
pm info --format '{{{{.Host.OCIRuntime.Path}}}}' >$O/hostinstall.podmanruntime 2>&1
step hostagain at_host $DG install-host --root /host --prefix /usr/local --enable --restart
step hostremove at_host $DG uninstall-host --root /host --restart --programs
runs hostremove
if [ -e $dropin ]; then cp $dropin $O/hostremove.podmandropin; fi
echo done >$O/done
"#
    )
}

/// The booted node's record of one step.
struct Step<'a> {
    out: &'a Path,
    name: &'static str,
    log: &'a str,
}

impl Step<'_> {
    fn read(&self, ext: &str) -> String {
        fs::read_to_string(self.out.join(format!("{}.{ext}", self.name))).unwrap_or_default()
    }
    fn has(&self, ext: &str) -> bool {
        self.out.join(format!("{}.{ext}", self.name)).exists()
    }
    fn said(&self) -> String {
        format!(
            "step {}: rc {} \nstdout:\n{}stderr:\n{}\n{}",
            self.name,
            self.read("rc").trim(),
            self.read("out"),
            self.read("err"),
            self.log
        )
    }
    fn rc(&self) -> String {
        self.read("rc").trim().to_string()
    }
    fn pid(&self) -> u32 {
        let p = self.read("pid");
        p.trim()
            .parse()
            .unwrap_or_else(|_| panic!("step {}: MainPID {p:?}\n{}", self.name, self.log))
    }
    fn config(&self) -> String {
        assert!(
            self.has("config"),
            "step {}: no config.toml\n{}",
            self.name,
            self.log
        );
        self.read("config")
    }
    /// containerd is active, its CRI plugins loaded.
    fn assert_running(&self) {
        assert_eq!(self.read("active").trim(), "active", "{}", self.said());
        assert_ne!(self.pid(), 0, "{}", self.said());
        assert_cri_loaded(&self.read("plugins"), &self.said());
    }
    fn assert_ran_container(&self) {
        let ctr = self.read("ctr");
        assert!(
            ctr.lines().any(|l| l.trim() == "ran"),
            "step {}: ctr run: {ctr}\n{}",
            self.name,
            self.log
        );
    }
    fn assert_no_programs(&self) {
        let bin = self.read("bin");
        for p in PROGRAMS {
            assert!(
                !bin.lines().any(|l| l == p),
                "{p} left: {bin}\n{}",
                self.said()
            );
        }
    }
}

/// `ctr plugins ls` shows containerd 2.x's CRI plugins `ok`: the runtime plugin
/// (`io.containerd.cri.v1 runtime`, which reads the config's runtimes) and the CRI service
/// (`io.containerd.grpc.v1 cri`, which loads the base specs at start and fails on one it
/// cannot read).
fn assert_cri_loaded(plugins: &str, ctx: &str) {
    for (typ, id) in [
        ("io.containerd.cri.v1", "runtime"),
        ("io.containerd.grpc.v1", "cri"),
    ] {
        let line = plugins.lines().find(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.first() == Some(&typ) && w.get(1) == Some(&id)
        });
        assert!(
            line.is_some_and(|l| l.split_whitespace().last() == Some("ok")),
            "{typ} {id} not ok: {line:?}\n{plugins}\n{ctx}"
        );
    }
}

#[test]
fn enable_and_restart_on_a_booted_systemd_node() {
    require_root!();
    if skip_in_forky_pass() {
        return;
    }
    let Some(root) = image_to_boot() else {
        return;
    };
    let out = tempdir("enable-sd-out");
    // The busybox image, for ctr inside (no registry is reachable).
    Podman::new("enable-sd-img").save(&out.join("image.tar"));
    let mut spec = base_spec(&["sh", "-c", "echo ran"]);
    spec["root"]["path"] = "/run/dg-rootfs".into();
    fs::write(out.join("spec.json"), spec.to_string()).unwrap();
    fs::write(out.join("run.sh"), node_script(TEST_IMAGE)).unwrap();
    let log = boot(&root, &out);
    let state = fs::read_to_string(out.join("state")).unwrap_or_default();
    assert!(
        state.starts_with("running") || state.starts_with("degraded"),
        "systemd did not boot: {state}\n{log}"
    );
    assert!(
        out.join("done").exists(),
        "the script did not finish\n{log}"
    );
    let step = |name| Step {
        out: &out,
        name,
        log: &log,
    };

    // The node as booted: Debian's config.toml, containerd enabled and running.
    let orig = step("orig");
    eprintln!(
        "containerd.service is {}",
        fs::read_to_string(out.join("enabled"))
            .unwrap_or_default()
            .trim()
    );
    orig.assert_running();
    let orig_config = orig.config();
    assert!(orig.has("nospec"), "{}", orig.said());
    let import = fs::read_to_string(out.join("import.out")).unwrap_or_default();
    assert_eq!(
        fs::read_to_string(out.join("import.rc"))
            .unwrap_or_default()
            .trim(),
        "0",
        "ctr images import: {import}\n{log}"
    );
    orig.assert_ran_container();

    // install-host --enable --restart: the marked lines, a new containerd, its CRI loaded.
    let install = step("install");
    assert_eq!(install.rc(), "0", "{}", install.said());
    assert_enabled(&orig_config, &install.config(), "install");
    assert!(install.has("spec"), "{}", install.said());
    install.assert_running();
    assert_ne!(
        install.pid(),
        orig.pid(),
        "containerd restarted\n{}",
        install.said()
    );
    install.assert_ran_container();
    for p in PROGRAMS {
        assert!(
            install.read("bin").lines().any(|l| l == p),
            "{p}: {}",
            install.said()
        );
    }

    podman_on_the_booted_node(&out, &log);
    // Through --root /host too (the DaemonSet's view: the wrapper checked chrooted), and a
    // rerun finds the drop-in in place.
    let host_dropin = fs::read_to_string(out.join("hostinstall.podmandropin")).unwrap_or_default();
    assert_eq!(
        host_dropin,
        fs::read_to_string(out.join("install.podmandropin")).unwrap_or_default(),
        "{log}"
    );
    assert!(
        fs::read_to_string(out.join("hostinstall.podmanruntime"))
            .unwrap_or_default()
            .lines()
            .any(|l| l == "/usr/local/bin/devgate-runtime"),
        "{log}"
    );
    assert!(!out.join("hostremove.podmandropin").exists(), "{log}");

    // Twice is once: nothing changes, nothing restarts.
    let again = step("again");
    assert_eq!(again.rc(), "0", "{}", again.said());
    assert!(
        again
            .read("out")
            .contains("devgate: containerd needs no restart"),
        "{}",
        again.said()
    );
    assert_eq!(again.config(), install.config());
    assert_eq!(again.read("spec"), install.read("spec"));
    assert_eq!(again.pid(), install.pid(), "{}", again.said());
    assert!(
        again.read("out").contains(
            "devgate: /etc/containers/containers.conf.d/99-devgate-runtime.conf is in place"
        ),
        "{}",
        again.said()
    );
    again.assert_running();

    // uninstall-host --restart: the config byte for byte, the spec gone (nothing names it),
    // containerd restarted without devgate.
    let uninstall = step("uninstall");
    assert_eq!(uninstall.rc(), "0", "{}", uninstall.said());
    assert!(
        uninstall
            .read("out")
            .contains("restarted containerd.service"),
        "{}",
        uninstall.said()
    );
    assert_eq!(uninstall.config(), orig_config, "{}", uninstall.said());
    assert!(uninstall.has("nospec"), "{}", uninstall.said());
    uninstall.assert_running();
    assert_ne!(uninstall.pid(), again.pid(), "{}", uninstall.said());
    uninstall.assert_ran_container();

    // containerd cannot start with devgate's lines: exit 2, one line, the files back as
    // they were, containerd running again.
    let prefail = step("prefail");
    let fail = step("fail");
    assert_eq!(fail.rc(), "2", "{}", fail.said());
    let err = fail.read("err");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {}", fail.said());
    assert!(lines[0].contains("containerd.service"), "{}", fail.said());
    assert_eq!(fail.config(), prefail.config(), "{}", fail.said());
    assert_eq!(fail.config(), orig_config, "{}", fail.said());
    assert_eq!(fail.has("nospec"), prefail.has("nospec"), "{}", fail.said());
    assert_eq!(fail.read("spec"), prefail.read("spec"), "{}", fail.said());
    fail.assert_running();
    assert_ne!(fail.pid(), prefail.pid(), "{}", fail.said());
    fail.assert_ran_container();

    // containerd starts but its CRI plugin cannot read the spec: the same, naming the
    // plugin; the spec, its record and config.toml back as install-host found them.
    let precri = step("precri");
    assert_eq!(precri.rc(), "0", "{}", precri.said());
    assert!(
        precri.has("spec") && precri.has("record"),
        "{}",
        precri.said()
    );
    let crifail = step("crifail");
    assert_eq!(crifail.rc(), "2", "{}", crifail.said());
    let err = crifail.read("err");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {}", crifail.said());
    for said in [
        "CRI plugin did not load",
        "io.containerd.grpc.v1 cri is error",
        "back as they were, and containerd runs as before",
    ] {
        assert!(lines[0].contains(said), "{said}: {}", crifail.said());
    }
    assert_eq!(crifail.config(), orig_config, "{}", crifail.said());
    for ext in ["spec", "record"] {
        assert!(crifail.has(ext), "{ext}: {}", crifail.said());
        assert_eq!(
            crifail.read(ext),
            precri.read(ext),
            "{ext}: {}",
            crifail.said()
        );
    }
    crifail.assert_running();
    assert_ne!(crifail.pid(), precri.pid(), "{}", crifail.said());
    crifail.assert_ran_container();

    // Without the drop-ins: on again, then off with the programs in one run.
    let reinstall = step("reinstall");
    assert_eq!(reinstall.rc(), "0", "{}", reinstall.said());
    assert_enabled(&orig_config, &reinstall.config(), "reinstall");
    reinstall.assert_running();
    assert_ne!(reinstall.pid(), crifail.pid(), "{}", reinstall.said());
    let remove = step("remove");
    assert_eq!(remove.rc(), "0", "{}", remove.said());
    assert_eq!(remove.config(), orig_config, "{}", remove.said());
    assert!(remove.has("nospec"), "{}", remove.said());
    remove.assert_running();
    assert_ne!(remove.pid(), reinstall.pid(), "{}", remove.said());
    remove.assert_no_programs();
    remove.assert_ran_container();

    // The same through /host, as the DaemonSet's init container runs it: systemctl runs
    // chrooted into /host and restarts the node's containerd.
    let hostinstall = step("hostinstall");
    assert_eq!(hostinstall.rc(), "0", "{}", hostinstall.said());
    assert_enabled(&orig_config, &hostinstall.config(), "install through /host");
    hostinstall.assert_running();
    assert_ne!(hostinstall.pid(), remove.pid(), "{}", hostinstall.said());
    hostinstall.assert_ran_container();
    let hostagain = step("hostagain");
    assert_eq!(hostagain.rc(), "0", "{}", hostagain.said());
    assert!(
        hostagain
            .read("out")
            .contains("containerd needs no restart"),
        "{}",
        hostagain.said()
    );
    assert_eq!(hostagain.pid(), hostinstall.pid(), "{}", hostagain.said());
    let hostremove = step("hostremove");
    assert_eq!(hostremove.rc(), "0", "{}", hostremove.said());
    assert_eq!(hostremove.config(), orig_config, "{}", hostremove.said());
    assert!(hostremove.has("nospec"), "{}", hostremove.said());
    hostremove.assert_running();
    assert_ne!(hostremove.pid(), hostagain.pid(), "{}", hostremove.said());
    hostremove.assert_no_programs();
    hostremove.assert_ran_container();

    // Last, so that a wording slip does not hide what the node did: an install that
    // restarted containerd says devgate is on, having checked its CRI plugin.
    for on in [&install, &reinstall, &hostinstall] {
        assert!(
            on.read("out")
                .contains("devgate: restarted containerd.service; devgate is on"),
            "{}",
            on.said()
        );
        assert!(
            !on.read("out").contains("could not be checked"),
            "{}",
            on.said()
        );
    }
}

// ---- The node without systemd ----------------------------------------------------------

/// A private mount namespace that stands for the node's root: `/etc`, `/usr` and
/// `/var/lib` are overlays whose upper layers live on a tmpfs of its own (what install-host
/// writes there stays in it), and `/run` is a fresh tmpfs: no `/run/systemd/system`, as on
/// a node without systemd (whatever runs this machine, nothing here can restart it). A
/// process holds it; commands enter it with nsenter, and the test reads its files through
/// `/proc/PID/root`.
struct NodeNs {
    child: Child,
    upper: PathBuf,
}

impl NodeNs {
    fn new(work: &Path) -> NodeNs {
        let upper = work.join("upper");
        fs::create_dir_all(&upper).unwrap();
        let ready = work.join("ns-ready");
        let script = r#"set -e
mount -t tmpfs -o mode=0755 tmpfs "$0"
for d in /etc /usr /var/lib; do
  n=$(echo "$d" | tr / _)
  mkdir "$0/$n.up" "$0/$n.work"
  mount -t overlay overlay -o "lowerdir=$d,upperdir=$0/$n.up,workdir=$0/$n.work" "$d"
done
mount -t tmpfs -o mode=0755 tmpfs /run
: >"$1"
exec sleep 100000"#;
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", script])
            .arg(&upper)
            .arg(&ready)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("the node's mount namespace", || {
            ready.exists() || child.try_wait().unwrap().is_some()
        });
        if !ready.exists() {
            let out = child.wait_with_output().unwrap();
            panic!("mount namespace: {}", text(&out));
        }
        NodeNs { child, upper }
    }

    /// `p` (a path on the node) as the test reaches it.
    fn path(&self, p: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.child.id())).join(p.trim_start_matches('/'))
    }

    fn enter(&self) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!("--mount=/proc/{}/ns/mnt", self.child.id()),
        ]
    }

    /// `containerd config dump` of the node's config.toml, as containerd reads it.
    fn config_dump(&self) -> Output {
        let e = self.enter();
        Command::new(&e[0])
            .args(&e[1..])
            .args([
                "containerd",
                "--config",
                "/etc/containerd/config.toml",
                "config",
                "dump",
            ])
            .output()
            .unwrap()
    }

    /// devgate ARGS on the node.
    fn devgate(&self, args: &[&str]) -> Output {
        let e = self.enter();
        Command::new(&e[0])
            .args(&e[1..])
            .arg(devgate_bin())
            .args(args)
            .env_remove("DEVGATE_CONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn devgate_ok(&self, args: &[&str]) -> String {
        let out = self.devgate(args);
        assert!(out.status.success(), "devgate {args:?}: {}", text(&out));
        text(&out)
    }

    /// Everything written to the node since it was made: each file of the overlays' upper
    /// layers, by path, with its bytes (a link's target, a whiteout's device).
    fn writes(&self) -> BTreeMap<String, String> {
        fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, String>) {
            let mut entries: Vec<_> = fs::read_dir(dir).unwrap().flatten().collect();
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let name = format!("{rel}/{}", e.file_name().to_string_lossy());
                let m = e.path().symlink_metadata().unwrap();
                use std::os::unix::fs::{MetadataExt, PermissionsExt};
                let mode = m.permissions().mode();
                if m.is_dir() {
                    out.insert(name.clone(), format!("dir {mode:o}"));
                    walk(&e.path(), &name, out);
                } else if m.is_file() {
                    let bytes = fs::read(e.path()).unwrap();
                    out.insert(
                        name,
                        format!("{mode:o} {}", String::from_utf8_lossy(&bytes)),
                    );
                } else if m.file_type().is_symlink() {
                    out.insert(name, format!("-> {:?}", fs::read_link(e.path()).unwrap()));
                } else {
                    out.insert(name, format!("other {mode:o} {}", m.rdev()));
                }
            }
        }
        let mut out = BTreeMap::new();
        for d in ["_etc", "_usr", "_var_lib"] {
            let up = self.path(s(&self.upper.join(format!("{d}.up"))));
            walk(&up, d, &mut out);
        }
        out
    }

    /// podman on the node as its operator runs it: the node's containers.conf files (no
    /// CONTAINERS_CONF), with `p`'s storage.
    fn podman(&self, p: &Podman, args: &[&str]) -> Output {
        let e = self.enter();
        Command::new(&e[0])
            .args(&e[1..])
            .arg("podman")
            .arg("--root")
            .arg(p.dir.join("root"))
            .arg("--runroot")
            .arg(p.dir.join("runroot"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .env_remove("CONTAINERS_CONF")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// containerd on the node, on its /etc/containerd/config.toml.
    fn containerd(&self, work: &Path) -> Containerd {
        let e = self.enter();
        let e: Vec<&str> = e.iter().map(String::as_str).collect();
        Containerd::start_on_config(
            work,
            Path::new("/etc/containerd/config.toml"),
            &work.join("c.sock"),
            &e,
        )
    }
}

impl Drop for NodeNs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pod on the node, removed when dropped (before containerd stops: fields drop in order).
struct PodOn {
    c: Cri,
    id: String,
    config: cri::PodSandboxConfig,
}

impl PodOn {
    fn run(cd: &Containerd, work: &Path, name: &str) -> PodOn {
        let mut c = Cri::connect(&cd.socket);
        let uid = format!("{name}-uid");
        let config = cri::host_network_pod(name, &uid, "ml", &work.join("pods").join(&uid));
        let id = c
            .run_pod_sandbox(&config)
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", cd.log()));
        PodOn { c, id, config }
    }

    fn create(&mut self, name: &str, devices: &[&str]) -> String {
        let req = cri::container(name, TEST_IMAGE, &["sh", "-c", "echo ran"], devices);
        self.c
            .create_container(&self.id, req, &self.config)
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}"))
    }

    /// The container starts, runs and exits 0.
    fn runs(&mut self, name: &str, devices: &[&str], cd: &Containerd) {
        let id = self.create(name, devices);
        if let Err(e) = self.c.start_container(&id) {
            panic!("StartContainer {name} ({devices:?}): {e}\n{}", cd.log());
        }
        let st = cri::wait_exited(&mut self.c, &id);
        assert_eq!(st.state, ContainerState::ContainerExited as i32, "{st:?}");
        assert_eq!(st.exit_code, 0, "{name}: {st:?}");
        let log = fs::read_to_string(&st.log_path).unwrap_or_default();
        assert!(log.contains(" stdout F ran"), "{name}: {log}");
        self.c.remove_container(&id).unwrap();
    }

    /// StartContainer fails with `line`, and ContainerStatus carries it as kubelet shows it.
    fn rejected(&mut self, name: &str, devices: &[&str], line: &str) {
        let id = self.create(name, devices);
        let err = self
            .c
            .start_container(&id)
            .expect_err("StartContainer must fail for a cordoned device");
        assert!(err.message().contains(line), "{err}");
        let st = self.c.container_status(&id).unwrap();
        assert_eq!(st.reason, "StartError", "{st:?}");
        assert!(st.message.contains(line), "{st:?}");
        self.c.remove_container(&id).unwrap();
    }
}

impl Drop for PodOn {
    fn drop(&mut self) {
        let _ = self.c.stop_pod_sandbox(&self.id);
        let _ = self.c.remove_pod_sandbox(&self.id);
    }
}

/// The node's containerd config.toml, in the version of the containerd under test, with
/// its state under `work` and its socket at `sock`: the CRI settings of a node without a
/// registry, and a runc runtime of its own (after `note`). Written under the node's /etc;
/// returns its path and text.
fn write_node_config(
    host: &NodeNs,
    work: &Path,
    sock: &Path,
    version: &cri::Config,
    note: &str,
) -> (PathBuf, String) {
    let config = format!(
        "{top}\nroot = \"{root}\"\nstate = \"{state}\"\n\n[grpc]\n  address = \"{sock}\"\n\n\
         [ttrpc]\n  address = \"{sock}.ttrpc\"\n\n[debug]\n  address = \"\"\n\n\
         [metrics]\n  address = \"\"\n\n{cri}\n{note}{runc}\n  runtime_type = \"io.containerd.runc.v2\"\n",
        top = version.top(),
        root = work.join("root").display(),
        state = work.join("state").display(),
        sock = sock.display(),
        cri = version.plugin_settings(TEST_IMAGE),
        runc = version.runc_table(),
    );
    let file = host.path("/etc/containerd/config.toml");
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, &config).unwrap();
    (file, config)
}

#[test]
fn enable_on_a_node_without_systemd_then_restart_by_hand() {
    require_root!();
    if let Some(why) = node::unified_without("cpu") {
        eprintln!("skipped: {why}: a CRI pod sandbox sets cpu.weight");
        return;
    }
    require_cmd("containerd", "containerd");
    let work = tempdir("enable-nosd");
    // The ConfigMap's config: devgate's state, quarantine and log in the test's dir.
    let env = Env::new("enable-nosd-env");
    let host = NodeNs::new(&work);
    let sock = work.join("c.sock");
    // The operator's config, in the version of the containerd under test (version 3 on
    // 2.x): the CRI settings of a node without a registry, and a runc runtime of its own,
    // under whose header install-host adds its lines.
    let version = cri::Config::of_containerd();
    version.say_loaded("the test's config.toml");
    let (file, config) =
        write_node_config(&host, &work, &sock, &version, "# the operator's runc\n");

    // podman on the node: its runtime is crun (podman's default), its settings this
    // machine's (the test Podman's) in the node's own containers.conf.
    // What a plain container does under crun before devgate is the baseline: crun 1.8
    // refuses this host's hybrid cgroups, and through the wrapper it must do the same.
    let podman = have("podman").then(|| {
        let p = Podman::new("enable-nosd-podman");
        let conf = host.path("/etc/containers/containers.conf");
        fs::create_dir_all(conf.parent().unwrap()).unwrap();
        fs::copy(p.dir.join("containers.conf"), &conf).unwrap();
        let plain = host.podman(&p, PLAIN);
        if !plain.status.success() {
            eprintln!("crun cannot run a container on this node: {}", text(&plain));
        }
        (p, plain)
    });

    // No devgate on the node yet: a container starts.
    let cd = host.containerd(&work);
    cd.import_test_image("k8s.io");
    {
        let mut pod = PodOn::run(&cd, &work, "before");
        pod.runs("plain", &[], &cd);
    }

    // --restart on a node without systemd: refused, and nothing on the node changed.
    let before = host.writes();
    let out = host.devgate(&[
        "install-host",
        "--root",
        "/",
        "--prefix",
        "/usr/local",
        "--config-file",
        s(&env.config),
        "--enable",
        "--restart",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not run systemd"),
        "{}",
        text(&out)
    );
    assert_eq!(
        host.writes(),
        before,
        "--restart without systemd changed the node"
    );

    // A drop-in with a CRI table (as nvidia-ctk writes one): containerd 1.x replaces the
    // whole plugin section with it, so devgate's lines in config.toml would reach no
    // runtime. install-host asks the node's containerd, and where config.toml's lines do
    // not reach the default runtime it lays its own copy of the drop-in, read after it.
    let dropins = host.path("/etc/containerd/conf.d");
    fs::create_dir_all(&dropins).unwrap();
    fs::write(
        dropins.join("99-nvidia.toml"),
        format!(
            "{}\n{}\n  runtime_type = \"io.containerd.runc.v2\"\n",
            version.top(),
            version
                .runc_table()
                .replace("runtimes.runc", "runtimes.nvidia")
        ),
    )
    .unwrap();
    let importing = config.replacen(
        version.top(),
        &format!(
            "{}\nimports = [\"/etc/containerd/conf.d/*.toml\"]",
            version.top()
        ),
        1,
    );
    assert_ne!(importing, config);
    fs::write(&file, &importing).unwrap();
    let out = host.devgate(&[
        "install-host",
        "--root",
        "/",
        "--prefix",
        "/usr/local",
        "--config-file",
        s(&env.config),
        "--enable",
    ]);
    let dump = host.config_dump();
    let dumped = String::from_utf8_lossy(&dump.stdout).into_owned();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        dumped.contains("devgate-base-spec.json"),
        "install-host said yes, containerd no: {dumped}"
    );
    // 2.x merges the drop-in's runtime tables with config.toml's; 1.x needs the copy.
    eprintln!(
        "{version:?}: devgate's copy of the drop-in: {}",
        dropins.join("zz-devgate.toml").exists()
    );
    fs::remove_dir_all(&dropins).unwrap();
    fs::write(&file, &config).unwrap();

    // --enable alone: the config names the spec; the operator restarts containerd (this
    // node has no systemd for devgate to do it through).
    let said = host.devgate_ok(&[
        "install-host",
        "--root",
        "/",
        "--prefix",
        "/usr/local",
        "--config-file",
        s(&env.config),
        "--enable",
    ]);
    let edited = fs::read_to_string(&file).unwrap();
    assert_enabled(&config, &edited, "install-host --enable");
    assert!(said.contains("rerun with --restart"), "{said}");
    assert!(host
        .path("/etc/containerd/devgate-base-spec.json")
        .is_file());
    // Run twice, it changes nothing.
    host.devgate_ok(&[
        "install-host",
        "--root",
        "/",
        "--prefix",
        "/usr/local",
        "--config-file",
        s(&env.config),
        "--enable",
    ]);
    assert_eq!(fs::read_to_string(&file).unwrap(), edited);
    drop(cd);
    let cd = host.containerd(&work);

    // devgate is on: a cordoned device is rejected with devgate's line, a container
    // without devices starts.
    env.ok(&["cordon", "/dev/zero", "--reason", "enable test"]);
    let reject = r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "enable test"; policy reject"#;
    {
        let mut pod = PodOn::run(&cd, &work, "on");
        pod.rejected("gpu", &["/dev/zero"], reject);
        pod.runs("plain", &[], &cd);
    }
    if let Some((p, plain)) = &podman {
        podman_through_the_wrapper(&host, p, plain, reject);
    }
    let decisions = env.decisions();
    assert!(
        decisions.iter().any(|d| d["action"] == "reject"),
        "{decisions:?}"
    );

    // uninstall-host: the config byte for byte; the operator restarts containerd; then the
    // programs go, and the device devgate rejected starts (devgate is off).
    let said = host.devgate_ok(&["uninstall-host", "--root", "/"]);
    assert_eq!(fs::read_to_string(&file).unwrap(), config, "{said}");
    assert!(said.contains("--programs"), "{said}");
    if let Some((p, _)) = &podman {
        // podman runs crun itself again, and with the hooks gone the device starts.
        assert!(!host.path(PODMAN_DROPIN).exists(), "{said}");
        assert!(
            !host.path("/etc/containers/containers.conf.d").exists(),
            "the directory install-host made stays: {said}"
        );
        let out = host.podman(p, ON_ZERO);
        assert!(!text(&out).contains("devgate"), "{}", text(&out));
    }
    drop(cd);
    let cd = host.containerd(&work);
    let said = host.devgate_ok(&["uninstall-host", "--root", "/", "--programs"]);
    for p in PROGRAMS {
        assert!(
            !host.path(&format!("/usr/local/bin/{p}")).exists(),
            "{p} left: {said}"
        );
    }
    assert_eq!(fs::read_to_string(&file).unwrap(), config);
    {
        let mut pod = PodOn::run(&cd, &work, "off");
        pod.runs("gpu", &["/dev/zero"], &cd);
        pod.runs("plain", &[], &cd);
    }
    env.ok(&["uncordon", "/dev/zero"]);
    drop(cd);
}

/// podman on a node where install-host put devgate-runtime in front of its crun: the
/// drop-in names the wrapper under crun's own name, devgate's config has the wrapper run
/// crun, podman's error carries devgate's reject line, a container without devices runs,
/// and doctor passes podman.
fn podman_through_the_wrapper(host: &NodeNs, p: &Podman, plain: &Output, reject: &str) {
    let dropin = fs::read_to_string(host.path(PODMAN_DROPIN)).unwrap();
    assert!(
        dropin.ends_with("[engine.runtimes]\n\"crun\" = [\"/usr/local/bin/devgate-runtime\"]\n"),
        "{dropin}"
    );
    let cfg: serde_json::Value =
        serde_json::from_slice(&fs::read(host.path("/etc/devgate/config.json")).unwrap()).unwrap();
    assert_eq!(cfg["runtime"]["path"], "crun", "{cfg}");
    let out = host.podman(p, ON_ZERO);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(reject), "{}", text(&out));
    let out = host.podman(p, PLAIN);
    assert_eq!(out.status.code(), plain.status.code(), "{}", text(&out));
    if plain.status.success() {
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    } else {
        let last = |o: &Output| text(o).trim_end().lines().last().unwrap_or("").to_string();
        assert_eq!(
            last(&out),
            last(plain),
            "the wrapper changed what crun says"
        );
    }
    let doctor = host.devgate(&["doctor"]);
    let podman_line = String::from_utf8_lossy(&doctor.stdout)
        .lines()
        .find(|l| l.contains(" podman: "))
        .unwrap_or_default()
        .to_string();
    assert!(
        podman_line.starts_with("✓ podman: ")
            && podman_line
                .ends_with("its runtime is devgate's wrapper /usr/local/bin/devgate-runtime"),
        "{}",
        text(&doctor)
    );
}

/// podman 5 on the booted forky node, whose runtime is crun: install-host put
/// devgate-runtime in front of it (the drop-in under crun's own name, devgate's config
/// running crun), a cordoned device's start fails with devgate's line, a plain container
/// does what it did before devgate, doctor passes every runtime the node has, and
/// uninstall-host takes the drop-in out again.
fn podman_on_the_booted_node(out: &Path, log: &str) {
    let read = |n: &str| fs::read_to_string(out.join(n)).unwrap_or_default();
    assert_eq!(
        read("podman-load.rc").trim(),
        "0",
        "podman load: {}\n{log}",
        read("podman-load.out")
    );
    let dropin = read("install.podmandropin");
    assert!(
        dropin.ends_with("[engine.runtimes]\n\"crun\" = [\"/usr/local/bin/devgate-runtime\"]\n"),
        "no podman drop-in: {dropin:?}\n{}\n{log}",
        read("install.out")
    );
    let cfg: serde_json::Value = serde_json::from_str(&read("install.devgateconfig")).unwrap();
    assert_eq!(cfg["runtime"]["path"], "crun", "{cfg}");
    // podman keeps crun's name and runs the wrapper under it.
    let info = read("install.podmanruntime");
    assert!(
        info.lines()
            .any(|l| l == "crun /usr/local/bin/devgate-runtime"),
        "podman info: {info}"
    );
    let reject =
        r#"devgate: rejected /dev/zero (1:5): quarantined by operator: "forky"; policy reject"#;
    assert_ne!(read("installreject.podmanrc").trim(), "0");
    assert!(
        read("installreject.podman").contains(reject),
        "podman's error: {}\ncordon: {}\n{log}",
        read("installreject.podman"),
        read("cordon.out")
    );
    // A plain container does through the wrapper what it did under crun alone.
    let orig_rc = read("orig.podmanrc");
    eprintln!(
        "podman run on the booted node before devgate: rc {}: {}",
        orig_rc.trim(),
        read("orig.podman").trim_end().lines().last().unwrap_or("")
    );
    for s in ["install", "uninstall"] {
        assert_eq!(
            read(&format!("{s}.podmanrc")),
            orig_rc,
            "{s}: {}\nbefore: {}\n{log}",
            read(&format!("{s}.podman")),
            read("orig.podman")
        );
        if orig_rc.trim() == "0" {
            let said = read(&format!("{s}.podman"));
            assert!(said.lines().any(|l| l == "ran"), "{s}: {said}");
        }
    }
    let doctor = read("install.doctor");
    for l in doctor.lines() {
        for rt in ["podman", "cri-o", "containerd", "containerd annotations"] {
            if l.starts_with(&format!("✗ {rt}: ")) {
                panic!("doctor fails {rt} after install-host:\n{doctor}");
            }
        }
    }
    assert!(
        doctor.lines().any(|l| l.starts_with("✓ podman: ")
            && l.ends_with("its runtime is devgate's wrapper /usr/local/bin/devgate-runtime")),
        "{doctor}"
    );
    assert!(
        doctor.lines().any(|l| l.starts_with("✓ containerd: ")),
        "{doctor}"
    );
    assert!(
        doctor
            .lines()
            .any(|l| l.starts_with("✓ containerd annotations: ")),
        "{doctor}"
    );
    assert!(
        !out.join("uninstall.podmandropin").exists(),
        "{}",
        read("uninstall.out")
    );
}

/// A node whose containerd runs crun (its default runtime's `BinaryName`): install-host
/// `--enable` sets the operator's BinaryName line aside for devgate-runtime's, which
/// containerd's own `config dump` then reads (imports included), doctor passes containerd,
/// and uninstall-host gives config.toml back byte for byte. File level: crun 1.8 starts no
/// container on this host's hybrid cgroups, so no pod runs here; the booted forky node
/// runs runc.
#[test]
fn containerd_running_crun_gets_the_wrapper() {
    require_root!();
    require_cmd("containerd", "containerd");
    require_cmd("crun", "crun");
    let work = tempdir("enable-crun-ctd");
    let host = NodeNs::new(&work);
    let version = cri::Config::of_containerd();
    let config = format!(
        "{top}\n\n{runc}\n  runtime_type = \"io.containerd.runc.v2\"\n{opts}.options]\n  \
         BinaryName = \"/usr/bin/crun\"  # the operator's crun\n  SystemdCgroup = false\n",
        top = version.top(),
        runc = version.runc_table(),
        opts = version.runc_table().trim_end_matches(']'),
    );
    let file = host.path("/etc/containerd/config.toml");
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, &config).unwrap();
    let said = host.devgate_ok(&[
        "install-host",
        "--root",
        "/",
        "--prefix",
        "/usr/local",
        "--enable",
    ]);
    let edited = fs::read_to_string(&file).unwrap();
    assert!(
        edited.contains(
            "# devgate install-host set aside:   BinaryName = \"/usr/bin/crun\"  # the operator's crun\n  \
             BinaryName = \"/usr/local/bin/devgate-runtime\" # devgate install-host\n"
        ),
        "{edited}\n{said}"
    );
    let cfg: serde_json::Value =
        serde_json::from_slice(&fs::read(host.path("/etc/devgate/config.json")).unwrap()).unwrap();
    assert_eq!(cfg["runtime"]["path"], "crun", "{cfg}");
    let dump = host.config_dump();
    let dumped = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dumped
            .lines()
            .any(|l| l.trim().starts_with("BinaryName")
                && l.contains("/usr/local/bin/devgate-runtime")),
        "{dumped}"
    );
    let doctor = host.devgate(&["doctor"]);
    let lines = String::from_utf8_lossy(&doctor.stdout).into_owned();
    assert!(
        lines.lines().any(|l| l.starts_with("✓ containerd: default runtime runc runs devgate's runtime wrapper /usr/local/bin/devgate-runtime")),
        "{lines}"
    );
    // Twice is once.
    host.devgate_ok(&[
        "install-host",
        "--root",
        "/",
        "--prefix",
        "/usr/local",
        "--enable",
    ]);
    assert_eq!(fs::read_to_string(&file).unwrap(), edited);
    let said = host.devgate_ok(&["uninstall-host", "--root", "/"]);
    assert_eq!(fs::read_to_string(&file).unwrap(), config, "{said}");
}

// ---- The GPU Operator's node -------------------------------------------------------------

/// The GPU Operator's toolkit on the node: nvidia-ctk and nvidia-container-runtime built from
/// NVIDIA's module (tests/nvidia-toolkit, scripts/k8s-binaries.sh), laid where the
/// operator's toolkit container lays them, with the runtime in CDI mode (no
/// libnvidia-container, no driver) and a CDI spec for the fake GPUs.
const TOOLKIT_DIR: &str = "/usr/local/nvidia/toolkit";
const NVIDIA_DROPIN: &str = "/etc/containerd/conf.d/99-nvidia.toml";
const DEVGATE_DROPIN: &str = "/etc/containerd/conf.d/zz-devgate.toml";

fn toolkit_bin() -> PathBuf {
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/k8s-binaries.sh"))
        .args(["build", "nvidia-toolkit"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "k8s-binaries.sh build nvidia-toolkit: {}",
        text(&out)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or(""),
    )
}

impl NodeNs {
    /// The toolkit's programs and the runtime's config on the node; `dev` holds the fake
    /// GPUs' device nodes, which the CDI spec names.
    fn lay_toolkit(&self, bin: &Path, dev: &Path) {
        let dir = self.path(TOOLKIT_DIR);
        fs::create_dir_all(&dir).unwrap();
        for p in ["nvidia-ctk", "nvidia-container-runtime"] {
            fs::copy(bin.join(p), dir.join(p)).unwrap();
        }
        let conf = self.path("/etc/nvidia-container-runtime/config.toml");
        fs::create_dir_all(conf.parent().unwrap()).unwrap();
        fs::write(
            &conf,
            "[nvidia-container-runtime]\nmode = \"cdi\"\nruntimes = [\"runc\"]\n\
             [nvidia-container-runtime.modes.cdi]\ndefault-kind = \"nvidia.com/gpu\"\n",
        )
        .unwrap();
        let devices: Vec<String> = (0..2)
            .map(|i| {
                format!(
                    r#"{{"name":"{i}","containerEdits":{{"deviceNodes":[{{"path":"/dev/nvidia{i}","hostPath":"{}"}}]}}}}"#,
                    dev.join(format!("nvidia{i}")).display()
                )
            })
            .collect();
        let cdi = self.path("/etc/cdi/nvidia.json");
        fs::create_dir_all(cdi.parent().unwrap()).unwrap();
        fs::write(
            &cdi,
            format!(
                r#"{{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{}]}}"#,
                devices.join(",")
            ),
        )
        .unwrap();
    }

    /// What the operator's toolkit container runs: `nvidia-ctk runtime configure` with the
    /// drop-in, the config from `containerd config dump`, nvidia the default and CDI on
    /// (nvidia-ctk-installer's containerd defaults in v1.20). Returns the toolkit's files.
    fn toolkit_configure(&self) -> (String, String) {
        let e = self.enter();
        let out = Command::new(&e[0])
            .args(&e[1..])
            .arg(format!("{TOOLKIT_DIR}/nvidia-ctk"))
            .args([
                "runtime",
                "configure",
                "--runtime=containerd",
                "--config=/etc/containerd/config.toml",
                &format!("--drop-in-config={NVIDIA_DROPIN}"),
                "--config-source=command",
                &format!("--nvidia-runtime-path={TOOLKIT_DIR}/nvidia-container-runtime"),
                "--nvidia-set-as-default",
                "--cdi.enabled",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "nvidia-ctk: {}", text(&out));
        (
            fs::read_to_string(self.path(NVIDIA_DROPIN)).unwrap(),
            fs::read_to_string(self.path("/etc/containerd/config.toml")).unwrap(),
        )
    }
}

impl PodOn {
    /// A container asking nvidia-container-runtime for fake GPU `gpu` (CDI, by
    /// NVIDIA_VISIBLE_DEVICES), which checks that the device is there.
    fn gpu_container(&mut self, name: &str, gpu: u32) -> String {
        let check = format!("test -c /dev/nvidia{gpu} && echo ran");
        let mut req = cri::container(name, TEST_IMAGE, &["sh", "-c", &check], &[]);
        req.envs.push(cri::KeyValue {
            key: "NVIDIA_VISIBLE_DEVICES".into(),
            value: gpu.to_string(),
        });
        self.c
            .create_container(&self.id, req, &self.config)
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}"))
    }

    fn gpu_runs(&mut self, name: &str, gpu: u32, cd: &Containerd) {
        let id = self.gpu_container(name, gpu);
        if let Err(e) = self.c.start_container(&id) {
            panic!("StartContainer {name} (GPU {gpu}): {e}\n{}", cd.log());
        }
        let st = cri::wait_exited(&mut self.c, &id);
        let log = fs::read_to_string(&st.log_path).unwrap_or_default();
        assert_eq!(st.exit_code, 0, "{name}: {st:?} {log}");
        assert!(log.contains(" stdout F ran"), "{name}: {log}");
        self.c.remove_container(&id).unwrap();
    }

    fn gpu_rejected(&mut self, name: &str, gpu: u32) {
        let id = self.gpu_container(name, gpu);
        let err = self
            .c
            .start_container(&id)
            .expect_err("StartContainer must fail for a cordoned GPU");
        let line = format!("devgate: rejected /dev/nvidia{gpu}");
        assert!(err.message().contains(&line), "{err}");
        self.c.remove_container(&id).unwrap();
    }
}

/// One GPU Operator node, in one order of installs: the toolkit's configure (and containerd's
/// restart), devgate's install-host --enable; then the toolkit reruns and restarts
/// containerd; a cordoned GPU is refused with devgate's line and a healthy one starts
/// throughout; uninstall-host leaves the toolkit's files as the toolkit last wrote them.
fn gpu_operator_node(toolkit_first: bool) {
    let tag = if toolkit_first {
        "gpuop-tk"
    } else {
        "gpuop-dg"
    };
    let work = tempdir(tag);
    let gpus = common::fake_nvml::GpuNode::new(&format!("{tag}-gpus"));
    let env = Env::with(&format!("{tag}-env"), gpus.config());
    let host = NodeNs::new(&work);
    let sock = work.join("c.sock");
    let version = cri::Config::of_containerd();
    let (file, _) = write_node_config(&host, &work, &sock, &version, "");
    host.lay_toolkit(&toolkit_bin(), &gpus.dev_root);
    let install = [
        "install-host",
        "--root",
        "/",
        "--prefix",
        "/usr/local",
        "--config-file",
        s(&env.config),
        "--enable",
    ];
    let mut toolkit = if toolkit_first {
        let t = host.toolkit_configure();
        eprintln!("{version:?}: the toolkit's drop-in:\n{}", t.0);
        // The toolkit's containerd runs the GPU through nvidia-container-runtime.
        let cd = host.containerd(&work);
        cd.import_test_image("k8s.io");
        PodOn::run(&cd, &work, "before").gpu_runs("gpu0", 0, &cd);
        let said = host.devgate_ok(&install);
        assert!(host.path(DEVGATE_DROPIN).is_file(), "{said}");
        // The toolkit's drop-in as it wrote it; config.toml gains devgate's marked lines.
        let now = fs::read_to_string(host.path(NVIDIA_DROPIN)).unwrap();
        assert_eq!(now, t.0, "install-host wrote the toolkit's drop-in: {said}");
        t
    } else {
        host.devgate_ok(&install);
        host.toolkit_configure()
    };
    // doctor agrees: the default runtime is the toolkit's, and it runs devgate.
    let doctor = text(&host.devgate(&["doctor", "--config", s(&env.config)]));
    assert!(
        doctor.contains(
            "✓ containerd: default runtime nvidia starts from /etc/containerd/devgate-base-spec.json"
        ),
        "{doctor}"
    );
    // /dev/nvidia1 is the fake GPU 195:1 (its node is under the test's dev_root).
    env.ok(&["cordon", "195:1", "--reason", "operator test"]);
    for round in ["installed", "the toolkit reran"] {
        let cd = host.containerd(&work);
        cd.import_test_image("k8s.io");
        let mut pod = PodOn::run(&cd, &work, &format!("on-{}", round.len()));
        pod.gpu_rejected("gpu1", 1);
        pod.gpu_runs("gpu0", 0, &cd);
        drop(pod);
        drop(cd);
        if round == "installed" {
            toolkit = host.toolkit_configure();
            // The DaemonSet's installer reruns too: it follows the toolkit's new drop-in.
            host.devgate_ok(&install);
        }
    }
    let said = host.devgate_ok(&["uninstall-host", "--root", "/"]);
    assert!(!host.path(DEVGATE_DROPIN).exists(), "{said}");
    assert_eq!(
        fs::read_to_string(host.path(NVIDIA_DROPIN)).unwrap(),
        toolkit.0,
        "uninstall-host changed the toolkit's drop-in: {said}"
    );
    assert_eq!(fs::read_to_string(&file).unwrap(), toolkit.1, "{said}");
    // The toolkit copied devgate's base spec into its own files: the spec stays, without
    // hooks, and every GPU starts again.
    let cd = host.containerd(&work);
    cd.import_test_image("k8s.io");
    let mut pod = PodOn::run(&cd, &work, "off");
    pod.gpu_runs("gpu1", 1, &cd);
}

/// Whether a CRI pod sandbox can run here (containerd, and cpu.weight where cgroup v2
/// lacks the cpu controller); where not, says why, and the test skips.
fn cri_sandbox_here() -> bool {
    if let Some(why) = node::unified_without("cpu") {
        eprintln!("skipped: {why}: a CRI pod sandbox sets cpu.weight");
        return false;
    }
    require_cmd("containerd", "containerd");
    true
}

#[test]
fn gpu_operator_toolkit_first() {
    require_root!();
    if cri_sandbox_here() {
        gpu_operator_node(true);
    }
}

#[test]
fn gpu_operator_devgate_first() {
    require_root!();
    if cri_sandbox_here() {
        gpu_operator_node(false);
    }
}
