//! Bounded state: a crash-looping pod's rejected starts do not pile up under state_dir.

mod common;
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
