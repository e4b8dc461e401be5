//! Bounded state: a crash-looping pod's rejected starts do not pile up under state_dir.

mod common;
use common::wrapper::Wrapper;
use common::*;
use serde_json::json;
use std::path::Path;

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| {
                    if e.file_type().unwrap().is_dir() {
                        count_files(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn rejected_starts_with_distinct_ids_leave_at_most_twice_exits_keep_files() {
    const KEEP: usize = 20;
    let env = Env::with("bounded", json!({ "exits_keep": KEEP }));
    let mut b = Bundle::new("bounded", &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.write();
    env.ok(&["cordon", "1:5", "--reason", "bad"]);
    for i in 0..300 {
        let state = b.state_json(&format!("crashloop-{i}"));
        let pre = env.hook_stdin("prestart", state.as_bytes());
        assert!(
            !pre.status.success(),
            "start {i} was not rejected: {}",
            text(&pre)
        );
        let post = env.hook_stdin("poststop", state.as_bytes());
        assert!(post.status.success(), "{}", text(&post));
    }
    let files = count_files(&env.dir.join("state"));
    assert!(
        files <= 2 * KEEP,
        "{files} files under state_dir after 300 rejected starts, exits_keep {KEEP}"
    );
    // the newest rejected start can still be explained
    let explained = env.ok(&["explain", "crashloop-299"]);
    assert!(explained.contains("crashloop-299"), "{explained}");
}

/// The same bound with state_dir on tmpfs, as on a node (/run): there the number of records
/// is read from the directory's size rather than by listing it (store::records::prune).
#[test]
fn rejected_starts_on_tmpfs_stay_within_exits_keep_and_its_slack() {
    require_root!();
    const KEEP: usize = 32; // slack 2
    let env = Env::with("bounded-tmpfs", json!({ "exits_keep": KEEP }));
    let mut b = Bundle::new("bounded-tmpfs", &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.write();
    env.ok(&["cordon", "1:5", "--reason", "bad"]);
    let states = env.dir.join("states");
    std::fs::create_dir_all(&states).unwrap();
    for i in 0..100 {
        std::fs::write(
            states.join(format!("{i:03}.json")),
            b.state_json(&format!("crashloop-{i}")),
        )
        .unwrap();
    }
    let state_dir = env.dir.join("state");
    std::fs::create_dir_all(&state_dir).unwrap();
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            r#"mount -t tmpfs -o mode=0755 tmpfs "$1" || exit 9
               for f in "$2"/*.json; do "$3" --config "$4" hook prestart < "$f" >/dev/null 2>&1; done
               stat -f -c %T "$1"; find "$1/containers" -type f -name '*.json' | wc -l"#,
        )
        .arg("sh")
        .arg(&state_dir)
        .arg(&states)
        .arg(devgate_bin())
        .arg(&env.config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = said.lines();
    assert_eq!(lines.next(), Some("tmpfs"), "{said}");
    let records: usize = lines.next().unwrap().trim().parse().unwrap();
    assert!(
        (KEEP..=KEEP + 2).contains(&records),
        "{records} start records on tmpfs after 100 rejected starts, exits_keep {KEEP}"
    );
}

/// The runtime wrapper's "decided" markers (`state_dir/decided/<id>.json`) are bounded as
/// records are: a create through the wrapper whose container is never deleted through it
/// (a crash-looping pod, `runc delete` run by hand, a killed shim) left one for good. The
/// marker of a container the runtime still has (its state directory, `<root>/<id>`) is
/// never pruned: its prestart hook still needs it.
#[test]
fn creates_through_the_wrapper_without_deletes_leave_a_bounded_number_of_markers() {
    require_root!();
    const KEEP: usize = 20;
    let env = Env::with(
        "bounded-markers",
        json!({ "exits_keep": KEEP, "runtime": {"path": "/bin/true"} }),
    );
    let mut b = Bundle::new("bounded-markers", &["true"]);
    b.add_device("/dev/zero", "c", 1, 5);
    b.write();
    let w = Wrapper::new(&env);
    let live = "live-0";
    std::fs::create_dir_all(w.root.join(live)).unwrap();
    let bundle = b.dir.to_str().unwrap();
    for i in 0..400 {
        let id = if i == 0 {
            live.to_string()
        } else {
            format!("gone-{i}")
        };
        w.ok(&["create", "--bundle", bundle, &id]);
    }
    let decided = env.dir.join("state/decided");
    let markers = count_files(&decided);
    assert!(
        markers <= 2 * KEEP,
        "{markers} decided markers after 400 creates without a delete, exits_keep {KEEP}"
    );
    assert!(
        decided.join(format!("{live}.json")).exists(),
        "the marker of a container the runtime still has was pruned"
    );
    assert!(
        decided.join("gone-399.json").exists(),
        "the newest marker went"
    );
}

/// On a GPU node whose driver did not load (NVIDIA functions in sysfs, no GPU list from the
/// driver or NVML), each index in `NVIDIA_VISIBLE_DEVICES` was taken as a GPU: a pod listing
/// 0..1023 made every start a thousand devices, each a walk of dev_root, and an 870 KB
/// record and decision-log line, on every retry. The record holds the GPU nodes the host
/// has and one missing index; the rest are counted sentences.
#[test]
fn a_thousand_gpu_indexes_without_a_gpu_list_make_one_missing_device() {
    let dir = tempdir("selector-flood");
    let dev = dir.join("dev");
    let proc_root = dir.join("proc");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::create_dir_all(proc_root.join("driver/nvidia")).unwrap();
    for i in 0..200 {
        std::fs::write(dev.join(format!("f{i}")), "").unwrap();
    }
    let env = Env::with(
        "selector-flood",
        json!({
            "dev_root": dev,
            "sysfs_root": dir.join("sys"),
            "proc_root": proc_root,
            "nvml_library": dir.join("no-libnvidia-ml.so.1"),
            "kmsg_path": dir.join("no-kmsg"),
        }),
    );
    let mut b = Bundle::new("selector-flood", &["true"]);
    let all: Vec<String> = (0..1024).map(|i| i.to_string()).collect();
    b.spec["process"]["env"] = json!([format!("NVIDIA_VISIBLE_DEVICES={}", all.join(","))]);
    b.write();
    let out = env.hook_stdin("prestart", b.state_json("flood").as_bytes());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let decisions = env.decisions();
    let rec = decisions.last().expect("a decision");
    let devices = rec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{}", text(&out));
    assert_eq!(devices[0]["device"]["minor"], 0, "{rec}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.lines().count() <= 20, "{stderr}");
    assert!(
        stderr.contains("and 1007 more GPU selectors that name no GPU"),
        "{stderr}"
    );
}
