//! The wrapper's remap under the systemd cgroup driver on the 2026 node: the forky image
//! booted by systemd-nspawn with systemd as PID 1 on cgroup v2, runc 1.3 and crun 1.2x run
//! with `--systemd-cgroup` through devgate-runtime, with bpffs mounted (crun hands systemd
//! a BPFProgram=) and without it (crun falls back to DeviceAllow=, which refuses a deny
//! rule). In each case the container sees the spare at the bad device's path, the bad
//! device is denied, systemd's view of the scope agrees, and all of it holds after
//! `systemctl daemon-reload` (systemd rewrites the scope's device policy from its own
//! properties then).
//!
//! It runs on the host and boots the image itself (scripts/forky-stack.sh builds or finds
//! it); inside the forky stack's own pass it skips.

mod common;
use common::boot::{image_to_boot, skip_in_forky_pass, Boot};
use common::wrapper::*;
use common::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The forky image's root, or why there is none.
/// One container: a runtime, bpffs or not, its environment, bundle and wrapper.
struct Case {
    runtime: &'static str,
    bpffs: bool,
    /// The spec allows `c 10:*` (as `c 195:*` does for GPUs) besides the bad device.
    wildcard: bool,
    id: String,
    env: Env,
    bundle: Bundle,
    wrapper: Wrapper,
}

impl Case {
    fn new(runtime: &'static str, bpffs: bool, wildcard: bool) -> Case {
        let tag = format!(
            "sd-{runtime}-{}{}",
            if bpffs { "bpf" } else { "nobpf" },
            if wildcard { "-wild" } else { "" }
        );
        let env = remap_env(&tag, runtime);
        let id = unique_id(&tag);
        let mut bundle = bundle(&tag, &["sleep", "600"]);
        // The scope systemd makes is dgtest-<id>.scope.
        bundle.spec["linux"]["cgroupsPath"] = json!(format!("system.slice:dgtest:{id}"));
        if wildcard {
            let rules = bundle.spec["linux"]["resources"]["devices"].as_array_mut();
            rules
                .unwrap()
                .push(json!({"allow": true, "type": "c", "major": 10, "access": "rwm"}));
        }
        bundle.write();
        let wrapper = Wrapper::new(&env);
        Case {
            runtime,
            bpffs,
            wildcard,
            id,
            env,
            bundle,
            wrapper,
        }
    }

    /// The shell lines that run it inside the booted image, writing `<out>/<id>.*`.
    fn script(&self, out: &Path) -> String {
        let w = &self.wrapper;
        let o = out.join(&self.id);
        let unit = format!("dgtest-{}.scope", self.id);
        format!(
            "{bpf}\n\
             wr() {{ DEVGATE_CONFIG={cfg} {link} --root {root} --log {log} --log-format json --systemd-cgroup \"$@\"; }}\n\
             wr create --no-new-keyring --bundle {bundle} {id} >{o}.create 2>&1; echo $? >>{o}.create\n\
             wr start {id} >>{o}.create 2>&1\n\
             for n in 1 2; do\n\
               systemctl show -p BPFProgram -p DevicePolicy -p DeviceAllow {unit} >{o}.show$n 2>&1\n\
               {rt} --root {root} --systemd-cgroup exec {id} sh -c '{probe}' >{o}.probe$n 2>{o}.err$n\n\
               [ $n = 1 ] && systemctl daemon-reload\n\
             done\n\
             {rt} --root {root} --systemd-cgroup kill {id} KILL; sleep 1\n\
             wr delete --force {id} >>{o}.create 2>&1\n",
            bpf = if self.bpffs {
                "mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf"
            } else {
                "! mountpoint -q /sys/fs/bpf || umount /sys/fs/bpf"
            },
            cfg = s(&w.config),
            link = s(&w.link),
            root = s(&w.root),
            log = s(&w.log),
            bundle = s(&self.bundle.dir),
            id = self.id,
            o = s(&o),
            rt = self.runtime,
            probe = PROBE,
        )
    }

    /// The host paths the image needs at the same place.
    fn binds(&self) -> Vec<PathBuf> {
        vec![
            self.env.dir.clone(),
            self.bundle.dir.clone(),
            self.wrapper.link.parent().unwrap().to_path_buf(),
        ]
    }
}

/// `systemctl show` output as key → values (DeviceAllow= comes once per entry).
fn show(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in text.lines().filter_map(|l| l.split_once('=')) {
        m.entry(k.to_string()).or_default().push(v.to_string());
    }
    // systemd may list DeviceAllow= in another order after a daemon-reload.
    m.values_mut().for_each(|v| v.sort());
    m
}

