//! A device rule's numbers as the real crun reads them on cgroup v2 (SECURITY.md, "What
//! devgate assumes of each runtime's parser"). crun copies a rule's major and minor into a
//! C `int` for its eBPF device filter, so `{"major":195,"minor":4294967297}` is `c 195:1`
//! there. These tests show crun granting it, and devgate refusing the spec that asks.
//! The node has no NVIDIA driver: an open that the device filter lets through fails with
//! ENXIO ("No such device or address"), one it stops with EPERM.

mod common;
use common::node::Runtime;
use common::*;
use std::fs;

/// The attacker's rule: after the spec's deny-all, an allow whose minor is 2^32 + 1.
const TRUNCATED: &str = "4294967297";

/// A bundle whose process makes `c 195:1` and opens it, writing what the open said to the
/// marker; its rules allow `c 195:<minor>` after the deny-all.
fn opener(tag: &str, minor: &str) -> Bundle {
    let mut b = Bundle::new(
        tag,
        &[
            "sh",
            "-c",
            "mknod /dev/g c 195 1 && { head -c1 /dev/g; echo; } > /out/ran 2>&1; echo done >> /out/ran",
        ],
    );
    let rule: serde_json::Value = serde_json::from_str(&format!(
        r#"{{"allow":true,"type":"c","major":195,"minor":{minor},"access":"rwm"}}"#
    ))
    .unwrap();
    b.spec["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(rule);
    b
}

fn crun_v2() -> Runtime {
    assert!(
        have("crun"),
        "crun is not installed: make test installs it (scripts/install-test-deps.sh)"
    );
    Runtime::CRUN_V2
}

/// crun itself, no devgate: the truncated minor opens GPU 1 (the filter lets the open
/// through to the driver), where a rule for another minor does not.
#[test]
fn crun_on_cgroup_v2_reads_a_rule_number_as_a_c_int() {
    require_root!();
    let rt = crun_v2();
    let b = opener("rulenum-crun", TRUNCATED);
    let out = runtime_run_on(rt, &b, &unique_id("t"));
    assert!(out.status.success(), "{}", text(&out));
    let said = fs::read_to_string(b.marker()).unwrap();
    assert!(said.contains("No such device or address"), "{said}");
    let b = opener("rulenum-crun-other", "2");
    let out = runtime_run_on(rt, &b, &unique_id("o"));
    assert!(out.status.success(), "{}", text(&out));
    let said = fs::read_to_string(b.marker()).unwrap();
    assert!(said.contains("Operation not permitted"), "{said}");
}

/// The attack with devgate's hook: GPU 1 is quarantined, and the spec reaches it only
/// through the truncated minor. devgate refuses the spec, naming the rule, and the
/// process never runs.
#[test]
fn crun_on_cgroup_v2_start_with_a_truncated_rule_number_is_refused() {
    require_root!();
    let rt = crun_v2();
    let dev_root = tempdir("rulenum-dev");
    nix::sys::stat::mknod(
        &dev_root.join("nvidia1"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(195, 1),
    )
    .unwrap();
    let env = Env::with("rulenum", serde_json::json!({"dev_root": dev_root}));
    let node = dev_root.join("nvidia1");
    env.ok(&["cordon", node.to_str().unwrap(), "--reason", "xid 79"]);
    let mut b = opener("rulenum-hook", TRUNCATED);
    b.add_hooks(&env, &["prestart"]);
    let hook_stderr = b.dir.join("hooks.stderr");
    b.spec["annotations"] = serde_json::json!({"run.oci.hooks.stderr": hook_stderr});
    let out = runtime_run_on(rt, &b, &unique_id("h"));
    let mut all = text(&out);
    all.push_str(&fs::read_to_string(&hook_stderr).unwrap_or_default());
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("linux.resources.devices[1]: minor 4294967297"),
        "{all}"
    );
    assert!(!b.marker().exists(), "the container process ran: {all}");
}