/// Boots the image with `script` as a unit that powers the machine off when done.
fn boot(root: &Path, out: &Path, script: &str, binds: &[PathBuf]) -> String {
    fs::write(out.join("run.sh"), script).unwrap();
    let mut args = vec![format!("--bind={BAD}"), format!("--bind={SPARE}")];
    let bin_dir = devgate_bin().parent().unwrap().to_path_buf();
    for b in binds.iter().chain([&bin_dir]) {
        args.push(format!("--bind={}", b.display()));
    }
    let b = Boot {
        description: "devgate systemd-driver remap test",
        tag: "dg-sd-remap",
        nspawn_timeout_s: 180,
        script_timeout_s: None,
        args,
        run_tail: None,
    };
    common::boot::boot(root, out, &b)
}

#[test]
fn remap_holds_under_the_systemd_driver_with_and_without_bpffs() {
    require_root!();
    if skip_in_forky_pass() || !have_devices() {
        return;
    }
    let Some(root) = image_to_boot() else {
        return;
    };
    let mut cases = Vec::new();
    for (bpf, wild) in [(false, false), (true, false), (false, true), (true, true)] {
        cases.extend(["runc", "crun"].map(|rt| Case::new(rt, bpf, wild)));
    }
    let out = tempdir("sd-remap-out");
    // Inside, /dgout is `out`; the cases write there.
    let inner = Path::new("/dgout");
    let mut script = String::from(
        "mkdir -p /dev/char\nln -sf ../fuse /dev/char/10:229\nln -sf ../loop-control /dev/char/10:237\n",
    );
    let mut binds = Vec::new();
    for c in &cases {
        script.push_str(&c.script(inner));
        binds.extend(c.binds());
    }
    let log = boot(&root, &out, &script, &binds);
    let state = fs::read_to_string(out.join("state")).unwrap_or_default();
    assert!(
        state.starts_with("running") || state.starts_with("degraded"),
        "systemd did not boot: {state}\n{log}"
    );
    for c in &cases {
        let read =
            |ext: &str| fs::read_to_string(out.join(format!("{}.{ext}", c.id))).unwrap_or_default();
        let what = format!(
            "{} with{} bpffs{}",
            c.runtime,
            if c.bpffs { "" } else { "out" },
            if c.wildcard { ", c 10:* allowed" } else { "" }
        );
        let create = read("create");
        assert!(
            create.contains("devgate: remapped /dev/fuse (10:229) -> /dev/loop-control (10:237)"),
            "{what}: {create}\n{log}"
        );
        for n in 1..=2 {
            let probe = read(&format!("probe{n}"));
            assert_eq!(
                probe_says(&probe),
                remapped(),
                "{what}, probe {n}: {probe}{}\n{create}\n{log}",
                read(&format!("err{n}"))
            );
            let sd = show(&read(&format!("show{n}")));
            let allow = sd.get("DeviceAllow").cloned().unwrap_or_default();
            let prog = sd.get("BPFProgram").cloned().unwrap_or_default();
            let policy = sd.get("DevicePolicy").map(|v| v.join(","));
            if n == 1 {
                eprintln!("{what}: systemd has {sd:?}");
            }
            // The bad device never reaches systemd. (crun reads a minor of 0 as a wildcard
            // there: the split's `c 10:0` shows as `char-10`; the probe above says what the
            // container may open.)
            assert!(
                !allow.iter().any(|a| a.starts_with("/dev/char/10:229")),
                "{what}: {sd:?}"
            );
            if c.runtime == "crun" && c.bpffs {
                // crun's own program carries the rules; systemd holds no list of its own.
                assert!(
                    prog.iter().any(|p| p.starts_with("device:")),
                    "{what}, show {n}: {sd:?}"
                );
            } else {
                assert_eq!(
                    policy.as_deref(),
                    Some("strict"),
                    "{what}, show {n}: {sd:?}"
                );
                assert!(
                    allow.iter().any(|a| a == "/dev/char/10:237 rwm"),
                    "{what}, show {n}: {sd:?}"
                );
            }
        }
        assert_eq!(
            show(&read("show1")),
            show(&read("show2")),
            "{what}: daemon-reload changed the scope"
        );
        assert_eq!(leases(&c.env), vec![], "{what}: delete gave the spare back");
    }
}
